package main

// The release manifests against the real consumers' libraries, without a cluster: clusterctl
// (sigs.k8s.io/cluster-api v1.13.5's client: local repository, metadata validation, contract
// check, variables, target namespace) and Helm (v3 SDK: `helm template`'s install action, schema
// validation, lint). The API-server half — strict server-side apply and the shim running as the
// generated ServiceAccount — is tests/release_manifests.rs.

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
	"sigs.k8s.io/yaml"
)

type obj = map[string]any

func repoRoot(t *testing.T) string {
	t.Helper()
	root := defaultRoot()
	if _, err := os.Stat(filepath.Join(root, "deploy", "base", "kustomization.yaml")); err != nil {
		t.Fatalf("run from hack/release: %v", err)
	}
	return root
}

func mustBase(t *testing.T) *base {
	t.Helper()
	b, err := loadBase(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// baseObjects is deploy/base as kustomize builds it, as plain maps keyed by kind/name.
func baseObjects(t *testing.T, b *base) map[string]obj {
	t.Helper()
	out := map[string]obj{}
	for _, o := range b.copies() {
		text, err := marshal(o)
		if err != nil {
			t.Fatal(err)
		}
		var m obj
		if err := yaml.Unmarshal([]byte(text), &m); err != nil {
			t.Fatal(err)
		}
		out[key(m)] = m
	}
	return out
}

func key(m obj) string {
	md, _ := m["metadata"].(obj)
	return m["kind"].(string) + "/" + md["name"].(string)
}

// parseDocs reads a multi-document YAML stream into maps (empty documents skipped).
func parseDocs(t *testing.T, text string) []obj {
	t.Helper()
	var out []obj
	for _, doc := range strings.Split("\n"+text, "\n---") {
		var m obj
		if err := yaml.Unmarshal([]byte(doc), &m); err != nil {
			t.Fatalf("YAML: %v\n%s", err, doc)
		}
		if len(m) > 0 {
			out = append(out, m)
		}
	}
	return out
}

func byKey(t *testing.T, objs []obj) map[string]obj {
	t.Helper()
	out := map[string]obj{}
	for _, o := range objs {
		k := key(o)
		if _, dup := out[k]; dup {
			t.Fatalf("%s twice", k)
		}
		out[k] = o
	}
	return out
}

func get(m obj, path ...string) any {
	var cur any = m
	for _, p := range path {
		mm, ok := cur.(obj)
		if !ok {
			return nil
		}
		cur = mm[p]
	}
	return cur
}

func labels(m obj) map[string]any {
	l, _ := get(m, "metadata", "labels").(obj)
	return l
}

// withoutLabels returns a copy of m without the given metadata labels (and without an emptied map).
func withoutLabels(t *testing.T, m obj, keys ...string) obj {
	t.Helper()
	b, _ := yaml.Marshal(m)
	var c obj
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	// What clusterctl's typed round trip adds: an empty status and null creationTimestamps.
	if st, ok := c["status"].(obj); ok && len(st) == 0 {
		delete(c, "status")
	}
	for _, md := range []any{get(c, "metadata"), get(c, "spec", "template", "metadata")} {
		if mdm, ok := md.(obj); ok {
			if v, ok := mdm["creationTimestamp"]; ok && v == nil {
				delete(mdm, "creationTimestamp")
			}
		}
	}
	if l := labels(c); l != nil {
		for _, k := range keys {
			delete(l, k)
		}
		if len(l) == 0 {
			delete(c["metadata"].(obj), "labels")
		}
	}
	return c
}

func managerContainerOf(t *testing.T, d obj) obj {
	t.Helper()
	cs, _ := get(d, "spec", "template", "spec", "containers").([]any)
	for _, c := range cs {
		if c.(obj)["name"] == managerContainer {
			return c.(obj)
		}
	}
	t.Fatalf("no container %q in %s", managerContainer, key(d))
	return nil
}

func envOf(c obj) map[string]any {
	out := map[string]any{}
	env, _ := c["env"].([]any)
	for _, e := range env {
		em := e.(obj)
		out[em["name"].(string)] = em["value"]
	}
	return out
}

func unsetenv(t *testing.T, names ...string) {
	for _, n := range names {
		t.Setenv(n, "") // restored after the test
		os.Unsetenv(n)
	}
}

func writeRepo(t *testing.T, b *base) (dir, url string) {
	t.Helper()
	dir = t.TempDir()
	p, err := writeRepository(b, dir)
	if err != nil {
		t.Fatal(err)
	}
	return dir, "file://" + filepath.ToSlash(p)
}

func TestTheProviderLabelIsClusterctls(t *testing.T) {
	if got := clusterctlv1.ManifestLabel(providerName, clusterctlv1.AddonProviderType); got != providerLabel {
		t.Fatalf("clusterctl's label for the add-on is %q, the generator writes %q", got, providerLabel)
	}
}

// The raw file: what the contract asks of it before clusterctl touches it.
func TestTheComponentsFileFollowsTheContract(t *testing.T) {
	b := mustBase(t)
	text, err := addonComponents(b)
	if err != nil {
		t.Fatal(err)
	}
	objs := parseDocs(t, text)
	ns, _ := b.namespace()
	namespaces := 0
	for _, o := range objs {
		if o["kind"] == "Namespace" {
			namespaces++
			if get(o, "metadata", "name") != ns {
				t.Errorf("Namespace %v", get(o, "metadata", "name"))
			}
		}
		if labels(o)[providerLabelKey] != providerLabel {
			t.Errorf("%s: label %s=%v, want %s", key(o), providerLabelKey, labels(o)[providerLabelKey], providerLabel)
		}
		if !isClusterScoped(o["kind"].(string)) && get(o, "metadata", "namespace") != ns {
			t.Errorf("%s: namespace %v, want the target namespace %s", key(o), get(o, "metadata", "namespace"), ns)
		}
	}
	if namespaces != 1 || objs[0]["kind"] != "Namespace" {
		t.Errorf("want exactly one Namespace, first; have %d, first %v", namespaces, objs[0]["kind"])
	}
	if len(objs) != len(b.objs) {
		t.Errorf("%d objects, deploy/base has %d", len(objs), len(b.objs))
	}
	d := byKey(t, objs)["Deployment/capc-health-shim"]
	c := managerContainerOf(t, d)
	if !strings.HasPrefix(c["image"].(string), "${"+imageVar+":=") {
		t.Errorf("image %v is not the variable %s", c["image"], imageVar)
	}
	if v := envOf(c)[logEnv]; !strings.HasPrefix(v.(string), "${"+logVar+":=") {
		t.Errorf("env %s=%v is not the variable", logEnv, v)
	}
}

// clusterctl with no variables set: the defaults make exactly deploy/base, plus the labels.
func TestClusterctlWithDefaultsInstallsExactlyTheBase(t *testing.T) {
	unsetenv(t, imageVar, logVar)
	b := mustBase(t)
	_, url := writeRepo(t, b)
	comps, err := clusterctlGenerate(context.Background(), url, "v"+b.version, "")
	if err != nil {
		t.Fatal(err)
	}
	ns, _ := b.namespace()
	if comps.TargetNamespace() != ns {
		t.Errorf("target namespace %q, want the components' Namespace %q", comps.TargetNamespace(), ns)
	}
	vars := comps.Variables()
	sort.Strings(vars)
	if want := []string{imageVar, logVar}; !reflect.DeepEqual(vars, want) {
		t.Errorf("variables %v, want %v", vars, want)
	}
	if got := comps.ManifestLabel(); got != providerLabel {
		t.Errorf("provider label %q", got)
	}
	y, err := comps.Yaml()
	if err != nil {
		t.Fatal(err)
	}
	got := byKey(t, parseDocs(t, string(y)))
	want := baseObjects(t, b)
	if len(got) != len(want) {
		t.Errorf("clusterctl makes %d objects, deploy/base has %d", len(got), len(want))
	}
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			t.Errorf("%s missing", k)
			continue
		}
		if labels(g)[providerLabelKey] != providerLabel {
			t.Errorf("%s: no provider label", k)
		}
		if _, ok := labels(g)[clusterctlv1.ClusterctlLabel]; !ok {
			t.Errorf("%s: clusterctl did not label it (%s)", k, clusterctlv1.ClusterctlLabel)
		}
		stripped := withoutLabels(t, g, providerLabelKey, clusterctlv1.ClusterctlLabel)
		if !reflect.DeepEqual(stripped, w) {
			gb, _ := yaml.Marshal(stripped)
			wb, _ := yaml.Marshal(w)
			t.Errorf("%s differs from deploy/base:\n--- clusterctl\n%s\n--- base\n%s", k, gb, wb)
		}
	}
}

// clusterctl init --target-namespace and the variables set: every namespaced object, the one
// Namespace and the binding's subject move; the base's namespace is named nowhere else.
func TestClusterctlTargetNamespaceAndVariables(t *testing.T) {
	t.Setenv(imageVar, "registry.example.com/mirror/capc-health-shim:v0.1.0-rc1")
	t.Setenv(logVar, "info,capc_health_shim=debug")
	b := mustBase(t)
	_, url := writeRepo(t, b)
	const target = "ops-capc-health"
	comps, err := clusterctlGenerate(context.Background(), url, "v"+b.version, target)
	if err != nil {
		t.Fatal(err)
	}
	y, err := comps.Yaml()
	if err != nil {
		t.Fatal(err)
	}
	ns, _ := b.namespace()
	if strings.Contains(string(y), ns) {
		t.Errorf("the base's namespace %s is still named after --target-namespace %s:\n%s", ns, target, y)
	}
	objs := byKey(t, parseDocs(t, string(y)))
	if n := objs["Namespace/"+target]; n == nil || labels(n)["pod-security.kubernetes.io/enforce"] != "restricted" {
		t.Errorf("the Namespace is not %s with its Pod Security label: %v", target, n)
	}
	for k, o := range objs {
		if !isClusterScoped(o["kind"].(string)) && get(o, "metadata", "namespace") != target {
			t.Errorf("%s in %v", k, get(o, "metadata", "namespace"))
		}
	}
	subjects := get(objs["ClusterRoleBinding/capc-health-shim"], "subjects").([]any)
	if subjects[0].(obj)["namespace"] != target {
		t.Errorf("binding subject %v", subjects[0])
	}
	c := managerContainerOf(t, objs["Deployment/capc-health-shim"])
	if c["image"] != "registry.example.com/mirror/capc-health-shim:v0.1.0-rc1" {
		t.Errorf("image %v", c["image"])
	}
	if envOf(c)[logEnv] != "info,capc_health_shim=debug" {
		t.Errorf("log %v", envOf(c)[logEnv])
	}
}

// metadata.yaml passes clusterctl's validation (the tests above read it through clusterctl); the
// same path refuses what the contract forbids, so passing means something.
func TestMetadataIsValidatedByClusterctl(t *testing.T) {
	unsetenv(t, imageVar, logVar)
	b := mustBase(t)
	text, err := metadataYAML(b)
	if err != nil {
		t.Fatal(err)
	}
	var md obj
	if err := yaml.Unmarshal([]byte(text), &md); err != nil {
		t.Fatal(err)
	}
	if md["apiVersion"] != clusterctlv1.GroupVersion.String() || md["kind"] != "Metadata" {
		t.Errorf("apiVersion/kind %v/%v", md["apiVersion"], md["kind"])
	}
	series := md["releaseSeries"].([]any)
	found := false
	for _, s := range series {
		sm := s.(obj)
		if sm["contract"] != contract {
			t.Errorf("series %v: contract %v, want %s", sm, sm["contract"], contract)
		}
		if v := strings.Split(b.version, "."); sm["major"] == mustFloat(v[0]) && sm["minor"] == mustFloat(v[1]) {
			found = true
		}
	}
	if !found {
		t.Errorf("no release series for %s in %v", b.version, series)
	}

	broken := map[string]struct{ metadata, version, want string }{
		"empty releaseSeries":  {"apiVersion: clusterctl.cluster.x-k8s.io/v1alpha3\nkind: Metadata\nreleaseSeries: []\n", "", "releaseSeries is empty"},
		"wrong apiVersion":     {strings.Replace(text, "v1alpha3", "v1alpha2", 1), "", `error decoding "metadata.yaml"`},
		"wrong kind":           {strings.Replace(text, "kind: Metadata", "kind: Provider", 1), "", `error decoding "metadata.yaml"`},
		"unknown contract":     {strings.ReplaceAll(text, "contract: "+contract, "contract: v1alpha4"), "", "v1alpha4"},
		"version in no series": {text, "v9.9.0", "does not match any release series"},
	}
	for name, c := range broken {
		t.Run(name, func(t *testing.T) {
			dir, _ := writeRepo(t, b)
			version := "v" + b.version
			if c.version != "" {
				if err := os.Rename(filepath.Join(dir, providerLabel, version), filepath.Join(dir, providerLabel, c.version)); err != nil {
					t.Fatal(err)
				}
				version = c.version
			}
			vdir := filepath.Join(dir, providerLabel, version)
			if err := os.WriteFile(filepath.Join(vdir, "metadata.yaml"), []byte(c.metadata), 0o644); err != nil {
				t.Fatal(err)
			}
			url := "file://" + filepath.ToSlash(filepath.Join(vdir, "addon-components.yaml"))
			_, err := clusterctlGenerate(context.Background(), url, version, "")
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("clusterctl accepted it or said something else: %v (want %q)", err, c.want)
			}
		})
	}
}

func mustFloat(s string) float64 {
	var f float64
	for _, ch := range s {
		f = f*10 + float64(ch-'0')
	}
	return f
}

// The committed chart is what the generator writes from today's deploy/base.
func TestTheCommittedChartIsGeneratedFromTheBase(t *testing.T) {
	b := mustBase(t)
	want, err := chartFiles(b)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(b.root, "deploy", "helm", chartName)
	have := map[string]string{}
	err = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		text, err := os.ReadFile(p)
		have[filepath.ToSlash(rel)] = string(text)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for name, w := range want {
		if h, ok := have[name]; !ok {
			t.Errorf("deploy/helm/%s/%s missing", chartName, name)
		} else if h != w {
			t.Errorf("deploy/helm/%s/%s is out of date", chartName, name)
		}
	}
	for name := range have {
		if _, ok := want[name]; !ok {
			t.Errorf("deploy/helm/%s/%s is not generated", chartName, name)
		}
	}
	if t.Failed() {
		t.Log("run `make release-manifests` to regenerate the chart")
	}
}

func chartDir(t *testing.T) string {
	return filepath.Join(repoRoot(t), "deploy", "helm", chartName)
}

var helmLabels = []string{"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "app.kubernetes.io/version"}

// The default values render deploy/base itself (the Namespace only on request), plus Helm's labels.
func TestTheChartWithDefaultValuesRendersTheBase(t *testing.T) {
	b := mustBase(t)
	ns, _ := b.namespace()
	text, err := helmTemplate(chartDir(t), "capc-health-shim", ns, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := byKey(t, parseDocs(t, text))
	want := baseObjects(t, b)
	delete(want, "Namespace/"+ns)
	if len(got) != len(want) {
		t.Errorf("%d objects rendered, want %d (deploy/base without its Namespace)", len(got), len(want))
	}
	for k, w := range want {
		g, ok := got[k]
		if !ok {
			t.Errorf("%s not rendered", k)
			continue
		}
		if labels(g)["app.kubernetes.io/managed-by"] != "Helm" || labels(g)["app.kubernetes.io/instance"] != "capc-health-shim" {
			t.Errorf("%s: Helm's labels missing: %v", k, labels(g))
		}
		// The chart's selectors (and the pods' labels) hold the release too, so that two
		// releases never select each other's pods; the base's have no release to name.
		for _, sel := range selectorsOf(g) {
			if sel["app.kubernetes.io/instance"] != "capc-health-shim" {
				t.Errorf("%s: selector %v without the release", k, sel)
			}
			delete(sel, "app.kubernetes.io/instance")
		}
		if stripped := withoutLabels(t, g, helmLabels...); !reflect.DeepEqual(stripped, w) {
			gb, _ := yaml.Marshal(stripped)
			wb, _ := yaml.Marshal(w)
			t.Errorf("%s differs from deploy/base:\n--- chart\n%s\n--- base\n%s", k, gb, wb)
		}
	}
	linter := lint.All(chartDir(t), nil, ns, false)
	for _, m := range linter.Messages {
		if m.Severity >= support.WarningSev {
			t.Errorf("helm lint: %s", m)
		}
	}
}

func TestTheChartWithOtherValues(t *testing.T) {
	const ns = "ops-shim"
	values := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(values, []byte(`
image:
  repository: registry.example.com/mirror/capc-health-shim
  tag: v0.1.0-rc1
  pullPolicy: Always
imagePullSecrets: [{name: regcred}]
replicas: 1
resources:
  requests: {cpu: 100m, memory: 128Mi}
  limits: {cpu: "1", memory: 512Mi}
log: info
endpointCredentials:
  - apiUrl: https://cloud.example.com/client/api
    secretName: capc-health-shim-cloudstack-readonly
  - apiUrl: https://other.example.com/client/api
    secretName: ro-key
    namespace: keys
extraCA:
  configMapName: corporate-ca
extraArgs: ["--mode=observe"]
extraEnv: [{name: CAPC_HEALTH_POLL_INTERVAL, value: 45s}]
extraVolumes: [{name: tls, secret: {secretName: shim-serving-cert}}]
extraVolumeMounts: [{name: tls, mountPath: /etc/capc-health-shim/tls, readOnly: true}]
namespace:
  create: true
networkPolicy:
  egress:
    - to: [{ipBlock: {cidr: 10.0.0.0/24}}]
      ports: [{port: 8080, protocol: TCP}]
`), 0o644); err != nil {
		t.Fatal(err)
	}
	text, err := helmTemplate(chartDir(t), "shim", ns, []string{values}, []string{"networkPolicy.enabled=true"})
	if err != nil {
		t.Fatal(err)
	}
	objs := byKey(t, parseDocs(t, text))
	const full = "shim-capc-health-shim" // the release name does not contain the chart's
	if _, ok := objs["PodDisruptionBudget/"+full]; ok {
		t.Error("a PodDisruptionBudget with one replica would block every drain")
	}
	if n := objs["Namespace/"+ns]; n == nil || labels(n)["pod-security.kubernetes.io/enforce"] != "restricted" {
		t.Errorf("namespace.create: %v", n)
	}
	for k, o := range objs {
		if !isClusterScoped(o["kind"].(string)) && get(o, "metadata", "namespace") != ns {
			t.Errorf("%s in %v", k, get(o, "metadata", "namespace"))
		}
	}
	if s := get(objs["ClusterRoleBinding/"+full], "subjects").([]any); s[0].(obj)["namespace"] != ns {
		t.Errorf("binding subject %v", s[0])
	}
	d := objs["Deployment/"+full]
	if get(d, "spec", "replicas") != float64(1) {
		t.Errorf("replicas %v", get(d, "spec", "replicas"))
	}
	c := managerContainerOf(t, d)
	if c["image"] != "registry.example.com/mirror/capc-health-shim:v0.1.0-rc1" || c["imagePullPolicy"] != "Always" {
		t.Errorf("image %v %v", c["image"], c["imagePullPolicy"])
	}
	if get(c, "resources", "limits", "memory") != "512Mi" || get(c, "resources", "requests", "cpu") != "100m" {
		t.Errorf("resources %v", c["resources"])
	}
	args := []string{}
	for _, a := range c["args"].([]any) {
		args = append(args, a.(string))
	}
	wantArgs := []string{"run", "--log-format=json", "--lease-name=" + full, "--orphan-memory-configmap=" + full + "-memory",
		"--endpoint-credentials=https://cloud.example.com/client/api=" + ns + "/capc-health-shim-cloudstack-readonly",
		"--endpoint-credentials=https://other.example.com/client/api=keys/ro-key",
		"--mode=observe"}
	if !reflect.DeepEqual(args, wantArgs) {
		t.Errorf("args %q, want %q", args, wantArgs)
	}
	env := envOf(c)
	if env[logEnv] != "info" || env["CAPC_HEALTH_POLL_INTERVAL"] != "45s" {
		t.Errorf("env %v", env)
	}
	certDirs := strings.Split(env["SSL_CERT_DIR"].(string), ":")
	mounts, _ := c["volumeMounts"].([]any)
	vols, _ := get(d, "spec", "template", "spec", "volumes").([]any)
	if len(mounts) != 2 || len(vols) != 2 {
		t.Fatalf("extra CA and extra volume: mounts %v volumes %v", mounts, vols)
	}
	if get(vols[1].(obj), "secret", "secretName") != "shim-serving-cert" || mounts[1].(obj)["mountPath"] != "/etc/capc-health-shim/tls" {
		t.Errorf("extraVolumes/extraVolumeMounts: %v %v", vols[1], mounts[1])
	}
	m, v := mounts[0].(obj), vols[0].(obj)
	if m["name"] != v["name"] || get(v, "configMap", "name") != "corporate-ca" || m["readOnly"] != true {
		t.Errorf("extra CA volume %v mount %v", v, m)
	}
	if !reflect.DeepEqual(certDirs, []string{systemCADir, m["mountPath"].(string)}) {
		t.Errorf("SSL_CERT_DIR %v: the system CAs and the mount %v", certDirs, m["mountPath"])
	}
	if ps := get(d, "spec", "template", "spec", "imagePullSecrets").([]any); ps[0].(obj)["name"] != "regcred" {
		t.Errorf("imagePullSecrets %v", ps)
	}
	np := objs["NetworkPolicy/"+full]
	egress := get(np, "spec", "egress").([]any)
	if len(egress) != 1 || get(egress[0].(obj), "to") == nil {
		t.Errorf("egress %v", egress)
	}

	// A Secret for the CA instead of a ConfigMap; the NetworkPolicy off.
	text, err = helmTemplate(chartDir(t), "shim", ns, nil, []string{"extraCA.secretName=corporate-ca", "networkPolicy.enabled=false"})
	if err != nil {
		t.Fatal(err)
	}
	objs = byKey(t, parseDocs(t, text))
	if _, ok := objs["NetworkPolicy/"+full]; ok {
		t.Error("networkPolicy.enabled=false still renders it")
	}
	vols = get(objs["Deployment/"+full], "spec", "template", "spec", "volumes").([]any)
	if len(vols) != 1 || get(vols[0].(obj), "secret", "secretName") != "corporate-ca" {
		t.Errorf("volumes %v", vols)
	}

	// An extra volume without an extra CA: only that volume, and no SSL_CERT_DIR.
	text, err = helmTemplate(chartDir(t), "shim", ns, nil, []string{"extraVolumes[0].name=tls", "extraVolumes[0].secret.secretName=cert", "extraVolumeMounts[0].name=tls", "extraVolumeMounts[0].mountPath=/tls"})
	if err != nil {
		t.Fatal(err)
	}
	d = byKey(t, parseDocs(t, text))["Deployment/"+full]
	c = managerContainerOf(t, d)
	vols = get(d, "spec", "template", "spec", "volumes").([]any)
	mounts, _ = c["volumeMounts"].([]any)
	if len(vols) != 1 || vols[0].(obj)["name"] != "tls" || len(mounts) != 1 || mounts[0].(obj)["mountPath"] != "/tls" {
		t.Errorf("volumes %v mounts %v", vols, mounts)
	}
	if _, ok := envOf(c)["SSL_CERT_DIR"]; ok {
		t.Error("SSL_CERT_DIR without an extra CA")
	}

	// The schema refuses misspelt or incomplete values instead of ignoring them.
	for _, bad := range []string{"replica=3", "image.tags=v1", "endpointCredentials[0].apiUrl=https://x/client/api", "networkPolicy.enabled=maybe"} {
		if _, err := helmTemplate(chartDir(t), "shim", ns, nil, []string{bad}); err == nil {
			t.Errorf("--set %s was accepted", bad)
		}
	}
}

// selectorsOf are the label maps of an object that select the shim's pods, and the pods' own.
func selectorsOf(o obj) []obj {
	var out []obj
	add := func(v any) {
		if m, ok := v.(obj); ok {
			out = append(out, m)
		}
	}
	switch o["kind"] {
	case "Deployment":
		add(get(o, "spec", "selector", "matchLabels"))
		add(get(o, "spec", "template", "metadata", "labels"))
		tscs, _ := get(o, "spec", "template", "spec", "topologySpreadConstraints").([]any)
		for _, c := range tscs {
			add(get(c.(obj), "labelSelector", "matchLabels"))
		}
	case "Service":
		add(get(o, "spec", "selector"))
	case "PodDisruptionBudget", "ServiceMonitor":
		add(get(o, "spec", "selector", "matchLabels"))
	case "NetworkPolicy":
		add(get(o, "spec", "podSelector", "matchLabels"))
	}
	return out
}
