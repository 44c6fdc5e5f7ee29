# A three-node RabbitMQ cluster on one machine, for `scripts/services start --cluster`: nodes
# km0c1@localhost, km0c2@localhost and km0c3@localhost from Debian's package, AMQP on
# 127.0.0.1:5682, :5683 and :5684, the management API on :15682, :15683 and :15684, Erlang
# distribution on :25682, :25683 and :25684. They find each other at their first boot
# (classic peer discovery), run as the rabbitmq user with its Erlang cookie, and keep their
# state in that user's home, under /var/lib/rabbitmq/km0-cluster/.
#
#   start_rabbitmq_cluster     starts the nodes not running and waits until all three are
#                              running members of one cluster
#   rabbitmq_cluster_status    one line per node
#   stop_rabbitmq_cluster      stops every node
#
# Needs provision.sh and rabbitmq.sh sourced first (ensure_rabbitmq installs the package).

RABBITMQ_CLUSTER_DIR=/var/lib/rabbitmq/km0-cluster

rabbitmq_cluster_node() { echo "km0c$1@localhost"; }
rabbitmq_cluster_port() { echo $((5681 + $1)); }

rabbitmq_cluster_url() {
  echo "amqp://guest:guest@127.0.0.1:5682,127.0.0.1:5683,127.0.0.1:5684"
}

# Writes node $1's settings.
rabbitmq_cluster_configure() {
  local i=$1 dir="$RABBITMQ_CLUSTER_DIR/node-$1"
  mkdir -p "$dir/log" "$dir/mnesia"
  cat >"$dir/rabbitmq.conf" <<CONF
listeners.tcp.1 = 127.0.0.1:$((5681 + i))
management.tcp.ip = 127.0.0.1
management.tcp.port = $((15681 + i))
loopback_users = none
cluster_formation.peer_discovery_backend = classic_config
cluster_formation.classic_config.nodes.1 = $(rabbitmq_cluster_node 1)
cluster_formation.classic_config.nodes.2 = $(rabbitmq_cluster_node 2)
cluster_formation.classic_config.nodes.3 = $(rabbitmq_cluster_node 3)
CONF
  echo "[rabbitmq_consistent_hash_exchange,rabbitmq_management]." >"$dir/enabled_plugins"
  chown -R rabbitmq:rabbitmq "$RABBITMQ_CLUSTER_DIR"
}

rabbitmq_cluster_running() {
  timeout 20 rabbitmqctl -q -n "$(rabbitmq_cluster_node "$1")" status >/dev/null 2>&1
}

rabbitmq_cluster_spawn() {
  local i=$1 dir="$RABBITMQ_CLUSTER_DIR/node-$1"
  rabbitmq_cluster_running "$i" && return 0
  rabbitmq_cluster_configure "$i"
  echo "starting RabbitMQ node $(rabbitmq_cluster_node "$i") on 127.0.0.1:$((5681 + i)) (logs: $dir/log)"
  env RABBITMQ_NODENAME="$(rabbitmq_cluster_node "$i")" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
    RABBITMQ_NODE_PORT=$((5681 + i)) RABBITMQ_DIST_PORT=$((25681 + i)) \
    RABBITMQ_CONFIG_FILE="$dir/rabbitmq" RABBITMQ_MNESIA_BASE="$dir/mnesia" \
    RABBITMQ_LOG_BASE="$dir/log" RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" \
    RABBITMQ_PID_FILE="$dir/pid" RABBITMQ_CONF_ENV_FILE=/dev/null HOME=/var/lib/rabbitmq \
    start-stop-daemon --start --quiet --background --chuid rabbitmq --pidfile "$dir/pid" \
    --output "$dir/log/server.out" --exec /usr/lib/rabbitmq/bin/rabbitmq-server ||
    fail "starting RabbitMQ node $i" "read $dir/log/"
}

start_rabbitmq_cluster() {
  command -v rabbitmq-server >/dev/null || ensure_rabbitmq
  local i
  for i in 1 2 3; do rabbitmq_cluster_spawn "$i"; done
  local waited=0
  for i in 1 2 3; do
    until rabbitmq_cluster_running "$i" && port_open $((5681 + i)); do
      local pid_file="$RABBITMQ_CLUSTER_DIR/node-$i/pid"
      if [ -f "$pid_file" ] && ! kill -0 "$(cat "$pid_file")" 2>/dev/null; then
        tail -n 5 "$RABBITMQ_CLUSTER_DIR/node-$i/log/server.out" >&2
        fail "starting the RabbitMQ cluster" "node $i exited; read $RABBITMQ_CLUSTER_DIR/node-$i/log/"
      fi
      waited=$((waited + 1))
      [ "$waited" -le 120 ] ||
        fail "starting the RabbitMQ cluster" "node $i not up after 120 s; read $RABBITMQ_CLUSTER_DIR/node-$i/log/"
      sleep 1
    done
  done
  waited=0
  until [ "$(rabbitmqctl -q -n "$(rabbitmq_cluster_node 1)" eval \
    'length(rabbit_nodes:all_running()).' 2>/dev/null)" = "3" ]; do
    waited=$((waited + 1))
    [ "$waited" -le 60 ] ||
      fail "starting the RabbitMQ cluster" "the nodes did not join one cluster in 60 s"
    sleep 1
  done
  echo "RabbitMQ cluster of three nodes answers on $(rabbitmq_cluster_url)"
  ENTREGA_TEST_AMQP_CLUSTER=$(rabbitmq_cluster_url)
  export ENTREGA_TEST_AMQP_CLUSTER
}

rabbitmq_cluster_status() {
  local i rc=0
  for i in 1 2 3; do
    if port_open $((5681 + i)); then
      echo "rabbitmq-$i  up    amqp://guest:guest@127.0.0.1:$((5681 + i))  ($(rabbitmq_cluster_node "$i"), management :$((15681 + i)))"
    else
      echo "rabbitmq-$i  down"
      rc=1
    fi
  done
  return $rc
}

stop_rabbitmq_cluster() {
  local i
  for i in 1 2 3; do
    rabbitmq_cluster_running "$i" || continue
    echo "stopping RabbitMQ node $(rabbitmq_cluster_node "$i")"
    rabbitmqctl -q -n "$(rabbitmq_cluster_node "$i")" stop >/dev/null 2>&1 || true
  done
}
