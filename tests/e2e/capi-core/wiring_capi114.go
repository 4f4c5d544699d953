//go:build capi114

// CAPI v1.14 (go build -modfile=go.capi114.mod -tags capi114): the API types are a module of
// their own (sigs.k8s.io/cluster-api/api, required in go.capi114.mod at the same version),
// the reconcilers moved to core/reconcilers/<kind>, controlplane/kubeadm/reconcilers and
// bootstrap/kubeadm/reconcilers, the webhooks to */webhooks/admission and */webhooks/conversion,
// the config (CRDs, webhook manifests) of the core provider to core/config. The API types no
// longer implement Hub/Convertible: each admission webhook registers its kind's hub-and-spoke
// converter with the manager (controller-runtime ≥ v0.24 WithConverter), and the v1beta1
// apiVersion getters moved from the API packages to the conversion packages.

package main

import (
	"context"
	"fmt"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	ctrlconversion "sigs.k8s.io/controller-runtime/pkg/webhook/conversion"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	bootstrapreconciler "sigs.k8s.io/cluster-api/bootstrap/kubeadm/reconcilers/kubeadmconfig"
	bootstrapadmission "sigs.k8s.io/cluster-api/bootstrap/kubeadm/webhooks/admission"
	kcpreconciler "sigs.k8s.io/cluster-api/controlplane/kubeadm/reconcilers/kubeadmcontrolplane"
	kcpadmission "sigs.k8s.io/cluster-api/controlplane/kubeadm/webhooks/admission"
	kcpconversion "sigs.k8s.io/cluster-api/controlplane/kubeadm/webhooks/conversion"
	"sigs.k8s.io/cluster-api/core/reconcilers/cluster"
	"sigs.k8s.io/cluster-api/core/reconcilers/machine"
	"sigs.k8s.io/cluster-api/core/reconcilers/machinedeployment"
	"sigs.k8s.io/cluster-api/core/reconcilers/machinehealthcheck"
	"sigs.k8s.io/cluster-api/core/reconcilers/machineset"
	coreadmission "sigs.k8s.io/cluster-api/core/webhooks/admission"
	coreconversion "sigs.k8s.io/cluster-api/core/webhooks/conversion"
	"sigs.k8s.io/cluster-api/util/index"
)

// webhookManifests are the admission webhook manifests in the module zip, relative to its root
// (v1.14 moved the core provider's config/ to core/config/).
var webhookManifests = []string{
	"core/config/webhook/manifests.yaml",
	"controlplane/kubeadm/config/webhook/manifests.yaml",
	"bootstrap/kubeadm/config/webhook/manifests.yaml",
}

// ignoreSchemeConvertible: nothing in the scheme is Hub/Convertible any more, so envtest would
// switch every CRD's conversion off; instead every core-group CRD handed to it converts through
// this process, and coreSetup checks that each of their kinds has a converter.
const ignoreSchemeConvertible = true

func addDefaultIndexes(ctx context.Context, mgr ctrl.Manager) error {
	return index.AddDefaultIndexes(ctx, mgr)
}

// setAPIVersionGetter: v1.14's getters live in the conversion packages and get the conversion
// request's context.
func setAPIVersionGetter(_ context.Context, get func(context.Context, schema.GroupKind) (string, error)) {
	coreconversion.SetAPIVersionGetter(get)
	kcpconversion.SetAPIVersionGetter(get)
}

// converterOnly are converters of core-group kinds whose admission webhooks this process does
// not set up (v1.13 converted them from the scheme all the same).
var converterOnly = map[schema.GroupKind]func(*runtime.Scheme) (ctrlconversion.Converter, error){
	clusterv1.GroupVersion.WithKind("MachinePool").GroupKind(): coreconversion.MachinePool,
}

// coreSetup: CAPI's defaults — remote connection grace 50 s, remote conditions grace 5 min,
// KCP's etcd timeouts 10 s/15 s and reconciliation timeout 3 min, bootstrap token TTL
// (kubeadmconfig.DefaultTokenTTL, 15 min).
func coreSetup(ctx context.Context, w wiring) []setupStep {
	mgr, cc, opts := w.mgr, w.clusterCache, w.opts
	return []setupStep{
		{"Cluster", func() error {
			return (&cluster.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), ClusterCache: cc, RemoteConnectionGracePeriod: 50 * time.Second}).SetupWithManager(ctx, mgr, opts)
		}},
		{"Machine", func() error {
			return (&machine.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), ClusterCache: cc, RemoteConditionsGracePeriod: 5 * time.Minute}).SetupWithManager(ctx, mgr, opts)
		}},
		{"MachineSet", func() error {
			return (&machineset.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), ClusterCache: cc}).SetupWithManager(ctx, mgr, opts)
		}},
		{"MachineDeployment", func() error {
			return (&machinedeployment.Reconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader()}).SetupWithManager(ctx, mgr, opts)
		}},
		{"MachineHealthCheck", func() error {
			return (&machinehealthcheck.Reconciler{Client: mgr.GetClient(), ClusterCache: cc}).SetupWithManager(ctx, mgr, opts)
		}},
		{"KubeadmControlPlane", func() error {
			return (&kcpreconciler.Reconciler{
				Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), SecretCachingClient: w.secretCachingClient, ClusterCache: cc,
				EtcdDialTimeout: 10 * time.Second, EtcdCallTimeout: 15 * time.Second, EtcdLogger: w.etcdLogger,
				RemoteConditionsGracePeriod: 5 * time.Minute,
			}).SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: opts.MaxConcurrentReconciles, ReconciliationTimeout: 3 * time.Minute})
		}},
		{"KubeadmConfig", func() error {
			return (&bootstrapreconciler.Reconciler{
				Client: mgr.GetClient(), SecretCachingClient: w.secretCachingClient, APIReader: mgr.GetAPIReader(), ClusterCache: cc,
				TokenTTL: bootstrapreconciler.DefaultTokenTTL,
			}).SetupWithManager(ctx, mgr, opts)
		}},
		{"webhooks", func() error {
			// Each of these also registers its kind's converter (and /convert) with the manager.
			for _, wh := range []interface{ SetupWebhookWithManager(ctrl.Manager) error }{
				&coreadmission.Cluster{Client: mgr.GetClient(), ClusterCacheReader: cc},
				&coreadmission.ClusterClass{Client: mgr.GetClient()},
				&coreadmission.Machine{}, &coreadmission.MachineSet{}, &coreadmission.MachineDeployment{},
				&coreadmission.MachineHealthCheck{}, &coreadmission.MachineDrainRule{},
				&kcpadmission.KubeadmControlPlane{}, &kcpadmission.ScaleValidator{Client: mgr.GetClient()},
				&kcpadmission.KubeadmControlPlaneTemplate{},
				&bootstrapadmission.KubeadmConfig{}, &bootstrapadmission.KubeadmConfigTemplate{},
			} {
				if err := wh.SetupWebhookWithManager(mgr); err != nil {
					return fmt.Errorf("%T: %w", wh, err)
				}
			}
			return nil
		}},
		{"conversion", func() error { return registerConverters(mgr, w.crds) }},
	}
}

// registerConverters makes sure every CRD envtest pointed at /convert has a converter: those
// without an admission webhook here get theirs from converterOnly; any other gap is an error
// (the API server would fail every request for a non-storage version of that kind).
func registerConverters(mgr ctrl.Manager, crds []*apiextensionsv1.CustomResourceDefinition) error {
	reg := mgr.GetConverterRegistry()
	for _, crd := range crds {
		if crd.Spec.Conversion == nil || crd.Spec.Conversion.Strategy != apiextensionsv1.WebhookConverter {
			continue
		}
		gk := schema.GroupKind{Group: crd.Spec.Group, Kind: crd.Spec.Names.Kind}
		if _, ok := reg.GetConverter(gk); ok {
			continue
		}
		newConverter, ok := converterOnly[gk]
		if !ok {
			return fmt.Errorf("CRD %s converts through this process but no converter is registered for %s", crd.Name, gk)
		}
		c, err := newConverter(mgr.GetScheme())
		if err != nil {
			return fmt.Errorf("converter for %s: %w", gk, err)
		}
		if err := reg.RegisterConverter(gk, c); err != nil {
			return err
		}
	}
	return nil
}
