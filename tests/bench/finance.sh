#!/usr/bin/env bash
# tests/bench/finance.sh — closing a month and exporting its invoices, with the
# goal (docs/benchmarks.md) beside the figures; the last line is JSON.
#
#  rows               usage_hourly rows of the month: 2,000 sandboxes in 200 accounts (10 each,
#                     2 API keys per account), every hour of last month (UTC); each sandbox-hour
#                     running (CPU and memory) or, one in five, paused (storage). Written straight
#                     into usage_hourly (the rollup triggers run as for the aggregator's batches):
#                     the close, not the pipeline, is measured here (scripts/bench aggregator is the
#                     pipeline's)
#  preview_s          finance.invoices (the open month as a preview) read once before the close
#  close_s            `tally-admin close-month YYYY-MM` (the real binary, one transaction)   goal < 10 s
#  export_rows        every invoice line and per-key line of the month, as the finance role
#                     reads them: COPY (SELECT * FROM finance.invoice_lines ...) TO STDOUT
#                     WITH (FORMAT csv, HEADER), and the same of finance.invoice_key_lines
#  export_rows_per_s  export_rows / the time of both COPYs
#  sandbox_daily_rows_per_s  COPY of finance.sandbox_daily for the month (2,000 x days rows)
set -euo pipefail
source "$(dirname "$0")/../../scripts/lib.sh"
BUILD=${TALLY_BUILD:?run through scripts/bench}
ACCOUNTS=${ACCOUNTS:-200}
PER_ACCOUNT=${PER_ACCOUNT:-10}
WORK=$(mktemp -d /tmp/tally-bench-finance.XXXXXX)
cleanup() { stop_test_services "$WORK"; }
trap cleanup EXIT
start_test_services "$WORK" "$BUILD"
DB="${TALLY_TEST_PG_URL%/*}/tally"
"$BUILD/ledger/tally-migrate" --database-url "$(pg_role_url "$DB" tally_owner)" --log-level warn
psql() { "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 "$DB" "$@"; }
now_ns() { date +%s%N; }
secs() { local ms=$(( ($2 - $1) / 1000000 )); printf '%d.%03d' $((ms / 1000)) $((ms % 1000)); }

MONTH=$(date -u -d "$(date -u +%Y-%m-01) -1 month" +%Y-%m)
SANDBOXES=$((ACCOUNTS * PER_ACCOUNT))
say "generating $SANDBOXES sandboxes in $ACCOUNTS accounts, every hour of $MONTH"
T0=$(now_ns)
psql <<SQL
INSERT INTO accounts (id, name) SELECT format('acct-%s', a), format('Account %s', a) FROM generate_series(1, $ACCOUNTS) a;
INSERT INTO sandboxes (id, account_id, key_id, vcpus, mem_size_bytes, disk_size_bytes, labels, state)
SELECT format('sb-%s', s), format('acct-%s', (s - 1) / $PER_ACCOUNT + 1), format('key-%s-%s', (s - 1) / $PER_ACCOUNT + 1, s % 2),
       2, 4294967296, 10737418240, jsonb_build_object('team', format('team-%s', s % 7)), 'stopped'
  FROM generate_series(1, $SANDBOXES) s;
SQL
# One statement per day, so each trigger's transition table stays a day's rows.
DAYS=$(date -u -d "$MONTH-01 +1 month -1 day" +%d)
for d in $(seq 0 $((10#$DAYS - 1))); do
  psql <<SQL
INSERT INTO usage_hourly (sandbox_id, hour, account_id, key_id, cpu_ns, mem_byte_ns, storage_byte_ns, mem_peak_bytes)
SELECT s.id, h.hour, s.account_id, s.key_id,
       CASE WHEN paused THEN 0 ELSE ((hashint4(hashn) & 2147483647)::bigint % 7200) * 1000000000 END,
       CASE WHEN paused THEN 0 ELSE s.mem_size_bytes::numeric * 3600000000000 END,
       CASE WHEN paused THEN (s.mem_size_bytes + s.disk_size_bytes)::numeric * 3600000000000 ELSE 0 END,
       s.mem_size_bytes / 2
  FROM sandboxes s
 CROSS JOIN generate_series(timestamptz '$MONTH-01 00:00:00+00' + interval '$d days',
                            timestamptz '$MONTH-01 00:00:00+00' + interval '$d days' + interval '23 hours',
                            interval '1 hour') AS h(hour)
 CROSS JOIN LATERAL (SELECT (extract(epoch FROM h.hour)::bigint / 3600 + replace(s.id, 'sb-', '')::int) % 5 = 0 AS paused,
                            (extract(epoch FROM h.hour)::bigint / 3600 * 31 + replace(s.id, 'sb-', '')::int)::int AS hashn) p;
SQL
done
psql -c "VACUUM ANALYZE"
ROWS=$(psql -tAc "SELECT count(*) FROM usage_hourly")
T1=$(now_ns)
say "generated $ROWS rows in $(secs "$T0" "$T1") s"
[ "$ROWS" -eq $((SANDBOXES * 10#$DAYS * 24)) ] || die "want $((SANDBOXES * 10#$DAYS * 24)) usage rows, have $ROWS"

say "preview of $MONTH (finance.invoices before the close)"
T0=$(now_ns)
PREVIEW=$(psql -tAc "SELECT count(*) FROM finance.invoices WHERE month = '$MONTH-01' AND status = 'preview'")
T1=$(now_ns)
PREVIEW_NS=$((T1 - T0))
say "previewed in $(secs 0 "$PREVIEW_NS") s"
[ "$PREVIEW" -eq "$ACCOUNTS" ] || die "want $ACCOUNTS preview invoices, have $PREVIEW"

say "closing $MONTH with tally-admin"
T0=$(now_ns)
"$BUILD/api/tally-admin" --database-url "$(pg_role_url "$DB" tally_admin)" close-month "$MONTH" >"$WORK/close.out"
T1=$(now_ns)
CLOSE_NS=$((T1 - T0))
cat "$WORK/close.out" >&2
CLOSED=$(psql -tAc "SELECT count(*) FROM closed_invoices WHERE month = '$MONTH-01'")
[ "$CLOSED" -eq "$ACCOUNTS" ] || die "want $ACCOUNTS closed invoices, have $CLOSED"
say "closed in $(secs 0 "$CLOSE_NS") s"
BAD=$(psql -tAc "SELECT count(*) FROM closed_invoices i CROSS JOIN LATERAL
                   (SELECT sum(amount_cents) AS c, sum(amount_nanodollars) AS n FROM closed_invoice_lines l
                     WHERE l.account_id = i.account_id AND l.month = i.month) s
                  WHERE (i.total_cents, i.total_nanodollars) IS DISTINCT FROM (s.c, s.n)")
[ "$BAD" -eq 0 ] || die "$BAD closed invoices differ from the sum of their lines"

say "exporting every invoice line of $MONTH as CSV"
T0=$(now_ns)
psql -c "COPY (SELECT * FROM finance.invoice_lines WHERE month = '$MONTH-01' ORDER BY account_id, line_no) TO STDOUT WITH (FORMAT csv, HEADER)" >"$WORK/lines.csv"
psql -c "COPY (SELECT * FROM finance.invoice_key_lines WHERE month = '$MONTH-01' ORDER BY account_id, key_id, meter) TO STDOUT WITH (FORMAT csv, HEADER)" >"$WORK/key_lines.csv"
T1=$(now_ns)
EXPORT_NS=$((T1 - T0))
EXPORT_ROWS=$(( $(wc -l <"$WORK/lines.csv") - 1 + $(wc -l <"$WORK/key_lines.csv") - 1 ))
T0=$(now_ns)
psql -c "COPY (SELECT * FROM finance.sandbox_daily WHERE day >= '$MONTH-01' AND day < date '$MONTH-01' + interval '1 month') TO STDOUT WITH (FORMAT csv, HEADER)" >"$WORK/sandbox_daily.csv"
T1=$(now_ns)
SD_ROWS=$(( $(wc -l <"$WORK/sandbox_daily.csv") - 1 ))
SD_NS=$((T1 - T0))
[ "$SD_ROWS" -eq $((SANDBOXES * 10#$DAYS)) ] || die "want $((SANDBOXES * 10#$DAYS)) sandbox-day rows, have $SD_ROWS"

EXPORT_RPS=$(( EXPORT_ROWS * 1000000000 / EXPORT_NS ))
SD_RPS=$(( SD_ROWS * 1000000000 / SD_NS ))
CLOSE_S=$(secs 0 "$CLOSE_NS")
GOAL=$([ "$CLOSE_NS" -lt 10000000000 ] && echo met || echo MISSED)
printf '%-44s %14s   %s\n' "figure" "measured" "goal"
printf '%-44s %14s   %s\n' "usage_hourly rows ($MONTH)" "$ROWS" "2,000 sandboxes x 200 accounts x hours"
printf '%-44s %14s   %s\n' "preview of the month, s" "$(secs 0 "$PREVIEW_NS")" "-"
printf '%-44s %14s   %s\n' "close-month, s" "$CLOSE_S" "< 10 ($GOAL)"
printf '%-44s %14s   %s\n' "invoice + key lines exported" "$EXPORT_ROWS" "-"
printf '%-44s %14s   %s\n' "export rows/s (COPY ... FORMAT csv)" "$EXPORT_RPS" "-"
printf '%-44s %14s   %s\n' "sandbox_daily rows/s ($SD_ROWS rows)" "$SD_RPS" "-"
printf '{"rows": %s, "accounts": %s, "sandboxes": %s, "preview_s": %s, "close_s": %s, "export_rows": %s, "export_rows_per_s": %s, "sandbox_daily_rows": %s, "sandbox_daily_rows_per_s": %s}\n' \
  "$ROWS" "$ACCOUNTS" "$SANDBOXES" "$(secs 0 "$PREVIEW_NS")" "$CLOSE_S" "$EXPORT_ROWS" "$EXPORT_RPS" "$SD_ROWS" "$SD_RPS"
