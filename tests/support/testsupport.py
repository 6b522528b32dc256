"""testsupport.py — what the Python integration tests share with the C ones
(support.h): a port for a server started later, waiting out a UTC day that
would end during a test, and a database URL as one of tally's PostgreSQL roles.
Imported with tests/support on sys.path."""
import random
import re
import socket
import sys
import time

_given = set()


def port_range():
    """The range free_port picks from, (lo, hi) inclusive: as support.h's
    test_port_range, below the kernel's ephemeral range."""
    low, high = 32768, 60999
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            l, h = (int(x) for x in f.read().split()[:2])
        if 0 < l <= h <= 65535:
            low, high = l, h
    except (OSError, ValueError):
        pass
    if low - 1 - 20000 >= 1000:
        return 20000, low - 1
    if low - 1 - 1024 >= 1000:
        return 1024, low - 1
    if 65535 - (high + 1) >= 1000:
        return high + 1, 65535
    print(f"warning: the ephemeral port range {low}-{high} leaves no ports outside it", file=sys.stderr)
    return 1024, 65535


def role_url(url, role):
    """url (postgresql://USER@host:port/db) as role: what a tally program started
    by a test logs in as (support.h's test_role_url; the passwords are in the
    PGPASSFILE scripts/lib.sh's start_test_pg exports)."""
    out, n = re.subn(r"^(postgres(?:ql)?://)[^@/]*@", lambda m: m.group(1) + role + "@", url, count=1)
    if n != 1:
        raise SystemExit(f"FAIL: {url} names no user")
    return out


def free_port():
    """A TCP port on 127.0.0.1 for a server started later (`scripts/up` with
    TALLY_PG_PORT, a daemon's --metrics-port): random below the ephemeral range
    (no outgoing connection takes it meanwhile), free now (bound without
    SO_REUSEADDR and released), never one this process handed out before."""
    lo, hi = port_range()
    rng = random.SystemRandom()
    for _ in range(1000):
        p = rng.randint(lo, hi)
        if p in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", p))
            except OSError:
                continue
        _given.add(p)
        return p
    raise SystemExit(f"FAIL: no free port on 127.0.0.1 in {lo}-{hi} after 1000 tries")


def wait_out_utc_day(run_s):
    """For a test whose checks need one UTC day throughout (a daily limit, the
    warning whose horizon ends at midnight): when the current UTC day ends
    within run_s seconds, say so and sleep until one second into the next."""
    now = time.time()
    left = 86400 - now % 86400
    if left > run_s:
        return
    print(f"the UTC day ends in {left:.0f} s, within this test's {run_s} s: waiting for the next", flush=True)
    time.sleep(left + 1)


def pid_alive(pid):
    """The process runs. A zombie does not: it has ended and waits for its parent
    to reap it, which for a daemon that outlived the script that started it is
    PID 1 — on a loaded machine that can take seconds (scripts/lib.sh pid_alive)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in f)
    except FileNotFoundError:
        return False
