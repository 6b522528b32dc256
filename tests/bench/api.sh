#!/usr/bin/env bash
# tests/bench/api.sh — tally-api's read side on this machine, with the goals of
# the read API's beside them (docs/benchmarks.md); the last line is JSON.
#
# The ledger gets one month of hourly usage for 1,000 sandboxes of one account
# (720 hours x 1,000 = 720,000 usage_hourly rows, one API key, labels), then
#  - in-process: the handlers alone (tests/bench/api/bench-api), one connection:
#      GET /v1/usage (the month by day, as the key) and GET /v1/spend;
#  - over HTTP: wrk (Debian's) against a real tally-api, each route for DURATION
#      seconds with CONNECTIONS connections: /v1/spend, /v1/usage (the month by
#      day) and a static route of the same daemon (STATIC, default
#      /v1/openapi.json: no database) as the ceiling. Requests/s and p99 each,
#      and the CPU time each request cost tally-api and PostgreSQL (from
#      /proc: utime + stime over the run / requests) — the figure that does not
#      move with the other jobs on the machine, where requests/s and p99 do.
#  - a noisy neighbour: another account's key keeps NOISY concurrent execs of
#      `sleep 2` going (NOISY, default 16: four times a key's cap of 4 at once)
#      through tally-api into a real tally-vmm (process backend) — one client
#      process on kept-alive connections (tests/bench/noisy_exec.py), so that
#      its cost on this machine is tally's and the sandbox's, not a shell
#      forking a client per request — while
#      wrk -c$QUIET_CONNECTIONS reads /v1/spend as the bench key; the same
#      wrk alone just before, in the same run; and paced: /v1/spend at
#      PACED_RATE a second (default 200) on one kept-alive connection
#      (tests/bench/paced_get.py, latency from each request's due moment),
#      alone and beside the neighbour. The goal: the p99 under the neighbour
#      within 2x the p99 alone. wrk saturates both of this machine's CPUs, so
#      its ratio also counts the CPU the neighbour's execs take on the same
#      two cores (one machine plays every tenant and the host); the paced
#      reader measures what a polling tenant sees.
# The load average is printed at the start and the end.
# Without a tally-api binary in the build, the HTTP figures are null and say so.
set -euo pipefail
source "$(dirname "$0")/../../scripts/lib.sh"
BUILD=${TALLY_BUILD:?run through scripts/bench}
BENCH=$BUILD/tests/bench/api/bench-api
API=$BUILD/api/tally-api
DURATION=${DURATION:-10}
CONNECTIONS=${CONNECTIONS:-32}
THREADS=${THREADS:-2}
STATIC=${STATIC:-/v1/openapi.json}
CALLS=${CALLS:-200}
NOISY=${NOISY:-16}
QUIET_CONNECTIONS=${QUIET_CONNECTIONS:-4}
PACED_RATE=${PACED_RATE:-200}
ensure_packages wrk
LOAD0=$(cut -d' ' -f1 /proc/loadavg)
WORK=$(mktemp -d /tmp/tally-bench-api.XXXXXX)
API_PID=
VMM_PID=
NOISY_PIDS=()
PARENT=tally-bench-api-$$
cleanup() {
  set +e
  for p in "${NOISY_PIDS[@]}"; do kill "$p" 2>/dev/null; done
  [ -n "$API_PID" ] && kill "$API_PID" 2>/dev/null && wait "$API_PID" 2>/dev/null
  [ -n "$VMM_PID" ] && kill "$VMM_PID" 2>/dev/null && wait "$VMM_PID" 2>/dev/null
  # What the neighbour's sandboxes left under our cgroup parent: thaw, kill, remove.
  for h in freezer cpu cpuacct memory pids unified; do
    for d in /sys/fs/cgroup/$h/$PARENT/*/ /sys/fs/cgroup/$PARENT/*/; do
      [ -d "$d" ] || continue
      [ -f "$d/freezer.state" ] && echo THAWED > "$d/freezer.state"
      for p in $(cat "$d/cgroup.procs" 2>/dev/null); do kill -9 "$p" 2>/dev/null; done
      rmdir "$d" 2>/dev/null
    done
    rmdir /sys/fs/cgroup/$h/$PARENT 2>/dev/null
  done
  rmdir /sys/fs/cgroup/$PARENT 2>/dev/null
  stop_test_services "$WORK"
}
trap cleanup EXIT
start_test_services "$WORK" "$BUILD"
DB="${TALLY_TEST_PG_URL%/*}/tally"
"$BUILD/ledger/tally-migrate" --database-url "$(pg_role_url "$DB" tally_owner)" --log-level warn
psql() { "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 "$DB" "$@"; }

SECRET=tk_bench0123456789abcdef0123456789abcdef0123456789
NOISY_SECRET=tk_noisy0123456789abcdef0123456789abcdef0123456789
say "generating a month of hourly usage for 1,000 sandboxes"
# The 720 hours ending with the current one; the key also spent today and burns now.
psql <<SQL
INSERT INTO accounts (id, name) VALUES ('bench-acct', 'bench'), ('noisy-acct', 'noisy neighbour');
INSERT INTO api_keys (id, account_id, key_hash) VALUES ('noisy-key', 'noisy-acct', sha256('$NOISY_SECRET'::bytea));
INSERT INTO api_keys (id, account_id, key_hash, daily_limit_nanodollars)
     VALUES ('bench-key', 'bench-acct', sha256('$SECRET'::bytea), 100000000000);
INSERT INTO sandboxes (id, account_id, key_id, vcpus, mem_size_bytes, labels, state)
SELECT 'bench-sb-' || i, 'bench-acct', 'bench-key', 2, 4294967296,
       jsonb_build_object('agent', 'agent-' || (i % 10)), 'running'
  FROM generate_series(0, 999) AS i;
INSERT INTO usage_hourly (sandbox_id, hour, account_id, key_id, cpu_ns, mem_byte_ns, mem_peak_bytes)
SELECT 'bench-sb-' || i, date_trunc('hour', now(), 'UTC') - h * interval '1 hour', 'bench-acct', 'bench-key',
       (i % 7 + 1) * 300000000000::bigint, 4294967296::numeric * 3600000000000, 1000000000
  FROM generate_series(0, 999) AS i, generate_series(0, 719) AS h;
INSERT INTO spend_daily (key_id, day, account_id, cpu_rated)
     VALUES ('bench-key', (now() AT TIME ZONE 'UTC')::date, 'bench-acct', 3600000000000::numeric * 25000000 * 40);
VACUUM ANALYZE;
SQL
# The month by day: the 30 UTC days ending tomorrow at midnight (whole days, as a dashboard asks).
FROM=$(date -u -d "today -29 days" +%Y-%m-%dT00:00:00Z)
TO=$(date -u -d "tomorrow" +%Y-%m-%dT00:00:00Z)
USAGE_QS="from=$FROM&to=$TO&granularity=day"
ROWS=$(psql -tAc "SELECT count(*) FROM usage_hourly WHERE account_id = 'bench-acct'")
[ "$ROWS" = 720000 ] || die "generated $ROWS usage rows, want 720000"

say "in-process: the handlers alone ($CALLS calls each, one connection)"
IP_USAGE=$("$BENCH" "$DB" bench-acct bench-key usage "$CALLS" "$USAGE_QS")
IP_SPEND=$("$BENCH" "$DB" bench-acct bench-key spend "$((CALLS * 10))" "")
field() { sed -n "s/^$2=//p" <<<"$1"; }

# CPU clock ticks (utime + stime) of the given pids, and of PostgreSQL's
# processes: the postmaster, its children alive now, and the children it reaped.
ticks() { local t=0 p; for p in "$@"; do [ -r "/proc/$p/stat" ] && t=$((t + $(awk '{ print $14 + $15 }' "/proc/$p/stat"))); done; echo "$t"; }
pg_ticks() {
  local pm; pm=$(head -1 "$WORK/pg/data/postmaster.pid")
  echo $(( $(ticks $(pgrep -P "$pm")) + $(awk '{ print $14 + $15 + $16 + $17 }' "/proc/$pm/stat") ))
}
HZ=$(getconf CLK_TCK)
# microseconds per request from ticks over n requests, one decimal
us_per() { awk -v t="$1" -v n="$2" -v hz="$HZ" 'BEGIN { printf "%.1f", (n > 0 ? t * 1000000 / hz / n : 0) }'; }

# wrk's "Requests/sec:" and its 99% latency (us, ms or s) in milliseconds.
wrk_run() { # PATH -> "RPS P99_MS NON2XX API_CPU_US PG_CPU_US"
  local out a0 p0 a1 p1 n
  a0=$(ticks "$API_PID"); p0=$(pg_ticks)
  out=$(wrk -t"$THREADS" -c"$CONNECTIONS" -d"${DURATION}s" --latency -H "Authorization: Bearer $SECRET" \
        "http://127.0.0.1:$PORT$1")
  a1=$(ticks "$API_PID"); p1=$(pg_ticks)
  printf '%s\n' "$out" >>"$WORK/wrk.txt"
  n=$(awk '/requests in/ { print $1 }' <<<"$out")
  # The distribution behind the p99, for the reader (stderr).
  say "  $1: $(awk '/^Requests\/sec:/ { r = $2 } $1 ~ /^(50|75|90|99)%$/ { d = d " p" $1 "=" $2 } END { print r " req/s" d }' <<<"$out")"
  local rps p99 bad
  rps=$(awk '/^Requests\/sec:/ { printf "%d", $2 }' <<<"$out")
  p99=$(awk '$1 == "99%" { v = $2; u = v; sub(/[0-9.]+/, "", u); sub(/[a-z]+$/, "", v);
               if (u == "us") v /= 1000; else if (u == "s") v *= 1000; printf "%.2f", v }' <<<"$out")
  bad=$(awk '/Non-2xx or 3xx responses:/ { print $NF }' <<<"$out")
  echo "$rps $p99 ${bad:-0} $(us_per $((a1 - a0)) "$n") $(us_per $((p1 - p0)) "$n")"
}

HTTP=false
if [ -x "$API" ]; then
  HTTP=true
  SOCK=$WORK/vmm.sock
  "$BUILD/vmm/tally-vmm" --state-dir "$WORK/state" --socket "$SOCK" --kafka-brokers "$TALLY_TEST_BROKERS" \
    --cgroup-parent "$PARENT" --host-id bench-api-host --backend process --final-wait-ms 200 \
    --log-level warn 2>"$WORK/vmm.log" &
  VMM_PID=$!
  for _ in $(seq 1 200); do [ -S "$SOCK" ] && break; sleep 0.1; done
  [ -S "$SOCK" ] || die "tally-vmm did not start: $(tail -3 "$WORK/vmm.log")"
  "$API" --database-url="$(pg_role_url "$DB" tally_api)" --port=0 --rate-per-s=1000000 --rate-burst=1000000 --log-level=warn \
    --cookie-secure=false --vmm-sockets="$SOCK" 2>"$WORK/api.log" &
  API_PID=$!
  # The port is logged at start (level info); ask the kernel instead, whatever the log level.
  PORT=
  for _ in $(seq 100); do
    PORT=$(ss -Hltnp 2>/dev/null | awk -v pid="pid=$API_PID," 'index($0, pid) { n = split($4, a, ":"); print a[n]; exit }')
    [ -n "$PORT" ] && break
    kill -0 "$API_PID" 2>/dev/null || die "tally-api exited: $(tail -3 "$WORK/api.log")"
    sleep 0.1
  done
  [ -n "$PORT" ] || die "tally-api opened no port"
  code=$(curl -s -o "$WORK/usage.json" -w '%{http_code}' -H "Authorization: Bearer $SECRET" "http://127.0.0.1:$PORT/v1/usage?$USAGE_QS")
  [ "$code" = 200 ] || die "GET /v1/usage answered $code: $(head -c 300 "$WORK/usage.json")"
  code=$(curl -s -o "$WORK/spend.json" -w '%{http_code}' -H "Authorization: Bearer $SECRET" "http://127.0.0.1:$PORT/v1/spend")
  [ "$code" = 200 ] || die "GET /v1/spend answered $code: $(head -c 300 "$WORK/spend.json")"
  say "over HTTP: wrk -t$THREADS -c$CONNECTIONS -d${DURATION}s, one route at a time"
  read -r S_RPS S_P99 S_BAD S_API S_PG < <(wrk_run /v1/spend)
  read -r U_RPS U_P99 U_BAD U_API U_PG < <(wrk_run "/v1/usage?$USAGE_QS")
  read -r T_RPS T_P99 T_BAD T_API T_PG < <(wrk_run "$STATIC")
  for b in "$S_BAD" "$U_BAD" "$T_BAD"; do
    [ "$b" = 0 ] || die "wrk saw $b answers that were not 2xx (see $WORK/wrk.txt)"
  done

  say "noisy neighbour: /v1/spend with wrk -c$QUIET_CONNECTIONS alone, then while another account keeps $NOISY execs going"
  SBX=$(curl -s -X POST -H "Authorization: Bearer $NOISY_SECRET" -H 'Content-Type: application/json' \
        -d '{"memory_mib":64,"timeout_s":3600}' "http://127.0.0.1:$PORT/v1/sandboxes" |
        sed -n 's/.*"id":"\([^"]*\)".*/\1/p')
  [ -n "$SBX" ] || die "the neighbour's sandbox was not created: $(tail -3 "$WORK/api.log")"
  quiet() { # -> "P99_MS NON2XX"
    local save_c=$CONNECTIONS save_t=$THREADS r
    CONNECTIONS=$QUIET_CONNECTIONS THREADS=1
    read -r _ r_p99 r_bad _ _ < <(wrk_run /v1/spend)
    CONNECTIONS=$save_c THREADS=$save_t
    echo "$r_p99 $r_bad"
  }
  read -r Q_ALONE Q_ALONE_BAD < <(quiet)
  # The machine's busy ticks (all CPUs, from /proc/stat) and tally-api's,
  # tally-vmm's and PostgreSQL's, over a paced run: where the CPU went.
  busy() { awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 }' /proc/stat; }
  paced() { # -> "P50 P99 NON2XX MACHINE_BUSY_PCT API_PCT VMM_PCT PG_PCT"
    local m0 a0 v0 p0 t0 r
    m0=$(busy); a0=$(ticks "$API_PID"); v0=$(ticks "$VMM_PID"); p0=$(pg_ticks); t0=$(date +%s%N)
    r=$(python3 "$TALLY_ROOT/tests/bench/paced_get.py" "$PORT" /v1/spend "$SECRET" "$PACED_RATE" 5)
    echo "$r $(awk -v m=$(($(busy) - m0)) -v a=$(($(ticks "$API_PID") - a0)) -v v=$(($(ticks "$VMM_PID") - v0)) \
          -v p=$(($(pg_ticks) - p0)) -v ns=$(($(date +%s%N) - t0)) -v hz="$HZ" \
          'BEGIN { s = ns / 1e9 * hz / 100; printf "%.0f %.0f %.0f %.0f", m / s, a / s, v / s, p / s }')"
  }
  read -r _ P_ALONE P_ALONE_BAD P_ALONE_CPU < <(paced)
  say "  paced alone: p99 $P_ALONE ms; CPU % (machine of 200, tally-api, tally-vmm, PostgreSQL): $P_ALONE_CPU"
  python3 "$TALLY_ROOT/tests/bench/noisy_exec.py" "$PORT" "$SBX" "$NOISY_SECRET" "$NOISY" "$WORK/noisy.txt" &
  NOISY_PIDS+=($!)
  sleep 3 # the neighbour at its caps: 4 running, the rest waiting
  running=$(curl -s "http://127.0.0.1:$PORT/metrics" | awk '$1 == "tally_api_workers_running" { print $2 }')
  read -r Q_NOISY Q_NOISY_BAD < <(quiet)
  read -r _ P_NOISY P_NOISY_BAD P_NOISY_CPU < <(paced)
  say "  paced beside: p99 $P_NOISY ms; CPU % (machine of 200, tally-api, tally-vmm, PostgreSQL): $P_NOISY_CPU"
  for p in "${NOISY_PIDS[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  NOISY_PIDS=()
  read -r NOISY_DONE NOISY_429 NOISY_OTHER <"$WORK/noisy.txt"
  [ "$NOISY_OTHER" = 0 ] || say "  the neighbour's execs: $NOISY_OTHER answered other than 200 or 429, or failed"
  say "  the neighbour: $running execs running at once (its cap), $NOISY_DONE ended with 200, $NOISY_429 refused with 429"
  [ "$Q_ALONE_BAD" = 0 ] && [ "$Q_NOISY_BAD" = 0 ] || die "/v1/spend answered other than 2xx (see $WORK/wrk.txt)"
  [ "$P_ALONE_BAD" = 0 ] && [ "$P_NOISY_BAD" = 0 ] || die "/v1/spend answered other than 2xx to the paced reader"
  Q_RATIO=$(awk -v a="$Q_ALONE" -v b="$Q_NOISY" 'BEGIN { printf "%.2f", (a > 0 ? b / a : 0) }')
  P_RATIO=$(awk -v a="$P_ALONE" -v b="$P_NOISY" 'BEGIN { printf "%.2f", (a > 0 ? b / a : 0) }')
else
  say "no $API in this build: the HTTP figures are not measured"
  S_RPS=null S_P99=null U_RPS=null U_P99=null T_RPS=null T_P99=null
  S_API=null S_PG=null U_API=null U_PG=null T_API=null T_PG=null
  Q_ALONE=null Q_NOISY=null Q_RATIO=null NOISY_DONE=null P_ALONE=null P_NOISY=null P_RATIO=null
fi

printf '%-40s %12s   %s\n' "figure" "measured" "goal"
printf '%-40s %12s   %s\n' "in-process usage calls/s (month by day)" "$(field "$IP_USAGE" calls_per_s)" "-"
printf '%-40s %12s   %s\n' "in-process usage p99 (ms)" "$(field "$IP_USAGE" p99_ms)" "< 50"
printf '%-40s %12s   %s\n' "in-process spend calls/s" "$(field "$IP_SPEND" calls_per_s)" "-"
printf '%-40s %12s   %s\n' "in-process spend p99 (ms)" "$(field "$IP_SPEND" p99_ms)" "-"
printf '%-40s %12s   %s\n' "GET /v1/spend requests/s" "$S_RPS" ">= 10000"
printf '%-40s %12s   %s\n' "GET /v1/spend p99 (ms)" "$S_P99" "< 20"
printf '%-40s %12s   %s\n' "GET /v1/usage requests/s (month by day)" "$U_RPS" "-"
printf '%-40s %12s   %s\n' "GET /v1/usage p99 (ms)" "$U_P99" "< 50"
printf '%-40s %12s   %s\n' "GET $STATIC requests/s (ceiling)" "$T_RPS" "-"
printf '%-40s %12s   %s\n' "GET $STATIC p99 (ms)" "$T_P99" "-"
printf '%-40s %12s   %s\n' "noisy neighbour: spend p99 alone (ms)" "$Q_ALONE" "wrk -c$QUIET_CONNECTIONS"
printf '%-40s %12s   %s\n' "noisy neighbour: spend p99 beside (ms)" "$Q_NOISY" "another account: $NOISY execs"
printf '%-40s %12s   %s\n' "noisy neighbour: beside / alone" "$Q_RATIO" "<= 2 (wrk saturating both CPUs)"
printf '%-40s %12s   %s\n' "noisy neighbour: paced p99 alone (ms)" "$P_ALONE" "$PACED_RATE/s, one connection"
printf '%-40s %12s   %s\n' "noisy neighbour: paced p99 beside (ms)" "$P_NOISY" "another account: $NOISY execs"
printf '%-40s %12s   %s\n' "noisy neighbour: paced beside / alone" "$P_RATIO" "<= 2"
printf '%-40s %12s   %s\n' "GET /v1/spend CPU us/request" "$S_API + $S_PG" "tally-api + PostgreSQL"
printf '%-40s %12s   %s\n' "GET /v1/usage CPU us/request" "$U_API + $U_PG" "tally-api + PostgreSQL"
printf '%-40s %12s   %s\n' "GET $STATIC CPU us/request" "$T_API + $T_PG" "tally-api + PostgreSQL"
printf '%-40s %12s   %s\n' "load average, start -> end" "$LOAD0 -> $(cut -d' ' -f1 /proc/loadavg)" "(2 CPUs)"
$HTTP || printf '%-40s %12s   %s\n' "HTTP figures" "" "NOT MEASURED: no tally-api in this build"
printf '{"usage_rows": %s, "spend_rps": %s, "spend_p99_ms": %s, "usage_rps": %s, "usage_p99_ms": %s, "static_rps": %s, "static_p99_ms": %s, "inprocess_usage_p99_ms": %s, "inprocess_spend_p99_ms": %s, "spend_api_cpu_us": %s, "spend_pg_cpu_us": %s, "usage_api_cpu_us": %s, "usage_pg_cpu_us": %s, "static_api_cpu_us": %s, "noisy_spend_p99_alone_ms": %s, "noisy_spend_p99_beside_ms": %s, "noisy_ratio": %s, "noisy_paced_p99_alone_ms": %s, "noisy_paced_p99_beside_ms": %s, "noisy_paced_ratio": %s, "noisy_execs_done": %s, "load_avg_start": %s, "load_avg_end": %s}\n' \
  "$ROWS" "$S_RPS" "$S_P99" "$U_RPS" "$U_P99" "$T_RPS" "$T_P99" "$(field "$IP_USAGE" p99_ms)" "$(field "$IP_SPEND" p99_ms)" \
  "$S_API" "$S_PG" "$U_API" "$U_PG" "$T_API" "$Q_ALONE" "$Q_NOISY" "$Q_RATIO" "$P_ALONE" "$P_NOISY" "$P_RATIO" "$NOISY_DONE" "$LOAD0" "$(cut -d' ' -f1 /proc/loadavg)"
