/* metrics.c — see metrics.h. Reads the counters, never writes them. */
#include "metrics.h"

#include "log.h"

#include <inttypes.h>
#include <stddef.h>

static uint64_t get(const _Atomic uint64_t *v) { return atomic_load_explicit(v, memory_order_relaxed); }

static void scalar(struct metrics_text *p, const char *name, const char *type, const char *help,
                   const _Atomic uint64_t *v)
{
        metrics_text_put(p, "# HELP %s %s\n# TYPE %s %s\n%s %" PRIu64 "\n", name, help, name, type, name, get(v));
}

static void histogram(struct metrics_text *p, const char *name, const char *help, const struct metrics_histogram *h)
{
        metrics_text_put(p, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
        metrics_text_histogram(p, name, h);
}

int agg_metrics_text(const struct agg_metrics *m, char *buf, size_t size)
{
        struct metrics_text p;
        metrics_text_init(&p, buf, size);
        static const struct {
                const char *name, *type, *help;
                size_t offset;
        } table[] = {
#define C(field, name, help) { name, "counter", help, offsetof(struct agg_metrics, field) }
#define G(field, name, help) { name, "gauge", help, offsetof(struct agg_metrics, field) }
                C(batches_committed, "tally_aggregator_batches_committed_total", "Batches committed to the ledger"),
                C(messages_committed, "tally_aggregator_messages_total", "Messages committed (billed, duplicate or dead-lettered)"),
                C(batches_failed, "tally_aggregator_batches_failed_total", "Batch commits the database refused (read again)"),
                C(batches_fenced, "tally_aggregator_batches_fenced_total", "Batches dropped: a partition or sandbox is owned elsewhere now"),
                C(batch_splits, "tally_aggregator_batch_splits_total", "Times a batch that kept failing was halved to find the message at fault"),
                C(offset_gaps, "tally_aggregator_offset_gaps_total", "Stored offsets no longer in the broker (recorded in offset_gaps)"),
                C(offsets_lost, "tally_aggregator_offsets_lost_total", "Messages lost to those gaps, never billed"),
                C(rating_gaps, "tally_aggregator_rating_gaps_total", "Account-meter-hours with usage and no rate in the plan (rating_gaps)"),
                C(sandboxes_fenced, "tally_aggregator_sandbox_fence_total", "Commits refused: a sandbox's fold state was moved on by another aggregator"),
                C(sandboxes_loaded, "tally_aggregator_sandboxes_loaded_total", "Sandboxes whose fold state was read from the ledger"),
                C(state_reads, "tally_aggregator_state_reads_total", "Queries reading fold states from the ledger: one per poll for its sandboxes not in memory, one per sandbox a poll's read missed"),
                C(sandboxes_evicted, "tally_aggregator_sandboxes_evicted_total", "Sandboxes dropped from memory after their last reading"),
                G(sandboxes_in_memory, "tally_aggregator_sandboxes", "Sandboxes held in memory"),
                G(metering_gap_hosts, "tally_aggregator_metering_gap_hosts", "Hosts with running sandboxes and no recent sample (metering_gaps)"),
                C(metering_gaps_seen, "tally_aggregator_metering_gaps_total", "Hosts seen in metering_gaps, summed over the checks"),
                C(clock_ahead, "tally_aggregator_clock_ahead_total", "Readings dated too far ahead of the aggregator's clock (placed at its clock)"),
                C(clock_behind, "tally_aggregator_clock_behind_total", "Readings dated too far behind the aggregator's clock (placed at its clock)"),
                C(counter_resets, "tally_aggregator_counter_resets_total", "CPU counters that went back within an epoch, billed as restarts"),
                C(held_back, "tally_aggregator_held_back_total", "Held-time counters that went back (nothing billed for them)"),
                C(stops_folded, "tally_aggregator_stops_folded_total", "vmm stopped events folded (closing a sandbox's bill)"),
                C(readings_held, "tally_aggregator_readings_held_total", "Readings held: no created event for the sandbox yet, or an epoch its host did not announce"),
                C(readings_released, "tally_aggregator_readings_released_total", "Held readings taken once the sandbox's created or restarted event came"),
                C(readings_expired, "tally_aggregator_readings_expired_total", "Held readings dead-lettered after provenance_grace_ms"),
#undef C
#undef G
        };
        for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++)
                scalar(&p, table[i].name, table[i].type, table[i].help,
                       (const _Atomic uint64_t *)((const char *)m + table[i].offset));
        static const char *const causes[AGG_DEAD_CAUSES] = { "decode", "database" };
        metrics_text_put(&p, "# HELP tally_aggregator_dead_letters_total Messages set aside in dead_letters, by cause\n"
                "# TYPE tally_aggregator_dead_letters_total counter\n");
        for (int c = 0; c < AGG_DEAD_CAUSES; c++)
                metrics_text_put(&p, "tally_aggregator_dead_letters_total{cause=\"%s\"} %" PRIu64 "\n", causes[c],
                    get(&m->dead_letters[c]));
        histogram(&p, "tally_aggregator_commit_seconds", "Time of one batch's transaction", &m->commit);
        histogram(&p, "tally_aggregator_commit_lag_seconds",
                  "From a sample's Kafka timestamp (its message's) to its commit; a usage batch counts once per sample",
                  &m->lag);
        return metrics_text_end(&p);
}

int agg_metrics_page(const void *m, char *buf, size_t size)
{
        return agg_metrics_text(m, buf, size);
}

void agg_log_lag_histogram(const uint64_t *hist, int buckets)
{
        char line[800];
        size_t len = 0;
        for (int i = 0; i < buckets; i++) {
                if (hist[i]) {
                        len += (size_t)snprintf(line + len, sizeof(line) - len, "%s%d:%" PRIu64, len ? " " : "", i,
                                                hist[i]);
                }
                if (len && (i == buckets - 1 || len > sizeof(line) - 48)) {
                        log_debug("commit lag histogram", "ms_samples=\"%s\"", line);
                        len = 0;
                }
        }
}
