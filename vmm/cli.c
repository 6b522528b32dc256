/* cli.c — see cli.h. Prints what the daemon answers: JSON for single objects,
 * a table for `ls`, and for `exec` the command's own stdout, stderr and exit status.
 * It reaches the daemon through vmm/client.h. */
#include "cli.h"

#include "client.h"

#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const commands[] = { "create", "ls", "exec", "pause", "resume", "fork", "stop", "show",
                                        "timeout", "status", NULL };

int vmm_cli_is_command(const char *name)
{
        for (const char *const *c = commands; *c; c++)
                if (strcmp(*c, name) == 0)
                        return 1;
        return 0;
}

long vmm_api_call(const char *socket_path, const char *method, const char *path, json_t *body, json_t **ret)
{
        /* a wedged daemon is an error, not a hang */
        static const struct vmm_client_options opt = { .connect_timeout_ms = 10000 };
        struct vmm_client *c;
        char full[512], why[256] = "";
        int r = vmm_client_new(socket_path, &opt, &c);
        if (r < 0) {
                fprintf(stderr, "tally-vmm: could not reach the daemon at %s: %s\n", socket_path, strerror(-r));
                return -1;
        }
        snprintf(full, sizeof(full), "/v1%s", path);
        json_t *answer = NULL;
        long status = vmm_client_call(c, method, full, body, &answer, why, sizeof(why));
        vmm_client_free(c);
        if (status < 0) {
                fprintf(stderr, "tally-vmm: could not reach the daemon at %s: %s\n", socket_path, why);
                return -1;
        }
        *ret = answer ? answer : json_object();
        return status;
}

static int print_answer(long status, json_t *answer)
{
        if (status < 0)
                return 1;
        if (status >= 300) {
                json_t *e = json_object_get(answer, "error");
                fprintf(stderr, "tally-vmm: %s\n", json_is_string(e) ? json_string_value(e) : "request refused");
                json_decref(answer);
                return 1;
        }
        char *text = json_dumps(answer, JSON_INDENT(2) | JSON_SORT_KEYS);
        if (text)
                puts(text);
        free(text);
        json_decref(answer);
        return 0;
}

/* One request whose answer is printed as it comes. */
static int request(const char *sock, const char *method, const char *path, json_t *body)
{
        json_t *answer = NULL;
        long status = vmm_api_call(sock, method, path, body, &answer);
        return print_answer(status, answer);
}

static int usage(const char *msg)
{
        fprintf(stderr, "tally-vmm: %s (try --help)\n", msg);
        return 2;
}

static int parse_num(const char *s, long long *ret)
{
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (errno || end == s || *end)
                return -EINVAL;
        *ret = v;
        return 0;
}

static json_t *argv_json(int argc, char **argv)
{
        json_t *a = json_array();
        for (int i = 0; i < argc; i++)
                json_array_append_new(a, json_string(argv[i]));
        return a;
}

static int cmd_create(const char *sock, int argc, char **argv)
{
        static const struct option opts[] = {
                { "account", required_argument, 0, 'a' }, { "key", required_argument, 0, 'k' },
                { "vcpus", required_argument, 0, 'c' },   { "memory-mib", required_argument, 0, 'm' },
                { "disk-mib", required_argument, 0, 'd' }, { "label", required_argument, 0, 'l' },
                { "timeout", required_argument, 0, 't' }, { "network", no_argument, 0, 'n' },
                { "backend", required_argument, 0, 'b' }, { "image", required_argument, 0, 'i' },
                { "allow", required_argument, 0, 'A' }, { "pids-max", required_argument, 0, 'p' },
                { 0, 0, 0, 0 },
        };
        json_t *body = json_object(), *labels = json_object(), *allow = json_array();
        bool internet = false;
        int o, rc = 2;
        optind = 1;
        while ((o = getopt_long(argc, argv, "+", opts, NULL)) != -1) {
                long long n;
                const char *name = NULL;
                switch (o) {
                case 'a': json_object_set_new(body, "account", json_string(optarg)); break;
                case 'k': json_object_set_new(body, "key", json_string(optarg)); break;
                case 'b': json_object_set_new(body, "backend", json_string(optarg)); break;
                case 'i': json_object_set_new(body, "image", json_string(optarg)); break;
                case 'n': internet = true; break;
                case 'A': internet = true; json_array_append_new(allow, json_string(optarg)); break;
                case 'c': name = "vcpus"; break;
                case 'm': name = "memory_mib"; break;
                case 'd': name = "disk_mib"; break;
                case 't': name = "timeout_s"; break;
                case 'p': name = "pids_max"; break;
                case 'l': {
                        char *eq = strchr(optarg, '=');
                        if (!eq) {
                                rc = usage("--label wants KEY=VALUE");
                                goto out;
                        }
                        *eq = '\0';
                        json_object_set_new(labels, optarg, json_string(eq + 1));
                        break;
                }
                default: goto out;
                }
                if (name) {
                        if (parse_num(optarg, &n) < 0) {
                                fprintf(stderr, "tally-vmm: --%s wants an integer, not \"%s\"\n", opts[o == 'c' ? 2 :
                                        o == 'm' ? 3 : o == 'd' ? 4 : o == 'p' ? 11 : 6].name, optarg);
                                goto out;
                        }
                        json_object_set_new(body, name, json_integer(n));
                }
        }
        if (json_object_size(labels))
                json_object_set(body, "labels", labels);
        if (internet && json_array_size(allow) == 0)
                json_object_set_new(body, "network", json_true());
        else if (internet)
                json_object_set_new(body, "network", json_pack("{s:b, s:O}", "internet", 1, "allow", allow));
        if (optind < argc)
                json_object_set_new(body, "command", argv_json(argc - optind, argv + optind));
        json_t *answer = NULL;
        long status = vmm_api_call(sock, "POST", "/sandboxes", body, &answer);
        rc = print_answer(status, answer);
out:
        json_decref(allow);
        json_decref(labels);
        json_decref(body);
        return rc;
}

static void write_output(FILE *f, json_t *answer, const char *name)
{
        json_t *s = json_object_get(answer, name);
        if (json_is_string(s)) {
                fwrite(json_string_value(s), 1, json_string_length(s), f);
                return;
        }
        char key[64];
        snprintf(key, sizeof(key), "%s_base64", name);
        json_t *b = json_object_get(answer, key);
        if (!json_is_string(b))
                return;
        size_t len = json_string_length(b);
        unsigned char *raw = malloc(len / 4 * 3 + 3);
        if (!raw)
                return;
        int n = EVP_DecodeBlock(raw, (const unsigned char *)json_string_value(b), (int)len);
        if (n > 0) {
                const char *t = json_string_value(b);
                n -= (len > 0 && t[len - 1] == '=') + (len > 1 && t[len - 2] == '=');
                fwrite(raw, 1, (size_t)n, f);
        }
        free(raw);
}

static int cmd_exec(const char *sock, int argc, char **argv)
{
        static const struct option opts[] = {
                { "timeout-ms", required_argument, 0, 't' }, { "output-cap", required_argument, 0, 'c' },
                { "stdin", required_argument, 0, 'i' },     { 0, 0, 0, 0 },
        };
        json_t *body = json_object();
        int o, rc = 2;
        optind = 1;
        while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
                long long n;
                if (o == 'i') {
                        json_object_set_new(body, "stdin", json_string(optarg));
                        continue;
                }
                if (o == '?' || parse_num(optarg, &n) < 0) {
                        rc = usage("exec: --timeout-ms and --output-cap want integers");
                        goto out;
                }
                json_object_set_new(body, o == 't' ? "timeout_ms" : "output_cap", json_integer(n));
        }
        if (argc - optind < 2) {
                rc = usage("exec wants a sandbox id and a command: exec ID [--timeout-ms N] -- COMMAND...");
                goto out;
        }
        char path[128];
        snprintf(path, sizeof(path), "/sandboxes/%s/exec", argv[optind]);
        int first = optind + 1;
        if (first < argc && strcmp(argv[first], "--") == 0)
                first++;
        if (first >= argc) {
                rc = usage("exec wants a command after the sandbox id");
                goto out;
        }
        json_object_set_new(body, "command", argv_json(argc - first, argv + first));
        json_t *answer = NULL;
        long status = vmm_api_call(sock, "POST", path, body, &answer);
        if (status < 0 || status >= 300) {
                rc = print_answer(status, answer);
                goto out;
        }
        write_output(stdout, answer, "stdout");
        write_output(stderr, answer, "stderr");
        fflush(stdout);
        rc = (int)json_integer_value(json_object_get(answer, "exit_code"));
        if (json_is_true(json_object_get(answer, "timed_out"))) {
                fprintf(stderr, "tally-vmm: the command timed out\n");
                rc = 124;
        }
        json_decref(answer);
out:
        json_decref(body);
        return rc;
}

static int cmd_ls(const char *sock, int argc, char **argv)
{
        char path[160] = "/sandboxes";
        if (argc == 3 && strcmp(argv[1], "--account") == 0)
                snprintf(path, sizeof(path), "/sandboxes?account=%s", argv[2]);
        else if (argc != 1)
                return usage("ls takes no arguments but --account ID");
        json_t *answer = NULL;
        long status = vmm_api_call(sock, "GET", path, NULL, &answer);
        if (status < 0 || status >= 300)
                return print_answer(status, answer);
        printf("%-22s %-8s %-8s %5s %8s %-16s %-16s\n", "ID", "STATE", "BACKEND", "VCPUS", "MEM_MIB", "ACCOUNT",
               "KEY");
        size_t i;
        json_t *s;
        json_array_foreach(json_object_get(answer, "sandboxes"), i, s) {
                printf("%-22s %-8s %-8s %5lld %8lld %-16s %-16s\n",
                       json_string_value(json_object_get(s, "id")), json_string_value(json_object_get(s, "state")),
                       json_string_value(json_object_get(s, "backend")),
                       (long long)json_integer_value(json_object_get(s, "vcpus")),
                       (long long)json_integer_value(json_object_get(s, "memory_mib")),
                       json_string_value(json_object_get(s, "account")), json_string_value(json_object_get(s, "key")));
        }
        json_decref(answer);
        return 0;
}

int vmm_cli(const char *sock, int argc, char **argv)
{
        const char *cmd = argv[0];
        json_t *answer = NULL;
        char path[160];
        if (strcmp(cmd, "create") == 0)
                return cmd_create(sock, argc, argv);
        if (strcmp(cmd, "exec") == 0)
                return cmd_exec(sock, argc, argv);
        if (strcmp(cmd, "ls") == 0)
                return cmd_ls(sock, argc, argv);
        if (strcmp(cmd, "status") == 0)
                return request(sock, "GET", "/status", NULL);
        if (argc < 2)
                return usage("this command wants a sandbox id");
        const char *id = argv[1];
        if (strcmp(cmd, "show") == 0 && argc == 2) {
                snprintf(path, sizeof(path), "/sandboxes/%s", id);
                return request(sock, "GET", path, NULL);
        }
        if ((strcmp(cmd, "pause") == 0 || strcmp(cmd, "resume") == 0 || strcmp(cmd, "stop") == 0) && argc == 2) {
                snprintf(path, sizeof(path), "/sandboxes/%s/%s", id, cmd);
                return request(sock, "POST", path, NULL);
        }
        long long n = 1;
        if (strcmp(cmd, "fork") == 0) {
                if (argc == 4 && strcmp(argv[2], "--count") == 0) {
                        if (parse_num(argv[3], &n) < 0)
                                return usage("fork: --count wants an integer");
                } else if (argc != 2) {
                        return usage("fork ID [--count N]");
                }
                snprintf(path, sizeof(path), "/sandboxes/%s/fork", id);
                json_t *body = json_pack("{s:I}", "count", (json_int_t)n);
                long status = vmm_api_call(sock, "POST", path, body, &answer);
                json_decref(body);
                return print_answer(status, answer);
        }
        if (strcmp(cmd, "timeout") == 0 && argc == 3) {
                if (parse_num(argv[2], &n) < 0)
                        return usage("timeout ID SECONDS");
                snprintf(path, sizeof(path), "/sandboxes/%s/timeout", id);
                json_t *body = json_pack("{s:I}", "timeout_s", (json_int_t)n);
                long status = vmm_api_call(sock, "POST", path, body, &answer);
                json_decref(body);
                return print_answer(status, answer);
        }
        return usage("bad arguments");
}
