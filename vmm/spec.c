/* spec.c — see spec.h. */
#include "spec.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void command_free(char **argv)
{
        for (char **a = argv; a && *a; a++)
                free(*a);
        free(argv);
}

int command_parse(const json_t *v, const char *field, char ***ret, char *why, size_t whylen)
{
        size_t n = json_is_array(v) ? json_array_size(v) : 3;
        size_t bytes = 0;
        if (json_is_string(v)) {
                if (json_string_length(v) == 0 || json_string_length(v) > SPEC_COMMAND_BYTES_MAX ||
                    strlen(json_string_value(v)) != json_string_length(v)) {
                        snprintf(why, whylen, "%s: a shell command of 1..%d bytes without NUL is needed", field,
                                 SPEC_COMMAND_BYTES_MAX);
                        return -EINVAL;
                }
        } else if (!json_is_array(v) || n == 0 || n > SPEC_COMMAND_ARGS_MAX) {
                snprintf(why, whylen, "%s: a non-empty array of at most %d strings, or a shell string, is needed",
                         field, SPEC_COMMAND_ARGS_MAX);
                return -EINVAL;
        }
        char **argv = calloc(n + 1, sizeof(*argv));
        if (!argv)
                return -ENOMEM;
        if (json_is_string(v)) {
                argv[0] = strdup("/bin/sh");
                argv[1] = strdup("-c");
                argv[2] = strdup(json_string_value(v));
        } else {
                for (size_t i = 0; i < n; i++) {
                        json_t *a = json_array_get(v, i);
                        if (!json_is_string(a) || strlen(json_string_value(a)) != json_string_length(a) ||
                            (i == 0 && json_string_length(a) == 0) ||
                            (bytes += json_string_length(a) + 1) > SPEC_COMMAND_BYTES_MAX) {
                                snprintf(why, whylen,
                                         "%s[%zu]: arguments are strings without NUL, %d bytes in all at most, "
                                         "the first not empty",
                                         field, i, SPEC_COMMAND_BYTES_MAX);
                                command_free(argv);
                                return -EINVAL;
                        }
                        argv[i] = strdup(json_string_value(a));
                }
        }
        for (size_t i = 0; i < n; i++)
                if (!argv[i]) {
                        command_free(argv);
                        return -ENOMEM;
                }
        *ret = argv;
        return 0;
}

void create_request_clear(struct create_request *r)
{
        if (!r)
                return;
        command_free(r->command);
        free(r->image);
        free(r->labels);
        memset(r, 0, sizeof(*r));
}

/* An optional integer field within [min, max]; def when absent. */
static int get_int(const json_t *o, const char *name, int64_t min, int64_t max, int64_t def, int64_t *out,
                   const char *unit, char *why, size_t whylen)
{
        json_t *v = json_object_get(o, name);
        if (!v) {
                *out = def;
                return 0;
        }
        if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max) {
                snprintf(why, whylen, "%s must be an integer from %lld to %lld%s", name, (long long)min,
                         (long long)max, unit);
                return -EINVAL;
        }
        *out = json_integer_value(v);
        return 0;
}

static int get_id(const json_t *o, const char *name, char *out, char *why, size_t whylen)
{
        json_t *v = json_object_get(o, name);
        if (!json_is_string(v) || !event_id_valid(json_string_value(v))) {
                snprintf(why, whylen, "%s is required: 1 to %d characters of A-Z a-z 0-9 _ . : -", name,
                         EVENT_ID_MAX);
                return -EINVAL;
        }
        snprintf(out, EVENT_ID_MAX + 1, "%s", json_string_value(v));
        return 0;
}

static const char *const known_fields[] = { "account", "key", "vcpus", "memory_mib", "disk_mib", "labels",
                                            "timeout_s", "network", "command", "image", "backend", "pids_max", NULL };

int create_request_parse(const json_t *body, const struct vmm_limits *limits, struct create_request *ret,
                         char *why, size_t whylen)
{
        struct create_request r = { 0 };
        int64_t vcpus, mem_mib, disk_mib, pids_max;
        int e = -EINVAL;
        if (!json_is_object(body)) {
                snprintf(why, whylen, "the request body must be a JSON object");
                return -EINVAL;
        }
        const char *name;
        json_t *value;
        json_object_foreach((json_t *)body, name, value) {
                bool known = false;
                for (const char *const *k = known_fields; *k && !known; k++)
                        known = strcmp(*k, name) == 0;
                if (!known) {
                        snprintf(why, whylen, "unknown field \"%.64s\"", name);
                        return -EINVAL;
                }
        }
        int64_t host_mib = (int64_t)(limits->host_mem_bytes / (1024 * 1024));
        if (get_id(body, "account", r.account, why, whylen) < 0 || get_id(body, "key", r.key, why, whylen) < 0 ||
            get_int(body, "vcpus", 1, SANDBOX_VCPUS_MAX, 1, &vcpus, "", why, whylen) < 0 ||
            get_int(body, "disk_mib", 0, SPEC_DISK_MIB_MAX, 1024, &disk_mib, " MiB", why, whylen) < 0 ||
            get_int(body, "pids_max", SPEC_PIDS_MAX_MIN, SPEC_PIDS_MAX_MAX, SPEC_PIDS_MAX_DEFAULT, &pids_max, "",
                    why, whylen) < 0 ||
            get_int(body, "timeout_s", 1, limits->timeout_max_s, SPEC_TIMEOUT_DEFAULT_S < limits->timeout_max_s ?
                    SPEC_TIMEOUT_DEFAULT_S : limits->timeout_max_s, &r.timeout_s, " seconds", why, whylen) < 0)
                goto fail;
        json_t *mem = json_object_get(body, "memory_mib");
        if (mem && json_is_integer(mem) && json_integer_value(mem) > host_mib && host_mib >= SPEC_MEMORY_MIB_MIN) {
                snprintf(why, whylen, "memory_mib %lld is more than this host's memory (%lld MiB)",
                         (long long)json_integer_value(mem), (long long)host_mib);
                goto fail;
        }
        if (get_int(body, "memory_mib", SPEC_MEMORY_MIB_MIN, host_mib, 512 < host_mib ? 512 : host_mib, &mem_mib,
                    " MiB (this host's memory)", why, whylen) < 0)
                goto fail;
        r.vcpus = (uint32_t)vcpus;
        r.mem_bytes = (uint64_t)mem_mib * 1024 * 1024;
        r.disk_bytes = (uint64_t)disk_mib * 1024 * 1024;
        r.pids_max = (uint32_t)pids_max;
        if (net_policy_parse(json_object_get(body, "network"), &r.net, why, whylen) < 0)
                goto fail;
        json_t *backend = json_object_get(body, "backend");
        if (backend && (!json_is_string(backend) || json_string_length(backend) >= sizeof(r.backend) ||
                        json_string_length(backend) == 0)) {
                snprintf(why, whylen, "backend must be a backend's name (%s)", backend_names());
                goto fail;
        }
        snprintf(r.backend, sizeof(r.backend), "%s", backend ? json_string_value(backend) : "auto");
        json_t *image = json_object_get(body, "image");
        if (image) {
                if (!json_is_string(image) || json_string_length(image) == 0 || json_string_length(image) > 255 ||
                    strlen(json_string_value(image)) != json_string_length(image)) {
                        snprintf(why, whylen, "image must be a name of 1 to 255 bytes");
                        goto fail;
                }
                if (!(r.image = strdup(json_string_value(image)))) {
                        e = -ENOMEM;
                        goto fail;
                }
        }
        json_t *command = json_object_get(body, "command");
        if (command && (e = command_parse(command, "command", &r.command, why, whylen)) < 0)
                goto fail;
        e = -EINVAL;
        json_t *labels = json_object_get(body, "labels");
        if (labels) {
                if (!json_is_object(labels)) {
                        snprintf(why, whylen, "labels must be an object of strings");
                        goto fail;
                }
                if (json_object_size(labels) > EVENT_LABELS_MAX) {
                        snprintf(why, whylen, "too many labels: %zu, at most %d", json_object_size(labels),
                                 EVENT_LABELS_MAX);
                        goto fail;
                }
                struct usage_event tmp = { 0 };
                const char *k;
                json_t *v;
                json_object_foreach(labels, k, v) {
                        if (!json_is_string(v)) {
                                snprintf(why, whylen, "label \"%.63s\": the value must be a string", k);
                                goto label_fail;
                        }
                        if (strlen(k) == 0 || strlen(k) > EVENT_LABEL_KEY_MAX) {
                                snprintf(why, whylen, "label key \"%.40s...\" is %zu bytes: 1 to %d allowed", k,
                                         strlen(k), EVENT_LABEL_KEY_MAX);
                                goto label_fail;
                        }
                        if (strlen(json_string_value(v)) != json_string_length(v)) {
                                snprintf(why, whylen, "label \"%s\": the value holds a NUL byte", k);
                                goto label_fail;
                        }
                        if (json_string_length(v) > EVENT_LABEL_VALUE_MAX) {
                                snprintf(why, whylen, "label \"%s\": the value is %zu bytes, at most %d allowed", k,
                                         json_string_length(v), EVENT_LABEL_VALUE_MAX);
                                goto label_fail;
                        }
                        int lr = event_add_label(&tmp, k, json_string_value(v));
                        if (lr < 0) {
                                snprintf(why, whylen, "label \"%s\" is not valid", k);
                                e = lr == -ENOMEM ? -ENOMEM : -EINVAL;
                                goto label_fail;
                        }
                        continue;
label_fail:
                        free(tmp.labels);
                        goto fail;
                }
                r.labels = tmp.labels;
                r.nlabels = tmp.nlabels;
        }
        *ret = r;
        return 0;
fail:
        create_request_clear(&r);
        return e;
}
