# Redis from Debian's packages for the tests and scripts/services (the lab's lock scenario):
# one server on 127.0.0.1:6379, loopback only, protected mode, no persistence (no RDB
# snapshots, no AOF: every start begins empty), run as a process of its own rather than
# Debian's service, with its working directory, pid file and log under
# $REDIS_STATE/redis-6379.
#
#   ensure_redis    installs redis-server when missing, starts the server unless one already
#                   answers PING on 127.0.0.1:6379, exports ENTREGA_TEST_REDIS (a caller's
#                   value wins)
#   redis_ready     whether PING is answered on 127.0.0.1:6379
#   stop_redis      stops the server ensure_redis started (one it did not start is left alone)
#
# Needs provision.sh (run_step, fail, apt_install, port_open) sourced first.

REDIS_PORT=6379
REDIS_STATE="${KM0_STATE:-$HOME/.local/state/km0}"
REDIS_DIR="$REDIS_STATE/redis-$REDIS_PORT"

redis_ready() {
  command -v redis-cli >/dev/null &&
    [ "$(timeout 5 redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null)" = PONG ]
}

# Debian's package starts its own service from its postinst (on a machine with an init): a
# policy-rc.d that refuses every start, for the install only, keeps it from doing so. A
# policy-rc.d already there (as in containers) is left as it is.
redis_install() {
  local policy=/usr/sbin/policy-rc.d ours=0 status=0
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\n# km0 (scripts/lib/redis.sh): no service starts while redis-server installs.\nexit 101\n' >"$policy"
    chmod 0755 "$policy"
    ours=1
  fi
  apt_install redis-server || status=$?
  [ "$ours" = 0 ] || rm -f "$policy"
  return "$status"
}

# A server Debian's service started anyway (its pid file): stopped, so that ours, with its
# own settings, takes the port.
redis_stop_debian_service() {
  local file pid
  for file in /run/redis/redis-server.pid /var/run/redis/redis-server.pid; do
    [ -f "$file" ] || continue
    pid=$(cat "$file")
    kill -0 "$pid" 2>/dev/null || continue
    echo "stopping the redis-server Debian's package started (pid $pid)"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    return 0
  done
}

ensure_redis() {
  if ! command -v redis-server >/dev/null; then
    if redis_ready; then
      echo "Redis: something answers PING on 127.0.0.1:$REDIS_PORT and no local server is installed; using it"
      export ENTREGA_TEST_REDIS="${ENTREGA_TEST_REDIS:-redis://127.0.0.1:$REDIS_PORT}"
      return 0
    fi
    run_step "installing Redis from Debian's packages" "$KM0_LOGS/apt-redis.log" redis_install
    command -v redis-server >/dev/null ||
      fail "installing Redis" "no redis-server after the install; read $KM0_LOGS/apt-redis.log"
    redis_stop_debian_service
  fi
  if redis_ready; then
    echo "Redis already answers on 127.0.0.1:$REDIS_PORT"
  elif port_open "$REDIS_PORT"; then
    fail "Redis on :$REDIS_PORT" "something listens on 127.0.0.1:$REDIS_PORT but does not answer PING; stop it"
  else
    local log="$REDIS_DIR/redis.log" launcher waited=0
    mkdir -p "$REDIS_DIR"
    echo "starting Redis on 127.0.0.1:$REDIS_PORT (log $log)"
    # The previous run's log stays readable as redis.log.1.
    if [ -f "$log" ]; then mv -f "$log" "$log.1"; fi
    # In a session of its own, the server outlives the shell that started it (scripts/services);
    # --wait keeps setsid there as long as the server when it has to fork (called from a
    # process group leader), so the launcher's pid tells whether the server still runs. The
    # server writes its own pid to $REDIS_DIR/pid before it answers. No configuration file:
    # everything is on the command line.
    rm -f "$REDIS_DIR/pid"
    setsid --wait redis-server --bind 127.0.0.1 --port "$REDIS_PORT" --protected-mode yes \
      --save '' --appendonly no --dir "$REDIS_DIR" --daemonize no \
      --pidfile "$REDIS_DIR/pid" >"$log" 2>&1 </dev/null &
    launcher=$!
    until redis_ready; do
      if ! kill -0 "$launcher" 2>/dev/null; then
        tail -n 20 "$log" >&2
        fail "starting Redis on :$REDIS_PORT" "the server exited; read $log"
      fi
      waited=$((waited + 1))
      [ "$waited" -le 60 ] || fail "starting Redis on :$REDIS_PORT" "no PONG after 30 s; read $log"
      sleep 0.5
    done
    echo "Redis answers on 127.0.0.1:$REDIS_PORT"
  fi
  export ENTREGA_TEST_REDIS="${ENTREGA_TEST_REDIS:-redis://127.0.0.1:$REDIS_PORT}"
}

stop_redis() {
  local pid
  [ -f "$REDIS_DIR/pid" ] || return 0
  pid=$(cat "$REDIS_DIR/pid")
  # Only a redis-server: the pid of one that exited long ago may be another process's now.
  if kill -0 "$pid" 2>/dev/null && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = redis-server ]; then
    echo "stopping Redis (pid $pid, $REDIS_DIR)"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
  fi
  rm -f "$REDIS_DIR/pid"
}
