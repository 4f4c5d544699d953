package harness

import (
	"context"
	"fmt"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1b3 "sigs.k8s.io/cluster-api-provider-cloudstack/api/v1beta3"
	clusterv1 "sigs.k8s.io/cluster-api/api/v1beta1"
	bootstrapv1 "sigs.k8s.io/cluster-api/bootstrap/kubeadm/api/v1beta1"
	controlplanev1 "sigs.k8s.io/cluster-api/controlplane/kubeadm/api/v1beta1"
)

// The names the e2e scenario of cloudstack-sim defines (cloudstack-fixtures/scenarios/capc-e2e.json).
const (
	SimScenario       = "capc-e2e.json"
	SimZone           = "zone1"
	SimNetwork        = "shared-net"
	SimOffering       = "small"
	SimTemplate       = "ubuntu-2204-kube-v1.31.3"
	SimAdminKey       = "e2e-admin-key"
	SimAdminSecret    = "e2e-admin-secret"
	SimReadOnlyKey    = "e2e-shim-ro-key"
	SimReadOnlySecret = "e2e-shim-ro-secret"
	// The guest probe's own key: an account whose Admin-type role allows only listRouters,
	// runDiagnostics and queryAsyncJobResult (hack/cloudstack-role/create-role.py --probe).
	SimProbeKey       = "e2e-shim-probe-key"
	SimProbeSecret    = "e2e-shim-probe-secret"
	KubernetesVersion = "v1.31.3"
	CredentialsSecret = "cloudstack-credentials"
	ShimSecret        = "capc-health-shim-cloudstack"
	ProbeSecret       = "capc-health-shim-probe"
)

// ClusterSpec is one workload cluster as a user would write it from CAPC's cluster template.
type ClusterSpec struct {
	Namespace, Name string
	ControlPlanes   int32
	Workers         int32
	Host            string // control-plane endpoint (the in-memory listener)
	Port            int
	APIURL          string
}

// MHCSpec is a MachineHealthCheck selecting every Machine of the cluster.
type MHCSpec struct {
	NodeStartupTimeout time.Duration
	UnhealthyTimeout   time.Duration // Node Ready False/Unknown
	// ShimConditionTimeout, when set, adds the shim's condition (CloudStackVMHealthy=False) to
	// unhealthyMachineConditions: condition mode (v1beta2 MHC only).
	ShimConditionTimeout time.Duration
}

// noDrain keeps CAPI from draining: the in-memory API has no eviction subresource (§E.5.7).
var noDrain = map[string]string{clusterv1.ExcludeNodeDrainingAnnotation: "", clusterv1.ExcludeWaitForNodeVolumeDetachAnnotation: ""}

// ClusterObjects are the objects of CAPC's cluster-template.yaml for a shared network.
func ClusterObjects(s ClusterSpec) []client.Object {
	ns := s.Namespace
	cpName := s.Name + "-control-plane"
	mdName := s.Name + "-md-0"
	nodeReg := bootstrapv1.NodeRegistrationOptions{
		Name:             "{{ local_hostname }}",
		KubeletExtraArgs: map[string]string{"provider-id": "cloudstack:///'{{ ds.meta_data.instance_id }}'"},
	}
	infraTemplate := func(name string) *infrav1b3.CloudStackMachineTemplate {
		return &infrav1b3.CloudStackMachineTemplate{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: infrav1b3.CloudStackMachineTemplateSpec{Template: infrav1b3.CloudStackMachineTemplateResource{
				Spec: infrav1b3.CloudStackMachineSpec{
					Offering: infrav1b3.CloudStackResourceIdentifier{Name: SimOffering},
					Template: infrav1b3.CloudStackResourceIdentifier{Name: SimTemplate},
				},
			}},
		}
	}
	return []client.Object{
		&corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: CredentialsSecret},
			StringData: map[string]string{"api-url": s.APIURL, "api-key": SimAdminKey, "secret-key": SimAdminSecret, "verify-ssl": "false"},
		},
		&clusterv1.Cluster{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: s.Name},
			Spec: clusterv1.ClusterSpec{
				ClusterNetwork: &clusterv1.ClusterNetwork{
					Pods:          &clusterv1.NetworkRanges{CIDRBlocks: []string{"192.168.0.0/16"}},
					ServiceDomain: "cluster.local",
				},
				InfrastructureRef: &corev1.ObjectReference{APIVersion: infrav1b3.GroupVersion.String(), Kind: "CloudStackCluster", Name: s.Name},
				ControlPlaneRef:   &corev1.ObjectReference{APIVersion: controlplanev1.GroupVersion.String(), Kind: "KubeadmControlPlane", Name: cpName},
			},
		},
		&infrav1b3.CloudStackCluster{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: s.Name},
			Spec: infrav1b3.CloudStackClusterSpec{
				ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: s.Host, Port: int32(s.Port)},
				FailureDomains: []infrav1b3.CloudStackFailureDomainSpec{{
					Name:        "fd1",
					ACSEndpoint: corev1.SecretReference{Name: CredentialsSecret, Namespace: ns},
					Zone:        infrav1b3.CloudStackZoneSpec{Name: SimZone, Network: infrav1b3.Network{Name: SimNetwork}},
				}},
			},
		},
		infraTemplate(cpName),
		&controlplanev1.KubeadmControlPlane{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: cpName},
			Spec: controlplanev1.KubeadmControlPlaneSpec{
				Replicas: ptr.To(s.ControlPlanes),
				Version:  KubernetesVersion,
				MachineTemplate: controlplanev1.KubeadmControlPlaneMachineTemplate{
					ObjectMeta:        clusterv1.ObjectMeta{Annotations: noDrain},
					InfrastructureRef: corev1.ObjectReference{APIVersion: infrav1b3.GroupVersion.String(), Kind: "CloudStackMachineTemplate", Name: cpName},
				},
				KubeadmConfigSpec: bootstrapv1.KubeadmConfigSpec{
					InitConfiguration:  &bootstrapv1.InitConfiguration{NodeRegistration: nodeReg},
					JoinConfiguration:  &bootstrapv1.JoinConfiguration{NodeRegistration: nodeReg},
					PreKubeadmCommands: []string{"swapoff -a"},
				},
			},
		},
		infraTemplate(mdName),
		&bootstrapv1.KubeadmConfigTemplate{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: mdName},
			Spec: bootstrapv1.KubeadmConfigTemplateSpec{Template: bootstrapv1.KubeadmConfigTemplateResource{
				Spec: bootstrapv1.KubeadmConfigSpec{
					JoinConfiguration:  &bootstrapv1.JoinConfiguration{NodeRegistration: nodeReg},
					PreKubeadmCommands: []string{"swapoff -a"},
				},
			}},
		},
		&clusterv1.MachineDeployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: mdName},
			Spec: clusterv1.MachineDeploymentSpec{
				ClusterName: s.Name,
				Replicas:    ptr.To(s.Workers),
				Template: clusterv1.MachineTemplateSpec{
					ObjectMeta: clusterv1.ObjectMeta{Annotations: noDrain},
					Spec: clusterv1.MachineSpec{
						ClusterName: s.Name,
						Version:     ptr.To(KubernetesVersion),
						Bootstrap: clusterv1.Bootstrap{ConfigRef: &corev1.ObjectReference{
							APIVersion: bootstrapv1.GroupVersion.String(), Kind: "KubeadmConfigTemplate", Name: mdName,
						}},
						InfrastructureRef: corev1.ObjectReference{APIVersion: infrav1b3.GroupVersion.String(), Kind: "CloudStackMachineTemplate", Name: mdName},
					},
				},
			},
		},
	}
}

// MachineHealthCheck selects every Machine of the cluster (CAPC's templates ship one for the
// control plane and one for workers; one for both is equivalent here).
func MachineHealthCheck(namespace, cluster string, s MHCSpec) *clusterv1.MachineHealthCheck {
	return &clusterv1.MachineHealthCheck{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: cluster + "-mhc"},
		Spec: clusterv1.MachineHealthCheckSpec{
			ClusterName: cluster,
			Selector:    metav1.LabelSelector{MatchLabels: map[string]string{clusterv1.ClusterNameLabel: cluster}},
			UnhealthyConditions: []clusterv1.UnhealthyCondition{
				{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Timeout: metav1.Duration{Duration: s.UnhealthyTimeout}},
				{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Timeout: metav1.Duration{Duration: s.UnhealthyTimeout}},
			},
			NodeStartupTimeout: &metav1.Duration{Duration: s.NodeStartupTimeout},
			MaxUnhealthy:       ptr.To(intstr.FromString("100%")),
		},
	}
}

// MachineHealthCheckV1Beta2 is the same MachineHealthCheck as CAPI v1.12+ users write it
// (cluster.x-k8s.io/v1beta2, checks.*Seconds), with the shim's condition among
// unhealthyMachineConditions when s.ShimConditionTimeout is set, as
// deploy/examples/mhc-condition-mode.yaml. Unstructured: this module links CAPI v1.9, which has
// no v1beta2 MachineHealthCheck type.
func MachineHealthCheckV1Beta2(namespace, cluster string, s MHCSpec) *unstructured.Unstructured {
	seconds := func(d time.Duration) int64 { return int64(d.Round(time.Second) / time.Second) }
	nodeConditions := []any{}
	for _, status := range []string{"False", "Unknown"} {
		nodeConditions = append(nodeConditions, map[string]any{"type": "Ready", "status": status, "timeoutSeconds": seconds(s.UnhealthyTimeout)})
	}
	checks := map[string]any{
		"nodeStartupTimeoutSeconds": seconds(s.NodeStartupTimeout),
		"unhealthyNodeConditions":   nodeConditions,
	}
	if s.ShimConditionTimeout > 0 {
		checks["unhealthyMachineConditions"] = []any{
			map[string]any{"type": ShimConditionType, "status": "False", "timeoutSeconds": seconds(s.ShimConditionTimeout)},
		}
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": clusterv1.GroupVersion.Group + "/v1beta2",
		"kind":       "MachineHealthCheck",
		"metadata":   map[string]any{"namespace": namespace, "name": cluster + "-mhc"},
		"spec": map[string]any{
			"clusterName": cluster,
			"selector":    map[string]any{"matchLabels": map[string]any{clusterv1.ClusterNameLabel: cluster}},
			"checks":      checks,
			"remediation": map[string]any{"triggerIf": map[string]any{"unhealthyLessThanOrEqualTo": "100%"}},
		},
	}}
	return u
}

// ShimConditionType is the condition the shim writes on Machines.
const ShimConditionType = "CloudStackVMHealthy"

// ShimCredentials is the operator's read-only key for the shim (deploy/examples), used through
// --endpoint-credentials instead of CAPC's admin key.
func ShimCredentials(namespace, apiURL string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: ShimSecret},
		StringData: map[string]string{"api-url": apiURL, "api-key": SimReadOnlyKey, "secret-key": SimReadOnlySecret, "verify-ssl": "false"},
	}
}

// ProbeCredentials is the guest probe's key for the shim (--probe-credentials): a Secret of its
// own, separate from the read-only key and from CAPC's.
func ProbeCredentials(namespace, apiURL string) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: ProbeSecret},
		StringData: map[string]string{"api-url": apiURL, "api-key": SimProbeKey, "secret-key": SimProbeSecret, "verify-ssl": "false"},
	}
}

// CreateAll creates objects in order, retrying while webhooks or CRD caches settle.
func CreateAll(ctx context.Context, c client.Client, objs ...client.Object) error {
	for _, o := range objs {
		o := o
		err := WaitFor(ctx, 30*time.Second, 250*time.Millisecond, fmt.Sprintf("create %T %s", o, o.GetName()), func() (bool, error) {
			if err := c.Create(ctx, o); err != nil {
				return false, err
			}
			return true, nil
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// Upgrade is what a user does to roll a cluster to a new Kubernetes version: bump the KCP's
// version and point the MachineDeployment at a new infrastructure template with the new version.
func Upgrade(ctx context.Context, c client.Client, namespace, cluster, version string) error {
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: cluster + "-control-plane"}, kcp); err != nil {
		return err
	}
	patch := client.MergeFrom(kcp.DeepCopy())
	kcp.Spec.Version = version
	if err := c.Patch(ctx, kcp, patch); err != nil {
		return fmt.Errorf("bump KCP version: %w", err)
	}
	mdName := cluster + "-md-0"
	old := &infrav1b3.CloudStackMachineTemplate{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: mdName}, old); err != nil {
		return err
	}
	next := &infrav1b3.CloudStackMachineTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: mdName + "-" + version},
		Spec:       old.Spec,
	}
	if err := CreateAll(ctx, c, next); err != nil {
		return err
	}
	md := &clusterv1.MachineDeployment{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: mdName}, md); err != nil {
		return err
	}
	patch = client.MergeFrom(md.DeepCopy())
	md.Spec.Template.Spec.Version = ptr.To(version)
	md.Spec.Template.Spec.InfrastructureRef.Name = next.Name
	if err := c.Patch(ctx, md, patch); err != nil {
		return fmt.Errorf("roll the MachineDeployment: %w", err)
	}
	return nil
}
