#!/usr/bin/env bash
# tests/bench/aggregator.sh — tally-aggregator's figures on this machine, with
# the goals (docs/benchmarks.md) beside them, and the machine's own ceiling
# measured in the same run; the last line is JSON. Its baseline (a billing
# engine's published 10,000 events/s) is quoted, not measured here, and
# printed and keyed as quoted.
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
#                              and time, the usage and fold state rows written per sample, and the
#                              load average when it ran
#  consume_only_*              the ceiling: a plain librdkafka consumer (the aggregator's fetch
#                              settings) reading the same preloaded messages and discarding them:
#                              messages/s, samples/s, its CPU per sample; e2e_of_consume_only is
#                              e2e_samples_per_s / consume_only_samples_per_s
#  copy_rows_per_s             the other ceiling: PostgreSQL's COPY of 1,000,000 usage_hourly-shaped
#                              rows (a primary key of (sandbox, hour), one transaction), and its CPU
#                              per row; beside it the samples/s PostgreSQL could take if it did
#                              nothing but COPY the rows the end-to-end phase wrote per sample
#  fold_samples_per_s_per_core the fold stage alone, in memory, one core
#  commit_latency_ms_p50/p99   Kafka create time of a sample -> its batch committed, at a steady
#                              LAT_RATE (200,000) samples/s offered (paced by the producer), with
#                              the aggregator's own histogram printed at exit, on fresh samples:
#                              5,000 sandboxes never billed before, so every sample is folded,
#                              rated and written (checked in usage_hourly); each sandbox's created
#                              event in the same round as its first sample
#  commit_latency_created_ahead_ms_p50/p99
#                              the same on 5,000 more new sandboxes whose created events were
#                              committed before their samples start (a vmm announces a sandbox a
#                              collector's tick or more before its first sample)
#  commit_latency_N_aggregators_ms_p50/p99, commit_latency_created_ahead_N_aggregators_ms_p50/p99
#                              the two above again, on 5,000 more new sandboxes each, with
#                              LAT_AGGREGATORS (N, 2) tally-aggregators in the group sharing the
#                              partitions, each committing its own on a PostgreSQL connection of
#                              its own (their histograms, logged at exit, merged)
#  freeze_latency_ms_p50/p99   the sample that crosses a key's daily limit produced -> pause command
#                              published -> consumed by a real tally-vmm -> its process
#                              sandbox's freezer cgroup reads FROZEN
#
#  FORMATS                     the preload formats measured, one after another on the same broker
#                              and ledger (default: v1, one message per sample, then v2, usage
#                              batches, docs/events.md); the first keeps
#                              the keys above, each further one gets them prefixed with its name
#                              (v2_e2e_samples_per_s, ...). A format is a case of produce() below.
#  PERF_DIR                    when set, `perf record -g` of the aggregator and PostgreSQL over each
#                              end-to-end phase, into PERF_DIR/e2e.PREFIXFORMAT.data, and each
#                              commit-latency phase, into
#                              PERF_DIR/lat.PREFIXFORMAT.WHEN.AGGREGATORS.data (perf report
#                              --sort comm,dso,sym -i FILE shows where the CPU went)
#  LOG_DIR                     when set, the aggregator's debug logs of every phase are copied there
#                              at the end (each batch's step times: "batch committed"), with the
#                              freeze phase's trials (freeze.txt) and tally-vmm's log
#  --kafka apache              also runs the end-to-end, ceiling and commit-latency phases, in the
#                              same run, against one real Apache Kafka node (scripts/kafka, same
#                              partitions, a database of their own), keyed apache_... (and
#                              apache_v2_... for a further format)
set -euo pipefail
source "$(dirname "$0")/../../scripts/lib.sh"
BUILD=${TALLY_BUILD:?run through scripts/bench}
BENCH=$BUILD/tests/bench/aggregator/bench-aggregator
AGG=${TALLY_AGGREGATOR:-$BUILD/aggregator/tally-aggregator}  # TALLY_AGGREGATOR: another build of it, to compare
SANDBOXES=${SANDBOXES:-10000}
SAMPLES=${SAMPLES:-100}
LAT_RATE=${LAT_RATE:-200000}
LAT_SANDBOXES=5000
LAT_AGGREGATORS=${LAT_AGGREGATORS:-2}
FORMATS=${FORMATS:-v1 v2}
# The development broker keeps 5 MiB per partition by default (librdkafka's mock cluster) and
# drops older messages: most of a 1,000,000-sample preload. Here it is told to keep 2 GiB (and
# 10,000,000 producer batches) per partition, its --keep-bytes-per-partition, through the
# environment (it logs the limits in force at start); the end-to-end phase checks nothing was dropped.
export TALLY_KEEP_BYTES_PER_PARTITION=${TALLY_KEEP_BYTES_PER_PARTITION:-2147483648}
export TALLY_KEEP_BATCHES_PER_PARTITION=${TALLY_KEEP_BATCHES_PER_PARTITION:-10000000}
PARTITIONS=${PARTITIONS:-4}
AGG_KAFKA=  # the aggregator's kafka_settings (Apache Kafka's SASL)
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
  [ -n "$AGG_PID" ] && kill $AGG_PID 2>/dev/null
  [ -z "${LOG_DIR:-}" ] || { mkdir -p "$LOG_DIR" && cp "$WORK"/agg.*.log "$LOG_DIR"/ 2>/dev/null; }
  [ -z "${LOG_DIR:-}" ] || cp "$WORK"/freeze.txt "$WORK"/vmm.log "$LOG_DIR"/ 2>/dev/null || true
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
# wait_committed polls through one psql session every 20 ms: a psql per poll
# started a backend (fork, authentication) each time, which counted in
# PostgreSQL's CPU per sample (about a third of it in the end-to-end phase).
wait_committed() { # N TIMEOUT_S
  local end=$(( EPOCHSECONDS + $2 )) got=0
  coproc POLL { "$PG_BIN/psql" -X -q -tA -v ON_ERROR_STOP=1 "$DB" 2>&1; }
  while :; do
    echo "SELECT coalesce(sum(next_offset), 0) FROM consumer_offsets WHERE group_id = 'tally-aggregator';" >&"${POLL[1]}"
    read -r got <&"${POLL[0]}" || got="(psql ended)"
    [[ "$got" =~ ^[0-9]+$ ]] || die "polling the committed offsets: $got"
    [ "$got" -lt "$1" ] || break
    [ "$EPOCHSECONDS" -lt "$end" ] || { kill "$POLL_PID"; die "the aggregator committed $got of $1 messages in $2 s"; }
    sleep 0.02
  done
  local pid=$POLL_PID
  exec {POLL[1]}>&-
  wait "$pid" 2>/dev/null || true
}
wait_log() { # FILE PATTERN TIMEOUT_S
  local end=$(( $(date +%s) + $3 ))
  until grep -q "$2" "$1" 2>/dev/null; do
    [ "$(date +%s)" -lt "$end" ] || die "no \"$2\" in $1 after $3 s: $(tail -3 "$1")"
    sleep 0.1
  done
}
# What the ledger billed the sandboxes named PREFIX-N: sandboxes, CPU ns, memory byte-ns.
billed() { psql -tAc "SELECT count(DISTINCT sandbox_id) || ' ' || coalesce(sum(cpu_ns), 0) || ' ' || coalesce(sum(mem_byte_ns), 0)
                        FROM usage_hourly WHERE sandbox_id LIKE '$1-%'"; }
# The usage topic's high watermarks (o0,o1,...), and their sum.
watermarks() { "$BENCH" watermarks "$BROKERS"; }
offsets_sum() { tr ',' '\n' <<<"$1" | awk '{ s += $1 } END { print s + 0 }'; }

# CPU seconds x 100 (user + system) of a process, and of every process of this PostgreSQL
# (the postmaster's own with its reaped children's: a backend that ended counts too).
cpu_of() { awk '{ print $14 + $15 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
pg_cpu() {
  local pm c t
  pm=$(head -1 "$WORK/pg/data/postmaster.pid")
  t=$(awk '{ print $14 + $15 + $16 + $17 }' "/proc/$pm/stat")
  for c in $(pgrep -P "$pm"); do t=$(( t + $(cpu_of "$c") )); done
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
# The batches' debug lines of a log: "batches messages usage_rows sandboxes commit_ms_total commit_ms_longest".
batch_sums() {
  grep 'msg="batch committed"' "$1" |
    sed 's/.* messages=\([0-9]*\) .*usage_rows=\([0-9]*\) sandboxes=\([0-9]*\) .* ms=\([0-9]*\) fold_ms.*/\1 \2 \3 \4/' |
    awk '$1 > 0 { n++; m += $1; u += $2; s += $3; t += $4; if ($4 > mx) mx = $4 } END { printf "%d %d %d %d %d %d\n", n, m, u, s, t, mx }'
}

# produce FORMAT RATE PREFIX SANDBOXES [CREATED]: SANDBOXES x SAMPLES samples of sandboxes
# PREFIX-N in FORMAT, RATE a second (0: flat out); CREATED (bench-aggregator's --created): each
# sandbox's created event just before its first sample (with, the default), the created events
# alone (only), the samples alone (none).
produce() {
  case "$1" in
    v1|v2) "$BENCH" produce --format "$1" --created "${5:-with}" "$BROKERS" "$4" "$SAMPLES" "$2" "$3" >&2 ;;
    *) die "no producer for format $1" ;;
  esac
}

say "fold stage alone"
FOLD=$("$BENCH" fold 20000000 | sed -n 's/^fold_samples_per_s_per_core=//p')

# PostgreSQL's COPY of 1,000,000 usage_hourly-shaped rows, one transaction, into a table with
# its primary key: the rate PostgreSQL takes rows at all (COPY_RATE rows/s, COPY_NS CPU ns a row).
copy_ceiling() {
  local n=1000000 t0 t1 p0
  # (sandbox i mod SANDBOXES, hour i / SANDBOXES from 2026-01-01: the rows are distinct (sandbox, hour))
  awk -v n=$n -v sb="$SANDBOXES" 'BEGIN { for (i = 0; i < n; i++) { h = int(i / sb)
    printf "copy-sb-%d\t2026-%02d-%02d %02d:00:00+00\tbench-acct-%d\tbench-key-%d\t700000000\t4294967296000000000\t0\t1073741824\n",
      i % sb, int(h / 672) + 1, int(h / 24) % 28 + 1, h % 24, i % 97, i % 97 } }' \
    >"$WORK/copy.tsv"
  psql -c "DROP TABLE IF EXISTS bench_copy" -c "CREATE TABLE bench_copy (sandbox_id text, hour timestamptz,
             account_id text, key_id text, cpu_ns bigint, mem_byte_ns numeric, storage_byte_ns numeric,
             mem_peak_bytes bigint, PRIMARY KEY (sandbox_id, hour))"
  p0=$(pg_cpu); t0=$(date +%s%N)
  psql -c "\\copy bench_copy FROM '$WORK/copy.tsv'"
  t1=$(date +%s%N)
  COPY_NS=$(( ($(pg_cpu) - p0) * 10000000 / n ))
  COPY_RATE=$(( n * 1000000000 / (t1 - t0) ))
  psql -c "DROP TABLE bench_copy"
  rm -f "$WORK/copy.tsv"
  say "PostgreSQL COPY: $COPY_RATE rows/s, $COPY_NS ns of its CPU a row"
}

# perf_start FILE: `perf record -g` of the aggregator (AGG_PID) and PostgreSQL's backends into FILE, in
# the background; prints its pid, for perf_stop (a child of the subshell that printed it, not waitable).
perf_start() {
  mkdir -p "$(dirname "$1")"
  perf record -q -F 499 -g -o "$1" \
    -p "$(echo $AGG_PID $(pgrep -P "$(head -1 "$WORK/pg/data/postmaster.pid")") | tr ' ' ',')" >/dev/null 2>&1 &
  echo $!
}
perf_stop() { # PID (none: nothing) — ends the recording and waits for its file to be written
  [ -n "$1" ] || return 0
  kill -INT "$1" 2>/dev/null || true
  while kill -0 "$1" 2>/dev/null; do sleep 0.1; done
}

# run_aggregator LOG: one more tally-aggregator in the group (debug log into LOG); its pid added to
# AGG_PID (a list: `kill $AGG_PID` and `wait $AGG_PID` take them all).
run_aggregator() {
  : >"$1"
  "$AGG" --database-url "$(pg_role_url "$DB" tally_aggregator)" --kafka-brokers "$BROKERS" ${AGG_KAFKA:+--kafka-settings "$AGG_KAFKA"} --log-level debug 2>"$1" &
  AGG_PID="${AGG_PID:+$AGG_PID }$!"
}
stop_aggregators() { [ -z "$AGG_PID" ] || { kill -TERM $AGG_PID; wait $AGG_PID || true; }; AGG_PID=; }

# wait_assigned TIMEOUT_S LOG...: until the group has settled: the aggregator of every LOG holds a
# partition, and together they hold all PARTITIONS (a log's assigned less its released).
wait_assigned() {
  local end=$(( $(date +%s) + $1 )) f held total owners
  shift
  while :; do
    total=0 owners=0
    for f in "$@"; do
      held=$(( $(grep -c 'msg="partition assigned"' "$f" || true) - $(grep -c 'msg="partition released"' "$f" || true) ))
      total=$(( total + held ))
      [ "$held" -le 0 ] || owners=$(( owners + 1 ))
    done
    [ "$owners" != $# ] || [ "$total" != "$PARTITIONS" ] || return 0
    [ "$(date +%s)" -lt "$end" ] || die "the group did not settle in $1 s: $owners of $# aggregators hold $total of $PARTITIONS partitions"
    sleep 0.1
  done
}

# lag_quantiles LOG...: "P50 P99" of the commit lag (ms) of every sample the aggregators of LOG
# committed: their histograms (each logs its own at exit, "commit lag histogram") merged, with
# the aggregator's own rule for a quantile (the first 1 ms bucket at or past ceil(total x q)).
lag_quantiles() {
  grep -h 'msg="commit lag histogram"' "$@" | sed 's/.*ms_samples="\([^"]*\)".*/\1/' | tr ' ' '\n' |
    awk -F: 'NF == 2 { n[$1] += $2; t += $2; if ($1 + 0 > mx) mx = $1 + 0 }
      END {
        if (!t) { print "-1 -1"; exit }
        w50 = int((t * 50 + 99) / 100); w99 = int((t * 99 + 99) / 100); c = 0; p50 = -1
        for (i = 0; i <= mx; i++) { c += n[i]; if (p50 < 0 && c >= w50) p50 = i; if (c >= w99) { print p50, i; exit } }
      }'
}

# latency FORMAT PFX LABEL PREFIX WHEN [AGGREGATORS]: the commit latency of LAT_SANDBOXES x SAMPLES
# samples offered at a steady LAT_RATE a second, of 5,000 sandboxes the ledger has never seen
# (PREFIX-N): every sample is new usage to fold, rate and write, none a duplicate of the end-to-end
# phase's. WHEN: the sandboxes' created events with their first samples, in the same round (with),
# or produced and committed before the samples start, as a vmm announces a sandbox a collector's
# tick or more before its first sample (ahead; the aggregators are started again for the samples,
# so their histograms hold samples only). AGGREGATORS (1): how many tally-aggregators share the
# partitions, each with its own connection to PostgreSQL. Sets LAT_P50, LAT_P99 (the aggregators'
# own histograms at exit, merged), LAT_ROWS, LAT_BATCHES.
latency() {
  local fmt=$1 pfx=$2 label=$3 prefix=$4 when=$5 aggs=${6:-1} before w k logs=()
  local name="agg.lat.$pfx$fmt.$when$([ "$aggs" = 1 ] || echo ".${aggs}aggregators")"
  say "[$label] commit latency at a steady $LAT_RATE samples/s offered, on fresh samples, created events $when, $aggs aggregator(s)"
  before=$(billed "$prefix")
  [ "$before" = "0 0 0" ] || die "the latency phase's sandboxes were billed before it: $before"
  if [ "$when" = ahead ]; then
    run_aggregator "$WORK/$name.announce.log"
    produce "$fmt" 0 "$prefix" "$LAT_SANDBOXES" only
    w=$(watermarks)
    wait_committed "$(offsets_sum "$w")" 300
    stop_aggregators
  fi
  for k in $(seq 1 "$aggs"); do
    logs+=("$WORK/$name$([ "$aggs" = 1 ] || echo ".$k").log")
    run_aggregator "${logs[-1]}"
  done
  wait_assigned 60 "${logs[@]}"
  sleep 1
  local perf_pid=
  [ -z "${PERF_DIR:-}" ] || perf_pid=$(perf_start "$PERF_DIR/lat.$pfx$fmt.$when.${aggs}.data")
  produce "$fmt" "$LAT_RATE" "$prefix" "$LAT_SANDBOXES" "$([ "$when" = ahead ] && echo none || echo with)"
  w=$(watermarks)
  wait_committed "$(offsets_sum "$w")" 300
  perf_stop "$perf_pid"
  stop_aggregators
  local got want
  got=$(billed "$prefix")
  want=$(want_billed "$LAT_SANDBOXES")
  say "[$label] latency phase billed (sandboxes cpu_ns mem_byte_ns): $got (want $want)"
  [ "$got" = "$want" ] || die "the latency phase's samples were not all billed: $got, want $want"
  LAT_ROWS=$(psql -tAc "SELECT count(*) FROM usage_hourly WHERE sandbox_id LIKE '$prefix-%'")
  local ln lm lu lsb lt lmx
  read -r ln lm lu lsb lt lmx <<<"$(cat "${logs[@]}" | batch_sums /dev/stdin)"
  LAT_BATCHES="$ln batches, $(( lm / (ln ? ln : 1) )) messages each on average, $(( lt / (ln ? ln : 1) )) ms each on average, longest $lmx ms"
  say "[$label] latency phase: $LAT_BATCHES"
  read -r LAT_P50 LAT_P99 <<<"$(lag_quantiles "${logs[@]}")"
  if [ "$aggs" = 1 ]; then # the merge, checked against the aggregator's own figures
    local own
    own=$(sed -n 's/.*msg="aggregator stopped".*commit_lag_ms_p50=\([0-9-]*\) commit_lag_ms_p99=\([0-9-]*\).*/\1 \2/p' "${logs[0]}")
    [ "$own" = "$LAT_P50 $LAT_P99" ] || die "the merged commit lag histogram says $LAT_P50 $LAT_P99, the aggregator $own"
  fi
}

# The end-to-end, ceiling and commit-latency phases of FORMAT against BROKERS, billing into DB.
# Sets the figures below (F_*), the printed lines (LINES) and the JSON fields (JSON) with PFX.
LINES=""
JSON=""
line() { LINES+=$(printf '%-34s %14s   %s' "$1" "$2" "$3")$'\n'; }
phases() { # FORMAT PFX (key prefix) LABEL
  local fmt=$1 pfx=$2 label=$3 w0 w1 w2
  TOTAL=$((SANDBOXES * SAMPLES))
  say "[$label] preloading $TOTAL samples ($SANDBOXES sandboxes x $SAMPLES, format $fmt)"
  w0=$(watermarks)
  produce "$fmt" 0 "bench-sb-$fmt" "$SANDBOXES"
  w1=$(watermarks)
  local messages=$(( $(offsets_sum "$w1") - $(offsets_sum "$w0") ))

  say "[$label] the ceiling: a consumer that discards what it reads"
  local c cons_ms cons_cpu
  c=$("$BENCH" consume "$BROKERS" "$w0" "$w1")
  cons_ms=$(sed -n 's/.*consume_ms=\([0-9]*\).*/\1/p' <<<"$c")
  cons_cpu=$(sed -n 's/.*consume_cpu_ms=\([0-9]*\).*/\1/p' <<<"$c")
  local cons_msg_s=$(( messages * 1000 / (cons_ms ? cons_ms : 1) )) cons_smp_s=$(( TOTAL * 1000 / (cons_ms ? cons_ms : 1) ))
  local cons_ns=$(( cons_cpu * 1000000 / TOTAL ))
  say "[$label] consume only: $messages messages in $cons_ms ms: $cons_msg_s messages/s, $cons_smp_s samples/s, $cons_ns ns of CPU a sample"

  say "[$label] end to end: broker -> fold -> exactly-once commits"
  local load pg0 br0 t0 t1
  load=$(load1)
  pg0=$(pg_cpu) br0=$(broker_cpu)
  t0=$(date +%s%N)
  "$AGG" --database-url "$(pg_role_url "$DB" tally_aggregator)" --kafka-brokers "$BROKERS" ${AGG_KAFKA:+--kafka-settings "$AGG_KAFKA"} --log-level debug 2>"$WORK/agg.e2e.$pfx$fmt.log" &
  AGG_PID=$!
  local perf_pid=
  if [ -n "${PERF_DIR:-}" ]; then
    wait_log "$WORK/agg.e2e.$pfx$fmt.log" "partition assigned" 60
    perf_pid=$(perf_start "$PERF_DIR/e2e.$pfx$fmt.data")
  fi
  wait_committed "$(offsets_sum "$w1")" 600
  t1=$(date +%s%N)
  perf_stop "$perf_pid"
  local cpu_agg cpu_pg cpu_br
  cpu_agg=$(cpu_of $AGG_PID) cpu_pg=$(( $(pg_cpu) - pg0 )) cpu_br=$(( $(broker_cpu) - br0 ))
  kill -TERM $AGG_PID; wait $AGG_PID || true; AGG_PID=
  load="$load..$(load1)"
  local cpu_json="$(ns_per_sample $cpu_agg), $(ns_per_sample $cpu_pg), $(ns_per_sample $cpu_br)"
  say "[$label] end to end: CPU per sample (ns): aggregator $(ns_per_sample $cpu_agg), PostgreSQL $(ns_per_sample $cpu_pg)," \
      "broker $(ns_per_sample $cpu_br); load average $load over $(( (t1 - t0) / 1000000 )) ms"
  local bs nb bm bu bsb bt
  read -r nb bm bu bsb bt _ <<<"$(batch_sums "$WORK/agg.e2e.$pfx$fmt.log")"
  local rows_per_ksample=$(( (bu + bsb) * 1000 / TOTAL ))
  local batches="$nb batches, $(( bm / (nb ? nb : 1) )) messages each on average, $bt ms of commits in all, $bu usage rows and $bsb fold state rows ($rows_per_ksample per 1,000 samples)"
  say "[$label] end to end: $batches"
  # Updates PostgreSQL made in place (HOT: no index entry written) of all it made, per table.
  say "[$label] end to end: HOT updates of all updates: $(psql -tAc "SELECT string_agg(t || ' ' || h || '/' || u, ', ')
        FROM (SELECT CASE WHEN relname LIKE 'usage_hourly%' THEN 'usage_hourly' ELSE relname END AS t,
                     sum(n_tup_hot_upd) AS h, sum(n_tup_upd) AS u FROM pg_stat_user_tables
               WHERE relname IN ('fold_state', 'spend_daily', 'sandboxes', 'consumer_offsets') OR relname LIKE 'usage_hourly%'
               GROUP BY 1 ORDER BY 1) x")"
  # Nothing dropped: no retention gap recorded, and (development broker) every partition still starts at 0.
  local gaps dropped=0
  gaps=$(psql -tAc "SELECT count(*) FROM offset_gaps")
  if [ "$BROKERS" = "$TALLY_TEST_BROKERS" ]; then
    dropped=$("$BUILD/broker/tally-broker" --control-socket "$TALLY_TEST_BROKER_CONTROL" ctl watermarks |
      tr ' ' '\n' | sed -n 's/^[0-9]*=\([0-9]*\)\.\..*/\1/p' | awk '{ s += $1 } END { print s + 0 }')
  fi
  # Throughput from the moment the aggregator holds its partitions (joining the
  # group takes ~3 s in the development broker; printed separately) to the last commit.
  local assigned ta join_ms e2e e2e_with_join
  assigned=$(sed -n 's/^ts=\([^ ]*\) .*partition assigned.*/\1/p' "$WORK/agg.e2e.$pfx$fmt.log" | head -1)
  ta=$(date -d "$assigned" +%s%N)
  join_ms=$(( (ta - t0) / 1000000 ))
  e2e=$(( TOTAL * 1000000000 / (t1 - ta) ))
  e2e_with_join=$(( TOTAL * 1000000000 / (t1 - t0) ))

  # Each sample's cpu_ns is k x 0.7 s and its wall time t0 + k s (k = 0..SAMPLES-1), running, 4 GiB:
  # a sandbox is billed (SAMPLES-1) x 0.7 CPU-s and 4 GiB x (SAMPLES-1) s, worked by hand here.
  want_billed() { # SANDBOXES
    echo "$1 $(( $1 * (SAMPLES - 1) * 700000000 )) $(psql -tAc "SELECT $1::numeric * 4 * 1073741824 * ($SAMPLES - 1) * 1000000000")"
  }
  local got want intervals note="" e2e_json=$e2e
  got=$(billed "bench-sb-$fmt")
  want=$(want_billed "$SANDBOXES")
  # Memory is billed for each interval between two samples the aggregator saw: a sample it never
  # got (dropped by the broker) leaves its interval to the next one, but samples lost from the
  # start of a sandbox's stream leave theirs unbilled. So memory tells how much was consumed.
  intervals=$(psql -tAc "SELECT coalesce(sum(mem_byte_ns), 0) / (4 * 1073741824::numeric * 1000000000) FROM usage_hourly WHERE sandbox_id LIKE 'bench-sb-$fmt-%'")
  intervals=${intervals%%.*}
  if [ "$gaps" != 0 ] || [ "$dropped" != 0 ]; then
    say "[$label] end to end: NOT ALL CONSUMED: $gaps retention gaps recorded, $dropped messages dropped by the broker"
    note="INVALID: the broker dropped $dropped messages ($gaps retention gaps recorded)"
    e2e_json=null
  elif [ "$got" != "$want" ]; then
    say "[$label] end to end: NOT ALL BILLED: (sandboxes cpu_ns mem_byte_ns) $got, want $want;"
    say "  memory for $intervals of $(( SANDBOXES * (SAMPLES - 1) )) sample intervals: the broker dropped the rest (PARTITIONS=$PARTITIONS)"
    note="INVALID: only $intervals of $(( SANDBOXES * (SAMPLES - 1) )) intervals billed; the broker dropped the rest"
    e2e_json=null
  else
    say "[$label] end to end: all billed: (sandboxes cpu_ns mem_byte_ns) $got"
  fi
  # PostgreSQL doing nothing but COPY the rows this phase wrote: samples/s it could take.
  local pg_only=$(( COPY_RATE * 1000 / (rows_per_ksample ? rows_per_ksample : 1) ))
  local ratio
  ratio=$(awk -v e="$e2e" -v c="$cons_smp_s" 'BEGIN { printf "%.3f", c ? e / c : 0 }')

  latency "$fmt" "$pfx" "$label" "bench-lat-$fmt" with
  local p50=$LAT_P50 p99=$LAT_P99 lat_rows=$LAT_ROWS lat_batches=$LAT_BATCHES
  latency "$fmt" "$pfx" "$label" "bench-lat-ahead-$fmt" ahead
  local a50=$LAT_P50 a99=$LAT_P99 a_batches=$LAT_BATCHES
  local n=$LAT_AGGREGATORS
  latency "$fmt" "$pfx" "$label" "bench-lat$n-$fmt" with "$n"
  local m50=$LAT_P50 m99=$LAT_P99 m_batches=$LAT_BATCHES
  latency "$fmt" "$pfx" "$label" "bench-lat$n-ahead-$fmt" ahead "$n"
  local ma50=$LAT_P50 ma99=$LAT_P99 ma_batches=$LAT_BATCHES
  say "[$label] e2e $e2e samples/s ($e2e_with_join with the join), $ratio of consume only; commit latency p50/p99 $p50/$p99 ms (created events ahead: $a50/$a99 ms; $n aggregators: $m50/$m99 ms, ahead $ma50/$ma99 ms)"

  line "[$label] e2e samples/s" "$e2e" ">= 1000000 (development broker), >= 500000 (Apache Kafka); quoted baseline, not measured here: a billing engine's published 10000 events/s"
  [ -z "$note" ] || line "  e2e samples/s is" "" "$note"
  line "  (with the ${join_ms} ms group join)" "$e2e_with_join" ""
  line "  e2e CPU ns/sample" "" "aggregator, PostgreSQL, broker: $cpu_json (load average $load; $batches)"
  line "  consume only: messages/s" "$cons_msg_s" "the ceiling: a consumer that discards ($messages messages, $cons_ns ns of its CPU a sample)"
  line "  consume only: samples/s" "$cons_smp_s" ""
  line "  e2e / consume only" "$ratio" ""
  line "  PostgreSQL COPY alone: samples/s" "$pg_only" "COPY at $COPY_RATE rows/s of the $rows_per_ksample rows per 1,000 samples e2e wrote"
  line "  commit latency p50 (ms)" "$p50" "at $LAT_RATE samples/s offered (fresh samples: $LAT_SANDBOXES new sandboxes, $lat_rows usage_hourly rows; $lat_batches)"
  line "  commit latency p99 (ms)" "$p99" "<= 250"
  line "  created ahead: p50 (ms)" "$a50" "the same with the sandboxes' created events committed before their samples start ($a_batches)"
  line "  created ahead: p99 (ms)" "$a99" "<= 250"
  line "  $n aggregators: p50 (ms)" "$m50" "the first two with $n aggregators sharing the partitions, one PostgreSQL connection each ($m_batches)"
  line "  $n aggregators: p99 (ms)" "$m99" "<= 250"
  line "  $n, created ahead: p50 (ms)" "$ma50" "($ma_batches)"
  line "  $n, created ahead: p99 (ms)" "$ma99" "<= 250"
  JSON+=$(printf ', "%se2e_samples_per_s": %s, "%se2e_samples_per_s_with_join": %s, "%se2e_cpu_ns_per_sample_aggregator_postgres_broker": [%s], "%se2e_load_average_1m": "%s", "%se2e_rows_per_1000_samples": %s, "%sconsume_only_messages_per_s": %s, "%sconsume_only_samples_per_s": %s, "%sconsume_only_cpu_ns_per_sample": %s, "%se2e_of_consume_only": %s, "%scopy_only_samples_per_s": %s, "%scommit_latency_offered_samples_per_s": %s, "%scommit_latency_ms_p50": %s, "%scommit_latency_ms_p99": %s, "%scommit_latency_usage_rows": %s, "%scommit_latency_created_ahead_ms_p50": %s, "%scommit_latency_created_ahead_ms_p99": %s, "%scommit_latency_%s_aggregators_ms_p50": %s, "%scommit_latency_%s_aggregators_ms_p99": %s, "%scommit_latency_created_ahead_%s_aggregators_ms_p50": %s, "%scommit_latency_created_ahead_%s_aggregators_ms_p99": %s' \
    "$pfx" "$e2e_json" "$pfx" "$e2e_with_join" "$pfx" "$cpu_json" "$pfx" "$load" "$pfx" "$rows_per_ksample" \
    "$pfx" "$cons_msg_s" "$pfx" "$cons_smp_s" "$pfx" "$cons_ns" "$pfx" "$ratio" "$pfx" "$pg_only" \
    "$pfx" "$LAT_RATE" "$pfx" "$p50" "$pfx" "$p99" "$pfx" "$lat_rows" "$pfx" "$a50" "$pfx" "$a99" \
    "$pfx" "$n" "$m50" "$pfx" "$n" "$m99" "$pfx" "$n" "$ma50" "$pfx" "$n" "$ma99")
}

# Every format on one broker: the first format's keys carry PFX alone, a further one's PFX + its name.
all_formats() { # PFX LABEL
  local f first=1
  copy_ceiling
  JSON+=$(printf ', "%scopy_rows_per_s": %s, "%scopy_cpu_ns_per_row": %s' "$1" "$COPY_RATE" "$1" "$COPY_NS")
  line "[$2] PostgreSQL COPY rows/s" "$COPY_RATE" "the ceiling: 1,000,000 usage rows, one transaction ($COPY_NS ns of its CPU a row)"
  for f in $FORMATS; do
    if [ $first = 1 ]; then phases "$f" "$1" "$2 $f"; else phases "$f" "$1${f}_" "$2 $f"; fi
    first=0
  done
}

BROKERS=$TALLY_TEST_BROKERS
all_formats "" "development broker"

if [ "$KAFKA" = apache ]; then
  say "the same phases against Apache Kafka $(kafka_version), one node, $PARTITIONS partitions"
  kafka_start "$WORK/kafka" 1 "$PARTITIONS" 1209600000 "${TALLY_KAFKA_HEAP:-1g}" >/dev/null
  BROKERS=$(cat "$WORK/kafka/bootstrap")
  # Its listeners want SASL: the bench's own clients as admin, the aggregator as its principal.
  export BENCH_KAFKA_SETTINGS BENCH_KAFKA_PASSWORD TALLY_KAFKA_SASL_PASSWORD
  BENCH_KAFKA_SETTINGS=$(kafka_client_settings "$WORK/kafka" admin)
  BENCH_KAFKA_PASSWORD=$(kafka_password "$(kafka_credentials "$WORK/kafka")" admin)
  AGG_KAFKA=$(kafka_client_settings "$WORK/kafka" aggregator)
  TALLY_KAFKA_SASL_PASSWORD=$(kafka_password "$(kafka_credentials "$WORK/kafka")" aggregator)
  psql -c "CREATE DATABASE tally_apache OWNER tally_owner"
  DEV_DB=$DB
  DB="${TALLY_TEST_PG_URL%/*}/tally_apache"
  "$BUILD/ledger/tally-migrate" --database-url "$(pg_role_url "$DB" tally_owner)" --log-level warn
  JSON+=$(printf ', "apache_kafka_version": "%s"' "$(kafka_version)")
  all_formats "apache_" "Apache Kafka $(kafka_version)"
  DB=$DEV_DB
  BROKERS=$TALLY_TEST_BROKERS
  unset BENCH_KAFKA_SETTINGS BENCH_KAFKA_PASSWORD TALLY_KAFKA_SASL_PASSWORD
  AGG_KAFKA=
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
"$TALLY_BUILD/vmm/tally-vmm" --state-dir "$WORK/vmm" --host-id bench-host --kafka-brokers "$TALLY_TEST_BROKERS" --backend process \
  --cgroup-parent "$VMM_PARENT" --final-wait-ms 200 2>"$WORK/vmm.log" &
VMM_PID=$!
SOCK_END=$(( $(date +%s) + 30 ))
until [ -S "$WORK/vmm/vmm.sock" ]; do
  kill -0 $VMM_PID || die "tally-vmm exited: $(tail -3 "$WORK/vmm.log")"
  [ "$(date +%s)" -lt "$SOCK_END" ] || die "tally-vmm opened no socket in 30 s: $(tail -3 "$WORK/vmm.log")"
  sleep 0.1
done
wait_log "$WORK/vmm.log" "control topic assigned" 30
# (A trial the load keeps from freezing within 30 s ends the phase: the figures of the trials before it stand.)
"$BENCH" freeze "$TALLY_TEST_BROKERS" "$TRIALS" "$TALLY_BUILD/vmm/tally-vmm" "$WORK/vmm" "$VMM_PARENT" >"$WORK/freeze.txt" ||
  say "freeze latency: a trial failed; $(grep -c freeze_ms "$WORK/freeze.txt") of $TRIALS measured"
kill -TERM $AGG_PID; wait $AGG_PID || true; AGG_PID=
sleep 0.5  # the last stopped sandbox's cgroup goes once its final counter is out
kill -TERM $VMM_PID; wait $VMM_PID || true; VMM_PID=
for h in /sys/fs/cgroup/*/"$VMM_PARENT"; do rmdir "$h"/*/ "$h" 2>/dev/null || true; done
sed -n 's/^freeze_ms=//p' "$WORK/freeze.txt" | sort -n >"$WORK/freeze.sorted"
N=$(wc -l <"$WORK/freeze.sorted")
F50=null F99=null
if [ "$N" -gt 0 ]; then
  F50=$(sed -n "$(( (N * 50 + 99) / 100 ))p" "$WORK/freeze.sorted")
  F99=$(sed -n "$(( (N * 99 + 99) / 100 ))p" "$WORK/freeze.sorted")
fi

printf '%-34s %14s   %s\n' "figure ($PARTITIONS partitions)" "measured" "goal / ceiling / quoted baseline"
printf '%s' "$LINES"
printf '%-34s %14s   %s\n' "fold samples/s per core" "$FOLD" "-"
printf '%-34s %14s   %s\n' "freeze latency p50 (ms, $N trials)" "$F50" "-"
printf '%-34s %14s   %s\n' "freeze latency p99 (ms)" "$F99" "<= 250"
printf '{"partitions": %s, "formats": "%s", "quoted_baseline_billing_engine_events_per_s": 10000, "fold_samples_per_s_per_core": %s, "commit_latency_fresh_sandboxes": %s, "freeze_latency_ms_p50": %s, "freeze_latency_ms_p99": %s, "load_average_1m_start_end": "%s..%s"%s}\n' \
  "$PARTITIONS" "$FORMATS" "$FOLD" "$LAT_SANDBOXES" "$F50" "$F99" "$LOAD_START" "$(load1)" "$JSON"
