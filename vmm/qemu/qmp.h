/* qmp.h — a client of QEMU's machine protocol (QMP) on one connected socket:
 * one JSON object a line each way; asynchronous events are skipped.
 *
 * struct qmp owns the socket from qmp_init to qmp_free. One exchange runs at
 * a time (the lock): pause, resume and fork may call from other threads
 * than the one running an exec. Once qmp_quit was called every further
 * command fails with -ESRCH, so a VM being stopped is never sent more.
 * Errors are negative errno: -ESRCH (not connected, or quitting), -EIO (QEMU
 * answered "error"), -ETIMEDOUT (no answer within 5 s), -EPIPE (QEMU closed
 * the socket), -EMSGSIZE (a line longer than the buffer). */
#pragma once

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct qmp {
        int fd;                      /* -1 until connected; owned */
        bool quitting;               /* qmp_quit was called (atomic: read by any thread) */
        pthread_mutex_t lock;        /* one exchange at a time */
        size_t len;                  /* bytes read and not consumed yet */
        char buf[8192];
};

/* An unconnected client; qmp_free undoes it. */
void qmp_init(struct qmp *q);

/* Closes the socket and frees the lock. */
void qmp_free(struct qmp *q);

/* On a freshly connected socket: waits for QEMU's greeting and enters
 * command mode (qmp_capabilities), both before deadline (a time_mono_ms() value). */
int qmp_handshake(struct qmp *q, int64_t deadline);

/* Sends one command (a JSON object without the newline) and waits for its
 * answer; *ret_value, if asked for, is the "return" member (a new reference
 * the caller must json_decref). */
int qmp_call(struct qmp *q, const char *json, json_t **ret_value);

/* qmp_call of {"execute":command} without arguments. */
int qmp_command(struct qmp *q, const char *command);

/* Hands fd to QEMU under name (QMP getfd: the descriptor travels with the
 * command as SCM_RIGHTS). The caller keeps its own fd. */
int qmp_send_fd(struct qmp *q, const char *name, int fd);

/* Refuses every later command and asks QEMU to quit without waiting for an
 * answer that may never come (QEMU exits). */
void qmp_quit(struct qmp *q);

/* Shuts the socket down (not closed: a reader in another thread sees the
 * end of the stream; qmp_free closes it). */
void qmp_shutdown(struct qmp *q);
