# Running the workspace's test binaries side by side, for scripts/test.
#
#   run_test_binaries JOBS THREADS   builds every test target of the workspace, then runs the
#                                    binaries JOBS at a time, each with THREADS test threads,
#                                    the slowest of the last run first; prints one line per
#                                    binary as it ends and, for one that failed, its output
#
# `cargo test` runs its binaries one after another, so a run takes the sum of their times
# even though most of a binary's time is spent waiting on brokers, databases and spawned
# processes. Here the binaries overlap, and starting the slowest first keeps the last one
# from starting late. Each binary runs as cargo would run it: from its package's directory,
# with CARGO_MANIFEST_DIR set. Durations are kept in $KM0_CACHE/test-durations.tsv.
#
# Needs provision.sh (KM0_CACHE) sourced first, and python3 (to read cargo's JSON).

TEST_DURATIONS="$KM0_CACHE/test-durations.tsv"

# Prints `name<TAB>package dir<TAB>executable` for every test binary of the workspace,
# building them first.
test_binaries() {
  local json
  json=$(mktemp)
  if ! cargo test --workspace --no-run --quiet --message-format=json-render-diagnostics >"$json"; then
    rm -f "$json"
    return 1
  fi
  python3 -c '
import json, os, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") != "compiler-artifact" or not m.get("executable"):
        continue
    if not m.get("profile", {}).get("test"):
        continue
    package = os.path.dirname(m["manifest_path"])
    name = os.path.basename(package) + "-" + m["target"]["name"]
    kind = m["target"]["kind"][0]
    if kind in ("lib", "bin"):
        name += "-unit" if kind == "lib" else "-bin"
    print(name, package, m["executable"], sep="\t")
' <"$json"
  rm -f "$json"
}

# The last run's duration of binary NAME in seconds, 100000 when unknown (a new binary
# might be slow: start it early).
last_duration() {
  local seconds
  seconds=$(awk -F'\t' -v n="$1" '$1 == n { s = $2 } END { print s }' "$TEST_DURATIONS" 2>/dev/null)
  printf '%s' "${seconds:-100000}"
}

run_test_binaries() {
  local jobs=$1 threads=$2 out line name dir exe listed=()
  out=$(mktemp -d)
  # Built first, in the foreground: a compile error stops here with cargo's own message.
  local built
  built=$(test_binaries) || fail "tests" "the test build failed (cargo's messages are above)"
  mapfile -t listed <<<"$built"
  [ -n "$built" ] || fail "tests" "no test binary was built"
  # Interrupted: the binaries still running stop too.
  trap 'kill $(jobs -p) 2>/dev/null' INT TERM
  local ordered
  ordered=$(for line in "${listed[@]}"; do
    IFS=$'\t' read -r name dir exe <<<"$line"
    printf '%s\t%s\n' "$(last_duration "$name")" "$line"
  done | sort -t$'\t' -k1,1nr | cut -f2-)

  while IFS=$'\t' read -r name dir exe; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do
      wait -n || true
    done
    (
      start=$SECONDS
      if (cd "$dir" && CARGO_MANIFEST_DIR="$dir" "$exe" --test-threads "$threads" -q) \
        >"$out/$name.log" 2>&1; then
        status=ok
      else
        status=FAILED
        touch "$out/$name.failed"
      fi
      took=$((SECONDS - start))
      printf '%s\t%s\n' "$name" "$took" >"$out/$name.took"
      summary=$(grep -E '^test result:' "$out/$name.log" | tail -n 1 | sed 's/^test result: //')
      printf '  %-6s %-28s %4ds  %s\n' "$status" "$name" "$took" "$summary"
    ) &
  done <<<"$ordered"
  wait

  cat "$out"/*.took >"$TEST_DURATIONS.new" 2>/dev/null && mv "$TEST_DURATIONS.new" "$TEST_DURATIONS"
  local failed=0 log
  for log in "$out"/*.failed; do
    [ -e "$log" ] || continue
    failed=1
    name=$(basename "$log" .failed)
    printf '\n---- output of %s ----\n' "$name"
    cat "$out/$name.log"
  done
  rm -rf "$out"
  [ "$failed" = 0 ] || fail "tests" "a test binary failed (its output is above)"
}
