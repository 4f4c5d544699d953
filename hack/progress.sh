#!/usr/bin/env bash
# Runs a command and, while it runs, prints on stderr every $PROGRESS_INTERVAL seconds (30)
#   still building WHAT: 2m30s elapsed
# so that a long first build (cargo, Go modules, etcd + kube-apiserver) shows it is alive
# where the tool itself says nothing. The command's output passes through untouched and its
# exit status is this script's. A command done within the interval prints nothing extra.
#   hack/progress.sh "the workspace binaries" cargo build --workspace --bins
set -uo pipefail

what="$1"
shift
interval="${PROGRESS_INTERVAL:-30}"
start="$(date +%s)"
parent=$$
(
  while sleep "$interval" </dev/null >/dev/null 2>&1; do
    kill -0 "$parent" 2>/dev/null || exit 0 # this script was killed: stop too
    elapsed=$(($(date +%s) - start))
    printf 'still building %s: %dm%02ds elapsed\n' "$what" $((elapsed / 60)) $((elapsed % 60)) >&2
  done
) &
ticker=$!
# The command runs in the foreground (Ctrl-C reaches it as usual); the ticker goes with us.
trap 'kill "$ticker" 2>/dev/null' EXIT
"$@"
