/* bench_qemu.c — create → first exec result of the qemu backend, N times.
 *
 *   bench-vmm-qemu RUNS ACCEL WORKDIR
 *
 * ACCEL is kvm, tcg or auto (kvm when a KVM guest really boots here, else
 * tcg). Each run creates a cgroup (v1 cpuacct + memory, or one v2 folder)
 * with the VM's memory limit, starts the VM inside it, runs `echo ok` through
 * the guest agent and stops; the time from before the cgroup's mkdir to the
 * command's result is one sample; the time to qemu_vm_start's return (QEMU
 * jailed, started and answering QMP, the guest not yet booted) is another,
 * where the jail's cost shows without the boot's noise. Prints one line a
 * run and a summary line
 *   accel=tcg runs=5 p50_us=... p99_us=... min_us=... max_us=... start_p50_us=... start_p99_us=...
 * Figures are integers (microseconds). */
#include "qemu.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static int64_t now_us(void)
{
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int write_file(const char *path, const char *value)
{
        FILE *f = fopen(path, "we");
        if (!f)
                return -errno;
        fputs(value, f);
        return fclose(f) == 0 ? 0 : -errno;
}

static int cmp(const void *a, const void *b)
{
        int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
        return x < y ? -1 : x > y;
}

/* Nearest-rank percentile of sorted v. */
static int64_t pct(const int64_t *v, int n, int p)
{
        int rank = (p * n + 99) / 100;
        return v[rank < 1 ? 0 : rank - 1];
}

int main(int argc, char **argv)
{
        if (argc != 4 || strcmp(argv[1], "--help") == 0) {
                fprintf(stderr, "Usage: bench-vmm-qemu RUNS kvm|tcg|auto WORKDIR\n");
                return argc == 2 ? 0 : 2;
        }
        int runs = atoi(argv[1]);
        const char *accel = argv[2], *work = argv[3];
        if (runs < 1 || runs > 1000) {
                fprintf(stderr, "RUNS must be 1..1000\n");
                return 2;
        }
        bool kvm = strcmp(accel, "kvm") == 0;
        if (strcmp(accel, "auto") == 0) {
                char why[512] = "";
                kvm = qemu_kvm_boots(work, 30000, why, sizeof(why));
                if (!kvm)
                        fprintf(stderr, "KVM does not boot a guest here (%s); using TCG\n", why);
        }
        bool v2 = access("/sys/fs/cgroup/cgroup.controllers", F_OK) == 0;
        int64_t *samples = calloc((size_t)runs, sizeof(int64_t)), *starts = calloc((size_t)runs, sizeof(int64_t));
        if (!samples || !starts)
                return 1;
        for (int i = 0; i < runs; i++) {
                char name[64], cpu[256], mem[256], f1[300], f2[300], lim[300];
                snprintf(name, sizeof(name), "tally-bench-vmm-qemu-%d-%d", (int)getpid(), i);
                if (v2) {
                        snprintf(cpu, sizeof(cpu), "/sys/fs/cgroup/%s", name);
                        snprintf(mem, sizeof(mem), "/sys/fs/cgroup/%s", name);
                } else {
                        snprintf(cpu, sizeof(cpu), "/sys/fs/cgroup/cpuacct/%s", name);
                        snprintf(mem, sizeof(mem), "/sys/fs/cgroup/memory/%s", name);
                }
                snprintf(f1, sizeof(f1), "%s/cgroup.procs", cpu);
                snprintf(f2, sizeof(f2), "%s/cgroup.procs", mem);
                snprintf(lim, sizeof(lim), "%s/%s", mem, v2 ? "memory.max" : "memory.limit_in_bytes");
                const char *files[] = { f1, v2 ? NULL : f2, NULL };

                int64_t t0 = now_us();
                if (mkdir(cpu, 0755) < 0 || (!v2 && mkdir(mem, 0755) < 0) || write_file(lim, "805306368") < 0) {
                        fprintf(stderr, "could not create cgroup %s: %s\n", cpu, strerror(errno));
                        return 1;
                }
                struct qemu_vm_spec spec = { .vcpus = 1, .mem_mib = 256, .workdir = work, .kvm = kvm };
                struct qemu_vm *vm = NULL;
                char why[512] = "";
                int r = qemu_vm_start(&spec, files, &vm, why, sizeof(why));
                int64_t ts = now_us();
                struct qemu_exec_result res = { 0 };
                if (r == 0) {
                        char *cmd[] = { "echo", "ok", NULL };
                        struct qemu_exec_request req = { .argv = cmd, .timeout_ns = 10000000000LL, .output_cap = 64 };
                        r = qemu_vm_exec(vm, &req, &res, why, sizeof(why));
                }
                int64_t t1 = now_us();
                bool ok = r == 0 && res.exit_code == 0 && strcmp(res.out, "ok\n") == 0;
                qemu_exec_result_clear(&res);
                if (vm)
                        qemu_vm_stop(vm, 2000);
                qemu_vm_free(vm);
                rmdir(cpu);
                if (!v2)
                        rmdir(mem);
                if (!ok) {
                        fprintf(stderr, "run %d failed: %s\n", i, r < 0 ? why : "wrong output");
                        return 1;
                }
                samples[i] = t1 - t0;
                starts[i] = ts - t0;
                printf("run=%d create_exec_us=%lld start_us=%lld\n", i, (long long)samples[i], (long long)starts[i]);
                fflush(stdout);
        }
        qsort(samples, (size_t)runs, sizeof(int64_t), cmp);
        qsort(starts, (size_t)runs, sizeof(int64_t), cmp);
        printf("accel=%s runs=%d p50_us=%lld p99_us=%lld min_us=%lld max_us=%lld start_p50_us=%lld start_p99_us=%lld\n",
               kvm ? "kvm" : "tcg", runs, (long long)pct(samples, runs, 50), (long long)pct(samples, runs, 99),
               (long long)samples[0], (long long)samples[runs - 1], (long long)pct(starts, runs, 50),
               (long long)pct(starts, runs, 99));
        free(samples);
        free(starts);
        return 0;
}
