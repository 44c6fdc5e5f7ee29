# RabbitMQ from Debian's packages for the tests and scripts/services: one node named
# rabbit@localhost, listening on 127.0.0.1:5672 only, with rabbitmq_consistent_hash_exchange
# and rabbitmq_management (its HTTP API on 127.0.0.1:15672, for unacked counts) enabled;
# `amqp://guest:guest@127.0.0.1:5672` (guest may connect from loopback only), and amqps on
# 127.0.0.1:5671 with the test suite's own certificate authority (tls.sh).
# Needs provision.sh (run_step, fail, apt_install, port_open) sourced first.

RABBITMQ_PID_FILE=/var/run/rabbitmq/pid
RABBITMQ_ENV_CONF=/etc/rabbitmq/rabbitmq-env.conf
RABBITMQ_CONF=/etc/rabbitmq/rabbitmq.conf
RABBITMQ_TLS_DIR=/etc/rabbitmq/km0-tls

# The test certificate and key where the rabbitmq user can read them.
rabbitmq_tls_files() {
  ensure_test_pki
  mkdir -p "$RABBITMQ_TLS_DIR"
  install -o rabbitmq -g rabbitmq -m 0644 "$KM0_TLS_DIR/ca.pem" "$RABBITMQ_TLS_DIR/ca.pem"
  install -o rabbitmq -g rabbitmq -m 0644 "$KM0_TLS_DIR/server.pem" "$RABBITMQ_TLS_DIR/server.pem"
  install -o rabbitmq -g rabbitmq -m 0600 "$KM0_TLS_DIR/server-key.pem" "$RABBITMQ_TLS_DIR/server-key.pem"
}

# The node's name and address, read by rabbitmq-server and rabbitmqctl alike. A fixed name
# keeps the node independent of whether this machine's hostname resolves.
rabbitmq_configure() {
  local marker="# km0 (scripts/lib/rabbitmq.sh), with TLS"
  if ! grep -qF "$marker" "$RABBITMQ_CONF" 2>/dev/null; then
    echo "configuring RabbitMQ in $RABBITMQ_CONF: management API on 127.0.0.1:15672, TLS on 127.0.0.1:5671"
    mkdir -p "$(dirname "$RABBITMQ_CONF")"
    cat >"$RABBITMQ_CONF" <<CONF
$marker
management.tcp.ip = 127.0.0.1
management.tcp.port = 15672
# amqps with the test suite's own certificate authority (scripts/lib/tls.sh).
listeners.ssl.1 = 127.0.0.1:5671
ssl_options.cacertfile = $RABBITMQ_TLS_DIR/ca.pem
ssl_options.certfile = $RABBITMQ_TLS_DIR/server.pem
ssl_options.keyfile = $RABBITMQ_TLS_DIR/server-key.pem
ssl_options.verify = verify_none
ssl_options.fail_if_no_peer_cert = false
CONF
  fi
  grep -qF "$marker" "$RABBITMQ_ENV_CONF" 2>/dev/null && return 0
  echo "configuring RabbitMQ in $RABBITMQ_ENV_CONF: node rabbit@localhost on 127.0.0.1"
  mkdir -p "$(dirname "$RABBITMQ_ENV_CONF")"
  cat >"$RABBITMQ_ENV_CONF" <<CONF
$marker
NODENAME=rabbit@localhost
NODE_IP_ADDRESS=127.0.0.1
NODE_PORT=5672
CONF
}

rabbitmq_running() {
  command -v rabbitmqctl >/dev/null && timeout 30 rabbitmqctl -q status >/dev/null 2>&1
}

ensure_rabbitmq() {
  if ! command -v rabbitmq-server >/dev/null; then
    if port_open 5672; then
      echo "RabbitMQ: something answers on 127.0.0.1:5672 and no local server is installed; using it"
      return 0
    fi
    run_step "installing RabbitMQ from Debian's packages" "$KM0_LOGS/apt-rabbitmq.log" \
      apt_install rabbitmq-server
  fi
  rabbitmq_tls_files
  if rabbitmq_running && ! port_open 5671; then
    # Started by an earlier run without the TLS listener: it reads its configuration at boot.
    echo "RabbitMQ runs without its TLS listener; restarting it with one"
    rabbitmq_configure
    stop_rabbitmq
    for _ in $(seq 1 60); do rabbitmq_running || break; sleep 0.5; done
  fi
  if rabbitmq_running; then
    echo "RabbitMQ already runs"
  else
    rabbitmq_configure
    run_step "enabling rabbitmq_consistent_hash_exchange and rabbitmq_management" \
      "$KM0_LOGS/rabbitmq-plugins.log" \
      rabbitmq-plugins enable --offline rabbitmq_consistent_hash_exchange rabbitmq_management
    mkdir -p "$(dirname "$RABBITMQ_PID_FILE")"
    chown rabbitmq:rabbitmq "$(dirname "$RABBITMQ_PID_FILE")"
    local log="$KM0_LOGS/rabbitmq-server.log"
    echo "starting RabbitMQ on 127.0.0.1:5672 (output: $log, node logs: /var/log/rabbitmq/)"
    RABBITMQ_PID_FILE=$RABBITMQ_PID_FILE start-stop-daemon --start --quiet --background \
      --chuid rabbitmq --pidfile "$RABBITMQ_PID_FILE" --output "$log" \
      --exec /usr/sbin/rabbitmq-server ||
      fail "starting RabbitMQ" "read $log and /var/log/rabbitmq/"
    run_step "waiting for RabbitMQ to boot" "$KM0_LOGS/rabbitmq-wait.log" \
      rabbitmqctl wait --timeout 120 "$RABBITMQ_PID_FILE"
  fi
  # Online, so a node that was already running gets the plugin too (a no-op if enabled).
  run_step "checking rabbitmq_consistent_hash_exchange and rabbitmq_management" \
    "$KM0_LOGS/rabbitmq-plugins.log" \
    rabbitmq-plugins enable rabbitmq_consistent_hash_exchange rabbitmq_management
  run_step "checking that guest/guest may log in" "$KM0_LOGS/rabbitmq-auth.log" \
    rabbitmqctl authenticate_user guest guest
  port_open 5672 || fail "RabbitMQ" "nothing listens on 127.0.0.1:5672; read /var/log/rabbitmq/"
  port_open 5671 || fail "RabbitMQ" "nothing listens on 127.0.0.1:5671 (TLS); read /var/log/rabbitmq/"
  export ENTREGA_TEST_AMQP="${ENTREGA_TEST_AMQP:-amqp://guest:guest@127.0.0.1:5672}"
}

stop_rabbitmq() {
  rabbitmq_running || return 0
  echo "stopping RabbitMQ"
  rabbitmqctl -q stop "$RABBITMQ_PID_FILE" || rabbitmqctl -q stop || true
}
