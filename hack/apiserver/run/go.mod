// The hack/apiserver runner: builds (once, cached) and supervises etcd + kube-apiserver
// for tests. Deliberately tiny: the standard library plus a YAML→JSON converter.
module github.com/capc-health-shim/hack/apiserver/run

go 1.24.0

require sigs.k8s.io/yaml v1.4.0
