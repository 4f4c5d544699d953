// Package monitoring checks deploy/components/monitoring: the PrometheusRule's groups as the
// plain rule file promtool reads, and the metric names every alert and dashboard query names
// (parsed with Prometheus' own PromQL parser), listed in testdata/queried-metrics.txt for
// tests/monitoring_metrics.rs, which finds each in the shim's /metrics.
package monitoring

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"

	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

// RuleFile returns the PrometheusRule's spec.groups as a Prometheus rule file.
func RuleFile(prometheusRule []byte) ([]byte, error) {
	var obj struct {
		Kind string `json:"kind"`
		Spec struct {
			Groups []json.RawMessage `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.UnmarshalStrict(prometheusRule, &obj); err != nil {
		// Strict on the fields we read only: the rest of the object is the API server's business.
		if err := yaml.Unmarshal(prometheusRule, &obj); err != nil {
			return nil, err
		}
	}
	if obj.Kind != "PrometheusRule" || len(obj.Spec.Groups) == 0 {
		return nil, fmt.Errorf("not a PrometheusRule with groups (kind %q)", obj.Kind)
	}
	return yaml.Marshal(map[string]any{"groups": obj.Spec.Groups})
}

// RuleExprs returns every rule's expression, keyed by the alert (or record) name.
func RuleExprs(prometheusRule []byte) (map[string]string, error) {
	var obj struct {
		Spec struct {
			Groups []struct {
				Rules []struct {
					Alert  string `json:"alert"`
					Record string `json:"record"`
					Expr   string `json:"expr"`
				} `json:"rules"`
			} `json:"groups"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(prometheusRule, &obj); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, g := range obj.Spec.Groups {
		for _, r := range g.Rules {
			out[r.Alert+r.Record] = r.Expr
		}
	}
	return out, nil
}

// DashboardQueries returns every PromQL query of a Grafana dashboard: each panel target's
// expr (rows' nested panels too) and each query variable's label_values(metric, label) metric.
func DashboardQueries(dashboard []byte) (map[string]string, error) {
	var d struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(dashboard, &d); err != nil {
		return nil, err
	}
	out := map[string]string{}
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, t := range p.Targets {
				out[fmt.Sprintf("panel %q target %s", p.Title, t.RefID)] = t.Expr
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			// A query variable's query may also be a plain string.
			if err := json.Unmarshal(v.Query, &q.Query); err != nil {
				return nil, fmt.Errorf("variable %s: %v", v.Name, err)
			}
		}
		m := labelValues.FindStringSubmatch(q.Query)
		if m == nil {
			return nil, fmt.Errorf("variable %s: not label_values(<selector>, <label>): %q", v.Name, q.Query)
		}
		out["variable "+v.Name] = m[1]
	}
	return out, nil
}

type panel struct {
	Title   string `json:"title"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

var (
	labelValues = regexp.MustCompile(`^\s*label_values\(\s*(.+?)\s*,\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)\s*$`)
	// Grafana's variables: $name, ${name}, ${name:format}, [[name]].
	grafanaVar = regexp.MustCompile(`\$\{[^}]+\}|\$[a-zA-Z_][a-zA-Z0-9_]*|\[\[[^\]]+\]\]`)
)

// SubstituteGrafana replaces Grafana's variables by values PromQL parses: durations for the
// interval variables, a regex-safe string for the others (which only appear in label matchers).
func SubstituteGrafana(q string) string {
	return grafanaVar.ReplaceAllStringFunc(q, func(v string) string {
		name := strings.Trim(v, "${}[]")
		if i := strings.IndexByte(name, ':'); i >= 0 {
			name = name[:i]
		}
		switch name {
		case "__rate_interval", "__interval", "__range":
			return "5m"
		case "__interval_ms", "__range_ms":
			return "300000"
		case "__range_s":
			return "300"
		default:
			return "x"
		}
	})
}

// MetricNames returns the metric names a PromQL expression selects, as Prometheus stores them
// (a counter's `_total`, a histogram's `_bucket`). An expression naming no metric (or one by
// a __name__ matcher other than equality) is an error: every query must be checkable.
func MetricNames(expr string) ([]string, error) {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	names := map[string]bool{}
	var bad error
	parser.Inspect(e, func(node parser.Node, _ []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		if vs.Name != "" {
			names[vs.Name] = true
			return nil
		}
		bad = fmt.Errorf("selector %s names no metric", vs)
		return nil
	})
	if bad != nil {
		return nil, bad
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%q selects no metric", expr)
	}
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}

// QueriedMetrics returns the sorted metric names every rule and dashboard query names.
func QueriedMetrics(rulePath, dashboardPath string) ([]string, error) {
	rule, err := os.ReadFile(rulePath)
	if err != nil {
		return nil, err
	}
	dash, err := os.ReadFile(dashboardPath)
	if err != nil {
		return nil, err
	}
	rules, err := RuleExprs(rule)
	if err != nil {
		return nil, err
	}
	queries, err := DashboardQueries(dash)
	if err != nil {
		return nil, err
	}
	all := map[string]bool{}
	add := func(where, q string) error {
		names, err := MetricNames(q)
		if err != nil {
			return fmt.Errorf("%s: %v", where, err)
		}
		for _, n := range names {
			all[n] = true
		}
		return nil
	}
	for name, q := range rules {
		if err := add("alert "+name, q); err != nil {
			return nil, err
		}
	}
	for where, q := range queries {
		if err := add("dashboard "+where, SubstituteGrafana(q)); err != nil {
			return nil, err
		}
	}
	out := make([]string, 0, len(all))
	for n := range all {
		out = append(out, n)
	}
	sort.Strings(out)
	return out, nil
}

// LabelUse is one label a rule's expression selects on, for one metric it reads: a name it
// groups or matches by (`by (cluster)`, `on (scope)`: Value is empty, Op is "by" or "on"), or a
// matcher of the selector (`kind="unauthorized"`: Op is the matcher's, `=`, `!=`, `=~`, `!~`).
type LabelUse struct {
	Metric string
	Label  string
	Op     string
	Value  string
}

// String is the line testdata/rule-labels.txt holds: `metric by label`, `metric on label` or
// `metric label="value"` (the value quoted as Go quotes it).
func (u LabelUse) String() string {
	if u.Op == "by" || u.Op == "on" {
		return fmt.Sprintf("%s %s %s", u.Metric, u.Op, u.Label)
	}
	return fmt.Sprintf("%s %s%s%q", u.Metric, u.Label, u.Op, u.Value)
}

// selectorNames returns the metric names of every vector selector under n.
func selectorNames(n parser.Node) []string {
	var out []string
	parser.Inspect(n, func(node parser.Node, _ []parser.Node) error {
		if vs, ok := node.(*parser.VectorSelector); ok && vs.Name != "" {
			out = append(out, vs.Name)
		}
		return nil
	})
	return out
}

// RuleLabels returns the labels an expression selects on, per metric: the grouping labels of
// each aggregation (`by`; `without` is refused: what it keeps cannot be checked), the matching
// labels of each binary operation (`on`; `ignoring` likewise refused) for the metrics of both
// sides, and every label matcher of every selector (but `__name__`).
func RuleLabels(expr string) ([]LabelUse, error) {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	seen := map[LabelUse]bool{}
	var bad error
	parser.Inspect(e, func(node parser.Node, _ []parser.Node) error {
		switch n := node.(type) {
		case *parser.AggregateExpr:
			if n.Without && len(n.Grouping) > 0 {
				bad = fmt.Errorf("%s: `without` cannot be checked against a scrape", n)
			}
			if n.Without {
				return nil
			}
			for _, m := range selectorNames(n.Expr) {
				for _, l := range n.Grouping {
					seen[LabelUse{Metric: m, Label: l, Op: "by"}] = true
				}
			}
		case *parser.BinaryExpr:
			vm := n.VectorMatching
			if vm == nil || len(vm.MatchingLabels) == 0 {
				return nil
			}
			if !vm.On {
				bad = fmt.Errorf("%s: `ignoring` cannot be checked against a scrape", n)
				return nil
			}
			for _, side := range []parser.Node{n.LHS, n.RHS} {
				for _, m := range selectorNames(side) {
					for _, l := range vm.MatchingLabels {
						seen[LabelUse{Metric: m, Label: l, Op: "on"}] = true
					}
				}
			}
		case *parser.VectorSelector:
			for _, lm := range n.LabelMatchers {
				if lm.Name == "__name__" {
					continue
				}
				seen[LabelUse{Metric: n.Name, Label: lm.Name, Op: lm.Type.String(), Value: lm.Value}] = true
			}
		}
		return nil
	})
	if bad != nil {
		return nil, bad
	}
	out := make([]LabelUse, 0, len(seen))
	for u := range seen {
		out = append(out, u)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].String() < out[j].String() })
	return out, nil
}

// RuleLabelLines returns testdata/rule-labels.txt's lines for every alert of the rule file:
// `<alert> <LabelUse>`, sorted.
func RuleLabelLines(rulePath string) ([]string, error) {
	rule, err := os.ReadFile(rulePath)
	if err != nil {
		return nil, err
	}
	rules, err := RuleExprs(rule)
	if err != nil {
		return nil, err
	}
	var out []string
	for name, q := range rules {
		uses, err := RuleLabels(q)
		if err != nil {
			return nil, fmt.Errorf("alert %s: %v", name, err)
		}
		for _, u := range uses {
			out = append(out, name+" "+u.String())
		}
	}
	sort.Strings(out)
	return out, nil
}
