package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// crdSource is one kustomize CRD directory inside an upstream Go module.
type crdSource struct {
	name       string
	module     string
	version    string
	crdDir     string // holds kustomization.yaml + bases/
	defaultDir string // config/default: where the cluster.x-k8s.io/provider label comes from
	// contract is what <crdDir>/kustomization.yaml's commonLabels/labels must say: the CAPI
	// contract labels CAPI resolves external references with (util/conversion). Written out
	// here so that a version bump that changes them fails loudly instead of silently.
	contract map[string]string
	// onlyStorageServed marks every version of its CRDs but the storage version
	// `served: false` (see unserveNonStorage).
	onlyStorageServed bool
}

const (
	capi19Version = "v1.9.6"
	capi13Version = "v1.13.5"
	capi14Version = "v1.14.2"
	capcVersion   = "v0.6.1"
	capiModule    = "sigs.k8s.io/cluster-api"
	capcModule    = "sigs.k8s.io/cluster-api-provider-cloudstack"
)

var capc = crdSource{"CAPC " + capcVersion, capcModule, capcVersion, "config/crd", "config/default",
	map[string]string{"cluster.x-k8s.io/v1beta1": "v1beta1_v1beta2_v1beta3"}, false}

// capi113 is CAPI v1.13's core, KCP and CABPK: v1beta2 is the storage version; MHC has
// unhealthyMachineConditions.
var capi113 = []crdSource{
	{"CAPI " + capi13Version + " core", capiModule, capi13Version, "config/crd", "config/default", nil, false},
	{"CAPI " + capi13Version + " KCP", capiModule, capi13Version, "controlplane/kubeadm/config/crd", "controlplane/kubeadm/config/default",
		map[string]string{"cluster.x-k8s.io/v1beta1": "v1beta1", "cluster.x-k8s.io/v1beta2": "v1beta2"}, false},
	{"CAPI " + capi13Version + " CABPK", capiModule, capi13Version, "bootstrap/kubeadm/config/crd", "bootstrap/kubeadm/config/default",
		map[string]string{"cluster.x-k8s.io/v1beta1": "v1beta1", "cluster.x-k8s.io/v1beta2": "v1beta2"}, false},
}

// capi114 is CAPI v1.14's core, KCP and CABPK: the core provider's kustomize config moved from
// config/ to core/config/; the contract labels, the served and storage versions (v1beta1
// served but deprecated, v1beta2 storage) and the MHC schema are v1.13's.
var capi114 = []crdSource{
	{"CAPI " + capi14Version + " core", capiModule, capi14Version, "core/config/crd", "core/config/default", nil, false},
	{"CAPI " + capi14Version + " KCP", capiModule, capi14Version, "controlplane/kubeadm/config/crd", "controlplane/kubeadm/config/default",
		map[string]string{"cluster.x-k8s.io/v1beta1": "v1beta1", "cluster.x-k8s.io/v1beta2": "v1beta2"}, false},
	{"CAPI " + capi14Version + " CABPK", capiModule, capi14Version, "bootstrap/kubeadm/config/crd", "bootstrap/kubeadm/config/default",
		map[string]string{"cluster.x-k8s.io/v1beta1": "v1beta1", "cluster.x-k8s.io/v1beta2": "v1beta2"}, false},
}

// v1beta2OnlyProfile is CAPI v1.13 as it will ship once CAPI stops serving v1beta1 (planned
// for around v1.16): the same CRDs, but only their storage version (v1beta2) is served, so
// a client that asks for cluster.x-k8s.io/v1beta1 (or bootstrap/controlplane v1beta1, ipam
// v1alpha1, …) gets a 404. It shows the shim needs no v1beta1 in condition mode. CAPC's CRDs
// are unchanged (CAPC v0.6.1 still serves v1beta1–v1beta3; the shim reads v1beta3). The
// runner also writes an audit log in this profile (audit.go), so tests can count requests.
const v1beta2OnlyProfile = "capi-1.13-v1beta2-only"

var profiles = map[string][]crdSource{
	// CAPI v1.9.6 is what CAPC v0.6.1 is built against (its go.mod).
	"capi-1.9": {
		{"CAPI " + capi19Version + " core", capiModule, capi19Version, "config/crd", "config/default", nil, false},
		{"CAPI " + capi19Version + " KCP", capiModule, capi19Version, "controlplane/kubeadm/config/crd", "controlplane/kubeadm/config/default",
			map[string]string{"cluster.x-k8s.io/v1beta1": "v1beta1"}, false},
		{"CAPI " + capi19Version + " CABPK", capiModule, capi19Version, "bootstrap/kubeadm/config/crd", "bootstrap/kubeadm/config/default",
			map[string]string{"cluster.x-k8s.io/v1beta1": "v1beta1"}, false},
		capc,
	},
	"capi-1.13":        append(append([]crdSource{}, capi113...), capc),
	v1beta2OnlyProfile: append(onlyStorageServed(capi113), capc),
	"capi-1.14":        append(append([]crdSource{}, capi114...), capc),
}

// onlyStorageServed returns copies of srcs whose CRDs serve only their storage version.
func onlyStorageServed(srcs []crdSource) []crdSource {
	out := append([]crdSource{}, srcs...)
	for i := range out {
		out[i].name += " (storage version only)"
		out[i].onlyStorageServed = true
	}
	return out
}

func profileNames() []string {
	var names []string
	for n := range profiles {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

type kustomization struct {
	Resources    []string          `json:"resources"`
	CommonLabels map[string]string `json:"commonLabels"`
	Labels       []struct {
		Pairs map[string]string `json:"pairs"`
	} `json:"labels"`
}

func (k kustomization) allLabels() map[string]string {
	out := map[string]string{}
	for key, v := range k.CommonLabels {
		out[key] = v
	}
	for _, l := range k.Labels {
		for key, v := range l.Pairs {
			out[key] = v
		}
	}
	return out
}

type loadedSet struct {
	src    crdSource
	labels map[string]string
	crds   []map[string]any
}

// loadCRDSets reads the CRDs of each source from the Go module cache (downloading the module
// through the Go module proxy on first use) and adds the labels kustomize would add.
func loadCRDSets(ctx context.Context, toolsDir string, srcs []crdSource) ([]loadedSet, error) {
	var out []loadedSet
	dirs := map[string]string{}
	for _, src := range srcs {
		mv := src.module + "@" + src.version
		modDir, ok := dirs[mv]
		if !ok {
			var err error
			if modDir, err = moduleDir(ctx, toolsDir, mv); err != nil {
				return nil, err
			}
			dirs[mv] = modDir
		}
		k, err := readKustomization(filepath.Join(modDir, src.crdDir, "kustomization.yaml"))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", src.name, err)
		}
		labels := k.allLabels()
		if !sameMap(labels, src.contract) {
			return nil, fmt.Errorf("%s: %s/kustomization.yaml labels are %v, expected contract labels %v; update hack/apiserver/run/crds.go",
				src.name, src.crdDir, labels, src.contract)
		}
		if d, err := readKustomization(filepath.Join(modDir, src.defaultDir, "kustomization.yaml")); err == nil {
			if v, ok := d.allLabels()["cluster.x-k8s.io/provider"]; ok {
				labels["cluster.x-k8s.io/provider"] = v
			}
		}
		set := loadedSet{src: src, labels: labels}
		for _, res := range k.Resources {
			if !strings.HasSuffix(res, ".yaml") {
				continue
			}
			path := filepath.Join(modDir, src.crdDir, res)
			docs, err := readCRDs(path)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", src.name, err)
			}
			for _, crd := range docs {
				applyLabels(crd, labels)
				checkConversion(crd)
				if src.onlyStorageServed {
					if err := unserveNonStorage(crd); err != nil {
						return nil, fmt.Errorf("%s: %s: %w", src.name, path, err)
					}
				}
				set.crds = append(set.crds, crd)
			}
		}
		if len(set.crds) == 0 {
			return nil, fmt.Errorf("%s: no CRDs found under %s", src.name, filepath.Join(modDir, src.crdDir))
		}
		logf("%s: %d CRDs from %s, labels %v", src.name, len(set.crds), filepath.Join(modDir, src.crdDir), labels)
		out = append(out, set)
	}
	return out, nil
}

func moduleDir(ctx context.Context, toolsDir, mv string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", mv)
	cmd.Dir = toolsDir
	cmd.Env = append(os.Environ(), modFlags(), "GOWORK=off")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var info struct{ Dir, Error string }
	_ = json.Unmarshal(out, &info)
	if err != nil || info.Dir == "" {
		return "", fmt.Errorf("go mod download %s: %v %s %s", mv, err, info.Error, strings.TrimSpace(stderr.String()))
	}
	return info.Dir, nil
}

func readKustomization(path string) (kustomization, error) {
	var k kustomization
	b, err := os.ReadFile(path)
	if err != nil {
		return k, err
	}
	if err := yaml.Unmarshal(b, &k); err != nil {
		return k, fmt.Errorf("parse %s: %w", path, err)
	}
	return k, nil
}

var docSep = regexp.MustCompile(`(?m)^---\s*$`)

func readCRDs(path string) ([]map[string]any, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []map[string]any
	for _, doc := range docSep.Split(string(b), -1) {
		if strings.TrimSpace(doc) == "" {
			continue
		}
		j, err := yaml.YAMLToJSON([]byte(doc))
		if err != nil {
			return nil, fmt.Errorf("parse %s: %w", path, err)
		}
		var obj map[string]any
		if err := json.Unmarshal(j, &obj); err != nil || obj == nil {
			continue
		}
		if obj["kind"] != "CustomResourceDefinition" {
			return nil, fmt.Errorf("%s: expected CustomResourceDefinition, got %v", path, obj["kind"])
		}
		out = append(out, obj)
	}
	return out, nil
}

func applyLabels(crd map[string]any, labels map[string]string) {
	meta, _ := crd["metadata"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
		crd["metadata"] = meta
	}
	l, _ := meta["labels"].(map[string]any)
	if l == nil {
		l = map[string]any{}
		meta["labels"] = l
	}
	for k, v := range labels {
		l[k] = v
	}
	delete(meta, "creationTimestamp")
}

// unserveNonStorage sets `served: false` on every version of crd but its storage version,
// which is what a CAPI release that no longer serves v1beta1 will ship: the version stays in
// the CRD (so objects an older release stored as it stay decodable and status.storedVersions
// stays valid) but the API server neither lists it in discovery nor answers requests for it. Exactly one storage version is
// required, and it must be served already.
func unserveNonStorage(crd map[string]any) error {
	spec, _ := crd["spec"].(map[string]any)
	versions, _ := spec["versions"].([]any)
	storage := 0
	for _, v := range versions {
		vm, _ := v.(map[string]any)
		if vm == nil {
			return fmt.Errorf("malformed spec.versions")
		}
		if s, _ := vm["storage"].(bool); s {
			storage++
			if served, _ := vm["served"].(bool); !served {
				return fmt.Errorf("storage version %v is not served", vm["name"])
			}
			continue
		}
		vm["served"] = false
	}
	if storage != 1 {
		return fmt.Errorf("%d storage versions, expected 1", storage)
	}
	return nil
}

// checkConversion: the CRD bases of these pins declare no conversion stanza (strategy None is
// the default), so nothing is rewritten today. Multi-version CRDs therefore convert with
// strategy None: the API server only rewrites apiVersion. Real conversion needs the providers'
// conversion webhooks (a later harness). Should a future pin ship `strategy: Webhook`, there
// is no webhook server here, so it is rewritten to None — loudly.
func checkConversion(crd map[string]any) {
	spec, _ := crd["spec"].(map[string]any)
	conv, _ := spec["conversion"].(map[string]any)
	if conv == nil || conv["strategy"] != "Webhook" {
		return
	}
	meta, _ := crd["metadata"].(map[string]any)
	logf("WARNING: CRD %v declares conversion strategy Webhook; no webhook server runs here, rewriting to None", meta["name"])
	spec["conversion"] = map[string]any{"strategy": "None"}
}

func sameMap(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// installCRDs creates every CRD, then waits until each is Established and every served
// version answers a list request. It writes the CRDs as sent under <dir>/crds/.
func installCRDs(ctx context.Context, c *apiClient, dir string, sets []loadedSet, timeout time.Duration) (int, error) {
	const crdPath = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
	if err := os.MkdirAll(filepath.Join(dir, "crds"), 0o755); err != nil {
		return 0, err
	}
	type crdRef struct {
		name, group, plural string
		versions            []string
	}
	var refs []crdRef
	for _, set := range sets {
		for _, crd := range set.crds {
			body, err := json.Marshal(crd)
			if err != nil {
				return 0, err
			}
			name := crd["metadata"].(map[string]any)["name"].(string)
			_ = os.WriteFile(filepath.Join(dir, "crds", name+".json"), body, 0o644)
			status, resp, err := c.do(ctx, http.MethodPost, crdPath, body)
			if err != nil {
				return 0, fmt.Errorf("create CRD %s: %w", name, err)
			}
			if status != http.StatusCreated {
				return 0, fmt.Errorf("create CRD %s (%s): HTTP %d: %s", name, set.src.name, status, truncate(string(resp), 800))
			}
			spec := crd["spec"].(map[string]any)
			ref := crdRef{name: name, group: spec["group"].(string),
				plural: spec["names"].(map[string]any)["plural"].(string)}
			for _, v := range spec["versions"].([]any) {
				vm := v.(map[string]any)
				if served, _ := vm["served"].(bool); served {
					ref.versions = append(ref.versions, vm["name"].(string))
				}
			}
			refs = append(refs, ref)
		}
	}

	deadline := time.Now().Add(timeout)
	pending := refs
	for len(pending) > 0 {
		var still []crdRef
		var last string
		for _, r := range pending {
			ok, why, err := c.established(ctx, crdPath+"/"+r.name)
			if err != nil {
				return 0, err
			}
			if !ok {
				still = append(still, r)
				last = r.name + ": " + why
			}
		}
		pending = still
		if len(pending) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("%d CRDs not Established within %s (e.g. %s)", len(pending), timeout, last)
		}
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return 0, err
		}
	}
	// Established means the API server will serve the resource; also see it answer, so a
	// client that starts the moment the kubeconfig appears never meets a 404.
	for _, r := range refs {
		for _, v := range r.versions {
			path := fmt.Sprintf("/apis/%s/%s/%s?limit=1", r.group, v, r.plural)
			for {
				status, body, err := c.do(ctx, http.MethodGet, path, nil)
				if err == nil && status == http.StatusOK {
					break
				}
				if time.Now().After(deadline) {
					return 0, fmt.Errorf("GET %s not served within %s (HTTP %d %v %s)", path, timeout, status, err, truncate(string(body), 300))
				}
				if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
					return 0, err
				}
			}
		}
	}
	return len(refs), nil
}

func (c *apiClient) do(ctx context.Context, method, path string, body []byte) (int, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return 0, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

func (c *apiClient) established(ctx context.Context, path string) (bool, string, error) {
	status, body, err := c.do(ctx, http.MethodGet, path, nil)
	if err != nil {
		return false, "", err
	}
	if status != http.StatusOK {
		return false, fmt.Sprintf("HTTP %d", status), nil
	}
	var crd struct {
		Status struct {
			Conditions []struct{ Type, Status, Reason, Message string }
		}
	}
	if err := json.Unmarshal(body, &crd); err != nil {
		return false, "", err
	}
	why := "no Established condition yet"
	for _, cond := range crd.Status.Conditions {
		if cond.Type == "Established" {
			if cond.Status == "True" {
				return true, "", nil
			}
			why = cond.Reason + ": " + cond.Message
		}
		if cond.Type == "NamesAccepted" && cond.Status == "False" {
			return false, "", fmt.Errorf("CRD %s names not accepted: %s", path, cond.Message)
		}
	}
	return false, why, nil
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
