# promtool, to check and unit-test deploy/prometheus/alerts.yml: taken from Debian's
# `prometheus` package without installing it (no service is set up or started), unpacked
# under ~/.cache/km0/prometheus-<version>/ and named by KM0_PROMTOOL.

ensure_promtool() {
  local version dir deb
  if [ -n "${KM0_PROMTOOL:-}" ] && [ -x "$KM0_PROMTOOL" ]; then
    return
  fi
  version=$(apt-cache policy prometheus 2>/dev/null | awk '/Candidate:/ {print $2}')
  if [ -z "$version" ] || [ "$version" = "(none)" ]; then
    apt-get update -qq
    version=$(apt-cache policy prometheus 2>/dev/null | awk '/Candidate:/ {print $2}')
  fi
  [ -n "$version" ] && [ "$version" != "(none)" ] ||
    fail "promtool" "Debian offers no prometheus package"
  dir="$KM0_CACHE/prometheus-${version//[^A-Za-z0-9.+-]/_}"
  if [ ! -x "$dir/usr/bin/promtool" ]; then
    local tmp
    tmp=$(mktemp -d)
    run_step "downloading Debian's prometheus $version (for promtool)" \
      "$KM0_LOGS/promtool-download.log" \
      bash -c "cd '$tmp' && apt-get download 'prometheus=$version'"
    deb=$(ls "$tmp"/prometheus_*.deb)
    mkdir -p "$dir"
    dpkg-deb -x "$deb" "$dir"
    rm -rf "$tmp"
  fi
  export KM0_PROMTOOL="$dir/usr/bin/promtool"
  "$KM0_PROMTOOL" --version >/dev/null 2>&1 || fail "promtool" "$KM0_PROMTOOL does not run"
}
