package scenarios

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1b2 "sigs.k8s.io/cluster-api-provider-cloudstack/api/v1beta2"
	infrav1b3 "sigs.k8s.io/cluster-api-provider-cloudstack/api/v1beta3"
	clusterv1 "sigs.k8s.io/cluster-api/api/v1beta1"

	"github.com/capc-health-shim/tests/e2e/harness"
)

func checkConversion(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := h.Mgmt.Direct
	ns := "e2e-harness-check"
	if err := harness.CreateAll(ctx, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	tmpl := &infrav1b3.CloudStackMachineTemplate{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "conv"},
		Spec: infrav1b3.CloudStackMachineTemplateSpec{Template: infrav1b3.CloudStackMachineTemplateResource{
			Spec: infrav1b3.CloudStackMachineSpec{
				Offering: infrav1b3.CloudStackResourceIdentifier{Name: harness.SimOffering},
				Template: infrav1b3.CloudStackResourceIdentifier{Name: harness.SimTemplate},
			},
		}},
	}
	if err := harness.CreateAll(ctx, c, tmpl); err != nil {
		t.Fatal(err)
	}
	defer c.Delete(ctx, tmpl)
	old := &infrav1b2.CloudStackMachineTemplate{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(tmpl), old); err != nil {
		t.Fatalf("read v1beta3 object as v1beta2 (conversion webhook): %v", err)
	}
	if old.Spec.Spec.Spec.Offering.Name != harness.SimOffering || old.Spec.Spec.Spec.Template.Name != harness.SimTemplate {
		t.Fatalf("v1beta2 view lost fields: %+v", old.Spec.Spec.Spec)
	}
	// The Machine defaulting webhook fills in the bootstrap config namespace and the cluster label.
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "defaults"},
		Spec: clusterv1.MachineSpec{
			ClusterName: "nope", Version: ptr.To("v1.31.3"),
			Bootstrap:         clusterv1.Bootstrap{DataSecretName: ptr.To("x")},
			InfrastructureRef: corev1.ObjectReference{APIVersion: infrav1b3.GroupVersion.String(), Kind: "CloudStackMachine", Name: "x"},
		},
	}
	if err := harness.CreateAll(ctx, c, m); err != nil {
		t.Fatal(err)
	}
	defer c.Delete(ctx, m)
	if m.Labels[clusterv1.ClusterNameLabel] != "nope" || m.Spec.InfrastructureRef.Namespace != ns {
		t.Fatalf("Machine defaulting webhook did not run: labels %v, infraRef ns %q", m.Labels, m.Spec.InfrastructureRef.Namespace)
	}
	if !h.Stack.V1Beta2() {
		return
	}
	// CAPI v1.13 (process B) converts: the v1beta1 Machine written above reads back as v1beta2,
	// whose contract reference names an apiGroup instead of an apiVersion; and back as v1beta1,
	// the apiVersion comes from CAPC's CRD contract label (process B's apiVersion getter).
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("cluster.x-k8s.io/v1beta2")
	u.SetKind("Machine")
	if err := c.Get(ctx, client.ObjectKeyFromObject(m), u); err != nil {
		t.Fatalf("read the Machine as v1beta2 (CAPI v1.13 conversion webhook): %v", err)
	}
	ref, _, _ := unstructured.NestedStringMap(u.Object, "spec", "infrastructureRef")
	if ref["apiGroup"] != infrav1b3.GroupVersion.Group || ref["kind"] != "CloudStackMachine" || ref["apiVersion"] != "" {
		t.Fatalf("v1beta2 infrastructureRef = %v, want apiGroup %s and no apiVersion", ref, infrav1b3.GroupVersion.Group)
	}
	back := &clusterv1.Machine{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(m), back); err != nil {
		t.Fatal(err)
	}
	if back.Spec.InfrastructureRef.APIVersion != infrav1b3.GroupVersion.String() {
		t.Fatalf("v1beta1 view of a v1beta2 Machine: infrastructureRef apiVersion %q, want %s", back.Spec.InfrastructureRef.APIVersion, infrav1b3.GroupVersion)
	}
}
