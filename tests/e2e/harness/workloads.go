package harness

import (
	"context"
	"crypto/rsa"
	"fmt"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inmemoryruntime "sigs.k8s.io/cluster-api/test/infrastructure/inmemory/pkg/runtime"
	inmemoryserver "sigs.k8s.io/cluster-api/test/infrastructure/inmemory/pkg/server"
	"sigs.k8s.io/cluster-api/util/certs"
	"sigs.k8s.io/cluster-api/util/secret"
)

// Workloads simulates the workload clusters' API servers and etcd with CAPI's in-memory
// libraries: one TLS listener per cluster, objects kept in a resource group.
type Workloads struct {
	rt  inmemoryruntime.Manager
	mux *inmemoryserver.WorkloadClustersMux

	mu       sync.Mutex
	clusters map[string]bool
}

// StartWorkloads starts the in-memory runtime and the listener mux on loopback ports
// [minPort, maxPort) with its debug listener on debugPort.
func StartWorkloads(ctx context.Context, minPort, maxPort, debugPort int) (*Workloads, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, rbacv1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	rt := inmemoryruntime.NewManager(s)
	if err := rt.Start(ctx); err != nil {
		return nil, err
	}
	mux, err := inmemoryserver.NewWorkloadClustersMux(rt, "127.0.0.1",
		inmemoryserver.CustomPorts{MinPort: minPort, MaxPort: maxPort, DebugPort: debugPort})
	if err != nil {
		return nil, err
	}
	return &Workloads{rt: rt, mux: mux, clusters: map[string]bool{}}, nil
}

func workloadName(namespace, cluster string) string { return namespace + "/" + cluster }

// AddCluster prepares a workload cluster's listener (before the CloudStackCluster exists: its
// controlPlaneEndpoint is immutable) and its default namespaces; returns the endpoint.
func (w *Workloads) AddCluster(ctx context.Context, namespace, cluster string) (string, int, error) {
	name := workloadName(namespace, cluster)
	w.rt.AddResourceGroup(name)
	c := w.rt.GetResourceGroup(name).GetClient()
	for _, ns := range []string{metav1.NamespaceDefault, metav1.NamespacePublic, metav1.NamespaceSystem} {
		obj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{"kubernetes.io/metadata.name": ns}}}
		if err := c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return "", 0, err
		}
	}
	l, err := w.mux.InitWorkloadClusterListener(name)
	if err != nil {
		return "", 0, err
	}
	if err := w.mux.RegisterResourceGroup(name, name); err != nil {
		return "", 0, err
	}
	w.mu.Lock()
	w.clusters[name] = true
	w.mu.Unlock()
	return l.Host(), l.Port(), nil
}

// RemoveCluster stops a workload cluster's listener and drops its objects.
func (w *Workloads) RemoveCluster(namespace, cluster string) {
	name := workloadName(namespace, cluster)
	_ = w.mux.DeleteWorkloadClusterListener(name)
	w.rt.DeleteResourceGroup(name)
	w.mu.Lock()
	delete(w.clusters, name)
	w.mu.Unlock()
}

// Client reads and writes one workload cluster's objects directly (not through its listener).
func (w *Workloads) Client(namespace, cluster string) (inmemoryruntime.Client, bool) {
	name := workloadName(namespace, cluster)
	w.mu.Lock()
	ok := w.clusters[name]
	w.mu.Unlock()
	if !ok {
		return nil, false
	}
	return w.rt.GetResourceGroup(name).GetClient(), true
}

// Shutdown stops every listener.
func (w *Workloads) Shutdown(ctx context.Context) { _ = w.mux.Shutdown(ctx) }

// caPair reads a CA that KCP generated for the cluster (secret.ClusterCA, secret.EtcdCA).
func caPair(ctx context.Context, c client.Client, namespace, cluster string, purpose secret.Purpose) (*caKeyPair, error) {
	s, err := secret.Get(ctx, c, client.ObjectKey{Namespace: namespace, Name: cluster}, purpose)
	if err != nil {
		return nil, err
	}
	cert, err := certs.DecodeCertPEM(s.Data[secret.TLSCrtDataName])
	if err != nil || cert == nil {
		return nil, fmt.Errorf("%s CA of %s/%s: bad certificate: %v", purpose, namespace, cluster, err)
	}
	key, err := certs.DecodePrivateKeyPEM(s.Data[secret.TLSKeyDataName])
	if err != nil {
		return nil, fmt.Errorf("%s CA of %s/%s: bad key: %v", purpose, namespace, cluster, err)
	}
	rsaKey, ok := key.(*rsa.PrivateKey)
	if !ok {
		return nil, fmt.Errorf("%s CA of %s/%s: not an RSA key", purpose, namespace, cluster)
	}
	return &caKeyPair{cert: cert, key: rsaKey}, nil
}
