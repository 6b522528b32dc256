"""alertlib.py — what the alert tests and the alerts bench share: a webhook
receiver and an SMTP sink on loopback (started by the test, real sockets),
the signature check exactly as docs/alerts.md documents it (written here, not
taken from tally), a fresh migrated database, and tally's daemons as real
processes. Nothing here is a mock of PostgreSQL or of tally's code."""
import hashlib
import hmac
import http.server
import json
import os
import re
import signal
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid

# Ports and the UTC day, shared with the other Python tests (tests/support/testsupport.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "support"))
from testsupport import free_port, role_url, wait_out_utc_day  # noqa: E402,F401

FAILURES = []
CHECKS = [0]


def check(cond, msg):
    CHECKS[0] += 1
    if not cond:
        FAILURES.append(msg)
        print("FAIL: " + msg, file=sys.stderr, flush=True)
    return cond


def env(name):
    v = os.environ.get(name)
    if not v:
        print(f"FAIL: {name} is not set (run through scripts/test)", file=sys.stderr)
        sys.exit(1)
    return v


def wait_for(pred, timeout_s, step_s=0.02):
    until = time.monotonic() + timeout_s
    while time.monotonic() < until:
        v = pred()
        if v:
            return v
        time.sleep(step_s)
    return pred()


# ---- the signature check of docs/alerts.md ----

def verify_signature(secret, header, body, now=None, tolerance_s=300):
    """True when header is "t=<unix>,v1=<hex>" with v1 = HMAC-SHA256(secret,
    "<t>.<body>") and t within tolerance_s of now."""
    parts = dict(p.split("=", 1) for p in header.split(",") if "=" in p)
    if "t" not in parts or "v1" not in parts or not parts["t"].isdigit():
        return False
    t = int(parts["t"])
    now = int(time.time()) if now is None else now
    if abs(now - t) > tolerance_s:
        return False
    want = hmac.new(secret.encode(), parts["t"].encode() + b"." + body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(want, parts["v1"])


# ---- the webhook receiver ----

class Receiver:
    """Records every POST: (path, event id header, signature header, body, time).
    Behaviours by path: /ok answers 200; /flaky answers 500 to the first three
    requests of each event id, then 200; /stall holds the first request of
    each event id until release() (then answers 200 to a socket that may be
    gone); anything else 404."""

    def __init__(self, tls=None):
        self.lock = threading.Lock()
        self.got = []
        self.seen_per_event = {}
        self.stalled = threading.Event()
        self.release_ev = threading.Event()
        rec = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_POST(self):
                n = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(n)
                eid = self.headers.get("Tally-Event-Id", "")
                with rec.lock:
                    rec.got.append({"path": self.path, "event_id": eid, "sig": self.headers.get("Tally-Signature", ""),
                                    "type": self.headers.get("Tally-Event-Type", ""), "body": body,
                                    "at": time.time()})
                    k = (self.path, eid)
                    rec.seen_per_event[k] = rec.seen_per_event.get(k, 0) + 1
                    nth = rec.seen_per_event[k]
                status = 200
                if self.path.startswith("/flaky") and nth <= 3:
                    status = 500
                elif self.path.startswith("/stall") and nth == 1:
                    rec.stalled.set()
                    rec.release_ev.wait(30)
                elif not (self.path.startswith("/ok") or self.path.startswith("/stall") or self.path.startswith("/flaky")):
                    status = 404
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                except OSError:
                    pass

        class S(http.server.ThreadingHTTPServer):
            # The default listen backlog (5) drops the SYNs of a batch sent at
            # once; the client's retry comes a second later.
            request_queue_size = 128
            daemon_threads = True

        self.srv = S(("127.0.0.1", 0), H)
        if tls:  # (certfile, keyfile): HTTPS
            import ssl
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            self.srv.socket = ctx.wrap_socket(self.srv.socket, server_side=True)
        self.scheme = "https" if tls else "http"
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def url(self, path):
        return f"{self.scheme}://127.0.0.1:{self.port}{path}"

    def requests(self, path_prefix=None, event_id=None):
        with self.lock:
            return [g for g in self.got if (path_prefix is None or g["path"].startswith(path_prefix))
                    and (event_id is None or g["event_id"] == event_id)]

    def release(self):
        self.release_ev.set()

    def stop(self):
        self.release_ev.set()
        self.srv.shutdown()


# ---- the SMTP sink ----

class SmtpSink:
    """A minimal SMTP server: keeps each message's envelope, data and whether
    it came over TLS. With tls=(certfile, keyfile) it offers STARTTLS."""

    def __init__(self, tls=None):
        self.lock = threading.Lock()
        self.messages = []
        sink = self
        ctx = None
        if tls:
            import ssl
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)

        class H(socketserver.BaseRequestHandler):
            def handle(self):
                conn = self.request
                rf, w = conn.makefile("rb"), conn.makefile("wb", buffering=0)
                w.write(b"220 sink ESMTP\r\n")
                frm, rcpt, secure = None, [], False
                while True:
                    line = rf.readline()
                    if not line:
                        return
                    cmd = line.decode("utf-8", "replace").strip()
                    up = cmd.upper()
                    if up.startswith("EHLO"):
                        w.write(b"250-sink\r\n" + (b"250-STARTTLS\r\n" if ctx and not secure else b"")
                                + b"250 SIZE 10000000\r\n")
                    elif up.startswith("HELO"):
                        w.write(b"250 sink\r\n")
                    elif up == "STARTTLS" and ctx and not secure:
                        w.write(b"220 go ahead\r\n")
                        conn = ctx.wrap_socket(conn, server_side=True)
                        rf, w = conn.makefile("rb"), conn.makefile("wb", buffering=0)
                        secure = True
                    elif up.startswith("MAIL FROM"):
                        frm = cmd[10:].strip()
                        w.write(b"250 ok\r\n")
                    elif up.startswith("RCPT TO"):
                        rcpt.append(cmd[8:].strip())
                        w.write(b"250 ok\r\n")
                    elif up == "DATA":
                        w.write(b"354 go\r\n")
                        data = b""
                        while not data.endswith(b"\r\n.\r\n"):
                            chunk = rf.readline()
                            if not chunk:
                                return
                            data += chunk
                        with sink.lock:
                            sink.messages.append({"from": frm, "rcpt": rcpt, "data": data[:-5].decode(),
                                                  "tls": secure})
                        rcpt = []
                        w.write(b"250 queued\r\n")
                    elif up == "QUIT":
                        w.write(b"221 bye\r\n")
                        return
                    elif up == "RSET" or up == "NOOP":
                        w.write(b"250 ok\r\n")
                    else:
                        w.write(b"502 no\r\n")

        class S(socketserver.ThreadingTCPServer):
            allow_reuse_address = True
            daemon_threads = True
            request_queue_size = 128

        self.srv = S(("127.0.0.1", 0), H)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def stop(self):
        self.srv.shutdown()


# ---- PostgreSQL ----

class Db:
    def __init__(self, prefix):
        base = env("TALLY_TEST_PG_URL")
        self.name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self.admin_url = base
        self.psql(f"CREATE DATABASE {self.name} OWNER tally_owner", url=base)
        self.url = re.sub(r"/[^/?]*(\?|$)", f"/{self.name}\\1", base.split("://", 1)[1], count=1)
        self.url = base.split("://", 1)[0] + "://" + self.url
        r = subprocess.run([env("TALLY_MIGRATE_BIN"), "--database-url", role_url(self.url, "tally_owner")],
                           capture_output=True, text=True)
        if r.returncode != 0:
            print("FAIL: tally-migrate: " + r.stderr, file=sys.stderr)
            sys.exit(1)

    def psql(self, sql, url=None):
        r = subprocess.run(["psql", "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", url or self.url, "-c", sql],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"psql failed: {sql}: {r.stderr}")
        return r.stdout.strip()

    def q(self, sql):
        return self.psql(sql)

    def drop(self):
        try:
            self.psql(f"DROP DATABASE IF EXISTS {self.name} WITH (FORCE)", url=self.admin_url)
        except RuntimeError as e:
            print(e, file=sys.stderr)


# ---- processes ----

class Proc:
    def __init__(self, argv, log):
        self.argv, self.log = argv, log
        self.start()

    def start(self):
        self.f = open(self.log, "ab")
        self.p = subprocess.Popen(self.argv, stdout=self.f, stderr=self.f)

    def kill9(self):
        self.p.send_signal(signal.SIGKILL)
        self.p.wait()
        self.f.close()

    def stop(self):
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.f.close()
        return self.p.returncode

    def text(self):
        with open(self.log, "rb") as f:
            return f.read().decode("utf-8", "replace")


def self_signed_cert(workdir):
    """A certificate for 127.0.0.1 that no system CA signed: (cert, key)."""
    cert, key = os.path.join(workdir, "cert.pem"), os.path.join(workdir, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", cert,
                    "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return cert, key


def start_notifier(db_url, workdir, smtp_port, extra=(), name="notifier"):
    mport = free_port()
    argv = [env("TALLY_NOTIFIER_BIN"), "--database-url", role_url(db_url, "tally_notifier"), "--allow-http", "127.0.0.1",
            "--smtp-url", f"smtp://127.0.0.1:{smtp_port}", "--smtp-from", "tally <alerts@tally.test>",
            "--dashboard-url", "https://dashboard.tally.test/", "--metrics-port", str(mport),
            "--retry-base-ms", "200", "--retry-max-ms", "2000", "--timeout-ms", "20000", "--log-level", "debug"]
    argv += list(extra)
    p = Proc(argv, os.path.join(workdir, name + ".log"))
    p.metrics_port = mport
    return p


def http_get(url):
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


# ---- tally-api ----

class Api:
    def __init__(self, db_url, workdir):
        self.log = os.path.join(workdir, "api.log")
        self.proc = Proc([env("TALLY_API_BIN"), "--database-url", role_url(db_url, "tally_api"), "--port", "0",
                          "--cookie-secure=false", "--vmm-sockets", os.path.join(workdir, "no-vmm.sock"),
                          "--rate-per-s", "100", "--rate-burst", "1000"], self.log)
        m = wait_for(lambda: re.search(r'msg="listening".* port=(\d+)', self.proc.text()), 20)
        if not m:
            print("FAIL: tally-api did not start:\n" + self.proc.text(), file=sys.stderr)
            sys.exit(1)
        self.port = int(m.group(1))

    def call(self, method, path, body=None, key=None, session=None):
        h = {"Content-Type": "application/json"}
        if key:
            h["Authorization"] = "Bearer " + key
        if session:
            h["Cookie"] = "tally_session=" + session[0]
            h["X-CSRF-Token"] = session[1]
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=data, headers=h, method=method)
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                raw = r.read()
                return r.status, (json.loads(raw) if raw else None), r.headers
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                j = json.loads(raw)
            except ValueError:
                j = None
            return e.code, j, e.headers

    def sign_in(self, email, password):
        st, j, h = self.call("POST", "/v1/sessions", {"email": email, "password": password})
        if st != 201:
            return None
        m = re.search(r"tally_session=([^;]+)", h.get("Set-Cookie", ""))
        return (m.group(1), j["csrf_token"]) if m else None

    def stop(self):
        self.proc.stop()


def admin(db_url, *args):
    role = "tally_close_due" if "close-due" in args else "tally_admin"
    r = subprocess.run([env("TALLY_ADMIN_BIN"), "--database-url", role_url(db_url, role)] + list(args),
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"tally-admin {args}: {r.stderr}")
    return r.stdout


def make_account(db_url, workdir, acct, email, password="correct horse battery"):
    """An account with a person and a key; returns the key's (id, secret)."""
    pw = os.path.join(workdir, acct + ".pw")
    with open(pw, "w") as f:
        f.write(password + "\n")
    admin(db_url, "account", "create", acct, "--name", acct)
    admin(db_url, "person", "create", "--account", acct, "--email", email, "--password-file", pw)
    out = admin(db_url, "key", "create", "--account", acct, "--name", "agent")
    kid = re.search(r"id=(\S+)", out).group(1)
    sec = re.search(r"key=(\S+)", out).group(1)
    return kid, sec


def workdir(prefix):
    base = os.environ.get("TALLY_TEST_WORK") or tempfile.gettempdir()
    return tempfile.mkdtemp(prefix=prefix + "-", dir=base)


# What the aggregator runs when a batch crosses a threshold (aggregator/store.c,
# limits_sql): the same insert, committed on its own.
def threshold_sql(key, account, pct, spend, limit, day="(now() AT TIME ZONE 'UTC')::date"):
    return (f"INSERT INTO alerts (key_id, day, threshold_pct, account_id, spend_nanodollars, limit_nanodollars)"
            f" VALUES ('{key}', {day}, {pct}, '{account}', {spend}, {limit})"
            f" ON CONFLICT (key_id, day, threshold_pct) DO NOTHING")


def record_threshold(db, key, account, pct, spend, limit, day="(now() AT TIME ZONE 'UTC')::date"):
    db.q(threshold_sql(key, account, pct, spend, limit, day))
