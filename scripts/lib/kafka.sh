# Apache Kafka for the tests, the benchmarks and `scripts/services`: the broker's jars from
# Maven Central (scripts/kafka/pom.xml), cached under ~/.cache/km0/kafka-<version>/libs, and
# one KRaft node (broker + controller) per port, run with the installed Java 17.
#
#   ensure_kafka_libs                     jars in $KAFKA_LIBS (a no-op when cached)
#   start_kafka_broker PORT DIR [ADV]     formats DIR once, starts a node on 127.0.0.1:PORT
#                                         (controller on PORT+1, ADV the advertised port) and
#                                         waits until it answers a Metadata request
#   ensure_kafka                          the shared broker on $KAFKA_PORT (9092), started
#                                         unless it already answers there
#   stop_kafka_broker DIR                 stops the node whose state is in DIR
#
# Needs provision.sh (run_step, fail, port_open) sourced first.

KAFKA_VERSION="4.1.2"
KAFKA_HOME="$KM0_CACHE/kafka-$KAFKA_VERSION"
KAFKA_LIBS="$KAFKA_HOME/libs"
KAFKA_CONF_DIR="$KM0_ROOT/scripts/kafka"
KAFKA_STATE="${KM0_STATE:-$HOME/.local/state/km0}"
KAFKA_HEAP="${KAFKA_HEAP:--Xms256m -Xmx1g}"

# java with Kafka's jars on the class path; the rest of the arguments name the main class.
kafka_java() {
  # shellcheck disable=SC2086 # KAFKA_HEAP holds several options
  java $KAFKA_HEAP -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$KAFKA_CONF_DIR/log4j2.properties" -cp "$KAFKA_LIBS/*" "$@"
}

ensure_kafka_libs() {
  local stamp="$KAFKA_HOME/.pom-sha256" want
  want=$(sha256sum "$KAFKA_CONF_DIR/pom.xml" | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -d "$KAFKA_LIBS" ]; then
    return 0
  fi
  grep -q "<kafka.version>$KAFKA_VERSION</kafka.version>" "$KAFKA_CONF_DIR/pom.xml" ||
    fail "Kafka jars" "scripts/kafka/pom.xml does not pin Kafka $KAFKA_VERSION (KAFKA_VERSION in scripts/lib/kafka.sh)"
  command -v java >/dev/null || run_step "installing Java 17" "$KM0_LOGS/apt-java.log" \
    apt_install openjdk-17-jre-headless
  command -v mvn >/dev/null || run_step "installing Maven" "$KM0_LOGS/apt-maven.log" apt_install maven
  mkdir -p "$KAFKA_HOME"
  rm -rf "$KAFKA_LIBS.partial"
  run_step "downloading Apache Kafka $KAFKA_VERSION jars from Maven Central into $KAFKA_LIBS" \
    "$KM0_LOGS/kafka-mvn.log" \
    mvn -B -f "$KAFKA_CONF_DIR/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
    -DoutputDirectory="$KAFKA_LIBS.partial"
  rm -rf "$KAFKA_LIBS"
  mv "$KAFKA_LIBS.partial" "$KAFKA_LIBS"
  echo "$want" >"$stamp"
}

# Whether a Kafka broker answers a Metadata request on 127.0.0.1:$1.
kafka_ready() {
  python3 "$KAFKA_CONF_DIR/probe.py" "127.0.0.1:$1" >/dev/null 2>&1
}

start_kafka_broker() {
  local port=$1 dir=$2 advertised=${3:-$1}
  local controller=$((port + 1)) log="$dir/broker.log"
  mkdir -p "$dir/data"
  sed -e "s#@PORT@#$port#g" -e "s#@CONTROLLER_PORT@#$controller#g" \
    -e "s#@ADVERTISED_PORT@#$advertised#g" -e "s#@DATA_DIR@#$dir/data#g" \
    "$KAFKA_CONF_DIR/server.properties.in" >"$dir/server.properties"
  if [ ! -f "$dir/data/meta.properties" ]; then
    [ -f "$dir/cluster-id" ] || kafka_java kafka.tools.StorageTool random-uuid | tail -n 1 >"$dir/cluster-id"
    run_step "formatting Kafka storage in $dir/data (cluster $(cat "$dir/cluster-id"))" \
      "$dir/format.log" \
      kafka_java kafka.tools.StorageTool format --standalone --ignore-formatted \
      -t "$(cat "$dir/cluster-id")" -c "$dir/server.properties"
  fi
  echo "starting Apache Kafka $KAFKA_VERSION on 127.0.0.1:$port (controller :$controller, log $log)"
  # The previous run's log stays readable as broker.log.1.
  if [ -f "$log" ]; then mv -f "$log" "$log.1"; fi
  # In a session of its own, the broker outlives the shell that started it (scripts/services).
  # shellcheck disable=SC2086 # KAFKA_HEAP holds several options
  setsid java $KAFKA_HEAP -XX:+UseG1GC -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$KAFKA_CONF_DIR/log4j2.properties" -cp "$KAFKA_LIBS/*" \
    kafka.Kafka "$dir/server.properties" >"$log" 2>&1 </dev/null &
  echo $! >"$dir/pid"
  local waited=0
  until kafka_ready "$advertised"; do
    if ! kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
      tail -n 20 "$log" >&2
      fail "starting Kafka on :$port" "the broker exited; read $log"
    fi
    waited=$((waited + 1))
    [ "$waited" -le 120 ] || fail "starting Kafka on :$port" "no metadata answer after 60 s; read $log"
    sleep 0.5
  done
  echo "Kafka on 127.0.0.1:$port answers: $(python3 "$KAFKA_CONF_DIR/probe.py" "127.0.0.1:$advertised")"
}

stop_kafka_broker() {
  local dir=$1 pid
  [ -f "$dir/pid" ] || return 0
  pid=$(cat "$dir/pid")
  if kill -0 "$pid" 2>/dev/null; then
    echo "stopping Kafka (pid $pid, $dir)"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$dir/pid"
}

ensure_kafka() {
  local port="${KAFKA_PORT:-9092}"
  ensure_kafka_libs
  if kafka_ready "$port"; then
    echo "Kafka already answers on 127.0.0.1:$port"
  elif port_open "$port"; then
    fail "Kafka on :$port" "something listens on 127.0.0.1:$port but does not answer as a Kafka broker; stop it or set KAFKA_PORT"
  else
    start_kafka_broker "$port" "$KAFKA_STATE/kafka-$port"
  fi
  export ENTREGA_TEST_KAFKA="${ENTREGA_TEST_KAFKA:-127.0.0.1:$port}"
  export ENTREGA_KAFKA_LIBS="$KAFKA_LIBS"
}
