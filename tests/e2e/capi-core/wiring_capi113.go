//go:build !capi114

// CAPI v1.13 (the default build, go.mod): controllers under controllers/ and
// */kubeadm/controllers, webhooks under webhooks/ and */kubeadm/webhooks, the API types in the
// root module. The API types implement Hub/Convertible, so controller-runtime serves /convert
// from the scheme once any webhook of a convertible kind is set up.

package main

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller"

	controlplanev1beta1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta1"
	clusterv1beta1 "sigs.k8s.io/cluster-api/api/core/v1beta1"
	"sigs.k8s.io/cluster-api/api/core/v1beta2/index"
	bootstrapcontrollers "sigs.k8s.io/cluster-api/bootstrap/kubeadm/controllers"
	bootstrapwebhooks "sigs.k8s.io/cluster-api/bootstrap/kubeadm/webhooks"
	capicontrollers "sigs.k8s.io/cluster-api/controllers"
	kcpcontrollers "sigs.k8s.io/cluster-api/controlplane/kubeadm/controllers"
	kcpwebhooks "sigs.k8s.io/cluster-api/controlplane/kubeadm/webhooks"
	capiwebhooks "sigs.k8s.io/cluster-api/webhooks"
)

// webhookManifests are the admission webhook manifests in the module zip, relative to its root.
var webhookManifests = []string{
	"config/webhook/manifests.yaml",
	"controlplane/kubeadm/config/webhook/manifests.yaml",
	"bootstrap/kubeadm/config/webhook/manifests.yaml",
}

// ignoreSchemeConvertible: envtest finds the convertible kinds in the scheme.
const ignoreSchemeConvertible = false

func addDefaultIndexes(ctx context.Context, mgr ctrl.Manager) error {
	return index.AddDefaultIndexes(ctx, mgr)
}

// setAPIVersionGetter: v1.13's getters live in the v1beta1 API packages and take no context;
// they get the process's.
func setAPIVersionGetter(ctx context.Context, get func(context.Context, schema.GroupKind) (string, error)) {
	getter := func(gk schema.GroupKind) (string, error) { return get(ctx, gk) }
	clusterv1beta1.SetAPIVersionGetter(getter)
	controlplanev1beta1.SetAPIVersionGetter(getter)
}

// coreSetup: CAPI's defaults — remote connection grace 50 s, remote conditions grace 5 min,
// KCP's etcd timeouts 10 s/15 s and reconciliation timeout 3 min, bootstrap token TTL 15 min.
func coreSetup(ctx context.Context, w wiring) []setupStep {
	mgr, cc, opts := w.mgr, w.clusterCache, w.opts
	return []setupStep{
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
				Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), SecretCachingClient: w.secretCachingClient, ClusterCache: cc,
				EtcdDialTimeout: 10 * time.Second, EtcdCallTimeout: 15 * time.Second, EtcdLogger: w.etcdLogger,
				RemoteConditionsGracePeriod: 5 * time.Minute,
			}).SetupWithManager(ctx, mgr, controller.Options{MaxConcurrentReconciles: opts.MaxConcurrentReconciles, ReconciliationTimeout: 3 * time.Minute})
		}},
		{"KubeadmConfig", func() error {
			return (&bootstrapcontrollers.KubeadmConfigReconciler{
				Client: mgr.GetClient(), SecretCachingClient: w.secretCachingClient, ClusterCache: cc, TokenTTL: 15 * time.Minute,
			}).SetupWithManager(ctx, mgr, opts)
		}},
		{"webhooks", func() error {
			for _, wh := range []interface{ SetupWebhookWithManager(ctrl.Manager) error }{
				&capiwebhooks.Cluster{Client: mgr.GetClient(), ClusterCacheReader: cc},
				&capiwebhooks.ClusterClass{Client: mgr.GetClient()},
				&capiwebhooks.Machine{}, &capiwebhooks.MachineSet{}, &capiwebhooks.MachineDeployment{},
				&capiwebhooks.MachineHealthCheck{}, &capiwebhooks.MachineDrainRule{},
				&kcpwebhooks.KubeadmControlPlane{}, &kcpwebhooks.ScaleValidator{Client: mgr.GetClient()},
				&kcpwebhooks.KubeadmControlPlaneTemplate{},
				&bootstrapwebhooks.KubeadmConfig{}, &bootstrapwebhooks.KubeadmConfigTemplate{},
			} {
				if err := wh.SetupWebhookWithManager(mgr); err != nil {
					return fmt.Errorf("%T: %w", wh, err)
				}
			}
			return nil
		}},
	}
}
