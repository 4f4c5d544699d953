package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/version"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/controllers/remote"
	"sigs.k8s.io/cluster-api/feature"
)

const controllerName = "capi-core-e2e"

// wiring is what the release-specific files (wiring_capi113.go, wiring_capi114.go) need to set
// up CAPI's reconcilers and webhooks in the shared manager.
type wiring struct {
	mgr                 ctrl.Manager
	secretCachingClient client.Client
	clusterCache        clustercache.ClusterCache
	etcdLogger          *zap.Logger
	// crds are the core-group CRDs whose conversion envtest pointed at this process.
	crds []*apiextensionsv1.CustomResourceDefinition
	// opts are the controller options of every reconciler but KCP's.
	opts controller.Options
}

// setupStep is one named part of the release-specific wiring (an error names it).
type setupStep struct {
	name string
	fn   func() error
}

// startControllers wires the reconcilers and webhooks the way CAPI's three main.go files do
// (core, controlplane/kubeadm, bootstrap/kubeadm) with their default timings, in one manager.
// Left out: ClusterClass/topology, MachinePool, ClusterResourceSet, runtime extensions and the
// CRD storage-version migrator (the API server starts empty with v1beta2 storage). What differs
// between releases (package layout, reconciler types, how conversion is registered) is in
// coreSetup, defined once per release behind a build tag.
func startControllers(ctx context.Context, core *coreProcess, etcdLogger *zap.Logger, connectionRetry time.Duration) (<-chan error, error) {
	wo := core.env.WebhookInstallOptions
	mgr, err := ctrl.NewManager(core.cfg, ctrl.Options{
		Scheme:                 core.scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		// As CAPI's main.go: the priority queue when its feature gate is on (the default from
		// v1.13, and required by ReconcilerRateLimiting).
		Controller: config.Controller{UsePriorityQueue: ptr.To(feature.Gates.Enabled(feature.PriorityQueue))},
		WebhookServer: webhook.NewServer(webhook.Options{
			Host: wo.LocalServingHost, Port: wo.LocalServingPort, CertDir: wo.LocalServingCertDir,
		}),
		// As CAPI's main.go: Secrets and ConfigMaps are read live by the manager's client.
		Client: client.Options{Cache: &client.CacheOptions{
			DisableFor:   []client.Object{&corev1.ConfigMap{}, &corev1.Secret{}},
			Unstructured: true,
		}},
	})
	if err != nil {
		return nil, err
	}
	if err := addDefaultIndexes(ctx, mgr); err != nil {
		return nil, err
	}
	secretCachingClient, err := client.New(mgr.GetConfig(), client.Options{
		HTTPClient: mgr.GetHTTPClient(),
		Cache:      &client.CacheOptions{Reader: mgr.GetCache()},
	})
	if err != nil {
		return nil, err
	}
	cc, err := clustercache.SetupWithManager(ctx, mgr, clustercache.Options{
		SecretClient: secretCachingClient,
		Cache:        clustercache.CacheOptions{Indexes: []clustercache.CacheOptionsIndex{clustercache.NodeProviderIDIndex}},
		Client: clustercache.ClientOptions{
			QPS: 20, Burst: 30, UserAgent: remote.DefaultClusterAPIUserAgent(controllerName),
			Cache: clustercache.ClientCacheOptions{DisableFor: []client.Object{
				&corev1.ConfigMap{}, &corev1.Secret{}, &corev1.Pod{}, &appsv1.DaemonSet{},
				&storagev1.VolumeAttachment{}, &corev1.PersistentVolume{},
			}},
		},
	}, controller.Options{MaxConcurrentReconciles: 10})
	if err != nil {
		return nil, err
	}
	if s, ok := cc.(interface{ SetConnectionCreationRetryInterval(time.Duration) }); ok {
		s.SetConnectionCreationRetryInterval(connectionRetry)
	}
	// The v1beta1 conversions fill in a reference's apiVersion from the referenced CRD's
	// contract labels, as CAPI's main.go sets up with its internal contract package.
	setAPIVersionGetter(ctx, func(ctx context.Context, gk schema.GroupKind) (string, error) {
		return latestContractVersion(ctx, mgr, gk)
	})

	w := wiring{
		mgr: mgr, secretCachingClient: secretCachingClient, clusterCache: cc, etcdLogger: etcdLogger,
		crds: core.crds, opts: controller.Options{MaxConcurrentReconciles: 4},
	}
	for _, s := range coreSetup(ctx, w) {
		if err := s.fn(); err != nil {
			return nil, fmt.Errorf("set up %s: %w", s.name, err)
		}
	}
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		return nil, fmt.Errorf("manager caches did not sync")
	}
	deadline := time.Now().Add(30 * time.Second)
	for mgr.GetWebhookServer().StartedChecker()(nil) != nil {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("webhook server did not start within 30 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	return done, nil
}

// latestContractVersion is the apiVersion a v1beta1 reference to gk should carry: the newest
// API version the CRD lists under the newest CAPI contract label it has
// (cluster.x-k8s.io/v1beta2, else cluster.x-k8s.io/v1beta1; values joined by "_").
func latestContractVersion(ctx context.Context, mgr ctrl.Manager, gk schema.GroupKind) (string, error) {
	mapping, err := mgr.GetRESTMapper().RESTMapping(gk)
	if err != nil {
		return "", fmt.Errorf("apiVersion of %s: %w", gk, err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	name := mapping.Resource.Resource + "." + gk.Group
	if err := mgr.GetAPIReader().Get(ctx, client.ObjectKey{Name: name}, &crd); err != nil {
		return "", fmt.Errorf("apiVersion of %s: %w", gk, err)
	}
	for _, contract := range []string{"v1beta2", "v1beta1"} {
		label := crd.Labels[clusterv1.GroupVersion.Group+"/"+contract]
		if label == "" {
			continue
		}
		versions := strings.Split(label, "_")
		best := versions[0]
		for _, v := range versions[1:] {
			if version.CompareKubeAwareVersionStrings(v, best) > 0 {
				best = v
			}
		}
		return schema.GroupVersion{Group: gk.Group, Version: best}.String(), nil
	}
	return "", fmt.Errorf("apiVersion of %s: CRD %s has no CAPI contract label", gk, name)
}
