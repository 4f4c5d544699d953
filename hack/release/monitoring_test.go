package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

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
