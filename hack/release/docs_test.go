package main

// docs/install.md's install paths, checked against what they describe: the clusterctl.yaml
// snippet works with clusterctl's library, the table of grants is the base's ClusterRoles, the
// Helm values table names every value, and the NetworkPolicy example renders.

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

func installDoc(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "docs", "install.md"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var fenceRE = regexp.MustCompile("(?s)```yaml\n(.*?)```")

// yamlBlock is the first ```yaml block of the doc containing marker.
func yamlBlock(t *testing.T, doc, marker string) string {
	t.Helper()
	for _, m := range fenceRE.FindAllStringSubmatch(doc, -1) {
		if strings.Contains(m[1], marker) {
			return m[1]
		}
	}
	t.Fatalf("docs/install.md: no yaml block with %q", marker)
	return ""
}

// section is the text from the heading line to the next heading of the same or a higher level.
func section(t *testing.T, doc, heading string) string {
	t.Helper()
	at := strings.Index(doc, "\n"+heading+"\n")
	if at < 0 {
		t.Fatalf("docs/install.md: no %q", heading)
	}
	level := strings.Count(strings.Fields(heading)[0], "#")
	rest := doc[at+len(heading)+2:]
	for _, l := range regexp.MustCompile(`(?m)^#+ `).FindAllStringIndex(rest, -1) {
		if l[1]-l[0]-1 <= level {
			return rest[:l[0]]
		}
	}
	return rest
}

func TestTheDocumentedClusterctlConfigurationInstallsTheAddon(t *testing.T) {
	unsetenv(t, imageVar, logVar)
	b := mustBase(t)
	cfg := yamlBlock(t, installDoc(t), "type: AddonProvider")
	var parsed struct {
		Providers []struct{ Name, URL, Type string }
	}
	if err := yaml.Unmarshal([]byte(cfg), &parsed); err != nil || len(parsed.Providers) != 1 {
		t.Fatalf("the documented clusterctl.yaml: %v %+v", err, parsed)
	}
	p := parsed.Providers[0]
	suffix := "/" + providerLabel + "/v" + b.version + "/addon-components.yaml"
	if p.Name != providerName || !strings.HasPrefix(p.URL, "file:///") || !strings.HasSuffix(p.URL, suffix) {
		t.Fatalf("documented provider %+v: want name %s and a file:// URL ending in %s", p, providerName, suffix)
	}
	// The documented directory, relocated to this test's repository.
	dir, _ := writeRepo(t, b)
	local := strings.Replace(cfg, strings.TrimSuffix(p.URL, suffix), "file://"+filepath.ToSlash(dir), 1)
	comps, err := clusterctlGenerateWith(context.Background(), local, "", "")
	if err != nil {
		t.Fatalf("clusterctl with the documented configuration: %v", err)
	}
	if comps.Version() != "v"+b.version || comps.TargetNamespace() != "capc-health-shim-system" {
		t.Errorf("version %s, target namespace %s", comps.Version(), comps.TargetNamespace())
	}
	// The documented variables are the components' variables.
	vars := comps.Variables()
	sort.Strings(vars)
	clusterctlSection := section(t, installDoc(t), "#### With clusterctl (an add-on provider)")
	var documented []string
	for _, m := range regexp.MustCompile("(?m)^\\| `(CAPC_HEALTH_SHIM_[A-Z_]+)` \\|").FindAllStringSubmatch(clusterctlSection, -1) {
		documented = append(documented, m[1])
	}
	sort.Strings(documented)
	if !reflect.DeepEqual(vars, documented) {
		t.Errorf("variables %v, documented %v", vars, documented)
	}
}

type grant struct{ role, group, resources, names, verbs string }

func TestTheDocumentedGrantsAreTheBasesRoles(t *testing.T) {
	b := mustBase(t)
	var want []grant
	for _, o := range baseObjects(t, b) {
		if o["kind"] != "ClusterRole" && o["kind"] != "Role" {
			continue
		}
		for _, r := range o["rules"].([]any) {
			rule := r.(obj)
			g := grant{role: get(o, "metadata", "name").(string)}
			list := func(k string) string {
				var out []string
				for _, v := range asList(rule[k]) {
					out = append(out, v)
				}
				return strings.Join(out, ",")
			}
			if urls := list("nonResourceURLs"); urls != "" {
				g.group, g.resources = "non-resource URLs", urls
			} else {
				g.group, g.resources = list("apiGroups"), list("resources")
				if g.group == "" {
					g.group = "core"
				}
			}
			g.names, g.verbs = list("resourceNames"), list("verbs")
			want = append(want, g)
		}
	}
	table := section(t, installDoc(t), "### What a fresh install grants")
	var have []grant
	clean := func(s string) string {
		s = strings.NewReplacer("`", "", " ", "").Replace(s)
		return s
	}
	for _, line := range strings.Split(table, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) != 7 || !strings.Contains(cells[1], "`capc-health-shim") {
			continue
		}
		group := strings.TrimSpace(strings.ReplaceAll(cells[2], "`", ""))
		role := clean(cells[1])
		// "`capc-health-shim-leader` (Role, in the install's namespace)": the name is the role.
		if i := strings.Index(role, "("); i >= 0 {
			role = role[:i]
		}
		have = append(have, grant{role, group, clean(cells[3]), clean(cells[4]), clean(cells[5])})
	}
	sortGrants := func(g []grant) {
		sort.Slice(g, func(i, j int) bool {
			return strings.Join([]string{g[i].role, g[i].group, g[i].resources, g[i].names}, "|") < strings.Join([]string{g[j].role, g[j].group, g[j].resources, g[j].names}, "|")
		})
	}
	sortGrants(want)
	sortGrants(have)
	if !reflect.DeepEqual(have, want) {
		t.Errorf("docs/install.md's grants differ from deploy/base's ClusterRoles and Roles:\ndocumented %+v\nbase       %+v", have, want)
	}
}

func asList(v any) []string {
	var out []string
	l, _ := v.([]any)
	for _, x := range l {
		out = append(out, x.(string))
	}
	return out
}

func TestTheDocumentedHelmValuesAndNetworkPolicyExample(t *testing.T) {
	doc := installDoc(t)
	helm := section(t, doc, "#### With Helm")
	var values obj
	text, err := os.ReadFile(filepath.Join(chartDir(t), "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(text, &values); err != nil {
		t.Fatal(err)
	}
	for k, v := range values {
		names := []string{k}
		// resources (a ResourceRequirements), the pods' maps and config (a key per flag of run,
		// the chart's README lists them) are one value each.
		if m, ok := v.(obj); ok && !map[string]bool{"config": true, "resources": true, "nodeSelector": true, "affinity": true, "podAnnotations": true, "podLabels": true}[k] {
			names = nil
			for sub := range m {
				names = append(names, k+"."+sub)
			}
		}
		for _, n := range names {
			if !strings.Contains(helm, "`"+n+"`") {
				t.Errorf("the Helm values table does not name `%s`", n)
			}
		}
	}

	example := yamlBlock(t, doc, "networkPolicy:")
	f := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(f, []byte(example), 0o644); err != nil {
		t.Fatal(err)
	}
	rendered, err := helmTemplate(chartDir(t), "capc-health-shim", "capc-health-shim-system", []string{f}, nil)
	if err != nil {
		t.Fatalf("the documented NetworkPolicy values: %v", err)
	}
	var want obj
	if err := yaml.Unmarshal([]byte(example), &want); err != nil {
		t.Fatal(err)
	}
	np := byKey(t, parseDocs(t, rendered))["NetworkPolicy/capc-health-shim"]
	if !reflect.DeepEqual(get(np, "spec", "egress"), get(want, "networkPolicy", "egress")) {
		t.Errorf("rendered egress %v, documented %v", get(np, "spec", "egress"), get(want, "networkPolicy", "egress"))
	}
}
