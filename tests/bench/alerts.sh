#!/usr/bin/env bash
# tests/bench/alerts.sh — the latency from an alert's commit (the
# aggregator's own INSERT INTO alerts, committed on its own) to the webhook
# receiver on loopback getting the signed POST from tally-notifier, with the
# goal (docs/alerts.md) beside it; the last line is JSON with delivery_ms_p50 and
# delivery_ms_p99. COUNT alerts, one every INTERVAL_MS, across 10 accounts.
set -euo pipefail
source "$(dirname "$0")/../../scripts/lib.sh"
BUILD=${TALLY_BUILD:?run through scripts/bench}
COUNT=${COUNT:-300}
INTERVAL_MS=${INTERVAL_MS:-20}
WORK=$(mktemp -d /tmp/tally-bench-alerts.XXXXXX)
trap 'stop_test_services "$WORK"' EXIT
start_test_services "$WORK" "$BUILD"
DB="${TALLY_TEST_PG_URL%/*}/tally"
"$BUILD/ledger/tally-migrate" --database-url "$(pg_role_url "$DB" tally_owner)" --log-level warn
OUT=$(python3 "$TALLY_ROOT/tests/bench/alerts.py" "$DB" "$BUILD/notifier/tally-notifier" "$COUNT" "$INTERVAL_MS")
field() { python3 -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$OUT" "$1"; }
printf '%-44s %12s   %s\n' "figure" "measured" "goal (docs/alerts.md)"
printf '%-44s %12s   %s\n' "alerts sent / received" "$(field alerts) / $(field received)" "all"
printf '%-44s %12s   %s\n' "commit -> receiver p50 (ms)" "$(field delivery_ms_p50)" "-"
printf '%-44s %12s   %s\n' "commit -> receiver p99 (ms)" "$(field delivery_ms_p99)" "< 1000"
printf '%-44s %12s   %s\n' "commit -> receiver max (ms)" "$(field delivery_ms_max)" "-"
echo "$OUT"
