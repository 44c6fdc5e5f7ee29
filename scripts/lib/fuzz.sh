# Coverage-guided fuzzing (cargo-fuzz on libFuzzer) of the parsers that read bytes from
# outside: the event envelope, `--broker` URLs and the body of `POST /pedidos`. The targets
# are in fuzz/fuzz_targets/, their seed corpora in fuzz/corpus/<target>/, dictionaries in
# fuzz/dict/<target>.dict.
#
#   ensure_cargo_fuzz                     cargo-fuzz $CARGO_FUZZ_VERSION under $KM0_CACHE (a no-op
#                                         when cached); checks the nightly toolchain it needs
#   run_fuzz_targets SECONDS [TARGET...]  builds the targets, then runs each (all by default)
#                                         for SECONDS; a crash stops with its artifact's path.
#                                         FUZZ_BUILD_FLAGS (an array) adds cargo-fuzz build
#                                         flags: scripts/test's short run builds with
#                                         `--dev --sanitizer none`
#
# The build goes to $KM0_CACHE/fuzz-target and the inputs libFuzzer finds to
# $KM0_CACHE/fuzz-corpus/<target>/, so the repository's seed corpus stays as committed and
# a fresh clone reuses both. Crashes land in fuzz/artifacts/<target>/ (ignored by git).
#
# Needs provision.sh (run_step, fail, apt_install) sourced first.

CARGO_FUZZ_VERSION="0.13.2"
CARGO_FUZZ_ROOT="$KM0_CACHE/cargo-fuzz-$CARGO_FUZZ_VERSION"
FUZZ_DIR="$KM0_ROOT/fuzz"
FUZZ_TARGET_DIR="$KM0_CACHE/fuzz-target"
FUZZ_CORPUS_CACHE="$KM0_CACHE/fuzz-corpus"
[ -n "${FUZZ_BUILD_FLAGS+set}" ] || FUZZ_BUILD_FLAGS=()

ensure_cargo_fuzz() {
  # libFuzzer's instrumentation flags (-Zsanitizer, sanitizer coverage) exist on nightly only,
  # and rustup on a machine without network cannot fetch it: say so instead of failing later
  # in the middle of a build.
  cargo +nightly --version >/dev/null 2>&1 ||
    fail "fuzzing" "cargo-fuzz needs the nightly toolchain and \`cargo +nightly\` does not run; install it with \`rustup toolchain install nightly --profile minimal\`"
  # libfuzzer-sys compiles libFuzzer itself, in C++.
  command -v c++ >/dev/null || run_step "installing a C++ compiler (for libFuzzer)" \
    "$KM0_LOGS/apt-gxx.log" apt_install g++
  if [ ! -x "$CARGO_FUZZ_ROOT/bin/cargo-fuzz" ]; then
    run_step "installing cargo-fuzz $CARGO_FUZZ_VERSION into $CARGO_FUZZ_ROOT" \
      "$KM0_LOGS/cargo-fuzz-install.log" \
      cargo install cargo-fuzz --locked --version "$CARGO_FUZZ_VERSION" --root "$CARGO_FUZZ_ROOT"
  fi
  case ":$PATH:" in
    *":$CARGO_FUZZ_ROOT/bin:"*) ;;
    *) export PATH="$CARGO_FUZZ_ROOT/bin:$PATH" ;;
  esac
}

# The targets defined in fuzz/Cargo.toml, one a line.
fuzz_targets() {
  awk '/^\[\[bin\]\]/ { bin = 1; next } bin && /^name *=/ { gsub(/[" ]/, "", $0); sub(/^name=/, "", $0); print; bin = 0 }' \
    "$FUZZ_DIR/Cargo.toml"
}

run_fuzz_targets() {
  local seconds=$1
  shift
  local targets=("$@") target all
  all=$(fuzz_targets)
  [ "${#targets[@]}" -gt 0 ] || mapfile -t targets <<<"$all"
  for target in "${targets[@]}"; do
    grep -qx "$target" <<<"$all" ||
      fail "fuzzing" "no fuzz target \`$target\` (fuzz/Cargo.toml has: $(tr "\n" " " <<<"$all"))"
  done
  ensure_cargo_fuzz
  # One build for every target (they share all their dependencies); `fuzz run` below then
  # finds them up to date. Same flags as `run`, or it would build everything again. The
  # target directory is set per command: the cargo runs after this one (scripts/test's
  # demos) keep the workspace's own.
  run_step "building the fuzz targets (cached in $FUZZ_TARGET_DIR)" "$KM0_LOGS/fuzz-build.log" \
    env CARGO_TARGET_DIR="$FUZZ_TARGET_DIR" cargo +nightly fuzz build "${FUZZ_BUILD_FLAGS[@]}" \
    --fuzz-dir "$FUZZ_DIR"
  for target in "${targets[@]}"; do
    run_fuzz_target "$target" "$seconds"
  done
}

# run_fuzz_target TARGET SECONDS: one target for SECONDS, its output in a log; prints the
# final counts, or on a failure the panic and the input that reproduces it.
run_fuzz_target() {
  local target=$1 seconds=$2
  local log="$KM0_LOGS/fuzz-$target.log" corpus="$FUZZ_CORPUS_CACHE/$target"
  local dict=() artifact
  mkdir -p "$corpus"
  [ -f "$FUZZ_DIR/dict/$target.dict" ] && dict=("-dict=$FUZZ_DIR/dict/$target.dict")
  echo "fuzzing $target for $seconds s (log: $log)"
  # libFuzzer adds what it finds to the first corpus directory only: the cache one. The
  # committed seeds are read as a second directory and never written.
  if ! CARGO_TARGET_DIR="$FUZZ_TARGET_DIR" cargo +nightly fuzz run "${FUZZ_BUILD_FLAGS[@]}" \
    --fuzz-dir "$FUZZ_DIR" "$target" \
    "$corpus" "$FUZZ_DIR/corpus/$target" -- \
    -max_total_time="$seconds" -print_final_stats=1 "${dict[@]}" >"$log" 2>&1; then
    artifact=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$log" | tail -n 1)
    if [ -n "$artifact" ]; then
      # The panic (or libFuzzer's verdict: timeout, out of memory, sanitizer) rather than the
      # end of the log, which is backtraces.
      { awk '/panicked at/ { on = 1 } /^stack backtrace:|^note: / { on = 0 } on' "$log" |
        head -n 12 >&2; } || true
      grep -m 1 -E 'ERROR: (libFuzzer|AddressSanitizer)' "$log" >&2 || true
      artifact=${artifact#"$KM0_ROOT"/}
      echo "crash input: $artifact" >&2
      # With the cached build and the pinned cargo-fuzz, from the repository's root.
      echo "reproduce:   CARGO_TARGET_DIR=$FUZZ_TARGET_DIR PATH=$CARGO_FUZZ_ROOT/bin:\$PATH cargo +nightly fuzz run ${FUZZ_BUILD_FLAGS[*]} $target $artifact" >&2
    else
      tail -n 30 "$log" >&2
    fi
    fail "fuzzing $target" "read $log"
  fi
  # `#N DONE cov: ... exec/s: E ...` and libFuzzer's final statistics.
  grep -E '^#[0-9]+[[:space:]]+DONE|^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)' \
    "$log" | sed 's/^/  /' || true
}
