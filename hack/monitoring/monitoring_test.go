package monitoring

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

const (
	ruleFile      = "../../deploy/components/monitoring/prometheusrule.yaml"
	dashboardFile = "../../deploy/components/monitoring/dashboard.json"
	queriedList   = "testdata/queried-metrics.txt"
	// ruleLabelsList: the labels the alerts select on (TestRuleLabelsListIsCurrent).
	ruleLabelsList = "testdata/rule-labels.txt"
)

// promtool is the one make test-monitoring builds from the Prometheus module (go.mod's version).
func promtool(t *testing.T) string {
	t.Helper()
	p := os.Getenv("PROMTOOL")
	if p == "" {
		p = "../../target/tools/promtool"
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(abs); err != nil {
		t.Fatalf("promtool not built (make test-monitoring builds it): %v", err)
	}
	return abs
}

// rulesDir writes the PrometheusRule's groups as rules.yaml next to the unit tests.
func rulesDir(t *testing.T) string {
	t.Helper()
	rule, err := os.ReadFile(ruleFile)
	if err != nil {
		t.Fatal(err)
	}
	rules, err := RuleFile(rule)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile("testdata/alerts_test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), tests, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func run(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command(promtool(t), args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	t.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
	if err != nil {
		t.Fatalf("promtool %s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}

func TestPromtoolCheckRules(t *testing.T) {
	dir := rulesDir(t)
	out := run(t, dir, "check", "rules", "--lint=all", "--lint-fatal", "rules.yaml")
	rule, _ := os.ReadFile(ruleFile)
	exprs, err := RuleExprs(rule)
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("SUCCESS: %d rules found", len(exprs)); !strings.Contains(out, want) || len(exprs) < 11 {
		t.Errorf("expected every one of the %d alerts: %s", len(exprs), out)
	}
}

// Every alert has a test where it fires and one where it stays silent.
func TestPromtoolTestRules(t *testing.T) {
	dir := rulesDir(t)
	run(t, dir, "test", "rules", "alerts_test.yaml")

	rule, _ := os.ReadFile(ruleFile)
	exprs, err := RuleExprs(rule)
	if err != nil {
		t.Fatal(err)
	}
	tests, _ := os.ReadFile("testdata/alerts_test.yaml")
	fires, silent := map[string]int{}, map[string]int{}
	var name string
	for _, line := range strings.Split(string(tests), "\n") {
		l := strings.TrimSpace(line)
		switch {
		case strings.HasPrefix(l, "alertname:"):
			name = strings.TrimSpace(strings.TrimPrefix(l, "alertname:"))
		case l == "exp_alerts: []":
			silent[name]++
		case l == "exp_alerts:":
			fires[name]++
		}
	}
	for a := range exprs {
		if fires[a] == 0 || silent[a] == 0 {
			t.Errorf("%s: %d test(s) where it fires, %d where it stays silent; want both", a, fires[a], silent[a])
		}
		t.Logf("%s: fires in %d, silent in %d", a, fires[a], silent[a])
	}
}

// testdata/queried-metrics.txt lists what the rules and the dashboard query (UPDATE=1 rewrites
// it); tests/monitoring_metrics.rs finds every name in the shim's /metrics.
func TestQueriedMetricsListIsCurrent(t *testing.T) {
	names, err := QueriedMetrics(ruleFile, dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join(names, "\n") + "\n"
	if os.Getenv("UPDATE") == "1" {
		if err := os.WriteFile(queriedList, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, _ := os.ReadFile(queriedList)
	if string(got) != want {
		t.Fatalf("%s is stale (UPDATE=1 go test ./... rewrites it); the queries name:\n%s", queriedList, want)
	}
}

func TestMetricNamesParsesPromQLAndGrafanaVariables(t *testing.T) {
	q := `histogram_quantile(0.9, sum by (le) (rate(a_bucket{scope=~"$scope"}[$__rate_interval]))) / on() b or absent(c)`
	names, err := MetricNames(SubstituteGrafana(q))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(names, ",") != "a_bucket,b,c" {
		t.Errorf("names %v", names)
	}
	if _, err := MetricNames(`{__name__=~"capc.*"}`); err == nil {
		t.Error("a selector without a metric name must be refused")
	}
	if _, err := MetricNames(`sum(rate(x[5m])`); err == nil {
		t.Error("a query that does not parse must be refused")
	}
}

// testdata/rule-labels.txt lists the labels every alert selects on, per metric (UPDATE=1
// rewrites it); tests/alerts_kube.rs finds each on the running shim's /metrics series, and
// tests/monitoring_metrics.rs on those of every recorder.
func TestRuleLabelsListIsCurrent(t *testing.T) {
	lines, err := RuleLabelLines(ruleFile)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join(lines, "\n") + "\n"
	if os.Getenv("UPDATE") == "1" {
		if err := os.WriteFile(ruleLabelsList, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, _ := os.ReadFile(ruleLabelsList)
	if string(got) != want {
		t.Fatalf("%s is stale (UPDATE=1 go test ./... rewrites it); the rules select on:\n%s", ruleLabelsList, want)
	}
}

func TestRuleLabelsReadGroupingMatchingAndMatchers(t *testing.T) {
	uses, err := RuleLabels(`(max by (scope) (a) == 0) unless on (scope) (sum by (scope, x) (increase(b_total{kind="unauthorized"}[30m])) > 0)`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, u := range uses {
		got = append(got, u.String())
	}
	want := `a by scope,a on scope,b_total by scope,b_total by x,b_total kind="unauthorized",b_total on scope`
	if strings.Join(got, ",") != want {
		t.Errorf("got  %s\nwant %s", strings.Join(got, ","), want)
	}
	if _, err := RuleLabels(`sum without (pod) (a)`); err == nil {
		t.Error("`without` must be refused")
	}
	if _, err := RuleLabels(`a and ignoring (pod) b`); err == nil {
		t.Error("`ignoring` must be refused")
	}
}
