package harness

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	clusterv1 "sigs.k8s.io/cluster-api/api/v1beta1"
)

// An owner created after the collector listed its kind is still there: its objects are not
// garbage (the race that deleted a new Machine's KubeadmConfig and CloudStackMachine).
func TestOwnersGoneAsksTheAPIServer(t *testing.T) {
	scheme, err := NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	machine := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m1", UID: "uid-live"}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(machine).Build()
	owned := func(name string, uid types.UID) *unstructured.Unstructured {
		o := &unstructured.Unstructured{}
		o.SetNamespace("ns")
		o.SetName("cfg")
		o.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: clusterv1.GroupVersion.String(), Kind: "Machine", Name: name, UID: uid}})
		return o
	}
	for _, tc := range []struct {
		name  string
		owner string
		uid   types.UID
		gone  bool
	}{
		{"owner exists", "m1", "uid-live", false},
		{"same name, another object", "m1", "uid-old", true},
		{"owner deleted", "m0", "uid-x", true},
	} {
		gone, err := ownersGone(context.Background(), c, owned(tc.owner, tc.uid))
		if err != nil || gone != tc.gone {
			t.Errorf("%s: gone=%v err=%v, want gone=%v", tc.name, gone, err, tc.gone)
		}
	}
}
