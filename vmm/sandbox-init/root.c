/* root.c — see root.h. */
#include "root.h"
#include "builder.h"
#include "copy.h"
#include "disk.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

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

void make_root(const char *root, uint64_t disk_bytes, uint32_t base, bool network)
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
