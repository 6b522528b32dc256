#!/usr/bin/env python3
"""tests/bench/paced_get.py PORT PATH SECRET RATE SECONDS — GETs PATH on 127.0.0.1:PORT
at a fixed RATE per second (an open loop: each request is due at its moment, and its
latency counts from that moment, so a stall shows in every request it delays) on one
kept-alive connection, as a dashboard or an agent polling its spend does. Prints
"P50_MS P99_MS NON2XX" (milliseconds, from integer microseconds)."""
import http.client
import sys
import time


def main():
    port, path, secret, rate, seconds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
    conn = http.client.HTTPConnection("127.0.0.1", int(port), timeout=30)
    headers = {"Authorization": "Bearer " + secret}
    n = rate * seconds
    step_ns = 1_000_000_000 // rate
    start = time.monotonic_ns()
    lat_us, bad = [], 0
    for i in range(n):
        due = start + i * step_ns
        now = time.monotonic_ns()
        if now < due:
            time.sleep((due - now) / 1e9)
        conn.request("GET", path, headers=headers)
        r = conn.getresponse()
        r.read()
        if r.status // 100 != 2:
            bad += 1
        lat_us.append((time.monotonic_ns() - due) // 1000)
    lat_us.sort()
    p50, p99 = lat_us[len(lat_us) // 2], lat_us[(len(lat_us) * 99) // 100]
    print(f"{p50 // 1000}.{p50 % 1000:03d} {p99 // 1000}.{p99 % 1000:03d} {bad}")


if __name__ == "__main__":
    main()
