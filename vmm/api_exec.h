/* api_exec.h — the exec route of tally-vmm's local API. The command's output
 * is never held more than once: the JSON answer is escaped while it is sent,
 * from the command's own buffers (exec_result), and those buffers count
 * against one budget for the whole daemon, reserved (twice the output cap)
 * before the command runs and given back when the answer is done. */
#pragma once

#include "vmm.h"

#include <jansson.h>
#include <microhttpd.h>
#include <stdatomic.h>

/* Exec output held at once, all execs together. */
struct exec_budget {
        atomic_llong held;               /* bytes reserved for exec output (2 x output_cap per exec) */
        long long max;                   /* output_held_max */
};

/* Runs body's command in sandbox id of v and queues its answer (or the error)
 * on c. body is borrowed. */
enum MHD_Result vmm_api_exec(struct MHD_Connection *c, struct vmm *v, struct exec_budget *budget, const char *id,
                             json_t *body);
