/* takeover.c — a restarted daemon takes over the QEMUs its predecessor
 * started (qemu_vm_attach, see qemu.h).
 *
 * A QEMU's chardevs reconnect (reconnect=1): once the daemon that held the
 * other ends exited, QEMU retries every second. The new daemon recognizes
 * the QEMU by its command line (its QMP socket is the sandbox's; a recycled
 * pid is not taken for it), listens again at the socket paths, gives them
 * to the jailed QEMU's uid, and takes the connections. */
#include "beneath.h"
#include "sockio.h"
#include "vm.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Copies src into dst, truncating to size - 1 bytes. */
static void copy_str(char *dst, size_t size, const char *src)
{
        size_t n = strnlen(src, size - 1);
        memcpy(dst, src, n);
        dst[n] = 0;
}

/* The path in a "socket,id=ID,path=PATH,..." argument, into buf. */
static bool socket_arg_path(const char *arg, const char *id, char *buf, size_t size)
{
        char key[64];
        snprintf(key, sizeof(key), "socket,id=%s,path=", id);
        if (strncmp(arg, key, strlen(key)) != 0)
                return false;
        const char *p = arg + strlen(key);
        size_t n = strcspn(p, ",");
        if (n >= size)
                return false;
        memcpy(buf, p, n);
        buf[n] = 0;
        return true;
}

/* Whether /proc/<pid>/cmdline is the QEMU of workdir: its QMP socket is
 * workdir's (<workdir>/qemu/qmp.sock; <workdir>/qmp.sock for a QEMU started
 * before the jail). Guards against a recycled pid. Fills vm's machine and
 * socket paths; *ret_kvm says whether it runs on KVM. */
static bool is_our_qemu(pid_t pid, const char *workdir, bool *ret_kvm, struct qemu_vm *vm)
{
        char p[64], buf[16384];
        snprintf(p, sizeof(p), "/proc/%d/cmdline", (int)pid);
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
                return false;
        ssize_t n = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (n <= 0)
                return false;
        buf[n] = 0;
        char jailed[4200], old[4200];
        snprintf(jailed, sizeof(jailed), "%s/qemu/qmp.sock", workdir);
        snprintf(old, sizeof(old), "%s/qmp.sock", workdir);
        bool ours = false, kvm = false;
        for (char *a = buf; a < buf + n; a += strlen(a) + 1) {
                if (socket_arg_path(a, "qmp", vm->qmp_path, sizeof(vm->qmp_path)))
                        ours = strcmp(vm->qmp_path, jailed) == 0 || strcmp(vm->qmp_path, old) == 0;
                socket_arg_path(a, "agent", vm->agent_path, sizeof(vm->agent_path));
                if (strcmp(a, "kvm") == 0)
                        kvm = true;
                const char *next = a + strlen(a) + 1;
                if (next >= buf + n)
                        continue;
                if (a == buf)
                        copy_str(vm->qemu, sizeof(vm->qemu), a);
                if (strcmp(a, "-smp") == 0)
                        vm->vcpus = (uint32_t)strtoul(next, NULL, 10);
                else if (strcmp(a, "-m") == 0)
                        vm->mem_mib = strtoull(next, NULL, 10);
                else if (strcmp(a, "-kernel") == 0)
                        copy_str(vm->kernel, sizeof(vm->kernel), next);
                else if (strcmp(a, "-initrd") == 0)
                        copy_str(vm->initrd, sizeof(vm->initrd), next);
        }
        *ret_kvm = kvm;
        return ours && vm->agent_path[0];
}

/* The real uid and gid of pid (its jail's), from /proc. */
static int process_ids(pid_t pid, uid_t *ret_uid, gid_t *ret_gid)
{
        char p[64], line[256];
        snprintf(p, sizeof(p), "/proc/%d/status", (int)pid);
        FILE *f = fopen(p, "re");
        if (!f)
                return -errno;
        unsigned long uid = 0, gid = 0;
        int found = 0;
        while (fgets(line, sizeof(line), f)) {
                if (sscanf(line, "Uid: %lu", &uid) == 1)
                        found |= 1;
                else if (sscanf(line, "Gid: %lu", &gid) == 1)
                        found |= 2;
        }
        fclose(f);
        if (found != 3)
                return -EIO;
        *ret_uid = (uid_t)uid;
        *ret_gid = (gid_t)gid;
        return 0;
}

/* Listens at vm's socket paths again, gives them to QEMU's uid, takes QEMU's
 * connections and greets both ends. */
static int reconnect(struct qemu_vm *vm, const char *workdir, uid_t uid, gid_t gid, char *why, size_t whylen)
{
        pid_t pid = vm->pid; /* vm->pid becomes 0 if QEMU goes meanwhile */
        int r, qmp_l = qio_listen_unix(vm->qmp_path), agent_l = qio_listen_unix(vm->agent_path);
        if (qmp_l < 0 || agent_l < 0) {
                r = qmp_l < 0 ? qmp_l : agent_l;
                qio_set_why(why, whylen, "could not listen in %s: %s", workdir, strerror(-r));
                goto out;
        }
        /* The jailed QEMU connects as its own uid, to sockets only it (and root) may use. It
         * runs, and its folder is its own: a link it put in a socket's place is never followed. */
        if (uid != 0 && ((r = beneath_give(vm->qmp_path, uid, gid, 0600)) < 0 ||
                         (r = beneath_give(vm->agent_path, uid, gid, 0600)) < 0)) {
                qio_set_why(why, whylen, "could not give QEMU %d its sockets: %s", (int)pid, strerror(-r));
                goto out;
        }
        /* QEMU retries its connections every second (reconnect=1). */
        int64_t deadline = time_mono_ms() + QEMU_CONNECT_TIMEOUT_MS;
        int qmp = vm_accept(vm, qmp_l, deadline), agent = qmp < 0 ? -1 : vm_accept(vm, agent_l, deadline);
        r = qmp < 0 ? qmp : agent < 0 ? agent : 0;
        if (qmp >= 0)
                vm->qmp.fd = qmp;
        if (agent >= 0)
                vm->agent.fd = agent;
        if (r < 0) {
                qio_set_why(why, whylen, "QEMU %d did not reconnect: %s", (int)pid, strerror(-r));
                goto out;
        }
        r = qmp_handshake(&vm->qmp, deadline);
        if (r >= 0)
                r = agent_chan_ping(&vm->agent); /* the next wait for ready takes the answer */
        if (r < 0)
                qio_set_why(why, whylen, "QEMU %d did not answer after reconnecting: %s", (int)pid, strerror(-r));
out:
        if (qmp_l >= 0)
                close(qmp_l);
        if (agent_l >= 0)
                close(agent_l);
        unlink(vm->qmp_path);
        unlink(vm->agent_path);
        return r;
}

int qemu_vm_attach(const char *workdir, pid_t pid, struct qemu_vm **ret, char *why, size_t whylen)
{
        bool kvm = false;
        struct qemu_vm *vm = vm_alloc(false, 0);
        if (!vm)
                return -ENOMEM;
        if (pid <= 0 || !is_our_qemu(pid, workdir, &kvm, vm)) {
                qio_set_why(why, whylen, "no QEMU of this sandbox runs as pid %d", (int)pid);
                qemu_vm_free(vm);
                return -ESRCH;
        }
        vm->pid = pid;
        vm->child = false;
        vm->accel = kvm ? "kvm" : "tcg";
        snprintf(vm->log_path, sizeof(vm->log_path), "%s/qemu.log", workdir);
        uid_t uid = 0;
        gid_t gid = 0;
        int r = process_ids(pid, &uid, &gid);
        if (r < 0)
                qio_set_why(why, whylen, "could not read QEMU %d's uid: %s", (int)pid, strerror(-r));
        else
                r = reconnect(vm, workdir, uid, gid, why, whylen);
        if (r < 0) {
                qemu_vm_free(vm);
                return r;
        }
        *ret = vm;
        return 0;
}
