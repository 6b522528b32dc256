/* Unit tests of common/beneath.c, the host-root walks over folders another
 * party writes (a sandbox's disk folder, a jailed QEMU's folder): a link in
 * the tree is never followed and a mount inside is never entered, whether
 * the walk measures (the collector's disk usage) or removes (a sandbox's
 * folder at clean-up). The mounts are real: the test runs as root in a mount
 * namespace of its own, so nothing it mounts reaches the host's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "beneath.h"
#include "unit.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64], host[128], tree[128];

#define BIG (4 << 20) /* the "host" file: 4 MiB of written blocks */

static void write_bytes(const char *path, size_t n)
{
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        assert_true(fd >= 0);
        static char block[65536];
        memset(block, 'x', sizeof(block));
        for (size_t done = 0; done < n; done += sizeof(block))
                assert_int_equal(write(fd, block, sizeof(block)), (ssize_t)sizeof(block));
        assert_int_equal(fsync(fd), 0);
        close(fd);
}

static uint64_t blocks_of(const char *path)
{
        struct stat st;
        assert_int_equal(lstat(path, &st), 0);
        return (uint64_t)st.st_blocks * 512;
}

/* dir/host: a "host" folder with a big file; dir/tree: the folder walked, with
 * a small file, a link to the host folder, and the host folder bound inside. */
static int setup(void **state)
{
        (void)state;
        if (unshare(CLONE_NEWNS) < 0 || mount("none", "/", "none", MS_REC | MS_PRIVATE, NULL) < 0) {
                fprintf(stderr, "test-beneath needs root (a mount namespace of its own): %s\n", strerror(errno));
                return -1;
        }
        snprintf(dir, sizeof(dir), "/tmp/tally-beneath.XXXXXX");
        if (!mkdtemp(dir))
                return -1;
        snprintf(host, sizeof(host), "%s/host", dir);
        snprintf(tree, sizeof(tree), "%s/tree", dir);
        char p[256];
        mkdir(host, 0755);
        mkdir(tree, 0755);
        snprintf(p, sizeof(p), "%s/big", host);
        write_bytes(p, BIG);
        snprintf(p, sizeof(p), "%s/own", tree);
        write_bytes(p, 65536);
        snprintf(p, sizeof(p), "%s/link", tree);
        if (symlink(host, p) < 0)
                return -1;
        snprintf(p, sizeof(p), "%s/sub", tree);
        mkdir(p, 0755);
        snprintf(p, sizeof(p), "%s/sub/mounted", tree);
        mkdir(p, 0755);
        return mount(host, p, "none", MS_BIND, NULL) < 0 ? -1 : 0;
}

static int teardown(void **state)
{
        (void)state;
        char p[256];
        snprintf(p, sizeof(p), "%s/sub/mounted", tree);
        umount2(p, MNT_DETACH);
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
        return system(cmd);
}

/* The walk counts the tree's own file, not the big file behind the link or the mount. */
static void usage_stays_in_its_tree(void **state)
{
        (void)state;
        char own[256];
        snprintf(own, sizeof(own), "%s/own", tree);
        uint64_t want = blocks_of(own); /* the kernel's count of the one file that is the tree's */
        uint64_t got = beneath_usage(tree);
        assert_int_equal(got, want);
        /* a file is its blocks; a link at the top is nothing */
        assert_int_equal(beneath_usage(own), want);
        char link[256];
        snprintf(link, sizeof(link), "%s/link", tree);
        assert_int_equal(beneath_usage(link), 0);
}

/* Removing the tree leaves the host folder and its file, behind the link and
 * under the mount; the mount point's folder stays (it cannot go while mounted). */
static void remove_stays_in_its_tree(void **state)
{
        (void)state;
        char big[256], own[256], mounted[256];
        snprintf(big, sizeof(big), "%s/big", host);
        snprintf(own, sizeof(own), "%s/own", tree);
        snprintf(mounted, sizeof(mounted), "%s/sub/mounted/big", tree);
        assert_int_not_equal(beneath_remove_tree(tree), 0); /* the mount point could not go */
        assert_int_equal(access(big, F_OK), 0);
        assert_int_equal(access(mounted, F_OK), 0);
        assert_int_equal(access(own, F_OK), -1);
        struct stat st;
        assert_int_equal(stat(big, &st), 0);
        assert_int_equal(st.st_size, BIG);
}

/* A link given as the tree is removed as a link, never followed. */
static void remove_link_not_target(void **state)
{
        (void)state;
        char link[256], big[256];
        snprintf(link, sizeof(link), "%s/top-link", dir);
        snprintf(big, sizeof(big), "%s/big", host);
        assert_int_equal(symlink(host, link), 0);
        assert_int_equal(beneath_remove_tree(link), 0);
        assert_int_equal(access(link, F_OK), -1);
        assert_int_equal(access(big, F_OK), 0);
}

/* beneath_open refuses a link, "..", a path of several names and a mount. */
static void open_refuses(void **state)
{
        (void)state;
        int d = open(tree, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        assert_true(d >= 0);
        int probe = beneath_open(d, "own", O_RDONLY, 0);
        if (probe == -ENOSYS) {
                close(d);
                UNIT_SKIP("openat2 is not known here (valgrind 3.19 does not emulate it)");
        }
        close(probe);
        assert_int_equal(beneath_open(d, "link", O_RDONLY, 0), -ELOOP);
        assert_true(beneath_open(d, "link", O_RDONLY | O_DIRECTORY, 0) < 0);
        assert_int_equal(beneath_open(d, "..", O_RDONLY, 0), -EINVAL);
        assert_int_equal(beneath_open(d, "sub/mounted", O_RDONLY, 0), -EINVAL);
        int s = beneath_open(d, "sub", O_RDONLY | O_DIRECTORY, 0);
        assert_true(s >= 0);
        assert_int_equal(beneath_open(s, "mounted", O_RDONLY | O_DIRECTORY, 0), -EXDEV);
        int f = beneath_open(d, "own", O_RDONLY, 0);
        assert_true(f >= 0);
        close(f);
        close(s);
        close(d);
}

/* Giving a path to a jailed uid changes the file there, never what a link in
 * its place names (a jailed QEMU that swapped its socket for a link to a host file). */
static void give_not_through_link(void **state)
{
        (void)state;
        char link[256], big[256], own[256];
        snprintf(link, sizeof(link), "%s/give-link", dir);
        snprintf(big, sizeof(big), "%s/big", host);
        snprintf(own, sizeof(own), "%s/give-own", dir);
        assert_int_equal(symlink(big, link), 0);
        struct stat before, after;
        assert_int_equal(stat(big, &before), 0);
        assert_int_equal(beneath_give(link, 4242, 4243, 0600), -ELOOP);
        assert_int_equal(stat(big, &after), 0);
        assert_int_equal(after.st_uid, before.st_uid);
        assert_int_equal(after.st_mode, before.st_mode);
        write_bytes(own, 65536);
        assert_int_equal(beneath_give(own, 4242, 4243, 0600), 0);
        assert_int_equal(stat(own, &after), 0);
        assert_int_equal(after.st_uid, 4242);
        assert_int_equal(after.st_gid, 4243);
        assert_int_equal(after.st_mode & 07777, 0600);
}

int main(void)
{
        const struct CMUnitTest tests[] = {
                cmocka_unit_test(open_refuses),
                cmocka_unit_test(usage_stays_in_its_tree),
                cmocka_unit_test(remove_link_not_target),
                cmocka_unit_test(give_not_through_link),
                cmocka_unit_test(remove_stays_in_its_tree),
        };
        return unit_status(cmocka_run_group_tests(tests, setup, teardown));
}
