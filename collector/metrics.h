/* metrics.h — how tally-collector's modules update its counters and gauges
 * (struct collector_metrics, collector.h). The engine's thread writes them;
 * the HTTP thread reads them (collector_metrics_text, metrics.c) with relaxed
 * atomic loads, so every access goes through these macros. m is a
 * struct collector_metrics *. */
#pragma once

#include "collector.h"

#define M_SET(m, field, v) __atomic_store_n(&(m)->field, (uint64_t)(v), __ATOMIC_RELAXED)
#define M_ADD(m, field, v) __atomic_fetch_add(&(m)->field, (uint64_t)(v), __ATOMIC_RELAXED)
#define M_GET(m, field)    __atomic_load_n(&(m)->field, __ATOMIC_RELAXED)
