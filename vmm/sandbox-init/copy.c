/* copy.c — see copy.h. */
#include "copy.h"
#include "beneath.h"
#include "builder.h"
#include "jail.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

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

void copy_disk(int workfd, uint64_t disk_bytes, const char *from_pid, const char *from_id, uint32_t base)
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
