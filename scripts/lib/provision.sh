# Provisioning for scripts/test, scripts/bench and scripts/services, on a bare Debian machine:
# each ensure_* installs or starts what is missing and is a no-op when it is already there.
# Every step says what it does; a failing step names itself and the log file to read.
#
#   ensure_rust        cargo with rustfmt and clippy
#   ensure_build_cache the workspace's builds under $KM0_CACHE (CARGO_TARGET_DIR)
#   ensure_postgres    a PostgreSQL server on 127.0.0.1:5432 (Debian's packages), loopback trust,
#                      TLS with the test suite's own CA (tls.sh)
#   ensure_rabbitmq    RabbitMQ on 127.0.0.1:5672 with the consistent-hash exchange (rabbitmq.sh)
#   ensure_kafka       Apache Kafka on 127.0.0.1:9092 from Maven Central jars (kafka.sh)
#   ensure_redis       Redis on 127.0.0.1:6379, no persistence (redis.sh)

KM0_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
KM0_CACHE="${KM0_CACHE:-$HOME/.cache/km0}"
KM0_LOGS="${KM0_LOGS:-$KM0_CACHE/logs}"
mkdir -p "$KM0_CACHE" "$KM0_LOGS"

# Stops the script: what failed and where to read why.
fail() {
  printf 'FAILED: %s: %s\n' "$1" "$2" >&2
  exit 1
}

# run_step DESCRIPTION LOG COMMAND...: prints the step, runs it with its output in LOG, and on
# failure shows the end of LOG and stops.
run_step() {
  local what=$1 log=$2
  shift 2
  echo "$what (log: $log)"
  if ! "$@" >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    fail "$what" "read $log"
  fi
}

APT_UPDATED=0
apt_install() {
  if [ "$APT_UPDATED" = 0 ]; then
    apt-get update -qq
    APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

ensure_rust() {
  command -v cargo >/dev/null || fail "Rust toolchain" "cargo is required (rustup); none is on PATH"
  local component
  for component in rustfmt clippy; do
    rustup component list --installed 2>/dev/null | grep -q "^$component" ||
      run_step "adding the $component component" "$KM0_LOGS/rustup-$component.log" \
        rustup component add "$component"
  done
  # librdkafka is built with TLS and SCRAM against the system's OpenSSL (rdkafka's `ssl`).
  local missing=()
  dpkg -s libssl-dev >/dev/null 2>&1 || missing+=(libssl-dev)
  command -v pkg-config >/dev/null || missing+=(pkg-config)
  command -v cmake >/dev/null || missing+=(cmake)
  if [ ${#missing[@]} -gt 0 ]; then
    run_step "installing ${missing[*]} (librdkafka's build)" "$KM0_LOGS/apt-build-deps.log" \
      apt_install "${missing[@]}"
  fi
}

# The workspace's build directory, outside the clone under $KM0_CACHE, keyed by the toolchain:
# a fresh clone then compiles only the workspace's own crates, its dependencies (librdkafka's
# C build among them) come from the cache. A caller's CARGO_TARGET_DIR wins. A cache of an
# older toolchain is removed, and one grown past KM0_TARGET_CACHE_GIB (default 20: each
# clone's path builds its own copy of the workspace's crates) starts over.
ensure_build_cache() {
  [ -z "${CARGO_TARGET_DIR:-}" ] || return 0
  local key dir old size_kib
  key=$(rustc -vV | sha256sum | cut -c1-12)
  dir="$KM0_CACHE/target-$key"
  for old in "$KM0_CACHE"/target-*; do
    [ -d "$old" ] && [ "$old" != "$dir" ] && rm -rf "$old"
  done
  if [ -d "$dir" ]; then
    size_kib=$(du -sk "$dir" | cut -f1)
    if [ "$size_kib" -gt $((${KM0_TARGET_CACHE_GIB:-20} * 1024 * 1024)) ]; then
      echo "the build cache $dir holds $((size_kib / 1024 / 1024)) GiB: starting it over"
      rm -rf "$dir"
    fi
  fi
  mkdir -p "$dir"
  export CARGO_TARGET_DIR="$dir"
  echo "builds in $CARGO_TARGET_DIR"
}

# --- PostgreSQL --------------------------------------------------------------------------

KM0_PG_DEFAULT="postgres://postgres@127.0.0.1:5432"
pg_url_base() { printf '%s' "${ENTREGA_TEST_PG%/}"; }

psql_admin() {
  psql "$(pg_url_base)/postgres" -v ON_ERROR_STOP=1 -qAt "$@"
}

# The newest PostgreSQL server installed from Debian's packages (empty if none: a client alone
# has psql but no /usr/lib/postgresql/<v>/bin/postgres).
pg_server_version() {
  local bin
  for bin in /usr/lib/postgresql/*/bin/postgres; do
    [ -x "$bin" ] && basename "$(dirname "$(dirname "$bin")")"
  done | sort -V | tail -n 1
}

# Loopback connections as the test convention wants them: trust on 127.0.0.1 and ::1, ahead of
# Debian's scram-sha-256 lines, for this cluster only.
pg_configure_cluster() {
  local conf=$1 marker="# km0: loopback trust (test convention, scripts/lib/provision.sh)"
  if ! grep -qF "$marker" "$conf/pg_hba.conf"; then
    echo "setting trust for loopback TCP in $conf/pg_hba.conf"
    {
      echo "$marker"
      echo "host    all             all             127.0.0.1/32            trust"
      echo "host    all             all             ::1/128                 trust"
      echo "host    replication     all             127.0.0.1/32            trust"
      cat "$conf/pg_hba.conf"
    } >"$conf/pg_hba.conf.km0" && mv "$conf/pg_hba.conf.km0" "$conf/pg_hba.conf"
    chown postgres:postgres "$conf/pg_hba.conf"
  fi
  mkdir -p "$conf/conf.d"
  cat >"$conf/conf.d/km0.conf" <<CONF
# km0 tests and benchmarks (scripts/lib/provision.sh): loopback only, room for parallel tests.
listen_addresses = '127.0.0.1'
port = 5432
max_connections = $KM0_PG_MAX_CONNECTIONS
# The WAL relay (docs/OPERATIONS.md, "The WAL relay's slot"): logical decoding, a slot and a
# sender per outbox a test streams at once, and a cap on the WAL one slot may hold: a slot
# whose reader stopped is invalidated past it rather than fill the disk.
wal_level = logical
max_replication_slots = $KM0_PG_MAX_SLOTS
max_wal_senders = $KM0_PG_MAX_SLOTS
max_slot_wal_keep_size = 2GB
CONF
}

# Replication slots and WAL senders: each test that runs a WAL relay streams from a slot of
# its own database.
KM0_PG_MAX_SLOTS=64

# Connections the server takes: the tests of one binary run four at a time, and a test that
# runs a whole deployment opens every service's pool.
KM0_PG_MAX_CONNECTIONS=1000

# A server this script configured earlier, with fewer connections than the tests need now:
# configured again and restarted (a server it did not configure is left as it is).
pg_ensure_room() {
  local version have level slots
  version=$(pg_server_version)
  [ -n "$version" ] && [ -f "/etc/postgresql/$version/main/conf.d/km0.conf" ] || return 0
  have=$(psql_admin -tAc 'show max_connections' 2>/dev/null) || return 0
  level=$(psql_admin -tAc 'show wal_level' 2>/dev/null) || return 0
  slots=$(psql_admin -tAc 'show max_replication_slots' 2>/dev/null) || return 0
  [ "${have:-0}" -lt "$KM0_PG_MAX_CONNECTIONS" ] || [ "$level" != logical ] ||
    [ "${slots:-0}" -lt "$KM0_PG_MAX_SLOTS" ] || return 0
  pg_configure_cluster "/etc/postgresql/$version/main"
  run_step "restarting PostgreSQL $version for max_connections $KM0_PG_MAX_CONNECTIONS (was $have), wal_level logical (was $level), $KM0_PG_MAX_SLOTS slots (was $slots)" \
    "$KM0_LOGS/pg-start.log" pg_ctlcluster --skip-systemctl-redirect "$version" main restart
  for _ in $(seq 1 60); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.5; done
}

ensure_postgres() {
  export ENTREGA_TEST_PG="${ENTREGA_TEST_PG:-$KM0_PG_DEFAULT}"
  if [ "$(pg_url_base)" != "$KM0_PG_DEFAULT" ]; then
    echo "PostgreSQL: using ENTREGA_TEST_PG=$(pg_url_base) as given (nothing provisioned)"
    command -v psql >/dev/null || run_step "installing the PostgreSQL client" \
      "$KM0_LOGS/apt-postgresql-client.log" apt_install postgresql-client
    psql_admin -c 'select 1' >/dev/null ||
      fail "PostgreSQL" "cannot connect to $(pg_url_base) as a superuser"
    return 0
  fi
  if pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then
    echo "PostgreSQL already answers on 127.0.0.1:5432"
    pg_ensure_room
  else
    local version
    version=$(pg_server_version)
    if [ -z "$version" ]; then
      if command -v psql >/dev/null; then
        echo "a PostgreSQL client is installed but no server"
      fi
      run_step "installing the PostgreSQL server from Debian's packages" \
        "$KM0_LOGS/apt-postgresql.log" apt_install postgresql postgresql-contrib
      version=$(pg_server_version)
      [ -n "$version" ] || fail "installing PostgreSQL" "no server binary after the install; read $KM0_LOGS/apt-postgresql.log"
    fi
    if [ ! -d "/etc/postgresql/$version/main" ]; then
      run_step "creating the PostgreSQL $version cluster 'main' on port 5432" \
        "$KM0_LOGS/pg-createcluster.log" pg_createcluster "$version" main -p 5432
    fi
    pg_configure_cluster "/etc/postgresql/$version/main"
    local log="/var/log/postgresql/postgresql-$version-main.log"
    run_step "starting PostgreSQL $version (server log: $log)" "$KM0_LOGS/pg-start.log" \
      pg_ctlcluster --skip-systemctl-redirect "$version" main start
    for _ in $(seq 1 60); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 0.5; done
    pg_isready -q -h 127.0.0.1 -p 5432 || fail "starting PostgreSQL" "no answer on 127.0.0.1:5432 after 30 s; read $log"
  fi
  command -v psql >/dev/null || run_step "installing the PostgreSQL client" \
    "$KM0_LOGS/apt-postgresql-client.log" apt_install postgresql-client
  psql_admin -c 'select 1' >/dev/null ||
    fail "PostgreSQL" "cannot connect to $(pg_url_base) without a password; a server already running there must trust loopback for postgres, or set ENTREGA_TEST_PG"
  # TLS with the test suite's own CA, also on a server an earlier run started without it.
  local version
  version=$(pg_server_version)
  if [ -n "$version" ] && [ -d "/etc/postgresql/$version/main" ]; then
    ensure_test_pki
    pg_configure_tls "/etc/postgresql/$version/main"
    # Reloaded every time: a running server keeps the certificate it loaded until a reload,
    # and the one on disk may have been made again since (a cache wiped, one near expiry).
    if [ "$(psql_admin -c 'show ssl')" != "on" ]; then
      echo "turning TLS on in PostgreSQL $version"
    fi
    psql_admin -c 'select pg_reload_conf()' >/dev/null
    for _ in $(seq 1 20); do [ "$(psql_admin -c 'show ssl')" = "on" ] && break; sleep 0.25; done
    [ "$(psql_admin -c 'show ssl')" = "on" ] || fail "PostgreSQL TLS" "ssl is still off after a reload; read the server log"
  fi
}

# Stops the cluster ensure_postgres started (a server it did not start is left alone).
stop_postgres() {
  local version
  version=$(pg_server_version)
  [ -n "$version" ] && [ -f "/etc/postgresql/$version/main/conf.d/km0.conf" ] || return 0
  if pg_isready -q -h 127.0.0.1 -p 5432; then
    echo "stopping PostgreSQL $version"
    pg_ctlcluster --skip-systemctl-redirect "$version" main stop || true
  fi
}

drop_databases_like() {
  local pattern=$1 db
  for db in $(psql_admin -c "select datname from pg_database where datname like '$pattern'"); do
    psql_admin -c "drop database if exists \"$db\" with (force)" || true
  done
}

# Databases left by interrupted earlier runs.
drop_stale_test_databases() {
  drop_databases_like 'entrega_t_%'
  drop_databases_like 'km0ci%'
  drop_databases_like 'km0lp%'
  drop_databases_like 'km0tls%'
  drop_databases_like 'km0nosecret%'
  # Service roles the least-privilege test made (they own nothing once their databases are
  # gone).
  local role
  for role in $(psql_admin -c "select rolname from pg_roles where rolname like 'km0lp%'"); do
    psql_admin -c "drop role if exists \"$role\"" || true
  done
}

# shellcheck source=scripts/lib/tls.sh
. "$KM0_ROOT/scripts/lib/tls.sh"
# shellcheck source=scripts/lib/rabbitmq.sh
. "$KM0_ROOT/scripts/lib/rabbitmq.sh"
# shellcheck source=scripts/lib/rabbitmq_cluster.sh
. "$KM0_ROOT/scripts/lib/rabbitmq_cluster.sh"
# shellcheck source=scripts/lib/kafka.sh
. "$KM0_ROOT/scripts/lib/kafka.sh"
# shellcheck source=scripts/lib/kafka_cluster.sh
. "$KM0_ROOT/scripts/lib/kafka_cluster.sh"
# shellcheck source=scripts/lib/postgres_pair.sh
. "$KM0_ROOT/scripts/lib/postgres_pair.sh"
# shellcheck source=scripts/lib/redis.sh
. "$KM0_ROOT/scripts/lib/redis.sh"
