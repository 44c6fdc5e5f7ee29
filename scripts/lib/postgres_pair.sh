# A PostgreSQL primary on 127.0.0.1:15432 with a streaming standby on 127.0.0.1:15433, from
# the server Debian's packages installed (ensure_postgres first). Replication is synchronous
# (`synchronous_standby_names = '*'` on the primary): a transaction committed on the primary
# is on the standby's disk too. km0 takes both in one URL, as libpq does:
#   --database postgres://postgres@127.0.0.1:15432,127.0.0.1:15433
# Both run as the postgres user with their data under $PG_PAIR_DIR; the standby is made with
# pg_basebackup from the primary the first time. After a failover done by hand (the standby
# promoted), `stop --cluster` and removing $PG_PAIR_DIR start the pair afresh.

PG_PAIR_DIR=/var/lib/postgresql/km0-pair
PG_PAIR_PORTS=(15432 15433)
PG_PAIR_NAMES=(primary standby)

pg_pair_bin() {
  echo "/usr/lib/postgresql/$(pg_server_version)/bin"
}

pg_pair_ready() {
  pg_isready -q -h 127.0.0.1 -p "$1" 2>/dev/null
}

pg_pair_psql() {
  local port=$1
  shift
  runuser -u postgres -- psql -h 127.0.0.1 -p "$port" -U postgres -Atc "$@"
}

# pg_ctl start of node I (0: primary, 1: standby).
pg_pair_start_node() {
  local i=$1 bin data port sync
  bin=$(pg_pair_bin)
  data="$PG_PAIR_DIR/${PG_PAIR_NAMES[$i]}"
  port=${PG_PAIR_PORTS[$i]}
  # Only the primary waits for a standby; a promoted standby has none to wait for.
  sync="''"
  [ "$i" = 0 ] && sync="'*'"
  pg_pair_ready "$port" && return 0
  run_step "starting the PostgreSQL ${PG_PAIR_NAMES[$i]} on 127.0.0.1:$port" \
    "$KM0_LOGS/pg-pair-${PG_PAIR_NAMES[$i]}.log" \
    runuser -u postgres -- "$bin/pg_ctl" -D "$data" -w -t 60 -l "$PG_PAIR_DIR/${PG_PAIR_NAMES[$i]}.log" \
    -o "-p $port -k $PG_PAIR_DIR -c listen_addresses=127.0.0.1 -c max_connections=300 \
        -c wal_level=logical -c max_replication_slots=16 -c max_wal_senders=16 \
        -c hot_standby=on -c synchronous_standby_names=$sync \
        -c wal_sender_timeout=5s -c wal_receiver_timeout=5s -c shared_buffers=64MB" start
}

start_postgres_pair() {
  local bin
  bin=$(pg_pair_bin)
  mkdir -p "$PG_PAIR_DIR"
  chown postgres:postgres "$PG_PAIR_DIR"
  if [ ! -f "$PG_PAIR_DIR/primary/PG_VERSION" ]; then
    run_step "creating the PostgreSQL pair's primary in $PG_PAIR_DIR/primary" \
      "$KM0_LOGS/pg-pair-initdb.log" \
      runuser -u postgres -- "$bin/initdb" -D "$PG_PAIR_DIR/primary" -A trust -U postgres
  fi
  pg_pair_start_node 0
  if [ ! -f "$PG_PAIR_DIR/standby/PG_VERSION" ]; then
    run_step "copying the primary to the standby (pg_basebackup)" \
      "$KM0_LOGS/pg-pair-basebackup.log" \
      runuser -u postgres -- "$bin/pg_basebackup" -h 127.0.0.1 -p "${PG_PAIR_PORTS[0]}" -U postgres \
      -D "$PG_PAIR_DIR/standby" -X stream -R
  fi
  pg_pair_start_node 1
  local state=""
  for _ in $(seq 1 60); do
    state=$(pg_pair_psql "${PG_PAIR_PORTS[0]}" "select sync_state from pg_stat_replication" 2>/dev/null || true)
    [ "$state" = sync ] && break
    sleep 0.5
  done
  [ "$state" = sync ] || fail "PostgreSQL pair" "the standby does not stream synchronously; read $PG_PAIR_DIR/*.log"
}

# One line per node: its port, whether it answers, primary or standby, and the primary's
# view of its standby.
postgres_pair_status() {
  local rc=0 i port role
  for i in 0 1; do
    port=${PG_PAIR_PORTS[$i]}
    if pg_pair_ready "$port"; then
      if [ "$(pg_pair_psql "$port" "select pg_is_in_recovery()" 2>/dev/null)" = t ]; then
        role="standby"
      else
        role="primary, standbys: $(pg_pair_psql "$port" \
          "select coalesce(string_agg(client_port::text || ' ' || state || ' ' || sync_state, ', '), 'none') from pg_stat_replication" 2>/dev/null)"
      fi
      echo "postgresql pair ${PG_PAIR_NAMES[$i]}  up    127.0.0.1:$port  ($role)"
    else
      echo "postgresql pair ${PG_PAIR_NAMES[$i]}  down  127.0.0.1:$port"
      rc=1
    fi
  done
  echo "postgresql pair: postgres://postgres@127.0.0.1:${PG_PAIR_PORTS[0]},127.0.0.1:${PG_PAIR_PORTS[1]}"
  return $rc
}

stop_postgres_pair() {
  local bin i
  bin=$(pg_pair_bin)
  for i in 1 0; do
    [ -f "$PG_PAIR_DIR/${PG_PAIR_NAMES[$i]}/postmaster.pid" ] || continue
    echo "stopping the PostgreSQL pair's ${PG_PAIR_NAMES[$i]}"
    runuser -u postgres -- "$bin/pg_ctl" -D "$PG_PAIR_DIR/${PG_PAIR_NAMES[$i]}" -m fast -w stop || true
  done
}
