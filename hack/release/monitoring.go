package main

// The chart's monitoring values: deploy/components/monitoring's PrometheusRule and Grafana
// dashboard, rendered from the component's own files (copied into the chart under monitoring/
// and read with .Files.Get, so the rules' {{ $labels.… }} templates reach Prometheus untouched).

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

const (
	monitoringDir      = "deploy/components/monitoring"
	chartRuleSpecFile  = "monitoring/prometheusrule-spec.yaml"
	chartDashboardFile = "monitoring/capc-health-shim.json"
	dashboardConfigMap = "capc-health-shim-dashboard"
)

// addMonitoring puts the component's rule spec and dashboard into the chart, with a template
// that renders them when monitoring.prometheusRule.enabled / monitoring.dashboard.enabled.
func addMonitoring(root string, files map[string]string) error {
	ruleText, err := os.ReadFile(filepath.Join(root, monitoringDir, "prometheusrule.yaml"))
	if err != nil {
		return err
	}
	var rule struct {
		Kind     string `json:"kind"`
		Metadata struct {
			Name   string            `json:"name"`
			Labels map[string]string `json:"labels"`
		} `json:"metadata"`
		Spec any `json:"spec"`
	}
	if err := yaml.Unmarshal(ruleText, &rule); err != nil {
		return fmt.Errorf("%s/prometheusrule.yaml: %v", monitoringDir, err)
	}
	if rule.Kind != "PrometheusRule" || rule.Spec == nil {
		return fmt.Errorf("%s/prometheusrule.yaml: not a PrometheusRule with a spec", monitoringDir)
	}
	spec, err := yaml.Marshal(rule.Spec)
	if err != nil {
		return err
	}
	dashboard, err := os.ReadFile(filepath.Join(root, monitoringDir, "dashboard.json"))
	if err != nil {
		return err
	}
	files[chartRuleSpecFile] = string(spec)
	files[chartDashboardFile] = string(dashboard)

	var ruleLabels []string
	for k, v := range rule.Metadata.Labels {
		ruleLabels = append(ruleLabels, fmt.Sprintf("    %s: %q", k, v))
	}
	sort.Strings(ruleLabels)
	ruleName, err := nameRef(rule.Metadata.Name)
	if err != nil {
		return err
	}
	dashboardName, err := nameRef(dashboardConfigMap)
	if err != nil {
		return err
	}
	files["templates/monitoring.yaml"] = `{{/* ` + generatedBy + ` from ` + monitoringDir + ` */}}
{{- if .Values.monitoring.prometheusRule.enabled }}
{{- if not (or .Values.serviceMonitor.enabled .Values.monitoring.prometheusRule.scrapedElsewhere) }}
{{- fail "monitoring.prometheusRule.enabled without serviceMonitor.enabled: nothing would scrape the shim and CAPCHealthNoLeader would fire. Set serviceMonitor.enabled=true, or monitoring.prometheusRule.scrapedElsewhere=true if your Prometheus scrapes the shim's /metrics by other means." }}
{{- end }}
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: ` + ruleName + `
  namespace: {{ .Release.Namespace }}
  labels:
` + strings.Join(ruleLabels, "\n") + `
    {{- include "capc-health-shim.labels" . | nindent 4 }}
    {{- with .Values.monitoring.prometheusRule.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
{{ .Files.Get "` + chartRuleSpecFile + `" | indent 2 }}
{{- end }}
{{- if .Values.monitoring.dashboard.enabled }}
---
apiVersion: v1
kind: ConfigMap
metadata:
  name: ` + dashboardName + `
  namespace: {{ .Values.monitoring.dashboard.namespace | default .Release.Namespace }}
  labels:
    grafana_dashboard: "1"
    app.kubernetes.io/name: capc-health-shim
    {{- include "capc-health-shim.labels" . | nindent 4 }}
    {{- with .Values.monitoring.dashboard.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
data:
  capc-health-shim.json: |-
{{ .Files.Get "` + chartDashboardFile + `" | trimSuffix "\n" | indent 4 }}
{{- end }}
`
	return nil
}

// monitoringValues is the monitoring section of values.yaml.
const monitoringValues = `
# What operators look at (deploy/components/monitoring, docs/alerts.md): the alerts as a
# PrometheusRule (needs the Prometheus Operator's CRD) and a Grafana dashboard in a ConfigMap
# labelled grafana_dashboard: "1" for Grafana's dashboard sidecar.
monitoring:
  prometheusRule:
    # Needs serviceMonitor.enabled (or scrapedElsewhere): CAPCHealthNoLeader fires without a scrape.
    enabled: false
    # Your Prometheus scrapes the shim without the chart's ServiceMonitor (e.g. a PodMonitor).
    scrapedElsewhere: false
    # More labels, e.g. the one your Prometheus' ruleSelector wants ({release: prometheus}).
    labels: {}
  dashboard:
    enabled: false
    # The ConfigMap's namespace (default: the release's), e.g. the one Grafana's sidecar watches.
    namespace: ""
    labels: {}
`

func monitoringSchema() map[string]any {
	labels := map[string]any{"type": "object", "additionalProperties": map[string]any{"type": "string"}}
	boolean := map[string]any{"type": "boolean"}
	return map[string]any{"type": "object", "additionalProperties": false, "properties": map[string]any{
		"prometheusRule": map[string]any{"type": "object", "additionalProperties": false, "properties": map[string]any{
			"enabled":          describe("the alerts of docs/alerts.md as a PrometheusRule (Prometheus Operator CRD); needs serviceMonitor.enabled or scrapedElsewhere (CAPCHealthNoLeader fires without a scrape)", boolean),
			"scrapedElsewhere": describe("the shim's /metrics is scraped without the chart's ServiceMonitor: allows prometheusRule without serviceMonitor", boolean),
			"labels":           describe("more labels of the PrometheusRule, e.g. for your Prometheus' ruleSelector", labels)}},
		"dashboard": map[string]any{"type": "object", "additionalProperties": false, "properties": map[string]any{
			"enabled":   describe(`the Grafana dashboard in a ConfigMap labelled grafana_dashboard: "1" (Grafana's sidecar)`, boolean),
			"namespace": describe("the dashboard ConfigMap's namespace (empty: the release's)", map[string]any{"type": "string"}),
			"labels":    describe("more labels of the dashboard ConfigMap", labels)}},
	}}
}
