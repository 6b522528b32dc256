/* cli.h — `tally-vmm COMMAND`: the command line client of a running tally-vmm,
 * talking to its local API socket with libcurl. */
#pragma once

/* Runs command argv[0] with its arguments against the daemon at socket_path.
 * Returns the process exit status: 0 done, 1 refused or failed (the daemon's
 * error on stderr), 2 bad usage; for exec, the command's own exit status. */
int vmm_cli(const char *socket_path, int argc, char **argv);

/* True if name is one of the client's commands. */
int vmm_cli_is_command(const char *name);
