package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// The chart's monitoring values render deploy/components/monitoring's PrometheusRule (the same
// spec: the alerts' {{ $labels }} templates untouched) and dashboard (byte for byte), with the
// chart's and the user's labels; neither by default, and misspelt values are refused.
func TestTheChartRendersTheMonitoringComponent(t *testing.T) {
	root := repoRoot(t)
	var rule obj
	ruleText, err := os.ReadFile(filepath.Join(root, monitoringDir, "prometheusrule.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(ruleText, &rule); err != nil {
		t.Fatal(err)
	}
	dashboard, err := os.ReadFile(filepath.Join(root, monitoringDir, "dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}

	const ns = "ops-shim"
	text, err := helmTemplate(chartDir(t), "capc-health-shim", ns, nil, []string{
		"monitoring.prometheusRule.enabled=true",
		"serviceMonitor.enabled=true", // the rule needs a scrape (chart_test.go)
		"monitoring.prometheusRule.labels.release=prometheus",
		"monitoring.dashboard.enabled=true",
		"monitoring.dashboard.namespace=monitoring",
	})
	if err != nil {
		t.Fatal(err)
	}
	got := byKey(t, parseDocs(t, text))
	pr, ok := got["PrometheusRule/capc-health-shim"]
	if !ok {
		t.Fatalf("no PrometheusRule rendered: %v", reflect.ValueOf(got).MapKeys())
	}
	if !reflect.DeepEqual(pr["spec"], rule["spec"]) {
		t.Errorf("the rendered PrometheusRule's spec differs from %s/prometheusrule.yaml", monitoringDir)
	}
	if get(pr, "metadata", "namespace") != ns {
		t.Errorf("PrometheusRule namespace %v, want %s", get(pr, "metadata", "namespace"), ns)
	}
	for k, v := range labels(rule) {
		if labels(pr)[k] != v {
			t.Errorf("PrometheusRule label %s=%v, want %v", k, labels(pr)[k], v)
		}
	}
	if labels(pr)["release"] != "prometheus" || labels(pr)["app.kubernetes.io/managed-by"] != "Helm" {
		t.Errorf("PrometheusRule labels %v", labels(pr))
	}
	if !strings.Contains(text, "{{ $labels.cluster }}") {
		t.Error("the alerts' templates were rendered by Helm")
	}

	cm, ok := got["ConfigMap/"+dashboardConfigMap]
	if !ok {
		t.Fatal("no dashboard ConfigMap rendered")
	}
	if get(cm, "metadata", "namespace") != "monitoring" || labels(cm)["grafana_dashboard"] != "1" {
		t.Errorf("dashboard ConfigMap metadata %v", cm["metadata"])
	}
	if data, _ := get(cm, "data", "capc-health-shim.json").(string); data != strings.TrimSuffix(string(dashboard), "\n") {
		t.Errorf("the ConfigMap's dashboard is not %s/dashboard.json", monitoringDir)
	}

	plain, err := helmTemplate(chartDir(t), "capc-health-shim", ns, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(plain, "PrometheusRule") || strings.Contains(plain, dashboardConfigMap) {
		t.Error("monitoring objects rendered with the default values")
	}
	if _, err := helmTemplate(chartDir(t), "capc-health-shim", ns, nil, []string{"monitoring.prometheusRules.enabled=true"}); err == nil {
		t.Error("a misspelt monitoring value was accepted")
	}
}

// The component itself, as `kubectl apply -k` builds an overlay with it (kustomize's library):
// the PrometheusRule, and the dashboard ConfigMap with the sidecar's label, no name hash, and
// dashboard.json byte for byte.
func TestTheMonitoringComponentBuildsWithTheBase(t *testing.T) {
	root := repoRoot(t)
	overlay := t.TempDir()
	// kustomize wants relative paths to other kustomizations.
	rel := func(p string) string {
		r, err := filepath.Rel(overlay, filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	kust := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - " +
		rel("deploy/base") + "\ncomponents:\n  - " + rel(monitoringDir) + "\n"
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(kust), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), overlay)
	if err != nil {
		t.Fatalf("kustomize build of base + %s: %v", monitoringDir, err)
	}
	text, err := m.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	got := byKey(t, parseDocs(t, string(text)))
	if _, ok := got["PrometheusRule/capc-health-shim"]; !ok {
		t.Error("no PrometheusRule")
	}
	cm, ok := got["ConfigMap/"+dashboardConfigMap]
	if !ok {
		t.Fatalf("no ConfigMap %s (a name hash?)", dashboardConfigMap)
	}
	dashboard, _ := os.ReadFile(filepath.Join(root, monitoringDir, "dashboard.json"))
	if get(cm, "data", "capc-health-shim.json") != string(dashboard) {
		t.Error("the ConfigMap's dashboard is not dashboard.json")
	}
	if labels(cm)["grafana_dashboard"] != "1" || get(cm, "metadata", "namespace") != "capc-health-shim-system" {
		t.Errorf("ConfigMap metadata %v", cm["metadata"])
	}
	if len(got) != len(baseObjects(t, mustBase(t)))+2 {
		t.Errorf("%d objects, want the base's and two", len(got))
	}
}
