/* fuzz_vmm_api.c — the request bodies of tally-vmm's local API (vmm/api.c):
 * every body is read as api.c's handle() reads it (json_loadb with
 * JSON_REJECT_DUPLICATES), then given to the parsers its routes call:
 * create_request_parse (POST /v1/sandboxes) and command_parse (exec's
 * "command"), both in vmm/spec.c.
 *
 * The parsers alone, fast and with no service behind them; route(), vmm_api_exec()
 * and the vmm behind them get the same bodies inside whole HTTP requests from
 * the target vmm-http (fuzz_vmm_http.c: a real vmm and its API in the
 * fuzzer's process). Checked beyond "no crash": an accepted create request holds
 * what create_request_parse promises (ids valid, sizes inside the limits,
 * a NULL-terminated argv of strings). */
#include "spec.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAIL(...) do { fprintf(stderr, "fuzz_vmm_api: " __VA_ARGS__); fputc('\n', stderr); abort(); } while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_argv(char **argv, const char *what)
{
        size_t n = 0, bytes = 0;
        for (; argv[n]; n++)
                bytes += strlen(argv[n]) + 1;
        if (n == 0)
                FAIL("%s: an empty argv was accepted", what);
        if (n > SPEC_COMMAND_ARGS_MAX + 3 || bytes > SPEC_COMMAND_BYTES_MAX + 64)
                FAIL("%s: %zu arguments, %zu bytes accepted", what, n, bytes);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        const struct vmm_limits limits = { .host_mem_bytes = UINT64_C(8) << 30, .timeout_max_s = 86400 };
        json_error_t jerr;
        json_t *body = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &jerr);
        if (!body)
                return 0;
        char why[512] = "";
        struct create_request req;
        memset(&req, 0, sizeof(req));
        if (create_request_parse(body, &limits, &req, why, sizeof(why)) == 0) {
                if (!event_id_valid(req.account) || (req.key[0] && !event_id_valid(req.key)))
                        FAIL("accepted account \"%s\" key \"%s\"", req.account, req.key);
                if (req.mem_bytes > limits.host_mem_bytes)
                        FAIL("accepted %llu bytes of memory, more than the host's %llu",
                             (unsigned long long)req.mem_bytes, (unsigned long long)limits.host_mem_bytes);
                if (req.timeout_s < 1 || req.timeout_s > limits.timeout_max_s)
                        FAIL("accepted timeout_s %lld", (long long)req.timeout_s);
                if (req.vcpus < 1 || req.pids_max < SPEC_PIDS_MAX_MIN || req.pids_max > SPEC_PIDS_MAX_MAX)
                        FAIL("accepted vcpus %u pids_max %u", req.vcpus, req.pids_max);
                if (req.nlabels > EVENT_LABELS_MAX)
                        FAIL("accepted %zu labels", req.nlabels);
                if (req.command)
                        check_argv(req.command, "create");
                create_request_clear(&req);
        } else if (!why[0]) {
                FAIL("a create request refused without a reason");
        }
        char **argv = NULL;
        why[0] = '\0';
        if (command_parse(json_object_get(body, "command"), "command", &argv, why, sizeof(why)) == 0) {
                if (!argv)
                        FAIL("command_parse succeeded without an argv");
                check_argv(argv, "exec");
                command_free(argv);
        } else if (!why[0]) {
                FAIL("a command refused without a reason");
        }
        json_decref(body);
        return 0;
}
