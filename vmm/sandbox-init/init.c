/* tally-sandbox-init — pid 1 of a process sandbox, and the jail it builds.
 *
 * tally-vmm clone()s this program's process into the sandbox's namespaces and
 * cgroup and execs it at once (vmm/sandbox-init/jail.h has the descriptors and
 * the configuration it is given). Being a fresh single-threaded program, it can
 * then use ordinary calls: nothing here runs in a copy of the threaded daemon.
 *
 * As host root, before any sandbox code runs, it builds the jail:
 *   - a per-sandbox uid range (a user namespace, root inside = an unprivileged
 *     uid outside, no capability on the host) whose lock it holds while alive;
 *   - the disk: a size-capped ext4 image on a loop device (or a tmpfs for tiny
 *     disks) mounted at /work, with /tmp on it, so writing past disk_mib is ENOSPC;
 *   - a private root (pivot_root onto a tmpfs): read-only binds of the host's
 *     /usr (and /lib*, /bin, /sbin as they are on the host), a generated /etc,
 *     a minimal /dev, its own /proc over an empty folder, nothing of the state
 *     folder and no vmm socket;
 *   - a cgroup namespace rooted at the sandbox's cgroup (entered after the
 *     daemon put us there), with no cgroup file system mounted;
 *   - a seccomp filter every sandbox process runs under.
 * Then it drops its own capabilities and serves exec requests: each command is
 * forked, joins the user namespace as its root, loads the filter and execs.
 * It also ends the sandbox at its lease (the lease file), whether tally-vmm is
 * up or not. */

#include "jail.h"
#include "beneath.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif

#include <errno.h>
#include <fcntl.h>
#include <dirent.h>
#include <grp.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/loop.h>
#include <linux/openat2.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <seccomp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define ARGS_MAX 256
#define CONFIG_MAX (128 * 1024)
#define JOBS_MAX 256
#define REQUEST_MAX (64 * 1024 + 64)
#define CGROUPS_MAX 8

#define EGRESS_URL "http://127.0.0.1:" JAIL_STR(JAIL_EGRESS_PORT)
#define JAIL_STR(x) JAIL_STR_(x)
#define JAIL_STR_(x) #x

/* Every command's environment; with internet the egress proxy is named in it
 * (the only way out of the sandbox's network namespace). */
static char *sandbox_env[] = {
        "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG=C.UTF-8",
        "TERM=dumb",
        "HOME=/work",
        NULL, /* from here: set by use_egress_env() */
        NULL, NULL, NULL, NULL, NULL, NULL, NULL,
        NULL,
};

static void use_egress_env(void)
{
        static char *const proxy[] = { "HTTP_PROXY=" EGRESS_URL, "HTTPS_PROXY=" EGRESS_URL, "ALL_PROXY=" EGRESS_URL,
                                       "http_proxy=" EGRESS_URL, "https_proxy=" EGRESS_URL, "all_proxy=" EGRESS_URL,
                                       "NO_PROXY=localhost,127.0.0.1,::1", "no_proxy=localhost,127.0.0.1,::1" };
        for (size_t i = 0; i < sizeof(proxy) / sizeof(proxy[0]); i++)
                sandbox_env[4 + i] = proxy[i];
}

static int report_fd = -1;          /* where a failure is explained (init: the ready pipe; join: stderr) */
static int userns_fd = -1;          /* the sandbox's user namespace */
static struct sock_fprog filter;    /* the seccomp filter, exported once */

/* ---- configuration ---- */

static char config[CONFIG_MAX];
static struct {
        const char *id, *dir, *disk_bytes, *network, *copy_from, *copy_from_id, *pid;
        const char *cgroups[CGROUPS_MAX];
        int ncgroups;
        char *argv[ARGS_MAX + 1];
} cfg;

static _Noreturn void fail(const char *fmt, ...)
{
        int e = errno;
        char buf[512];
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(buf, sizeof(buf), fmt, ap);
        va_end(ap);
        if (n < 0)
                n = 0;
        if ((size_t)n >= sizeof(buf))
                n = sizeof(buf) - 1;
        if (e)
                n += snprintf(buf + n, sizeof(buf) - (size_t)n, ": %s", strerror(e));
        if ((size_t)n >= sizeof(buf) - 1)
                n = sizeof(buf) - 2;
        if (report_fd == 2)
                buf[n++] = '\n';
        ssize_t w = write(report_fd, buf, (size_t)n);
        (void)w;
        _exit(1);
}

static void read_config(void)
{
        size_t len = 0;
        ssize_t n;
        if (lseek(JAIL_FD_CONFIG, 0, SEEK_SET) < 0)
                fail("could not read the configuration");
        while ((n = read(JAIL_FD_CONFIG, config + len, sizeof(config) - 1 - len)) > 0)
                len += (size_t)n;
        if (n < 0)
                fail("could not read the configuration");
        close(JAIL_FD_CONFIG);
        config[len] = '\0';
        bool args = false;
        size_t argc = 0;
        for (size_t at = 0; at < len; at += strlen(config + at) + 1) {
                char *s = config + at;
                if (args) {
                        if (argc < ARGS_MAX)
                                cfg.argv[argc++] = s;
                        continue;
                }
                if (strcmp(s, "--") == 0) {
                        args = true;
                        continue;
                }
                char *eq = strchr(s, '=');
                if (!eq)
                        continue;
                *eq = '\0';
                const char *v = eq + 1;
                if (strcmp(s, "id") == 0)
                        cfg.id = v;
                else if (strcmp(s, "dir") == 0)
                        cfg.dir = v;
                else if (strcmp(s, "disk_bytes") == 0)
                        cfg.disk_bytes = v;
                else if (strcmp(s, "network") == 0)
                        cfg.network = v;
                else if (strcmp(s, "copy_from") == 0)
                        cfg.copy_from = v;
                else if (strcmp(s, "copy_from_id") == 0)
                        cfg.copy_from_id = v;
                else if (strcmp(s, "pid") == 0)
                        cfg.pid = v;
                else if (strcmp(s, "cgroup") == 0 && cfg.ncgroups < CGROUPS_MAX)
                        cfg.cgroups[cfg.ncgroups++] = v;
        }
        cfg.argv[argc] = NULL;
}

/* ---- small file helpers ---- */

static void write_file(const char *path, const char *text, mode_t mode)
{
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
        if (fd < 0)
                fail("could not create %s", path);
        size_t len = strlen(text);
        if (write(fd, text, len) != (ssize_t)len)
                fail("could not write %s", path);
        close(fd);
}

static void make_dir(const char *path, mode_t mode)
{
        if (mkdir(path, mode) < 0 && errno != EEXIST)
                fail("could not create %s", path);
}

static void path(char *buf, size_t size, const char *a, const char *b)
{
        if (snprintf(buf, size, "%s/%s", a, b) >= (int)size) {
                errno = ENAMETOOLONG;
                fail("path too long");
        }
}

/* Binds src at dst (created as a folder or an empty file) read-only, no suid, no devices. */
static void bind_ro(const char *src, const char *dst, bool optional)
{
        struct stat st;
        if (stat(src, &st) < 0) {
                if (optional)
                        return;
                fail("could not find %s", src);
        }
        if (S_ISDIR(st.st_mode))
                make_dir(dst, 0755);
        else
                write_file(dst, "", 0644);
        if (mount(src, dst, NULL, MS_BIND | MS_REC, NULL) < 0)
                fail("could not bind %s", src);
        if (mount(NULL, dst, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) < 0)
                fail("could not make %s read-only", src);
}

static int run_program(char *const argv[])
{
        pid_t p = fork();
        if (p < 0)
                return -errno;
        if (p == 0) {
                int null = open("/dev/null", O_RDWR);
                dup2(null, 0);
                dup2(null, 1);
                dup2(null, 2);
                close_range(3, ~0U, 0);
                char *const env[] = { "PATH=/usr/sbin:/usr/bin:/sbin:/bin", NULL };
                execve(argv[0], argv, env);
                _exit(127);
        }
        int status;
        while (waitpid(p, &status, 0) < 0)
                if (errno != EINTR)
                        return -errno;
        return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -EIO;
}

/* ---- the uid range ---- */

static uint32_t take_uid_slot(const char *id)
{
        uint32_t h = 2166136261u;
        for (const char *p = id; *p; p++)
                h = (h ^ (uint8_t)*p) * 16777619u;
        if (mkdir(JAIL_SLOT_DIR, 0700) < 0 && errno != EEXIST)
                fail("could not create %s", JAIL_SLOT_DIR);
        for (uint32_t k = 0; k < JAIL_SLOTS; k++) {
                uint32_t slot = (h + k) % JAIL_SLOTS;
                char lock[64];
                snprintf(lock, sizeof(lock), JAIL_SLOT_DIR "/%u", slot);
                int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
                if (fd < 0)
                        fail("could not open %s", lock);
                if (flock(fd, LOCK_EX | LOCK_NB) == 0)
                        return slot; /* fd stays open (and locked) while this init lives */
                close(fd);
        }
        errno = EAGAIN;
        fail("no free uid range (%u sandboxes hold one each)", JAIL_SLOTS);
}

/* ---- the disk ---- */

/* Returns the loop device's descriptor: keep it open until the disk is
 * mounted, or autoclear detaches the image at its last close. */
static int attach_loop(int image, char *dev, size_t devlen)
{
        int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
        if (ctl < 0)
                fail("could not open /dev/loop-control");
        for (int tries = 0; tries < 64; tries++) {
                int n = ioctl(ctl, LOOP_CTL_GET_FREE);
                if (n < 0)
                        fail("could not get a free loop device");
                snprintf(dev, devlen, "/dev/loop%d", n);
                int fd = open(dev, O_RDWR | O_CLOEXEC);
                if (fd < 0) {
                        if (errno == ENOENT)
                                continue; /* its node is being made */
                        fail("could not open %s", dev);
                }
                struct loop_config c = { .fd = (uint32_t)image, .block_size = 0 };
                c.info.lo_flags = LO_FLAGS_AUTOCLEAR;
                if (ioctl(fd, LOOP_CONFIGURE, &c) == 0) {
                        close(ctl);
                        return fd;
                }
                int e = errno;
                close(fd);
                if (e != EBUSY) {
                        errno = e;
                        fail("could not attach the disk image to %s", dev);
                }
        }
        errno = EBUSY;
        fail("could not find a free loop device");
}

static void make_disk(const char *work, uint64_t bytes, uint32_t base)
{
        char image[PATH_MAX], opt[128];
        path(image, sizeof(image), cfg.dir, "disk");
        if (bytes < JAIL_DISK_IMAGE_MIN) {
                snprintf(opt, sizeof(opt), "size=%" PRIu64 ",mode=0755,uid=%u,gid=%u", bytes < 4096 ? 4096 : bytes,
                         base, base);
                if (mount("tally-disk", work, "tmpfs", MS_NOSUID | MS_NODEV, opt) < 0)
                        fail("could not mount the disk (tmpfs)");
                return;
        }
        int fd = open(image, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (fd < 0)
                fail("could not create the disk image");
        if (ftruncate(fd, (off_t)bytes) < 0)
                fail("could not size the disk image");
        char owner[96];
        snprintf(owner, sizeof(owner), "lazy_itable_init=1,lazy_journal_init=1,nodiscard,root_owner=%u:%u", base,
                 base);
        char *const mkfs[] = { "/sbin/mke2fs", "-q", "-F", "-t", "ext4", "-O", "^has_journal", "-m", "0", "-E", owner,
                               image, NULL };
        if (run_program(mkfs) < 0) {
                errno = 0;
                fail("could not make the disk's file system (/sbin/mke2fs, e2fsprogs)");
        }
        char dev[32];
        int loop = attach_loop(fd, dev, sizeof(dev));
        close(fd);
        if (mount(dev, work, "ext4", MS_NOSUID | MS_NODEV, "noinit_itable") < 0)
                fail("could not mount the disk");
        close(loop); /* the mount holds the device now; autoclear detaches it after */
        char lf[PATH_MAX];
        path(lf, sizeof(lf), work, "lost+found");
        rmdir(lf);
}

/* fork: the source's /work, copied file by file into this sandbox's disk
 * and moved into this sandbox's uid range.
 *
 * This runs as host root while the source sandbox runs and may rename,
 * replace and link anything in its /work meanwhile. So the copy never
 * resolves a path string of the source's tree: it walks descriptors, opening
 * each entry by its one name beneath its parent's descriptor (beneath_open:
 * no link followed, no mount crossed, no ".."), decides what an entry is from
 * the descriptor it opened, copies a link as a link (readlinkat/symlinkat, its
 * target never resolved), and skips device nodes and sockets. A rename race can
 * only move what the copy sees within the source's own disk; a link the
 * source planted (to "/", to /proc, to a cgroup folder) is copied as the link
 * it is. The copy is bounded by the new disk (its size, its entries).
 *
 * Why not copy inside the source's user namespace as its root: the
 * destination would have to be reachable from the source's namespaces, the
 * files would still need a second pass as host root to move them into the
 * copy's uid range, and the copier would be a process the source's root may
 * ptrace (the same uid in its namespace). */

#define COPY_LINKS_MAX 128 /* files with several names whose first copy is remembered */

static struct {
        uint32_t from, to;     /* the source's uid base, this sandbox's */
        uint64_t bytes_left;   /* data the copy may still write (the disk's size) */
        uint64_t entries_left; /* entries it may still make */
        int err;               /* why it stopped: -ENOSPC (too big), -ELOOP (too deep), -EIO */
        struct {
                dev_t dev;
                ino_t ino;
                int fd; /* O_PATH of its copy, for linkat */
        } links[COPY_LINKS_MAX];
        int nlinks;
} cp;

static uint32_t shift_id(uint32_t id)
{
        /* Whatever lies outside the source's range becomes the copy's root. */
        return id >= cp.from && id - cp.from < JAIL_UID_COUNT ? id - cp.from + cp.to : cp.to;
}

static void copy_stop(int err)
{
        if (!cp.err)
                cp.err = err;
}

/* Owner, mode and times of a copied file or folder (fd is the copy's). */
static void copy_meta(int fd, const struct stat *st)
{
        const struct timespec ts[2] = { st->st_atim, st->st_mtim };
        /* chown first: it clears set-id bits that fchmod then restores (the disk is nosuid) */
        if (fchown(fd, shift_id(st->st_uid), shift_id(st->st_gid)) < 0 || fchmod(fd, st->st_mode & 07777) < 0 ||
            futimens(fd, ts) < 0)
                copy_stop(-EIO);
}

/* The data of in (a regular file of st's size) into out: only its data
 * extents (holes stay holes), within what the disk has left. */
static void copy_data(int in, int out, const struct stat *st)
{
        static char buf[128 * 1024];
        off_t off = 0, size = st->st_size;
        while (off < size && !cp.err) {
                off_t data = lseek(in, off, SEEK_DATA);
                if (data < 0) {
                        if (errno != ENXIO)
                                copy_stop(-EIO);
                        break; /* ENXIO: only a hole is left */
                }
                off_t hole = lseek(in, data, SEEK_HOLE);
                if (hole < 0 || hole > size)
                        hole = size;
                for (off = data; off < hole && !cp.err;) {
                        size_t want = (size_t)(hole - off) < sizeof(buf) ? (size_t)(hole - off) : sizeof(buf);
                        if (want > cp.bytes_left) {
                                copy_stop(-ENOSPC);
                                break;
                        }
                        ssize_t n = pread(in, buf, want, off);
                        if (n <= 0) {
                                if (n < 0)
                                        copy_stop(-EIO);
                                off = size; /* the file shrank meanwhile */
                                break;
                        }
                        ssize_t w = pwrite(out, buf, (size_t)n, off);
                        if (w != n) {
                                copy_stop(w < 0 && (errno == ENOSPC || errno == EDQUOT) ? -ENOSPC : -EIO);
                                break;
                        }
                        cp.bytes_left -= (uint64_t)n;
                        off += n;
                }
        }
        if (!cp.err && ftruncate(out, size) < 0)
                copy_stop(errno == ENOSPC ? -ENOSPC : -EIO);
}

/* A file with several names: linked to its first copy when there is one. */
static bool copy_as_link(const struct stat *st, int dfd, const char *name)
{
        for (int i = 0; i < cp.nlinks; i++)
                if (cp.links[i].dev == st->st_dev && cp.links[i].ino == st->st_ino)
                        return linkat(cp.links[i].fd, "", dfd, name, AT_EMPTY_PATH) == 0 || errno == EEXIST;
        return false;
}

static void copy_file(int in, const struct stat *st, int dfd, const char *name)
{
        if (st->st_nlink > 1 && copy_as_link(st, dfd, name))
                return;
        int out = beneath_open(dfd, name, O_WRONLY | O_CREAT | O_EXCL, 0600);
        if (out < 0) {
                if (out != -EEXIST) /* the same name twice (a rename meanwhile): the first stays */
                        copy_stop(out == -ENOSPC || out == -EDQUOT ? -ENOSPC : -EIO);
                return;
        }
        copy_data(in, out, st);
        copy_meta(out, st);
        if (st->st_nlink > 1 && cp.nlinks < COPY_LINKS_MAX && !cp.err) {
                int p = beneath_open(dfd, name, O_PATH, 0);
                if (p >= 0) {
                        cp.links[cp.nlinks].dev = st->st_dev;
                        cp.links[cp.nlinks].ino = st->st_ino;
                        cp.links[cp.nlinks++].fd = p;
                }
        }
        close(out);
}

static void copy_link(int sfd, const struct stat *st, int dfd, const char *name)
{
        char target[PATH_MAX];
        ssize_t n = readlinkat(sfd, name, target, sizeof(target) - 1);
        if (n < 0)
                return; /* no longer a link (a rename meanwhile): skipped */
        target[n] = '\0';
        if (symlinkat(target, dfd, name) < 0) {
                if (errno != EEXIST)
                        copy_stop(errno == ENOSPC || errno == EDQUOT ? -ENOSPC : -EIO);
                return;
        }
        const struct timespec ts[2] = { st->st_atim, st->st_mtim };
        if (fchownat(dfd, name, shift_id(st->st_uid), shift_id(st->st_gid), AT_SYMLINK_NOFOLLOW) < 0 ||
            utimensat(dfd, name, ts, AT_SYMLINK_NOFOLLOW) < 0)
                copy_stop(-EIO);
}

static void copy_fifo(const struct stat *st, int dfd, const char *name)
{
        if (mknodat(dfd, name, S_IFIFO | 0600, 0) < 0) {
                if (errno != EEXIST)
                        copy_stop(errno == ENOSPC || errno == EDQUOT ? -ENOSPC : -EIO);
                return;
        }
        int fd = beneath_open(dfd, name, O_PATH, 0);
        const struct timespec ts[2] = { st->st_atim, st->st_mtim };
        char self[64];
        snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
        if (fd < 0 || fchownat(fd, "", shift_id(st->st_uid), shift_id(st->st_gid), AT_EMPTY_PATH) < 0 ||
            chmod(self, st->st_mode & 07777) < 0 || utimensat(AT_FDCWD, self, ts, 0) < 0)
                copy_stop(-EIO);
        if (fd >= 0)
                close(fd);
}

static void copy_folder(int sfd, int dfd, int depth);

/* One entry of the source's folder sfd, into the copy's folder dfd. */
static void copy_entry(int sfd, int dfd, const char *name, int depth)
{
        if (cp.entries_left == 0) {
                copy_stop(-ENOSPC);
                return;
        }
        cp.entries_left--;
        struct stat st;
        if (fstatat(sfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
                return; /* gone meanwhile */
        if (S_ISLNK(st.st_mode)) {
                copy_link(sfd, &st, dfd, name);
                return;
        }
        if (S_ISFIFO(st.st_mode)) {
                copy_fifo(&st, dfd, name);
                return;
        }
        if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
                return; /* device nodes and sockets are not copied */
        /* What is copied is what this descriptor holds, whatever the name meant a moment ago. */
        int in = beneath_open(sfd, name, O_RDONLY | O_NONBLOCK | O_NOCTTY, 0);
        if (in < 0)
                return; /* gone, or a link or a mount now: skipped */
        if (fstat(in, &st) < 0) {
                close(in);
                copy_stop(-EIO);
                return;
        }
        if (S_ISREG(st.st_mode)) {
                copy_file(in, &st, dfd, name);
                close(in);
                return;
        }
        if (!S_ISDIR(st.st_mode)) {
                close(in);
                return;
        }
        if (depth >= BENEATH_DEPTH_MAX) {
                close(in);
                copy_stop(-ELOOP);
                return;
        }
        if (mkdirat(dfd, name, 0700) < 0) {
                close(in);
                if (errno != EEXIST)
                        copy_stop(errno == ENOSPC || errno == EDQUOT ? -ENOSPC : -EIO);
                return;
        }
        int out = beneath_open(dfd, name, O_RDONLY | O_DIRECTORY, 0);
        if (out < 0) {
                close(in);
                copy_stop(-EIO);
                return;
        }
        copy_folder(in, out, depth + 1);
        copy_meta(out, &st); /* after its entries: they changed its times */
        close(out);
}

/* Copies what the folder sfd holds into dfd. sfd is taken (closed here). */
static void copy_folder(int sfd, int dfd, int depth)
{
        DIR *d = fdopendir(sfd);
        if (!d) {
                close(sfd);
                copy_stop(-EIO);
                return;
        }
        struct dirent *de;
        while (!cp.err && (de = readdir(d)))
                if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0)
                        copy_entry(dirfd(d), dfd, de->d_name, depth);
        closedir(d);
}

/* The source sandbox's /work, opened through its init (pid) without trusting
 * the number: everything is read through one descriptor of /proc/PID (which
 * stays that process's, ESRCH once it is gone, whoever takes the number
 * next), and that process must be in the source's cgroup (id), or another
 * process could have taken the number (the host's own root behind it). This
 * init is in a pid namespace of its own: a pidfd cannot name a host pid. */
static int open_source_work(const char *pid_text, const char *id)
{
        char p[64], buf[4096], needle[160];
        snprintf(p, sizeof(p), "/proc/%d", (int)strtol(pid_text, NULL, 10));
        snprintf(needle, sizeof(needle), "/%s\n", id ? id : "");
        int proc = id && *id ? open(p, O_PATH | O_DIRECTORY | O_CLOEXEC) : -1;
        int fd = proc >= 0 ? openat(proc, "cgroup", O_RDONLY | O_CLOEXEC) : -1;
        ssize_t n = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;
        if (fd >= 0)
                close(fd);
        if (n > 0)
                buf[n] = '\0';
        int root = n > 0 && strstr(buf, needle) ? openat(proc, "root", O_PATH | O_DIRECTORY | O_CLOEXEC) : -1;
        /* /work is the disk's mount point in the source's root: the one step that enters a mount */
        struct open_how how = { .flags = O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC,
                                .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS };
        int work = root >= 0 ? (int)syscall(SYS_openat2, root, "work", &how, sizeof(how)) : -1;
        struct stat rst, wst;
        bool ok = work >= 0 && fstat(root, &rst) == 0 && fstat(work, &wst) == 0 && rst.st_dev != wst.st_dev;
        if (root >= 0)
                close(root);
        if (proc >= 0)
                close(proc);
        if (!ok) {
                if (work >= 0)
                        close(work);
                errno = 0;
                fail("could not find the source sandbox's disk");
        }
        return work;
}

static void copy_disk(int workfd, uint64_t disk_bytes, const char *from_pid, const char *from_id, uint32_t base)
{
        int src = open_source_work(from_pid, from_id);
        struct stat st;
        if (fstat(src, &st) < 0)
                fail("could not read the source sandbox's disk");
        /* Each level of the walk holds two descriptors. */
        struct rlimit nofile;
        if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
                nofile.rlim_cur = nofile.rlim_max;
                setrlimit(RLIMIT_NOFILE, &nofile);
        }
        /* the source's range: its /work's owner rounded down to a range's start */
        cp.from = st.st_uid >= JAIL_UID_BASE
                          ? JAIL_UID_BASE + (st.st_uid - JAIL_UID_BASE) / JAIL_UID_COUNT * JAIL_UID_COUNT
                          : st.st_uid;
        cp.to = base;
        cp.bytes_left = disk_bytes;
        cp.entries_left = disk_bytes / 256 + 4096;
        copy_folder(src, workfd, 0);
        if (!cp.err)
                copy_meta(workfd, &st);
        for (int i = 0; i < cp.nlinks; i++)
                close(cp.links[i].fd);
        /* Fixed sentences: nothing of the host (an errno, a path) goes back to the caller. */
        errno = 0;
        if (cp.err == -ENOSPC)
                fail("could not copy the source sandbox's disk: its files do not fit the copy's disk");
        if (cp.err == -ELOOP)
                fail("could not copy the source sandbox's disk: its folders nest deeper than %d", BENEATH_DEPTH_MAX);
        if (cp.err)
                fail("could not copy the source sandbox's disk");
}

/* /tmp is the disk's .tmp, bound from a descriptor: a folder of the disk's
 * own file system, opened beneath the disk's root without following a link.
 * Anything else in its place (a link to "/", to /proc, a file) is removed
 * and a fresh folder made: never followed. */
static void make_tmp(int workfd, const char *tmp, uint32_t base)
{
        struct stat wst, st;
        if (fstat(workfd, &wst) < 0)
                fail("could not set up /tmp");
        int fd = beneath_open(workfd, ".tmp", O_RDONLY | O_DIRECTORY, 0);
        if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_dev != wst.st_dev)) {
                close(fd);
                fd = -1;
        }
        if (fd < 0) {
                if (unlinkat(workfd, ".tmp", 0) < 0 && errno != ENOENT) {
                        errno = 0;
                        fail("could not set up /tmp");
                }
                if (mkdirat(workfd, ".tmp", 01777) < 0 ||
                    (fd = beneath_open(workfd, ".tmp", O_RDONLY | O_DIRECTORY, 0)) < 0 || fchown(fd, base, base) < 0 ||
                    fchmod(fd, 01777) < 0) {
                        errno = 0;
                        fail("could not set up /tmp");
                }
        }
        make_dir(tmp, 01777);
        int tree = open_tree(fd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);
        if (tree < 0 || move_mount(tree, "", AT_FDCWD, tmp, MOVE_MOUNT_F_EMPTY_PATH) < 0) {
                errno = 0;
                fail("could not bind /tmp");
        }
        close(tree);
        close(fd);
}

/* ---- the root ---- */

static void make_etc(const char *root, bool network)
{
        char etc[PATH_MAX], p[PATH_MAX], text[1024];
        path(etc, sizeof(etc), root, "etc");
        make_dir(etc, 0755);
        path(p, sizeof(p), etc, "passwd");
        write_file(p, "root:x:0:0:root:/work:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
                   0644);
        path(p, sizeof(p), etc, "group");
        write_file(p, "root:x:0:\nnogroup:x:65534:\n", 0644);
        path(p, sizeof(p), etc, "hostname");
        snprintf(text, sizeof(text), "%s\n", cfg.id);
        write_file(p, text, 0644);
        path(p, sizeof(p), etc, "hosts");
        snprintf(text, sizeof(text), "127.0.0.1 localhost %s\n::1 localhost ip6-localhost\n", cfg.id);
        write_file(p, text, 0644);
        path(p, sizeof(p), etc, "nsswitch.conf");
        write_file(p, "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n", 0644);
        path(p, sizeof(p), etc, "os-release");
        symlink("../usr/lib/os-release", p);
        path(p, sizeof(p), etc, "alternatives");
        bind_ro("/etc/alternatives", p, true);
        path(p, sizeof(p), etc, "ld.so.cache");
        bind_ro("/etc/ld.so.cache", p, true);
        /* No resolv.conf: nothing answers DNS in the sandbox's namespace; the
         * egress proxy resolves names itself. Certificates for TLS through it. */
        if (network) {
                path(p, sizeof(p), etc, "ssl");
                bind_ro("/etc/ssl", p, true);
        }
}

static void make_dev(const char *root)
{
        char dev[PATH_MAX], p[PATH_MAX];
        path(dev, sizeof(dev), root, "dev");
        make_dir(dev, 0755);
        if (mount("tally-dev", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=0755") < 0)
                fail("could not mount /dev");
        static const char *const nodes[] = { "null", "zero", "full", "random", "urandom", "tty" };
        for (size_t i = 0; i < sizeof(nodes) / sizeof(nodes[0]); i++) {
                char src[64];
                snprintf(src, sizeof(src), "/dev/%s", nodes[i]);
                path(p, sizeof(p), dev, nodes[i]);
                write_file(p, "", 0644);
                if (mount(src, p, NULL, MS_BIND, NULL) < 0)
                        fail("could not bind %s", src);
        }
        static const char *const links[][2] = { { "fd", "/proc/self/fd" },
                                                 { "stdin", "/proc/self/fd/0" },
                                                 { "stdout", "/proc/self/fd/1" },
                                                 { "stderr", "/proc/self/fd/2" } };
        for (size_t i = 0; i < sizeof(links) / sizeof(links[0]); i++) {
                path(p, sizeof(p), dev, links[i][0]);
                if (symlink(links[i][1], p) < 0)
                        fail("could not create /dev/%s", links[i][0]);
        }
        path(p, sizeof(p), dev, "shm");
        make_dir(p, 01777);
        if (mount("tally-shm", p, "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=1777") < 0)
                fail("could not mount /dev/shm");
        if (mount(NULL, dev, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NOEXEC, NULL) < 0)
                fail("could not make /dev read-only");
}

static void make_proc(const char *root)
{
        char proc[PATH_MAX], p[PATH_MAX];
        path(proc, sizeof(proc), root, "proc");
        make_dir(proc, 0555);
        /* Over an empty folder of our tmpfs: unmounting it (which the sandbox may
         * not do anyway) reveals nothing of the host's /proc. */
        if (mount("proc", proc, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
                fail("could not mount /proc");
        /* Its own network namespace: ports below 1024 are the sandbox's to use. */
        path(p, sizeof(p), proc, "sys/net/ipv4/ip_unprivileged_port_start");
        int fd = open(p, O_WRONLY | O_CLOEXEC);
        if (fd >= 0) {
                ssize_t w = write(fd, "0", 1);
                (void)w;
                close(fd);
        }
        /* What Docker masks: kernel memory, keys and timers of the host. */
        static const char *const masked[] = { "kcore", "keys", "timer_list", "sched_debug", "latency_stats" };
        for (size_t i = 0; i < sizeof(masked) / sizeof(masked[0]); i++) {
                path(p, sizeof(p), proc, masked[i]);
                if (access(p, F_OK) == 0 && mount("/dev/null", p, NULL, MS_BIND, NULL) < 0)
                        fail("could not mask /proc/%s", masked[i]);
        }
        static const char *const readonly[] = { "sys", "sysrq-trigger", "irq", "bus", "fs", "acpi", "scsi" };
        for (size_t i = 0; i < sizeof(readonly) / sizeof(readonly[0]); i++) {
                path(p, sizeof(p), proc, readonly[i]);
                if (access(p, F_OK) < 0)
                        continue;
                if (mount(p, p, NULL, MS_BIND | MS_REC, NULL) < 0 ||
                    mount(NULL, p, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
                        fail("could not make /proc/%s read-only", readonly[i]);
        }
}

static void make_root(const char *root, uint64_t disk_bytes, uint32_t base, bool network)
{
        make_dir(root, 0755);
        if (mount("tally-root", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755") < 0)
                fail("could not mount the sandbox's root");
        char p[PATH_MAX];
        path(p, sizeof(p), root, "usr");
        bind_ro("/usr", p, false);
        static const char *const tops[] = { "bin", "sbin", "lib", "lib32", "lib64", "libx32" };
        for (size_t i = 0; i < sizeof(tops) / sizeof(tops[0]); i++) {
                char host[32], target[PATH_MAX];
                snprintf(host, sizeof(host), "/%s", tops[i]);
                struct stat st;
                if (lstat(host, &st) < 0)
                        continue;
                path(p, sizeof(p), root, tops[i]);
                if (S_ISLNK(st.st_mode)) {
                        ssize_t n = readlink(host, target, sizeof(target) - 1);
                        if (n <= 0)
                                fail("could not read %s", host);
                        target[n] = '\0';
                        if (symlink(target, p) < 0)
                                fail("could not create /%s", tops[i]);
                } else if (S_ISDIR(st.st_mode)) {
                        bind_ro(host, p, false);
                }
        }
        make_etc(root, network);
        make_dev(root);
        make_proc(root);

        char work[PATH_MAX], tmp[PATH_MAX];
        path(work, sizeof(work), root, "work");
        make_dir(work, 0755);
        make_disk(work, disk_bytes, base);
        /* From here the disk is walked by descriptor only (it may hold what a source sandbox made). */
        int workfd = open(work, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (workfd < 0)
                fail("could not open the disk");
        if (cfg.copy_from && *cfg.copy_from && strcmp(cfg.copy_from, "0") != 0)
                copy_disk(workfd, disk_bytes, cfg.copy_from, cfg.copy_from_id, base);
        /* /tmp lives on the disk, so it counts against disk_mib too. */
        path(tmp, sizeof(tmp), root, "tmp");
        make_tmp(workfd, tmp, base);
        close(workfd);
        path(p, sizeof(p), root, "var");
        make_dir(p, 0755);
        path(p, sizeof(p), root, "var/tmp");
        symlink("/tmp", p);
        path(p, sizeof(p), root, "run");
        make_dir(p, 0755);
        path(p, sizeof(p), root, "root");
        symlink("/work", p);
}

/* ---- the user namespace and the filter ---- */

static void make_userns(uint32_t base)
{
        int up[2], down[2];
        if (pipe2(up, O_CLOEXEC) < 0 || pipe2(down, O_CLOEXEC) < 0)
                fail("could not make a pipe");
        pid_t c = fork();
        if (c < 0)
                fail("could not fork");
        if (c == 0) {
                char b = 'x';
                if (unshare(CLONE_NEWUSER) < 0)
                        _exit(1);
                if (write(up[1], &b, 1) != 1 || read(down[0], &b, 1) < 0)
                        _exit(1);
                _exit(0);
        }
        close(up[1]);
        close(down[0]);
        char b, p[64], map[64];
        if (read(up[0], &b, 1) != 1) {
                errno = 0;
                fail("could not create the sandbox's user namespace (user namespaces disabled?)");
        }
        snprintf(map, sizeof(map), "0 %u %u\n", base, JAIL_UID_COUNT);
        snprintf(p, sizeof(p), "/proc/%d/uid_map", (int)c);
        write_file(p, map, 0644);
        snprintf(p, sizeof(p), "/proc/%d/gid_map", (int)c);
        write_file(p, map, 0644);
        snprintf(p, sizeof(p), "/proc/%d/ns/user", (int)c);
        if ((userns_fd = open(p, O_RDONLY | O_CLOEXEC)) < 0)
                fail("could not open the sandbox's user namespace");
        ssize_t w = write(down[1], &b, 1);
        (void)w;
        close(up[0]);
        close(down[1]);
        waitpid(c, NULL, 0);
}

/* Refused with EPERM (ENOSYS for clone3, so libc falls back to clone, whose
 * namespace flags can be checked). Learnt from Docker's default profile: calls
 * that reach the host kernel's global state, load code into it, or leave the
 * namespaces. The user namespace already strips host capabilities; this is
 * the second wall, and it closes what a namespace root could still do. */
static const char *const refused[] = {
        /* file systems: cgroup (release_agent), fuse, anything mountable */
        "mount", "umount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig", "fsmount",
        "fspick", "mount_setattr",
        /* namespaces: no new user namespace, no joining another */
        "unshare", "setns",
        /* kernel code and the machine */
        "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module", "create_module", "reboot",
        "swapon", "swapoff", "acct", "iopl", "ioperm", "syslog", "quotactl", "quotactl_fd", "nfsservctl",
        "lookup_dcookie", "uselib", "_sysctl", "vm86", "vm86old", "get_kernel_syms", "query_module",
        /* clocks */
        "settimeofday", "clock_settime", "clock_settime64", "clock_adjtime", "clock_adjtime64", "adjtimex", "stime",
        /* tracing and bpf, keyrings, file handles (the "shocker" escape), io_uring, userfaultfd */
        "bpf", "perf_event_open", "add_key", "request_key", "keyctl", "open_by_handle_at", "name_to_handle_at",
        "io_uring_setup", "io_uring_enter", "io_uring_register", "userfaultfd", "fanotify_init",
};

static void build_filter(void)
{
        scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
        if (!ctx) {
                errno = ENOMEM;
                fail("could not build the seccomp filter");
        }
        int r = 0;
        for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]) && r == 0; i++) {
                int nr = seccomp_syscall_resolve_name(refused[i]);
                if (nr == __NR_SCMP_ERROR)
                        continue; /* not on this architecture */
                r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0);
        }
        if (r == 0)
                r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
        static const uint64_t ns_flags[] = { CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWPID,
                                             CLONE_NEWNET, CLONE_NEWUTS, CLONE_NEWIPC };
        for (size_t i = 0; i < sizeof(ns_flags) / sizeof(ns_flags[0]) && r == 0; i++)
                r = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                                     SCMP_A0(SCMP_CMP_MASKED_EQ, ns_flags[i], ns_flags[i]));
        if (r < 0) {
                errno = -r;
                fail("could not build the seccomp filter");
        }
        int mem = memfd_create("seccomp", MFD_CLOEXEC);
        if (mem < 0 || (r = seccomp_export_bpf(ctx, mem)) < 0) {
                errno = mem < 0 ? errno : -r;
                fail("could not export the seccomp filter");
        }
        seccomp_release(ctx);
        off_t len = lseek(mem, 0, SEEK_END);
        struct sock_filter *prog = len > 0 ? malloc((size_t)len) : NULL;
        if (!prog || pread(mem, prog, (size_t)len, 0) != len) {
                errno = EIO;
                fail("could not read the seccomp filter");
        }
        close(mem);
        filter.len = (unsigned short)((size_t)len / sizeof(struct sock_filter));
        filter.filter = prog;
}

/* In a child forked for one command: becomes the sandbox's root (in its user
 * namespace: no host capability), under the filter, and execs argv. stdio is
 * set; every other descriptor is closed. */
static _Noreturn void exec_in_jail(char *const argv[])
{
        setsid();
        if (setns(userns_fd, CLONE_NEWUSER) < 0) {
                dprintf(2, "tally: could not enter the sandbox's user namespace: %s\n", strerror(errno));
                _exit(126);
        }
        close_range(3, ~0U, 0);
        if (setgroups(0, NULL) < 0 || setresgid(0, 0, 0) < 0 || setresuid(0, 0, 0) < 0) {
                dprintf(2, "tally: could not become the sandbox's root: %s\n", strerror(errno));
                _exit(126);
        }
        if (chdir("/work") < 0 && chdir("/") < 0)
                _exit(126);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGCHLD, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &filter) < 0) {
                dprintf(2, "tally: could not load the seccomp filter: %s\n", strerror(errno));
                _exit(126);
        }
        execvpe(argv[0], argv, sandbox_env);
        int e = errno;
        dprintf(2, "tally: could not run %s: %s\n", argv[0], strerror(e));
        _exit(e == ENOENT ? 127 : 126);
}

/* ---- the lease ---- */

static int lease_fd = -1, timer_fd = -1;

static _Noreturn void end_sandbox(void)
{
        kill(-1, SIGKILL); /* every process of our pid namespace but us */
        _exit(0);
}

static void lease_check(void)
{
        char buf[32];
        ssize_t n = pread(lease_fd, buf, sizeof(buf) - 1, 0);
        int64_t deadline = 0;
        if (n > 0) {
                buf[n] = '\0';
                deadline = strtoll(buf, NULL, 10);
        }
        struct itimerspec its = { 0 };
        if (deadline > 0) {
                int64_t at = deadline + JAIL_LEASE_GRACE_NS;
                struct timespec now;
                clock_gettime(CLOCK_REALTIME, &now);
                if ((int64_t)now.tv_sec * 1000000000 + now.tv_nsec >= at)
                        end_sandbox();
                its.it_value.tv_sec = at / 1000000000;
                its.it_value.tv_nsec = at % 1000000000;
        }
        timerfd_settime(timer_fd, TFD_TIMER_ABSTIME, &its, NULL);
}

/* ---- the exec server ---- */

static struct job {
        int conn;
        pid_t pid;
} jobs[JOBS_MAX];
static char request[REQUEST_MAX];
static char *request_argv[ARGS_MAX + 1];

/* One request: argv as NUL-terminated strings with the command's stdin,
 * stdout and stderr as SCM_RIGHTS; answered with its pid, then its status.
 * A request whose argv is JAIL_LEASE_REQUEST (no descriptors) re-reads the lease. */
static void start_job(int conn)
{
        int fds[3] = { -1, -1, -1 };
        union {
                struct cmsghdr h;
                char buf[CMSG_SPACE(sizeof(fds))];
        } control;
        struct iovec iov = { request, sizeof(request) - 1 };
        struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = control.buf,
                              .msg_controllen = sizeof(control.buf) };
        ssize_t n = recvmsg(conn, &msg, MSG_CMSG_CLOEXEC);
        if (n > 0 && (size_t)n == sizeof(JAIL_LEASE_REQUEST) && memcmp(request, JAIL_LEASE_REQUEST, (size_t)n) == 0) {
                lease_check();
                ssize_t w = write(conn, "ok", 2);
                (void)w;
                close(conn);
                return;
        }
        struct cmsghdr *c = n > 0 ? CMSG_FIRSTHDR(&msg) : NULL;
        int slot = -1;
        for (int i = 0; i < JOBS_MAX && slot < 0; i++)
                if (jobs[i].pid == 0)
                        slot = i;
        if (!c || c->cmsg_type != SCM_RIGHTS || c->cmsg_len != CMSG_LEN(sizeof(fds)) || (msg.msg_flags & MSG_TRUNC) ||
            slot < 0 || request[n - 1] != '\0') {
                if (c && c->cmsg_type == SCM_RIGHTS) {
                        memcpy(fds, CMSG_DATA(c), sizeof(fds));
                        for (int i = 0; i < 3; i++)
                                if (fds[i] >= 0)
                                        close(fds[i]);
                }
                close(conn);
                return;
        }
        memcpy(fds, CMSG_DATA(c), sizeof(fds));
        size_t argc = 0;
        for (ssize_t at = 0; at < n && argc < ARGS_MAX; at += (ssize_t)strlen(request + at) + 1)
                request_argv[argc++] = request + at;
        request_argv[argc] = NULL;
        pid_t pid = argc ? fork() : -1;
        if (pid == 0) {
                dup2(fds[0], 0);
                dup2(fds[1], 1);
                dup2(fds[2], 2);
                exec_in_jail(request_argv);
        }
        for (int i = 0; i < 3; i++)
                close(fds[i]);
        int v = (int)pid;
        if (pid < 0 || write(conn, &v, sizeof(v)) != sizeof(v)) {
                if (pid > 0)
                        kill(pid, SIGKILL); /* reaped below; nobody waits for its status */
                close(conn);
                return;
        }
        jobs[slot].conn = conn;
        jobs[slot].pid = pid;
}

static void on_sigchld(int sig) { (void)sig; }

static _Noreturn void serve(int listen_fd, const sigset_t *none)
{
        struct pollfd fds[JOBS_MAX + 2];
        int slots[JOBS_MAX + 2];
        for (int i = 0; i < JOBS_MAX; i++)
                jobs[i].conn = -1;
        for (;;) {
                int status;
                pid_t p;
                while ((p = waitpid(-1, &status, WNOHANG)) > 0) {
                        for (int i = 0; i < JOBS_MAX; i++) {
                                if (jobs[i].pid != p)
                                        continue;
                                if (jobs[i].conn >= 0) {
                                        ssize_t w = write(jobs[i].conn, &status, sizeof(status));
                                        (void)w;
                                        close(jobs[i].conn);
                                }
                                jobs[i].pid = 0;
                                jobs[i].conn = -1;
                        }
                }
                int n = 0;
                fds[n] = (struct pollfd){ timer_fd, POLLIN, 0 };
                slots[n++] = -2;
                if (listen_fd >= 0) {
                        fds[n] = (struct pollfd){ listen_fd, POLLIN, 0 };
                        slots[n++] = -1;
                }
                for (int i = 0; i < JOBS_MAX; i++)
                        if (jobs[i].pid > 0 && jobs[i].conn >= 0) {
                                fds[n] = (struct pollfd){ jobs[i].conn, POLLIN, 0 };
                                slots[n++] = i;
                        }
                if (ppoll(fds, (nfds_t)n, NULL, none) <= 0)
                        continue; /* SIGCHLD: reap */
                for (int k = 0; k < n; k++) {
                        if (!fds[k].revents)
                                continue;
                        if (slots[k] == -2) {
                                uint64_t ticks;
                                ssize_t r = read(timer_fd, &ticks, sizeof(ticks));
                                (void)r;
                                lease_check();
                                continue;
                        }
                        if (slots[k] == -1) {
                                int c = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
                                if (c >= 0)
                                        start_job(c);
                                continue;
                        }
                        /* The daemon asks for a kill, or went away: the command must not outlive it. */
                        struct job *j = &jobs[slots[k]];
                        char b;
                        ssize_t r = read(j->conn, &b, 1);
                        if (r == 1 || r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) {
                                kill(-j->pid, SIGKILL);
                                kill(j->pid, SIGKILL);
                        }
                        if (r <= 0 && !(r < 0 && (errno == EINTR || errno == EAGAIN))) {
                                close(j->conn);
                                j->conn = -1;
                        }
                }
        }
}

static void drop_capabilities(void)
{
        /* From here the init only forks, kills and reads its descriptors. It keeps
         * what it needs in the sandbox's user namespace as that namespace's owner. */
        struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
        struct __user_cap_data_struct d[2] = { { 0 } };
        if (syscall(SYS_capset, &h, d) < 0)
                fail("could not drop the init's capabilities");
}

static int init_main(void)
{
        report_fd = JAIL_FD_READY;
        /* Before anything is opened that could take its number. */
        int listen_fd = fcntl(JAIL_FD_LISTEN, F_GETFD) >= 0 ? JAIL_FD_LISTEN : -1;
        if (listen_fd >= 0)
                fcntl(listen_fd, F_SETFD, FD_CLOEXEC);
        signal(SIGPIPE, SIG_IGN); /* a daemon that hung up must not end the init */
        read_config();
        if (!cfg.id || !cfg.dir || !cfg.disk_bytes)
                fail("incomplete configuration");
        bool network = cfg.network && strcmp(cfg.network, "1") == 0;
        uint64_t disk_bytes = strtoull(cfg.disk_bytes, NULL, 10);
        prctl(PR_SET_NAME, JAIL_INIT_NAME, 0, 0, 0);
        if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
                fail("could not make the mounts private");

        uint32_t base = JAIL_UID_BASE + take_uid_slot(cfg.id) * JAIL_UID_COUNT;
        char root[PATH_MAX], p[PATH_MAX];
        path(root, sizeof(root), cfg.dir, "root");
        path(p, sizeof(p), cfg.dir, JAIL_LEASE_FILE);
        if ((lease_fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600)) < 0)
                fail("could not open the lease file");
        if ((timer_fd = timerfd_create(CLOCK_REALTIME, TFD_CLOEXEC | TFD_NONBLOCK)) < 0)
                fail("could not create the lease timer");
        int console = -1;
        if (cfg.argv[0]) {
                path(p, sizeof(p), cfg.dir, "console.log");
                if ((console = open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600)) < 0)
                        fail("could not open the console log");
        }
        make_root(root, disk_bytes, base, network);

        if (sethostname(cfg.id, strlen(cfg.id)) < 0)
                fail("could not set the host name");
        /* Only loopback, and up, so local servers work (and the egress proxy's listener, which
         * tally-vmm may already have brought up). */
        jail_loopback_up();
        if (network)
                use_egress_env();
        /* The daemon has put us in the sandbox's cgroup: that is now "/". */
        if (unshare(CLONE_NEWCGROUP) < 0)
                fail("could not create the cgroup namespace");
        if (chdir(root) < 0 || syscall(SYS_pivot_root, ".", ".") < 0)
                fail("could not pivot to the sandbox's root");
        if (umount2(".", MNT_DETACH) < 0 || chdir("/") < 0)
                fail("could not detach the host's root");
        if (mount(NULL, "/", NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) < 0)
                fail("could not make the root read-only");
        make_userns(base);
        build_filter();
        lease_check();

        setsid();
        struct sigaction sa = { .sa_handler = on_sigchld, .sa_flags = SA_NOCLDSTOP };
        sigaction(SIGCHLD, &sa, NULL);
        sigset_t chld, none;
        sigemptyset(&chld);
        sigaddset(&chld, SIGCHLD);
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &chld, NULL);
        drop_capabilities();
        if (cfg.argv[0]) {
                pid_t c = fork();
                if (c < 0)
                        fail("could not start the main program");
                if (c == 0) {
                        dup2(console, 1);
                        dup2(console, 2);
                        exec_in_jail(cfg.argv);
                }
                close(console);
        }
        ssize_t w = write(JAIL_FD_READY, "ok", 2);
        (void)w;
        close(JAIL_FD_READY);
        serve(listen_fd, &none);
}

/* ---- join: exec without the init's socket ---- */

/* LeakSanitizer's end-of-process check cannot run once --join is in the
 * sandbox's pid namespace: it clones a tracer to stop and read this process,
 * the clone lands in that namespace, where the tracer's getppid() is 0, not
 * the parent's host pid; it takes this as "parent gone" and exits, and the
 * parent spins in sched_yield() forever waiting for it (the exec never ended:
 * the vmm test's bad-input case hung to its timeout). The mount namespace
 * hides the host's /proc as well. So in a leak-checking build the check runs
 * before the cgroup and the namespaces are entered (the tracer is then no task
 * of the sandbox's pids.max, nor billed to it; the check does not run again at
 * exit), and join_main ends with _exit. */
static void leak_check_on_host(void)
{
#if defined(__SANITIZE_ADDRESS__)
        __lsan_do_leak_check();
#endif
}

static int join_main(void)
{
        report_fd = 2;
        read_config();
        if (!cfg.pid || !cfg.argv[0])
                fail("tally: incomplete configuration");
        if (cfg.network && strcmp(cfg.network, "1") == 0)
                use_egress_env();
        fcntl(JAIL_FD_STATUS, F_SETFD, FD_CLOEXEC);
        char num[24];
        snprintf(num, sizeof(num), "%d", (int)getpid());
        leak_check_on_host();
        for (int i = 0; i < cfg.ncgroups; i++) {
                char p[PATH_MAX + 16];
                snprintf(p, sizeof(p), "%s/cgroup.procs", cfg.cgroups[i]);
                int fd = open(p, O_WRONLY | O_CLOEXEC);
                if (fd < 0 || write(fd, num, strlen(num)) < 0)
                        fail("tally: could not enter the sandbox's cgroup");
                close(fd);
        }
        /* The user namespace: the one the init holds a descriptor of. */
        char dirpath[64];
        snprintf(dirpath, sizeof(dirpath), "/proc/%s/fd", cfg.pid);
        for (int fd = 0; fd < 64 && userns_fd < 0; fd++) {
                char link[96], target[64];
                snprintf(link, sizeof(link), "%s/%d", dirpath, fd);
                ssize_t n = readlink(link, target, sizeof(target) - 1);
                if (n > 0 && (target[n] = '\0', strncmp(target, "user:[", 6) == 0))
                        userns_fd = open(link, O_RDONLY | O_CLOEXEC);
        }
        if (userns_fd < 0)
                fail("tally: could not find the sandbox's user namespace");
        static const char *const ns[] = { "ipc", "uts", "net", "cgroup", "pid", "mnt" }; /* mnt last: it moves the root */
        for (size_t i = 0; i < sizeof(ns) / sizeof(ns[0]); i++) {
                char p[64];
                snprintf(p, sizeof(p), "/proc/%s/ns/%s", cfg.pid, ns[i]);
                int fd = open(p, O_RDONLY | O_CLOEXEC);
                if (fd < 0 || setns(fd, 0) < 0)
                        fail("tally: could not enter the sandbox's %s namespace", ns[i]);
                close(fd);
        }
        build_filter();
        pid_t c = fork();
        if (c == 0)
                exec_in_jail(cfg.argv);
        int msg[2] = { c, 0 };
        if (write(JAIL_FD_STATUS, &msg[0], sizeof(msg[0])) < 0 || c < 0)
                _exit(1);
        close(0);
        close(1);
        close(2);
        while (waitpid(c, &msg[1], 0) < 0 && errno == EINTR)
                ;
        if (write(JAIL_FD_STATUS, &msg[1], sizeof(msg[1])) < 0)
                _exit(1);
        _exit(0); /* no exit handlers inside the sandbox's namespaces: see leak_check_on_host */
}

int main(int argc, char **argv)
{
        if (argc > 1 && strcmp(argv[1], "--join") == 0)
                return join_main();
        return init_main();
}
