/* bench-vmm — times create → first exec result against a running tally-vmm,
 * the way an agent sees it: one HTTP request creating the sandbox, one running
 * `echo ready` in it, measured from before the first to after the second.
 * Each sandbox is stopped afterwards (not timed).
 *
 *   bench-vmm SOCKET BACKEND COUNT [internet]
 * With "internet" each sandbox has internet through the egress proxy (an
 * allow-list of one name): its network namespace's proxy listener is part of
 * the time. Prints one line: "n=N p50_us=... p99_us=... min_us=... max_us=..." or a
 * line starting with "error:". Integers only. */
#include "cli.h"
#include "timeutil.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* One POST through the CLI's own client; NULL when the daemon gave no JSON. */
static json_t *post(const char *sock, const char *path, json_t *body, long *status)
{
        json_t *j = NULL;
        *status = vmm_api_call(sock, "POST", path, body, &j);
        return j;
}

static int64_t now_us(void)
{
        return time_mono_ns() / NS_PER_US;
}

static int cmp(const void *a, const void *b)
{
        int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
        return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
        if (argc != 4 && !(argc == 5 && strcmp(argv[4], "internet") == 0)) {
                fprintf(stderr, "usage: bench-vmm SOCKET BACKEND COUNT [internet]\n");
                return 2;
        }
        const char *sock = argv[1], *backend = argv[2];
        int count = atoi(argv[3]);
        if (count < 1 || count > 100000) {
                fprintf(stderr, "bench-vmm: COUNT must be 1..100000\n");
                return 2;
        }
        int64_t *samples = calloc((size_t)count, sizeof(*samples));
        json_t *create = json_pack("{s:s, s:s, s:s, s:i, s:i, s:i}", "account", "bench-account", "key", "bench-key",
                                   "backend", backend, "vcpus", 1, "memory_mib", 256, "timeout_s", 600);
        if (argc == 5)
                json_object_set_new(create, "network", json_pack("{s:b, s:[s]}", "internet", 1, "allow", "example.com"));
        json_t *exec = json_pack("{s:[s,s], s:i}", "command", "echo", "ready", "timeout_ms", 60000);
        int status = 0;
        for (int i = 0; i < count; i++) {
                long code;
                int64_t t0 = now_us();
                json_t *sb = post(sock, "/sandboxes", create, &code);
                const char *id = json_string_value(json_object_get(sb, "id"));
                if (code != 201 || !id) {
                        const char *e = json_string_value(json_object_get(sb, "error"));
                        printf("error: create answered %ld: %s\n", code, e ? e : "(no answer)");
                        status = 1;
                        json_decref(sb);
                        break;
                }
                char path[128];
                snprintf(path, sizeof(path), "/sandboxes/%s/exec", id);
                json_t *res = post(sock, path, exec, &code);
                int64_t t1 = now_us();
                const char *out = json_string_value(json_object_get(res, "stdout"));
                if (code != 200 || !out || strcmp(out, "ready\n") != 0) {
                        printf("error: exec answered %ld\n", code);
                        status = 1;
                }
                samples[i] = t1 - t0;
                snprintf(path, sizeof(path), "/sandboxes/%s/stop", id);
                json_t *empty = json_object();
                json_decref(post(sock, path, empty, &code));
                json_decref(empty);
                json_decref(res);
                json_decref(sb);
                if (status)
                        break;
        }
        if (status == 0) {
                qsort(samples, (size_t)count, sizeof(*samples), cmp);
                /* nearest rank: the smallest sample with at least p% of samples at or below it */
                int64_t p50 = samples[(count * 50 + 99) / 100 - 1], p99 = samples[(count * 99 + 99) / 100 - 1];
                printf("n=%d p50_us=%lld p99_us=%lld min_us=%lld max_us=%lld\n", count, (long long)p50,
                       (long long)p99, (long long)samples[0], (long long)samples[count - 1]);
        }
        json_decref(create);
        json_decref(exec);
        free(samples);
        return status;
}
