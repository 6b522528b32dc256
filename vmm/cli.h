/* cli.h — `tally-vmm COMMAND`: the command line client of a running tally-vmm,
 * talking to its local API socket through vmm/client.h. */
#pragma once

#include <jansson.h>

/* Runs command argv[0] with its arguments against the daemon at socket_path.
 * Returns the process exit status: 0 done, 1 refused or failed (the daemon's
 * error on stderr), 2 bad usage; for exec, the command's own exit status. */
int vmm_cli(const char *socket_path, int argc, char **argv);

/* One request to the daemon's local API (HTTP over its unix socket), path
 * under /v1 ("/sandboxes"); *ret is the decoded JSON answer ({} when it has
 * none; yours to json_decref). Returns the HTTP status, or -1 when the daemon
 * could not be reached (message on stderr). Connects within 10 s. */
long vmm_api_call(const char *socket_path, const char *method, const char *path, json_t *body, json_t **ret);

/* True if name is one of the client's commands. */
int vmm_cli_is_command(const char *name);
