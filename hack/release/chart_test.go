package main

// The chart's conventions (issue 43, item 3) with non-default values, through Helm's library:
// names after the release and every reference following them, the ServiceAccount and RBAC
// switches, the ServiceMonitor, the Secrets choice, the pods' scheduling values, the schema and
// the values reference generated from it.

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

func render(t *testing.T, release, ns string, sets ...string) []obj {
	t.Helper()
	text, err := helmTemplate(chartDir(t), release, ns, nil, sets)
	if err != nil {
		t.Fatalf("helm template %s -n %s %v: %v", release, ns, sets, err)
	}
	return parseDocs(t, text)
}

func ofKind(objs []obj, kind string) []obj {
	var out []obj
	for _, o := range objs {
		if o["kind"] == kind {
			out = append(out, o)
		}
	}
	return out
}

func one(t *testing.T, objs []obj, kind string) obj {
	t.Helper()
	os := ofKind(objs, kind)
	if len(os) != 1 {
		t.Fatalf("%d %s rendered, want 1", len(os), kind)
	}
	return os[0]
}

func nameOf(o obj) string {
	n, _ := get(o, "metadata", "name").(string)
	return n
}

func nsOf(o obj) string {
	n, _ := get(o, "metadata", "namespace").(string)
	return n
}

func argsOf(t *testing.T, d obj) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, a := range managerContainerOf(t, d)["args"].([]any) {
		if k, v, ok := strings.Cut(a.(string), "="); ok {
			out[k] = v
		}
	}
	return out
}

// strings that name the chart's objects where a release's own name belongs: every string of
// the objects except the label values and the image, which name the application.
func leakedNames(o obj) []string {
	var out []string
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case obj:
			for k, c := range x {
				if k == "app.kubernetes.io/name" || k == "helm.sh/chart" || k == "image" {
					continue
				}
				// The alerts' and the dashboard's text (monitoring_test.go checks they are the
				// component's) name the application, not an object.
				if (o["kind"] == "PrometheusRule" && path == "" && k == "spec") || (o["kind"] == "ConfigMap" && path == "" && k == "data") {
					continue
				}
				walk(path+"."+k, c)
			}
		case []any:
			for _, c := range x {
				walk(path+"[]", c)
			}
		case string:
			for _, f := range strings.FieldsFunc(x, func(r rune) bool { return r == '=' || r == '/' || r == ' ' || r == ',' }) {
				if f == chartName || strings.HasPrefix(f, chartName+"-") {
					out = append(out, path+": "+x)
				}
			}
		}
	}
	walk("", o)
	return out
}

// Every name follows the release and every reference follows the names, so two releases in two
// namespaces share no object; the base's names appear nowhere a name is (a release whose name
// does not contain the chart's).
func TestTheChartsNamesFollowTheRelease(t *testing.T) {
	sets := []string{
		"serviceMonitor.enabled=true", "monitoring.prometheusRule.enabled=true", "monitoring.dashboard.enabled=true",
		"rbac.secrets.namespaces={capi-clusters,capc-keys}",
	}
	type release struct{ name, ns, full string }
	releases := []release{
		{"east", "ops-east", "east-capc-health-shim"},
		{"west", "ops-west", "west-capc-health-shim"},
	}
	seen := map[string]string{}
	for _, r := range releases {
		objs := render(t, r.name, r.ns, sets...)
		byKind := map[string][]obj{}
		for _, o := range objs {
			k := o["kind"].(string)
			byKind[k] = append(byKind[k], o)
			id := k + " " + nsOf(o) + "/" + nameOf(o)
			if other, ok := seen[id]; ok {
				t.Errorf("%s rendered by both %s and %s", id, other, r.name)
			}
			seen[id] = r.name
			if !strings.HasPrefix(nameOf(o), r.full) {
				t.Errorf("%s: name not after the release (%s)", id, r.full)
			}
			for _, l := range leakedNames(o) {
				t.Errorf("%s still names the base's object: %s", id, l)
			}
		}
		for _, k := range []string{"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy", "ServiceMonitor", "PrometheusRule", "ConfigMap"} {
			if len(byKind[k]) == 0 {
				t.Errorf("%s: no %s rendered (the checks would pass on nothing)", r.name, k)
			}
		}
		sa := one(t, objs, "ServiceAccount")
		d := one(t, objs, "Deployment")
		if get(d, "spec", "template", "spec", "serviceAccountName") != nameOf(sa) {
			t.Errorf("serviceAccountName %v, the ServiceAccount is %s", get(d, "spec", "template", "spec", "serviceAccountName"), nameOf(sa))
		}
		// Bindings: their roles are rendered, their subject is the ServiceAccount.
		roles := map[string]bool{}
		for _, o := range append(byKind["ClusterRole"], byKind["Role"]...) {
			roles[o["kind"].(string)+" "+nsOf(o)+"/"+nameOf(o)] = true
		}
		for _, b := range append(byKind["ClusterRoleBinding"], byKind["RoleBinding"]...) {
			ref := get(b, "roleRef").(obj)
			want := ref["kind"].(string) + " " + nsOf(b) + "/" + ref["name"].(string)
			if !roles[want] {
				t.Errorf("%s %s: roleRef %s is not rendered", b["kind"], nameOf(b), want)
			}
			for _, s := range get(b, "subjects").([]any) {
				if s.(obj)["name"] != nameOf(sa) || s.(obj)["namespace"] != r.ns {
					t.Errorf("%s %s: subject %v, want %s/%s", b["kind"], nameOf(b), s, r.ns, nameOf(sa))
				}
			}
		}
		// The flags name the Lease and the ConfigMap the Role grants.
		args := argsOf(t, d)
		if args["--lease-name"] != r.full || args["--orphan-memory-configmap"] != r.full+"-memory" {
			t.Errorf("args %v", args)
		}
		var leader obj
		for _, role := range byKind["Role"] {
			if nameOf(role) == r.full+"-leader" {
				leader = role
			}
		}
		granted := map[string][]string{}
		for _, rule := range get(leader, "rules").([]any) {
			for _, res := range asList(rule.(obj)["resources"]) {
				granted[res] = append(granted[res], asList(rule.(obj)["resourceNames"])...)
			}
		}
		if !reflect.DeepEqual(granted["leases"], []string{args["--lease-name"]}) || !reflect.DeepEqual(granted["configmaps"], []string{args["--orphan-memory-configmap"]}) {
			t.Errorf("the leader Role grants %v, the flags name %v", granted, args)
		}
		// Every selector selects this release's pods (its labels) and names the release.
		podLabels := get(d, "spec", "template", "metadata", "labels").(obj)
		for _, o := range objs {
			for _, sel := range selectorsOf(o) {
				if sel["app.kubernetes.io/instance"] != r.name {
					t.Errorf("%s %s: selector %v without the release", o["kind"], nameOf(o), sel)
				}
				for k, v := range sel {
					if podLabels[k] != v {
						t.Errorf("%s %s: selector %s=%v, the pods have %v", o["kind"], nameOf(o), k, v, podLabels[k])
					}
				}
			}
		}
	}

	// A release name that contains the chart's is the name; fullnameOverride replaces it; a long
	// one is cut to 63 characters (a Service name is a DNS label).
	for _, c := range []struct {
		release string
		sets    []string
		want    string
	}{
		{"capc-health-shim-east", nil, "capc-health-shim-east"},
		{"east", []string{"fullnameOverride=shim"}, "shim"},
		// Helm's longest release name, 53 characters.
		{strings.Repeat("r", 53), nil, (strings.Repeat("r", 53) + "-capc-health-shim")[:63]},
	} {
		objs := render(t, c.release, "ops", c.sets...)
		if got := nameOf(one(t, objs, "Deployment")); got != c.want || len(got) > 63 {
			t.Errorf("release %s %v: Deployment %s, want %s", c.release, c.sets, got, c.want)
		}
		if got := nameOf(one(t, objs, "Service")); got != c.want {
			t.Errorf("release %s %v: Service %s, want %s", c.release, c.sets, got, c.want)
		}
	}
}

func TestTheChartsServiceAccountValues(t *testing.T) {
	// Created, with another name and annotations.
	objs := render(t, "shim", "ops", "serviceAccount.name=shim-runner", "serviceAccount.annotations.example\\.com/role=reader")
	sa := one(t, objs, "ServiceAccount")
	if nameOf(sa) != "shim-runner" || get(sa, "metadata", "annotations", "example.com/role") != "reader" {
		t.Errorf("ServiceAccount %v", sa["metadata"])
	}
	// Not created: none rendered; the pods and every binding use the given name, or default.
	for _, c := range []struct {
		sets []string
		want string
	}{
		{[]string{"serviceAccount.create=false", "serviceAccount.name=existing"}, "existing"},
		{[]string{"serviceAccount.create=false"}, "default"},
	} {
		objs := render(t, "shim", "ops", append(c.sets, "rbac.secrets.namespaces={keys}")...)
		if sas := ofKind(objs, "ServiceAccount"); len(sas) != 0 {
			t.Errorf("%v: a ServiceAccount rendered: %v", c.sets, sas)
		}
		if got := get(one(t, objs, "Deployment"), "spec", "template", "spec", "serviceAccountName"); got != c.want {
			t.Errorf("%v: serviceAccountName %v, want %s", c.sets, got, c.want)
		}
		bindings := append(ofKind(objs, "ClusterRoleBinding"), ofKind(objs, "RoleBinding")...)
		if len(bindings) != 3 {
			t.Errorf("%v: %d bindings, want 3 (ClusterRole, leader Role, Secrets Role)", c.sets, len(bindings))
		}
		for _, b := range bindings {
			if s := get(b, "subjects").([]any)[0].(obj); s["name"] != c.want || s["namespace"] != "ops" {
				t.Errorf("%v: %s %s binds %v", c.sets, b["kind"], nameOf(b), s)
			}
		}
	}
}

func TestTheChartsRBACSwitchAndSecretsChoice(t *testing.T) {
	rbacKinds := []string{"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"}
	secretsRules := func(objs []obj) map[string]int {
		out := map[string]int{}
		for _, o := range objs {
			if o["kind"] != "ClusterRole" && o["kind"] != "Role" {
				continue
			}
			for _, r := range get(o, "rules").([]any) {
				if reflect.DeepEqual(asList(r.(obj)["resources"]), []string{"secrets"}) {
					if !reflect.DeepEqual(asList(r.(obj)["verbs"]), []string{"get"}) || r.(obj)["resourceNames"] != nil {
						t.Errorf("%s %s: Secrets rule %v, want get on all", o["kind"], nameOf(o), r)
					}
					out[o["kind"].(string)+" "+nsOf(o)]++
				}
			}
		}
		return out
	}
	// Default: get on Secrets cluster-wide (the base's rule), no per-namespace Role.
	def := render(t, "shim", "ops")
	if got := secretsRules(def); !reflect.DeepEqual(got, map[string]int{"ClusterRole ": 1}) {
		t.Errorf("default Secrets rules %v, want the ClusterRole's only", got)
	}
	for _, k := range rbacKinds {
		if len(ofKind(def, k)) == 0 {
			t.Errorf("default: no %s (the rbac.create=false check below would pass on nothing)", k)
		}
	}
	// Namespaces: a Role and RoleBinding in each, none cluster-wide; the rest unchanged.
	objs := render(t, "shim", "ops", "rbac.secrets.namespaces={capi-clusters,capc-keys}")
	if got := secretsRules(objs); !reflect.DeepEqual(got, map[string]int{"Role capi-clusters": 1, "Role capc-keys": 1}) {
		t.Errorf("Secrets rules %v, want one Role in each listed namespace", got)
	}
	for _, b := range ofKind(objs, "RoleBinding") {
		if nsOf(b) == "ops" {
			continue
		}
		if get(b, "roleRef", "name") != "shim-capc-health-shim-secrets" || get(b, "roleRef", "kind") != "Role" {
			t.Errorf("RoleBinding %s/%s: roleRef %v", nsOf(b), nameOf(b), b["roleRef"])
		}
	}
	if n := len(ofKind(objs, "RoleBinding")); n != 3 {
		t.Errorf("%d RoleBindings, want the leader's and two for Secrets", n)
	}
	rulesOf := func(objs []obj) int {
		for _, c := range ofKind(objs, "ClusterRole") {
			if nameOf(c) == "shim-capc-health-shim" {
				return len(get(c, "rules").([]any))
			}
		}
		t.Fatal("no ClusterRole shim-capc-health-shim")
		return 0
	}
	if rulesOf(objs) != rulesOf(def)-1 {
		t.Errorf("the ClusterRole has %d rules, by default %d: it lost more than its Secrets rule", rulesOf(objs), rulesOf(def))
	}
	// An --endpoint-credentials Secret outside the listed namespaces could not be read: refused.
	cred := []string{"endpointCredentials[0].apiUrl=https://cloud.example.com/client/api", "endpointCredentials[0].secretName=ro"}
	if _, err := helmTemplate(chartDir(t), "shim", "ops", nil, append(cred, "rbac.secrets.namespaces={capi-clusters}")); err == nil || !strings.Contains(err.Error(), "ops/ro") {
		t.Errorf("endpointCredentials in an unlisted namespace: %v", err)
	}
	render(t, "shim", "ops", append(cred, "rbac.secrets.namespaces={capi-clusters,ops}")...)
	render(t, "shim", "ops", cred...) // cluster-wide: any namespace

	// rbac.create=false: no RBAC at all, the Secrets Roles included.
	objs = render(t, "shim", "ops", "rbac.create=false", "rbac.secrets.namespaces={capi-clusters}")
	for _, k := range rbacKinds {
		if got := ofKind(objs, k); len(got) != 0 {
			t.Errorf("rbac.create=false renders %d %s", len(got), k)
		}
	}
	if len(ofKind(objs, "Deployment")) != 1 || len(ofKind(objs, "ServiceAccount")) != 1 {
		t.Error("rbac.create=false lost the Deployment or the ServiceAccount")
	}
}

func TestTheChartsServiceMonitorAndTheRuleThatNeedsIt(t *testing.T) {
	if sms := ofKind(render(t, "shim", "ops"), "ServiceMonitor"); len(sms) != 0 {
		t.Errorf("a ServiceMonitor by default: %v", sms)
	}
	objs := render(t, "shim", "ops", "serviceMonitor.enabled=true", "serviceMonitor.labels.release=prometheus", "serviceMonitor.interval=1m")
	sm := one(t, objs, "ServiceMonitor")
	svc := one(t, objs, "Service")
	for k, v := range get(sm, "spec", "selector", "matchLabels").(obj) {
		if labels(svc)[k] != v {
			t.Errorf("ServiceMonitor selects %s=%v, the Service is labelled %v", k, v, labels(svc)[k])
		}
	}
	eps := get(sm, "spec", "endpoints").([]any)
	ep := eps[0].(obj)
	ports := map[any]bool{}
	for _, p := range get(svc, "spec", "ports").([]any) {
		ports[p.(obj)["name"]] = true
	}
	if len(eps) != 1 || !ports[ep["port"]] || ep["path"] != "/metrics" || ep["scheme"] != "https" || ep["interval"] != "1m" || ep["scrapeTimeout"] != "10s" {
		t.Errorf("endpoint %v (Service ports %v)", ep, ports)
	}
	if labels(sm)["release"] != "prometheus" || nsOf(sm) != "ops" {
		t.Errorf("ServiceMonitor metadata %v", sm["metadata"])
	}
	// deploy/optional/servicemonitor.yaml is the source: its endpoint is the chart's.
	src, err := readObjects(filepath.Join(repoRoot(t), serviceMonitorFile))
	if err != nil {
		t.Fatal(err)
	}
	text, _ := marshal(src[0])
	var want obj
	if err := yaml.Unmarshal([]byte(text), &want); err != nil {
		t.Fatal(err)
	}
	wantEp := get(want, "spec", "endpoints").([]any)[0].(obj)
	wantEp["interval"] = "1m"
	if !reflect.DeepEqual(ep, wantEp) {
		t.Errorf("endpoint %v, %s has %v", ep, serviceMonitorFile, wantEp)
	}

	// The PrometheusRule alone would fire CAPCHealthNoLeader: refused, unless scraped elsewhere.
	if _, err := helmTemplate(chartDir(t), "shim", "ops", nil, []string{"monitoring.prometheusRule.enabled=true"}); err == nil || !strings.Contains(err.Error(), "serviceMonitor.enabled") {
		t.Errorf("prometheusRule without serviceMonitor: %v", err)
	}
	for _, ok := range [][]string{
		{"monitoring.prometheusRule.enabled=true", "serviceMonitor.enabled=true"},
		{"monitoring.prometheusRule.enabled=true", "monitoring.prometheusRule.scrapedElsewhere=true"},
	} {
		if n := len(ofKind(render(t, "shim", "ops", ok...), "PrometheusRule")); n != 1 {
			t.Errorf("%v: %d PrometheusRules", ok, n)
		}
	}
}

func TestTheChartsPodValues(t *testing.T) {
	f := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(f, []byte(`
nodeSelector: {node-role.example.com/infra: "true"}
tolerations: [{key: infra, operator: Exists, effect: NoSchedule}]
affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: zone, operator: In, values: [a]}]}]}}}
priorityClassName: system-cluster-critical
podAnnotations: {example.com/scrape: "false"}
podLabels: {team: platform}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	text, err := helmTemplate(chartDir(t), "shim", "ops", []string{f}, nil)
	if err != nil {
		t.Fatal(err)
	}
	objs := parseDocs(t, text)
	d := one(t, objs, "Deployment")
	pod := get(d, "spec", "template", "spec").(obj)
	// Helm merges maps: the base's kubernetes.io/os stays next to the new key.
	if !reflect.DeepEqual(pod["nodeSelector"], obj{"kubernetes.io/os": "linux", "node-role.example.com/infra": "true"}) {
		t.Errorf("nodeSelector %v", pod["nodeSelector"])
	}
	if get(pod["tolerations"].([]any)[0].(obj), "key") != "infra" || get(pod["affinity"].(obj), "nodeAffinity") == nil || pod["priorityClassName"] != "system-cluster-critical" {
		t.Errorf("tolerations %v affinity %v priorityClassName %v", pod["tolerations"], pod["affinity"], pod["priorityClassName"])
	}
	if get(d, "spec", "template", "metadata", "annotations", "example.com/scrape") != "false" || get(d, "spec", "template", "metadata", "labels", "team") != "platform" {
		t.Errorf("pod metadata %v", get(d, "spec", "template", "metadata"))
	}
	for _, o := range objs {
		for _, sel := range selectorsOf(o) {
			if _, ok := sel["team"]; ok && !(o["kind"] == "Deployment" && reflect.DeepEqual(sel, get(d, "spec", "template", "metadata", "labels"))) {
				t.Errorf("%s %s: podLabels in a selector %v", o["kind"], nameOf(o), sel)
			}
		}
	}
	// nodeSelector: null drops the base's.
	d = one(t, render(t, "shim", "ops", "nodeSelector=null"), "Deployment")
	if ns := get(d, "spec", "template", "spec", "nodeSelector"); ns != nil {
		t.Errorf("nodeSelector=null: %v", ns)
	}
}

func TestTheChartsSchemaRefusesBadValues(t *testing.T) {
	for _, bad := range []string{
		"serviceAccount.create=maybe",
		"serviceAccount.nmae=x",
		"serviceAccount.name=Not_A_Name",
		"rbac.create=yes",
		"rbac.secrets.namespaces={Capi_Clusters}",
		"rbac.secrets.namespaces={a,a}",
		"rbac.secret.namespaces={a}",
		"serviceMonitor.enabled=sure",
		"serviceMonitor.interval=soon",
		"fullnameOverride=Shim",
		"nodeSelector.zone=1",
		"podLabels.team=7",
		"tolerations.key=x",
		"monitoring.prometheusRule.scrapedElsewher=true",
	} {
		if _, err := helmTemplate(chartDir(t), "shim", "ops", nil, []string{"serviceMonitor.enabled=true", bad}); err == nil {
			t.Errorf("--set %s was accepted", bad)
		}
	}
	// Positive control: good values of the same keys pass.
	render(t, "shim", "ops", "serviceAccount.create=false", "serviceAccount.name=runner", "rbac.create=true",
		"rbac.secrets.namespaces={a,b}", "serviceMonitor.interval=45s", "fullnameOverride=shim", "nodeSelector.zone=a", "podLabels.team=x")
}

// README.md lists every value of values.yaml (a map value such as resources as one row) with a
// description from the schema; the generator refuses a schema property without one.
func TestTheValuesReferenceIsTheSchemas(t *testing.T) {
	dir := chartDir(t)
	readme, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	valuesText, err := os.ReadFile(filepath.Join(dir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values obj
	if err := yaml.Unmarshal(valuesText, &values); err != nil {
		t.Fatal(err)
	}
	rows := map[string]bool{}
	for _, l := range strings.Split(string(readme), "\n") {
		if strings.HasPrefix(l, "| `") {
			rows[strings.Split(l, "`")[1]] = true
		}
	}
	var missing []string
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		if rows[prefix] {
			return
		}
		m, ok := v.(obj)
		if !ok || len(m) == 0 {
			missing = append(missing, prefix)
			return
		}
		for k, c := range m {
			p := k
			if prefix != "" {
				p = prefix + "." + k
			}
			walk(p, c)
		}
	}
	walk("", values)
	sort.Strings(missing)
	if len(missing) > 0 {
		t.Errorf("README.md has no row for %v", missing)
	}
	for _, want := range []string{"serviceAccount.create", "rbac.secrets.namespaces", "serviceMonitor.enabled", "fullnameOverride", "nodeSelector"} {
		if !rows[want] {
			t.Errorf("no row %s", want)
		}
	}
	// Negative control: a property without a description is refused.
	flags, err := loadRunFlags(defaultRoot())
	if err != nil {
		t.Fatal(err)
	}
	schema, err := valuesSchema(flags)
	if err != nil {
		t.Fatal(err)
	}
	var s obj
	if err := json.Unmarshal([]byte(schema), &s); err != nil {
		t.Fatal(err)
	}
	delete(get(s, "properties", "serviceMonitor", "properties", "enabled").(obj), "description")
	broken, _ := json.Marshal(s)
	if _, err := valuesReadme(string(broken), string(valuesText)); err == nil || !strings.Contains(err.Error(), "serviceMonitor.enabled") {
		t.Errorf("a value without a description: %v", err)
	}
}

// managerEnv is the manager container's env as name → literal value.
func managerEnv(t *testing.T, d obj) map[string]string {
	t.Helper()
	out := map[string]string{}
	cs, _ := get(d, "spec", "template", "spec", "containers").([]any)
	for _, c := range cs {
		if c.(obj)["name"] != managerContainer {
			continue
		}
		env, _ := c.(obj)["env"].([]any)
		for _, e := range env {
			v, _ := e.(obj)["value"].(string)
			out[e.(obj)["name"].(string)] = v
		}
	}
	return out
}

// Issue 43 (3): a config value for every flag of `run` (run-flags.json, from clap) but those the
// chart sets itself; each renders its CAPC_HEALTH_* variable only when set.
func TestTheChartsConfigHasAValueForEveryRunFlag(t *testing.T) {
	flags, err := loadRunFlags(repoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	valuesText, err := os.ReadFile(filepath.Join(chartDir(t), "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values obj
	if err := yaml.Unmarshal(valuesText, &values); err != nil {
		t.Fatal(err)
	}
	config, _ := values["config"].(obj)
	readme, err := os.ReadFile(filepath.Join(chartDir(t), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	keys := 0
	for _, f := range flags {
		_, set := chartSetsFlag[f.Flag]
		_, has := config[configKey(f)]
		if set == has {
			t.Errorf("--%s: config.%s present=%v, set by the chart=%v", f.Flag, configKey(f), has, set)
		}
		if has {
			keys++
			if !strings.Contains(string(readme), "| `config."+configKey(f)+"` |") {
				t.Errorf("README.md has no row config.%s", configKey(f))
			}
		}
	}
	if keys < 40 || len(config) != keys {
		t.Errorf("%d config values for %d flags: %v", len(config), len(flags), config)
	}
	// Default: none of the variables.
	base := managerEnv(t, one(t, render(t, "shim", "ops"), "Deployment"))
	for _, f := range flags {
		if _, ok := base[f.Env]; ok && f.Flag != "lease-namespace" {
			t.Errorf("default render sets %s", f.Env)
		}
	}
	// Set: each as its variable (a number, a list, a switch, a choice).
	env := managerEnv(t, one(t, render(t, "shim", "ops",
		"config.pollInterval=7s", "config.rateLimit=2.5", "config.maxConcurrentWrites=4",
		"config.namespaces={capi-a,capi-b}", "config.noOrphanReport=true", "config.noRemnantReport=false",
		"config.mode=observe", "config.probeArpingParams=-c 2"), "Deployment"))
	for k, want := range map[string]string{
		"CAPC_HEALTH_POLL_INTERVAL":         "7s",
		"CAPC_HEALTH_RATE_LIMIT":            "2.5",
		"CAPC_HEALTH_MAX_CONCURRENT_WRITES": "4",
		"CAPC_HEALTH_NAMESPACES":            "capi-a,capi-b",
		"CAPC_HEALTH_NO_ORPHAN_REPORT":      "true",
		"CAPC_HEALTH_MODE":                  "observe",
		"CAPC_HEALTH_PROBE_ARPING_PARAMS":   "-c 2",
	} {
		if env[k] != want {
			t.Errorf("%s = %q, want %q (env %v)", k, env[k], want, env)
		}
	}
	if _, ok := env["CAPC_HEALTH_NO_REMNANT_REPORT"]; ok {
		t.Errorf("a switch set to false renders its variable")
	}
	// The schema refuses unknown keys, a choice out of its values and a list as a scalar.
	for _, bad := range []string{"config.pollIntervall=7s", "config.mode=delete", "config.namespaces=capi-a", "config.leaseName=other"} {
		if _, err := helmTemplate(chartDir(t), "shim", "ops", nil, []string{bad}); err == nil {
			t.Errorf("--set %s accepted", bad)
		}
	}
}
