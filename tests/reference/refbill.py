#!/usr/bin/env python3
"""refbill.py: a reference biller, written from docs/events.md and
docs/billing.md alone (never from tally's code), to check tally-aggregator's
ledger against.

Input (a file or stdin): `ACCOUNT<TAB>JSON` lines, the `usage` messages in the
order the aggregator reads them (streamgen.py writes them). The messages of
one account are read in order; accounts are independent. A usage batch
(format v2, docs/events.md "Usage batches") is a line `ACCOUNT<TAB>v2:HEX`,
its bytes in hex; its samples are read in order, and its refused samples make
one dead letter of the line (the class of the first).

Output, sorted, one line each:
  usage SANDBOX HOUR_UNIX_S CPU_NS MEM_BYTE_NS STORAGE_BYTE_NS   (rows with any usage)
  spend KEY YYYY-MM-DD CPU_RATED MEMORY_RATED STORAGE_RATED NANODOLLARS   (rows with any spend)
  alert KEY YYYY-MM-DD THRESHOLD, block KEY YYYY-MM-DD POLICY     (keys with a limit in --plans)
  gap ACCOUNT PLAN METER HOUR_UNIX_S     (usage of an hour with no rate in force: not rated)
  lateusage SANDBOX HOUR_UNIX_S, latespend KEY YYYY-MM-DD   (usage at the aggregator's clock:
      the sandbox's hours from HOUR on, the key's days from that day on, are
      one line each, `usage SANDBOX late ...`, `spend KEY late ...`)
  dead COUNT
  deadclass CLASS COUNT                                             (per reason class)
  deadletter LINE CLASS                                             (with --why)

Spend is rated with the rate of the account's plan in force at each hour's
start (docs/billing.md "Rating and rounding"): --plans gives the plans and
the accounts on them; an account on none, and every account without
--plans, is rated with the default plan (sql/001_core.sql). Integers only:
Python ints, no floats anywhere.
"""
import argparse
import datetime
import json
import re
import sys
import time

NS = 1_000_000_000
HOUR = 3600 * NS
SLACK_FIRST = 60 * NS     # a first reading: the time since created + 60 s
SLACK = HOUR              # later readings: the time since the last + 1 h
JUMP = 65536              # seq generation or epoch jumps refused above this
AHEAD = 300 * NS          # max_clock_ahead_ms's default: a wall time further ahead is not trusted
BEHIND = 400 * 86400 * NS  # max_clock_behind_ms's default: further behind, not trusted
LATE = -1                 # the hour of usage placed at the aggregator's clock (see Biller)

# The default plan: nano-dollars per unit, and each unit in base units.
RATES = {"cpu": 25_000_000, "memory": 7_500_000, "storage": 80_000_000}
BASE = {"cpu": 3600 * NS, "memory": (1 << 30) * 3600 * NS, "storage": NS * 30 * 86400 * NS}

ID = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
TYPES = {"sample", "created", "paused", "resumed", "forked", "stopped", "restarted"}
STATES = {"running", "paused", "stopped"}
WALL_MIN = int(datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc).timestamp()) * NS
WALL_MAX = int(datetime.datetime(2200, 1, 1, tzinfo=datetime.timezone.utc).timestamp()) * NS


class Dead(Exception):
    """A dead letter, with its reason class."""


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < (1 << 63)


def decode(raw):
    """The decoder's checks (docs/events.md, the field table)."""
    try:
        m = json.loads(raw)
    except ValueError:
        raise Dead("decode")
    if not isinstance(m, dict) or m.get("v") != 1 or m.get("type") not in TYPES:
        raise Dead("decode")
    t = m["type"]
    for f in ("sandbox", "account"):
        if not isinstance(m.get(f), str) or not ID.match(m[f]):
            raise Dead("decode")
    for f in ("host", "key", "parent"):
        if f in m and (not isinstance(m[f], str) or not ID.match(m[f])):
            raise Dead("decode")
    ints = ("epoch", "seq", "wall_ns", "mono_ns", "cpu_ns", "mem_bytes", "mem_peak_bytes", "mem_size_bytes",
            "disk_bytes", "vcpus", "running_ns", "paused_ns", "net_rx_bytes", "net_tx_bytes", "disk_size_bytes",
            "fork_count")
    for f in ints:
        if f in m and not is_int(m[f]):
            raise Dead("decode")
    if "wall_ns" not in m or not WALL_MIN <= m["wall_ns"] < WALL_MAX:
        raise Dead("decode")
    need = {"sample": ("key", "epoch", "seq", "state", "cpu_ns", "mem_size_bytes", "vcpus"),
            "created": ("key", "mem_size_bytes", "vcpus"),
            "restarted": ("epoch", "reason"),
            "stopped": ("cpu_ns",)}.get(t, ())
    for f in need:
        if f not in m:
            raise Dead("decode")
    if "vcpus" in m and not 1 <= m["vcpus"] <= 1024:
        raise Dead("decode")
    if t in ("sample", "restarted") and m["epoch"] < 1:
        raise Dead("decode")
    if t == "sample" and m["state"] not in STATES:
        raise Dead("decode")
    if ("running_ns" in m) != ("paused_ns" in m) or ("net_rx_bytes" in m) != ("net_tx_bytes" in m):
        raise Dead("decode")
    if t == "restarted" and not re.match(r"^[a-z_]{1,31}$", str(m["reason"])):
        raise Dead("decode")
    return m


def varint(b, i):
    """(value, next index) of a shortest-form LEB128 below 2^63, or raise Dead."""
    v, shift = 0, 0
    while True:
        if i >= len(b) or shift > 56:
            raise Dead("decode")
        x = b[i]
        i += 1
        v |= (x & 0x7F) << shift
        if not x & 0x80:
            if x == 0 and shift:
                raise Dead("decode")
            if v >= 1 << 63:
                raise Dead("decode")
            return v, i
        shift += 7


def ident(b, i, empty=False):
    if i >= len(b):
        raise Dead("decode")
    n = b[i]
    s = b[i + 1:i + 1 + n]
    if len(s) != n:
        raise Dead("decode")
    t = s.decode("latin-1")
    if not (empty and n == 0) and not ID.match(t):
        raise Dead("decode")
    return t, i + 1 + n


def decode_batch(b):
    """docs/events.md "Usage batches": (host, [record]) where each record is a
    v1-like sample dict or a Dead; raises Dead when the header does not decode."""
    if not b or b[0] != 2:
        raise Dead("decode")
    host, i = ident(b, 1, empty=True)
    wall0, i = varint(b, i)
    mono0, i = varint(b, i)
    if i == len(b):
        raise Dead("decode")
    out = []
    while i < len(b):
        try:
            n, j = varint(b, i)
        except Dead as e:
            out.append(e)
            break
        if n > len(b) - j:
            out.append(Dead("decode"))
            break
        body, i = b[j:j + n], j + n
        try:
            out.append(record(body, host, wall0, mono0))
        except Dead as e:
            out.append(e)
    return host, out


def unzigzag(z):
    return (z >> 1) ^ -(z & 1)


def record(r, host, wall0, mono0):
    if not r:
        raise Dead("decode")
    flags = r[0]
    if flags & 0xE0 or flags & 3 == 3:
        raise Dead("decode")
    m = {"v": 1, "type": "sample", "state": ("running", "paused", "stopped")[flags & 3], "final": bool(flags & 4)}
    if host:
        m["host"] = host
    i = 1
    for f in ("sandbox", "account", "key"):
        m[f], i = ident(r, i)
    names = ["epoch", "seq", "wall_delta", "mono_delta", "cpu_ns", "mem_bytes", "mem_peak_bytes", "mem_size_bytes",
             "disk_bytes", "vcpus"]
    if flags & 8:
        names += ["running_ns", "paused_ns"]
    if flags & 16:
        names += ["net_rx_bytes", "net_tx_bytes"]
    for f in names:
        m[f], i = varint(r, i)
    if i != len(r):
        raise Dead("decode")
    m["wall_ns"] = wall0 + unzigzag(m.pop("wall_delta"))
    m["mono_ns"] = mono0 + unzigzag(m.pop("mono_delta"))
    if not WALL_MIN <= m["wall_ns"] < WALL_MAX or not 0 <= m["mono_ns"] < 1 << 63:
        raise Dead("decode")
    if not 1 <= m["vcpus"] <= 1024 or m["epoch"] < 1:
        raise Dead("decode")
    return m


class Sandbox:
    def __init__(self):
        self.created = None     # the `created` event
        self.epoch_max = 0      # highest epoch its host announced
        self.st = None          # the fold state: the last reading billed
        self.held = []          # readings waiting for their provenance


class State:
    pass


class Biller:
    """now_ns: the aggregator's clock when it reads the stream, at the
    earliest (None: every wall time is trusted). A reading dated more than
    AHEAD after it or BEHIND before it is not trusted for time: its usage is
    placed at the aggregator's clock, which the model knows only to be no
    earlier than now_ns, so it goes to the hour LATE, and report() merges a
    sandbox's usage from the hour before now_ns's on into one `late` line
    (the span ending at the aggregator's clock may reach back into it)."""

    def __init__(self, now_ns=None):
        self.now = now_ns
        self.late = set()       # sandboxes with usage at the aggregator's clock
        self.clock_notes = []   # (line, "clock_ahead" or "clock_behind")
        self.sandboxes = {}
        self.usage = {}         # (sandbox, hour start ns) -> [cpu, mem, storage]
        self.keys = {}          # (sandbox, hour) -> key
        self.accts = {}         # (sandbox, hour) -> account
        self.dead = []          # (line, class)
        # (sandbox, key, account) of a first reading not trusted for time
        # that carries an hour or more of held time: its span, ending at the
        # aggregator's clock, may reach back past the `late` line's first
        # hour, so the hours it lands in (and their rates) are not known
        self.unmodelled = set()

    def sb(self, sid):
        return self.sandboxes.setdefault(sid, Sandbox())

    def message(self, line, raw):
        try:
            m = decode(raw)
            self.apply(line, m)
        except Dead as e:
            self.dead.append((line, str(e)))

    def batch(self, line, data):
        """A usage batch: each sample a reading; one dead letter for those refused.
        held_readings keeps one sample of a message: another held is refused."""
        try:
            _, recs = decode_batch(data)
        except Dead as e:
            self.dead.append((line, str(e)))
            return
        refused, held = [], False
        for m in recs:
            if isinstance(m, Dead):
                refused.append(str(m))
                continue
            s = self.sb(m["sandbox"])
            before = len(s.held)
            try:
                self.apply(line, m)
            except Dead as e:
                refused.append(str(e))
                continue
            if len(s.held) > before:
                if held:
                    s.held.pop()
                    refused.append("held_twice")
                held = True
        if refused:
            self.dead.append((line, refused[0]))

    def apply(self, line, m):
        t = m["type"]
        s = self.sb(m["sandbox"])
        if t == "created":
            if s.created is not None:
                if m.get("host", "") != s.created.get("host", ""):
                    raise Dead("host")
                return
            s.created = m
            s.epoch_max = max(s.epoch_max, m.get("epoch", 1))
            self.release(s)
        elif t == "restarted":
            if s.created is None:
                # held for its `created` event like a reading (docs/events.md,
                # "Provenance"): the host it must come from is not known yet
                s.held.append((line, m, "no_created"))
                return
            if m.get("host", "") != s.created.get("host", ""):
                raise Dead("host")
            known = max(s.epoch_max, s.st.epoch if s.st else 0)
            if m["epoch"] > known + JUMP:
                raise Dead("epoch_jump")
            s.epoch_max = max(s.epoch_max, m["epoch"])
            self.release(s)
        elif t in ("sample", "stopped"):
            self.reading(s, line, m)

    def release(self, s):
        held, s.held = s.held, []
        for line, m, _ in held:
            try:
                if m["type"] == "restarted":
                    self.apply(line, m)
                else:
                    self.reading(s, line, m)
            except Dead as e:
                self.dead.append((line, str(e)))

    def reading(self, s, line, m):
        c = s.created
        if c is None:
            s.held.append((line, m, "no_created"))
            return
        if "host" in m and m["host"] != c.get("host"):
            raise Dead("host")
        st = st_before = s.st
        stopped_ev = m["type"] == "stopped"
        epoch = m.get("epoch", st.epoch if st else 0)
        if epoch > s.epoch_max:
            s.held.append((line, m, "unannounced"))
            return
        key = m.get("key", st.key if st else c["key"])
        vcpus = m.get("vcpus", st.vcpus if st else c["vcpus"])
        mem = m.get("mem_size_bytes", st.mem if st else c["mem_size_bytes"])
        disk = m.get("disk_bytes", (st.disk if st else 0) if stopped_ev else 0)
        if stopped_ev:
            # docs/events.md: in a `stopped` event a size of 0 is the same as a missing one.
            mem = mem or (st.mem if st else c["mem_size_bytes"])
            disk = disk or (st.disk if st else 0)
        wall = m["wall_ns"]
        bad = self.clock(line, wall)
        cpu = m["cpu_ns"]
        held = "running_ns" in m
        run, paused = m.get("running_ns", 0), m.get("paused_ns", 0)
        seq = m.get("seq")

        if st is None:
            # an untrusted first reading was read at the aggregator's clock
            # (now at the earliest): at most what could be used by then
            # (the time since is none for a reading dated before the created
            # moment: the slack is then all it may carry)
            since = max(0, (self.now if bad else wall) - c["wall_ns"]) + SLACK_FIRST
            if cpu > c["vcpus"] * since or (held and run + paused > since):
                raise Dead("impossible_first")
            d_cpu, d_run, d_paused = cpu, run, paused
            st = State()
            st.run = st.paused = 0
            # an untrusted first reading leaves the state's wall time at the
            # created moment (docs/events.md, "Clocks")
            st.wall = c["wall_ns"] if bad else wall
            st.stopped = False
            st.seq = seq if seq is not None else 0
            st.epoch = epoch
            st.held = held
        else:
            if epoch < st.epoch:
                return
            if epoch > st.epoch + JUMP:
                raise Dead("epoch_jump")
            if not st.stopped and stopped_ev and (
                    (epoch == st.epoch and cpu < st.cpu) or (not bad and wall < st.wall - HOUR)):
                raise Dead("stopped_behind")
            if not stopped_ev:
                if epoch == st.epoch and seq <= st.seq:
                    return
                # a seq generation jump is judged whatever the epoch (the
                # docs' "Jumps"), except against a state that has billed no
                # seq yet: one made by a `stopped` event alone
                if (seq >> 32) - (st.seq >> 32) > JUMP and not (st.stopped and st.seq == 0):
                    raise Dead("seq_jump")
            if st.stopped:
                d_cpu = max(0, cpu - st.cpu)
            elif epoch > st.epoch:
                d_cpu = cpu
            elif cpu >= st.cpu:
                d_cpu = cpu - st.cpu
            else:
                d_cpu = cpu
            d_run = max(0, run - st.run) if held else 0
            d_paused = max(0, paused - st.paused) if held else 0
            # an untrusted reading: no time known to have passed, the slack only
            elapsed = (0 if bad else max(0, wall - st.wall)) + SLACK
            if d_cpu > vcpus * elapsed or d_run + d_paused > elapsed:
                raise Dead("impossible")
            if held != st.held:
                sys.exit("refbill: a change between readings with and without held counters is not modelled")
            if not held:
                # the interval rule: (last wall, wall] in the state it began in
                interval = 0 if bad else max(0, wall - st.wall)
                if st.state == "running":
                    d_run = interval
                elif st.state == "paused":
                    d_paused = interval
        # bill it: over the span of its held time ending at its wall time;
        # the interval rule bills the interval with the sizes at its start
        # (the last reading's), held counters with the reading's own
        span = d_run + d_paused
        bill_mem, bill_disk = (st.mem, st.disk) if st_before is not None and not held else (mem, disk)
        if bad:
            self.late.add(m["sandbox"])
            if st_before is None and span >= HOUR:
                self.unmodelled.add((m["sandbox"], key, m["account"]))
            self.place(m["sandbox"], key, None, span, d_cpu, d_run, d_paused, bill_mem, bill_disk, m["account"])
        else:
            self.place(m["sandbox"], key, wall, span, d_cpu, d_run, d_paused, bill_mem, bill_disk, m["account"])
        # move the state
        if st.stopped:
            st.cpu = max(st.cpu, cpu)
        else:
            st.cpu = cpu
        # the last reading billed is its seq, stopped or not: a late resend
        # of an earlier seq after the stop is a duplicate (it once stayed at
        # the seq before the stop, and a resent forged sample was judged)
        if seq is not None:
            st.seq = seq
        st.epoch = max(st.epoch, epoch)
        st.run = max(st.run, run)
        st.paused = max(st.paused, paused)
        if not bad:
            st.wall = max(st.wall, wall)
        st.key, st.vcpus, st.mem, st.disk = key, vcpus, mem, disk
        if stopped_ev or m.get("state") == "stopped":
            st.stopped = True
        st.state = "stopped" if st.stopped else m.get("state", "running")
        s.st = st

    def place(self, sid, key, wall, span, cpu, run, paused, mem, disk, account):
        """Each quantity by each UTC hour's share of [wall - span, wall]:
        the usage up to the end of each hour's piece is floor(quantity x
        time so far / span), and an hour gets the difference, so the pieces
        sum to the quantity exactly. wall None: at the aggregator's clock
        (all of it to the hour LATE)."""
        if wall is None:
            pieces = [(LATE, 1)]
            span = 1
        elif span == 0:
            pieces = [(wall - wall % HOUR, 1)]
            span = 1
        else:
            pieces = []
            a = wall - span
            while a < wall:
                h = a - a % HOUR
                b = min(wall, h + HOUR)
                pieces.append((h, b - a))
                a = b
        done = 0
        before = [0, 0, 0]
        for h, share in pieces:
            done += share
            upto = [cpu * done // span, run * done // span, paused * done // span]
            q = [upto[0] - before[0], upto[1] - before[1], upto[2] - before[2]]
            before = upto
            row = self.usage.setdefault((sid, h), [0, 0, 0])
            row[0] += q[0]
            row[1] += mem * q[1]
            row[2] += (mem + disk) * q[2]
            self.keys[(sid, h)] = key
            self.accts[(sid, h)] = account

    def clock(self, line, wall):
        """Whether a reading's wall time is beyond the bounds (not trusted
        for time); noted as the aggregator counts it."""
        if self.now is None:
            return False
        if wall > self.now + AHEAD:
            self.clock_notes.append((line, "clock_ahead"))
            return True
        if wall < self.now - BEHIND:
            self.clock_notes.append((line, "clock_behind"))
            return True
        return False

    def end(self):
        for s in self.sandboxes.values():
            # after the grace, with what it waited for last
            for line, m, why in s.held:
                self.dead.append((line, why))
            s.held = []


def round_div(a, b):
    """a / b rounded once, half away from zero (integers)."""
    q, r = divmod(abs(a), b)
    if 2 * r >= b:
        q += 1
    return q if a >= 0 else -q


def day_of(ns):
    return datetime.datetime.fromtimestamp(ns // NS, datetime.timezone.utc).strftime("%Y-%m-%d")


def nanodollars(c, m, s):
    """The rated sums of a (key, day) in nano-dollars: divided by each unit's
    base units and rounded once."""
    den = BASE["cpu"] * BASE["memory"] * BASE["storage"]
    num = c * BASE["memory"] * BASE["storage"] + m * BASE["cpu"] * BASE["storage"] + s * BASE["cpu"] * BASE["memory"]
    return round_div(num, den)


THRESHOLDS = (50, 80, 100)


def limit_rule(nanodollars, limit, policy):
    """The daily limit rule (docs/billing.md, "Daily spend limits"; the
    policies: docs/api.md), the one place the model applies it: what a
    key's day with `nanodollars` of spend gets under a daily limit `limit`
    (None: no limit) and `policy` (`pause`, `stop`, `alert_only`). Returns
    (thresholds, block): the alert thresholds the day's spend reached
    (spend x 100 >= limit x threshold, exact; a day that spent nothing
    reaches none, whatever the limit), and the policy its block records
    (the block at 100 %; None: not blocked, as an `alert_only` key never
    is). Spend only grows within a day, so what the day's final spend
    reached is what the batches together recorded, each once."""
    if limit is None or nanodollars <= 0:
        return [], None
    reached = [t for t in THRESHOLDS if nanodollars * 100 >= limit * t]
    block = policy if 100 in reached and policy != "alert_only" else None
    return reached, block


def limit_lines(spend, limits):
    """`alert KEY DAY THRESHOLD` and `block KEY DAY POLICY` lines: spend is
    {(key, day): nanodollars}, limits {key: [limit, policy]}."""
    out = []
    for (key, day), nd in sorted(spend.items(), key=lambda x: (x[0][0].encode(), x[0][1])):
        lim = limits.get(key)
        if lim is None or day == "late":
            continue
        reached, block = limit_rule(nd, lim[0], lim[1])
        out += [f"alert {key} {day} {t}" for t in reached]
        if block:
            out.append(f"block {key} {day} {block}")
    return out


def rate_at(plans, account, meter, hour_ns):
    """The rate of the account's plan in force at the hour's start (a rate
    taking effect inside an hour holds from the next one); None: no rate."""
    plan = plans["accounts"].get(account, "default")
    best = None
    for at, rate in plans["rates"].get(plan, {}).get(meter, []):
        if at <= hour_ns and (best is None or at >= best[0]):
            best = (at, rate)
    return best[1] if best else None


DEFAULT_PLANS = {"accounts": {}, "rates": {"default": {m: [[WALL_MIN, r]] for m, r in RATES.items()}}}


def report(b, why, plans=None):
    """The model's lines. plans: {"accounts": {account: plan}, "rates": {plan:
    {meter: [[effective_from_ns, nanodollars_per_unit], ...]}}, "limits":
    {key: [daily_limit_nanodollars, policy]}}; the default plan's rates when
    the plan table gives none for "default"."""
    plans = dict(plans or {"accounts": {}, "rates": {}})
    plans["rates"] = dict(plans.get("rates", {}))
    plans["rates"].setdefault("default", DEFAULT_PLANS["rates"]["default"])
    plans.setdefault("accounts", {})
    out = []
    # a sandbox with usage at the aggregator's clock: its hours from the one
    # before now's on in one `late` line, its key's days from that hour's on
    cut = None if b.now is None else b.now - b.now % HOUR - HOUR
    late_keys = {b.keys[(sid, h)] for (sid, h) in b.usage if h == LATE}
    usage = {}
    for (sid, h), q in b.usage.items():
        k = (sid, "late" if sid in b.late and (h == LATE or h >= cut) else str(h // NS))
        row = usage.setdefault(k, [0, 0, 0])
        for i in range(3):
            row[i] += q[i]
    for sid in sorted(b.late, key=str.encode):
        out.append(f"lateusage {sid} {cut // NS}")
    for key in sorted(late_keys, key=str.encode):
        out.append(f"latespend {key} {day_of(cut)}")
    for (sid, h), (cpu, mem, sto) in sorted(usage.items(), key=lambda x: (x[0][0].encode(), x[0][1])):
        if cpu or mem or sto:
            out.append(f"usage {sid} {h} {cpu} {mem} {sto}")
    spend = {}
    gaps = set()
    for (sid, h), (cpu, mem, sto) in b.usage.items():
        key = b.keys[(sid, h)]
        # the rates in force from `cut` on are the same for every hour after
        # (pack.py's plans change no rate later)
        at = cut if h == LATE else h
        day = "late" if key in late_keys and day_of(at) >= day_of(cut) else day_of(at)
        r = spend.setdefault((key, day), [0, 0, 0])
        acct = b.accts[(sid, h)]
        for i, (meter, q) in enumerate((("cpu", cpu), ("memory", mem), ("storage", sto))):
            rate = rate_at(plans, acct, meter, at)
            if rate is None:
                # a rating gap: kept in usage, adds nothing to spend, one
                # rating_gaps row per (account, plan, meter, hour) with usage
                if q > 0:
                    if h == LATE:
                        sys.exit("refbill: a rating gap at the aggregator's clock is not modelled")
                    gaps.add((acct, plans["accounts"].get(acct, "default"), meter, h))
                continue
            r[i] += q * rate
    spent = {}
    for (key, day), (c, m, s) in sorted(spend.items(), key=lambda x: (x[0][0].encode(), x[0][1])):
        if not (c or m or s):
            continue
        spent[(key, day)] = nanodollars(c, m, s)
        out.append(f"spend {key} {day} {c} {m} {s} {spent[(key, day)]}")
    out += limit_lines(spent, plans.get("limits", {}))
    for acct, plan, meter, h in sorted(gaps, key=lambda g: (g[0].encode(), g[1].encode(), g[2], g[3])):
        out.append(f"gap {acct} {plan} {meter} {h // NS}")
    for sid, key, acct in sorted(b.unmodelled):
        out.append(f"unmodelled {sid} {key} {acct}")
    out.append(f"dead {len(b.dead)}")
    classes = {}
    for _, cls in b.dead:
        classes[cls] = classes.get(cls, 0) + 1
    for cls in sorted(classes):
        out.append(f"deadclass {cls} {classes[cls]}")
    if why:
        for line, cls in sorted(b.dead):
            out.append(f"deadletter {line} {cls}")
    return out


def main():
    ap = argparse.ArgumentParser(description="Bills a stream of usage messages as docs/billing.md says.")
    ap.add_argument("stream", nargs="?", default="-", help="ACCOUNT<TAB>JSON lines (default: stdin)")
    ap.add_argument("--why", action="store_true", help="list the dead letters with their reason class")
    ap.add_argument("--plans", default="", help="a JSON file of plans and their rates (default: the default plan)")
    ap.add_argument("--now-ns", type=int, default=time.time_ns(),
                    help="the aggregator's clock when it reads the stream (default: now; -1: trust every clock)")
    a = ap.parse_args()
    f = sys.stdin if a.stream == "-" else open(a.stream, encoding="utf-8")
    b = Biller(a.now_ns if a.now_ns >= 0 else None)
    for n, line in enumerate(f, 1):
        line = line.rstrip("\n")
        if not line or line.startswith("#"):
            continue
        _, raw = line.split("\t", 1)
        if raw.startswith("v2:"):
            b.batch(n, bytes.fromhex(raw[3:]))
        else:
            b.message(n, raw)
    b.end()
    plans = json.load(open(a.plans, encoding="utf-8")) if a.plans else None
    sys.stdout.write("\n".join(report(b, a.why, plans)) + "\n")


if __name__ == "__main__":
    main()
