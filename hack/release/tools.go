package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/strvals"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
	clusterctl "sigs.k8s.io/cluster-api/cmd/clusterctl/client"
)

// clusterctlGenerate runs clusterctl's own processing of an add-on provider from a local
// repository — what `clusterctl generate provider --addon` prints and `clusterctl init --addon`
// applies: the metadata is read and validated, the version matched to a release series whose
// contract this clusterctl accepts, variables substituted from the environment (defaults where
// unset), every namespaced object moved to the target namespace (the components' Namespace when
// targetNamespace is ""), and clusterctl's labels added.
//
// clusterctl's configuration (providers list) is written to a temporary directory, which is also
// its config home, so nothing of the caller's ~/.config/cluster-api is read.
func clusterctlGenerate(ctx context.Context, componentsURL, version, targetNamespace string) (clusterctl.Components, error) {
	return clusterctlGenerateWith(ctx, providersConfig(componentsURL), version, targetNamespace)
}

// providersConfig is a clusterctl.yaml naming the add-on and its components file.
func providersConfig(componentsURL string) string {
	return fmt.Sprintf("providers:\n  - name: %q\n    url: %q\n    type: %q\n",
		providerName, componentsURL, clusterctlv1.AddonProviderType)
}

// clusterctlGenerateWith is clusterctlGenerate with a clusterctl.yaml of the caller's.
func clusterctlGenerateWith(ctx context.Context, cfg, version, targetNamespace string) (clusterctl.Components, error) {
	home, err := os.MkdirTemp("", "capc-release-clusterctl-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(home)
	cfgPath := filepath.Join(home, "clusterctl.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		return nil, err
	}
	os.Setenv("XDG_CONFIG_HOME", home)
	c, err := clusterctl.New(ctx, cfgPath)
	if err != nil {
		return nil, err
	}
	provider := providerName
	if version != "" {
		provider += ":" + version
	}
	return c.GenerateProvider(ctx, provider, clusterctlv1.AddonProviderType, clusterctl.ComponentsOptions{
		TargetNamespace: targetNamespace,
	})
}

// helmTemplate renders a chart directory as `helm template` does (Helm's install action, client
// only): values from the chart, then each --values file, then each --set, validated against the
// chart's values.schema.json.
func helmTemplate(chartDir, releaseName, namespace string, valueFiles, sets []string) (string, error) {
	ch, err := loader.Load(chartDir)
	if err != nil {
		return "", err
	}
	vals := map[string]any{}
	for _, f := range valueFiles {
		v, err := chartutil.ReadValuesFile(f)
		if err != nil {
			return "", err
		}
		vals = chartutil.CoalesceTables(v.AsMap(), vals)
	}
	for _, s := range sets {
		if err := strvals.ParseInto(s, vals); err != nil {
			return "", fmt.Errorf("--set %s: %w", s, err)
		}
	}
	install := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	install.DryRun = true
	install.ClientOnly = true
	install.Replace = true
	install.ReleaseName = releaseName
	install.Namespace = namespace
	install.IncludeCRDs = true
	rel, err := install.Run(ch, vals)
	if err != nil {
		return "", err
	}
	var sb strings.Builder
	sb.WriteString(rel.Manifest)
	for _, h := range rel.Hooks {
		sb.WriteString("\n---\n# Source: " + h.Path + "\n" + h.Manifest)
	}
	return sb.String(), nil
}
