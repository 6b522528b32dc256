/* sample_batch.h — usage batches (format v2, docs/events.md "Usage batches"):
 * one binary message holding many samples of one tick, all of one partition.
 *
 * The collector writes them (sample_batch_begin, then sample_batch_record for
 * each sample); the aggregator reads them (sample_batch_open, then
 * sample_batch_next until it says the end). Both work in the caller's
 * buffers, with no allocation. The reader is total: whatever bytes it is
 * given, each record either decodes to the same struct usage_event that
 * event_decode gives for the equivalent v1 sample, or is refused with a
 * reason, and a refused record costs only itself unless its length runs past
 * the message (then the rest is refused as one). */
#pragma once

#include "event.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SAMPLE_BATCH_VERSION    2
#define SAMPLE_BATCH_MAX_BYTES  (256 * 1024) /* a batch message, at most (the writer's rule) */
/* A record's largest size: its length, flags, three ids and 15 varints. */
#define SAMPLE_BATCH_RECORD_MAX (2 + 1 + 3 * (1 + EVENT_ID_MAX) + 15 * 10)
/* A header's largest size: version, host, two varints. */
#define SAMPLE_BATCH_HEADER_MAX (1 + 1 + EVENT_ID_MAX + 2 * 10)

/* Is buf a usage batch (its first byte the version byte) rather than JSON? */
static inline bool sample_batch_is(const void *buf, size_t len)
{
        return len > 0 && *(const unsigned char *)buf == SAMPLE_BATCH_VERSION;
}

/* Writes a batch's header into buf: host ("" names none), and the wall and
 * monotonic times most of its samples share. Returns its length, or -EINVAL
 * (a bad host or time), -ENOBUFS. */
int sample_batch_begin(uint8_t *buf, size_t size, const char *host, int64_t wall_base, int64_t mono_base);

/* Appends ev (a sample) as a record to a batch whose header said wall_base
 * and mono_base. Returns the bytes written, or -EINVAL (not a sample
 * event_decode would take: an id, range or pair out of rule), -ENOBUFS. */
int sample_batch_record(uint8_t *buf, size_t size, int64_t wall_base, int64_t mono_base,
                        const struct usage_event *ev);

struct sample_batch_reader {
        const uint8_t *p, *end;         /* the next record, the message's end */
        char host[EVENT_ID_MAX + 1];    /* the batch's, "" when it names none */
        int64_t wall_base, mono_base;
        size_t index;                   /* records read so far */
};

/* Reads a batch's header. Returns 0, or -EINVAL with the reason in why: the
 * whole message is refused. */
int sample_batch_open(struct sample_batch_reader *r, const void *buf, size_t len, char *why, size_t whylen);

/* The sandbox id of the record at *at (0: the first) without decoding the
 * rest of it, *at moved to the next record: true with id set, false at the
 * end (also at bytes that do not read as a batch: *at is then len). A hint
 * only, for reading fold states ahead: the fold decodes every record. */
bool sample_batch_peek_sandbox(const void *buf, size_t len, size_t *at, char id[EVENT_ID_MAX + 1]);

/* Reads the next record into *ev (a sample: no labels, nothing to free) and
 * points *rec, *reclen at its bytes. Returns 1 for a sample; 0 at the end;
 * -EINVAL when this record is refused (why says so; reading goes on with the
 * next); -EPROTO when its length runs past the message: [*rec, end) is
 * refused as one and there is nothing more to read. */
int sample_batch_next(struct sample_batch_reader *r, struct usage_event *ev, const uint8_t **rec, size_t *reclen,
                      char *why, size_t whylen);
