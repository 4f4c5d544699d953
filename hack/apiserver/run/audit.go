package main

import "path/filepath"

// auditedProfiles write a kube-apiserver audit log to <dir>/audit.log, so that a test can
// count which requests reached the server, by whom (user, userAgent) and for which path,
// including requests for versions that are not served (a 404 is audited like any other
// answer). Only the v1beta2-only profile needs it: it exists to show that nothing asks for
// v1beta1; the other profiles (and the e2e harness and benches that use them) stay unaudited.
var auditedProfiles = map[string]bool{v1beta2OnlyProfile: true}

// auditPolicy logs, at level Metadata (who, verb, requestURI, userAgent, response code; no
// bodies), every request in the CAPI and CAPC API groups and their discovery documents, and
// nothing else. RequestReceived is not omitted: the log backend runs in blocking mode, so
// that stage is on disk before the request is handled — once a client has its answer, its
// request is in the log. A request appears once per stage; count distinct auditIDs.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
rules:
- level: Metadata
  resources:
  - group: cluster.x-k8s.io
  - group: bootstrap.cluster.x-k8s.io
  - group: controlplane.cluster.x-k8s.io
  - group: infrastructure.cluster.x-k8s.io
- level: Metadata
  nonResourceURLs:
  - /apis/cluster.x-k8s.io*
  - /apis/bootstrap.cluster.x-k8s.io*
  - /apis/controlplane.cluster.x-k8s.io*
  - /apis/infrastructure.cluster.x-k8s.io*
- level: None
`

// auditArgs writes the policy under dir and returns kube-apiserver's audit flags and the
// log's path.
func auditArgs(dir string) ([]string, string, error) {
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := writeFile(policy, []byte(auditPolicy)); err != nil {
		return nil, "", err
	}
	log := filepath.Join(dir, "audit.log")
	return []string{
		"--audit-policy-file=" + policy,
		"--audit-log-path=" + log,
		"--audit-log-format=json",
		"--audit-log-mode=blocking",
	}, log, nil
}
