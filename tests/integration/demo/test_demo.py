#!/usr/bin/env python3
"""The live demo, as a new user gets it: `./scripts/up start` in a temporary
state folder, then through tally-api's /v1 only:
  - the sign-in printed once works (POST /v1/sessions);
  - every demo sandbox (builder, researcher, trial) is billed: its
    cost_nanodollars is above zero and rises;
  - the trial key reaches its daily limit: its sandbox is paused, /v1/spend says
    blocked, and /v1/alerts holds the 50, 80 and 100 % alerts;
  - the dashboard in chromium (dashboard.cjs, which says all it checks) shows a
    key's spend equal to /v1/spend, sets a limit and policy through its form
    (read back from PostgreSQL), resumes the trial key's paused sandbox once
    the page raised its limit, adds a webhook and sees a delivery, downloads an
    invoice CSV equal to /v1/invoices/current, and works at 390 and 1280 px
    (screenshots in build/meson-logs/demo/);
  - `./scripts/up status` names the ports that actually answer;
  - `./scripts/up stop` ends every process and removes the instance's cgroup
    parent; a second `up start` keeps the account, keys and password.
Fails (never skips) when anything is missing."""
import glob
import json
import os
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

ROOT = os.environ.get("TALLY_ROOT") or os.path.abspath(os.path.join(os.path.dirname(__file__), "../../.."))
BUILD = os.environ.get("TALLY_BUILD_DIR") or os.path.join(ROOT, "build")
UP = os.path.join(ROOT, "scripts", "up")
TRIAL_DEADLINE_S = 150
# This test's run (its meson timeout less the room left for waiting out a UTC day that
# would end during it: the trial key's daily limit needs one day throughout).
RUN_S = 300

sys.path.insert(0, os.path.join(ROOT, "tests", "support"))
from testsupport import free_port, pid_alive, wait_out_utc_day  # noqa: E402

# The state folder of the instance under test, once there is one: fail() shows its logs.
STATE = [None]


def print_logs(state):
    """The last lines of every log the instance wrote: each daemon's, the demo agents',
    the development broker's and PostgreSQL's."""
    logs = sorted(glob.glob(os.path.join(state, "log", "*.log")) + glob.glob(os.path.join(state, "run", "*.log"))
                  + glob.glob(os.path.join(state, "pg", "*.log")) + glob.glob(os.path.join(state, "kafka", "node.*", "*.log")))
    for log in logs:
        with open(log, errors="replace") as f:
            lines = f.read().splitlines()[-40:]
        print(f"--- {log} (last {len(lines)} lines)\n" + "\n".join(lines), flush=True)


def fail(msg):
    print("FAIL:", msg, flush=True)
    if STATE[0]:
        print_logs(STATE[0])
        STATE[0] = None  # once
    raise SystemExit(1)


def call(base, method, path, body=None, key=None, cookie=None, csrf=None):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    if key:
        req.add_header("Authorization", "Bearer " + key)
    if cookie:
        req.add_header("Cookie", cookie)
    if csrf:
        req.add_header("X-CSRF-Token", csrf)
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=60) as res:
            return res.status, json.loads(res.read() or b"null"), res.headers
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null"), e.headers


def up(state, env, *args):
    p = subprocess.run([UP, *args], env=env, capture_output=True, text=True, timeout=240)
    print(f"--- scripts/up {' '.join(args)} (exit {p.returncode})\n{p.stdout}{p.stderr}", flush=True)
    if p.returncode != 0:
        fail(f"scripts/up {' '.join(args)} exited {p.returncode}")
    return p.stdout + p.stderr


def read_lines(stream, q):
    """Every line of stream into q, then None at its end."""
    for line in stream:
        q.put(line)
    q.put(None)


def sign_in(base, email, password):
    st, body, headers = call(base, "POST", "/v1/sessions", {"email": email, "password": password})
    if st != 201:
        fail(f"the printed sign-in does not work: {st} {body}")
    cookie = headers["Set-Cookie"].split(";")[0]
    return cookie, body["csrf_token"]


def main():
    wait_out_utc_day(RUN_S)
    state = tempfile.mkdtemp(prefix="tally-demo-", dir="/tmp")
    os.chmod(state, 0o755)
    STATE[0] = state
    env = dict(os.environ, TALLY_STATE_DIR=state, TALLY_BUILD_DIR=BUILD, TALLY_UP_NO_BUILD="1",
               TALLY_PG_PORT=str(free_port()), TALLY_BROKER_PORT="0", TALLY_API_PORT=str(free_port()),
               TALLY_PG_FSYNC="off")
    started = False
    try:
        t0 = time.monotonic()
        out = up(state, env, "start")
        started = True
        m = re.search(r"dashboard\s+(http://\S+?)/\s", out)
        email = re.search(r"sign in as\s+(\S+)", out)
        pw = re.search(r"password\s+(\S+)", out)
        if not (m and email and pw):
            fail("scripts/up did not print the dashboard URL, the sign-in and the password")
        base, email, pw = m.group(1), email.group(1), pw.group(1)
        if base != f"http://127.0.0.1:{env['TALLY_API_PORT']}":
            fail(f"the dashboard URL {base} is not on the port asked for")
        with urllib.request.urlopen(base + "/", timeout=10) as res:
            page = res.read().decode()
            if res.status != 200 or "<title>tally" not in page:
                fail("GET / is not the dashboard")

        # status reads what runs from the state folder, whatever this environment says.
        plain = {k: v for k, v in os.environ.items() if not k.startswith("TALLY_PG") and k != "TALLY_API_PORT"}
        st_out = subprocess.run([UP, "status"], env=dict(plain, TALLY_STATE_DIR=state, TALLY_PG_PORT="5999"),
                                capture_output=True, text=True).stdout
        print("--- scripts/up status\n" + st_out)
        if f"127.0.0.1:{env['TALLY_PG_PORT']}/tally" not in st_out or base not in st_out:
            fail("scripts/up status does not report the PostgreSQL port and API URL that run")
        instance = re.search(r"cgroup parent (\S+)", st_out).group(1).rstrip(",")
        if not instance.startswith("tally-") or instance == "tally":
            fail(f"the cgroup parent {instance} is not derived from the state folder")

        # The database as the finance role, as printed: the finance views, and nothing of the ledger.
        fin = re.search(r"PGPASSFILE=(\S+) psql (postgresql://\S+)", out)
        if not fin or "tally_finance@" not in fin.group(2):
            fail("scripts/up did not print how to reach the database as the finance role")
        secrets = os.path.join(state, "secrets")
        if os.stat(secrets).st_mode & 0o077 or any(os.stat(os.path.join(secrets, f)).st_mode & 0o077
                                                  for f in os.listdir(secrets)):
            fail(f"{secrets} or a file in it can be read by others than its owner")
        def finance_psql(sql):
            return subprocess.run(["psql", "-X", "-tA", fin.group(2), "-c", sql], capture_output=True, text=True,
                                  env=dict(os.environ, PGPASSFILE=fin.group(1)), timeout=30)
        p = finance_psql("SELECT count(*) FROM invoices")
        if p.returncode != 0:
            fail(f"the printed finance command cannot read finance.invoices: {p.stderr}")
        p = finance_psql("SELECT count(*) FROM public.usage_hourly")
        if p.returncode == 0 or "permission denied" not in p.stderr:
            fail(f"the finance role reads usage_hourly: {p.stdout}{p.stderr}")
        p = subprocess.run(["psql", "-X", "-tA", fin.group(2), "-c", "SELECT 1"], capture_output=True, text=True,
                           env=dict(os.environ, PGPASSFILE="/dev/null"), timeout=30)
        if p.returncode == 0:
            fail("PostgreSQL let the finance login in without a password")

        keys = json.load(open(os.path.join(state, "demo", "keys.json")))
        cookie, csrf = sign_in(base, email, pw)

        # Every demo sandbox billed: cost above zero, and rising for the running ones.
        def sandboxes():
            st, body, _ = call(base, "GET", "/v1/sandboxes?state=running,paused", cookie=cookie)
            if st != 200:
                fail(f"GET /v1/sandboxes: {st} {body}")
            return body["sandboxes"]

        deadline = time.monotonic() + 60
        while True:
            sbs = sandboxes()
            agents = sorted(s["labels"].get("agent", "") for s in sbs)
            if agents == ["builder", "researcher", "trial"]:
                break
            if time.monotonic() > deadline:
                fail(f"the demo sandboxes did not all start within 60 s: {agents}")
            time.sleep(1)
        first = {}
        deadline = time.monotonic() + 60
        while len(first) < 3:
            for s in sbs:
                st, sb, _ = call(base, "GET", f"/v1/sandboxes/{s['id']}", cookie=cookie)
                if st == 200 and (sb.get("cost_nanodollars") or 0) > 0:
                    first.setdefault(s["id"], (s["labels"]["agent"], sb["cost_nanodollars"]))
            if time.monotonic() > deadline:
                fail(f"not every demo sandbox is billed after 60 s: {first}")
            time.sleep(2)
        print("billed:", first, flush=True)

        # Costs rise: each running sandbox's cost grew since it was first seen billed.
        for sid, (agent, c0) in first.items():
            st, sb, _ = call(base, "GET", f"/v1/sandboxes/{sid}", cookie=cookie)
            if sb["state"] == "running" and sb["cost_nanodollars"] <= c0:
                fail(f"{agent}'s cost did not rise: {c0} then {sb['cost_nanodollars']}")

        # The trial key: paused at its limit, blocked, alerts at 50, 80 and 100 %.
        trial = keys["trial"]["id"]
        deadline = t0 + TRIAL_DEADLINE_S
        while True:
            st, sp, _ = call(base, "GET", "/v1/spend", key=keys["trial"]["key"])
            row = sp["data"][0] if st == 200 and sp["data"] else {}
            st, al, _ = call(base, "GET", f"/v1/alerts?key={trial}", cookie=cookie)
            # Threshold alerts only: the warning before the limit (spend.limit_projected) has none.
            pcts = sorted(a["threshold_pct"] for a in al["data"]
                          if a["type"] == "spend.threshold_reached") if st == 200 else []
            paused = [s for s in sandboxes() if s["key"] == trial and s["state"] == "paused"]
            if row.get("blocked") and pcts == [50, 80, 100] and paused:
                break
            if time.monotonic() > deadline:
                fail(f"the trial key did not reach its limit with its sandbox paused and alerts recorded "
                     f"within {TRIAL_DEADLINE_S} s of up: spend {row}, alerts {pcts}, paused {len(paused)}")
            time.sleep(2)
        print(f"trial key blocked at {row['spend_nanodollars']} of {row['limit_nanodollars']} nano-dollars, "
              f"alerts {pcts}, {len(paused)} sandbox(es) paused, {time.monotonic() - t0:.0f} s after up", flush=True)
        st, body, _ = call(base, "POST", "/v1/sandboxes", {"vcpus": 1}, key=keys["trial"]["key"])
        if st != 402:
            fail(f"a blocked key could start a sandbox: {st} {body}")

        # tally-admin's terminal views agree with /v1.
        # As the operator would: the state folder's tally-admin (tally_admin's URL and password file).
        admin = [os.path.join(state, "tally-admin")]
        def admin_out(*args, columns="100"):
            p = subprocess.run(admin + list(args), capture_output=True, text=True, timeout=30,
                               env=dict(os.environ, COLUMNS=columns))
            print(f"--- tally-admin {' '.join(args)} (exit {p.returncode})\n{p.stdout}{p.stderr}", flush=True)
            if p.returncode != 0:
                fail(f"tally-admin {' '.join(args)} exited {p.returncode}")
            return p.stdout
        def micro(nd):  # nano-dollars -> "$0.001234", half away from zero, as PostgreSQL rounds
            return "$%d.%06d" % divmod((nd + 500) // 1000, 1000000)
        for _ in range(20):
            a = call(base, "GET", "/v1/spend", key=keys["trial"]["key"])[1]["data"][0]["spend_nanodollars"]
            out = admin_out("spend", "--account", "demo")
            b = call(base, "GET", "/v1/spend", key=keys["trial"]["key"])[1]["data"][0]["spend_nanodollars"]
            line = next((l for l in out.splitlines() if trial in l), "")
            if a == b:
                break
        if micro(a) not in line or "BLOCKED" not in line:
            fail(f"tally-admin spend shows {line!r} for the trial key; /v1/spend says {a} nano-dollars, blocked")
        out = admin_out("status", base + "/healthz")
        if not re.search(r"tally-aggregator\s+usage\s+\d+\s+\d+\s+\d+ s ago\s+up", out) or \
                not re.search(r"\s\d+ s ago\s+\S+\s+ok", out) or not re.search(r"/healthz\s+up\s+HTTP 200", out):
            fail("tally-admin status does not show the aggregator committing, the host sampled and tally-api up")
        narrow = admin_out("spend", "--account", "demo", columns="60")
        wide = max(len(l) for l in narrow.splitlines()[1:])  # the title line is prose, the table must fit
        if wide > 60 or "…" not in narrow:
            fail(f"tally-admin spend's table does not fit 60 columns (widest line {wide})")
        out = admin_out("usage", "--account", "demo", "--by", "meter")
        if not all(re.search(rf"demo\s+{m}\s+\d+\.\d+\s+\S+\s+\$\d+\.\d{{6}}", out) for m in ("cpu", "memory", "storage")):
            fail("tally-admin usage --by meter does not list cpu, memory and storage with their cost")

        # The browser test, the trial key blocked (spend still rising on the agents key).
        snap = os.environ.get("TALLY_SCREENSHOT") or os.path.join(state, "dashboard.png")
        # The browser test's screenshots (390 and 1280 px) and the CSV it downloaded stay in the
        # test's log folder, as artifacts.
        artifacts = os.path.join(BUILD, "meson-logs", "demo")
        os.makedirs(artifacts, exist_ok=True)
        node = subprocess.run(["node", os.environ.get("TALLY_DASHBOARD_TEST",
                                                      os.path.join(os.path.dirname(__file__), "dashboard.cjs"))],
                              env=dict(os.environ, TALLY_URL=base, TALLY_EMAIL=email, TALLY_PASSWORD=pw,
                                       TALLY_DATABASE_URL=f"postgresql://tally@127.0.0.1:{env['TALLY_PG_PORT']}/tally",
                                       PGPASSFILE=os.path.join(state, "secrets", "pg-tally.pgpass"),
                                       TALLY_KEY_ID=keys["agents"]["id"], TALLY_TRIAL_KEY_ID=trial,
                                       TALLY_SCREENSHOT=snap, TALLY_ARTIFACTS=artifacts, TALLY_ROOT=ROOT),
                              capture_output=True, text=True, timeout=240)
        print(f"--- dashboard.cjs (exit {node.returncode})\n{node.stdout}{node.stderr}", flush=True)
        if node.returncode != 0:
            fail("the dashboard browser test failed")

        # stop: every process ends, the instance's cgroups go.
        pids = [int(open(os.path.join(state, "run", f)).read()) for f in os.listdir(os.path.join(state, "run"))
                if f.endswith(".pid")]
        up(state, env, "stop")
        started = False
        alive = [p for p in pids if pid_alive(p)]
        if alive:
            fail(f"processes still alive after stop: {alive}")
        left = subprocess.run(["find", "/sys/fs/cgroup", "-maxdepth", "2", "-name", instance],
                              capture_output=True, text=True).stdout.split()
        if left:
            fail(f"cgroup parent left after stop: {left}")

        # State survives: a second start, in the foreground as README's `./scripts/up` is, keeps
        # the account, the keys and the password; `./scripts/up stop` from another shell ends it.
        fg = subprocess.Popen([UP], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        started = True
        lines = queue.Queue()
        threading.Thread(target=read_lines, args=(fg.stdout, lines), daemon=True).start()
        out, deadline = "", time.monotonic() + 240
        while "Ctrl-C stops it all" not in out:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                line = None
            if line is None:
                print(f"--- scripts/up (foreground)\n{out}", flush=True)
                fail("the foreground scripts/up ended or stalled before it said it was up")
            out += line
        print(f"--- scripts/up (foreground)\n{out}", flush=True)
        if "password" in out and re.search(r"password\s+\S{12,}", out):
            fail("a second start printed a new password")
        if json.load(open(os.path.join(state, "demo", "keys.json"))) != keys:
            fail("a second start changed the demo's keys")
        sign_in(base, email, pw)
        up(state, env, "stop")
        started = False
        try:
            rc = fg.wait(timeout=30)
        except subprocess.TimeoutExpired:
            fg.kill()
            fail("the foreground scripts/up did not leave within 30 s of `scripts/up stop` from another shell")
        if rc != 0:
            fail(f"the foreground scripts/up left with {rc} after `scripts/up stop`")
        print(f"demo test passed in {time.monotonic() - t0:.0f} s")
        return 0
    except Exception:
        # Not a check that failed: a crash of the test itself (a timeout, an unexpected answer).
        if STATE[0]:
            print_logs(STATE[0])
        raise
    finally:
        if started:
            subprocess.run([UP, "stop"], env=env, capture_output=True, timeout=120)
        shutil.rmtree(state, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
