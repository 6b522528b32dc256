# scripts/lib.sh — shared by scripts/up, scripts/test and scripts/bench.
# Installs what tally needs from Debian, builds it, and runs the services it
# stands on: a private PostgreSQL 15 cluster and the Kafka development broker.
# PostgreSQL refuses to run as root, so as root its server runs as the
# unprivileged user "tally" (created if missing).

set -euo pipefail

TALLY_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}

# Every Debian package a build, a test run or `up` needs. One list, used everywhere.
TALLY_DEB_PACKAGES=(
  build-essential meson ninja-build pkg-config
  libpq-dev librdkafka-dev libjansson-dev libmicrohttpd-dev libcmocka-dev libinih-dev
  libssl-dev libcurl4-openssl-dev
  postgresql-15 postgresql-client-15 valgrind iproute2
  qemu-system-x86 busybox-static cpio
  clang llvm bpftool libbpf-dev
  libseccomp-dev e2fsprogs
)

say() { printf '%s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

ensure_packages() {
  local missing=() p
  for p in "${TALLY_DEB_PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  say "installing Debian packages: ${missing[*]}"
  local sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  "${sudo[@]}" apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
}

# build DIR [meson options...]: configures once, then builds incrementally.
build_tally() {
  local dir=$1; shift
  if [ ! -f "$TALLY_ROOT/$dir/build.ninja" ]; then
    meson setup "$TALLY_ROOT/$dir" "$TALLY_ROOT" "$@" >/dev/null
  else
    # A build folder made before an option existed does not know it: reconfigure from scratch then.
    meson configure "$TALLY_ROOT/$dir" "$@" >/dev/null 2>&1 ||
      meson setup --reconfigure "$TALLY_ROOT/$dir" "$TALLY_ROOT" "$@" >/dev/null
  fi
  ninja -C "$TALLY_ROOT/$dir" >/dev/null || ninja -C "$TALLY_ROOT/$dir"
}

# The user PostgreSQL runs as, and a command prefix that runs as it.
pg_user() { if [ "$(id -u)" -eq 0 ]; then echo tally; else id -un; fi; }
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then (cd / && runuser -u tally -- "$@"); else "$@"; fi
}
ensure_pg_user() {
  [ "$(id -u)" -eq 0 ] || return 0
  id tally >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin tally
}

# A port on 127.0.0.1 nothing listens on (tried by connecting to it).
free_port() {
  local p
  for _ in $(seq 1 200); do
    p=$(( (RANDOM % 30000) + 20000 ))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then echo "$p"; return 0; fi
  done
  die "no free port found"
}

# pg_start DATADIR PORT LOGFILE: initialises the cluster if needed, starts it,
# and creates database "tally". DATADIR's parents must be searchable by the
# PostgreSQL user.
pg_start() {
  local data=$1 port=$2 log=$3
  ensure_pg_user
  mkdir -p "$(dirname "$data")" "$(dirname "$log")"
  if [ "$(id -u)" -eq 0 ]; then chown "$(pg_user)" "$(dirname "$data")"; touch "$log"; chown "$(pg_user)" "$log"; fi
  as_pg test -x "$(dirname "$data")" || die "PostgreSQL's user $(pg_user) cannot reach $(dirname "$data")"
  if [ ! -f "$data/PG_VERSION" ]; then
    as_pg "$PG_BIN/initdb" -D "$data" -U tally --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
  fi
  if ! as_pg "$PG_BIN/pg_ctl" -D "$data" status >/dev/null 2>&1; then
    as_pg "$PG_BIN/pg_ctl" -D "$data" -l "$log" -w -t 60 start \
      -o "-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories='' -c fsync=${TALLY_PG_FSYNC:-on} -c max_connections=200" >/dev/null \
      || { tail -20 "$log" >&2; die "PostgreSQL did not start (log: $log)"; }
  fi
  local i
  for i in $(seq 1 50); do
    "$PG_BIN/psql" -X -q -h 127.0.0.1 -p "$port" -U tally -d postgres -c 'SELECT 1' >/dev/null 2>&1 && break
    sleep 0.2
  done
  "$PG_BIN/psql" -X -q -h 127.0.0.1 -p "$port" -U tally -d postgres -tAc \
    "SELECT 1 FROM pg_database WHERE datname = 'tally'" | grep -q 1 \
    || "$PG_BIN/createdb" -h 127.0.0.1 -p "$port" -U tally tally
}

# pg_data_dir STATE: where a state folder's cluster lives: STATE/pg when the
# PostgreSQL user can reach it, else (a state folder under a private home, say)
# a folder of its own under /var/tmp named for STATE.
pg_data_dir() {
  local state=$1
  ensure_pg_user
  mkdir -p "$state/pg"
  [ "$(id -u)" -eq 0 ] && chown "$(pg_user)" "$state/pg"
  if as_pg test -x "$state/pg" 2>/dev/null; then
    echo "$state/pg/data"
  else
    echo "/var/tmp/tally-pg-$(printf '%s' "$state" | md5sum | cut -c1-12)/data"
  fi
}

pg_stop() {
  local data=$1
  [ -f "$data/postmaster.pid" ] || return 0
  as_pg "$PG_BIN/pg_ctl" -D "$data" -m fast -w stop >/dev/null 2>&1 || true
}

# broker_start BIN RUNDIR PORT: starts tally-broker in the background and waits
# for its bootstrap file. Leaves RUNDIR/broker.pid, broker.bootstrap, broker.sock.
broker_start() {
  local bin=$1 run=$2 port=$3
  mkdir -p "$run"
  rm -f "$run/broker.bootstrap"
  "$bin" --port "$port" --partitions "${TALLY_PARTITIONS:-4}" \
    --bootstrap-file "$run/broker.bootstrap" --control-socket "$run/broker.sock" \
    >"$run/broker.out" 2>"$run/broker.log" &
  echo $! >"$run/broker.pid"
  local i
  for i in $(seq 1 100); do
    [ -s "$run/broker.bootstrap" ] && return 0
    kill -0 "$(cat "$run/broker.pid")" 2>/dev/null || { cat "$run/broker.log" >&2; die "tally-broker exited"; }
    sleep 0.1
  done
  die "tally-broker did not become ready"
}

# stop_pidfile FILE: SIGTERM, wait up to 10 s, then SIGKILL.
stop_pidfile() {
  local f=$1 pid i
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

# start_test_services WORK: a throwaway PostgreSQL cluster and development
# broker under WORK, for tests and benchmarks; exports TALLY_TEST_PG_URL,
# TALLY_TEST_BROKERS, TALLY_TEST_BROKER_CONTROL and TALLY_TEST_WORK.
# stop_test_services WORK removes them.
start_test_services() {
  local work=$1 build=${2:-$TALLY_ROOT/build} port
  chmod 755 "$work"
  port=$(free_port)
  TALLY_PG_FSYNC=${TALLY_PG_FSYNC:-off} pg_start "$work/pg/data" "$port" "$work/postgresql.log"
  broker_start "$build/broker/tally-broker" "$work/run" 0
  export TALLY_TEST_PG_URL="postgresql://tally@127.0.0.1:$port/postgres"
  export TALLY_TEST_BROKERS; TALLY_TEST_BROKERS=$(cat "$work/run/broker.bootstrap")
  export TALLY_TEST_BROKER_CONTROL=$work/run/broker.sock
  export TALLY_TEST_WORK=$work
}
stop_test_services() {
  local work=$1
  stop_pidfile "$work/run/broker.pid"
  pg_stop "$work/pg/data"
  rm -rf "$work"
}
