package main

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	kyaml "sigs.k8s.io/kustomize/kyaml/yaml"
)

const (
	// providerName is the add-on's name for clusterctl (`clusterctl init --addon capc-health-shim`).
	providerName = "capc-health-shim"
	// providerLabelKey is clusterctl's provider label; its value for an AddonProvider is
	// "addon-" + the name (clusterctl's ManifestLabel; release_test.go checks it against clusterctl).
	providerLabelKey = "cluster.x-k8s.io/provider"
	providerLabel    = "addon-" + providerName
	// managerContainer is the controller's container, named as clusterctl's contract requires.
	managerContainer = "manager"
	// logEnv is the container's log filter variable (the shim's own `--log` fallback); the release
	// manifests turn its value into the clusterctl variable logVar / the chart's `log`.
	logEnv = "CAPC_HEALTH_LOG"
	// logVar is the clusterctl variable for the log filter (clusterctl's variables of this
	// provider share the prefix CAPC_HEALTH_SHIM_; the container's variables are the flags').
	logVar = "CAPC_HEALTH_SHIM_LOG"
	// imageVar is the clusterctl variable for the image.
	imageVar = "CAPC_HEALTH_SHIM_IMAGE"
	// contract is the Cluster API contract of this release series (docs/versions.md): the shim
	// works on CAPI v1.7+ and v1beta1 is a contract every clusterctl since v1.7 accepts (their own
	// up to v1.10; later ones accept it next to v1beta2 while CAPI supports v1beta1).
	contract = "v1beta1"
)

// base is deploy/base as kustomize builds it, plus what the generators need to know about it.
type base struct {
	root    string
	version string // the workspace version, e.g. 0.1.0
	objs    []*kyaml.RNode
}

// loadBase builds deploy/base with kustomize's own library (krusty), as `kubectl apply -k` would.
func loadBase(root string) (*base, error) {
	version, err := workspaceVersion(root)
	if err != nil {
		return nil, err
	}
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), filepath.Join(root, "deploy", "base"))
	if err != nil {
		return nil, fmt.Errorf("kustomize build deploy/base: %w", err)
	}
	b := &base{root: root, version: version}
	for _, r := range m.Resources() {
		o := r.RNode.Copy()
		// The base's comments explain the base; in the release files they would name its
		// namespace in examples, and clusterctl would take a `${…}` in one for a variable.
		stripComments(o.YNode())
		b.objs = append(b.objs, o)
	}
	if _, err := b.namespace(); err != nil {
		return nil, err
	}
	if _, _, err := b.manager(); err != nil {
		return nil, err
	}
	return b, nil
}

// kustomizeBuild is what `kubectl kustomize dir` prints (the same library and defaults as
// loadBase), for the tests that build every kustomization and example under deploy/. With
// components, dir is built through an overlay that adds them (a Component cannot be built
// alone); kustomize takes only relative paths there, so the overlay names them relative to
// its own temporary directory.
func kustomizeBuild(dir string, components []string) ([]byte, error) {
	target := dir
	if len(components) > 0 {
		tmp, err := os.MkdirTemp("", "kustomize-overlay-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(tmp)
		rel := func(p string) (string, error) {
			abs, err := filepath.Abs(p)
			if err != nil {
				return "", err
			}
			return filepath.Rel(tmp, abs)
		}
		base, err := rel(dir)
		if err != nil {
			return nil, err
		}
		text := "resources:\n- " + base + "\ncomponents:\n"
		for _, c := range components {
			r, err := rel(c)
			if err != nil {
				return nil, err
			}
			text += "- " + r + "\n"
		}
		if err := os.WriteFile(filepath.Join(tmp, "kustomization.yaml"), []byte(text), 0o644); err != nil {
			return nil, err
		}
		target = tmp
	}
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), target)
	if err != nil {
		return nil, fmt.Errorf("kustomize build %s (components %v): %w", dir, components, err)
	}
	return m.AsYaml()
}

var workspaceVersionRE = regexp.MustCompile(`(?ms)^\[workspace\.package\]\s*$.*?^version\s*=\s*"([0-9]+\.[0-9]+\.[0-9]+)"`)

// workspaceVersion is `[workspace.package] version` of the Cargo workspace: the release's version.
func workspaceVersion(root string) (string, error) {
	text, err := os.ReadFile(filepath.Join(root, "Cargo.toml"))
	if err != nil {
		return "", err
	}
	m := workspaceVersionRE.FindSubmatch(text)
	if m == nil {
		return "", fmt.Errorf("Cargo.toml: no [workspace.package] version")
	}
	return string(m[1]), nil
}

// copies returns a deep copy of every object, so each generator edits its own.
func (b *base) copies() []*kyaml.RNode {
	out := make([]*kyaml.RNode, 0, len(b.objs))
	for _, o := range b.objs {
		out = append(out, o.Copy())
	}
	return out
}

// namespace is the name of the one Namespace the base holds (clusterctl's default target namespace).
func (b *base) namespace() (string, error) {
	var names []string
	for _, o := range b.objs {
		if o.GetKind() == "Namespace" {
			names = append(names, o.GetName())
		}
	}
	if len(names) != 1 {
		return "", fmt.Errorf("deploy/base must hold exactly one Namespace (clusterctl's target namespace), has %v", names)
	}
	return names[0], nil
}

// manager finds the one Deployment and its container `manager`.
func (b *base) manager() (*kyaml.RNode, *kyaml.RNode, error) {
	return managerOf(b.objs)
}

func managerOf(objs []*kyaml.RNode) (*kyaml.RNode, *kyaml.RNode, error) {
	var deployments []*kyaml.RNode
	for _, o := range objs {
		if o.GetKind() == "Deployment" {
			deployments = append(deployments, o)
		}
	}
	if len(deployments) != 1 {
		return nil, nil, fmt.Errorf("deploy/base must hold exactly one Deployment, has %d", len(deployments))
	}
	d := deployments[0]
	c, err := d.Pipe(kyaml.Lookup("spec", "template", "spec", "containers", "[name="+managerContainer+"]"))
	if err != nil {
		return nil, nil, err
	}
	if c == nil {
		return nil, nil, fmt.Errorf("Deployment %s: no container named %q (clusterctl's contract names the controller's container so)", d.GetName(), managerContainer)
	}
	return d, c, nil
}

// envValue finds the literal value node of the container's environment variable `name`.
func envValue(container *kyaml.RNode, name string) (*kyaml.RNode, error) {
	v, err := container.Pipe(kyaml.Lookup("env", "[name="+name+"]", "value"))
	if err != nil {
		return nil, err
	}
	if v == nil {
		return nil, fmt.Errorf("the %s container has no env %s with a literal value", managerContainer, name)
	}
	return v, nil
}

// splitImage splits `repo:tag` (a digest or a registry port are not used by the base).
func splitImage(image string) (repo, tag string, err error) {
	at := strings.LastIndex(image, ":")
	if at < 0 || strings.Contains(image[at:], "/") || strings.Contains(image, "@") {
		return "", "", fmt.Errorf("image %q: want repository:tag", image)
	}
	return image[:at], image[at+1:], nil
}

// isClusterScoped says which kinds of the base are not namespaced.
func isClusterScoped(kind string) bool {
	switch kind {
	case "Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
		"ValidatingWebhookConfiguration", "MutatingWebhookConfiguration", "PriorityClass", "StorageClass":
		return true
	}
	return false
}

// marshal writes one object in the style of deploy/base (sequences indented under their key).
func marshal(o *kyaml.RNode) (string, error) {
	b, err := kyaml.MarshalWithOptions(o.Document(), &kyaml.EncoderOptions{SeqIndent: kyaml.WideSequenceStyle})
	if err != nil {
		return "", err
	}
	return string(b), nil
}

func stripComments(n *kyaml.Node) {
	if n == nil {
		return
	}
	n.HeadComment, n.LineComment, n.FootComment = "", "", ""
	for _, c := range n.Content {
		stripComments(c)
	}
}
