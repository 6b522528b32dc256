#!/usr/bin/env bash
# tests/bench/collector.sh — CPU time and syscalls per sandbox-sample of
# tally-collector's cgroup reader (counter files opened once, pread at offset 0)
# beside a reader that opens, reads and closes each file every tick (the way
# common collectors read cgroups), on the same 100, 1,000 and 10,000 real v1
# cgroups, in the same run. Both read the same files on the collector's
# schedule: CPU counter and memory every tick, peak memory every 10th tick.
# CPU time is the process's own (user + system, CLOCK_PROCESS_CPUTIME_ID), the
# median of 5 interleaved rounds; syscalls are counted by strace between two
# marker calls. Needs root and cgroup v1 (cpuacct, memory). Ends with one JSON line.
source "$TALLY_ROOT/scripts/lib.sh" 2>/dev/null || source "$(dirname "$0")/../../scripts/lib.sh"
ensure_packages strace
BIN=$TALLY_BUILD/tests/bench/collector/bench-collector
[ -x "$BIN" ] || die "$BIN is missing (scripts/bench builds it)"
WORK=$(mktemp -d /tmp/tally-bench-collector.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

declare -A tally openclose transient
for n in 100 1000 10000; do
  read -r _ t o tr < <("$BIN" "$n" 5)
  tally[$n]=$t; openclose[$n]=$o; transient[$n]=$tr
done

# Syscalls per sandbox-sample: every call strace sees between the two getppid markers.
syscalls() { # MODE N TICKS
  strace -f -qq -o "$WORK/trace" "$BIN" --only "$1" "$2" "$3"
  awk -v samples=$(( $2 * $3 )) '
    /getppid\(/ { marks++; next }
    marks == 1  { calls++ }
    END { printf "%.2f", calls / samples }' "$WORK/trace"
}
sys_tally=$(syscalls tally 1000 20)
sys_openclose=$(syscalls openclose 1000 20)

us() { awk -v ns="$1" 'BEGIN { printf "%.3f", ns / 1000 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b / a }'; }
printf '\n%-10s  %22s  %22s  %8s\n' "sandboxes" "tally µs/sample" "open/read/close µs" "cheaper"
for n in 100 1000 10000; do
  printf '%-10s  %22s  %22s  %7sx\n' "$n" "$(us "${tally[$n]}")" "$(us "${openclose[$n]}")" \
    "$(ratio "${tally[$n]}" "${openclose[$n]}")"
done
printf '%-10s  %22s  %22s\n' "syscalls" "$sys_tally" "$sys_openclose"
[ "${transient[10000]}" -gt 0 ] && say "note: at 10000 sandboxes ${transient[10000]} were read by opening (RLIMIT_NOFILE $(ulimit -Hn))"
say "goal: at most 2 µs per sandbox-sample at 10,000, and at least 5x cheaper than open/read/close"
printf '{"bench":"collector","us_per_sample_100":%s,"us_per_sample_1000":%s,"us_per_sample_10000":%s,' \
  "$(us "${tally[100]}")" "$(us "${tally[1000]}")" "$(us "${tally[10000]}")"
printf '"openclose_us_per_sample_100":%s,"openclose_us_per_sample_1000":%s,"openclose_us_per_sample_10000":%s,' \
  "$(us "${openclose[100]}")" "$(us "${openclose[1000]}")" "$(us "${openclose[10000]}")"
printf '"syscalls_per_sample":%s,"openclose_syscalls_per_sample":%s,"ratio_10000":%s,"transient_10000":%s}\n' \
  "$sys_tally" "$sys_openclose" "$(ratio "${tally[10000]}" "${openclose[10000]}")" "${transient[10000]}"
