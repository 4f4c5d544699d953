package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	bootstrapv1beta1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta1"
	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1beta1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta1"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1beta1 "sigs.k8s.io/cluster-api/api/core/v1beta1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// coreGroups are the API groups whose CRDs this process converts (CAPC's stay with process A).
var coreGroups = map[string]bool{
	clusterv1.GroupVersion.Group:      true,
	bootstrapv1.GroupVersion.Group:    true,
	controlplanev1.GroupVersion.Group: true,
}

func newScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme,
		clusterv1.AddToScheme, clusterv1beta1.AddToScheme,
		bootstrapv1.AddToScheme, bootstrapv1beta1.AddToScheme,
		controlplanev1.AddToScheme, controlplanev1beta1.AddToScheme,
	} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// coreProcess is what installWebhooks prepared for startControllers.
type coreProcess struct {
	cfg    *rest.Config
	scheme *runtime.Scheme
	env    *envtest.Environment
	// crds are the core-group CRDs as envtest installed them (env.CRDs: deep copies of those
	// handed to it, with conversion rewritten).
	crds []*apiextensionsv1.CustomResourceDefinition
}

// installWebhooks points the CAPI CRDs' conversion and CAPI's admission webhooks (from the
// module's own webhook manifests, webhookManifests) at this process. controller-runtime's
// envtest does both against an existing cluster: it generates a serving certificate, rewrites
// each webhook's clientConfig to 127.0.0.1:<port> and sets the CRDs' conversion to strategy
// Webhook — for every kind that is convertible in the scheme (CAPI ≤ v1.13: the API types
// implement Hub/Convertible), or for every CRD handed over (ignoreSchemeConvertible, CAPI ≥
// v1.14: conversion lives in converters registered with the webhook server instead).
func installWebhooks(ctx context.Context, cfg *rest.Config) (*coreProcess, error) {
	scheme, err := newScheme()
	if err != nil {
		return nil, err
	}
	direct, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	crds, err := coreCRDs(ctx, direct)
	if err != nil {
		return nil, fmt.Errorf("list CRDs: %w", err)
	}
	muts, vals, err := loadWebhooks()
	if err != nil {
		return nil, err
	}
	useExisting := true
	env := &envtest.Environment{
		UseExistingCluster: &useExisting,
		Config:             cfg,
		Scheme:             scheme,
		CRDInstallOptions:  envtest.CRDInstallOptions{CRDs: crds, Scheme: scheme},
		WebhookInstallOptions: envtest.WebhookInstallOptions{
			LocalServingHost:   "127.0.0.1",
			MutatingWebhooks:   muts,
			ValidatingWebhooks: vals,
			MaxTime:            30 * time.Second,
			// CAPI ≥ v1.14 only; see installWebhooks' comment.
			IgnoreSchemeConvertible: ignoreSchemeConvertible,
		},
	}
	if _, err := env.Start(); err != nil {
		return nil, err
	}
	return &coreProcess{cfg: cfg, scheme: scheme, env: env, crds: env.CRDs}, nil
}

// coreCRDs are the installed CRDs of the core groups, handed back to envtest so that it only
// rewrites their conversion (hack/apiserver installs them with strategy None).
func coreCRDs(ctx context.Context, c client.Client) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	var list apiextensionsv1.CustomResourceDefinitionList
	if err := c.List(ctx, &list); err != nil {
		return nil, err
	}
	var out []*apiextensionsv1.CustomResourceDefinition
	for i := range list.Items {
		crd := list.Items[i]
		if !coreGroups[crd.Spec.Group] {
			continue
		}
		fresh := &apiextensionsv1.CustomResourceDefinition{}
		fresh.Name, fresh.Labels, fresh.Annotations = crd.Name, crd.Labels, crd.Annotations
		fresh.Spec = crd.Spec
		fresh.Spec.Conversion = nil
		out = append(out, fresh)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no CRDs of %v installed: start the API server with a CAPI profile", keys(coreGroups))
	}
	return out, nil
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// loadWebhooks reads the three manifests of the linked CAPI module (webhookManifests: their
// paths depend on the release). Every project names its configurations
// mutating-/validating-webhook-configuration, so each gets a suffix; webhooks for kinds this
// process does not serve (MachinePool, ClusterResourceSet, runtime, IPAM) are dropped, since
// nothing would answer them.
func loadWebhooks() ([]*admissionv1.MutatingWebhookConfiguration, []*admissionv1.ValidatingWebhookConfiguration, error) {
	dir, err := moduleDir("sigs.k8s.io/cluster-api")
	if err != nil {
		return nil, nil, err
	}
	var files []string
	for _, rel := range webhookManifests {
		files = append(files, filepath.Join(dir, filepath.FromSlash(rel)))
	}
	var muts []*admissionv1.MutatingWebhookConfiguration
	var vals []*admissionv1.ValidatingWebhookConfiguration
	for i, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, nil, err
		}
		suffix := fmt.Sprintf("-capi-core-%d", i)
		for _, doc := range bytes.Split(b, []byte("\n---")) {
			var meta struct {
				Kind string `json:"kind"`
			}
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			if err := yaml.Unmarshal(doc, &meta); err != nil {
				return nil, nil, fmt.Errorf("%s: %w", f, err)
			}
			switch meta.Kind {
			case "MutatingWebhookConfiguration":
				var m admissionv1.MutatingWebhookConfiguration
				if err := yaml.Unmarshal(doc, &m); err != nil {
					return nil, nil, fmt.Errorf("%s: %w", f, err)
				}
				m.Name += suffix
				m.Webhooks = keepServed(m.Webhooks, func(w admissionv1.MutatingWebhook) admissionv1.WebhookClientConfig { return w.ClientConfig })
				muts = append(muts, &m)
			case "ValidatingWebhookConfiguration":
				var v admissionv1.ValidatingWebhookConfiguration
				if err := yaml.Unmarshal(doc, &v); err != nil {
					return nil, nil, fmt.Errorf("%s: %w", f, err)
				}
				v.Name += suffix
				v.Webhooks = keepServed(v.Webhooks, func(w admissionv1.ValidatingWebhook) admissionv1.WebhookClientConfig { return w.ClientConfig })
				vals = append(vals, &v)
			}
		}
	}
	return muts, vals, nil
}

// keepServed drops the webhooks no handler here answers.
func keepServed[W any](hooks []W, config func(W) admissionv1.WebhookClientConfig) []W {
	var keep []W
	for _, w := range hooks {
		if served(config(w)) {
			keep = append(keep, w)
		}
	}
	return keep
}

func served(cc admissionv1.WebhookClientConfig) bool {
	if cc.Service == nil || cc.Service.Path == nil {
		return false
	}
	for _, skip := range []string{"machinepool", "clusterresourceset", "extensionconfig", "ipaddress", "runtime-cluster"} {
		if strings.Contains(*cc.Service.Path, skip) {
			return false
		}
	}
	return true
}

// moduleDir is the linked CAPI module's directory in the Go module cache (its zip carries the
// webhook manifests); the version is the one this binary was built with.
func moduleDir(path string) (string, error) {
	version := moduleVersion(path)
	if version == "" {
		return "", fmt.Errorf("%s is not linked into this binary", path)
	}
	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMODCACHE: %w", err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), path+"@"+version)
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("%s@%s not in the module cache (go mod download): %w", path, version, err)
	}
	return dir, nil
}
