# A certificate authority of the test suite's own, and the server certificate it signs for
# localhost and 127.0.0.1, made with Debian's openssl under $KM0_CACHE/tls/ (kept between
# runs, made again when missing or within 30 days of expiry). PostgreSQL and RabbitMQ serve
# TLS with it; tests trust ENTREGA_TEST_TLS_CA. Never use it outside tests: its key sits in a
# cache directory.

KM0_TLS_DIR="$KM0_CACHE/tls"

ensure_test_pki() {
  export ENTREGA_TEST_TLS_CA="$KM0_TLS_DIR/ca.pem"
  command -v openssl >/dev/null || run_step "installing openssl" \
    "$KM0_LOGS/apt-openssl.log" apt_install openssl
  if [ -f "$KM0_TLS_DIR/server.pem" ] &&
    openssl x509 -checkend $((30 * 86400)) -noout -in "$KM0_TLS_DIR/server.pem" >/dev/null 2>&1; then
    return 0
  fi
  mkdir -p "$KM0_TLS_DIR"
  chmod 0755 "$KM0_TLS_DIR"
  run_step "making the test certificate authority and server certificate in $KM0_TLS_DIR" \
    "$KM0_LOGS/tls-pki.log" make_test_pki "$KM0_TLS_DIR"
}

make_test_pki() {
  local dir=$1
  set -e
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 825 \
    -subj "/CN=km0 test CA" -keyout "$dir/ca-key.pem" -out "$dir/ca.pem" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -subj "/CN=localhost" -keyout "$dir/server-key.pem" -out "$dir/server.csr"
  printf '%s\n' "subjectAltName=DNS:localhost,IP:127.0.0.1" \
    "basicConstraints=CA:FALSE" "keyUsage=digitalSignature,keyEncipherment" \
    "extendedKeyUsage=serverAuth" >"$dir/server.ext"
  openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca-key.pem" \
    -CAcreateserial -days 825 -extfile "$dir/server.ext" -out "$dir/server.pem"
  # PKCS#8 for servers that insist on it (Kafka's PEM key store).
  openssl pkcs8 -topk8 -nocrypt -in "$dir/server-key.pem" -out "$dir/server-key.pk8.pem"
  chmod 0644 "$dir"/*.pem
  chmod 0600 "$dir/ca-key.pem" "$dir/server-key.pem" "$dir/server-key.pk8.pem"
}

# Serves TLS on the test cluster at $1 (its /etc/postgresql/V/main directory) with the test
# certificate; plain connections stay allowed. Reloads a running server whose setting differs.
pg_configure_tls() {
  local conf=$1
  install -o postgres -g postgres -m 0644 "$KM0_TLS_DIR/server.pem" "$conf/km0-server.pem"
  install -o postgres -g postgres -m 0600 "$KM0_TLS_DIR/server-key.pem" "$conf/km0-server-key.pem"
  cat >"$conf/conf.d/km0-tls.conf" <<CONF
# km0 tests (scripts/lib/tls.sh): TLS with the test suite's own certificate authority.
ssl = on
ssl_cert_file = '$conf/km0-server.pem'
ssl_key_file = '$conf/km0-server-key.pem'
CONF
}
