package harness

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/yaml"

	infrav1b1 "sigs.k8s.io/cluster-api-provider-cloudstack/api/v1beta1"
	infrav1b2 "sigs.k8s.io/cluster-api-provider-cloudstack/api/v1beta2"
	infrav1b3 "sigs.k8s.io/cluster-api-provider-cloudstack/api/v1beta3"
	capccontrollers "sigs.k8s.io/cluster-api-provider-cloudstack/controllers"
	capcutils "sigs.k8s.io/cluster-api-provider-cloudstack/controllers/utils"
	clusterv1 "sigs.k8s.io/cluster-api/api/v1beta1"
	"sigs.k8s.io/cluster-api/api/v1beta1/index"
	bootstrapv1 "sigs.k8s.io/cluster-api/bootstrap/kubeadm/api/v1beta1"
	bootstrapcontrollers "sigs.k8s.io/cluster-api/bootstrap/kubeadm/controllers"
	bootstrapwebhooks "sigs.k8s.io/cluster-api/bootstrap/kubeadm/webhooks"
	capicontrollers "sigs.k8s.io/cluster-api/controllers"
	"sigs.k8s.io/cluster-api/controllers/clustercache"
	"sigs.k8s.io/cluster-api/controllers/remote"
	controlplanev1 "sigs.k8s.io/cluster-api/controlplane/kubeadm/api/v1beta1"
	kcpcontrollers "sigs.k8s.io/cluster-api/controlplane/kubeadm/controllers"
	kcpwebhooks "sigs.k8s.io/cluster-api/controlplane/kubeadm/webhooks"
	expv1 "sigs.k8s.io/cluster-api/exp/api/v1beta1"
	capiwebhooks "sigs.k8s.io/cluster-api/webhooks"
)

// NewScheme holds every API the management cluster serves that the harness touches.
func NewScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{
		clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme,
		clusterv1.AddToScheme, expv1.AddToScheme, bootstrapv1.AddToScheme, controlplanev1.AddToScheme,
		infrav1b1.AddToScheme, infrav1b2.AddToScheme, infrav1b3.AddToScheme,
	} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Management is the management cluster: our API server with the real CAPC v0.6.1 controllers
// running in this process and, unless CAPI core runs in a process of its own (Stack.CoreBinary),
// the real CAPI v1.9.6 core, KCP and CABPK controllers too, with their admission and conversion
// webhooks served from here.
type Management struct {
	Config       *rest.Config
	Kubeconfig   string
	Scheme       *runtime.Scheme
	Client       client.Client             // the manager's (cached) client
	Direct       client.Client             // uncached
	ClusterCache clustercache.ClusterCache // nil when CAPI core runs elsewhere
	capcOnly     bool
	env          *envtest.Environment
	cancel       context.CancelFunc
	done         chan error
}

// webhookManifests are the admission webhook files inside the module zips (capi-interop §E.2):
// CAPC's, and CAPI's unless CAPI core runs in a process of its own.
func webhookManifests(capcOnly bool) ([]string, error) {
	capc, err := moduleDir("sigs.k8s.io/cluster-api-provider-cloudstack")
	if err != nil {
		return nil, err
	}
	if capcOnly {
		return []string{filepath.Join(capc, "config", "webhook", "manifests.yaml")}, nil
	}
	capi, err := moduleDir("sigs.k8s.io/cluster-api")
	if err != nil {
		return nil, err
	}
	return []string{
		filepath.Join(capi, "config", "webhook", "manifests.yaml"),
		filepath.Join(capi, "controlplane", "kubeadm", "config", "webhook", "manifests.yaml"),
		filepath.Join(capi, "bootstrap", "kubeadm", "config", "webhook", "manifests.yaml"),
		filepath.Join(capc, "config", "webhook", "manifests.yaml"),
	}, nil
}

// loadWebhooks reads the four manifests; every project calls its configurations
// mutating-/validating-webhook-configuration, so each gets a suffix to keep them apart.
// Webhooks for kinds nothing here serves (MachinePool, ClusterResourceSet, runtime, IPAM) are
// dropped: their handlers are not registered.
func loadWebhooks(files []string) ([]*admissionv1.MutatingWebhookConfiguration, []*admissionv1.ValidatingWebhookConfiguration, error) {
	var muts []*admissionv1.MutatingWebhookConfiguration
	var vals []*admissionv1.ValidatingWebhookConfiguration
	for i, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, nil, err
		}
		for _, doc := range bytes.Split(b, []byte("\n---")) {
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			var meta struct {
				Kind string `json:"kind"`
			}
			if err := yaml.Unmarshal(doc, &meta); err != nil {
				return nil, nil, fmt.Errorf("%s: %w", f, err)
			}
			suffix := fmt.Sprintf("-e2e-%d", i)
			switch meta.Kind {
			case "MutatingWebhookConfiguration":
				m, err := decodeYAML[admissionv1.MutatingWebhookConfiguration](f, doc)
				if err != nil {
					return nil, nil, err
				}
				m.Name += suffix
				m.Webhooks = keepServed(m.Webhooks, func(w admissionv1.MutatingWebhook) admissionv1.WebhookClientConfig { return w.ClientConfig })
				muts = append(muts, m)
			case "ValidatingWebhookConfiguration":
				v, err := decodeYAML[admissionv1.ValidatingWebhookConfiguration](f, doc)
				if err != nil {
					return nil, nil, err
				}
				v.Name += suffix
				v.Webhooks = keepServed(v.Webhooks, func(w admissionv1.ValidatingWebhook) admissionv1.WebhookClientConfig { return w.ClientConfig })
				vals = append(vals, v)
			}
		}
	}
	return muts, vals, nil
}

func decodeYAML[T any](file string, doc []byte) (*T, error) {
	var out T
	if err := yaml.Unmarshal(doc, &out); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return &out, nil
}

// keepServed drops the webhooks whose handler this process does not register.
func keepServed[W any](hooks []W, config func(W) admissionv1.WebhookClientConfig) []W {
	var keep []W
	for _, w := range hooks {
		if servedWebhook(config(w)) {
			keep = append(keep, w)
		}
	}
	return keep
}

func servedWebhook(cc admissionv1.WebhookClientConfig) bool {
	if cc.Service == nil || cc.Service.Path == nil {
		return false
	}
	p := *cc.Service.Path
	for _, skip := range []string{"machinepool", "clusterresourceset", "extensionconfig", "ipaddress", "runtime-cluster"} {
		if strings.Contains(p, skip) {
			return false
		}
	}
	return true
}

// capcCRDs are the CAPC CRDs hack/apiserver installed (with their contract labels), handed to
// envtest, which switches those whose kinds are convertible in the scheme to this process's
// /convert webhook.
func capcCRDs(ctx context.Context, c client.Client) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	var list apiextensionsv1.CustomResourceDefinitionList
	if err := c.List(ctx, &list); err != nil {
		return nil, err
	}
	var out []*apiextensionsv1.CustomResourceDefinition
	for i := range list.Items {
		crd := list.Items[i]
		if crd.Spec.Group != infrav1b3.GroupVersion.Group {
			continue
		}
		fresh := &apiextensionsv1.CustomResourceDefinition{}
		fresh.Name = crd.Name
		fresh.Labels = crd.Labels
		fresh.Annotations = crd.Annotations
		fresh.Spec = crd.Spec
		// hack/apiserver installs them with strategy None; envtest fills in the webhook.
		fresh.Spec.Conversion = nil
		out = append(out, fresh)
	}
	return out, nil
}

// StartManagement connects to the API server behind kubeconfig, installs webhooks and
// conversion, and runs the controllers until Stop; with capcOnly only CAPC's (CAPI core runs in
// process B and serves CAPI's webhooks and conversion itself).
func StartManagement(ctx context.Context, kubeconfig string, capcOnly bool) (*Management, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 200, 400
	scheme, err := NewScheme()
	if err != nil {
		return nil, err
	}
	direct, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	crds, err := capcCRDs(ctx, direct)
	if err != nil {
		return nil, fmt.Errorf("list CRDs: %w", err)
	}
	files, err := webhookManifests(capcOnly)
	if err != nil {
		return nil, err
	}
	muts, vals, err := loadWebhooks(files)
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
		},
	}
	if _, err := env.Start(); err != nil {
		return nil, fmt.Errorf("install webhooks and conversion: %w", err)
	}
	m := &Management{Config: cfg, Kubeconfig: kubeconfig, Scheme: scheme, Direct: direct, capcOnly: capcOnly, env: env}
	if err := m.startControllers(ctx); err != nil {
		_ = env.Stop()
		return nil, err
	}
	return m, nil
}

func (m *Management) startControllers(parent context.Context) error {
	wo := m.env.WebhookInstallOptions
	// CAPC v0.6.1's --sync-period default (main.go:177-182, 1 min; the manager's cache resync,
	// main.go:230-233), scaled like every default: CAPC's periodic reconciles are part of the
	// CloudStack load users already have (TestCloudStackLoad).
	syncPeriod := Scaled(CAPCSyncPeriod)
	mgr, err := ctrl.NewManager(m.Config, ctrl.Options{
		Cache:                  cache.Options{SyncPeriod: &syncPeriod},
		Scheme:                 m.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		WebhookServer: webhook.NewServer(webhook.Options{
			Host: wo.LocalServingHost, Port: wo.LocalServingPort, CertDir: wo.LocalServingCertDir,
		}),
		// As in CAPI's and CAPC's main.go: Secrets and ConfigMaps are read live.
		Client: client.Options{Cache: &client.CacheOptions{
			DisableFor: []client.Object{&corev1.ConfigMap{}, &corev1.Secret{}},
		}},
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(parent)
	m.cancel = cancel
	if !m.capcOnly {
		if err := m.setupCAPI(ctx, mgr); err != nil {
			return err
		}
	}
	for _, w := range []interface{ SetupWebhookWithManager(ctrl.Manager) error }{
		&infrav1b3.CloudStackCluster{}, &infrav1b3.CloudStackMachine{}, &infrav1b3.CloudStackMachineTemplate{},
	} {
		if err := w.SetupWebhookWithManager(mgr); err != nil {
			return fmt.Errorf("%T: %w", w, err)
		}
	}
	// CAPC, wired as its main.go does; its v1beta1 conversion reads through this package global.
	opts := controller.Options{MaxConcurrentReconciles: 4}
	base := capcutils.ReconcilerBase{
		K8sClient: mgr.GetClient(), BaseLogger: ctrl.Log.WithName("capc"),
		Recorder: mgr.GetEventRecorderFor("capc-controller-manager"), Scheme: mgr.GetScheme(),
	}
	infrav1b3.K8sClient = base.K8sClient
	if err := (&capccontrollers.CloudStackClusterReconciler{ReconcilerBase: base}).SetupWithManager(ctx, mgr, opts); err != nil {
		return err
	}
	if err := (&capccontrollers.CloudStackMachineReconciler{ReconcilerBase: base}).SetupWithManager(ctx, mgr, opts); err != nil {
		return err
	}
	if err := (&capccontrollers.CloudStackIsoNetReconciler{ReconcilerBase: base}).SetupWithManager(mgr, opts); err != nil {
		return err
	}
	if err := (&capccontrollers.CloudStackAffinityGroupReconciler{ReconcilerBase: base}).SetupWithManager(mgr, opts); err != nil {
		return err
	}
	if err := (&capccontrollers.CloudStackFailureDomainReconciler{ReconcilerBase: base}).SetupWithManager(mgr, opts); err != nil {
		return err
	}
	m.Client = mgr.GetClient()
	m.done = make(chan error, 1)
	go func() { m.done <- mgr.Start(ctx) }()
	if !mgr.GetCache().WaitForCacheSync(ctx) {
		return fmt.Errorf("manager caches did not sync")
	}
	// The webhook server must answer before objects are created.
	return WaitFor(ctx, 30*time.Second, 100*time.Millisecond, "webhook server", func() (bool, error) {
		return mgr.GetWebhookServer().StartedChecker()(nil) == nil, nil
	})
}

// setupCAPI adds the CAPI v1.9.6 core, KCP and CABPK controllers and webhooks to mgr, with
// CAPI's main.go defaults (remote connection grace 50 s, remote conditions grace 5 min).
func (m *Management) setupCAPI(ctx context.Context, mgr ctrl.Manager) error {
	if err := index.AddDefaultIndexes(ctx, mgr); err != nil {
		return err
	}
	secretCachingClient, err := client.New(mgr.GetConfig(), client.Options{
		HTTPClient: mgr.GetHTTPClient(),
		Cache:      &client.CacheOptions{Reader: mgr.GetCache()},
	})
	if err != nil {
		return err
	}
	cc, err := clustercache.SetupWithManager(ctx, mgr, clustercache.Options{
		SecretClient: secretCachingClient,
		Cache:        clustercache.CacheOptions{Indexes: []clustercache.CacheOptionsIndex{clustercache.NodeProviderIDIndex}},
		Client: clustercache.ClientOptions{
			QPS: 20, Burst: 30, UserAgent: remote.DefaultClusterAPIUserAgent("capc-e2e"),
			Cache: clustercache.ClientCacheOptions{DisableFor: []client.Object{
				&corev1.ConfigMap{}, &corev1.Secret{}, &corev1.Pod{}, &appsv1.DaemonSet{},
				&storagev1.VolumeAttachment{}, &corev1.PersistentVolume{},
			}},
		},
	}, controller.Options{MaxConcurrentReconciles: 10})
	if err != nil {
		return err
	}
	// The default is 30 s between attempts to reach a workload API server that is not up yet.
	if s, ok := cc.(interface{ SetConnectionCreationRetryInterval(time.Duration) }); ok {
		s.SetConnectionCreationRetryInterval(2 * time.Second)
	}
	m.ClusterCache = cc
	opts := controller.Options{MaxConcurrentReconciles: 4}
	setups := []struct {
		name string
		fn   func() error
	}{
		{"Cluster", func() error {
			return (&capicontrollers.ClusterReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), ClusterCache: cc, RemoteConnectionGracePeriod: 50 * time.Second}).SetupWithManager(ctx, mgr, opts)
		}},
		{"Machine", func() error {
			return (&capicontrollers.MachineReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), ClusterCache: cc, RemoteConditionsGracePeriod: 5 * time.Minute}).SetupWithManager(ctx, mgr, opts)
		}},
		{"MachineSet", func() error {
			return (&capicontrollers.MachineSetReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), ClusterCache: cc}).SetupWithManager(ctx, mgr, opts)
		}},
		{"MachineDeployment", func() error {
			return (&capicontrollers.MachineDeploymentReconciler{Client: mgr.GetClient(), APIReader: mgr.GetAPIReader()}).SetupWithManager(ctx, mgr, opts)
		}},
		{"MachineHealthCheck", func() error {
			return (&capicontrollers.MachineHealthCheckReconciler{Client: mgr.GetClient(), ClusterCache: cc}).SetupWithManager(ctx, mgr, opts)
		}},
		{"KubeadmControlPlane", func() error {
			return (&kcpcontrollers.KubeadmControlPlaneReconciler{
				Client: mgr.GetClient(), SecretCachingClient: secretCachingClient, ClusterCache: cc,
				EtcdDialTimeout: 10 * time.Second, EtcdCallTimeout: 15 * time.Second, RemoteConditionsGracePeriod: 5 * time.Minute,
			}).SetupWithManager(ctx, mgr, opts)
		}},
		{"KubeadmConfig", func() error {
			return (&bootstrapcontrollers.KubeadmConfigReconciler{
				Client: mgr.GetClient(), SecretCachingClient: secretCachingClient, ClusterCache: cc, TokenTTL: 15 * time.Minute,
			}).SetupWithManager(ctx, mgr, opts)
		}},
		{"webhooks", func() error {
			for _, w := range []interface{ SetupWebhookWithManager(ctrl.Manager) error }{
				&capiwebhooks.Cluster{Client: mgr.GetClient(), ClusterCacheReader: cc},
				&capiwebhooks.ClusterClass{Client: mgr.GetClient()},
				&capiwebhooks.Machine{}, &capiwebhooks.MachineSet{}, &capiwebhooks.MachineDeployment{},
				&capiwebhooks.MachineHealthCheck{}, &capiwebhooks.MachineDrainRule{},
				&kcpwebhooks.KubeadmControlPlane{}, &kcpwebhooks.ScaleValidator{Client: mgr.GetClient()},
				&kcpwebhooks.KubeadmControlPlaneTemplate{},
				&bootstrapwebhooks.KubeadmConfig{}, &bootstrapwebhooks.KubeadmConfigTemplate{},
			} {
				if err := w.SetupWebhookWithManager(mgr); err != nil {
					return fmt.Errorf("%T: %w", w, err)
				}
			}
			return nil
		}},
	}
	for _, s := range setups {
		if err := s.fn(); err != nil {
			return fmt.Errorf("set up %s: %w", s.name, err)
		}
	}
	return nil
}

// Stop ends the controllers and removes the webhook configurations' certificates.
func (m *Management) Stop() {
	if m.cancel != nil {
		m.cancel()
		select {
		case <-m.done:
		case <-time.After(20 * time.Second):
		}
	}
	_ = m.env.Stop()
}
