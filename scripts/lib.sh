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
  libssl-dev libcurl4-openssl-dev libcrypt-dev libgnutls28-dev openssl
  postgresql-15 postgresql-client-15 valgrind iproute2
  qemu-system-x86 busybox-static cpio
  clang llvm bpftool libbpf-dev libclang-rt-14-dev
  libseccomp-dev e2fsprogs
  python3 wrk
  maven openjdk-17-jre-headless openjdk-17-jdk-headless
  chromium
  prometheus
)
# Commands a package provides, installed only when the command is missing: nodejs
# and npm may come from elsewhere than Debian (a newer Node.js already on the host).
# npm installs the dashboard's chart library and the browser test's driver (web/package.json).
TALLY_DEB_COMMANDS=(npm:npm node:nodejs)

say() { printf '%s\n' "$*" >&2; }
die() { say "error: $*"; exit 1; }

ensure_packages() {
  local missing=() p
  for p in "${TALLY_DEB_PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  for p in "${TALLY_DEB_COMMANDS[@]}"; do
    command -v "${p%%:*}" >/dev/null 2>&1 || missing+=("${p#*:}")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing Debian packages: ${missing[*]}"
    local sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    "${sudo[@]}" apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
  fi
  # The dashboard's chart library and the browser test's driver (the demo test needs both).
  web_deps
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

# build_tally_progress DIR: build_tally for people watching (scripts/up): says what it
# does and shows ninja's progress on one line instead of minutes of silence.
build_tally_progress() {
  local dir=$1; shift
  if [ ! -f "$TALLY_ROOT/$dir/build.ninja" ]; then
    say "configuring the build in $dir/ (meson)"
    meson setup "$TALLY_ROOT/$dir" "$TALLY_ROOT" "$@" >/dev/null
  fi
  local todo
  todo=$(ninja -C "$TALLY_ROOT/$dir" -n 2>/dev/null | grep -c '^\[' || true)
  if [ "${todo:-0}" -eq 0 ]; then
    say "build is up to date ($dir/)"
    return 0
  fi
  # (ninja's count before the build: steps that regenerate files add to it as it runs)
  say "building tally into $dir/ (the first build takes a minute or two)"
  local log=$TALLY_ROOT/$dir/up-build.log last=-1 line n total pct t0
  t0=$(date +%s)
  if ! ninja -C "$TALLY_ROOT/$dir" 2>&1 | tee "$log" | while IFS= read -r line; do
      [[ $line =~ ^\[([0-9]+)/([0-9]+)\]\ (.*)$ ]] || continue
      n=${BASH_REMATCH[1]}; total=${BASH_REMATCH[2]}; pct=$(( n * 100 / total ))
      if [ -t 2 ]; then
        printf '\r  [%3d%%] %-70.70s' "$pct" "${BASH_REMATCH[3]}" >&2
      elif [ $(( pct / 10 )) -ne "$last" ]; then
        last=$(( pct / 10 )); printf '  build %3d%% (%d/%d)\n' "$pct" "$n" "$total" >&2
      fi
    done; then
    [ -t 2 ] && printf '\n' >&2
    say "build failed (log: $log)"; tail -30 "$log" >&2; exit 1
  fi
  [ -t 2 ] && printf '\r%-80s\r' '' >&2
  say "built in $(( $(date +%s) - t0 )) s"
}

# web_deps: the dashboard's npm packages (web/package.json, pinned by web/package-lock.json)
# in web/node_modules, installed with `npm ci` when missing or older than the lock file.
web_deps() {
  local web=$TALLY_ROOT/web
  [ -f "$web/package-lock.json" ] || return 0
  if [ ! -f "$web/node_modules/.package-lock.json" ] || [ "$web/package-lock.json" -nt "$web/node_modules/.package-lock.json" ]; then
    say "installing the dashboard's npm packages (web/package-lock.json)"
    (cd "$web" && npm ci --no-audit --no-fund --loglevel=error >/dev/null) || die "npm ci failed in $web"
  fi
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

# port_range: "LO HI", the ports free_port picks from: below the kernel's ephemeral range
# (/proc/sys/net/ipv4/ip_local_port_range, where outgoing connections take their local
# ports: 32768-60999 by default), from 20000; as tests/support/ports.c's test_port_range.
port_range() {
  local low=32768 high=60999 l h
  if read -r l h </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null &&
     [[ $l =~ ^[0-9]+$ && $h =~ ^[0-9]+$ ]] && [ "$l" -gt 0 ] && [ "$h" -ge "$l" ] && [ "$h" -le 65535 ]; then
    low=$l; high=$h
  fi
  if [ $(( low - 1 - 20000 )) -ge 1000 ]; then echo "20000 $(( low - 1 ))"
  elif [ $(( low - 1 - 1024 )) -ge 1000 ]; then echo "1024 $(( low - 1 ))"
  elif [ $(( 65535 - high - 1 )) -ge 1000 ]; then echo "$(( high + 1 )) 65535"
  else say "warning: the ephemeral port range $low-$high leaves no ports outside it"; echo "1024 65535"
  fi
}

# free_port [PORT...]: a port on 127.0.0.1 for a server started later, random in port_range
# (below the ephemeral range: an outgoing connection to PostgreSQL or Kafka cannot take it
# before the server binds), none of the PORTs given, nothing listening there (tried by
# connecting) and, where ss(8) is installed, no socket of any state using it.
free_port() {
  local lo hi p x taken
  read -r lo hi < <(port_range)
  for _ in $(seq 1 500); do
    p=$(( lo + ( (RANDOM << 15 | RANDOM) % (hi - lo + 1) ) ))
    taken=0
    for x in "$@"; do [ "$x" = "$p" ] && taken=1; done
    [ $taken = 0 ] || continue
    (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && continue
    if command -v ss >/dev/null 2>&1 && [ -n "$(ss -Htan "( sport = :$p )" 2>/dev/null)" ]; then continue; fi
    echo "$p"; return 0
  done
  die "no free port found in $lo-$hi"
}

# ---- PostgreSQL: a private cluster, SCRAM passwords only, one role per program.
# The cluster's superuser (named tally, made by initdb) is used only here, to make the
# roles and databases; tally's programs log in as the roles sql/roles/roles.sql makes,
# with the grants sql/013_roles.sql gives (docs/security.md). Passwords are generated
# into a secrets folder (0700; one pgpass file per role, 0600).

# The login each program connects as (its role's name). tally_finance is a login in
# the finance group (a person's, for the finance views).
PG_LOGINS=(tally_owner tally_aggregator tally_api tally_admin tally_vmm tally_notifier tally_close_due tally_finance)

# pg_passfile SECRETS ROLE: the role's pgpass file (libpq's PGPASSFILE or passfile=).
pg_passfile() { echo "$1/pg-$2.pgpass"; }

# pg_secret SECRETS ROLE: makes ROLE's password (random, 32 characters) and pgpass file once;
# prints the password.
pg_secret() {
  local dir=$1 role=$2 f pw
  f=$(pg_passfile "$dir" "$role")
  (umask 077; mkdir -p "$dir")
  chmod 700 "$dir"
  if [ ! -s "$f" ]; then
    pw=$(head -c 24 /dev/urandom | base64 | tr -d '/+=\n' | cut -c1-32)
    (umask 077; printf '*:*:*:%s:%s\n' "$role" "$pw" >"$f.tmp")
    mv "$f.tmp" "$f"
  fi
  chmod 600 "$f"
  cut -d: -f5- <"$f"
}

# pg_admin_psql SECRETS PORT DB ARGS...: psql as the cluster's superuser.
pg_admin_psql() {
  local dir=$1 port=$2 db=$3; shift 3
  PGPASSFILE=$(pg_passfile "$dir" tally) "$PG_BIN/psql" -X -q -v ON_ERROR_STOP=1 \
    -h 127.0.0.1 -p "$port" -U tally -d "$db" "$@"
}

# pg_start DATADIR PORT LOGFILE SECRETS: initialises the cluster if needed (SCRAM for
# every connection, the superuser's password in SECRETS), starts it, makes tally's
# roles with their passwords (SECRETS/pg-ROLE.pgpass) and database "tally", owned by
# tally_owner. DATADIR's parents must be searchable by the PostgreSQL user.
pg_start() {
  local data=$1 port=$2 log=$3 secrets=$4 pw
  ensure_pg_user
  mkdir -p "$(dirname "$data")" "$(dirname "$log")"
  if [ "$(id -u)" -eq 0 ]; then chown "$(pg_user)" "$(dirname "$data")"; touch "$log"; chown "$(pg_user)" "$log"; fi
  as_pg test -x "$(dirname "$data")" || die "PostgreSQL's user $(pg_user) cannot reach $(dirname "$data")"
  pw=$(pg_secret "$secrets" tally)
  if [ ! -f "$data/PG_VERSION" ]; then
    # The superuser's password reaches initdb in a file only PostgreSQL's user reads, removed at once.
    local pwfile; pwfile=$(dirname "$data")/.initdb-pw
    (umask 077; printf '%s\n' "$pw" >"$pwfile")
    [ "$(id -u)" -eq 0 ] && chown "$(pg_user)" "$pwfile"
    as_pg "$PG_BIN/initdb" -D "$data" -U tally --auth=scram-sha-256 --pwfile="$pwfile" -E UTF8 --locale=C.UTF-8 >/dev/null \
      || { rm -f "$pwfile"; die "initdb failed in $data"; }
    rm -f "$pwfile"
  fi
  local trusting=0
  grep -Eq '^[^#]*[[:space:]]trust([[:space:]]|$)' "$data/pg_hba.conf" 2>/dev/null && trusting=1
  if ! as_pg "$PG_BIN/pg_ctl" -D "$data" status >/dev/null 2>&1; then
    as_pg "$PG_BIN/pg_ctl" -D "$data" -l "$log" -w -t 60 start \
      -o "-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories='' -c fsync=${TALLY_PG_FSYNC:-on} -c max_connections=200 -c password_encryption=scram-sha-256" >/dev/null \
      || { tail -20 "$log" >&2; die "PostgreSQL did not start (log: $log)"; }
  fi
  if [ $trusting = 1 ]; then
    # A cluster made before passwords (initdb --auth=trust): its superuser gets one, then
    # every line of pg_hba.conf asks for SCRAM.
    say "PostgreSQL in $data trusted local connections: giving it passwords (SCRAM) now"
    "$PG_BIN/psql" -X -q -h 127.0.0.1 -p "$port" -U tally -d postgres \
      -c "SET password_encryption = 'scram-sha-256'; ALTER ROLE tally PASSWORD '$pw'" >/dev/null \
      || die "could not set the password of PostgreSQL's superuser"
    as_pg sed -i -E 's/^([^#]*[[:space:]])trust([[:space:]]|$)/\1scram-sha-256\2/' "$data/pg_hba.conf"
    as_pg "$PG_BIN/pg_ctl" -D "$data" reload >/dev/null
  fi
  local i
  for i in $(seq 1 50); do
    pg_admin_psql "$secrets" "$port" postgres -c 'SELECT 1' >/dev/null 2>&1 && break
    sleep 0.2
  done
  pg_roles "$secrets" "$port"
  pg_admin_psql "$secrets" "$port" postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'tally'" | grep -q 1 \
    || pg_admin_psql "$secrets" "$port" postgres -c 'CREATE DATABASE tally OWNER tally_owner'
  pg_adopt "$secrets" "$port" tally
}

# pg_roles SECRETS PORT: tally's roles (sql/roles/roles.sql, run as the superuser), each
# login's password from SECRETS, and the finance login tally_finance.
pg_roles() {
  local secrets=$1 port=$2 role sql=""
  for role in "${PG_LOGINS[@]}"; do
    sql+="ALTER ROLE $role LOGIN PASSWORD '$(pg_secret "$secrets" "$role")';"
  done
  pg_admin_psql "$secrets" "$port" postgres -f "$TALLY_ROOT/sql/roles/roles.sql" >/dev/null \
    || die "could not make tally's PostgreSQL roles (sql/roles/roles.sql)"
  pg_admin_psql "$secrets" "$port" postgres >/dev/null <<SQL || die "could not set the PostgreSQL roles' passwords"
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'tally_finance') THEN
    CREATE ROLE tally_finance LOGIN IN ROLE finance;
  END IF;
END \$\$;
ALTER ROLE tally_finance SET search_path = finance;
SET password_encryption = 'scram-sha-256';
$sql
SQL
}

# pg_adopt SECRETS PORT DB: gives DB and everything of tally's in it to tally_owner (a
# database a superuser migrated, before roles: the migrations must then run as the owner).
pg_adopt() {
  pg_admin_psql "$1" "$2" "$3" >/dev/null <<'SQL' || die "could not give database $3 to tally_owner"
DO $$
DECLARE r record;
BEGIN
  EXECUTE format('ALTER DATABASE %I OWNER TO tally_owner', current_database());
  FOR r IN SELECT c.oid::regclass AS o FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname IN ('public', 'finance') AND c.relkind IN ('r', 'p', 'v', 'm')
              AND c.relowner <> 'tally_owner'::regrole LOOP
    EXECUTE format('ALTER TABLE %s OWNER TO tally_owner', r.o);
  END LOOP;
  FOR r IN SELECT p.oid::regprocedure AS f FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
            WHERE n.nspname IN ('public', 'finance') AND p.proowner <> 'tally_owner'::regrole LOOP
    EXECUTE format('ALTER ROUTINE %s OWNER TO tally_owner', r.f);
  END LOOP;
  IF EXISTS (SELECT FROM pg_namespace WHERE nspname = 'finance' AND nspowner <> 'tally_owner'::regrole) THEN
    ALTER SCHEMA finance OWNER TO tally_owner;
  END IF;
END $$;
SQL
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

# pid_alive PID: the process runs. A zombie does not: it has ended and waits for its
# parent to reap it — for a daemon that outlived the script that started it, that
# parent is PID 1, which may take its time (on a loaded CI machine, seconds), and
# kill -0 still succeeds on it meanwhile.
pid_alive() {
  [ -r "/proc/$1/status" ] && ! grep -q '^State:[[:space:]]*Z' "/proc/$1/status" 2>/dev/null
}

# stop_pidfile FILE [TENTHS]: SIGTERM, wait up to TENTHS/10 s (default 10 s), then SIGKILL and
# wait up to 5 s more for it to end.
stop_pidfile() {
  local f=$1 tenths=${2:-100} pid i
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if pid_alive "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 "$tenths"); do pid_alive "$pid" || break; sleep 0.1; done
    if pid_alive "$pid"; then
      kill -KILL "$pid" 2>/dev/null || true
      for i in $(seq 1 50); do pid_alive "$pid" || break; sleep 0.1; done
    fi
  fi
  rm -f "$f"
}

# ---- Apache Kafka (scripts/kafka): jars from kafka/pom.xml through Maven, KRaft nodes on loopback.

KAFKA_POM=$TALLY_ROOT/kafka/pom.xml
kafka_version() { sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$KAFKA_POM"; }
kafka_cache() { echo "${TALLY_KAFKA_CACHE:-${XDG_CACHE_HOME:-/var/cache}/tally/kafka}"; }

# kafka_fetch: the folder of jars kafka/pom.xml resolves to, fetched through Maven the first
# time (keyed by the descriptor's content, so editing it fetches again) and reused after.
kafka_fetch() {
  local cache ver dir
  cache=$(kafka_cache); ver=$(kafka_version)
  [ -n "$ver" ] || die "no kafka.version in $KAFKA_POM"
  dir=$cache/$ver-$(md5sum <"$KAFKA_POM" | cut -c1-8)
  if [ ! -f "$dir/.complete" ]; then
    mkdir -p "$cache"
    (
      flock 9
      if [ ! -f "$dir/.complete" ]; then
        say "fetching Apache Kafka $ver through Maven into $dir"
        rm -rf "$dir.tmp"
        mvn -q -B -f "$KAFKA_POM" dependency:copy-dependencies -DincludeScope=runtime \
          -DoutputDirectory="$dir.tmp" >"$cache/mvn.log" 2>&1 \
          || { tail -30 "$cache/mvn.log" >&2; die "Maven could not resolve $KAFKA_POM (log: $cache/mvn.log)"; }
        rm -rf "$TALLY_ROOT/kafka/target"
        touch "$dir.tmp/.complete"
        rm -rf "$dir"; mv "$dir.tmp" "$dir"
      fi
    ) 9>"$cache/.lock" || exit 1
  fi
  echo "$dir"
}

# kafka_tool CLASS ARGS...: one of Kafka's command-line tools, in the foreground.
kafka_tool() {
  local cls=$1; shift
  java -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -cp "$KAFKA_LIBS/*" "$cls" "$@"
}

# ---- Who may connect to Apache Kafka (docs/kafka.md, "Principals and ACLs"). Every connection
# authenticates with SASL/PLAIN (kafka/server.properties.in says why not SCRAM) and may do only
# what an ACL allows. Principals:
#   admin          the nodes themselves (between brokers, to the controllers) and scripts/kafka's
#                  own tools: the one super user
#   aggregator     every tally-aggregator: reads usage (group tally-aggregator), writes control
#   host-<ID>      one per host, its tally-collector and tally-vmm: write usage, read control
#                  (group tally-vmm-<ID>); TALLY_KAFKA_HOSTS lists the IDs ("ID ID ...")
# Passwords are random, kept in one file ("user password" lines, 0600): TALLY_KAFKA_CREDENTIALS
# when set (scripts/test: one file for every cluster of a test run), else DIR/credentials.
KAFKA_SASL_MECHANISM=PLAIN

kafka_credentials() { echo "${TALLY_KAFKA_CREDENTIALS:-$1/credentials}"; }

# kafka_password FILE USER: USER's password in FILE, a new random one added first when it has none.
kafka_password() {
  local f=$1 u=$2
  mkdir -p "$(dirname "$f")"
  (
    flock 9
    local pw
    pw=$(awk -v u="$u" '$1 == u { print $2; exit }' "$f" 2>/dev/null || true)
    if [ -z "$pw" ]; then
      pw=$(head -c 30 /dev/urandom | base64 | tr -d '/+=\n' | cut -c1-32)
      (umask 077; echo "$u $pw" >>"$f")
    fi
    chmod 600 "$f"
    echo "$pw"
  ) 9>>"$f.lock"
}

# kafka_client_settings DIR USER: what a tally daemon connecting as USER sets, as kafka_settings
# (its password goes apart, as kafka_sasl_password: kafka_password).
kafka_client_settings() {
  echo "security.protocol=SASL_PLAINTEXT,sasl.mechanisms=$KAFKA_SASL_MECHANISM,sasl.username=$2"
}

# kafka_hosts: the host IDs whose principals a new cluster gets.
kafka_hosts() { echo "${TALLY_KAFKA_HOSTS:-}"; }

# kafka_admin_config DIR: DIR/admin.properties, the admin client settings of Kafka's tools (0600).
kafka_admin_config() {
  local dir=$1 pw
  pw=$(kafka_password "$(kafka_credentials "$dir")" admin)
  (umask 077; cat >"$dir/admin.properties" <<PROPS
security.protocol=SASL_PLAINTEXT
sasl.mechanism=$KAFKA_SASL_MECHANISM
sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="admin" password="$pw";
PROPS
  )
}

# kafka_bootstrap DIR: DIR's bootstrap list, also while kafka_start has not written DIR/bootstrap yet.
kafka_bootstrap() {
  if [ -f "$1/bootstrap" ]; then cat "$1/bootstrap"; else cat "$1/bootstrap.pending"; fi
}

# kafka_acl_tool: the folder of kafka/TallyAcls.class, compiled once (keyed by the source and
# the jars) into the cache beside the jars. One JVM creates all of a cluster's ACLs.
kafka_acl_tool() {
  local libs=${KAFKA_LIBS:-$(kafka_fetch)} src=$TALLY_ROOT/kafka/TallyAcls.java dir
  dir=$(kafka_cache)/tally-acls-$(cat "$src" <(basename "$libs") | md5sum | cut -c1-8)
  if [ ! -f "$dir/TallyAcls.class" ]; then
    command -v javac >/dev/null || die "javac is not installed (scripts/lib.sh installs openjdk-17-jdk-headless)"
    (
      flock 9
      if [ ! -f "$dir/TallyAcls.class" ]; then
        rm -rf "$dir.tmp"; mkdir -p "$dir.tmp"
        javac -nowarn -cp "$libs/*" -d "$dir.tmp" "$src" >&2 || die "could not compile $src"
        rm -rf "$dir"; mv "$dir.tmp" "$dir"
      fi
    ) 9>"$(kafka_cache)/.lock" || exit 1
  fi
  echo "$dir"
}

# kafka_acls DIR: every principal's ACLs on a new cluster, as admin: the aggregator's, and
# host-ID's for each of kafka_hosts: write usage, read control in its own consumer group
# (tally-vmm-ID). With TALLY_KAFKA_HOST_GROUPS=prefixed (the tests' one host principal, standing
# for every --host-id a test gives its vmm) the group is any tally-vmm-*.
kafka_acls() {
  local dir=$1 id tool group
  tool=$(kafka_acl_tool)
  {
    echo "User:aggregator Read Topic Literal usage"
    echo "User:aggregator Read Group Literal tally-aggregator"
    echo "User:aggregator Write Topic Literal control"
    for id in $(kafka_hosts); do
      group="Literal tally-vmm-$id"
      [ "${TALLY_KAFKA_HOST_GROUPS:-}" = prefixed ] && group="Prefixed tally-vmm-"
      echo "User:host-$id Write Topic Literal usage"
      echo "User:host-$id Read Topic Literal control"
      echo "User:host-$id Read Group $group"
    done
  } | java -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -cp "$tool:$KAFKA_LIBS/*" TallyAcls \
        "$(kafka_bootstrap "$dir")" "$dir/admin.properties" >"$dir/acls.log" 2>&1 \
    || { tail -20 "$dir/acls.log" >&2; die "could not set the ACLs of the kafka cluster in $dir"; }
}

# kafka_start_node DIR N: starts node N of DIR's cluster in the background (its
# server.properties written and its storage formatted before).
kafka_start_node() {
  local dir=$1 n=$2 nd heap
  nd=$dir/node.$n
  KAFKA_LIBS=${KAFKA_LIBS:-$(kafka_fetch)}
  heap=$(cat "$dir/heap")
  # Detached from the caller's terminal, stdin and pipes: the node outlives the command that started it.
  setsid java -Xms64m "-Xmx$heap" -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -Djava.awt.headless=true \
    "-Dkafka.logs.dir=$nd" "-Dlog4j2.configurationFile=$TALLY_ROOT/kafka/log4j2.properties" \
    -cp "$KAFKA_LIBS/*" kafka.Kafka "$nd/server.properties" </dev/null >"$nd/stdout.log" 2>&1 &
  echo $! >"$nd/pid"
}

# kafka_wait_node DIR N: waits (60 s at most) until node N accepts connections.
kafka_wait_node() {
  local dir=$1 n=$2 port i
  port=$(cat "$dir/node.$n/port")
  for i in $(seq 1 600); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
    kill -0 "$(cat "$dir/node.$n/pid")" 2>/dev/null || { tail -n 20 "$dir/node.$n/server.log" "$dir/node.$n/stdout.log" >&2; die "kafka node $n exited (log: $dir/node.$n/server.log)"; }
    sleep 0.1
  done
  die "kafka node $n did not listen on $port within 60 s (log: $dir/node.$n/server.log)"
}

# kafka_create_topic DIR NAME PARTITIONS RETENTION_MS: creates a topic replicated on every node
# (min.insync.replicas: 2 of 3, 1 of 1), retrying while the brokers register.
kafka_create_topic() {
  local dir=$1 name=$2 parts=$3 retention=$4 n rf minisr i out
  n=$(cat "$dir/nodes"); rf=$n; minisr=$(( n > 1 ? 2 : 1 ))
  KAFKA_LIBS=${KAFKA_LIBS:-$(kafka_fetch)}
  local extra=() c
  for c in ${TALLY_KAFKA_TOPIC_CONFIG:-}; do extra+=(--config "$c"); done
  for i in $(seq 1 30); do
    if out=$(kafka_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$(kafka_bootstrap "$dir")" \
               --command-config "$dir/admin.properties" --create --if-not-exists --topic "$name" --partitions "$parts" --replication-factor "$rf" \
               --config "retention.ms=$retention" --config "min.insync.replicas=$minisr" "${extra[@]}" 2>&1); then
      return 0
    fi
    sleep 1
  done
  say "$out"
  die "could not create topic $name on $dir"
}

# kafka_new_port DIR: a free port (below the ephemeral range: the node binds it seconds
# later, once the JVM is up) none of DIR's nodes has taken yet.
kafka_new_port() {
  # shellcheck disable=SC2046
  free_port $(cat "$1"/node.*/port "$1"/node.*/controller_port 2>/dev/null)
}

# kafka_start DIR NODES PARTITIONS RETENTION_MS HEAP [PORT]: a fresh KRaft cluster in DIR
# (formatted, started, topics usage and control created); writes DIR/bootstrap last.
kafka_start() {
  local dir=$1 nodes=$2 parts=$3 retention=$4 heap=$5 port=${6:-} n voters="" cluster t0
  t0=$(date +%s%N)
  command -v java >/dev/null || die "java is not installed (scripts/lib.sh installs it)"
  KAFKA_LIBS=$(kafka_fetch)
  if [ -f "$dir/nodes" ]; then
    for n in $(seq 1 "$(cat "$dir/nodes")"); do
      if [ -f "$dir/node.$n/pid" ] && kill -0 "$(cat "$dir/node.$n/pid")" 2>/dev/null; then
        die "kafka already runs in $dir (scripts/kafka stop $dir first)"
      fi
    done
  fi
  mkdir -p "$dir"; rm -f "$dir/bootstrap"
  echo "$nodes" >"$dir/nodes"; echo "$heap" >"$dir/heap"
  local bootstrap=()
  for n in $(seq 1 "$nodes"); do
    mkdir -p "$dir/node.$n"
    if [ -n "$port" ]; then echo $((port + n - 1)) >"$dir/node.$n/port"; else kafka_new_port "$dir" >"$dir/node.$n/port"; fi
    kafka_new_port "$dir" >"$dir/node.$n/controller_port"
    voters+="${voters:+,}$n@127.0.0.1:$(cat "$dir/node.$n/controller_port")"
    bootstrap+=("127.0.0.1:$(cat "$dir/node.$n/port")")
  done
  (IFS=,; echo "${bootstrap[*]}") >"$dir/bootstrap.pending"
  # A random cluster id (16 bytes, base64url); it may begin with "-", hence --cluster-id=ID below.
  cluster=$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')
  # Credentials first: every principal's user and password go into each server.properties.
  local creds admin_pw users="" u
  creds=$(kafka_credentials "$dir")
  admin_pw=$(kafka_password "$creds" admin)
  kafka_admin_config "$dir"
  for u in admin aggregator $(for n in $(kafka_hosts); do echo "host-$n"; done); do
    users+="${users:+ }user_$u=\"$(kafka_password "$creds" "$u")\""
  done
  local pids=()
  for n in $(seq 1 "$nodes"); do
    (umask 077; sed -e "s|@NODE_ID@|$n|" -e "s|@ADMIN_PASSWORD@|$admin_pw|g" -e "s|@PLAIN_USERS@|$users|" -e "s|@VOTERS@|$voters|" \
        -e "s|@PORT@|$(cat "$dir/node.$n/port")|" -e "s|@CONTROLLER_PORT@|$(cat "$dir/node.$n/controller_port")|" \
        -e "s|@DATA_DIR@|$dir/node.$n/data|" -e "s|@PARTITIONS@|$parts|" \
        -e "s|@REPLICATION@|$nodes|" -e "s|@MIN_ISR@|$(( nodes > 1 ? 2 : 1 ))|" \
        -e "s|@RETENTION_MS@|$retention|" -e "s|@RETENTION_CHECK_MS@|${TALLY_KAFKA_RETENTION_CHECK_MS:-300000}|" \
        -e "s|@SEGMENT_BYTES@|${TALLY_KAFKA_SEGMENT_BYTES:-1073741824}|" \
        "$TALLY_ROOT/kafka/server.properties.in" >"$dir/node.$n/server.properties")
    rm -rf "$dir/node.$n/data"
    kafka_tool kafka.tools.StorageTool format "--cluster-id=$cluster" -c "$dir/node.$n/server.properties" \
      >"$dir/node.$n/format.log" 2>&1 &
    pids+=($!)
  done
  for n in $(seq 1 "$nodes"); do
    wait "${pids[$((n - 1))]}" || { cat "$dir/node.$n/format.log" >&2; die "could not format kafka node $n"; }
  done
  for n in $(seq 1 "$nodes"); do kafka_start_node "$dir" "$n"; done
  for n in $(seq 1 "$nodes"); do kafka_wait_node "$dir" "$n"; done
  kafka_create_topic "$dir" usage "$parts" "$retention" &
  local a=$!
  kafka_create_topic "$dir" control "$parts" "$retention" || { wait $a; return 1; }
  wait $a || return 1
  kafka_acls "$dir"
  mv "$dir/bootstrap.pending" "$dir/bootstrap"
  say "kafka $(kafka_version): $nodes node(s) on $(cat "$dir/bootstrap"), topics usage and control ($parts partitions, retention ${retention} ms), SASL/$KAFKA_SASL_MECHANISM and ACLs for admin, aggregator${TALLY_KAFKA_HOSTS:+, host-${TALLY_KAFKA_HOSTS// /, host-}} (credentials: $creds) in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
}

kafka_kill_node() {
  local f=$1/node.$2/pid pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  kill -KILL "$pid" 2>/dev/null || true
  while pid_alive "$pid"; do sleep 0.05; done
}

# kafka_stop DIR: SIGTERM to every node at once (a controlled shutdown), SIGKILL after 15 s.
kafka_stop() {
  local dir=$1 f pid i
  for f in "$dir"/node.*/pid; do
    [ -f "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null || true
  done
  for f in "$dir"/node.*/pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    for i in $(seq 1 150); do pid_alive "$pid" || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    rm -f "$f"
  done
}

kafka_status() {
  local dir=$1 f n up=0
  for f in "$dir"/node.*/pid; do
    [ -f "$f" ] || continue
    n=$(basename "$(dirname "$f")")
    if kill -0 "$(cat "$f")" 2>/dev/null; then
      echo "kafka $n  running  pid $(cat "$f")  port $(cat "$(dirname "$f")/port")  log $(dirname "$f")/server.log"
      up=$((up + 1))
    else
      echo "kafka $n  stopped"
    fi
  done
  [ -f "$dir/bootstrap" ] && echo "bootstrap $(cat "$dir/bootstrap")"
  [ "$up" -gt 0 ]
}

# start_test_pg WORK: a throwaway PostgreSQL cluster under WORK, with tally's roles;
# exports TALLY_TEST_PG_URL (the cluster's superuser: tests make their databases
# with it and look into them) and PGPASSFILE, every role's password (tests start each
# program as its own role: tests/support's test_role_url).
start_test_pg() {
  local work=$1 port
  port=$(free_port)
  pg_test_start "$work/pg/data" "$port" "$work/postgresql.log" "$work/secrets"
  export PGPASSFILE=$work/secrets/pgpass
  export TALLY_TEST_PG_URL="postgresql://tally@127.0.0.1:$port/postgres"
}

# pg_role_url URL ROLE: URL (postgresql://USER@...) as ROLE; the benchmarks start each
# program as its own role with it (tests/support's test_role_url for the tests).
pg_role_url() { sed -E "s|^(postgres(ql)?://)[^@/]*@|\1$2@|" <<<"$1"; }

# pg_test_start DATADIR PORT LOGFILE SECRETS: pg_start for tests (fsync off unless
# TALLY_PG_FSYNC says otherwise), and SECRETS/pgpass: every role's password, the
# superuser's too, for the tests' PGPASSFILE.
pg_test_start() {
  local role
  TALLY_PG_FSYNC=${TALLY_PG_FSYNC:-off} pg_start "$@"
  for role in tally "${PG_LOGINS[@]}"; do cat "$(pg_passfile "$4" "$role")"; done >"$4/pgpass"
  chmod 600 "$4/pgpass"
}

# start_test_services WORK: a throwaway PostgreSQL cluster (start_test_pg) and development
# broker under WORK, for tests and benchmarks; exports TALLY_TEST_PG_URL, PGPASSFILE,
# TALLY_TEST_BROKERS, TALLY_TEST_BROKER_CONTROL and TALLY_TEST_WORK.
# stop_test_services WORK removes them.
start_test_services() {
  local work=$1 build=${2:-$TALLY_ROOT/build}
  chmod 755 "$work"
  start_test_pg "$work"
  broker_start "$build/broker/tally-broker" "$work/run" 0
  export TALLY_TEST_BROKERS; TALLY_TEST_BROKERS=$(cat "$work/run/broker.bootstrap")
  export TALLY_TEST_BROKER_CONTROL=$work/run/broker.sock
  export TALLY_TEST_WORK=$work
}
stop_test_services() {
  local work=$1 f
  stop_pidfile "$work/run/broker.pid"
  # Apache Kafka nodes a test or this script started and did not stop (a timeout, a crash).
  while IFS= read -r f; do kill -KILL "$(cat "$f")" 2>/dev/null || true; done \
    < <(find "$work" -path '*/node.*/pid' 2>/dev/null)
  pg_stop "$work/pg/data"
  rm -rf "$work"
}
