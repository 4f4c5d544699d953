package main

// The chart's `config` values: one per flag of `capc-health-shim run`, read from
// hack/release/run-flags.json (written from the clap definitions by tests/docs_gen; `make docs`
// and tests/docs_sync.rs keep it current), each rendered as the flag's CAPC_HEALTH_* variable
// only when set, so an unset value leaves the shim's own default.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// runFlag is one entry of run-flags.json.
type runFlag struct {
	Flag           string   `json:"flag"`
	Env            string   `json:"env"`
	TakesValue     bool     `json:"takesValue"`
	Repeatable     bool     `json:"repeatable"`
	Delimiter      *string  `json:"delimiter"`
	Default        *string  `json:"default"`
	PossibleValues []string `json:"possibleValues"`
	Help           string   `json:"help"`
}

// chartSetsFlag are the flags the chart sets otherwise, so no config value: why.
var chartSetsFlag = map[string]string{
	"lease-name":              "the chart names the Lease after the release (fullnameOverride), and its Role names it",
	"orphan-memory-configmap": "the chart names the memory ConfigMap after the release, and its Role names it",
	"lease-namespace":         "the pod's own namespace (the Role that grants the Lease is there)",
	"endpoint-credentials":    "the value endpointCredentials",
	"status-addr":             "the container's port 8443, which the probes, the Service and the NetworkPolicy name",
	"insecure-serving":        "the probes are HTTPS, and /status and /metrics must not be open to anyone in a cluster",
}

const runFlagsFile = "hack/release/run-flags.json"

// loadRunFlags reads run-flags.json under root.
func loadRunFlags(root string) ([]runFlag, error) {
	b, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(runFlagsFile)))
	if err != nil {
		return nil, fmt.Errorf("the run flags (make docs writes them): %w", err)
	}
	var doc struct {
		Flags []runFlag `json:"flags"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", runFlagsFile, err)
	}
	if len(doc.Flags) == 0 {
		return nil, fmt.Errorf("%s lists no flags", runFlagsFile)
	}
	for _, f := range doc.Flags {
		if !strings.HasPrefix(f.Env, envPrefix) {
			return nil, fmt.Errorf("--%s: variable %q does not start with %s", f.Flag, f.Env, envPrefix)
		}
	}
	return doc.Flags, nil
}

const envPrefix = "CAPC_HEALTH_"

// configKey is the value's name: the variable's suffix in lowerCamelCase (CAPC_HEALTH_POLL_INTERVAL
// → pollInterval, CAPC_HEALTH_NAMESPACES → namespaces).
func configKey(f runFlag) string {
	parts := strings.Split(strings.ToLower(strings.TrimPrefix(f.Env, envPrefix)), "_")
	for i := 1; i < len(parts); i++ {
		if parts[i] != "" {
			parts[i] = strings.ToUpper(parts[i][:1]) + parts[i][1:]
		}
	}
	return strings.Join(parts, "")
}

// configFlags are the flags with a config value, in definition order.
func configFlags(flags []runFlag) []runFlag {
	var out []runFlag
	for _, f := range flags {
		if _, ok := chartSetsFlag[f.Flag]; !ok {
			out = append(out, f)
		}
	}
	return out
}

// configEnvLines are the env entries of the manager container: one per set config value.
func configEnvLines(flags []runFlag) []string {
	var out []string
	for _, f := range configFlags(flags) {
		v := ".Values.config." + configKey(f)
		switch {
		case !f.TakesValue:
			out = append(out, "{{- if "+v+" }}", "- name: "+f.Env, `  value: "true"`, "{{- end }}")
		case f.Repeatable:
			d := ","
			if f.Delimiter != nil {
				d = *f.Delimiter
			}
			out = append(out, "{{- if "+v+" }}", "- name: "+f.Env, fmt.Sprintf("  value: {{ join %q %s | quote }}", d, v), "{{- end }}")
		default:
			out = append(out, `{{- if not (kindIs "invalid" `+v+`) }}`, "- name: "+f.Env, "  value: {{ "+v+" | toString | quote }}", "{{- end }}")
		}
	}
	return out
}

// configValuesYAML is values.yaml's config section.
func configValuesYAML(flags []runFlag) string {
	var sb strings.Builder
	sb.WriteString(`# Every flag of ` + "`capc-health-shim run`" + ` (docs/configuration.md), as its CAPC_HEALTH_* variable,
# rendered only when set: unset (null, false, []) keeps the shim's default (in the comment). The
# flags the chart sets itself have none: `)
	var skipped []string
	for _, f := range []string{"lease-name", "orphan-memory-configmap", "lease-namespace", "endpoint-credentials", "status-addr", "insecure-serving"} {
		skipped = append(skipped, "--"+f)
	}
	sb.WriteString(strings.Join(skipped, ", ") + " (docs/install.md).\nconfig:\n")
	for _, f := range configFlags(flags) {
		def := ""
		if f.Default != nil && *f.Default != "" {
			def = ", default " + *f.Default
		}
		fmt.Fprintf(&sb, "  # --%s%s\n", f.Flag, def)
		switch {
		case !f.TakesValue:
			fmt.Fprintf(&sb, "  %s: false\n", configKey(f))
		case f.Repeatable:
			fmt.Fprintf(&sb, "  %s: []\n", configKey(f))
		default:
			fmt.Fprintf(&sb, "  %s: null\n", configKey(f))
		}
	}
	return sb.String()
}

// configSchema is the schema of the config value.
func configSchema(flags []runFlag) map[string]any {
	props := map[string]any{}
	for _, f := range configFlags(flags) {
		desc := fmt.Sprintf("--%s (%s): %s", f.Flag, f.Env, f.Help)
		var s map[string]any
		switch {
		case !f.TakesValue:
			s = map[string]any{"type": "boolean"}
			desc += " Set when true."
		case f.Repeatable:
			s = map[string]any{"type": "array", "items": map[string]any{"type": "string", "minLength": 1}}
			if f.Default != nil && *f.Default != "" {
				desc += " Empty: " + *f.Default + "."
			}
		default:
			s = map[string]any{"type": []string{"string", "number", "null"}}
			if len(f.PossibleValues) > 0 {
				enum := []any{nil}
				for _, p := range f.PossibleValues {
					enum = append(enum, p)
				}
				s["enum"] = enum
			}
			if f.Default != nil && *f.Default != "" {
				desc += " Unset: " + *f.Default + "."
			}
		}
		props[configKey(f)] = describe(desc, s)
	}
	return map[string]any{"type": "object", "additionalProperties": false, "properties": props}
}
