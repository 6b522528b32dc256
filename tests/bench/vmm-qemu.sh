#!/usr/bin/env bash
# scripts/bench vmm-qemu — create → first exec result of the qemu backend
# over 5 microVMs (cgroup created, QEMU started inside it, guest booted,
# `echo ok` run through the guest agent), with KVM when a KVM guest really
# boots here, else TCG. Printed beside the product page's figure for
# Firecracker with KVM (351 ms median; quoted: Firecracker cannot run here).
# Needs root (cgroups). The last line is JSON.
source "$TALLY_ROOT/scripts/lib.sh" 2>/dev/null || source "$(dirname "$0")/../../scripts/lib.sh"
: "${TALLY_BUILD:?run through scripts/bench}"

RUNS=${TALLY_BENCH_QEMU_RUNS:-5}
ACCEL=${TALLY_BENCH_QEMU_ACCEL:-auto}
WORK=$(mktemp -d /tmp/tally-bench-vmm-qemu.XXXXXX)
trap 'rm -rf "$WORK"' EXIT

BENCH=$TALLY_BUILD/tests/bench/vmm-qemu/bench-vmm-qemu
[ -x "$BENCH" ] || die "$BENCH is missing (is the qemu backend built?)"
out=$("$BENCH" "$RUNS" "$ACCEL" "$WORK" 2>"$WORK/bench.err") || { cat "$WORK/bench.err" >&2; die "qemu benchmark failed"; }
cat "$WORK/bench.err" >&2
summary=$(tail -1 <<<"$out")
field() { sed -n "s/.*[ ^]$1=\([^ ]*\).*/\1/p" <<<" $summary"; }
ms() { printf '%d.%03d' $(( $1 / 1000 )) $(( $1 % 1000 )); }
accel=$(field accel); p50=$(field p50_us); p99=$(field p99_us); min=$(field min_us); max=$(field max_us)

printf '%-44s %12s %12s\n' "create -> first exec result" "median ms" "p99 ms"
printf '%-44s %12s %12s\n' "qemu microVM, $accel, $RUNS runs (this run)" "$(ms "$p50")" "$(ms "$p99")"
printf '%-44s %12s %12s\n' "Firecracker with KVM (product page, quoted)" "351" "-"
printf 'min %s ms, max %s ms\n' "$(ms "$min")" "$(ms "$max")"
printf '{"qemu_create_exec_ms_p50": %s, "qemu_create_exec_ms_p99": %s, "qemu_accel": "%s", "qemu_runs": %d, "firecracker_kvm_quoted_ms_p50": 351}\n' \
  "$(ms "$p50")" "$(ms "$p99")" "$accel" "$RUNS"
