#!/usr/bin/env python3
"""tests/bench/noisy_exec.py PORT SANDBOX SECRET CONCURRENCY OUT — a noisy neighbour:
CONCURRENCY threads, each keeping one exec of `sleep 2` in SANDBOX going through
tally-api on 127.0.0.1:PORT (a kept-alive connection each, a new exec as soon as the
last one answers, a 429 retried after its Retry-After), until SIGTERM; then writes
"DONE_200 REFUSED_429 OTHER" to OUT.

One process with kept-alive connections, so that what the neighbour costs this
machine is tally's work and the sandbox's, not a shell forking a client per request."""
import http.client
import json
import signal
import sys
import threading
import time

stop = threading.Event()
counts = {"200": 0, "429": 0, "other": 0}
lock = threading.Lock()


def count(status):
    key = str(status) if status in (200, 429) else "other"
    with lock:
        counts[key] += 1


def run(port, sandbox, secret):
    body = json.dumps({"command": "sleep 2", "timeout_ms": 30000})
    headers = {"Authorization": "Bearer " + secret, "Content-Type": "application/json"}
    conn = None
    while not stop.is_set():
        try:
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
            conn.request("POST", "/v1/sandboxes/%s/exec" % sandbox, body=body, headers=headers)
            r = conn.getresponse()
            r.read()
            count(r.status)
            if r.status == 429:
                stop.wait(float(r.getheader("Retry-After", "1")))
        except (OSError, http.client.HTTPException):
            count(0)
            if conn is not None:
                conn.close()
            conn = None
            stop.wait(0.1)


def main():
    port, sandbox, secret, n, out = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    threads = [threading.Thread(target=run, args=(port, sandbox, secret), daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    while not stop.is_set():
        time.sleep(0.1)
    with lock:
        line = "%d %d %d\n" % (counts["200"], counts["429"], counts["other"])
    with open(out, "w") as f:
        f.write(line)


if __name__ == "__main__":
    main()
