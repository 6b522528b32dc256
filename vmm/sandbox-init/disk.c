/* disk.c — see disk.h. */
#include "disk.h"
#include "beneath.h"
#include "builder.h"
#include "jail.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/loop.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

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

void make_disk(const char *work, uint64_t bytes, uint32_t base)
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

/* /tmp is the disk's .tmp, bound from a descriptor: a folder of the disk's
 * own file system, opened beneath the disk's root without following a link.
 * Anything else in its place (a link to "/", to /proc, a file) is removed
 * and a fresh folder made: never followed. */
void make_tmp(int workfd, const char *tmp, uint32_t base)
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
