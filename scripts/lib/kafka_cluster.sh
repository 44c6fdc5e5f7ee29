# A three-node Apache Kafka cluster on one machine, for `scripts/services start --cluster`:
# KRaft, every node both broker and controller, brokers on 127.0.0.1:19092, :19094 and :19096
# (controllers one port above each), replication factor 3 and min.insync.replicas 2
# (scripts/kafka/cluster.properties.in), small heaps.
#
#   start_kafka_cluster     formats the nodes once, starts those not running and waits until
#                           each answers a Metadata request listing all three
#   kafka_cluster_status    one line per node, and the active controller
#   stop_kafka_cluster      stops every node
#
# Needs provision.sh and kafka.sh sourced first.

KAFKA_CLUSTER_PORTS="19092 19094 19096"
KAFKA_CLUSTER_HEAP="${KAFKA_CLUSTER_HEAP:--Xms128m -Xmx384m}"

kafka_cluster_dir() { echo "$KAFKA_STATE/kafka-cluster/node-$1"; }

kafka_cluster_bootstrap() {
  local out="" port
  for port in $KAFKA_CLUSTER_PORTS; do out="${out:+$out,}127.0.0.1:$port"; done
  echo "$out"
}

kafka_cluster_voters() {
  local out="" id=1 port
  for port in $KAFKA_CLUSTER_PORTS; do
    out="${out:+$out,}$id@127.0.0.1:$((port + 1))"
    id=$((id + 1))
  done
  echo "$out"
}

# Writes node $1's settings (port $2) and formats its storage once, with the cluster's id.
kafka_cluster_format() {
  local id=$1 port=$2 dir cluster_id
  dir=$(kafka_cluster_dir "$id")
  mkdir -p "$dir/data"
  sed -e "s#@NODE_ID@#$id#g" -e "s#@PORT@#$port#g" -e "s#@CONTROLLER_PORT@#$((port + 1))#g" \
    -e "s#@VOTERS@#$(kafka_cluster_voters)#g" -e "s#@DATA_DIR@#$dir/data#g" \
    "$KAFKA_CONF_DIR/cluster.properties.in" >"$dir/server.properties"
  [ -f "$dir/data/meta.properties" ] && return 0
  local id_file="$KAFKA_STATE/kafka-cluster/cluster-id"
  [ -f "$id_file" ] || kafka_java kafka.tools.StorageTool random-uuid | tail -n 1 >"$id_file"
  cluster_id=$(cat "$id_file")
  run_step "formatting Kafka node $id in $dir/data (cluster $cluster_id)" "$dir/format.log" \
    kafka_java kafka.tools.StorageTool format --ignore-formatted -t "$cluster_id" \
    -c "$dir/server.properties"
}

kafka_cluster_spawn() {
  local id=$1 dir log
  dir=$(kafka_cluster_dir "$id")
  log="$dir/broker.log"
  if [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then return 0; fi
  if [ -f "$log" ]; then mv -f "$log" "$log.1"; fi
  # shellcheck disable=SC2086 # KAFKA_CLUSTER_HEAP holds several options
  setsid java $KAFKA_CLUSTER_HEAP -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$KAFKA_CONF_DIR/log4j2.properties" -cp "$KAFKA_LIBS/*" \
    kafka.Kafka "$dir/server.properties" >"$log" 2>&1 </dev/null &
  echo $! >"$dir/pid"
}

# Whether the node on port $1 answers and lists all three brokers.
kafka_cluster_node_ready() {
  python3 "$KAFKA_CONF_DIR/probe.py" "127.0.0.1:$1" 2>/dev/null | grep -q "brokers 1@.*2@.*3@"
}

start_kafka_cluster() {
  ensure_kafka_libs
  local id=1 port
  for port in $KAFKA_CLUSTER_PORTS; do
    kafka_cluster_format "$id" "$port"
    id=$((id + 1))
  done
  id=1
  for port in $KAFKA_CLUSTER_PORTS; do
    kafka_cluster_spawn "$id"
    id=$((id + 1))
  done
  local waited=0
  for port in $KAFKA_CLUSTER_PORTS; do
    until kafka_cluster_node_ready "$port"; do
      waited=$((waited + 1))
      [ "$waited" -le 240 ] ||
        fail "starting the Kafka cluster" "no node on :$port lists three brokers after 120 s; read $KAFKA_STATE/kafka-cluster/node-*/broker.log"
      sleep 0.5
    done
  done
  echo "Kafka cluster answers on $(kafka_cluster_bootstrap)"
  ENTREGA_TEST_KAFKA_CLUSTER=$(kafka_cluster_bootstrap)
  export ENTREGA_TEST_KAFKA_CLUSTER
}

# The active controller's node id, asked of the cluster with Kafka's Admin client.
kafka_cluster_controller() {
  java -cp "$KAFKA_LIBS/*" "$KAFKA_CONF_DIR/Quorum.java" "$(kafka_cluster_bootstrap)" 2>/dev/null
}

kafka_cluster_status() {
  local id=1 port rc=0
  for port in $KAFKA_CLUSTER_PORTS; do
    if kafka_ready "$port"; then
      echo "kafka-$id     up    kafka://127.0.0.1:$port  (controller :$((port + 1)))"
    else
      echo "kafka-$id     down"
      rc=1
    fi
    id=$((id + 1))
  done
  return $rc
}

stop_kafka_cluster() {
  local id
  for id in 1 2 3; do stop_kafka_broker "$(kafka_cluster_dir "$id")"; done
}
