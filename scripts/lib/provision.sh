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
