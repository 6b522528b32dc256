/* beneath.c — see beneath.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "beneath.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

int beneath_open(int dirfd, const char *name, int flags, mode_t mode)
{
        if (!*name || strchr(name, '/') || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
                return -EINVAL;
        struct open_how how = {
                .flags = (uint64_t)(flags | O_NOFOLLOW | O_CLOEXEC),
                .mode = (flags & O_CREAT) ? (uint64_t)mode : 0,
                .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV,
        };
        long fd = syscall(SYS_openat2, dirfd, name, &how, sizeof(how));
        return fd < 0 ? -errno : (int)fd;
}

static bool dot(const char *n)
{
        return n[0] == '.' && (n[1] == '\0' || (n[1] == '.' && n[2] == '\0'));
}

/* Empties the folder dfd (taken: closed here). */
static int remove_in(int dfd, int depth)
{
        DIR *d = fdopendir(dfd);
        if (!d) {
                int r = -errno;
                close(dfd);
                return r;
        }
        int first = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
                if (dot(de->d_name))
                        continue;
                if (unlinkat(dirfd(d), de->d_name, 0) == 0 || errno == ENOENT)
                        continue;
                if (errno != EISDIR && errno != EPERM) {
                        if (!first)
                                first = -errno;
                        continue;
                }
                /* A folder: emptied through a descriptor of its own (a link in its
                 * place, or a mount, is refused by beneath_open), then removed. */
                int r = -ELOOP;
                if (depth < BENEATH_DEPTH_MAX) {
                        int sub = beneath_open(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY, 0);
                        r = sub < 0 ? sub : remove_in(sub, depth + 1);
                }
                if (r == 0 && unlinkat(dirfd(d), de->d_name, AT_REMOVEDIR) < 0 && errno != ENOENT)
                        r = -errno;
                if (r < 0 && r != -ENOENT && !first)
                        first = r;
        }
        closedir(d);
        return first;
}

int beneath_remove_tree(const char *path)
{
        int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0) {
                if (errno != ENOTDIR && errno != ELOOP)
                        return -errno;
                return unlink(path) < 0 ? -errno : 0; /* a file, or a link: unlink never follows one */
        }
        int r = remove_in(fd, 0);
        if (rmdir(path) < 0 && r == 0)
                r = -errno;
        return r;
}

/* Inodes of files with several names already counted (a small table: past
 * it, such a file may count once per name). */
#define SEEN_MAX 1024

struct usage {
        dev_t dev;
        uint64_t bytes;
        ino_t seen[SEEN_MAX];
        int nseen;
};

static void usage_in(struct usage *u, int dfd, int depth)
{
        DIR *d = fdopendir(dfd);
        if (!d) {
                close(dfd);
                return;
        }
        struct dirent *de;
        while ((de = readdir(d))) {
                if (dot(de->d_name))
                        continue;
                struct stat st;
                if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || st.st_dev != u->dev)
                        continue;
                if (S_ISREG(st.st_mode)) {
                        bool counted = false;
                        for (int i = 0; st.st_nlink > 1 && i < u->nseen && !counted; i++)
                                counted = u->seen[i] == st.st_ino;
                        if (counted)
                                continue;
                        if (st.st_nlink > 1 && u->nseen < SEEN_MAX)
                                u->seen[u->nseen++] = st.st_ino;
                        u->bytes += (uint64_t)st.st_blocks * 512;
                } else if (S_ISDIR(st.st_mode) && depth < BENEATH_DEPTH_MAX) {
                        int sub = beneath_open(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY, 0);
                        if (sub >= 0)
                                usage_in(u, sub, depth + 1);
                }
        }
        closedir(d);
}

uint64_t beneath_usage(const char *path)
{
        if (!path || !*path)
                return 0;
        int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
        struct stat st;
        if (fd < 0)
                return 0;
        if (fstat(fd, &st) < 0) {
                close(fd);
                return 0;
        }
        if (S_ISREG(st.st_mode)) {
                close(fd);
                return (uint64_t)st.st_blocks * 512;
        }
        if (!S_ISDIR(st.st_mode)) {
                close(fd);
                return 0;
        }
        static __thread struct usage u;
        u.dev = st.st_dev;
        u.bytes = 0;
        u.nseen = 0;
        usage_in(&u, fd, 0);
        return u.bytes;
}

int beneath_give(const char *path, uid_t uid, gid_t gid, mode_t mode)
{
        int fd = open(path, O_PATH | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
                return -errno;
        struct stat st;
        char self[64];
        snprintf(self, sizeof(self), "/proc/self/fd/%d", fd);
        int r = 0;
        if (fstat(fd, &st) < 0)
                r = -errno;
        else if (S_ISLNK(st.st_mode))
                r = -ELOOP;
        /* chmod through the descriptor's own entry: that is the inode opened, not a path looked up again */
        else if (fchownat(fd, "", uid, gid, AT_EMPTY_PATH) < 0 || chmod(self, mode) < 0)
                r = -errno;
        close(fd);
        return r;
}
