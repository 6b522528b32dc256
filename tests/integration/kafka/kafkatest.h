/* kafkatest.h — what Apache Kafka's fault tests share (on top of aggtest.h):
 * who leads a partition of `usage`, and the comparison of the ledger with the
 * generator's ground truth, printed number by number. */
#pragma once

#include "aggtest.h"
#include "streamgen.h"

/* The node id (KRaft node.id = broker id) leading partition of `usage`; -1 if none. */
int kt_leader(struct aggtest *t, int32_t partition);
/* Prints every partition's leader and in-sync replicas. */
void kt_print_leaders(struct aggtest *t, const char *when);
/* Compares, and prints: messages produced with the end of the topic (nothing
 * lost, nothing doubled on the broker), offsets committed with the end, and
 * the ledger's totals with the ground truth; then every sandbox (gen_stream_verify). */
void kt_compare(struct aggtest *t, const struct gen_stream *g, int64_t produced);
/* Produces messages [from, to) of g in `steps` equal parts, one part every step_ms. */
void kt_produce_paced(struct aggtest *t, const struct gen_stream *g, size_t from, size_t to, int steps, int step_ms);

/* How many times what occurs in aggregator n's log (t->dir/aggregator.N.log). */
int kt_log_count(struct aggtest *t, int n, const char *what);
