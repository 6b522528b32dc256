#!/usr/bin/env python3
"""tests/bench/alerts.py DB_URL NOTIFIER_BIN COUNT INTERVAL_MS — the latency
from an alert's commit to the webhook receiver getting it.

Each alert is committed on its own connection with the aggregator's own
statement (aggregator/store.c limits_sql inserts into alerts; sql/009's trigger
adds the delivery and the NOTIFY in that transaction). The clock starts just
before COMMIT is sent (so the figure can only be too high, never too low) and
stops when the loopback receiver has read the request. One tally-notifier,
one webhook destination per account (HTTP on loopback, signed). Prints one
JSON line."""
import ctypes
import ctypes.util
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration", "alerts"))
from alertlib import Receiver, start_notifier, wait_for  # noqa: E402

pq = ctypes.CDLL(ctypes.util.find_library("pq"))
pq.PQconnectdb.restype = ctypes.c_void_p
pq.PQconnectdb.argtypes = [ctypes.c_char_p]
pq.PQstatus.argtypes = [ctypes.c_void_p]
pq.PQexec.restype = ctypes.c_void_p
pq.PQexec.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
pq.PQresultStatus.argtypes = [ctypes.c_void_p]
pq.PQclear.argtypes = [ctypes.c_void_p]
pq.PQerrorMessage.restype = ctypes.c_char_p
pq.PQerrorMessage.argtypes = [ctypes.c_void_p]
pq.PQfinish.argtypes = [ctypes.c_void_p]
PGRES_COMMAND_OK = 1


def exec_ok(conn, sql):
    r = pq.PQexec(conn, sql.encode())
    ok = pq.PQresultStatus(r) in (PGRES_COMMAND_OK, 2)
    pq.PQclear(r)
    if not ok:
        raise RuntimeError(f"{sql}: {pq.PQerrorMessage(conn).decode()}")


def pct(v, p):
    s = sorted(v)
    return s[min(len(s) - 1, (len(s) * p + 99) // 100 - 1)]


def main():
    url, notifier_bin, count, interval_ms = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    os.environ["TALLY_NOTIFIER_BIN"] = notifier_bin
    work = os.environ.get("TALLY_TEST_WORK", "/tmp")
    rcv = Receiver()
    conn = pq.PQconnectdb(url.encode())
    if pq.PQstatus(conn) != 0:
        raise SystemExit("could not connect: " + pq.PQerrorMessage(conn).decode())
    exec_ok(conn, "INSERT INTO accounts (id, name) SELECT 'bench-' || i, 'bench' FROM generate_series(1, 10) i")
    exec_ok(conn, "INSERT INTO alert_destinations (id, account_id, kind, url, secret, created_by)"
                  f" SELECT 'dst-' || i, 'bench-' || i, 'webhook', 'http://127.0.0.1:{rcv.port}/ok/' || i,"
                  " 'whsec_bench', 'bench' FROM generate_series(1, 10) i")
    smtp_port = 9  # no email destinations here
    n = start_notifier(url, work, smtp_port, ["--log-level", os.environ.get("BENCH_LOG", "warn")], name="bench-notifier")
    time.sleep(1.0)
    committed = {}
    for i in range(count):
        acct = f"bench-{i % 10 + 1}"
        exec_ok(conn, "BEGIN")
        exec_ok(conn, "INSERT INTO alerts (key_id, day, threshold_pct, account_id, spend_nanodollars, limit_nanodollars)"
                      f" VALUES ('bench-key-{i}', (now() AT TIME ZONE 'UTC')::date, 50, '{acct}', 505000, 1010000)"
                      " ON CONFLICT (key_id, day, threshold_pct) DO NOTHING")
        t = time.time()
        exec_ok(conn, "COMMIT")
        committed[f"bench-key-{i}"] = t
        time.sleep(interval_ms / 1000)
    import json
    wait_for(lambda: len(rcv.requests()) >= count, 30)
    lat = []
    for g in rcv.requests():
        ev = json.loads(g["body"])
        if ev["key"] in committed:
            lat.append((g["at"] - committed[ev["key"]]) * 1000)
    if os.environ.get("BENCH_DEBUG"):
        idx = sorted(((g["at"] - committed[json.loads(g["body"])["key"]]) * 1000, json.loads(g["body"])["key"])
                     for g in rcv.requests())
        print(idx[-8:], file=sys.stderr)
    n.stop()
    rcv.stop()
    pq.PQfinish(conn)
    if len(lat) != count:
        print(f"received {len(lat)} of {count}", file=sys.stderr)
    print(json.dumps({"alerts": count, "received": len(lat), "interval_ms": interval_ms,
                      "delivery_ms_p50": round(pct(lat, 50), 1) if lat else None,
                      "delivery_ms_p99": round(pct(lat, 99), 1) if lat else None,
                      "delivery_ms_max": round(max(lat), 1) if lat else None}))


if __name__ == "__main__":
    main()
