# Running the suite's parts side by side, for scripts/test.
#
#   test_tasks THREADS           builds every test target of the workspace and prints one
#                                task per test binary (see run_tasks)
#   run_tasks JOBS FILE          runs the tasks listed in FILE, JOBS at a time, the slowest of
#                                the last run first; prints one line per task as it ends and
#                                the output of those that failed (or asked to be shown)
#
# `cargo test` runs its binaries one after another, so a run takes the sum of their times,
# though most of the slow ones' time is spent waiting: on a broker brought down for a set
# time, a crash to be noticed, a rebalance. Here the test binaries, the doc tests and the
# demos overlap, and starting the slowest first keeps the last one from starting late. Each
# binary runs as cargo runs it: from its package's directory, with CARGO_MANIFEST_DIR set.
# Durations are kept in $KM0_CACHE/test-durations.tsv for the next run's order.
#
# A task is one line: `name<TAB>how<TAB>command`, the command evaluated in a subshell of
# the calling script (its functions and variables are there). `how` is `-`, `show` (print
# its output even when it passes) or `alone` (run after the others, with nothing beside it).
#
# Needs provision.sh (KM0_CACHE, fail) sourced first, and python3 (to read cargo's JSON).

TEST_DURATIONS="$KM0_CACHE/test-durations.tsv"

# Tests that take down a service other binaries share (the local RabbitMQ node, stopped and
# started by the restart test), need most of one (the demos on a shared broker open every
# service's pools, more connections than PostgreSQL serves beside the other tests) or most of
# the machine (the three-node clusters: three JVMs or three Erlang nodes, which beside the
# other broker tests starved them of CPU until their timeouts fired):
# `binary<TAB>test filter`, one a line. Their binary skips them, and they run alone at the
# end, one test at a time.
ALONE_TESTS=$'km0-brokers\tamqp_broker_restart::\nkm0-brokers\tdemo_hermetic::
km0-brokers\tkafka_cluster::\nkm0-brokers\tamqp_cluster::'

test_tasks() {
  local threads=$1 json
  json=$(mktemp)
  if ! cargo test --workspace --no-run --quiet --message-format=json-render-diagnostics >"$json"; then
    rm -f "$json"
    return 1
  fi
  local binaries
  binaries=$(python3 -c '
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
' <"$json") || return 1
  rm -f "$json"
  local name dir exe run skip alone filter
  while IFS=$'\t' read -r name dir exe; do
    run=$(printf 'cd %q && CARGO_MANIFEST_DIR=%q %q -q' "$dir" "$dir" "$exe")
    skip=""
    while IFS=$'\t' read -r alone filter; do
      [ "$alone" = "$name" ] || continue
      skip+=" --skip $filter"
      printf '%s\talone\t%s --test-threads 1 %s\n' "$name-${filter%%::*}" "$run" "$filter"
    done <<<"$ALONE_TESTS"
    printf '%s\t-\t%s --test-threads %s%s\n' "$name" "$run" "$threads" "$skip"
  done <<<"$binaries"
}

# The last run's duration of task NAME in seconds, 100000 when unknown (a new task might be
# slow: start it early).
last_duration() {
  local seconds
  seconds=$(awk -F'\t' -v n="$1" '$1 == n { s = $2 } END { print s }' "$TEST_DURATIONS" 2>/dev/null)
  printf '%s' "${seconds:-100000}"
}

# run_task OUT NAME HOW COMMAND: runs one task, its output in OUT/NAME.log; prints how it
# ended and leaves marks for run_tasks.
run_task() {
  local out=$1 name=$2 how=$3 command=$4 start=$SECONDS status took summary
  if (eval "$command") >"$out/$name.log" 2>&1; then
    status=ok
    [ "$how" = show ] && touch "$out/$name.show"
  else
    status=FAILED
    touch "$out/$name.failed"
  fi
  took=$((SECONDS - start))
  printf '%s\t%s\n' "$name" "$took" >"$out/$name.took"
  summary=$(grep -E '^test result:' "$out/$name.log" | tail -n 1 | sed 's/^test result: //' || true)
  printf '  %-6s %-40s %4ds  %s\n' "$status" "$name" "$took" "$summary"
}

# The tasks of TASK_PIDS still running (the script's other children, such as a Kafka broker
# it started, are not tasks).
running_tasks() {
  local pid
  for pid in $(jobs -rp); do
    [[ " ${TASK_PIDS[*]} " == *" $pid "* ]] && echo "$pid"
  done
  return 0
}

run_tasks() {
  local jobs=$1 file=$2 out ordered name how command running
  TASK_PIDS=()
  out=$(mktemp -d)
  ordered=$(while IFS=$'\t' read -r name how command; do
    printf '%s\t%s\t%s\t%s\n' "$(last_duration "$name")" "$name" "$how" "$command"
  done <"$file" | sort -t$'\t' -k1,1nr -s | cut -f2-)
  # Interrupted: the tasks still running stop too.
  trap 'kill $(running_tasks) 2>/dev/null' INT TERM

  while IFS=$'\t' read -r name how command; do
    [ "$how" != alone ] || continue
    while running=$(running_tasks) && [ "$(grep -c . <<<"$running")" -ge "$jobs" ]; do
      # shellcheck disable=SC2086 # one pid a word
      wait -n $running || true
    done
    run_task "$out" "$name" "$how" "$command" &
    TASK_PIDS+=("$!")
  done <<<"$ordered"
  wait "${TASK_PIDS[@]}" || true
  while IFS=$'\t' read -r name how command; do
    [ "$how" = alone ] || continue
    run_task "$out" "$name" "$how" "$command"
  done <<<"$ordered"
  trap - INT TERM

  cat "$out"/*.took >"$TEST_DURATIONS.new" 2>/dev/null && mv "$TEST_DURATIONS.new" "$TEST_DURATIONS"
  local failed=0 mark
  for mark in "$out"/*.show "$out"/*.failed; do
    [ -e "$mark" ] || continue
    name=$(basename "${mark%.*}")
    case $mark in *.failed) failed=1 ;; esac
    printf '\n---- %s ----\n' "$name"
    cat "$out/$name.log"
  done
  rm -rf "$out"
  [ "$failed" = 0 ] || fail "tests" "a task failed (its output is above)"
}
