#!/usr/bin/env bash
# Runs test lanes side by side and fails if any lane fails:
#   hack/lanes.sh rust "make test-rust-run" e2e "make test-e2e-run"
# Why: most of `make test` waits on timers (leases, graces, CAPI's requeues, scaled to seconds),
# not on the CPU, so two lanes with their own API servers take about as long as the longer one.
# Every line a lane prints is prefixed with its name (`[rust] …`), its whole output is also kept in
# target/test-logs/<name>.log, and the end says how long each lane took and how it ended.
set -uo pipefail

(( $# >= 2 && $# % 2 == 0 )) || { echo "usage: $0 NAME COMMAND [NAME COMMAND ...]" >&2; exit 2; }
logs="${LANES_LOG_DIR:-target/test-logs}"
mkdir -p "$logs"

names=() pids=() started="$(date +%s)"
while (( $# )); do
  name="$1" cmd="$2"
  shift 2
  rm -f "$logs/$name.end"
  (
    set -o pipefail
    lane_start="$(date +%s)"
    bash -c "$cmd" 2>&1 | tee "$logs/$name.log" | sed -u "s/^/[$name] /"
    rc=$?
    echo "$rc $(( $(date +%s) - lane_start ))" >"$logs/$name.end"
    exit "$rc"
  ) &
  names+=("$name") pids+=("$!")
done

# Ctrl-C or a kill stops every lane (each runs its own process group's children through make).
trap 'kill "${pids[@]}" 2>/dev/null; wait; exit 130' INT TERM

failed=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}" || failed=1
done
echo "lanes: done in $(( $(date +%s) - started ))s"
for name in "${names[@]}"; do
  read -r rc secs <"$logs/$name.end" 2>/dev/null || { rc=unknown secs=?; }
  printf 'lanes: %-6s %s after %ss (log: %s/%s.log)\n' "$name" \
    "$([[ $rc == 0 ]] && echo passed || echo "FAILED (exit $rc)")" "$secs" "$logs" "$name"
done
exit "$failed"
