/* backend_qemu.c — the qemu backend as tally-vmm's backend table sees it
 * (vmm/backend.h): a thin mapping onto qemu.h, nothing more.
 *
 * Built only when the daemon's vmm/backend.h sits beside vmm/qemu/ (see
 * meson.build), so the QEMU library itself never depends on the daemon.
 * KVM or TCG is decided once per daemon, by booting one small KVM guest
 * (qemu_kvm_boots): a /dev/kvm that opens is not proof that KVM works. */
#include "backend.h"
#include "beneath.h"
#include "log.h"
#include "qemu.h"

#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* How long stop waits for QEMU to quit before SIGKILL. */
#define STOP_GRACE_MS 3000
/* How long the KVM probe waits for its guest. */
#define KVM_PROBE_MS 20000

struct backend_sandbox {
        struct qemu_vm *vm;
};

static pthread_mutex_t accel_lock = PTHREAD_MUTEX_INITIALIZER;
static int accel_kvm = -1; /* -1: not decided yet */

/* KVM when TALLY_QEMU_ACCEL says so, or (unset / "auto") when a KVM guest
 * boots here; decided with the first sandbox, in its folder. */
static bool use_kvm(const char *dir)
{
        pthread_mutex_lock(&accel_lock);
        if (accel_kvm < 0) {
                const char *want = getenv("TALLY_QEMU_ACCEL");
                char why[512] = "";
                if (want && strcmp(want, "tcg") == 0)
                        accel_kvm = 0;
                else if (want && strcmp(want, "kvm") == 0)
                        accel_kvm = 1;
                else
                        accel_kvm = qemu_kvm_boots(dir, KVM_PROBE_MS, why, sizeof(why));
                log_info("qemu accelerator chosen", "accel=%s why=\"%s\"", accel_kvm ? "kvm" : "tcg",
                         accel_kvm ? "a KVM guest boots" : *why ? why : "asked for");
        }
        bool kvm = accel_kvm == 1;
        pthread_mutex_unlock(&accel_lock);
        return kvm;
}

/* For "auto": probes KVM once, in a scratch folder removed afterwards. */
static bool qemu_backend_accelerated(void)
{
        if (!qemu_kvm_usable())
                return false;
        char dir[] = "/tmp/tally-kvm-probe.XXXXXX";
        if (!mkdtemp(dir))
                return false;
        bool kvm = use_kvm(dir);
        beneath_remove_tree(dir); /* QEMU's folder in it is the jailed QEMU's to write */
        return kvm;
}

/* "<dir>/cgroup.procs" for every folder of the sandbox's cgroup (malloc'd,
 * NULL-terminated). */
static char **procs_files(const struct sandbox_cgroup *cg)
{
        char **files = calloc(cg->ndirs + 1, sizeof(char *));
        if (!files)
                return NULL;
        for (size_t i = 0; i < cg->ndirs; i++) {
                if (asprintf(&files[i], "%s/cgroup.procs", cg->dirs[i]) < 0) {
                        files[i] = NULL;
                        for (size_t j = 0; j < i; j++)
                                free(files[j]);
                        free(files);
                        return NULL;
                }
        }
        return files;
}

static void procs_files_free(char **files)
{
        for (size_t i = 0; files && files[i]; i++)
                free(files[i]);
        free(files);
}

static bool qemu_backend_available(char *why, size_t whylen)
{
        return qemu_available(why, whylen);
}

/* The sandbox's main program, if any, runs in the background in the guest,
 * its output discarded; commands come and go through exec. */
static int start_command(struct qemu_vm *vm, char **command, char *why, size_t whylen)
{
        size_t n = 0;
        while (command[n])
                n++;
        char **argv = calloc(n + 5, sizeof(char *));
        if (!argv)
                return -ENOMEM;
        argv[0] = "sh";
        argv[1] = "-c";
        argv[2] = "\"$@\" </dev/null >/dev/null 2>&1 &";
        argv[3] = "sh";
        memcpy(argv + 4, command, n * sizeof(char *));
        struct qemu_exec_request req = { .argv = argv, .timeout_ns = 30000000000LL, .output_cap = 4096 };
        struct qemu_exec_result res = { 0 };
        int r = qemu_vm_exec(vm, &req, &res, why, whylen);
        free(argv);
        if (r == 0 && res.exit_code != 0) {
                snprintf(why, whylen, "the main program could not be started in the guest (exit %d)", res.exit_code);
                r = -EIO;
        }
        qemu_exec_result_clear(&res);
        return r;
}

static int qemu_backend_start(const struct sandbox_spec *spec, const struct sandbox_cgroup *cg, const char *dir,
                              struct backend_sandbox **ret, pid_t *ret_pid, char *why, size_t whylen)
{
        if (spec->image && *spec->image && strcmp(spec->image, "default") != 0) {
                snprintf(why, whylen, "the qemu backend boots tally's guest image only, not \"%.64s\"", spec->image);
                return -EINVAL;
        }
        if (spec->internet) {
                snprintf(why, whylen, "the qemu backend has no internet yet (its guest has no network device): "
                         "ask for network false, or use the process backend");
                return -EOPNOTSUPP;
        }
        struct backend_sandbox *sb = calloc(1, sizeof(*sb));
        char **files = procs_files(cg);
        if (!sb || !files) {
                free(sb);
                procs_files_free(files);
                return -ENOMEM;
        }
        struct qemu_vm_spec vs = {
                .vcpus = spec->vcpus, .mem_mib = spec->mem_bytes >> 20, .workdir = dir, .kvm = use_kvm(dir),
        };
        int r = qemu_vm_start(&vs, (const char *const *)files, &sb->vm, why, whylen);
        procs_files_free(files);
        if (r == 0 && spec->command && spec->command[0]) {
                r = start_command(sb->vm, spec->command, why, whylen);
                if (r < 0)
                        qemu_vm_stop(sb->vm, STOP_GRACE_MS);
        }
        if (r < 0) {
                qemu_vm_free(sb->vm);
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
        struct qemu_exec_request q = {
                .argv = req->argv, .stdin_data = req->stdin_data, .stdin_len = req->stdin_len,
                .timeout_ns = req->timeout_ns, .output_cap = req->output_cap,
        };
        struct qemu_exec_result res;
        int r = qemu_vm_exec(sb->vm, &q, &res, why, whylen);
        if (r < 0)
                return r;
        *ret = (struct exec_result){
                .exit_code = res.exit_code, .timed_out = res.timed_out,
                .out = res.out, .out_len = res.out_len, .out_truncated = res.out_truncated,
                .err = res.err, .err_len = res.err_len, .err_truncated = res.err_truncated,
        };
        return 0;
}

static int qemu_backend_pause(struct backend_sandbox *sb)
{
        return qemu_vm_pause(sb->vm);
}

static int qemu_backend_resume(struct backend_sandbox *sb)
{
        return qemu_vm_resume(sb->vm);
}

static int qemu_backend_fork(struct backend_sandbox *src, const struct sandbox_spec *spec,
                             const struct sandbox_cgroup *cg, const char *dir, struct backend_sandbox **ret,
                             pid_t *ret_pid, bool *ret_processes_copied, char *why, size_t whylen)
{
        struct backend_sandbox *sb = calloc(1, sizeof(*sb));
        char **files = procs_files(cg);
        if (!sb || !files) {
                free(sb);
                procs_files_free(files);
                return -ENOMEM;
        }
        struct qemu_vm_spec vs = { .workdir = dir };
        int r = qemu_vm_fork(src->vm, &vs, (const char *const *)files, &sb->vm, why, whylen);
        procs_files_free(files);
        if (r < 0) {
                free(sb);
                return r;
        }
        *ret_pid = qemu_vm_pid(sb->vm);
        *ret_processes_copied = true;
        *ret = sb;
        return 0;
}

static int qemu_backend_stop(struct backend_sandbox *sb)
{
        pid_t pid = qemu_vm_pid(sb->vm);
        int r = qemu_vm_stop(sb->vm, STOP_GRACE_MS);
        if (r < 0)
                log_warn("could not stop QEMU", "pid=%d error=\"%s\"", (int)pid, strerror(-r));
        return r;
}

static int qemu_backend_recover(const struct sandbox_record *rec, const struct sandbox_cgroup *cg, const char *dir,
                                struct backend_sandbox **ret)
{
        struct backend_sandbox *sb = calloc(1, sizeof(*sb));
        if (!sb)
                return -ENOMEM;
        char why[512] = "";
        int r = qemu_vm_attach(dir, rec->pid, &sb->vm, why, sizeof(why));
        if (r < 0) {
                log_warn("could not take over a qemu sandbox", "sandbox=%s pid=%d error=\"%s\"", rec->id,
                         (int)rec->pid, why);
                free(sb);
                return r;
        }
        *ret = sb;
        return 0;
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
        /* A 160 MiB guest's QEMU peaked at about 190 MiB in its cgroup under TCG (260 MiB when a
         * fork's state went through a file). */
        .memory_overhead_bytes = UINT64_C(256) << 20,
        .available = qemu_backend_available,
        .accelerated = qemu_backend_accelerated,
        .start = qemu_backend_start,
        .exec = qemu_backend_exec,
        .pause = qemu_backend_pause,
        .resume = qemu_backend_resume,
        .fork = qemu_backend_fork,
        .stop = qemu_backend_stop,
        .recover = qemu_backend_recover,
        .free = qemu_backend_free,
};
