# shellcheck shell=bash
# The AsyncAPI parser from npm, to validate docs/asyncapi.yaml as AsyncAPI's own tools read it.
# Cached under ~/.cache/km0 by version; Node.js and npm from Debian's packages if missing.

KM0_ASYNCAPI_PARSER_VERSION=3.6.6

ensure_asyncapi_parser() {
  if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
    run_step "installing Node.js and npm from Debian's packages" "$KM0_LOGS/apt-nodejs.log" \
      apt_install nodejs npm
  fi
  local dir="$KM0_CACHE/asyncapi-parser-$KM0_ASYNCAPI_PARSER_VERSION"
  if [ ! -f "$dir/node_modules/@asyncapi/parser/package.json" ]; then
    mkdir -p "$dir"
    run_step "installing @asyncapi/parser $KM0_ASYNCAPI_PARSER_VERSION from npm" \
      "$KM0_LOGS/asyncapi-parser.log" \
      npm install --prefix "$dir" --no-audit --no-fund --silent \
      "@asyncapi/parser@$KM0_ASYNCAPI_PARSER_VERSION"
  fi
  export KM0_ASYNCAPI_PARSER_DIR="$dir"
}

# Validates docs/asyncapi.yaml (the test suite checks it is what the contracts generate).
validate_asyncapi() {
  NODE_PATH="$KM0_ASYNCAPI_PARSER_DIR/node_modules" node scripts/lib/asyncapi-check.cjs docs/asyncapi.yaml
}
