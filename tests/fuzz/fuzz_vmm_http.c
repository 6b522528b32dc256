/* fuzz_vmm_http.c — tally-vmm's local API (vmm/api.c: handle, route; vmm/api_exec.c
 * and every operation of the sandbox manager a request reaches) on hostile bytes.
 *
 * The real daemon runs in this process: vmm_open with the process backend on
 * this machine's real cgroups (a cgroup parent of its own) and the test
 * broker (TALLY_TEST_BROKERS), and vmm_api_start on a unix socket. Each input
 * is sent as the raw bytes of an HTTP request on a fresh connection to that
 * socket and the answer is read to the end. One sandbox, the resident, is
 * kept running between inputs so that the routes on a sandbox reach one:
 * every "$ID" in an input is replaced by its id before it is sent.
 *
 * What an input can cost is bounded, so that a long run can neither fill the
 * host nor leave anything behind:
 *   - the state folder (records, sandbox folders, every disk image) is a
 *     256 MiB tmpfs mounted in a mount namespace of this process's own: a
 *     disk_mib larger than that fails to be made, and the mount goes with
 *     the process;
 *   - every sandbox lives under one cgroup parent whose pids and memory
 *     limits bound all of them together (PARENT_PIDS_MAX, PARENT_MEM_BYTES);
 *   - a lease is at most TIMEOUT_MAX_S, so an exec (whatever its timeout_ms)
 *     ends with its sandbox, and a sandbox left by a crashed run is ended by
 *     its own init within that (scripts/fuzz also removes the cgroup parent);
 *   - after each input every sandbox but the running resident is stopped,
 *     and the input is done only once tally-vmm has removed them: at most the
 *     resident plus what one request makes (a create, or a fork's 10 copies)
 *     are ever alive at once; the resident itself is replaced every
 *     RESIDENT_AGE_MAX_S, so nothing an exec left in it outlives that long;
 *   - exec'd commands run as the sandboxes' unprivileged users in their own
 *     pid, mount, ipc, uts and net namespaces, on their sandbox's disk, niced
 *     as this process is; with loopback only, or with internet through the
 *     daemon's egress proxy when a create asks for it (never the host's
 *     own addresses or loopback services).
 * No limits database: the spend-limit check is off (limits_database_url "").
 *
 * Checked beyond "no crash, no sanitizer report": every answer is an HTTP/1.x
 * status line, a whole request without a body gets one, GET /v1/status still
 * answers 200 after each input, and the sandboxes an input made are gone
 * before the next. */
#include "api.h"
#include "log.h"
#include "support.h"
#include "timeutil.h"
#include "vmm.h"
#include "vmmtest.h"

#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define FAIL(...) do { fprintf(stderr, "fuzz_vmm_http: " __VA_ARGS__); fputc('\n', stderr); abort(); } while (0)

#define STATE_TMPFS_OPTS  "size=256m,mode=0755"
#define TIMEOUT_MAX_S     10
#define RESIDENT_AGE_MAX_S 8                    /* under TIMEOUT_MAX_S: its own lease rarely ends it mid-input */
#define PARENT_PIDS_MAX   "512"
#define PARENT_MEM_BYTES  "2147483648"
#define ANSWER_WAIT_S     (TIMEOUT_MAX_S + 10)  /* an exec lasts at most its sandbox's lease, plus the stop */
#define REMOVE_WAIT_MS    20000                 /* a stopped sandbox goes once the broker took its event */
#define ID_TOKEN          "$ID"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

static struct vmm *vmm;
static struct vmm_api *api;
static char work[PATH_MAX], state[PATH_MAX + 8], sock[sizeof(((struct sockaddr_un *)0)->sun_path)], parent[96],
        host[96];
static char resident[EVENT_ID_MAX + 1];
static int cgroup_version;

static void write_limit(const char *hierarchy, const char *file, const char *value)
{
        char path[512];
        if (cgroup_version == 2)
                snprintf(path, sizeof(path), "/sys/fs/cgroup/%s/%s", parent, file);
        else
                snprintf(path, sizeof(path), "/sys/fs/cgroup/%s/%s/%s", hierarchy, parent, file);
        FILE *f = fopen(path, "we");
        if (!f || fputs(value, f) < 0 || fclose(f) != 0)
                FAIL("could not limit the sandboxes' cgroup parent (%s = %s): %s", path, value, strerror(errno));
}

static void stop(void)
{
        if (vmm)
                vmm_begin_shutdown(vmm);
        if (vmm_api_stop(api, time_mono_ns() + 3 * NS_PER_SEC) < 0)
                _exit(1); /* a request still uses the vmm: nothing can be freed; the leases end the sandboxes */
        api = NULL;
        vmm_close(vmm, time_mono_ns() + 3 * NS_PER_SEC);
        vmm = NULL;
        /* vmm_close leaves sandboxes running (a later tally-vmm would find them): these go. */
        if (*parent)
                test_cgroup_remove(parent, cgroup_version);
        if (*work) {
                umount2(work, MNT_DETACH);
                rmdir(work);
        }
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
        (void)argc, (void)argv;
        log_set_level(LOG_LEVEL_WARN);
        const char *brokers = test_env("TALLY_TEST_BROKERS");
        /* Before any thread: unshare(CLONE_NEWNS) refuses a threaded process. */
        if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
                FAIL("could not make a mount namespace of its own (needs root): %s", strerror(errno));
        const char *tmp = getenv("TALLY_TEST_WORK");
        if (!tmp || !*tmp)
                tmp = getenv("TMPDIR");
        snprintf(work, sizeof(work), "%s/fuzz-vmm-http.XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(work)) {
                *work = '\0';
                FAIL("could not make a work folder: %s", strerror(errno));
        }
        if (mount("tally-fuzz-vmm", work, "tmpfs", MS_NOSUID | MS_NODEV, STATE_TMPFS_OPTS) < 0)
                FAIL("could not mount a tmpfs on %s: %s", work, strerror(errno));
        snprintf(state, sizeof(state), "%s/state", work);
        if (snprintf(sock, sizeof(sock), "%s/vmm.sock", work) >= (int)sizeof(sock))
                FAIL("the work folder's path %s is too long for a unix socket", work);
        /* scripts/fuzz names it, to remove it after a run that crashed. */
        const char *named = getenv("TALLY_FUZZ_VMM_CGROUP");
        if (named && *named)
                snprintf(parent, sizeof(parent), "%s", named);
        else
                snprintf(parent, sizeof(parent), "tally-fuzz-vmm-%d", (int)getpid());
        snprintf(host, sizeof(host), "fuzz-vmm-%d", (int)getpid());
        atexit(stop);
        struct vmm_settings s = {
                .state_dir = state, .host_id = host, .backend = "process", .cgroup_mount = "",
                .cgroup_parent = parent, .kafka_brokers = brokers, .kafka = NULL, .limits_database_url = "",
                .blocked_key_query = "", .timeout_max_s = TIMEOUT_MAX_S, .final_wait_ms = 0,
                .exec_timeout_default_ms = 2000, .exec_output_cap_default = 65536,
                .capacity = { .memory_overcommit_pct = 100, .vcpu_overcommit_pct = 1600, .disk_overcommit_pct = 100 },
        };
        char err[1024] = "";
        if (vmm_open(&s, &vmm, err, sizeof(err)) < 0)
                FAIL("could not start the vmm: %s", err);
        json_t *st = vmm_status(vmm);
        cgroup_version = (int)json_integer_value(json_object_get(st, "cgroup_version"));
        json_decref(st);
        write_limit("pids", "pids.max", PARENT_PIDS_MAX);
        write_limit("memory", cgroup_version == 2 ? "memory.max" : "memory.limit_in_bytes", PARENT_MEM_BYTES);
        const struct vmm_api_settings as = {
                .idle_timeout_s = 2, .connections_max = 64, .connections_per_client = 64,
                .output_held_max = 2 * VMM_EXEC_OUTPUT_CAP_MAX,
        };
        if (vmm_api_start(vmm, sock, &as, &api, err, sizeof(err)) < 0)
                FAIL("could not start the API: %s", err);
        return 0;
}

/* A running resident sandbox: made anew once it is RESIDENT_AGE_MAX_S old
 * (what an exec left running in the background in it, a CPU burner say,
 * goes with it), or once an input stopped or paused it (remove_others). */
static void ensure_resident(void)
{
        static int64_t born;
        char why[512] = "";
        json_t *sb = NULL;
        if (*resident && time_mono_ns() - born < RESIDENT_AGE_MAX_S * NS_PER_SEC &&
            vmm_show(vmm, resident, &sb, why, sizeof(why)) == 0) {
                bool running = strcmp(test_jstr(sb, "state"), "running") == 0;
                json_decref(sb);
                if (running)
                        return;
        }
        if (*resident)
                vmm_stop(vmm, resident, "fuzz", why, sizeof(why)); /* removed with the input's own (remove_others) */
        *resident = '\0';
        born = time_mono_ns();
        /* Small: a tmpfs disk (under the 8 MiB that makes an ext4 image), few processes. */
        json_t *body = json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:{s:s}}", "account", "fuzz", "key", "fuzz",
                                 "memory_mib", 64, "disk_mib", 4, "pids_max", 64, "timeout_s", TIMEOUT_MAX_S,
                                 "labels", "fuzz", "vmm-http");
        struct create_request req;
        if (create_request_parse(body, vmm_get_limits(vmm), &req, why, sizeof(why)) < 0)
                FAIL("the resident sandbox's request: %s", why);
        json_decref(body);
        int r = vmm_create(vmm, &req, &sb, why, sizeof(why));
        create_request_clear(&req);
        if (r < 0)
                FAIL("could not create the resident sandbox: %s", why);
        snprintf(resident, sizeof(resident), "%s", test_jstr(sb, "id"));
        json_decref(sb);
}

/* Stops every sandbox but a running resident, and waits until tally-vmm has
 * removed them (cgroup, record, folder). */
static void remove_others(void)
{
        int64_t until = time_mono_ns() + REMOVE_WAIT_MS * NS_PER_MS;
        for (;;) {
                json_t *list = vmm_list(vmm, NULL);
                size_t i, others = 0;
                json_t *sb;
                json_array_foreach(list, i, sb) {
                        const char *id = test_jstr(sb, "id");
                        bool is_resident = strcmp(id, resident) == 0;
                        if (is_resident && strcmp(test_jstr(sb, "state"), "running") == 0)
                                continue;
                        if (is_resident)
                                *resident = '\0'; /* paused or stopped: made anew before the next input */
                        others++;
                        char why[512] = "";
                        if (strcmp(test_jstr(sb, "state"), "stopped") != 0 && vmm_stop(vmm, id, "fuzz", why,
                                                                                       sizeof(why)) < 0)
                                FAIL("could not stop sandbox %s: %s", id, why);
                }
                json_decref(list);
                if (!others)
                        return;
                if (time_mono_ns() >= until)
                        FAIL("%zu sandboxes were not removed within %d ms of their stop", others, REMOVE_WAIT_MS);
                time_sleep_ns(20 * NS_PER_MS);
        }
}

/* The input with every ID_TOKEN replaced by the resident's id (malloc'd, *len set). */
static char *with_ids(const uint8_t *data, size_t size, size_t *len)
{
        size_t tok = strlen(ID_TOKEN), idlen = strlen(resident), n = 0;
        for (const uint8_t *p = data; (p = memmem(p, size - (size_t)(p - data), ID_TOKEN, tok)); p += tok)
                n++;
        char *out = malloc(size + n * idlen + 1), *w = out;
        if (!out)
                FAIL("out of memory");
        const uint8_t *p = data, *end = data + size;
        for (const uint8_t *hit; (hit = memmem(p, (size_t)(end - p), ID_TOKEN, tok)); p = hit + tok) {
                memcpy(w, p, (size_t)(hit - p));
                w += hit - p;
                memcpy(w, resident, idlen);
                w += idlen;
        }
        memcpy(w, p, (size_t)(end - p));
        w += end - p;
        *len = (size_t)(w - out);
        return out;
}

/* Sends req on a fresh connection to the socket, reads the answer to the end
 * (at most cap bytes kept) into out; returns its length, or -1 if the
 * connection failed. */
static ssize_t exchange(const void *req, size_t len, char *out, size_t cap)
{
        struct sockaddr_un a = { .sun_family = AF_UNIX };
        memcpy(a.sun_path, sock, sizeof(sock));
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
                if (fd >= 0)
                        close(fd);
                return -1;
        }
        return (ssize_t)test_http_exchange(fd, req, len, out, cap, ANSWER_WAIT_S, false);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        if (!vmm)
                LLVMFuzzerInitialize(NULL, NULL);
        static char out[1 << 16];
        ensure_resident();
        size_t len;
        char *req = with_ids(data, size, &len);
        ssize_t n = exchange(req, len, out, sizeof(out) - 1);
        bool due = test_http_answer_due(req, len);
        free(req);
        if (n < 0)
                FAIL("could not connect to the API");
        if (n == 0 && due)
                FAIL("a whole request without a body got no answer");
        out[n] = '\0';
        if (n > 0 && strncmp(out, "HTTP/1.", 7) != 0)
                FAIL("an answer that is not HTTP: %.80s", out);
        static const char status[] = "GET /v1/status HTTP/1.1\r\nHost: x\r\n\r\n";
        n = exchange(status, sizeof(status) - 1, out, sizeof(out) - 1);
        if (n < 12 || strncmp(out + 9, "200", 3) != 0) {
                out[n < 0 ? 0 : n] = '\0';
                FAIL("the API stopped answering GET /v1/status: %.200s", out);
        }
        remove_others();
        return 0;
}
