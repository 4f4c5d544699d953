#!/usr/bin/env bash
# Smoke test of hack/apiserver for one profile:
#   hack/apiserver/smoke.sh [capi-1.9|capi-1.13|capi-1.13-v1beta2-only|capi-1.14]
# Starts the runner in the background, waits (deadline) for <dir>/kubeconfig, then with curl
# only: checks /version, the installed CRDs and their labels, creates a namespace, a
# CloudStackMachine and a Machine, server-side-applies a condition to the Machine's status and
# reads it back, checks RBAC is enforced (impersonating a user with no bindings → 403; a
# ServiceAccount token from TokenRequest gets exactly what its Role grants) and that both admin
# credentials (token, client cert) work; then stops the runner and checks that etcd
# and kube-apiserver are gone and the kubeconfig removed.
# Env: APISERVER_RUNNER (default target/hack/apiserver-run, built by `make apiserver-runner`),
#      APISERVER_DIR (default target/apiserver-smoke), APISERVER_SMOKE_TIMEOUT seconds (default
#      1800: the first run also builds kube-apiserver and etcd).
set -euo pipefail

profile="${1:-${APISERVER_PROFILE:-capi-1.9}}"
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
runner="${APISERVER_RUNNER:-target/hack/apiserver-run}"
dir="${APISERVER_DIR:-target/apiserver-smoke}"
timeout_s="${APISERVER_SMOKE_TIMEOUT:-1800}"
log="target/apiserver-smoke-$profile.log"

for tool in curl jq; do
  command -v "$tool" >/dev/null || { echo "smoke: $tool is required" >&2; exit 1; }
done
[[ -x "$runner" ]] || { echo "smoke: $runner missing; run 'make apiserver-runner'" >&2; exit 1; }

case "$profile" in
  capi-1.9)  want_crds=25; machine_v=v1beta1; cond_path='.status.v1beta2.conditions' ;;
  capi-1.13|capi-1.13-v1beta2-only|capi-1.14) want_crds=25; machine_v=v1beta2; cond_path='.status.conditions' ;;
  *) echo "smoke: unknown profile $profile" >&2; exit 2 ;;
esac

fail() {
  echo "smoke[$profile]: FAIL: $*" >&2
  echo "smoke[$profile]: runner log $log:" >&2
  tail -n 30 "$log" >&2 || true
  exit 1
}
step() { echo "smoke[$profile]: $*"; }

mkdir -p target
rm -f "$dir/kubeconfig"
started=$(date +%s)
"$runner" --profile "$profile" --dir "$dir" >"$log" 2>&1 &
runner_pid=$!

stop_runner() {
  kill -0 "$runner_pid" 2>/dev/null || return 0
  kill -TERM "$runner_pid"
  local end=$(( $(date +%s) + 60 ))
  while kill -0 "$runner_pid" 2>/dev/null; do
    (( $(date +%s) < end )) || { kill -KILL "$runner_pid"; echo "smoke: runner did not stop in 60s" >&2; return 1; }
    sleep 0.2
  done
}
trap 'stop_runner || true' EXIT

# --- wait for readiness: the kubeconfig appears, written by *this* runner ------------------
end=$(( started + timeout_s ))
until [[ -f "$dir/kubeconfig" && -f "$dir/env" ]] && grep -qx "APISERVER_PID=$runner_pid" "$dir/env"; do
  kill -0 "$runner_pid" 2>/dev/null || { wait "$runner_pid" || true; fail "runner exited before it was ready"; }
  (( $(date +%s) < end )) || fail "no $dir/kubeconfig within ${timeout_s}s"
  sleep 0.2
done
ready=$(( $(date +%s) - started ))
step "ready after ${ready}s"
# shellcheck disable=SC1091
source "$dir/env"
token="$(cat "$APISERVER_TOKEN_FILE")"

# api METHOD PATH [BODY [CONTENT-TYPE]] → sets $body and $status (no subshell, so they stick)
api() {
  local method=$1 path=$2 data=${3:-} ctype=${4:-application/json} out
  local args=(-sS --max-time 30 --cacert "$APISERVER_CA" -H "Authorization: Bearer $token"
              -X "$method" -w '\n%{http_code}')
  [[ -n "$data" ]] && args+=(-H "Content-Type: $ctype" --data-binary "$data")
  out="$(curl "${args[@]}" "${extra_headers[@]}" "$APISERVER_URL$path")" || fail "curl $method $path"
  status="${out##*$'\n'}"
  body="${out%$'\n'*}"
}
extra_headers=()
expect() { # expect STATUS what
  [[ "$status" == "$1" ]] || fail "$2: HTTP $status (want $1): $(printf '%s' "$body" | head -c 600)"
}

# --- server ----------------------------------------------------------------------------------
api GET /version; expect 200 "GET /version"
step "kube-apiserver $(jq -r .gitVersion <<<"$body")"

# --- CRDs: count, Established, contract labels -----------------------------------------------
api GET /apis/apiextensions.k8s.io/v1/customresourcedefinitions; expect 200 "list CRDs"
n=$(jq '.items | length' <<<"$body")
[[ "$n" == "$want_crds" ]] || fail "$n CRDs installed, want $want_crds"
not_est=$(jq -r '.items[] | select(([.status.conditions[]? | select(.type=="Established" and .status=="True")] | length) == 0) | .metadata.name' <<<"$body")
[[ -z "$not_est" ]] || fail "CRDs not Established: $not_est"
label() { jq -r --arg n "$1" --arg k "$2" '.items[] | select(.metadata.name==$n) | .metadata.labels[$k] // "<none>"' <<<"$body"; }
[[ "$(label cloudstackmachines.infrastructure.cluster.x-k8s.io cluster.x-k8s.io/v1beta1)" == v1beta1_v1beta2_v1beta3 ]] \
  || fail "CAPC contract label missing"
[[ "$(label kubeadmconfigs.bootstrap.cluster.x-k8s.io cluster.x-k8s.io/v1beta1)" == v1beta1 ]] || fail "CABPK contract label missing"
[[ "$(label kubeadmcontrolplanes.controlplane.cluster.x-k8s.io cluster.x-k8s.io/v1beta1)" == v1beta1 ]] || fail "KCP contract label missing"
storage=$(jq -r '.items[] | select(.metadata.name=="machines.cluster.x-k8s.io") | .spec.versions[] | select(.storage) | .name' <<<"$body")
[[ "$storage" == "$machine_v" ]] || fail "Machine storage version $storage, want $machine_v"
webhook=$(jq -r '.items[] | select(.spec.conversion.strategy=="Webhook") | .metadata.name' <<<"$body")
[[ -z "$webhook" ]] || fail "CRDs with webhook conversion (no webhook server here): $webhook"
step "$n CRDs Established, contract labels present, Machine storage $storage"
if [[ "$profile" == capi-1.13-v1beta2-only ]]; then
  api GET /apis/cluster.x-k8s.io/v1beta1; expect 404 "v1beta1 must not be served"
  api GET /apis/controlplane.cluster.x-k8s.io/v1beta1; expect 404 "KCP v1beta1 must not be served"
  api GET /apis/infrastructure.cluster.x-k8s.io/v1beta3; expect 200 "CAPC v1beta3"
  grep -q '"requestURI":"/apis/cluster.x-k8s.io/v1beta1"' "$APISERVER_AUDIT_LOG" \
    || fail "the audit log ($APISERVER_AUDIT_LOG) does not show the v1beta1 request"
  step "only the storage version of CAPI's CRDs is served; the audit log records the 404s"
fi

# --- objects ---------------------------------------------------------------------------------
ns="smoke-$$"
api POST /api/v1/namespaces "{\"apiVersion\":\"v1\",\"kind\":\"Namespace\",\"metadata\":{\"name\":\"$ns\"}}"
expect 201 "create namespace"

api POST "/apis/infrastructure.cluster.x-k8s.io/v1beta3/namespaces/$ns/cloudstackmachines" '{
  "apiVersion": "infrastructure.cluster.x-k8s.io/v1beta3", "kind": "CloudStackMachine",
  "metadata": {"name": "cp-0"},
  "spec": {"offering": {"name": "medium"}, "template": {"name": "ubuntu-2204-kube"}}}'
expect 201 "create CloudStackMachine"

if [[ "$machine_v" == v1beta1 ]]; then
  infra_ref='{"apiVersion": "infrastructure.cluster.x-k8s.io/v1beta3", "kind": "CloudStackMachine", "name": "cp-0"}'
else
  infra_ref='{"apiGroup": "infrastructure.cluster.x-k8s.io", "kind": "CloudStackMachine", "name": "cp-0"}'
fi
api POST "/apis/cluster.x-k8s.io/$machine_v/namespaces/$ns/machines" "{
  \"apiVersion\": \"cluster.x-k8s.io/$machine_v\", \"kind\": \"Machine\",
  \"metadata\": {\"name\": \"cp-0\", \"labels\": {\"cluster.x-k8s.io/cluster-name\": \"smoke\"}},
  \"spec\": {\"clusterName\": \"smoke\", \"bootstrap\": {\"dataSecretName\": \"cp-0-bootstrap\"},
           \"infrastructureRef\": $infra_ref}}"
expect 201 "create Machine $machine_v"

api GET "/apis/infrastructure.cluster.x-k8s.io/v1beta3/namespaces/$ns/cloudstackmachines/cp-0"
expect 200 "get CloudStackMachine"
[[ "$(jq -r .spec.offering.name <<<"$body")" == medium ]] || fail "CloudStackMachine read back wrong: $body"
api GET "/apis/cluster.x-k8s.io/$machine_v/namespaces/$ns/machines/cp-0"
expect 200 "get Machine"
[[ "$(jq -r .spec.infrastructureRef.name <<<"$body")" == cp-0 ]] || fail "Machine read back wrong: $body"
step "created and read back CloudStackMachine v1beta3 and Machine $machine_v in namespace $ns"

# Server-side apply of a metav1 condition onto the Machine status (how the shim will write).
now="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
if [[ "$machine_v" == v1beta1 ]]; then status_obj="{\"v1beta2\": {\"conditions\": [COND]}}"; else status_obj="{\"conditions\": [COND]}"; fi
cond="{\"type\": \"CloudStackVMHealthy\", \"status\": \"False\", \"reason\": \"NoGuestTraffic\", \"message\": \"smoke\", \"lastTransitionTime\": \"$now\"}"
apply="{\"apiVersion\": \"cluster.x-k8s.io/$machine_v\", \"kind\": \"Machine\", \"metadata\": {\"name\": \"cp-0\"}, \"status\": ${status_obj/COND/$cond}}"
api PATCH "/apis/cluster.x-k8s.io/$machine_v/namespaces/$ns/machines/cp-0/status?fieldManager=capc-health-shim-smoke&force=true" \
  "$apply" application/apply-patch+yaml
expect 200 "server-side apply Machine status condition"
api GET "/apis/cluster.x-k8s.io/$machine_v/namespaces/$ns/machines/cp-0"
got=$(jq -r "$cond_path[]? | select(.type==\"CloudStackVMHealthy\") | .status + \"/\" + .reason" <<<"$body")
[[ "$got" == False/NoGuestTraffic ]] || fail "condition not read back at $cond_path: $body"
step "server-side-applied condition CloudStackVMHealthy=False read back from $cond_path"

if [[ "$profile" == capi-1.13* || "$profile" == capi-1.14 ]]; then
  api POST "/apis/cluster.x-k8s.io/v1beta2/namespaces/$ns/machinehealthchecks" '{
    "apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "MachineHealthCheck", "metadata": {"name": "vm-health"},
    "spec": {"clusterName": "smoke", "selector": {"matchLabels": {"cluster.x-k8s.io/cluster-name": "smoke"}},
             "checks": {"unhealthyMachineConditions": [{"type": "CloudStackVMHealthy", "status": "False", "timeoutSeconds": 60}]}}}'
  expect 201 "create MachineHealthCheck v1beta2 with unhealthyMachineConditions"
  api GET "/apis/cluster.x-k8s.io/v1beta2/namespaces/$ns/machinehealthchecks/vm-health"
  [[ "$(jq -r '.spec.checks.unhealthyMachineConditions[0].type' <<<"$body")" == CloudStackVMHealthy ]] \
    || fail "unhealthyMachineConditions not kept: $body"
  step "MachineHealthCheck v1beta2 keeps spec.checks.unhealthyMachineConditions"
fi

# --- authn/authz -----------------------------------------------------------------------------
extra_headers=(-H "Impersonate-User: smoke-nobody")
api GET "/apis/cluster.x-k8s.io/$machine_v/namespaces/$ns/machines"; expect 403 "RBAC: unbound user lists Machines"
extra_headers=()
code=$(curl -sS -o /dev/null -w '%{http_code}' --cacert "$APISERVER_CA" "$APISERVER_URL/api") || fail "curl anonymous"
[[ "$code" == 401 ]] || fail "anonymous request got HTTP $code, want 401"
code=$(curl -sS -o /dev/null -w '%{http_code}' --cacert "$APISERVER_CA" --cert "$APISERVER_ADMIN_CERT" --key "$APISERVER_ADMIN_KEY" \
  "$APISERVER_URL/apis/cluster.x-k8s.io/$machine_v/namespaces/$ns/machines") || fail "curl client cert"
[[ "$code" == 200 ]] || fail "admin client cert got HTTP $code, want 200"
step "RBAC enforced (unbound user 403, anonymous 401); admin token and client cert accepted"

# A ServiceAccount token (TokenRequest; signed with sa.key) authenticates, and RBAC grants it
# exactly what a Role binds: read Machines yes, Secrets no.
api POST "/api/v1/namespaces/$ns/serviceaccounts" '{"apiVersion":"v1","kind":"ServiceAccount","metadata":{"name":"shim"}}'
expect 201 "create ServiceAccount"
api POST "/apis/rbac.authorization.k8s.io/v1/namespaces/$ns/roles" '{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"Role",
  "metadata":{"name":"machines-read"},"rules":[{"apiGroups":["cluster.x-k8s.io"],"resources":["machines"],"verbs":["get","list","watch"]}]}'
expect 201 "create Role"
api POST "/apis/rbac.authorization.k8s.io/v1/namespaces/$ns/rolebindings" "{\"apiVersion\":\"rbac.authorization.k8s.io/v1\",\"kind\":\"RoleBinding\",
  \"metadata\":{\"name\":\"shim\"},\"roleRef\":{\"apiGroup\":\"rbac.authorization.k8s.io\",\"kind\":\"Role\",\"name\":\"machines-read\"},
  \"subjects\":[{\"kind\":\"ServiceAccount\",\"name\":\"shim\",\"namespace\":\"$ns\"}]}"
expect 201 "create RoleBinding"
api POST "/api/v1/namespaces/$ns/serviceaccounts/shim/token" '{"apiVersion":"authentication.k8s.io/v1","kind":"TokenRequest","spec":{"expirationSeconds":600}}'
expect 201 "TokenRequest"
sa_token=$(jq -r .status.token <<<"$body")
sa_get() {
  curl -sS -o /dev/null -w '%{http_code}' --cacert "$APISERVER_CA" -H "Authorization: Bearer $sa_token" "$APISERVER_URL$1"
}
# RBAC decisions are cached by the authorizer's informers; allow them a moment (deadline).
end=$(( $(date +%s) + 30 ))
until code=$(sa_get "/apis/cluster.x-k8s.io/$machine_v/namespaces/$ns/machines") && [[ "$code" == 200 ]]; do
  (( $(date +%s) < end )) || fail "ServiceAccount token with a Role to read Machines got HTTP $code, want 200"
  sleep 0.2
done
code=$(sa_get "/api/v1/namespaces/$ns/secrets") || fail "curl as ServiceAccount"
[[ "$code" == 403 ]] || fail "ServiceAccount listing Secrets got HTTP $code, want 403"
step "ServiceAccount token (TokenRequest) authenticates; Role grants Machines (200), not Secrets (403)"

# --- stop ------------------------------------------------------------------------------------
etcd_pid=$(cat "$dir/etcd.pid"); api_pid=$(cat "$dir/kube-apiserver.pid")
stop_runner || fail "runner did not stop"
wait "$runner_pid" 2>/dev/null || fail "runner exited non-zero after SIGTERM"
for p in "$etcd_pid" "$api_pid"; do
  ! kill -0 "$p" 2>/dev/null || fail "process $p still running after the runner stopped"
done
[[ ! -e "$dir/kubeconfig" ]] || fail "kubeconfig left behind after stop"
step "stopped cleanly (etcd and kube-apiserver gone, kubeconfig removed)"
echo "smoke[$profile]: PASS (ready after ${ready}s, total $(( $(date +%s) - started ))s)"
