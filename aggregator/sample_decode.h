/* sample_decode.h — the aggregator's fast path for the message it reads most:
 * a plain usage sample as the collector writes it.
 *
 * event_decode (common/event.c) builds a whole JSON tree with jansson: about
 * 11 µs of CPU per sample here, more than half of the aggregator's own CPU.
 * sample_decode_fast reads a sample in one pass with no allocation. It takes
 * only what it is sure event_decode would decode to the same struct: a flat
 * object of known fields, each once, strings of printable ASCII without
 * escapes, integers without sign, fraction or exponent, type "sample", every
 * field in range. Anything else (another type, labels, an escape, an unknown
 * or repeated field, a value out of range, bad JSON) is left to event_decode,
 * which also gives the reason a message is refused. Its unit test compares
 * the two on many messages. */
#pragma once

#include "event.h"

#include <stdbool.h>
#include <stddef.h>

/* true: *ev holds the sample (no labels, nothing to free); false: nothing is
 * said about the message, decode it with event_decode. */
bool sample_decode_fast(const void *buf, size_t len, struct usage_event *ev);
