# Apicurio Registry for the tests: a schema registry that speaks the Confluent Schema Registry
# API (/apis/ccompat/v7), to check entrega-contracts' compatibility rules against a real one.
# Apicurio publishes its built Quarkus application on Maven Central next to the module jar
# (io.apicurio:apicurio-registry-app:<version>:tar.gz:all); scripts/lib/registry-pom.xml
# unpacks it under ~/.cache/km0/apicurio-registry-<version>/app. It needs Java 21 or newer (its
# classes are built for 21): the Temurin JDK this kind of machine ships beside Java 17, or
# REGISTRY_JAVA. Storage is H2 in memory: every start begins empty.
#
#   ensure_registry          the application in $REGISTRY_HOME/app (a no-op when cached)
#   start_registry [PORT]    starts it on 127.0.0.1:PORT (default $REGISTRY_PORT, 8081) unless a
#                            registry already answers there, waits until it answers, prints
#                            the ccompat URL as its last line and exports
#                            ENTREGA_TEST_SCHEMA_REGISTRY (a caller's value wins)
#   registry_url [PORT]      http://127.0.0.1:PORT/apis/ccompat/v7
#   stop_registry [PORT]     stops the registry start_registry started on PORT
#
# The global compatibility level is REGISTRY_COMPATIBILITY (default BACKWARD, the Confluent
# Schema Registry's default; Apicurio's own default is NONE). PUT /config/<subject> sets a
# subject's level and is enforced at registration (409).
#
# Apicurio 3.3.3 checks JSON Schema compatibility only for drafts 4 to 7: a schema declaring
# "$schema": ".../draft/2020-12/schema" (as contracts/ do) registers under NONE, but every check
# that has to parse it answers HTTP 500 "#: could not determine version". Without "$schema" it
# reads draft 4 (a numeric exclusiveMinimum is then a 500 too); declare draft-07 to compare.
#
# Needs provision.sh (run_step, fail, port_open) sourced first.

REGISTRY_VERSION="3.3.3"
REGISTRY_HOME="$KM0_CACHE/apicurio-registry-$REGISTRY_VERSION"
REGISTRY_APP="$REGISTRY_HOME/app"
REGISTRY_POM="$KM0_ROOT/scripts/lib/registry-pom.xml"
REGISTRY_M2="${REGISTRY_M2:-$KM0_CACHE/m2}"
REGISTRY_STATE="${KM0_STATE:-$HOME/.local/state/km0}"
REGISTRY_HEAP="${REGISTRY_HEAP:--Xms64m -Xmx256m}"

registry_port() { printf '%s' "${1:-${REGISTRY_PORT:-8081}}"; }

registry_url() { printf 'http://127.0.0.1:%s/apis/ccompat/v7' "$(registry_port "${1:-}")"; }

# A java of version 21 or newer: REGISTRY_JAVA, the one on PATH, or any under /usr/lib/jvm.
registry_java() {
  local java major
  for java in "${REGISTRY_JAVA:-}" "$(command -v java || true)" /usr/lib/jvm/*/bin/java; do
    if [ -z "$java" ] || [ ! -x "$java" ]; then continue; fi
    major=$("$java" -version 2>&1 | sed -n '1s/.* version "\([0-9]*\).*/\1/p')
    if [ -n "$major" ] && [ "$major" -ge 21 ]; then
      printf '%s' "$java"
      return 0
    fi
  done
  return 1
}

ensure_registry() {
  local stamp="$REGISTRY_HOME/.pom-sha256" want
  want=$(sha256sum "$REGISTRY_POM" | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -f "$REGISTRY_APP/quarkus-run.jar" ]; then
    return 0
  fi
  grep -q "<apicurio.version>$REGISTRY_VERSION</apicurio.version>" "$REGISTRY_POM" ||
    fail "Apicurio Registry" "scripts/lib/registry-pom.xml does not pin $REGISTRY_VERSION (REGISTRY_VERSION in scripts/lib/registry.sh)"
  command -v mvn >/dev/null || run_step "installing Maven" "$KM0_LOGS/apt-maven.log" apt_install maven
  command -v curl >/dev/null || run_step "installing curl" "$KM0_LOGS/apt-curl.log" apt_install curl
  mkdir -p "$REGISTRY_HOME"
  rm -rf "$REGISTRY_APP.partial" "$REGISTRY_APP.partial.markers"
  # -DskipExternalRepos: Apicurio's parent POM adds the Eclipse and Confluent repositories
  # unless it is set; everything comes from Maven Central.
  run_step "downloading Apicurio Registry $REGISTRY_VERSION from Maven Central into $REGISTRY_APP" \
    "$KM0_LOGS/registry-mvn.log" \
    mvn -B -f "$REGISTRY_POM" -Dmaven.repo.local="$REGISTRY_M2" -DskipExternalRepos \
    -Dregistry.dir="$REGISTRY_APP.partial" dependency:unpack@registry
  [ -f "$REGISTRY_APP.partial/quarkus-run.jar" ] ||
    fail "Apicurio Registry" "no quarkus-run.jar in the unpacked archive; read $KM0_LOGS/registry-mvn.log"
  rm -rf "$REGISTRY_APP" "$REGISTRY_APP.partial.markers"
  mv "$REGISTRY_APP.partial" "$REGISTRY_APP"
  echo "$want" >"$stamp"
}

# Whether a schema registry answers on 127.0.0.1:$1 (GET /subjects gives a JSON array).
registry_ready() {
  local body
  body=$(curl -sf --max-time 2 "$(registry_url "$1")/subjects" 2>/dev/null) || return 1
  [ "${body:0:1}" = "[" ]
}

start_registry() {
  local port dir log java waited=0
  port=$(registry_port "${1:-}")
  dir="$REGISTRY_STATE/registry-$port"
  log="$KM0_LOGS/registry-$port.log"
  ensure_registry
  if registry_ready "$port"; then
    echo "a schema registry already answers on 127.0.0.1:$port"
  elif port_open "$port"; then
    fail "schema registry on :$port" "something listens on 127.0.0.1:$port but does not answer as a schema registry; stop it or set REGISTRY_PORT"
  else
    java=$(registry_java) ||
      fail "Apicurio Registry" "needs Java 21 or newer (none found on PATH or under /usr/lib/jvm); set REGISTRY_JAVA"
    mkdir -p "$dir"
    echo "starting Apicurio Registry $REGISTRY_VERSION on 127.0.0.1:$port (log $log)"
    # The previous run's log stays readable as registry-PORT.log.1.
    if [ -f "$log" ]; then mv -f "$log" "$log.1"; fi
    # In a session of its own, the registry outlives the shell that started it. The management
    # interface (health, metrics) gets a free loopback port; the H2 pool is small, the access
    # log off.
    # shellcheck disable=SC2086 # REGISTRY_HEAP holds several options
    setsid "$java" $REGISTRY_HEAP -XX:+UseSerialGC \
      -Dquarkus.http.host=127.0.0.1 -Dquarkus.http.port="$port" \
      -Dquarkus.management.host=127.0.0.1 -Dquarkus.management.port=0 \
      -Dquarkus.http.access-log.enabled=false \
      -Dapicurio.datasource.jdbc.initial-size=2 -Dapicurio.datasource.jdbc.min-size=2 \
      -Dapicurio.datasource.jdbc.max-size=20 \
      -Dapicurio.rules.global.compatibility="${REGISTRY_COMPATIBILITY:-BACKWARD}" \
      -jar "$REGISTRY_APP/quarkus-run.jar" >"$log" 2>&1 </dev/null &
    echo $! >"$dir/pid"
    until registry_ready "$port"; do
      if ! kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
        tail -n 20 "$log" >&2
        fail "starting Apicurio Registry on :$port" "it exited; read $log"
      fi
      waited=$((waited + 1))
      [ "$waited" -le 240 ] || fail "starting Apicurio Registry on :$port" "no answer after 120 s; read $log"
      sleep 0.5
    done
    echo "Apicurio Registry answers on 127.0.0.1:$port after $((waited / 2)) s"
  fi
  export ENTREGA_TEST_SCHEMA_REGISTRY="${ENTREGA_TEST_SCHEMA_REGISTRY:-$(registry_url "$port")}"
  printf '%s\n' "$(registry_url "$port")"
}

stop_registry() {
  local port dir pid
  port=$(registry_port "${1:-}")
  dir="$REGISTRY_STATE/registry-$port"
  [ -f "$dir/pid" ] || return 0
  pid=$(cat "$dir/pid")
  if kill -0 "$pid" 2>/dev/null; then
    echo "stopping Apicurio Registry (pid $pid, 127.0.0.1:$port)"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$dir/pid"
}
