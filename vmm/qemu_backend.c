/* qemu_backend.c — the "qemu" backend: a sandbox is a QEMU microVM
 * (vmm/qemu/), with QEMU and all its threads in the sandbox's cgroup.
 *
 * This file only adapts vmm/qemu's VM calls to the daemon's backend table;
 * it must not grow VM logic of its own. KVM is used where a KVM guest really
 * boots (probed once, on the first start), TCG elsewhere. */
#include "backend.h"
#include "qemu.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct backend_sandbox {
        struct qemu_vm *vm;
};

/* -1: not probed yet; 0: TCG; 1: KVM. */
static int kvm_choice = -1;
static pthread_mutex_t kvm_lock = PTHREAD_MUTEX_INITIALIZER;

static bool use_kvm(const char *dir)
{
        pthread_mutex_lock(&kvm_lock);
        if (kvm_choice < 0) {
                char why[256] = "";
                kvm_choice = qemu_kvm_usable() && qemu_kvm_boots(dir, 60000, why, sizeof(why));
        }
        bool kvm = kvm_choice == 1;
        pthread_mutex_unlock(&kvm_lock);
        return kvm;
}

static bool qemu_backend_available(char *why, size_t whylen)
{
        return qemu_available(why, whylen);
}

/* The files QEMU's pid goes into: cgroup.procs of every folder of the group. */
static int procs_files(const struct sandbox_cgroup *cg, char files[][PATH_MAX + 16], const char **list)
{
        size_t n = 0;
        for (size_t i = 0; i < cg->ndirs && i < CGROUP_MAX_DIRS; i++) {
                if (snprintf(files[n], PATH_MAX + 16, "%s/cgroup.procs", cg->dirs[i]) >= PATH_MAX + 16)
                        return -ENAMETOOLONG;
                list[n] = files[n];
                n++;
        }
        list[n] = NULL;
        return 0;
}

static int qemu_backend_start(const struct sandbox_spec *spec, const struct sandbox_cgroup *cg, const char *dir,
                              struct backend_sandbox **ret, pid_t *ret_pid, char *why, size_t whylen)
{
        if (spec->image && *spec->image) {
                snprintf(why, whylen, "the qemu backend has one guest image, tally's own; images (\"%.64s\") "
                         "are not supported yet", spec->image);
                return -EINVAL;
        }
        if (spec->command && spec->command[0]) {
                snprintf(why, whylen, "the qemu backend runs no main program; start the sandbox without a "
                         "command and use exec");
                return -EINVAL;
        }
        const char *list[CGROUP_MAX_DIRS + 1];
        char (*files)[PATH_MAX + 16] = calloc(CGROUP_MAX_DIRS, sizeof(*files));
        struct backend_sandbox *sb = calloc(1, sizeof(*sb));
        if (!sb || !files) {
                free(sb);
                free(files);
                return -ENOMEM;
        }
        struct qemu_vm_spec vs = {
                .vcpus = spec->vcpus,
                .mem_mib = spec->mem_bytes >> 20,
                .workdir = dir,
                .kvm = use_kvm(dir),
        };
        int r = procs_files(cg, files, list);
        if (r == 0)
                r = qemu_vm_start(&vs, list, &sb->vm, why, whylen);
        free(files);
        if (r < 0) {
                free(sb);
                return r;
        }
        *ret_pid = qemu_vm_pid(sb->vm);
        *ret = sb;
        return 0;
}

static int qemu_backend_exec(struct backend_sandbox *sb, const struct exec_request *req, struct exec_result *ret,
                             char *why, size_t whylen)
{
        struct qemu_exec_request q = { req->argv, req->stdin_data, req->stdin_len, req->timeout_ns, req->output_cap };
        struct qemu_exec_result res = { 0 };
        int r = qemu_vm_exec(sb->vm, &q, &res, why, whylen);
        if (r < 0)
                return r;
        *ret = (struct exec_result){ res.exit_code, res.timed_out, res.out, res.out_len, res.out_truncated,
                                     res.err, res.err_len, res.err_truncated };
        return 0;
}

static int qemu_backend_pause(struct backend_sandbox *sb) { return qemu_vm_pause(sb->vm); }
static int qemu_backend_resume(struct backend_sandbox *sb) { return qemu_vm_resume(sb->vm); }

static int qemu_backend_fork(struct backend_sandbox *src, const struct sandbox_spec *spec,
                             const struct sandbox_cgroup *cg, const char *dir, struct backend_sandbox **ret,
                             pid_t *ret_pid, bool *ret_processes_copied, char *why, size_t whylen)
{
        return qemu_vm_fork(src->vm, why, whylen);
}

static int qemu_backend_stop(struct backend_sandbox *sb) { return qemu_vm_stop(sb->vm, 3000); }

/* A VM's QMP and agent channels belong to the daemon that started it; a
 * restarted daemon cannot take them over, so it treats the VM as gone (the
 * daemon then ends what is left in its cgroup and publishes its final counter). */
static int qemu_backend_recover(const struct sandbox_record *rec, const struct sandbox_cgroup *cg, const char *dir,
                                struct backend_sandbox **ret)
{
        return -ESRCH;
}

static void qemu_backend_free(struct backend_sandbox *sb)
{
        if (!sb)
                return;
        qemu_vm_free(sb->vm);
        free(sb);
}

const struct backend_ops qemu_backend = {
        .name = "qemu",
        .concurrent_exec = false,
        .available = qemu_backend_available,
        .start = qemu_backend_start,
        .exec = qemu_backend_exec,
        .pause = qemu_backend_pause,
        .resume = qemu_backend_resume,
        .fork = qemu_backend_fork,
        .stop = qemu_backend_stop,
        .recover = qemu_backend_recover,
        .free = qemu_backend_free,
};
