/* spec.h — a create request as tally-vmm's API receives it, parsed and
 * checked before anything is created. Every refusal names the field and the
 * limit, so a caller can fix the request from the message alone. */
#pragma once

#include "backend.h"
#include "event.h"
#include "netpolicy.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <jansson.h>

#define SPEC_MEMORY_MIB_MIN   16
#define SPEC_DISK_MIB_MAX     (1024 * 1024)      /* 1 TiB */
#define SPEC_COMMAND_ARGS_MAX 256
#define SPEC_COMMAND_BYTES_MAX (64 * 1024)
#define SPEC_TIMEOUT_DEFAULT_S 300
#define SPEC_PIDS_MAX_MIN      8                 /* the init, a shell and a few commands */
#define SPEC_PIDS_MAX_MAX      65536
#define SPEC_PIDS_MAX_DEFAULT  1024

struct vmm_limits {
        uint64_t host_mem_bytes;     /* a sandbox may not ask for more memory than the host has */
        int64_t timeout_max_s;       /* longest lease one create or extend may ask for */
};

struct create_request {
        char account[EVENT_ID_MAX + 1];
        char key[EVENT_ID_MAX + 1];
        char backend[16];            /* "auto" unless asked */
        uint32_t vcpus;
        uint64_t mem_bytes;
        uint64_t disk_bytes;
        uint32_t pids_max;           /* processes and threads at once (the cgroup's pids.max) */
        int64_t timeout_s;
        struct net_policy net;       /* loopback only unless internet */
        char **command;              /* NULL-terminated, malloc'd; NULL: none */
        char *image;                 /* malloc'd or NULL */
        size_t nlabels;
        struct event_label *labels;  /* malloc'd */
};

/* Parses and checks a create request:
 *   {"account": id, "key": id, "vcpus": 1..16 (1), "memory_mib": n (512), "disk_mib": n (1024),
 *    "labels": {k: v}, "timeout_s": 1..max (300),
 *    "network": false (loopback only) | true | {"internet": bool, "allow": [names]} (netpolicy.h),
 *    "command": [argv] | "shell text" (run with /bin/sh -c), "image": name, "backend": name,
 *    "pids_max": 8..65536 (1024)}
 * Returns 0 and fills *ret (release with create_request_clear), or -EINVAL with why. */
int create_request_parse(const json_t *body, const struct vmm_limits *limits, struct create_request *ret,
                         char *why, size_t whylen);
void create_request_clear(struct create_request *r);

/* Parses a command given as an argv array of strings or a shell string
 * (run as /bin/sh -c TEXT). Returns a malloc'd NULL-terminated argv. */
int command_parse(const json_t *v, const char *field, char ***ret, char *why, size_t whylen);
void command_free(char **argv);
