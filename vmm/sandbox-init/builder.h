/* builder.h — what every step of tally-sandbox-init shares: its
 * configuration (read once from JAIL_FD_CONFIG, jail.h) and the one way a
 * step fails.
 *
 * tally-sandbox-init is a single-threaded program of its own, execed right
 * after tally-vmm's clone: its steps may use ordinary calls (malloc, stdio,
 * fork) because no other thread exists to hold a lock, and must never start
 * one (the fork children of confine.h and serve.h rely on it). A step that
 * cannot be done calls fail(): the reason goes to report_fd (the ready pipe,
 * which tally-vmm reads, or stderr in --join mode) and the program exits
 * with nothing half-built left running. Reasons that would reach a sandbox's
 * owner are fixed sentences: errno is cleared first where the host's detail
 * must not leak (copy.h). */
#pragma once

#include <stddef.h>
#include <sys/types.h>

#define ARGS_MAX 256
#define CONFIG_MAX (128 * 1024)
#define CGROUPS_MAX 8

/* The configuration's keys (jail.h): pointers into one static buffer, NULL
 * when absent; argv is the main program's (init) or the command's (--join),
 * NULL-terminated. */
struct jail_config {
        const char *id, *dir, *disk_bytes, *network, *copy_from, *copy_from_id, *pid;
        const char *cgroups[CGROUPS_MAX];
        int ncgroups;
        char *argv[ARGS_MAX + 1];
};

extern struct jail_config cfg;

/* Where fail() explains itself: JAIL_FD_READY for the init, 2 for --join. */
extern int report_fd;

/* Writes the reason (fmt, then ": strerror(errno)" when errno is set) to
 * report_fd and exits 1. */
_Noreturn void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Reads and closes JAIL_FD_CONFIG into cfg; fails if it cannot be read. */
void read_config(void);

/* Creates (or truncates) path with text; fails on any error. */
void write_file(const char *path, const char *text, mode_t mode);

/* Creates a folder; an existing one is fine; fails otherwise. */
void make_dir(const char *path, mode_t mode);

/* buf = "a/b"; fails with ENAMETOOLONG if it does not fit. */
void path(char *buf, size_t size, const char *a, const char *b);
