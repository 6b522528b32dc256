#!/usr/bin/env python3
"""streamgen.py: a seeded generator of `usage` message streams, from the spec.

Writes one message per line as `ACCOUNT<TAB>JSON`: the partition key (the
account, docs/events.md) and the message's bytes, in the order a producer
sends them; the messages of one account keep their order through a partition.

Every message is one docs/events.md allows an honest vmm and collector to
send: a `created` event before a sandbox's first reading; samples with
cumulative CPU and held counters (`running_ns`, `paused_ns`) consistent with
the sandbox's vCPUs and the time since its `created` moment; `paused` and
`resumed` at the moments themselves; epochs raised only after a `restarted`
event announced them (the CPU counter restarts from zero, the held counters
do not); a seq that rolls into the next generation; the vmm's `stopped`
event with or without its optional fields, and the collector's final sample,
in either order; duplicates and late samples (harmless: cumulative
counters); optional fields present or absent. Streams end in the recent
past of --now-ns and cross UTC hour and day boundaries. About one sandbox in
five has a host clock that is off for about a third of its readings (samples
and the `stopped` event): skewed by minutes, dated 300 to 390 days back
(both within the aggregator's bounds), days to years ahead or more than 402
days behind (beyond them: not trusted for time), or outside the spec's
2020..2200 (a dead letter). Wrong clocks are drawn from a generator of their
own, so a seed's lives and counters are what they were without them; so
are sizes that change during a life (the disk bytes used, for about one
sandbox in seven, and the memory size, for one in twenty).

Integers only. Standard library only; it never imports tally's code.
"""
import argparse
import heapq
import json
import random
import sys
import time

NS = 1_000_000_000
HOUR = 3600 * NS
GIB = 1 << 30
GEN_EPOCH_NS = 1_699_920_000 * NS  # 2023-11-14 00:00 UTC
DAY = 24 * HOUR
# Differences from the docs known and reported, whose fix is not in yet:
# the generator does not draw what would show them (each has its minimal
# case in tests/reference/corpus/open/, which the fixed-seed pass does not
# replay). Empty this set, and move the case to corpus/, with the fix.
#   untrusted_first_reading: a sandbox's first reading dated beyond the
#   aggregator's bounds sets the fold state's wall time to the aggregator's
#   clock, not to the `created` moment (docs/events.md, "Clocks"), so a
#   `stopped` event dated more than an hour before the aggregator reads it
#   is refused as behind, and the interval rule bills nothing until the
#   readings pass that clock.
OPEN = set()
WALL_MIN = 1_577_836_800 * NS      # 2020-01-01: docs/events.md's range of wall_ns
WALL_MAX = 7_258_118_400 * NS      # 2200-01-01


class Life:
    """One sandbox's life, drawn in order; readings carry its true counters."""

    def __init__(self, rng, sid, account, key, host, created_ns, end_ns):
        self.rng = rng
        self.sid, self.account, self.key, self.host = sid, account, key, host
        self.vcpus = rng.choice([1, 1, 2, 2, 4, 8, 16, rng.randint(1, 1024)])
        self.mem = rng.choice([256 << 20, GIB, 2 * GIB, 4 * GIB, 8 * GIB, rng.randint(1, 64 * GIB)])
        self.disk = rng.choice([0, 0, rng.randint(1, 10 * GIB)])
        self.disk0 = self.disk
        self.created_ns = created_ns
        self.end_ns = end_ns
        self.t = created_ns
        self.state = "running"
        self.cpu_total = 0      # CPU since created, all epochs
        self.cpu_epoch = 0      # the epoch's counter
        self.running = 0
        self.paused = 0
        self.epoch = 1
        # the collector's generation follows the clock's hours since
        # 2023-11-14 (docs/events.md, "Sequence numbers"), + 1,024 for a
        # host that lost its folder
        self.gen = (created_ns - GEN_EPOCH_NS) // HOUR + rng.choice([0, 0, 1, 1024])
        self.n = rng.choice([0, 0, 0, 0xFFFFFFFF - rng.randint(2, 20)])
        self.busy = rng.choice([0, 1, rng.randint(1, 1000)])  # per mille of the vCPUs
        self.events = []        # (wall_ns, order, message dict)
        self.samples = []       # the samples sent, for duplicates
        self.hostile = False
        self.parent = None      # the sandbox this one is a fork's copy of
        self.can_fork = True
        self.forks = []         # (moment, copies) of its `forked` events
        self.now = end_ns       # the clock the stream is drawn before (generate sets it)
        # the host's wall clock: right, or, for some readings, skewed within
        # the aggregator's bounds, or beyond them (docs/events.md, "Clocks")
        # (drawn from a generator of their own: a seed draws the same
        # lives, counters and order as before clocks were drawn)
        self.crng = random.Random(f"clock/{sid}/{created_ns}")
        self.clock = self.crng.choice(["right"] * 20 + ["skew", "ahead", "behind", "old", "outside"])
        # sizes that change during the life (drawn from the same side
        # generator): the disk bytes used, at about every reading, and the
        # memory size, now and then
        self.disk_moves = self.crng.random() < 0.15
        self.mem_moves = self.crng.random() < 0.05

    def advance(self, dt):
        if self.state == "running":
            self.running += dt
            cap = self.vcpus * dt
            use = cap * self.busy // 1000
            if self.rng.random() < 0.3:
                use = self.rng.randint(0, cap)
            self.cpu_total += use
            self.cpu_epoch += use
        elif self.state == "paused":
            self.paused += dt
        self.t += dt

    def wall(self):
        """The wall time a reading carries at the true moment self.t: the
        true one, or a wrong one for about a third of the readings of a host
        whose clock is off. Beyond the bounds by days (the aggregator's clock
        runs a round later than the clock the stream was drawn before, and a
        corpus case is replayed moved by whole days): ahead by 2 days to 10
        years, behind by more than 402 days (back to 2020); within them:
        skewed by up to 4 minutes either way, or a reading from 300 to 390
        days ago (as a spool could send); outside the spec's range (before
        2020, from 2200): a dead letter."""
        rng = self.crng
        first = not self.samples  # (the `stopped` event and final sample of a life with none: both)
        if self.clock == "right" or rng.random() < 0.65:
            return self.t
        # A first reading not trusted for time is placed at the aggregator's
        # clock, over the span of its held time: the model knows that clock
        # only to be no earlier than the round's, so it merges the hours from
        # the one before the clock's (refbill.py's `late` line), which a span
        # of an hour or more can reach back past. Not drawn (docs/testing.md).
        if first and self.clock in ("ahead", "behind") and self.running + self.paused >= HOUR - 60 * NS:
            return self.t
        if self.clock == "skew":
            return self.t + rng.randint(-240 * NS, 240 * NS)
        if self.clock == "ahead":
            return self.now + rng.choice([rng.randint(2 * DAY, 3 * DAY), rng.randint(2 * DAY, 3650 * DAY)])
        if self.clock == "behind":
            return rng.randint(WALL_MIN, self.now - 402 * DAY)
        if self.clock == "old":
            return self.t - rng.randint(300 * DAY, 390 * DAY)
        return rng.choice([rng.randint(0, WALL_MIN - 1), rng.randint(WALL_MAX, (1 << 63) - 1)])

    def emit(self, msg, at=None):
        """at: the true moment (the order messages are sent in), when the
        message's wall time is not it."""
        self.events.append((msg["wall_ns"] if at is None else at, len(self.events), msg))

    def next_seq(self):
        self.n += 1
        if self.n > 0xFFFFFFFF:
            self.gen += 1
            self.n = 1
        return (self.gen << 32) | self.n

    def resize(self):
        """The sizes a reading carries from now on (see __init__)."""
        c = self.crng
        if self.disk_moves and c.random() < 0.8:
            self.disk = max(0, self.disk + c.randint(-GIB // 4, GIB // 2))
        if self.mem_moves and c.random() < 0.3:
            self.mem = c.choice([256 << 20, GIB, 2 * GIB, 4 * GIB, c.randint(1, 64 * GIB)])

    def sample(self, state=None, final=False):
        rng = self.rng
        self.resize()
        m = {"v": 1, "type": "sample", "sandbox": self.sid, "account": self.account, "key": self.key,
             "epoch": self.epoch, "seq": self.next_seq(), "wall_ns": self.wall(), "state": state or self.state,
             "cpu_ns": self.cpu_epoch, "mem_size_bytes": self.mem, "vcpus": self.vcpus,
             "running_ns": self.running, "paused_ns": self.paused}
        if self.old:
            del m["running_ns"], m["paused_ns"]
        if rng.random() < 0.8:
            m["host"] = self.host
        # (the coin drawn as before sizes moved; disk in use is always sent)
        if self.disk0 or rng.random() < 0.5 or self.disk:
            m["disk_bytes"] = self.disk
        if rng.random() < 0.5:
            m["mono_ns"] = self.t - self.created_ns + 10 * NS
        if rng.random() < 0.5:
            m["mem_bytes"] = rng.randint(0, self.mem)
            m["mem_peak_bytes"] = m["mem_bytes"] + rng.randint(0, 1000)
        if rng.random() < 0.2:
            m["net_rx_bytes"] = rng.randint(0, 10**9)
            m["net_tx_bytes"] = rng.randint(0, 10**9)
        if final:
            m["final"] = True
        self.emit(m, self.t)
        self.samples.append(m)

    def forge(self):
        """A message the docs make a dead letter, right after a real sample:
        from another host, a seq generation or an epoch more than 65,536
        above the last billed, more CPU than the vCPUs could run, an epoch
        its host never announced."""
        rng = self.rng
        last = self.samples[-1]
        m = dict(last)
        kind = rng.choice(["host", "seq_jump", "impossible", "epoch_jump", "unannounced"])
        m["seq"] = last["seq"] + 1
        if kind == "host":
            m["host"] = "forged-" + self.host
        elif kind == "seq_jump":
            m["seq"] = ((self.gen + 65537 + rng.randint(0, 1 << 20)) << 32) | 1
        elif kind == "unannounced":
            # an epoch its host never announced: held, then dead-lettered
            # after provenance_grace_ms
            m["epoch"] = self.epoch + 1000 + rng.randint(0, 1000)
            m["cpu_ns"] = 0
        elif kind == "impossible":
            m["cpu_ns"] = last["cpu_ns"] + self.vcpus * (self.t - self.created_ns + 3 * HOUR)
        else:
            m = {"v": 1, "type": "restarted", "host": self.host, "sandbox": self.sid, "account": self.account,
                 "key": self.key, "epoch": self.epoch + 65537 + rng.randint(0, 1000), "wall_ns": self.t,
                 "reason": "restore"}
        self.emit(m, self.t)

    def lifecycle(self, typ):
        self.emit({"v": 1, "type": typ, "host": self.host, "sandbox": self.sid, "account": self.account,
                   "wall_ns": self.t})

    def draw(self):
        rng = self.rng
        c = {"v": 1, "type": "created", "host": self.host, "sandbox": self.sid, "account": self.account,
             "key": self.key, "wall_ns": self.created_ns, "mem_size_bytes": self.mem, "vcpus": self.vcpus}
        if rng.random() < 0.7:
            c["epoch"] = 1
        if rng.random() < 0.5:
            c["backend"] = rng.choice(["process", "qemu"])
        if rng.random() < 0.5:
            c["disk_size_bytes"] = self.disk + rng.randint(0, GIB)
        if rng.random() < 0.3:
            c["labels"] = {"team": "t" + str(rng.randint(0, 9))}
        if self.parent:
            c["parent"] = self.parent
        self.emit(c)
        restarted = False
        self.late_created = rng.random() < 0.1
        # an older collector and vmm: no held counters (the interval rule)
        self.old = rng.random() < 0.1
        nsamples = rng.choice([0, 1, 2, rng.randint(3, 12), rng.randint(3, 40)])
        gaps = [rng.choice([rng.randint(NS // 1000, 2 * NS), rng.randint(NS, 120 * NS),
                            rng.randint(60 * NS, 2 * HOUR)]) for _ in range(nsamples + 1)]
        for i in range(nsamples):
            dt = gaps[i]
            if self.t + dt + gaps[-1] >= self.end_ns:
                break
            # a pause or resume inside the gap, at its own moment
            if rng.random() < 0.25 and dt > 2:
                first = rng.randint(1, dt - 1)
                self.advance(first)
                if self.state == "running":
                    self.state = "paused"
                    self.lifecycle("paused")
                else:
                    self.state = "running"
                    self.lifecycle("resumed")
                dt -= first
            self.advance(dt)
            if rng.random() < 0.08:
                # the counter may have restarted: a new epoch, announced first
                self.epoch += 1
                self.cpu_epoch = 0
                restarted = True
                self.emit({"v": 1, "type": "restarted", "host": self.host, "sandbox": self.sid,
                           "account": self.account, "key": self.key, "epoch": self.epoch, "wall_ns": self.t,
                           "reason": rng.choice(["counter_back", "cgroup_recreated", "restore"])})
                # the new cgroup runs a little before its first reading
                self.advance(rng.randint(0, NS))
            self.sample()
            if self.hostile and rng.random() < 0.1:
                self.forge()
            if self.can_fork and self.state == "running" and rng.random() < 0.04:
                # a fork: the vmm's `forked` event; each copy is a sandbox of
                # its own with its own `created` event (parent = this one)
                n = rng.randint(1, 3)
                self.emit({"v": 1, "type": "forked", "host": self.host, "sandbox": self.sid,
                           "account": self.account, "wall_ns": self.t, "fork_count": n})
                self.forks.append((self.t, n))
        if rng.random() < 0.75:
            dt = gaps[-1]
            if self.t + dt < self.end_ns:
                self.advance(dt)
            self.state = "stopped"
            # a lease's end: the sandbox's own init ended it at its deadline,
            # and the stop reaches the topic dated then, after a final sample
            # dated up to 50 minutes later that carries the running time only
            # up to the deadline (docs/registry.md)
            lease = rng.random() < 0.1
            wall = self.wall()
            if "stopped_behind_new_epoch" in OPEN and self.epoch > 1 and wall < self.t - HOUR:
                wall = self.t
            st = {"v": 1, "type": "stopped", "sandbox": self.sid, "account": self.account, "wall_ns": wall,
                  "cpu_ns": self.cpu_epoch, "running_ns": self.running, "paused_ns": self.paused}
            if self.old:
                del st["running_ns"], st["paused_ns"]
            if rng.random() < 0.5:
                st["host"] = self.host
            if restarted or rng.random() < 0.5:
                st["epoch"] = self.epoch
            if rng.random() < 0.5:
                st["key"] = self.key
            if rng.random() < 0.5:
                st["vcpus"] = self.vcpus
                st["mem_size_bytes"] = self.mem
            if rng.random() < 0.5 and not (self.disk == 0 and self.disk_moves and "stopped_disk_zero" in OPEN):
                st["disk_bytes"] = self.disk
            final = rng.random() < 0.6
            if lease:
                end_t = self.t
                self.t = min(self.end_ns - 1, self.t + rng.randint(1, 50 * 60 * NS))
                self.sample(state="stopped", final=True)
                self.t = end_t
                self.emit(st, self.t)  # last, though dated before the sample
            elif final and rng.random() < 0.5:
                self.sample(state="stopped", final=True)
                self.emit(st, self.t)
            else:
                self.emit(st, self.t)
                if final:
                    self.sample(state="stopped", final=True)


def finish(rng, life):
    """A life's messages in the order they reach the topic."""
    ev = life.events
    if life.late_created:
        # the collector's producer was first: the `created` event reaches
        # the topic after the sandbox's first readings (held, then billed)
        k = 1
        while k < len(ev) and k < 3 and ev[k][2]["type"] in ("sample", "stopped"):
            k += 1
        ev.insert(k - 1, ev.pop(0))
    for k in range(len(ev) - 1):
        # a `restarted` announcement after the sample it announces (held)
        if ev[k][2]["type"] == "restarted" and ev[k + 1][2]["type"] == "sample" and rng.random() < 0.3:
            ev[k], ev[k + 1] = ev[k + 1], ev[k]


def generate(seed, now_ns, nsandboxes=None, prefix="", hostile=True, clock_ns=None):
    """clock_ns: the aggregator's clock, at the earliest, that wrong clocks
    are drawn beyond (default now_ns; a stream drawn to end before another
    moment, as pack.py's month ends, is still read now)."""
    clock_ns = now_ns if clock_ns is None else clock_ns
    rng = random.Random(seed)
    if nsandboxes is None:
        nsandboxes = rng.randint(1, 200)
    # whole hours before the clock's hour: a seed draws the same stream,
    # to the hour's split, whenever it runs
    end = now_ns - now_ns % HOUR - 120 * NS
    span = rng.choice([2 * HOUR, 6 * HOUR, 26 * HOUR])
    start = end - span
    naccounts = rng.randint(1, max(1, min(20, nsandboxes)))
    accounts = [f"{prefix}acct-{i}" for i in range(naccounts)]
    keys = {a: [f"{a}.key-{j}" for j in range(rng.randint(1, 3))] for a in accounts}
    hosts = [f"{prefix}host-{i}" for i in range(rng.randint(1, 5))]
    lives = []
    for i in range(nsandboxes):
        a = rng.choice(accounts)
        life = Life(rng, f"{prefix}sb-{i}", a, rng.choice(keys[a]), rng.choice(hosts),
                    rng.randint(start, end - 10 * NS), end)
        life.hostile, life.now = hostile, clock_ns
        life.draw()
        todo = [life]
        for t, n in life.forks:
            for _ in range(min(n, 9 - len(todo))):
                child = Life(rng, f"{life.sid}.f{len(todo) - 1}", a, life.key, life.host, t, end)
                child.hostile, child.can_fork, child.parent, child.now = hostile, False, life.sid, clock_ns
                child.draw()
                todo.append(child)
        for life in todo:
            finish(rng, life)
            lives.append(life)
    # Per account, the sandboxes' messages interleaved by time (each
    # sandbox's own order kept), then duplicates and late samples.
    out = []
    for a in accounts:
        # merge by time, keeping each sandbox's own order
        own = [[(w, m) for w, _, m in life.events] for life in lives if life.account == a]
        msgs = [m for _, m in heapq.merge(*own, key=lambda x: x[0])]
        placed = []
        late = []
        for m in msgs:
            placed.append(m)
            if m["type"] == "sample" and rng.random() < 0.1:
                if rng.random() < 0.5:
                    placed.append(m)  # a duplicate, at once
                else:
                    late.append(m)    # resent later
        for m in late:
            at = next(i for i, p in enumerate(placed) if p is m)
            placed.insert(rng.randint(at + 1, len(placed)), m)
        for m in placed:
            out.append((a, m))
    # accounts interleave at random (their partitions are independent)
    order = []
    queues = {a: [m for acc, m in out if acc == a] for a in accounts}
    queues = {a: q for a, q in queues.items() if q}
    while queues:
        a = rng.choice(sorted(queues))
        order.append((a, queues[a].pop(0)))
        if not queues[a]:
            del queues[a]
    return order


def main():
    ap = argparse.ArgumentParser(description="Writes a seeded stream of usage messages (ACCOUNT<TAB>JSON lines).")
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--now-ns", type=int, default=None, help="the clock the stream ends before (default: now)")
    ap.add_argument("--sandboxes", type=int, default=None, help="sandboxes (default: 1..200 from the seed)")
    ap.add_argument("--honest", action="store_true", help="no forged messages (dead letters)")
    ap.add_argument("--prefix", default="", help="prefix of every id (to run several streams in one ledger)")
    a = ap.parse_args()
    now = a.now_ns if a.now_ns is not None else time.time_ns()
    w = sys.stdout
    for acct, m in generate(a.seed, now, a.sandboxes, a.prefix, not a.honest):
        w.write(acct + "\t" + json.dumps(m, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
