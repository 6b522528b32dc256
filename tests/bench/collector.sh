#!/usr/bin/env bash
# tests/bench/collector.sh — CPU time and syscalls per sandbox-sample of
# tally-collector's cgroup readers — the BPF cgroup walk (one walk of each
# hierarchy per tick; the default where it loads) and kept counter files
# (pread at offset 0; the fallback) — beside a reader that opens, reads and
# closes each file every tick (the way common collectors read cgroups), on the
# same 100, 1,000 and 10,000 real v1 cgroups, in the same run. All read the
# same counters on the collector's schedule: CPU counter and memory every
# tick, peak memory every 10th tick.
# CPU time is the process's own (user + system, CLOCK_PROCESS_CPUTIME_ID), the
# median of 5 interleaved rounds; syscalls are counted by strace between two
# marker calls. Then the whole tally-collector daemon (every thread: reading,
# encoding, producing to a development broker) on 10,000 registered sandboxes:
# its CPU per published sample, with each reader, sending v1 messages (one JSON message per sample)
# and usage batches (usage_format v2: one message per partition per tick) in the same run.
# Needs root and cgroup v1 (cpuacct, memory).
# PERF_DIR: when set, `perf record -g` of each daemon phase into
# PERF_DIR/daemon.N.READER.FORMAT.data.
# Ends with one JSON line.
source "$TALLY_ROOT/scripts/lib.sh" 2>/dev/null || source "$(dirname "$0")/../../scripts/lib.sh"
ensure_packages strace
BIN=$TALLY_BUILD/tests/bench/collector/bench-collector
[ -x "$BIN" ] || die "$BIN is missing (scripts/bench builds it)"
WORK=$(mktemp -d /tmp/tally-bench-collector.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

declare -A scan pread openclose transient
for n in 100 1000 10000; do
  read -r _ t p o tr < <("$BIN" "$n" 5)
  scan[$n]=$t; pread[$n]=$p; openclose[$n]=$o; transient[$n]=$tr
done

# Syscalls per sandbox-sample: every call strace sees between the two getppid markers.
syscalls() { # MODE N TICKS
  strace -f -qq -o "$WORK/trace" "$BIN" --only "$1" "$2" "$3"
  awk -v samples=$(( $2 * $3 )) '
    /getppid\(/ { marks++; next }
    marks == 1  { calls++ }
    END { printf "%.2f", calls / samples }' "$WORK/trace"
}
sys_scan=$(syscalls scan 1000 20)
sys_pread=$(syscalls pread 1000 20)
sys_openclose=$(syscalls openclose 1000 20)

# The whole daemon: tally-collector itself (every thread: reading, encoding, producing to the
# development broker) sampling N sandboxes registered as the vmm would, at 1 tick a second.
# CPU from /proc/PID/stat over a steady window, per sample published.
metric() { # PORT NAME
  local line
  exec 3<>"/dev/tcp/127.0.0.1/$1" || return 1
  printf 'GET /metrics HTTP/1.0\r\n\r\n' >&3
  timeout 10 cat <&3 | awk -v n="tally_collector_$2" '$1 == n { print $2 }'
  exec 3>&-
}
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
daemon_cost() { # N SECONDS READER FORMAT -> ns per sample
  local n=$1 secs=$2 reader=$3 format=$4 state=$WORK/state-$1-$3-$4 port s0 s1 c0 c1 ready i
  mkdir -p "$state"
  coproc HOLD { "$BIN" --registry "$state" "$n"; }
  read -r ready <&"${HOLD[0]}"
  port=$(free_port)
  "$TALLY_BUILD/collector/tally-collector" --kafka-brokers "$(cat "$WORK/run/broker.bootstrap")" \
    --state-dir "$state" --metrics-port "$port" --cgroup-reader "$reader" --usage-format "$format" --log-level warn 2>>"$WORK/collector.log" &
  local pid=$!
  for i in $(seq 1 120); do
    [ "$(metric "$port" ticks_total 2>/dev/null || echo 0)" -ge 3 ] 2>/dev/null && break
    sleep 0.5
  done
  s0=$(metric "$port" samples_total); c0=$(cpu_ticks $pid)
  local perf_pid=
  if [ -n "${PERF_DIR:-}" ]; then
    mkdir -p "$PERF_DIR"
    perf record -q -F 999 -g -o "$PERF_DIR/daemon.$n.$reader.$format.data" -p "$pid" 2>/dev/null &
    perf_pid=$!
  fi
  sleep "$secs"
  s1=$(metric "$port" samples_total); c1=$(cpu_ticks $pid)
  [ -z "$perf_pid" ] || { kill -INT "$perf_pid" 2>/dev/null || true; wait "$perf_pid" || true; }
  kill -TERM $pid; wait $pid || true
  exec {HOLD[1]}>&-
  wait "$HOLD_PID" 2>/dev/null || true
  awk -v c=$(( c1 - c0 )) -v hz="$(getconf CLK_TCK)" -v s=$(( s1 - s0 )) 'BEGIN { printf "%d", c * 1e9 / hz / s }'
}
broker_start "$TALLY_BUILD/broker/tally-broker" "$WORK/run" 0
trap 'stop_pidfile "$WORK/run/broker.pid"; rm -rf "$WORK"' EXIT
daemon_10000=$(daemon_cost 10000 20 scan v1)
daemon_files_10000=$(daemon_cost 10000 20 files v1)
daemon_v2_10000=$(daemon_cost 10000 20 scan v2)
daemon_files_v2_10000=$(daemon_cost 10000 20 files v2)

us() { awk -v ns="$1" 'BEGIN { printf "%.3f", ns / 1000 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b / a }'; }
printf '\n%-10s  %16s  %16s  %20s  %14s\n' "sandboxes" "walk µs/sample" "pread µs/sample" "open/read/close µs" "walk cheaper"
for n in 100 1000 10000; do
  printf '%-10s  %16s  %16s  %20s  %13sx\n' "$n" "$(us "${scan[$n]}")" "$(us "${pread[$n]}")" \
    "$(us "${openclose[$n]}")" "$(ratio "${scan[$n]}" "${openclose[$n]}")"
done
printf '%-10s  %16s  %16s  %20s\n' "syscalls" "$sys_scan" "$sys_pread" "$sys_openclose"
printf '%-10s  %16s  %16s  %20s\n' "daemon v1" "$(us "$daemon_10000")" "$(us "$daemon_files_10000")" \
  "(tally-collector, 10000, all threads, a message per sample)"
printf '%-10s  %16s  %16s  %20s\n' "daemon v2" "$(us "$daemon_v2_10000")" "$(us "$daemon_files_v2_10000")" \
  "(tally-collector, 10000, all threads, usage batches)"
[ "${transient[10000]}" -gt 0 ] && say "note: at 10000 sandboxes ${transient[10000]} were read by opening their files in the pread column (RLIMIT_NOFILE $(ulimit -Hn))"
say "goal: at most 2 µs per sandbox-sample at 10,000, and at least 5x cheaper than open/read/close; the whole daemon at most 1 µs per sample with usage batches"
printf '{"bench":"collector","reader":"scan","us_per_sample_100":%s,"us_per_sample_1000":%s,"us_per_sample_10000":%s,' \
  "$(us "${scan[100]}")" "$(us "${scan[1000]}")" "$(us "${scan[10000]}")"
printf '"pread_us_per_sample_100":%s,"pread_us_per_sample_1000":%s,"pread_us_per_sample_10000":%s,' \
  "$(us "${pread[100]}")" "$(us "${pread[1000]}")" "$(us "${pread[10000]}")"
printf '"openclose_us_per_sample_100":%s,"openclose_us_per_sample_1000":%s,"openclose_us_per_sample_10000":%s,' \
  "$(us "${openclose[100]}")" "$(us "${openclose[1000]}")" "$(us "${openclose[10000]}")"
printf '"syscalls_per_sample":%s,"pread_syscalls_per_sample":%s,"openclose_syscalls_per_sample":%s,' \
  "$sys_scan" "$sys_pread" "$sys_openclose"
printf '"ratio_10000":%s,"pread_ratio_10000":%s,"transient_10000":%s,' \
  "$(ratio "${scan[10000]}" "${openclose[10000]}")" "$(ratio "${pread[10000]}" "${openclose[10000]}")" "${transient[10000]}"
printf '"daemon_us_per_sample_10000":%s,"daemon_files_us_per_sample_10000":%s,' \
  "$(us "$daemon_10000")" "$(us "$daemon_files_10000")"
printf '"daemon_v2_us_per_sample_10000":%s,"daemon_files_v2_us_per_sample_10000":%s}\n' \
  "$(us "$daemon_v2_10000")" "$(us "$daemon_files_v2_10000")"
