/* cache.c — see cache.h. */
#include "cache.h"

#include "log.h"
#include "sample_batch.h"
#include "text.h"
#include "timeutil.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint64_t hash_id(const char *s)
{
        uint64_t h = 1469598103934665603ULL;
        for (; *s; s++)
                h = (h ^ (unsigned char)*s) * 1099511628211ULL;
        return h;
}

struct sandbox *sandbox_find(struct sandbox_cache *c, const char *id)
{
        if (!c->nbuckets)
                return NULL;
        for (struct sandbox *s = c->buckets[hash_id(id) & (c->nbuckets - 1)]; s; s = s->next)
                if (strcmp(s->id, id) == 0)
                        return s;
        return NULL;
}

static int sandbox_rehash(struct sandbox_cache *c, size_t n)
{
        struct sandbox **b = calloc(n, sizeof(*b));
        if (!b)
                return -ENOMEM;
        for (size_t i = 0; i < c->nbuckets; i++)
                for (struct sandbox *s = c->buckets[i], *next; s; s = next) {
                        next = s->next;
                        size_t h = hash_id(s->id) & (n - 1);
                        s->next = b[h];
                        b[h] = s;
                }
        free(c->buckets);
        c->buckets = b;
        c->nbuckets = n;
        return 0;
}

static struct sandbox *sandbox_new(struct sandbox_cache *c, const char *id)
{
        if (c->nsandboxes + 1 > c->nbuckets && sandbox_rehash(c, c->nbuckets ? c->nbuckets * 2 : 4096) < 0)
                return NULL;
        struct sandbox *s = calloc(1, sizeof(*s));
        if (!s)
                return NULL;
        snprintf(s->id, sizeof(s->id), "%s", id);
        size_t h = hash_id(id) & (c->nbuckets - 1);
        s->next = c->buckets[h];
        c->buckets[h] = s;
        c->nsandboxes++;
        s->used_ns = time_mono_ns();
        atomic_store_explicit(&c->metrics->sandboxes_in_memory, c->nsandboxes, memory_order_relaxed);
        return s;
}

static int id_cmp(const void *x, const void *y) { return strcmp(x, y); }

static bool id_set_has(const struct id_set *s, const char *id)
{
        return s->sorted && bsearch(id, s->ids, s->sorted, sizeof(*s->ids), id_cmp);
}

static int id_set_add(struct id_set *s, const char *id)
{
        if (grow((void **)&s->ids, &s->cap, s->n + 1, sizeof(*s->ids)) < 0)
                return -ENOMEM;
        snprintf(s->ids[s->n++], sizeof(*s->ids), "%s", id);
        return 0;
}

/* Sorted once after adding, not after each id: with thousands of new
 * sandboxes in a prefetch that was most of its time. An id added twice
 * (sandbox_add of one) leaves the array a set for bsearch's purpose. */
static void id_set_sort(struct id_set *s)
{
        if (s->n > s->sorted)
                qsort(s->ids, s->n, sizeof(*s->ids), id_cmp);
        s->sorted = s->n;
}

static void id_set_clear(struct id_set *s)
{
        s->n = s->sorted = 0;
}

static void id_set_free(struct id_set *s)
{
        free(s->ids);
        *s = (struct id_set){ 0 };
}

bool sandbox_unheld(const struct sandbox_cache *c, const char *id)
{
        return id_set_has(&c->unheld, id);
}

void sandboxes_forget_unheld(struct sandbox_cache *c)
{
        id_set_clear(&c->unheld);
}

static bool valid_id(const char *s, size_t n)
{
        if (n == 0 || n > EVENT_ID_MAX)
                return false;
        for (size_t i = 0; i < n; i++)
                if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') ||
                      s[i] == '_' || s[i] == '.' || s[i] == ':' || s[i] == '-'))
                        return false;
        return true;
}

/* Reads the fold state of the sandboxes ids (n of them, not in memory) into
 * memory, in one query, with the size and key their `created` event gave (a
 * sandbox only created so far has no fold state: it comes back unknown, with
 * its size); those the ledger has no row for are remembered as
 * absent (new sandboxes) until sandboxes_forget_absent. Returns 0, -EIO, -ENOMEM,
 * or -EPROTO for a row this aggregator cannot read (written by a newer one:
 * billing it from nothing would bill it twice, so nothing is billed). */
static int load_sandboxes(struct sandbox_cache *c, char (*ids)[EVENT_ID_MAX + 1], size_t n)
{
        if (!n)
                return 0;
        if (db_ensure(c->ledger) < 0)
                return -EIO;
        struct text list = { 0 };
        for (size_t i = 0; i < n; i++)
                if (text_add(&list, "%s%s", i ? "," : "{", ids[i]) < 0) {
                        free(list.buf);
                        return -ENOMEM;
                }
        if (text_add(&list, "}") < 0) {
                free(list.buf);
                return -ENOMEM;
        }
        const char *params[] = { list.buf };
        atomic_fetch_add_explicit(&c->metrics->state_reads, 1, memory_order_relaxed);
        PGresult *res = PQexecParams(c->ledger->db,
                                     "SELECT i.id, coalesce(f.account_id, s.account_id), coalesce(f.key_id, s.key_id),"
                                     " f.fold, coalesce(f.version, 0), coalesce(s.host, ''), coalesce(s.vcpus, 1),"
                                     " coalesce(s.state, ''), coalesce(s.mem_size_bytes, 0),"
                                     " f.sandbox_id IS NOT NULL OR s.id IS NOT NULL,"
                                     " EXISTS (SELECT 1 FROM held_readings h WHERE h.sandbox_id = i.id)"
                                     " FROM unnest($1::text[]) AS i(id) LEFT JOIN fold_state f ON f.sandbox_id = i.id"
                                     " LEFT JOIN sandboxes s ON s.id = i.id",
                                     1, NULL, params, NULL, NULL, 0);
        free(list.buf);
        int r = query_ok(c->ledger, res, PGRES_TUPLES_OK, "load state");
        int rows = r == 0 ? PQntuples(res) : 0;
        for (int i = 0; r == 0 && i < rows; i++) {
                const char *id = PQgetvalue(res, i, 0);
                if (strcmp(PQgetvalue(res, i, 10), "f") == 0 && (r = id_set_add(&c->unheld, id)) < 0)
                        break;
                if (strcmp(PQgetvalue(res, i, 9), "t") != 0 || sandbox_find(c, id))
                        continue; /* no row; or memory is the ledger plus the batch: never older */
                struct fold_state f = { 0 }; /* no row: only its created event is in the ledger */
                if (!PQgetisnull(res, i, 3) && fold_state_parse(PQgetvalue(res, i, 3), &f) < 0) {
                        char q[600];
                        log_error("could not read a sandbox's fold state; not billing it", "sandbox=%s fold=%s", id,
                                  log_quote(q, sizeof(q), PQgetvalue(res, i, 3)));
                        r = -EPROTO;
                        break;
                }
                struct sandbox *s = sandbox_new(c, id);
                if (!s) {
                        r = -ENOMEM;
                        break;
                }
                s->fold = f;
                s->partition = INT32_MAX; /* set by the next message */
                snprintf(s->account, sizeof(s->account), "%s", PQgetvalue(res, i, 1));
                snprintf(s->key, sizeof(s->key), "%s", PQgetvalue(res, i, 2));
                s->version = strtoll(PQgetvalue(res, i, 4), NULL, 10);
                snprintf(s->host, sizeof(s->host), "%s", PQgetvalue(res, i, 5));
                s->vcpus = (uint32_t)strtoul(PQgetvalue(res, i, 6), NULL, 10);
                s->mem_size_bytes = strtoull(PQgetvalue(res, i, 8), NULL, 10);
                enum sandbox_state db;
                s->db_state = sandbox_state_parse(PQgetvalue(res, i, 7), &db) == 0 ? (int)db + 1 : 0;
                memcpy(s->db_host, s->host, sizeof(s->db_host));
                atomic_fetch_add_explicit(&c->metrics->sandboxes_loaded, 1, memory_order_relaxed);
        }
        PQclear(res);
        id_set_sort(&c->unheld);
        if (r < 0)
                return r;
        for (size_t i = 0; r == 0 && i < n; i++) /* (has: the part sorted before these) */
                if (!sandbox_find(c, ids[i]) && !id_set_has(&c->absent, ids[i]))
                        r = id_set_add(&c->absent, ids[i]);
        id_set_sort(&c->absent);
        return r;
}

/* A sandbox not in memory: its fold state is read from the ledger by id
 * (whatever partition it arrives on), unless a prefetch already found it has
 * none. NULL when the ledger cannot be read: the caller drops the batch and
 * reads it again, never billing from an empty state a row exists for. */
struct sandbox *sandbox_add(struct sandbox_cache *c, const char *id)
{
        if (!id_set_has(&c->absent, id)) {
                char ids[1][EVENT_ID_MAX + 1];
                snprintf(ids[0], sizeof(ids[0]), "%s", id);
                if (load_sandboxes(c, ids, 1) < 0)
                        return NULL;
                struct sandbox *s = sandbox_find(c, id);
                if (s)
                        return s;
        }
        struct sandbox *s = sandbox_new(c, id);
        if (s)
                s->no_row = true; /* absent: neither fold state nor a sandboxes row */
        return s;
}

/* The next sandbox id named in a message from *at on, read without decoding
 * it (*at moves past it), or false. Only a hint for prefetching: an id it
 * misses or misreads is loaded by sandbox_add. A message that carries many
 * samples names many sandboxes: each is found in turn. */
static bool peek_sandbox(const rd_kafka_message_t *m, size_t *at, char *id)
{
        if (sample_batch_is(m->payload, m->len)) /* a usage batch: its records' sandbox ids */
                return sample_batch_peek_sandbox(m->payload, m->len, at, id);
        static const char needle[] = "\"sandbox\":\"";
        const char *p = m->payload, *end = p + m->len;
        while (*at < m->len) {
                const char *hit = memmem(p + *at, m->len - *at, needle, sizeof(needle) - 1);
                if (!hit)
                        break;
                const char *v = hit + sizeof(needle) - 1, *q = memchr(v, '"', (size_t)(end - v));
                *at = (size_t)((q ? q : v) - p);
                if (!q || !valid_id(v, (size_t)(q - v)))
                        continue;
                memcpy(id, v, (size_t)(q - v));
                id[q - v] = '\0';
                return true;
        }
        *at = m->len;
        return false;
}

/* Before messages are folded: the fold state of every sandbox among them not
 * in memory, read in one query. A failure is not fatal here: sandbox_add
 * reads each one again. */
void prefetch(struct sandbox_cache *c, rd_kafka_message_t **msgs, size_t n)
{
        char (*ids)[EVENT_ID_MAX + 1] = NULL;
        size_t nids = 0, cap = 0;
        bool full = false;
        char id[EVENT_ID_MAX + 1];
        for (size_t i = 0; i < n && !full; i++) {
                size_t at = 0;
                bool batch = !msgs[i]->err && sample_batch_is(msgs[i]->payload, msgs[i]->len);
                while (!msgs[i]->err && peek_sandbox(msgs[i], &at, id)) {
                        /* A usage batch is read ahead up to its first sandbox in memory: a
                         * tick's batch names the sandboxes the last one did, so one in memory
                         * says the rest are too (one that is not is read alone, in
                         * sandbox_add), and a batch costs one lookup here, not one a sample. */
                        /* (Known already: in memory, or looked up since absent and unheld were
                         * forgotten, found new and with nothing held.) */
                        if (sandbox_find(c, id) || (id_set_has(&c->absent, id) && id_set_has(&c->unheld, id))) {
                                if (batch)
                                        break;
                                continue;
                        }
                        bool seen = false;
                        for (size_t j = nids; j-- > 0 && !seen && j + 64 >= nids;) /* neighbours: a sandbox's messages cluster */
                                seen = strcmp(ids[j], id) == 0;
                        if (seen)
                                continue;
                        if (grow((void **)&ids, &cap, nids + 1, sizeof(*ids)) < 0) {
                                full = true;
                                break;
                        }
                        memcpy(ids[nids++], id, sizeof(id));
                }
        }
        if (nids) {
                qsort(ids, nids, sizeof(*ids), id_cmp);
                size_t u = 0;
                for (size_t i = 0; i < nids; i++)
                        if (!u || strcmp(ids[u - 1], ids[i]) != 0)
                                memmove(ids[u++], ids[i], sizeof(*ids));
                if (load_sandboxes(c, ids, u) < 0)
                        id_set_clear(&c->absent);
        }
        free(ids);
}

/* Drops the state of every sandbox of partitions for which drop[p] is set
 * (drop NULL: all). Also forgets which sandboxes the ledger had no row for. */
void sandboxes_drop(struct sandbox_cache *c, const bool *drop, int32_t ndrop)
{
        sandboxes_forget_absent(c);
        for (size_t i = 0; i < c->nbuckets; i++) {
                struct sandbox **pp = &c->buckets[i];
                while (*pp) {
                        struct sandbox *s = *pp;
                        if (!drop || (s->partition < ndrop && drop[s->partition])) {
                                *pp = s->next;
                                free(s);
                                c->nsandboxes--;
                                if (c->metrics)
                                        atomic_store_explicit(&c->metrics->sandboxes_in_memory, c->nsandboxes,
                                                              memory_order_relaxed);
                        } else {
                                pp = &s->next;
                        }
                }
        }
}

/* Memory stays bounded: a sandbox leaves memory keep_stopped_ms (default a
 * minute) after a commit that left it stopped (its final reading), any other
 * after keep_idle_ms (15 minutes) without one. Its fold state stays in the
 * ledger; a later message reads it back by id. Never one the open batch
 * points at (dirty, or with a piece), and never while a commit is under way
 * (the caller's rule). */
size_t sandboxes_sweep(struct sandbox_cache *c, int64_t keep_idle_ms, int64_t keep_stopped_ms)
{
        int64_t now = time_mono_ns();
        size_t evicted = 0;
        for (size_t i = 0; i < c->nbuckets; i++) {
                struct sandbox **pp = &c->buckets[i];
                while (*pp) {
                        struct sandbox *s = *pp;
                        int64_t idle = now - s->used_ns;
                        if (!s->dirty && !s->piece && (idle > keep_idle_ms * NS_PER_MS ||
                                          (s->fold.state == STATE_STOPPED && idle > keep_stopped_ms * NS_PER_MS))) {
                                *pp = s->next;
                                free(s);
                                c->nsandboxes--;
                                evicted++;
                        } else {
                                pp = &s->next;
                        }
                }
        }
        atomic_store_explicit(&c->metrics->sandboxes_in_memory, c->nsandboxes, memory_order_relaxed);
        atomic_fetch_add_explicit(&c->metrics->sandboxes_evicted, evicted, memory_order_relaxed);
        if (evicted) {
                log_debug("sandboxes evicted from memory", "evicted=%zu kept=%zu", evicted, c->nsandboxes);
                /* One this aggregator wrote since a prefetch found it new is new no more. */
                sandboxes_forget_absent(c);
        }
        return evicted;
}

void sandboxes_warm(struct sandbox_cache *c)
{
        char ids[1][EVENT_ID_MAX + 1];
        snprintf(ids[0], sizeof(ids[0]), "tally-warm-%ld", (long)getpid()); /* (store.c's: no one has it) */
        load_sandboxes(c, ids, 1); /* (a failure costs the first prefetch the time) */
        sandboxes_forget_absent(c);
}

void sandboxes_forget_absent(struct sandbox_cache *c)
{
        id_set_clear(&c->absent);
        id_set_clear(&c->unheld);
}

void sandbox_cache_free(struct sandbox_cache *c)
{
        sandboxes_drop(c, NULL, 0);
        free(c->buckets);
        id_set_free(&c->absent);
        id_set_free(&c->unheld);
        c->buckets = NULL;
        c->nbuckets = 0;
}
