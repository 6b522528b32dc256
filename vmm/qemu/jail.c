/* jail.c — builds the jail a QEMU process runs in (see jail.h).
 *
 * The jail's root is a tmpfs that exists only in QEMU's mount namespace, so
 * nothing is left on disk and nothing needs cleaning when QEMU ends: the
 * namespace dies with its only process. Every path inside mirrors the host's
 * (the binary, the guest's kernel and QEMU's folder sit where QEMU's command
 * line says on both sides), so the command line needs no translation and a
 * restarted daemon recognises its QEMU by it.
 *
 * The child's half (qemu_jail_enter) must never allocate, lock or format: it
 * runs between fork and exec in a process whose other threads are gone. */
#include "jail.h"
#include "sockio.h"

#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/capability.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif

enum {
        JAIL_STEP_CHOWN,
        JAIL_STEP_UNSHARE,
        JAIL_STEP_PRIVATE,
        JAIL_STEP_TMPFS,
        JAIL_STEP_OP,
        JAIL_STEP_PIVOT,
        JAIL_STEP_READONLY,
        JAIL_STEP_LIMITS,
        JAIL_STEP_CAPS,
        JAIL_STEP_IDS,
        JAIL_STEP_NNP,
        JAIL_STEP_FDS,
};

const char *qemu_jail_step_name(int step)
{
        static const char *const names[] = {
                [JAIL_STEP_CHOWN] = "give QEMU's folder and sockets to its uid",
                [JAIL_STEP_UNSHARE] = "create QEMU's namespaces",
                [JAIL_STEP_PRIVATE] = "make the mount namespace private",
                [JAIL_STEP_TMPFS] = "mount the jail's root",
                [JAIL_STEP_OP] = "make",
                [JAIL_STEP_PIVOT] = "pivot into the jail",
                [JAIL_STEP_READONLY] = "make the jail's root read-only",
                [JAIL_STEP_LIMITS] = "set QEMU's resource limits",
                [JAIL_STEP_CAPS] = "drop capabilities",
                [JAIL_STEP_IDS] = "switch to QEMU's uid",
                [JAIL_STEP_NNP] = "set no_new_privs",
                [JAIL_STEP_FDS] = "close the daemon's descriptors",
        };
        return step >= 0 && step < (int)(sizeof(names) / sizeof(names[0])) ? names[step] : "enter the jail";
}

void qemu_jail_clear(struct qemu_jail *j)
{
        if (!j)
                return;
        for (size_t i = 0; i < j->nops; i++) {
                free(j->ops[i].path);
                free(j->ops[i].full);
                free(j->ops[i].target);
        }
        free(j->ops);
        for (size_t i = 0; i < 3; i++) {
                free(j->sockets[i]);
                free(j->env[i]);
        }
        memset(j, 0, sizeof(*j));
}

static const struct jail_op *find_op(const struct qemu_jail *j, const char *path)
{
        for (size_t i = 0; i < j->nops; i++)
                if (strcmp(j->ops[i].path, path) == 0)
                        return &j->ops[i];
        return NULL;
}

/* Whether path lies inside a folder already bound into the jail (it is then
 * visible as the host has it). */
static bool covered(const struct qemu_jail *j, const char *path)
{
        for (size_t i = 0; i < j->nops; i++) {
                const struct jail_op *o = &j->ops[i];
                size_t n = strlen(o->path);
                if (o->kind != JAIL_MKDIR && o->kind != JAIL_SYMLINK && !o->file &&
                    strncmp(path, o->path, n) == 0 && (path[n] == '/' || path[n] == 0))
                        return true;
        }
        return false;
}

static int add_op(struct qemu_jail *j, enum jail_op_kind kind, bool file, const char *path, const char *target)
{
        if (j->nops == j->cap) {
                size_t cap = j->cap ? j->cap * 2 : 32;
                struct jail_op *ops = realloc(j->ops, cap * sizeof(*ops));
                if (!ops)
                        return -ENOMEM;
                j->ops = ops;
                j->cap = cap;
        }
        struct jail_op *o = &j->ops[j->nops];
        memset(o, 0, sizeof(*o));
        o->kind = kind;
        o->file = file;
        o->path = strdup(path);
        if (asprintf(&o->full, "%s%s", j->root, path) < 0)
                o->full = NULL;
        o->target = target ? strdup(target) : NULL;
        if (!o->path || !o->full || (target && !o->target)) {
                free(o->path);
                free(o->full);
                free(o->target);
                return -ENOMEM;
        }
        j->nops++;
        return 0;
}

/* Makes host_path visible at the same path inside the jail as kind (a bind):
 * every folder on the way is made, every symbolic link on the way is made as
 * the same link and followed, so the path resolves inside the jail as it does
 * outside. */
static int expose(struct qemu_jail *j, const char *host_path, enum jail_op_kind kind, int depth)
{
        if (depth > 16)
                return -ELOOP;
        if (host_path[0] != '/')
                return -EINVAL;
        char cur[4096] = "";
        const char *p = host_path;
        while (*p) {
                while (*p == '/')
                        p++;
                if (!*p)
                        break;
                size_t n = strcspn(p, "/");
                const char *rest = p + n;
                bool last = strspn(rest, "/") == strlen(rest);
                if (n == 1 && p[0] == '.') {
                        p = rest;
                        continue;
                }
                if (n == 2 && p[0] == '.' && p[1] == '.') {
                        char *s = strrchr(cur, '/');
                        if (s)
                                *s = 0;
                        p = rest;
                        continue;
                }
                size_t l = strlen(cur);
                if (l + 1 + n >= sizeof(cur))
                        return -ENAMETOOLONG;
                cur[l] = '/';
                memcpy(cur + l + 1, p, n);
                cur[l + 1 + n] = 0;
                p = rest;
                if (covered(j, cur))
                        return 0;
                struct stat st;
                if (lstat(cur, &st) < 0)
                        return -errno;
                if (S_ISLNK(st.st_mode)) {
                        char target[4096];
                        ssize_t tl = readlink(cur, target, sizeof(target) - 1);
                        if (tl < 0)
                                return -errno;
                        target[tl] = 0;
                        const struct jail_op *o = find_op(j, cur);
                        if (!o) {
                                int r = add_op(j, JAIL_SYMLINK, false, cur, target);
                                if (r < 0)
                                        return r;
                        } else if (o->kind != JAIL_SYMLINK) {
                                return -EEXIST;
                        }
                        /* Follow it: the target, then what was left of the path. */
                        char next[8192];
                        char *slash = strrchr(cur, '/');
                        *slash = 0;
                        int w = target[0] == '/' ? snprintf(next, sizeof(next), "%s%s", target, rest)
                                                 : snprintf(next, sizeof(next), "%s/%s%s", cur, target, rest);
                        if (w < 0 || (size_t)w >= sizeof(next))
                                return -ENAMETOOLONG;
                        return expose(j, next, kind, depth + 1);
                }
                if (last) {
                        const struct jail_op *o = find_op(j, cur);
                        if (!o)
                                return add_op(j, kind, !S_ISDIR(st.st_mode), cur, NULL);
                        /* Already a folder on the way to something else: binding
                         * over it now would hide what was made inside. Callers
                         * expose folders before what lies in them. */
                        return o->kind == kind ? 0 : -EEXIST;
                }
                if (!S_ISDIR(st.st_mode))
                        return -ENOTDIR;
                if (!find_op(j, cur)) {
                        int r = add_op(j, JAIL_MKDIR, false, cur, NULL);
                        if (r < 0)
                                return r;
                }
        }
        return 0;
}

/* The binary's ELF interpreter (PT_INTERP), e.g. /lib64/ld-linux-x86-64.so.2. */
static int elf_interp(const char *exe, char *buf, size_t size)
{
        int fd = open(exe, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        Elf64_Ehdr eh;
        int r = -ENOEXEC;
        if (pread(fd, &eh, sizeof(eh), 0) != (ssize_t)sizeof(eh) || memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 ||
            eh.e_ident[EI_CLASS] != ELFCLASS64)
                goto out;
        for (unsigned i = 0; i < eh.e_phnum; i++) {
                Elf64_Phdr ph;
                if (pread(fd, &ph, sizeof(ph), (off_t)(eh.e_phoff + (uint64_t)i * eh.e_phentsize)) != (ssize_t)sizeof(ph))
                        goto out;
                if (ph.p_type != PT_INTERP)
                        continue;
                if (ph.p_filesz == 0 || ph.p_filesz >= size ||
                    pread(fd, buf, ph.p_filesz, (off_t)ph.p_offset) != (ssize_t)ph.p_filesz)
                        goto out;
                buf[ph.p_filesz] = 0;
                r = 0;
                goto out;
        }
        buf[0] = 0; /* static: no interpreter */
        r = 0;
out:
        close(fd);
        return r;
}

static int resolve_binary(const char *name, char *buf, size_t size)
{
        if (strchr(name, '/')) {
                if (!realpath(name, buf))
                        return -errno;
                return access(buf, X_OK) < 0 ? -errno : 0;
        }
        const char *path = getenv("PATH");
        if (!path || !*path)
                path = "/usr/bin:/bin";
        while (*path) {
                size_t n = strcspn(path, ":");
                char cand[4096];
                if (n > 0 && snprintf(cand, sizeof(cand), "%.*s/%s", (int)n, path, name) < (int)sizeof(cand) &&
                    access(cand, X_OK) == 0 && realpath(cand, buf))
                        return 0;
                path += n;
                if (*path == ':')
                        path++;
        }
        return -ENOENT;
}

int qemu_jail_prepare(struct qemu_jail *j, const char *binary, const char *workdir, const char *kernel,
                      const char *initrd, bool kvm, const char *qmp_sock, const char *agent_sock, char *why,
                      size_t whylen)
{
        memset(j, 0, sizeof(*j));
        j->uid_base = QEMU_JAIL_UID_BASE;
        j->fsize_max = QEMU_JAIL_FSIZE_MAX;
        j->cap_last = CAP_LAST_CAP;
        char line[32] = "";
        FILE *f = fopen("/proc/sys/kernel/cap_last_cap", "re");
        if (f) {
                if (fgets(line, sizeof(line), f))
                        j->cap_last = atoi(line);
                fclose(f);
        }
        int r = resolve_binary(binary, j->exe, sizeof(j->exe));
        if (r < 0) {
                qio_set_why(why, whylen, "%s is not installed (Debian package qemu-system-x86)", binary);
                return r;
        }
        if (snprintf(j->root, sizeof(j->root), "%s/jail", workdir) >= (int)sizeof(j->root) ||
            snprintf(j->run_dir, sizeof(j->run_dir), "%s/qemu", workdir) >= (int)sizeof(j->run_dir)) {
                qio_set_why(why, whylen, "the working folder's path is too long");
                return -ENAMETOOLONG;
        }
        if ((mkdir(j->root, 0700) < 0 && errno != EEXIST) || (mkdir(j->run_dir, 0700) < 0 && errno != EEXIST)) {
                r = -errno;
                qio_set_why(why, whylen, "could not create %s and %s: %s", j->root, j->run_dir, strerror(-r));
                return r;
        }
        j->sockets[0] = strdup(qmp_sock);
        j->sockets[1] = strdup(agent_sock);
        j->env[0] = strdup("PATH=/usr/bin:/bin");
        j->env[1] = strdup("LC_ALL=C");
        if (!j->sockets[0] || !j->sockets[1] || !j->env[0] || !j->env[1]) {
                qemu_jail_clear(j);
                return -ENOMEM;
        }

        /* The libraries first: a folder bound whole covers what later paths
         * find inside it. The libraries are where the interpreter really is
         * (Debian: /usr/lib/x86_64-linux-gnu, which also holds QEMU's modules,
         * e.g. its TCG accelerator). */
        char interp[4096], real[4096], what[4200] = "";
        r = elf_interp(j->exe, interp, sizeof(interp));
        if (r < 0) {
                snprintf(what, sizeof(what), "the ELF header of %s", j->exe);
                goto fail;
        }
        if (interp[0]) {
                if (!realpath(interp, real)) {
                        r = -errno;
                        snprintf(what, sizeof(what), "%s", interp);
                        goto fail;
                }
                *strrchr(real, '/') = 0;
                if ((r = expose(j, real, JAIL_BIND_RO, 0)) < 0 || (r = expose(j, interp, JAIL_BIND_RO, 0)) < 0) {
                        snprintf(what, sizeof(what), "%s", interp);
                        goto fail;
                }
        }
        /* Folders before the files that may lie in them: firmware and option
         * ROMs (QEMU's configured data folders) and the loader's cache,
         * wherever they exist; then the binary, the kernel, the initramfs. */
        const char *optional[] = { "/etc/ld.so.cache", "/usr/share/qemu", "/usr/share/seabios", "/usr/lib/ipxe" };
        for (size_t i = 0; i < sizeof(optional) / sizeof(optional[0]); i++)
                if (access(optional[i], F_OK) == 0 && (r = expose(j, optional[i], JAIL_BIND_RO, 0)) < 0) {
                        snprintf(what, sizeof(what), "%s", optional[i]);
                        goto fail;
                }
        const char *need[] = { j->exe, kernel, initrd };
        for (size_t i = 0; i < 3; i++)
                if ((r = expose(j, need[i], JAIL_BIND_RO, 0)) < 0) {
                        snprintf(what, sizeof(what), "%s", need[i]);
                        goto fail;
                }
        const char *devs[] = { "/dev/null", "/dev/zero", "/dev/urandom" };
        for (size_t i = 0; i < 3; i++)
                if ((r = expose(j, devs[i], JAIL_BIND_DEV, 0)) < 0) {
                        snprintf(what, sizeof(what), "%s", devs[i]);
                        goto fail;
                }
        /* The host's /dev/kvm is root's (Debian: 0660 root:kvm): the jail
         * gets a node of its own for the same device, QEMU's uid's alone, as
         * Firecracker's jailer makes it. */
        if (kvm) {
                struct stat st;
                snprintf(what, sizeof(what), "/dev/kvm");
                if (stat("/dev/kvm", &st) < 0) {
                        r = -errno;
                        goto fail;
                }
                if (!S_ISCHR(st.st_mode)) {
                        r = -ENODEV;
                        goto fail;
                }
                if ((r = add_op(j, JAIL_NODE, true, "/dev/kvm", NULL)) < 0)
                        goto fail;
                j->ops[j->nops - 1].rdev = st.st_rdev;
                j->nodes = true;
        }
        if ((r = expose(j, j->run_dir, JAIL_BIND_RW, 0)) < 0) {
                snprintf(what, sizeof(what), "%s", j->run_dir);
                goto fail;
        }
        return 0;
fail:
        qio_set_why(why, whylen, "could not prepare QEMU's jail: %s: %s", what, strerror(-r));
        qemu_jail_clear(j);
        return r;
}

/* --- the child's half: async-signal-safe only --- */

static int bind_one(const struct jail_op *o)
{
        if (o->file) {
                int fd = open(o->full, O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
                if (fd < 0 && errno != EEXIST)
                        return -errno;
                if (fd >= 0)
                        close(fd);
        } else if (mkdir(o->full, 0755) < 0 && errno != EEXIST) {
                return -errno;
        }
        if (mount(o->path, o->full, NULL, MS_BIND, NULL) < 0)
                return -errno;
        unsigned long flags = MS_REMOUNT | MS_BIND | MS_NOSUID;
        if (o->kind == JAIL_BIND_RO)
                flags |= MS_RDONLY | MS_NODEV;
        else if (o->kind == JAIL_BIND_RW)
                flags |= MS_NODEV | MS_NOEXEC;
        else
                flags |= MS_NOEXEC;
        if (mount(NULL, o->full, NULL, flags, NULL) < 0)
                return -errno;
        return 0;
}

#define FAIL(step)                      \
        do {                            \
                *ret_step = (step);     \
                return -errno;          \
        } while (0)

int qemu_jail_enter(const struct qemu_jail *j, int keep_fd, int *ret_step, int *ret_op)
{
        *ret_op = -1;
        uid_t id = (uid_t)(j->uid_base + (uint32_t)getpid());

        /* QEMU's folder and the sockets it connects to are its own and no one
         * else's: the daemon, root, reaches them anyway. */
        if (chown(j->run_dir, id, id) < 0 || chmod(j->run_dir, 0700) < 0)
                FAIL(JAIL_STEP_CHOWN);
        for (size_t i = 0; j->sockets[i]; i++)
                if (chown(j->sockets[i], id, id) < 0 || chmod(j->sockets[i], 0600) < 0)
                        FAIL(JAIL_STEP_CHOWN);

        /* After the cgroup was entered: the cgroup namespace is rooted there. */
        if (unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP) < 0)
                FAIL(JAIL_STEP_UNSHARE);
        if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
                FAIL(JAIL_STEP_PRIVATE);
        if (mount("tally-qemu-jail", j->root, "tmpfs", MS_NOSUID | (j->nodes ? 0 : MS_NODEV),
                  "mode=0755,size=256k,nr_inodes=512") < 0)
                FAIL(JAIL_STEP_TMPFS);
        for (size_t i = 0; i < j->nops; i++) {
                const struct jail_op *o = &j->ops[i];
                int r = 0;
                if (o->kind == JAIL_MKDIR)
                        r = mkdir(o->full, 0755) < 0 && errno != EEXIST ? -errno : 0;
                else if (o->kind == JAIL_SYMLINK)
                        r = symlink(o->target, o->full) < 0 ? -errno : 0;
                else if (o->kind == JAIL_NODE)
                        r = mknod(o->full, S_IFCHR | 0600, o->rdev) < 0 || chown(o->full, id, id) < 0 ? -errno : 0;
                else
                        r = bind_one(o);
                if (r < 0) {
                        *ret_op = (int)i;
                        *ret_step = JAIL_STEP_OP;
                        return r;
                }
        }
        if (chdir(j->root) < 0 || syscall(SYS_pivot_root, ".", ".") < 0 || umount2(".", MNT_DETACH) < 0 ||
            chdir("/") < 0)
                FAIL(JAIL_STEP_PIVOT);
        if (mount(NULL, "/", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | (j->nodes ? 0 : MS_NODEV), NULL) < 0)
                FAIL(JAIL_STEP_READONLY);

        /* A write past the limit fails with EFBIG instead of killing QEMU. */
        struct rlimit fsize = { j->fsize_max, j->fsize_max }, core = { 0, 0 };
        struct sigaction ign = { .sa_handler = SIG_IGN };
        if (setrlimit(RLIMIT_FSIZE, &fsize) < 0 || setrlimit(RLIMIT_CORE, &core) < 0 ||
            sigaction(SIGXFSZ, &ign, NULL) < 0)
                FAIL(JAIL_STEP_LIMITS);

        for (int c = 0; c <= j->cap_last; c++)
                if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0 && errno != EINVAL)
                        FAIL(JAIL_STEP_CAPS);
        /* Raw syscalls: glibc's wrappers would signal threads this child does not have. */
        if (syscall(SYS_setgroups, 0, NULL) < 0 || syscall(SYS_setresgid, id, id, id) < 0 ||
            syscall(SYS_setresuid, id, id, id) < 0)
                FAIL(JAIL_STEP_IDS);
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
                FAIL(JAIL_STEP_NNP);

        /* Whatever the daemon had open (its API, the broker, other sandboxes'
         * sockets) does not reach QEMU. */
        if (keep_fd > 3 && syscall(SYS_close_range, 3, (unsigned)keep_fd - 1, CLOSE_RANGE_CLOEXEC) < 0)
                FAIL(JAIL_STEP_FDS);
        if (syscall(SYS_close_range, keep_fd >= 3 ? (unsigned)keep_fd + 1 : 3u, ~0u, CLOSE_RANGE_CLOEXEC) < 0)
                FAIL(JAIL_STEP_FDS);
        if (keep_fd >= 0 && fcntl(keep_fd, F_SETFD, 0) < 0)
                FAIL(JAIL_STEP_FDS);
        return 0;
}
