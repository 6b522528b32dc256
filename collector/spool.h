/* spool.h — final samples on disk until Kafka acknowledges them.
 *
 * A stopped sandbox's final sample is written here (fsync'd) before the
 * collector tells the vmm it may remove the cgroup, and deleted only when the
 * producer's delivery report says the broker has it. A restarted collector
 * re-produces everything left; the aggregator treats duplicates as no-ops. So
 * neither a broker outage nor a kill -9 loses a sandbox's last counter.
 * One file per sandbox: <state_dir>/collector/spool/<sandbox>.json. */
#pragma once

#include <stdbool.h>
#include <stddef.h>

struct spool_entry {
        char sandbox[65];
        char account[65];   /* the message key */
        char *payload;      /* the encoded sample; owned */
        size_t len;
        bool in_flight;     /* produced, delivery report pending */
        struct spool_entry *next;
};

struct spool {
        char dir[4096];
        struct spool_entry *head;
        size_t count, bytes;
};

/* Opens the spool folder and loads what an earlier run left (entries that do
 * not decode as samples are moved aside to <name>.bad and logged). Returns 0 or -errno. */
int spool_open(struct spool *s, const char *state_dir);

/* Stores a final sample durably and adds it to the list. Returns the entry (owned
 * by the spool) or NULL with errno set (EEXIST: the sandbox has one already);
 * nothing is added on failure. */
struct spool_entry *spool_add(struct spool *s, const char *sandbox, const char *account, const char *payload,
                              size_t len);

/* The entry for sandbox, or NULL. */
struct spool_entry *spool_find(struct spool *s, const char *sandbox);

/* Deletes an acknowledged entry from disk and memory. Returns 0 or -errno (the
 * entry is dropped from memory either way; a leftover file is re-sent next start). */
int spool_done(struct spool *s, struct spool_entry *e);

/* Frees the in-memory list; files stay. Accepts NULL. */
void spool_close(struct spool *s);
