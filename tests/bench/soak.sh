#!/usr/bin/env bash
# tests/bench/soak.sh — the whole pipeline for MINUTES (default 10): tally-vmm
# (process sandboxes), tally-collector, tally-aggregator, tally-api, the
# development broker and PostgreSQL, with SANDBOXES (default 200) sandboxes
# alive at once, CHURN (default 2) of them stopped and as many created every
# second, and API load (usage, spend and sandbox lists as the key, about
# API_RPS requests a second). Every SAMPLE_S seconds (default 1) each daemon's
# RSS, heap in use (mallinfo2, from tests/bench/soak/heapstat.c preloaded into
# it) and open descriptors are sampled; growth is judged on each minute's mean
# (below, "growth and noise"). Each stop reads the sandbox's truth from the kernel
# (its cgroup's CPU counter once its processes ended); at the end every
# sandbox is stopped, the pipeline drains, and the ledger's CPU per sandbox
# must equal that truth to the ns. The last line is JSON:
#   {"duration_s", "sandboxes_created", "errors", "rss_growth_kib": {daemon: KiB from
#    minute 2 to the last minute}, "rss_noise_kib": {...}, "rss_grows": {daemon: growth
#    beyond noise}, "heap_growth_kib", "heap_noise_kib", "heap_grows" (the same for
#    the heap in use), "fd_growth": {...}, "ledger_exact", "ledger_mismatches"}
# The daemons run without glibc's per-thread cache (GLIBC_TUNABLES
# glibc.malloc.tcache_count=0; SOAK_TCACHE=1 keeps it): mallinfo2 counts the
# chunks it holds as in use, so tally-api's heap rose 1,230 -> 1,344 KiB in 7
# minutes while the program's own heap was flat (valgrind's massif, API_WRAPPER
# below: 686,350 B at 37 s and at 484 s), and flat at 746 KiB without it.
# LEAK_KIB_PER_MIN (default 0) makes every daemon leak that much on purpose
# (heapstat.c): the judgement must then say "grows". API_WRAPPER (e.g.
# "valgrind --tool=massif --massif-out-file=/tmp/api.massif") is put before
# tally-api's command, to see where its heap goes.
#
# The verdict is the exit status: 0 only when the ledger is exact, nothing
# failed and no daemon grows (RSS or heap beyond its noise, or descriptors);
# 1 otherwise. A run shorter than MIN_MINUTES (6) cannot call a steady leak
# growth (below, "growth and noise") and is refused before it starts.
set -euo pipefail
source "$(dirname "$0")/../../scripts/lib.sh"
BUILD=${TALLY_BUILD:?run through scripts/bench}
MINUTES=${1:-10}
# A steady leak of r a minute grows (last - 2) x r = (MINUTES - 3) x r against a noise of at
# least 2 x r: only from 6 minutes on can it exceed it.
MIN_MINUTES=6
[[ "$MINUTES" =~ ^[0-9]+$ ]] && [ "$MINUTES" -ge "$MIN_MINUTES" ] ||
  die "a soak of ${MINUTES} minutes can call no steady leak growth: give at least $MIN_MINUTES"
SANDBOXES=${SANDBOXES:-200}
CHURN=${CHURN:-2}
API_RPS=${API_RPS:-10}
SAMPLE_S=${SAMPLE_S:-1}
LEAK_KIB_PER_MIN=${LEAK_KIB_PER_MIN:-0}
SOAK_TCACHE=${SOAK_TCACHE:-0}
TUNABLES=${GLIBC_TUNABLES:-}
[ "$SOAK_TCACHE" = 1 ] || TUNABLES=${TUNABLES:+$TUNABLES:}glibc.malloc.tcache_count=0
HEAPSTAT=$BUILD/tests/bench/soak/libtally-heapstat.so
[ -f "$HEAPSTAT" ] || die "no $HEAPSTAT in this build"
WORK=$(mktemp -d /tmp/tally-bench-soak.XXXXXX)
STATE=$WORK/state
SOCK=$STATE/vmm.sock
CG=tally-soak-$$
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  # Sandboxes outlive tally-vmm by design: a soak that ended early leaves its
  # sandboxes running unless their processes are killed here.
  for d in /sys/fs/cgroup/*/"$CG" /sys/fs/cgroup/"$CG"; do
    [ -d "$d" ] || continue
    find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u | xargs -r kill -KILL 2>/dev/null || true
  done
  sleep 0.5
  for d in /sys/fs/cgroup/*/"$CG" /sys/fs/cgroup/"$CG"; do
    [ -d "$d" ] || continue
    find "$d" -depth -type d -exec rmdir {} \; 2>/dev/null || true
  done
  stop_test_services "$WORK"
}
trap cleanup EXIT
start_test_services "$WORK" "$BUILD"
mkdir -p "$STATE"
DB="${TALLY_TEST_PG_URL%/*}/tally"
BROKERS=$TALLY_TEST_BROKERS
"$BUILD/ledger/tally-migrate" --database-url "$(pg_role_url "$DB" tally_owner)" --log-level warn
SECRET=tk_soak0123456789abcdef0123456789abcdef0123456789ab
"$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 "$DB" <<SQL
INSERT INTO accounts (id, name) VALUES ('soak', 'soak');
INSERT INTO api_keys (id, account_id, key_hash) VALUES ('soak_key', 'soak', sha256('$SECRET'::bytea));
SQL

declare -A DPID
start_daemon() { # NAME ARGS...: started with heapstat.c preloaded, writing its heap in use to WORK/NAME.heap
  local name=$1; shift
  GLIBC_TUNABLES=$TUNABLES LD_PRELOAD=$HEAPSTAT TALLY_HEAPSTAT_FILE=$WORK/$name.heap \
    TALLY_HEAPSTAT_LEAK_KIB_PER_MIN=$LEAK_KIB_PER_MIN "$@" >>"$WORK/$name.log" 2>&1 &
  DPID[$name]=$!
  PIDS+=($!)
}
start_daemon vmm "$BUILD/vmm/tally-vmm" --state-dir "$STATE" --kafka-brokers "$BROKERS" --cgroup-parent "$CG" \
  --backend process --limits-database-url "$(pg_role_url "$DB" tally_vmm)" --timeout-max-s 86400 --log-level warn \
  --vcpu-overcommit-percent 10000
start_daemon collector "$BUILD/collector/tally-collector" --state-dir "$STATE" --kafka-brokers "$BROKERS" \
  --tick-ms 1000 --metrics-port 0 --log-level warn
start_daemon aggregator "$BUILD/aggregator/tally-aggregator" --database-url "$(pg_role_url "$DB" tally_aggregator)" --kafka-brokers "$BROKERS" \
  --log-level warn
start_daemon api ${API_WRAPPER:-} "$BUILD/api/tally-api" --database-url "$(pg_role_url "$DB" tally_api)" --port 0 --vmm-sockets "$SOCK" --rate-per-s 1000000 \
  --rate-burst 1000000 --cookie-secure=false --log-level warn
for _ in $(seq 200); do [ -S "$SOCK" ] && break; sleep 0.1; done
[ -S "$SOCK" ] || die "tally-vmm opened no socket: $(tail -3 "$WORK/vmm.log")"
PORT=
for _ in $(seq 100); do
  PORT=$(ss -Hltnp 2>/dev/null | awk -v pid="pid=${DPID[api]}," 'index($0, pid) { n = split($4, a, ":"); print a[n]; exit }')
  [ -n "$PORT" ] && break
  sleep 0.1
done
[ -n "$PORT" ] || die "tally-api opened no port: $(tail -3 "$WORK/api.log")"

ERRORS=0
err() { ERRORS=$((ERRORS + 1)); say "error: $*"; }
vmm_api() { # METHOD PATH [BODY] -> body on stdout, code in $WORK/code
  curl -s --unix-socket "$SOCK" -X "$1" -H 'Content-Type: application/json' ${3:+--data "$3"} \
    -o "$WORK/out.json" -w '%{http_code}' "http://localhost$2" >"$WORK/code" || echo 000 >"$WORK/code"
  cat "$WORK/out.json" 2>/dev/null || true
}

declare -A CPU_DIR          # live sandbox -> its CPU cgroup folder
LIVE=()
CREATED=0
: >"$WORK/truth"            # "id cpu_ns" of every stopped sandbox
# small disks: admission counts each disk_mib against the free space (SANDBOXES x 1 GiB would not fit)
BODY='{"account": "soak", "key": "soak_key", "vcpus": 1, "memory_mib": 64, "disk_mib": 16, "timeout_s": 86400, "command": ["sh", "-c", "while :; do i=0; while [ $i -lt 200 ]; do i=$((i+1)); done; sleep 2; done"]}'
create() {
  local out id dir
  out=$(vmm_api POST /v1/sandboxes "$BODY")
  if [ "$(cat "$WORK/code")" != 201 ]; then err "create: HTTP $(cat "$WORK/code") $(head -c 200 <<<"$out")"; return; fi
  id=$(jq -r .id <<<"$out"); dir=$(jq -r .cgroup_cpu <<<"$out")
  mkdir "$dir/tally-soak-hold" || { err "could not hold $dir"; return; }
  CPU_DIR[$id]=$dir
  LIVE+=("$id")
  CREATED=$((CREATED + 1))
}
cpu_of() { # DIR -> the kernel's counter, ns
  if [ -f "$1/cpuacct.usage" ]; then cat "$1/cpuacct.usage"
  else awk '$1 == "usage_usec" { print $2 * 1000 }' "$1/cpu.stat"; fi
}
stop() { # ID: stops it and reads its truth
  local id=$1 dir=${CPU_DIR[$1]} a b i
  vmm_api POST "/v1/sandboxes/$id/stop" '{}' >/dev/null
  [ "$(cat "$WORK/code")" = 200 ] || { err "stop $id: HTTP $(cat "$WORK/code")"; return; }
  # cgroup files report no size: read them.
  for i in $(seq 500); do [ -n "$(cat "$dir/cgroup.procs")" ] || break; sleep 0.01; done
  if [ -n "$(cat "$dir/cgroup.procs")" ]; then err "$id: processes left 5 s after its stop"; return; fi
  a=$(cpu_of "$dir")
  for i in $(seq 30); do sleep 0.1; b=$(cpu_of "$dir"); [ "$a" = "$b" ] && break; a=$b; done
  echo "$id $b" >>"$WORK/truth"
  rmdir "$dir/tally-soak-hold" || err "could not remove the hold of $id"
  unset "CPU_DIR[$id]"
}

# API load in the background: the key's reads, about API_RPS a second.
api_load() {
  local n=0 code path
  while :; do
    case $((n % 3)) in
      0) path=/v1/spend ;; 1) path="/v1/usage?from=$USAGE_FROM&to=$USAGE_TO&granularity=hour" ;; 2) path=/v1/sandboxes ;;
    esac
    code=$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $SECRET" "http://127.0.0.1:$PORT$path" || echo 000)
    [ "$code" = 200 ] || echo "$path $code" >>"$WORK/api_errors"
    n=$((n + 1))
    sleep "$(awk -v r="$API_RPS" 'BEGIN { printf "%.3f", 1 / r }')"
  done
}
USAGE_FROM=$(date -u -d "today" +%Y-%m-%dT00:00:00Z)
USAGE_TO=$(date -u -d "tomorrow" +%Y-%m-%dT00:00:00Z)
: >"$WORK/api_errors"
api_load &
PIDS+=($!)
LOAD_PID=$!

sample() { # SECONDS since the start: RSS (KiB), fds and heap in use (KiB) of every daemon
  local d heap
  for d in vmm collector aggregator api; do
    if ! kill -0 "${DPID[$d]}" 2>/dev/null; then err "$d exited: $(tail -2 "$WORK/$d.log")"; continue; fi
    heap=$(cat "$WORK/$d.heap" 2>/dev/null) || { err "$d wrote no heap figure"; continue; }
    echo "$1 $d $(awk '/^VmRSS:/ { print $2 }' "/proc/${DPID[$d]}/status") $(ls "/proc/${DPID[$d]}/fd" | wc -l) $heap"
  done >>"$WORK/samples"
}

say "soak: $SANDBOXES sandboxes, $CHURN stopped and created a second, API load ~$API_RPS/s, $MINUTES min"
for _ in $(seq "$SANDBOXES"); do create; done
say "soak: $CREATED sandboxes up"
T0=$(date +%s)
END=$((T0 + MINUTES * 60))
: >"$WORK/samples"
sample 0
next=$((T0 + SAMPLE_S)); next_minute=$((T0 + 60)); minute=1
while [ "$(date +%s)" -lt "$END" ]; do
  for _ in $(seq "$CHURN"); do
    [ ${#LIVE[@]} -gt 0 ] || break
    k=$((RANDOM % ${#LIVE[@]}))
    stop "${LIVE[$k]}"
    LIVE=("${LIVE[@]:0:$k}" "${LIVE[@]:$((k + 1))}")
    create
  done
  now=$(date +%s)
  if [ "$now" -ge "$next" ] && [ "$now" -lt "$END" ]; then
    sample $((now - T0))
    next=$((next + SAMPLE_S))
  fi
  if [ "$now" -ge "$next_minute" ] && [ "$now" -lt "$END" ]; then
    say "soak: minute $minute, $CREATED created, $ERRORS errors, $(tail -4 "$WORK/samples" | awk '{ printf "%s rss=%sKiB heap=%sKiB fds=%s  ", $2, $3, $5, $4 }')"
    minute=$((minute + 1)); next_minute=$((next_minute + 60))
  fi
  sleep 1
done
DURATION=$(( $(date +%s) - T0 ))
kill "$LOAD_PID" 2>/dev/null || true

say "soak: stopping the $((${#LIVE[@]})) sandboxes left, then waiting for the ledger"
for id in "${LIVE[@]}"; do stop "$id"; done
API_ERRORS=$(wc -l <"$WORK/api_errors")
[ "$API_ERRORS" = 0 ] || { ERRORS=$((ERRORS + API_ERRORS)); say "API errors: $(sort "$WORK/api_errors" | uniq -c | head -5)"; }

# The ledger: every sandbox's CPU billed equals its truth (waits up to 120 s for the drain).
mismatches=-1
[ -s "$WORK/truth" ] || die "no sandbox was stopped with its truth read"
for _ in $(seq 120); do
  mismatches=$(awk '{ printf "(%s, %s),", "'"'"'" $1 "'"'"'", $2 }' "$WORK/truth" | sed 's/,$//' |
    { read -r values; "$PG_BIN/psql" -X -tA "$DB" -c "SELECT count(*) FROM (VALUES $values) AS t(id, ns)
        LEFT JOIN (SELECT sandbox_id, sum(cpu_ns) AS billed FROM usage_hourly GROUP BY 1) u ON u.sandbox_id = t.id
        WHERE u.billed IS DISTINCT FROM t.ns::bigint"; })
  [ "$mismatches" = 0 ] && break
  sleep 1
done
TRUTHS=$(wc -l <"$WORK/truth")
LEDGER_EXACT=false
[ "$mismatches" = 0 ] && [ "$TRUTHS" = "$CREATED" ] && LEDGER_EXACT=true
[ "$TRUTHS" = "$CREATED" ] || err "truth read for $TRUTHS of $CREATED sandboxes"

# Growth and noise. One sample says little: a daemon's RSS moves within
# seconds (tally-api's by ~3 MB between heap trims, docs/testing.md), so each
# minute is summed up by the mean of its samples (RSS and heap; of
# descriptors, the median). The mean, not the median: sampled every 5 s
# against trims every 10 s, tally-api's RSS alternates between two levels ~2 MB
# apart, and the median of such a minute jumps between them. Growth: the last
# full minute's figure minus minute 2's (a run of under 4 minutes counts from
# minute 0; minutes 0 and 1 hold the start-up). Noise: twice the largest
# change from one minute to the next in between. A steady leak of r a minute
# grows (last - 2) * r against a noise of 2 * (r + the minutes' own jitter);
# a one-off step (a cache filling once) or two are not called growth. The
# noise was once the largest change itself: three 10-minute runs each called
# one daemon growing, a different one each time, with no trend in its samples
# (docs/testing.md). Noise is at least NOISE_FLOOR_KIB (16, four pages): a
# collector's heap rose 2,196 -> 2,198 -> 2,199 -> 2,199 KiB, a warm-up 10
# minutes cannot tell from a leak that small. Samples every second, not every
# 5: each minute's mean then spans 6 of the 10 s trim cycles, not a few phases
# of them. LEAK_KIB_PER_MIN shows what the rule calls.
NOISE_FLOOR_KIB=${NOISE_FLOOR_KIB:-16}
LAST=$((MINUTES - 1))
BASE=$([ "$MINUTES" -ge 4 ] && echo 2 || echo 0)
minutes() { # COLUMN (3 rss, 4 fds, 5 heap) STAT (mean or median) -> lines "daemon growth noise grows minute"
  awk -v c="$1" -v last="$LAST" '{ m = int($1 / 60); if (m > last) m = last; print $2, m, $c }' "$WORK/samples" |
    sort -k1,1 -k2,2n -k3,3n |
    awk -v base="$BASE" -v last="$LAST" -v stat="$2" -v floor="$NOISE_FLOOR_KIB" '
      function flush() {
        if (n) { fig[d, m] = stat == "mean" ? int(sum / n + 0.5) : n % 2 ? v[(n + 1) / 2] : int((v[n / 2] + v[n / 2 + 1]) / 2); seen[d] = 1 }
        n = 0; sum = 0
      }
      $1 != d || $2 != m { flush(); d = $1; m = $2 }
      { v[++n] = $3; sum += $3 }
      END {
        flush()
        for (x in seen) {
          z = 0; at = base
          for (k = base + 1; k <= last; k++) { dd = fig[x, k] - fig[x, k - 1]; if (dd < 0) dd = -dd; if (dd > z) { z = dd; at = k } }
          g = fig[x, last] - fig[x, base]; z = 2 * z < floor ? floor : 2 * z
          print x, g, z, (g > z ? "true" : "false"), at
        }
      }' | sort
}
json_of() { # FIELD (2 growth, 3 noise, 4 grows) <lines -> {"vmm": n, ...}
  awk -v f="$1" '{ s = s sprintf("%s\"%s\": %s", s == "" ? "" : ", ", $1, $f) } END { print "{" s "}" }'
}
minutes 3 mean >"$WORK/rss"
minutes 5 mean >"$WORK/heap"
minutes 4 median >"$WORK/fds"
say "samples (seconds daemon rss_kib fds heap_kib):"; cat "$WORK/samples" >&2
printf '%-34s %12s\n' "duration (s)" "$DURATION"
printf '%-34s %12s\n' "sandboxes created" "$CREATED"
printf '%-34s %12s\n' "errors" "$ERRORS"
printf '%-34s %12s\n' "ledger CPU = kernel, every sandbox" "$LEDGER_EXACT ($mismatches mismatches)"
[ "$LEAK_KIB_PER_MIN" = 0 ] || printf '%-34s %12s\n' "leaked on purpose, every daemon" "$LEAK_KIB_PER_MIN KiB/min"
printf '%-34s %12s\n' "glibc per-thread cache" "$([ "$SOAK_TCACHE" = 1 ] && echo on || echo "off (SOAK_TCACHE=1 keeps it)")"
for what in rss heap; do
  while read -r d g z grows at; do
    printf '%-34s %12s\n' "$d $([ $what = rss ] && echo RSS || echo "heap in use"), minute $BASE to $LAST (KiB)" \
      "$g (noise $z, twice the change into minute $at; $([ "$grows" = true ] && echo "GROWS beyond noise" || echo "within noise"))"
  done <"$WORK/$what"
done
while read -r d g _; do printf '%-34s %12s\n' "$d descriptors, minute $BASE to $LAST" "$g"; done <"$WORK/fds"
printf '{"duration_s": %d, "sandboxes_created": %d, "errors": %d, "leak_kib_per_min": %d, "tcache": %s, "rss_growth_kib": %s, "rss_noise_kib": %s, "rss_grows": %s, "heap_growth_kib": %s, "heap_noise_kib": %s, "heap_grows": %s, "fd_growth": %s, "ledger_exact": %s, "ledger_mismatches": %s}\n' \
  "$DURATION" "$CREATED" "$ERRORS" "$LEAK_KIB_PER_MIN" "$([ "$SOAK_TCACHE" = 1 ] && echo true || echo false)" "$(json_of 2 <"$WORK/rss")" "$(json_of 3 <"$WORK/rss")" "$(json_of 4 <"$WORK/rss")" \
  "$(json_of 2 <"$WORK/heap")" "$(json_of 3 <"$WORK/heap")" "$(json_of 4 <"$WORK/heap")" \
  "$(json_of 2 <"$WORK/fds")" "$LEDGER_EXACT" "$mismatches"

# The verdict (see the head of this file).
failed=()
[ "$LEDGER_EXACT" = true ] || failed+=("the ledger is not exact ($mismatches mismatches, $TRUTHS of $CREATED truths)")
[ "$ERRORS" = 0 ] || failed+=("$ERRORS errors")
for what in rss heap; do
  while read -r d g z grows _; do
    if [ "$grows" = true ]; then failed+=("$d's $what grows $g KiB beyond its noise $z"); fi
  done <"$WORK/$what"
done
while read -r d g _; do
  if [ "$g" -gt 0 ]; then failed+=("$d's descriptors grow by $g"); fi
done <"$WORK/fds"
if [ ${#failed[@]} -gt 0 ]; then
  for f in "${failed[@]}"; do say "soak FAILED: $f"; done
  exit 1
fi
say "soak passed: ledger exact, no errors, no growth in $MINUTES minutes"
