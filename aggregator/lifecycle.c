/* lifecycle.c — see lifecycle.h. */
#include "lifecycle.h"

#include "text.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A `created` event's labels as a JSON object (free it), NULL without memory. */
static char *labels_json(const struct usage_event *ev)
{
        json_t *labels = json_object();
        for (size_t i = 0; i < ev->nlabels; i++)
                json_object_set_new(labels, ev->labels[i].key, json_string(ev->labels[i].value));
        char *ljson = json_dumps(labels, JSON_COMPACT);
        json_decref(labels);
        return ljson;
}

/* The staged rows in id order (strcmp's: lifecycle_stage_created writes them
 * sorted, and a COPY's rows scan back in the order they came), so aggregators
 * lock sandboxes rows in one order without sorting them again here. */
static const char *const created_sql =
        "INSERT INTO sandboxes AS s (id, account_id, key_id, host, parent_id, backend, vcpus, mem_size_bytes,"
        "  disk_size_bytes, labels, state, created_at)"
        " SELECT sandbox_id, account_id, key_id, host, parent_id, backend, vcpus, mem_size_bytes, disk_size_bytes,"
        "        labels, 'running', created_at FROM stage_created"
        " ON CONFLICT (id) DO UPDATE SET parent_id = EXCLUDED.parent_id, backend = EXCLUDED.backend,"
        "  vcpus = EXCLUDED.vcpus, mem_size_bytes = EXCLUDED.mem_size_bytes,"
        "  disk_size_bytes = EXCLUDED.disk_size_bytes, labels = EXCLUDED.labels, created_at = EXCLUDED.created_at,"
        "  updated_at = now()";

struct event_ref {
        const char *sandbox;
        size_t i;
};

static int event_ref_cmp(const void *x, const void *y)
{
        const struct event_ref *a = x, *b = y;
        int c = strcmp(a->sandbox, b->sandbox);
        return c ? c : (a->i > b->i) - (a->i < b->i);
}

int lifecycle_created_row(struct text *t, const struct usage_event *ev)
{
        char ts[64];
        format_ts(ts, sizeof(ts), ev->wall_ns);
        char *ljson = labels_json(ev);
        int r = ljson ? 0 : -ENOMEM;
        if (r == 0)
                r = text_add(t, "%s\t%s\t%s\t%s\t", ev->sandbox, ev->account, ev->key, ev->host);
        if (r == 0)
                r = text_add_copy_field(t, ev->parent[0] ? ev->parent : NULL, '\t');
        if (r == 0)
                r = text_add_copy_field(t, ev->backend[0] ? ev->backend : NULL, '\t');
        if (r == 0)
                r = text_add(t, "%u\t%" PRIu64 "\t%" PRIu64 "\t", ev->vcpus, ev->mem_size_bytes, ev->disk_size_bytes);
        if (r == 0)
                r = text_add_copy_field(t, ljson, '\t');
        if (r == 0)
                r = text_add(t, "%s\n", ts);
        free(ljson);
        return r;
}

int lifecycle_first_created(const struct batch *b, size_t from, size_t **ret, size_t *ret_n)
{
        *ret = NULL;
        *ret_n = 0;
        if (b->nevents <= from)
                return 0;
        struct event_ref *refs = malloc(b->nevents * sizeof(*refs));
        size_t *idx = malloc(b->nevents * sizeof(*idx));
        if (!refs || !idx) {
                free(refs);
                free(idx);
                return -ENOMEM;
        }
        for (size_t i = 0; i < b->nevents; i++)
                refs[i] = (struct event_ref){ b->events[i].sandbox, i };
        qsort(refs, b->nevents, sizeof(*refs), event_ref_cmp);
        size_t n = 0;
        for (size_t k = 0; k < b->nevents; k++)
                if ((k == 0 || strcmp(refs[k - 1].sandbox, refs[k].sandbox) != 0) &&
                    b->events[refs[k].i].type == EVENT_CREATED && refs[k].i >= from)
                        idx[n++] = refs[k].i;
        free(refs);
        *ret = idx;
        *ret_n = n;
        return 0;
}

/* COPY of the rows in t into stage_created, then the one upsert. */
int lifecycle_write_created(struct ledger *l, const struct text *t)
{
        int r = copy_rows(l, "COPY stage_created FROM STDIN", t->buf, t->len);
        if (r == 0) {
                PGresult *res = PQexec(l->db, created_sql);
                r = query_ok(l, res, PGRES_COMMAND_OK, "created");
                PQclear(res);
        }
        return r;
}

int lifecycle_stage_created(struct ledger *l, const struct batch *b, struct text *t, bool **ret_staged, size_t *ret_n)
{
        *ret_staged = NULL;
        *ret_n = 0;
        if (!b->nevents)
                return 0;
        size_t *idx, n;
        bool *staged = calloc(b->nevents, sizeof(*staged));
        if (!staged || lifecycle_first_created(b, 0, &idx, &n) < 0) {
                free(staged);
                return -ENOMEM;
        }
        t->len = 0;
        int r = 0;
        size_t rows = 0;
        for (size_t k = 0; r == 0 && k < n; k++) {
                staged[idx[k]] = true; /* (one committed ahead is in the ledger already) */
                if (!b->announced[idx[k]]) {
                        r = lifecycle_created_row(t, &b->events[idx[k]]);
                        rows++;
                }
        }
        free(idx);
        *ret_staged = staged;
        *ret_n = n;
        return r == 0 && rows ? lifecycle_write_created(l, t) : r;
}

int lifecycle_announce_rows(const struct batch *b, struct text *t, size_t **ret_idx, size_t *ret_n)
{
        size_t *idx, n;
        if (lifecycle_first_created(b, b->events_scanned, &idx, &n) < 0)
                return -ENOMEM;
        t->len = 0;
        int r = 0;
        for (size_t k = 0; r == 0 && k < n; k++)
                r = lifecycle_created_row(t, &b->events[idx[k]]);
        if (r < 0) {
                free(idx);
                return r;
        }
        *ret_idx = idx;
        *ret_n = n;
        return 0;
}

int lifecycle_announce(struct ledger *l, const struct text *rows)
{
        int r = db_ensure(l);
        PGresult *res = r == 0 ? PQexec(l->db, "BEGIN") : NULL;
        if (r == 0 && (r = query_ok(l, res, PGRES_COMMAND_OK, "begin")) == 0) {
                r = lifecycle_write_created(l, rows);
                PGresult *end = PQexec(l->db, r == 0 ? "COMMIT" : "ROLLBACK");
                int e = query_ok(l, end, PGRES_COMMAND_OK, r == 0 ? "commit" : "rollback");
                PQclear(end);
                r = r ? r : e;
        }
        PQclear(res);
        return r;
}

int lifecycle_send(struct ledger *l, const struct usage_event *ev)
{
        char ts[64], vcpus[16], mem[32], disk[32];
        format_ts(ts, sizeof(ts), ev->wall_ns);
        int sent;
        if (ev->type == EVENT_CREATED) {
                char *ljson = labels_json(ev);
                snprintf(vcpus, sizeof(vcpus), "%u", ev->vcpus);
                snprintf(mem, sizeof(mem), "%" PRIu64, ev->mem_size_bytes);
                snprintf(disk, sizeof(disk), "%" PRIu64, ev->disk_size_bytes);
                const char *params[] = { ev->sandbox, ev->account, ev->key, ev->host, ev->parent[0] ? ev->parent : NULL,
                                         ev->backend[0] ? ev->backend : NULL, vcpus, mem, disk,
                                         ljson ? ljson : "{}", ts };
                sent = ledger_send(l, STMT_SANDBOX_CREATED, 11, params, NULL, NULL);
                free(ljson);
        } else if (ev->type == EVENT_PAUSED || ev->type == EVENT_RESUMED || ev->type == EVENT_STOPPED) {
                const char *state = ev->type == EVENT_PAUSED ? "paused" : ev->type == EVENT_RESUMED ? "running" : "stopped";
                const char *params[] = { ev->sandbox, state };
                sent = ledger_send(l, STMT_SANDBOX_STATE, 2, params, NULL, NULL);
        } else {
                return 0; /* forked: each copy has its own created event */
        }
        return sent;
}
