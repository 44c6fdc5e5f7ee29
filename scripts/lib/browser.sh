# The browser tests' tools: Debian's Chromium (installed with apt-get when missing) and
# playwright-core from npm, kept under ~/.cache/km0/playwright-<version>/ and named by
# KM0_CHROMIUM and KM0_NODE_MODULES.

PLAYWRIGHT_VERSION=1.64.1

ensure_browser() {
  if ! command -v chromium >/dev/null 2>&1; then
    run_step "installing Debian's chromium (browser tests)" "$KM0_LOGS/chromium-install.log" \
      bash -c "apt-get install -y -qq --no-install-recommends chromium ||
               { apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium; }"
  fi
  command -v chromium >/dev/null 2>&1 || fail "chromium" "apt-get installed no chromium"
  command -v node >/dev/null 2>&1 || fail "node" "Node.js is required for the browser tests"
  local dir="$KM0_CACHE/playwright-$PLAYWRIGHT_VERSION"
  if [ ! -f "$dir/node_modules/playwright-core/package.json" ]; then
    mkdir -p "$dir"
    run_step "installing playwright-core $PLAYWRIGHT_VERSION from npm" "$KM0_LOGS/playwright-install.log" \
      npm install --prefix "$dir" --no-audit --no-fund --silent "playwright-core@$PLAYWRIGHT_VERSION"
  fi
  export KM0_CHROMIUM
  KM0_CHROMIUM=$(command -v chromium)
  export KM0_NODE_MODULES="$dir/node_modules"
}
