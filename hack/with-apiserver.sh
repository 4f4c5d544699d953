#!/usr/bin/env bash
# Runs a command with a real API server of one CRD profile up:
#   hack/with-apiserver.sh capi-1.9 cargo test
# Starts hack/apiserver's runner in the background (building etcd and kube-apiserver on first
# use), waits with a deadline for its kubeconfig, runs the command with
# CAPC_HEALTH_TEST_KUBECONFIG and CAPC_HEALTH_TEST_PROFILE set, and always stops the server.
set -euo pipefail

profile="$1"; shift
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
runner="${APISERVER_RUNNER:-target/hack/apiserver-run}"
dir="${APISERVER_TEST_DIR:-target/apiserver-test-$profile}"
log="$dir.log"
timeout_s="${APISERVER_START_TIMEOUT:-2400}"

[[ -x "$runner" ]] || { echo "with-apiserver: $runner missing; run 'make apiserver-runner'" >&2; exit 1; }
mkdir -p target
rm -f "$dir/kubeconfig"
"$runner" --profile "$profile" --dir "$dir" >"$log" 2>&1 &
pid=$!
stop() {
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
}
trap stop EXIT

started=$(date +%s)
deadline=$(( started + timeout_s ))
next_note=$(( started + 30 ))
until [[ -f "$dir/kubeconfig" ]]; do
  if (( $(date +%s) >= next_note )); then
    # First use builds etcd and kube-apiserver (make apiserver-build does it up front).
    elapsed=$(( $(date +%s) - started ))
    printf 'with-apiserver[%s]: still starting the API server: %dm%02ds elapsed (log: %s)\n' \
      "$profile" $(( elapsed / 60 )) $(( elapsed % 60 )) "$log" >&2
    next_note=$(( next_note + 30 ))
  fi
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "with-apiserver[$profile]: the API server runner exited; its log ($log):" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
  if (( $(date +%s) > deadline )); then
    echo "with-apiserver[$profile]: no kubeconfig after ${timeout_s}s; log $log" >&2
    tail -n 40 "$log" >&2
    exit 1
  fi
  sleep 0.5
done
echo "with-apiserver[$profile]: $(tail -n 3 "$log" | head -n 1)"

CAPC_HEALTH_TEST_KUBECONFIG="$root/$dir/kubeconfig" CAPC_HEALTH_TEST_PROFILE="$profile" "$@"
