package harness

import (
	"context"
	"crypto/rsa"
	"crypto/x509"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inmemoryruntime "sigs.k8s.io/cluster-api/test/infrastructure/inmemory/pkg/runtime"
	"sigs.k8s.io/cluster-api/util/secret"
)

// What a booted guest leaves in its workload cluster: kubelet registers the Node; on a
// control-plane VM kubeadm starts the static pods and joins (or creates) etcd; `kubeadm init`
// also writes kube-system/kubeadm-config, which is what makes KCP call the cluster initialized.
// The fake etcd of CAPI's in-memory server derives its members from etcd pods carrying these
// annotations (strings from its internal etcdcluster_annotations.go).
const (
	etcdClusterIDAnnotation  = "etcd.inmemory.infrastructure.cluster.x-k8s.io/cluster-id"
	etcdMemberIDAnnotation   = "etcd.inmemory.infrastructure.cluster.x-k8s.io/member-id"
	etcdLeaderFromAnnotation = "etcd.inmemory.infrastructure.cluster.x-k8s.io/leader-from"
	etcdMemberRemoved        = "etcd.inmemory.infrastructure.cluster.x-k8s.io/member-removed"
)

type caKeyPair struct {
	cert *x509.Certificate
	key  *rsa.PrivateKey
}

// GuestNode is one VM's guest as the workload cluster will see it.
type GuestNode struct {
	Namespace, Cluster string
	NodeName           string // = the Machine name (CAPC sets the hostname to it)
	ProviderID         string // cloudstack:///<vm id>
	Address            string
	ControlPlane       bool
	Version            string
}

func readyNode(g GuestNode) *corev1.Node {
	now := metav1.Now()
	n := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: g.NodeName, Labels: map[string]string{"kubernetes.io/hostname": g.NodeName}},
		Spec:       corev1.NodeSpec{ProviderID: g.ProviderID},
		Status: corev1.NodeStatus{
			Conditions: []corev1.NodeCondition{
				{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastTransitionTime: now, LastHeartbeatTime: now},
				{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientMemory", LastTransitionTime: now},
				{Type: corev1.NodeDiskPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasNoDiskPressure", LastTransitionTime: now},
				{Type: corev1.NodePIDPressure, Status: corev1.ConditionFalse, Reason: "KubeletHasSufficientPID", LastTransitionTime: now},
			},
			NodeInfo: corev1.NodeSystemInfo{KubeletVersion: g.Version},
		},
	}
	if g.Address != "" {
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: g.Address}, {Type: corev1.NodeHostName, Address: g.NodeName}}
	}
	if g.ControlPlane {
		n.Labels["node-role.kubernetes.io/control-plane"] = ""
	}
	return n
}

func staticPod(component, node string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: metav1.NamespaceSystem,
			Name:      component + "-" + node,
			Labels:    map[string]string{"component": component, "tier": "control-plane"},
		},
		Spec: corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{
			Phase:      corev1.PodRunning,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		},
	}
}

func create(ctx context.Context, c inmemoryruntime.Client, obj client.Object) error {
	if err := c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create %T %s: %w", obj, obj.GetName(), err)
	}
	return nil
}

// Initialized reports whether `kubeadm init` has run in the workload cluster.
func (w *Workloads) Initialized(ctx context.Context, namespace, cluster string) bool {
	c, ok := w.Client(namespace, cluster)
	if !ok {
		return false
	}
	cm := &corev1.ConfigMap{}
	return c.Get(ctx, client.ObjectKey{Namespace: metav1.NamespaceSystem, Name: "kubeadm-config"}, cm) == nil
}

// JoinWorker is kubelet registering a worker's Node.
func (w *Workloads) JoinWorker(ctx context.Context, g GuestNode) error {
	c, ok := w.Client(g.Namespace, g.Cluster)
	if !ok {
		return fmt.Errorf("no workload cluster %s/%s", g.Namespace, g.Cluster)
	}
	return create(ctx, c, readyNode(g))
}

// JoinControlPlane is `kubeadm init` (when the cluster has no control plane yet) or `kubeadm
// join --control-plane`: etcd member, API server, scheduler, controller manager, Node, and on
// init the kubeadm objects and add-ons KCP looks for. mgmt reads the CAs KCP generated.
func (w *Workloads) JoinControlPlane(ctx context.Context, mgmt client.Client, g GuestNode) (initialized bool, err error) {
	c, ok := w.Client(g.Namespace, g.Cluster)
	if !ok {
		return false, fmt.Errorf("no workload cluster %s/%s", g.Namespace, g.Cluster)
	}
	name := workloadName(g.Namespace, g.Cluster)
	init := !w.Initialized(ctx, g.Namespace, g.Cluster)

	etcdCA, err := caPair(ctx, mgmt, g.Namespace, g.Cluster, secret.EtcdCA)
	if err != nil {
		return false, err
	}
	clusterCA, err := caPair(ctx, mgmt, g.Namespace, g.Cluster, secret.ClusterCA)
	if err != nil {
		return false, err
	}
	etcdPod := staticPod("etcd", g.NodeName)
	if err := c.Get(ctx, client.ObjectKeyFromObject(etcdPod), &corev1.Pod{}); apierrors.IsNotFound(err) {
		clusterID, leader, err := etcdMembership(ctx, c)
		if err != nil {
			return false, err
		}
		if clusterID == "" {
			clusterID = strconv.FormatUint(uint64(rand.Uint32()|1), 10)
		}
		etcdPod.Annotations = map[string]string{
			etcdClusterIDAnnotation: clusterID,
			etcdMemberIDAnnotation:  strconv.FormatUint(uint64(rand.Uint32()|1), 10),
		}
		if leader == "" {
			etcdPod.Annotations[etcdLeaderFromAnnotation] = time.Now().Format(time.RFC3339)
		}
		if err := create(ctx, c, etcdPod); err != nil {
			return false, err
		}
	}
	if !w.mux.HasEtcdMember(name, etcdPod.Name) {
		if err := w.mux.AddEtcdMember(name, etcdPod.Name, etcdCA.cert, etcdCA.key); err != nil {
			return false, fmt.Errorf("etcd member %s: %w", etcdPod.Name, err)
		}
	}
	apiPod := staticPod("kube-apiserver", g.NodeName)
	for _, p := range []*corev1.Pod{apiPod, staticPod("kube-scheduler", g.NodeName), staticPod("kube-controller-manager", g.NodeName)} {
		if err := create(ctx, c, p); err != nil {
			return false, err
		}
	}
	if !w.mux.HasAPIServer(name, apiPod.Name) {
		// The first API server starts the cluster's listener.
		if err := w.mux.AddAPIServer(name, apiPod.Name, clusterCA.cert, clusterCA.key); err != nil {
			return false, fmt.Errorf("API server %s: %w", apiPod.Name, err)
		}
	}
	if init {
		if err := kubeadmInitObjects(ctx, c, g.Version); err != nil {
			return false, err
		}
	}
	return init, create(ctx, c, readyNode(g))
}

// etcdMembership reads the cluster id and the current leader from the live etcd pods.
func etcdMembership(ctx context.Context, c inmemoryruntime.Client) (clusterID, leader string, err error) {
	pods := &corev1.PodList{}
	if err := c.List(ctx, pods, client.InNamespace(metav1.NamespaceSystem), client.MatchingLabels{"component": "etcd"}); err != nil {
		return "", "", err
	}
	var leaderFrom time.Time
	for _, p := range pods.Items {
		if _, removed := p.Annotations[etcdMemberRemoved]; removed {
			continue
		}
		if clusterID == "" {
			clusterID = p.Annotations[etcdClusterIDAnnotation]
		}
		if t, err := time.Parse(time.RFC3339, p.Annotations[etcdLeaderFromAnnotation]); err == nil && !t.Before(leaderFrom) {
			leader, leaderFrom = p.Annotations[etcdMemberIDAnnotation], t
		}
	}
	return clusterID, leader, nil
}

// kubeadmInitObjects are what `kubeadm init` and its add-on phase leave that KCP reads.
func kubeadmInitObjects(ctx context.Context, c inmemoryruntime.Client, version string) error {
	objs := []client.Object{
		&rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: "kubeadm:get-nodes"},
			Rules:      []rbacv1.PolicyRule{{Verbs: []string{"get"}, APIGroups: []string{""}, Resources: []string{"nodes"}}},
		},
		&rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: "kubeadm:get-nodes"},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "kubeadm:get-nodes"},
			Subjects:   []rbacv1.Subject{{Kind: rbacv1.GroupKind, Name: "system:bootstrappers:kubeadm:default-node-token"}},
		},
		&corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: "kubeadm-config"},
			Data:       map[string]string{"ClusterConfiguration": ""},
		},
		&appsv1.DaemonSet{
			ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: "kube-proxy", Labels: map[string]string{"component": "kube-proxy"}},
			Spec: appsv1.DaemonSetSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "kube-proxy", Image: "registry.k8s.io/kube-proxy:" + version}},
			}}},
		},
		&corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: "coredns"},
			Data:       map[string]string{"Corefile": ".:53 {\n    forward . /etc/resolv.conf\n}\n"},
		},
		&appsv1.Deployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: metav1.NamespaceSystem, Name: "coredns"},
			Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
				Containers: []corev1.Container{{Name: "coredns", Image: "registry.k8s.io/coredns/coredns:v1.11.3"}},
			}}},
		},
	}
	for _, o := range objs {
		if err := create(ctx, c, o); err != nil {
			return err
		}
	}
	return nil
}

// LeaveControlPlane is a control-plane VM going away: its static pods stop, its API server
// stops answering and its etcd member is gone. (The Node object stays: CAPI deletes it.)
func (w *Workloads) LeaveControlPlane(ctx context.Context, namespace, cluster, node string) error {
	c, ok := w.Client(namespace, cluster)
	if !ok {
		return nil
	}
	name := workloadName(namespace, cluster)
	for _, comp := range []string{"etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager"} {
		p := staticPod(comp, node)
		if err := c.Delete(ctx, p); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	if w.mux.HasEtcdMember(name, "etcd-"+node) {
		if err := w.mux.DeleteEtcdMember(name, "etcd-"+node); err != nil {
			return err
		}
	}
	if w.mux.HasAPIServer(name, "kube-apiserver-"+node) {
		if err := w.mux.DeleteAPIServer(name, "kube-apiserver-"+node); err != nil {
			return err
		}
	}
	return nil
}
