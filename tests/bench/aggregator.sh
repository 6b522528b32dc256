#!/usr/bin/env bash
# tests/bench/aggregator.sh — tally-aggregator's figures on this machine, with
# the goals (docs/benchmarks.md) beside them; the last line is JSON. Its baseline (a
# billing engine's published 10,000 events/s) is quoted, not measured here,
# and printed and keyed as quoted.
#
#  e2e_samples_per_s           1,000,000 samples preloaded in the development broker, consumed,
#                              folded and committed exactly once into PostgreSQL (from the
#                              partitions' assignment to the last offset committed; the figure
#                              with the group join included is printed too). Valid only when every
#                              sample was billed and none was dropped: the broker's first offsets
#                              are all 0 and no retention gap was recorded (offset_gaps)
#  e2e_cpu_ns_per_sample_*     where the time goes, whatever else runs on the machine: CPU time
#                              (user + system) of the aggregator, of PostgreSQL and of the broker
#                              over the end-to-end phase, per sample; with the batches' count, size
#                              and time, and the load average when it ran
#  fold_samples_per_s_per_core the fold stage alone, in memory, one core
#  commit_latency_ms_p50/p99   Kafka create time of a sample -> its batch committed, at a steady
#                              50,000 samples/s (the aggregator's own histogram, printed at exit),
#                              on fresh samples: 5,000 sandboxes never billed before, so every
#                              sample is folded, rated and written (checked in usage_hourly)
#  freeze_latency_ms_p50/p99   the sample that crosses a key's daily limit produced -> pause command
#                              published -> consumed by a real tally-vmm -> its process
#                              sandbox's freezer cgroup reads FROZEN
#
#  --kafka apache              also runs the end-to-end and commit-latency phases, in the same run,
#                              against one real Apache Kafka node (scripts/kafka, same partitions,
#                              a database of their own), reported as apache_e2e_samples_per_s,
#                              apache_e2e_samples_per_s_with_join, apache_commit_latency_ms_p50/p99
set -euo pipefail
source "$(dirname "$0")/../../scripts/lib.sh"
BUILD=${TALLY_BUILD:?run through scripts/bench}
BENCH=$BUILD/tests/bench/aggregator/bench-aggregator
AGG=$BUILD/aggregator/tally-aggregator
SANDBOXES=${SANDBOXES:-10000}
SAMPLES=${SAMPLES:-100}
# The development broker keeps 5 MiB per partition by default (librdkafka's mock cluster) and
# drops older messages: most of a 1,000,000-sample preload. Here it is told to keep 2 GiB (and
# 10,000,000 producer batches) per partition, its --keep-bytes-per-partition, through the
# environment (it logs the limits in force at start); the end-to-end phase checks nothing was dropped.
export TALLY_KEEP_BYTES_PER_PARTITION=${TALLY_KEEP_BYTES_PER_PARTITION:-2147483648}
export TALLY_KEEP_BATCHES_PER_PARTITION=${TALLY_KEEP_BATCHES_PER_PARTITION:-10000000}
PARTITIONS=${PARTITIONS:-4}
load1() { cut -d' ' -f1 /proc/loadavg; }
LOAD_START=$(load1)
KAFKA=dev
while [ $# -gt 0 ]; do
  case "$1" in
    --kafka) KAFKA=${2:-}; shift ;;
    *) die "unknown argument $1 (aggregator takes --kafka apache)" ;;
  esac
  shift
done
case "$KAFKA" in dev|apache) ;; *) die "--kafka is dev or apache" ;; esac
WORK=$(mktemp -d /tmp/tally-bench-aggregator.XXXXXX)
AGG_PID=
VMM_PID=
cleanup() {
  [ -n "$AGG_PID" ] && kill "$AGG_PID" 2>/dev/null
  [ -n "$VMM_PID" ] && kill "$VMM_PID" 2>/dev/null && wait "$VMM_PID" 2>/dev/null
  stop_test_services "$WORK"
}
trap cleanup EXIT
TALLY_PARTITIONS=$PARTITIONS start_test_services "$WORK" "$BUILD"
DB="${TALLY_TEST_PG_URL%/*}/tally"
"$BUILD/ledger/tally-migrate" --database-url "$(pg_role_url "$DB" tally_owner)" --log-level warn
psql() { "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 "$DB" "$@"; }
committed() { psql -tAc "SELECT coalesce(sum(next_offset), 0) FROM consumer_offsets WHERE group_id = 'tally-aggregator'"; }
# Waits that fail (die) at their timeout, never carry on.
wait_committed() { # N TIMEOUT_S
  local end=$(( $(date +%s) + $2 ))
  while [ "$(committed)" -lt "$1" ]; do
    [ "$(date +%s)" -lt "$end" ] || die "the aggregator committed $(committed) of $1 messages in $2 s"
    sleep 0.05
  done
}
wait_log() { # FILE PATTERN TIMEOUT_S
  local end=$(( $(date +%s) + $3 ))
  until grep -q "$2" "$1"; do
    [ "$(date +%s)" -lt "$end" ] || die "no \"$2\" in $1 after $3 s: $(tail -3 "$1")"
    sleep 0.1
  done
}
# What the ledger billed the sandboxes named PREFIX-N: sandboxes, CPU ns, memory byte-ns.
billed() { psql -tAc "SELECT count(DISTINCT sandbox_id) || ' ' || coalesce(sum(cpu_ns), 0) || ' ' || coalesce(sum(mem_byte_ns), 0)
                        FROM usage_hourly WHERE sandbox_id LIKE '$1-%'"; }
start_agg() { "$AGG" --database-url "$(pg_role_url "$DB" tally_aggregator)" --kafka-brokers "$TALLY_TEST_BROKERS" --log-level info "$@" 2>"$WORK/agg.$1.log" & AGG_PID=$!; }

# CPU seconds x 100 (user + system) of a process, and of every process of this PostgreSQL.
cpu_of() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
pg_cpu() {
  local pm c t=0
  pm=$(head -1 "$WORK/pg/data/postmaster.pid")
  for c in $pm $(pgrep -P "$pm"); do t=$(( t + $(cpu_of "$c") )); done
  echo $t
}
# The broker's processes: the development broker, or the Apache Kafka node(s) of $WORK/kafka.
broker_cpu() {
  local t=0 f
  if [ "$BROKERS" = "$TALLY_TEST_BROKERS" ]; then
    t=$(cpu_of "$(cat "$WORK/run/broker.pid")")
  else
    for f in "$WORK"/kafka/node.*/pid; do t=$(( t + $(cpu_of "$(cat "$f")") )); done
  fi
  echo $t
}
ns_per_sample() { echo $(( $1 * 10000000 / TOTAL )); } # CPU hundredths of a second over TOTAL samples -> ns

say "fold stage alone"
FOLD=$("$BENCH" fold 20000000 | sed -n 's/^fold_samples_per_s_per_core=//p')

# The end-to-end and commit-latency phases against BROKERS, billing into DB (a fresh database).
phases() {
  TOTAL=$((SANDBOXES * SAMPLES))
  say "preloading $TOTAL samples ($SANDBOXES sandboxes x $SAMPLES)"
  "$BENCH" produce "$BROKERS" "$SANDBOXES" "$SAMPLES" 0 >&2
  say "end to end: broker -> fold -> exactly-once commits"
  E2E_LOAD=$(load1)
  PG0=$(pg_cpu) BR0=$(broker_cpu)
  T0=$(date +%s%N)
  "$AGG" --database-url "$(pg_role_url "$DB" tally_aggregator)" --kafka-brokers "$BROKERS" --log-level debug 2>"$WORK/agg.e2e.log" &
  AGG_PID=$!
  wait_committed "$TOTAL" 600
  T1=$(date +%s%N)
  CPU_AGG=$(cpu_of $AGG_PID) CPU_PG=$(( $(pg_cpu) - PG0 )) CPU_BR=$(( $(broker_cpu) - BR0 ))
  kill -TERM $AGG_PID; wait $AGG_PID || true; AGG_PID=
  E2E_LOAD="$E2E_LOAD..$(load1)"
  CPU_JSON="$(ns_per_sample $CPU_AGG), $(ns_per_sample $CPU_PG), $(ns_per_sample $CPU_BR)"
  say "end to end: CPU per sample (ns): aggregator $(ns_per_sample $CPU_AGG), PostgreSQL $(ns_per_sample $CPU_PG)," \
      "broker $(ns_per_sample $CPU_BR); load average $E2E_LOAD over $(( (T1 - T0) / 1000000 )) ms"
  E2E_BATCHES=$(grep 'msg="batch committed"' "$WORK/agg.e2e.log" | sed 's/.* messages=\([0-9]*\) .* ms=\([0-9]*\).*/\1 \2/' |
    awk '$1 > 0 { n++; m += $1; t += $2 } END { if (n) printf "%d batches, %d messages each on average, %d ms of commits in all", n, m / n, t }')
  say "end to end: $E2E_BATCHES"
  # Nothing dropped: no retention gap recorded, and (development broker) every partition still starts at 0.
  GAPS=$(psql -tAc "SELECT count(*) FROM offset_gaps")
  DROPPED=0
  if [ "$BROKERS" = "$TALLY_TEST_BROKERS" ]; then
    DROPPED=$("$BUILD/broker/tally-broker" --control-socket "$TALLY_TEST_BROKER_CONTROL" ctl watermarks |
      tr ' ' '\n' | sed -n 's/^[0-9]*=\([0-9]*\)\.\..*/\1/p' | awk '{ s += $1 } END { print s + 0 }')
  fi
  # Throughput from the moment the aggregator holds its partitions (joining the
  # group takes ~3 s in the development broker; printed separately) to the last commit.
  ASSIGNED_TS=$(sed -n 's/^ts=\([^ ]*\) .*partition assigned.*/\1/p' "$WORK/agg.e2e.log" | head -1)
  TA=$(date -d "$ASSIGNED_TS" +%s%N)
  JOIN_MS=$(( (TA - T0) / 1000000 ))
  E2E=$(( TOTAL * 1000000000 / (T1 - TA) ))
  E2E_WITH_JOIN=$(( TOTAL * 1000000000 / (T1 - T0) ))

  # Each sample's cpu_ns is k x 0.7 s and its wall time t0 + k s (k = 0..SAMPLES-1), running, 4 GiB:
  # a sandbox is billed (SAMPLES-1) x 0.7 CPU-s and 4 GiB x (SAMPLES-1) s, worked by hand here.
  want_billed() { # SANDBOXES
    echo "$1 $(( $1 * (SAMPLES - 1) * 700000000 )) $(psql -tAc "SELECT $1::numeric * 4 * 1073741824 * ($SAMPLES - 1) * 1000000000")"
  }
  E2E_BILLED=$(billed bench-sb)
  E2E_WANT=$(want_billed "$SANDBOXES")
  # Memory is billed for each interval between two samples the aggregator saw: a sample it never
  # got (dropped by the broker) leaves its interval to the next one, but samples lost from the
  # start of a sandbox's stream leave theirs unbilled. So memory tells how much was consumed.
  E2E_INTERVALS=$(psql -tAc "SELECT coalesce(sum(mem_byte_ns), 0) / (4 * 1073741824::numeric * 1000000000) FROM usage_hourly WHERE sandbox_id LIKE 'bench-sb-%'")
  E2E_INTERVALS=${E2E_INTERVALS%%.*}
  E2E_JSON=$E2E
  if [ "$GAPS" != 0 ] || [ "$DROPPED" != 0 ]; then
    say "end to end: NOT ALL CONSUMED: $GAPS retention gaps recorded, $DROPPED messages dropped by the broker"
    E2E_NOTE="INVALID: the broker dropped $DROPPED messages ($GAPS retention gaps recorded)"
    E2E_JSON=null
  elif [ "$E2E_BILLED" != "$E2E_WANT" ]; then
    say "end to end: NOT ALL BILLED: (sandboxes cpu_ns mem_byte_ns) $E2E_BILLED, want $E2E_WANT;"
    say "  memory for $E2E_INTERVALS of $(( SANDBOXES * (SAMPLES - 1) )) sample intervals: the broker dropped the rest (PARTITIONS=$PARTITIONS)"
    E2E_NOTE="INVALID: only $E2E_INTERVALS of $(( SANDBOXES * (SAMPLES - 1) )) intervals billed; the broker dropped the rest"
    E2E_JSON=null
  else
    say "end to end: all billed: (sandboxes cpu_ns mem_byte_ns) $E2E_BILLED"
    E2E_NOTE=""
  fi

  say "commit latency at a steady 50,000 samples/s, on fresh samples"
  # 5,000 sandboxes the ledger has never seen (bench-lat-N): every sample is new
  # usage to fold, rate and write, none a duplicate of the end-to-end phase's.
  LAT_SANDBOXES=5000
  LAT_BEFORE=$(billed bench-lat)
  [ "$LAT_BEFORE" = "0 0 0" ] || die "the latency phase's sandboxes were billed before it: $LAT_BEFORE"
  "$AGG" --database-url "$(pg_role_url "$DB" tally_aggregator)" --kafka-brokers "$BROKERS" --log-level debug 2>"$WORK/agg.lat.log" &
  AGG_PID=$!
  wait_log "$WORK/agg.lat.log" "partition assigned" 30
  sleep 1
  "$BENCH" produce "$BROKERS" "$LAT_SANDBOXES" "$SAMPLES" 50000 bench-lat >&2
  wait_committed $(( TOTAL + LAT_SANDBOXES * SAMPLES )) 300
  kill -TERM $AGG_PID; wait $AGG_PID || true; AGG_PID=
  LAT_BILLED=$(billed bench-lat)
  LAT_WANT=$(want_billed "$LAT_SANDBOXES")
  say "latency phase billed (sandboxes cpu_ns mem_byte_ns): $LAT_BILLED (want $LAT_WANT)"
  [ "$LAT_BILLED" = "$LAT_WANT" ] || die "the latency phase's samples were not all billed: $LAT_BILLED, want $LAT_WANT"
  LAT_ROWS=$(psql -tAc "SELECT count(*) FROM usage_hourly WHERE sandbox_id LIKE 'bench-lat-%'")
  # The batches behind the latency: how many, how big, how long (the aggregator's debug lines).
  LAT_BATCHES=$(grep 'msg="batch committed"' "$WORK/agg.lat.log" | sed 's/.* messages=\([0-9]*\) .* ms=\([0-9]*\).*/\1 \2/' |
    awk '$1 > 0 { n++; m += $1; t += $2; if ($2 > mx) mx = $2 } END { if (n) printf "%d batches, %d messages each on average, %d ms each on average, longest %d ms", n, m / n, t / n, mx }')
  say "latency phase: $LAT_BATCHES"
  LAT=$(grep 'msg="aggregator stopped"' "$WORK/agg.lat.log")
  P50=$(sed -n 's/.*commit_lag_ms_p50=\([0-9-]*\).*/\1/p' <<<"$LAT")
  P99=$(sed -n 's/.*commit_lag_ms_p99=\([0-9-]*\).*/\1/p' <<<"$LAT")

}

BROKERS=$TALLY_TEST_BROKERS
phases

if [ "$KAFKA" = apache ]; then
  D=(E2E E2E_JSON E2E_WITH_JOIN JOIN_MS E2E_NOTE P50 P99 LAT_ROWS LAT_BATCHES CPU_JSON E2E_LOAD E2E_BATCHES)
  for v in "${D[@]}"; do eval "DEV_$v=\$$v"; done
  say "the same phases against Apache Kafka $(kafka_version), one node, $PARTITIONS partitions"
  kafka_start "$WORK/kafka" 1 "$PARTITIONS" 1209600000 "${TALLY_KAFKA_HEAP:-1g}" >/dev/null
  BROKERS=$(cat "$WORK/kafka/bootstrap")
  psql -c "CREATE DATABASE tally_apache OWNER tally_owner"
  DEV_DB=$DB
  DB="${TALLY_TEST_PG_URL%/*}/tally_apache"
  "$BUILD/ledger/tally-migrate" --database-url "$(pg_role_url "$DB" tally_owner)" --log-level warn
  phases
  for v in "${D[@]}"; do eval "APACHE_$v=\$$v; $v=\$DEV_$v"; done
  DB=$DEV_DB
  kafka_stop "$WORK/kafka"
fi

say "freeze latency: limit crossed -> pause command -> tally-vmm sandbox frozen"
TRIALS=${TRIALS:-20}
psql -c "INSERT INTO accounts (id, name) VALUES ('bench-freeze-acct', 'bench')" \
     -c "INSERT INTO api_keys (id, account_id, key_hash, daily_limit_nanodollars, limit_policy)
         SELECT 'bench-freeze-' || i, 'bench-freeze-acct', sha256(('bench-freeze-' || i)::bytea), 10000000, 'pause'
           FROM generate_series(0, $TRIALS - 1) AS i"
"$AGG" --database-url "$(pg_role_url "$DB" tally_aggregator)" --kafka-brokers "$TALLY_TEST_BROKERS" --log-level info 2>"$WORK/agg.freeze.log" &
AGG_PID=$!
wait_log "$WORK/agg.freeze.log" "partition assigned" 30
# The real tally-vmm carries the pause out (process sandboxes, its own cgroup parent).
VMM_PARENT=tally-bench-aggregator-$$
"$TALLY_BUILD/vmm/tally-vmm" --state-dir "$WORK/vmm" --kafka-brokers "$TALLY_TEST_BROKERS" --backend process \
  --cgroup-parent "$VMM_PARENT" --final-wait-ms 200 2>"$WORK/vmm.log" &
VMM_PID=$!
SOCK_END=$(( $(date +%s) + 30 ))
until [ -S "$WORK/vmm/vmm.sock" ]; do
  kill -0 $VMM_PID || die "tally-vmm exited: $(tail -3 "$WORK/vmm.log")"
  [ "$(date +%s)" -lt "$SOCK_END" ] || die "tally-vmm opened no socket in 30 s: $(tail -3 "$WORK/vmm.log")"
  sleep 0.1
done
wait_log "$WORK/vmm.log" "control topic assigned" 30
"$BENCH" freeze "$TALLY_TEST_BROKERS" "$TRIALS" "$TALLY_BUILD/vmm/tally-vmm" "$WORK/vmm" "$VMM_PARENT" >"$WORK/freeze.txt"
kill -TERM $AGG_PID; wait $AGG_PID || true; AGG_PID=
sleep 0.5  # the last stopped sandbox's cgroup goes once its final counter is out
kill -TERM $VMM_PID; wait $VMM_PID || true; VMM_PID=
for h in /sys/fs/cgroup/*/"$VMM_PARENT"; do rmdir "$h"/*/ "$h" 2>/dev/null || true; done
sed -n 's/^freeze_ms=//p' "$WORK/freeze.txt" | sort -n >"$WORK/freeze.sorted"
N=$(wc -l <"$WORK/freeze.sorted")
F50=$(sed -n "$(( (N * 50 + 99) / 100 ))p" "$WORK/freeze.sorted")
F99=$(sed -n "$(( (N * 99 + 99) / 100 ))p" "$WORK/freeze.sorted")

printf '%-34s %14s   %s\n' "figure" "measured" "goal / quoted baseline"
printf '%-34s %14s   %s\n' "e2e samples/s ($PARTITIONS partitions)" "$E2E" ">= 200000; quoted baseline, not measured here: a billing engine's published 10000 events/s"
[ -z "$E2E_NOTE" ] || printf '%-34s %14s   %s\n' "  e2e samples/s is" "" "$E2E_NOTE"
printf '%-34s %14s   %s\n' "  (with the ${JOIN_MS} ms group join)" "$E2E_WITH_JOIN" ""
printf '%-34s %14s   %s\n' "  e2e CPU ns/sample" "" "aggregator, PostgreSQL, broker: $CPU_JSON (load average $E2E_LOAD; $E2E_BATCHES)"
printf '%-34s %14s   %s\n' "fold samples/s per core" "$FOLD" "-"
printf '%-34s %14s   %s\n' "commit latency p50 (ms)" "$P50" "- (fresh samples: $LAT_SANDBOXES new sandboxes, $LAT_ROWS usage_hourly rows written)"
printf '%-34s %14s   %s\n' "commit latency p99 (ms)" "$P99" "<= 2000"
if [ "$KAFKA" = apache ]; then
  printf '%-34s %14s   %s\n' "Apache Kafka e2e samples/s" "$APACHE_E2E" "(one node, $PARTITIONS partitions, same run)"
  [ -z "$APACHE_E2E_NOTE" ] || printf '%-34s %14s   %s\n' "  Apache e2e samples/s is" "" "$APACHE_E2E_NOTE"
  printf '%-34s %14s   %s\n' "  (with the ${APACHE_JOIN_MS} ms group join)" "$APACHE_E2E_WITH_JOIN" ""
  printf '%-34s %14s   %s\n' "Apache Kafka commit latency p50" "$APACHE_P50" "($APACHE_LAT_ROWS usage_hourly rows written)"
  printf '%-34s %14s   %s\n' "Apache Kafka commit latency p99" "$APACHE_P99" "<= 2000"
  printf '%-34s %14s   %s\n' "  Apache e2e CPU ns/sample" "" "aggregator, PostgreSQL, Kafka: $APACHE_CPU_JSON (load average $APACHE_E2E_LOAD)"
  APACHE_JSON=$(printf ', "apache_kafka_version": "%s", "apache_e2e_samples_per_s": %s, "apache_e2e_samples_per_s_with_join": %s, "apache_commit_latency_ms_p50": %s, "apache_commit_latency_ms_p99": %s, "apache_commit_latency_usage_rows": %s, "apache_e2e_cpu_ns_per_sample_aggregator_postgres_broker": [%s], "apache_e2e_load_average_1m": "%s"' \
    "$(kafka_version)" "$APACHE_E2E_JSON" "$APACHE_E2E_WITH_JOIN" "$APACHE_P50" "$APACHE_P99" "$APACHE_LAT_ROWS" "$APACHE_CPU_JSON" "$APACHE_E2E_LOAD")
else
  APACHE_JSON=
fi
printf '%-34s %14s   %s\n' "freeze latency p50 (ms, $N trials)" "$F50" "-"
printf '%-34s %14s   %s\n' "freeze latency p99 (ms)" "$F99" "<= 2000"
printf '{"partitions": %s, "e2e_samples_per_s": %s, "quoted_baseline_billing_engine_events_per_s": 10000, "e2e_cpu_ns_per_sample_aggregator_postgres_broker": [%s], "e2e_load_average_1m": "%s", "fold_samples_per_s_per_core": %s, "commit_latency_ms_p50": %s, "commit_latency_ms_p99": %s, "commit_latency_fresh_sandboxes": %s, "commit_latency_usage_rows": %s, "freeze_latency_ms_p50": %s, "freeze_latency_ms_p99": %s, "load_average_1m_start_end": "%s..%s"%s}\n' \
  "$PARTITIONS" "$E2E_JSON" "$CPU_JSON" "$E2E_LOAD" "$FOLD" "$P50" "$P99" "$LAT_SANDBOXES" "$LAT_ROWS" "$F50" "$F99" "$LOAD_START" "$(load1)" "$APACHE_JSON"
