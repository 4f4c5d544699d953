package scenarios

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1b3 "sigs.k8s.io/cluster-api-provider-cloudstack/api/v1beta3"
	clusterv1 "sigs.k8s.io/cluster-api/api/v1beta1"

	"github.com/capc-health-shim/tests/e2e/harness"
)

// TestManagementConditionOwner checks, on the stack's real API server and CAPI conversion, what
// the causality assertion reads: the owner of the CloudStackVMHealthy entry from the managedFields
// of the Machine's status subresource, as the recorder sees it (a v1beta1 read). The shim's
// server-side apply (its layout on this stack) makes it the owner; a foreign writer that changes
// the entry takes it over, and the causality check then names that writer.
func TestManagementConditionOwner(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := h.Mgmt.Direct
	ns := "e2e-harness-owner"
	if err := harness.CreateAll(ctx, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatal(err)
	}
	m := &clusterv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "owned"},
		Spec: clusterv1.MachineSpec{
			ClusterName: "nope", Version: ptr.To("v1.31.3"),
			Bootstrap:         clusterv1.Bootstrap{DataSecretName: ptr.To("x")},
			InfrastructureRef: corev1.ObjectReference{APIVersion: infrav1b3.GroupVersion.String(), Kind: "CloudStackMachine", Name: "x"},
		},
	}
	if err := harness.CreateAll(ctx, c, m); err != nil {
		t.Fatal(err)
	}
	defer c.Delete(context.Background(), m)

	// The body the shim applies (crates/capi-model/src/condition.rs apply_body): v1beta2's
	// status.conditions where v1beta2 is stored, v1beta1's status.v1beta2.conditions on CAPI v1.9.
	// Each apply has a lastTransitionTime of its own (whole seconds, as the shim writes them):
	// server-side apply shares a field among appliers of one value, so two writes within the
	// same second would share it.
	ltt := time.Now().UTC().Add(-time.Hour)
	apply := func(manager, status, reason string) {
		t.Helper()
		ltt = ltt.Add(time.Minute)
		entry := map[string]any{"type": harness.ShimConditionType, "status": status, "reason": reason, "message": "set by " + manager,
			"lastTransitionTime": ltt.Format(time.RFC3339)}
		u := &unstructured.Unstructured{Object: map[string]any{"kind": "Machine",
			"metadata": map[string]any{"namespace": ns, "name": m.Name}}}
		if h.Stack.V1Beta2() {
			u.SetAPIVersion("cluster.x-k8s.io/v1beta2")
			u.Object["status"] = map[string]any{"conditions": []any{entry}}
		} else {
			u.SetAPIVersion("cluster.x-k8s.io/v1beta1")
			u.Object["status"] = map[string]any{"v1beta2": map[string]any{"conditions": []any{entry}}}
		}
		if err := c.Status().Patch(ctx, u, client.Apply, client.FieldOwner(manager), client.ForceOwnership); err != nil {
			t.Fatalf("apply %s=%s as %s: %v", harness.ShimConditionType, status, manager, err)
		}
	}
	owner := func() string {
		t.Helper()
		got := &clusterv1.Machine{}
		if err := c.Get(ctx, client.ObjectKeyFromObject(m), got); err != nil {
			t.Fatal(err)
		}
		return harness.ConditionManager(got.ManagedFields, harness.ShimConditionType)
	}

	// The shim's True, then a foreign writer's False: every value of the entry changes hands.
	apply(harness.ShimFieldManager, "True", "VMRunning")
	if got := owner(); got != harness.ShimFieldManager {
		t.Fatalf("after the shim's apply the entry is owned by %q, want %q", got, harness.ShimFieldManager)
	}
	apply("kubectl-patch", "False", "SetByHand")
	got := owner()
	if got != "kubectl-patch" {
		t.Fatalf("after a foreign writer's False the entry is owned by %q, want %q", got, "kubectl-patch")
	}
	chain := harness.CausalChain{Machine: m.Name, ShimFalse: ptr.To(1.0), ShimFalseBy: got, ShimFalseReasons: []string{"SetByHand"},
		MHCMarked: ptr.To(2.0), MHCReason: harness.MHCReasonUnhealthyMachine, ConditionByAtMark: got,
		MHCMessage: "Health check failed:\n  * Condition " + harness.ShimConditionType + " on Machine is reporting status False with reason SetByHand for more than 6s",
		Deleting:   ptr.To(3.0)}
	failures := harness.CausalityFailures([]harness.CausalChain{chain}, "condition", harness.ShimConditionType)
	if !strings.Contains(strings.Join(failures, "; "), `written by field manager "kubectl-patch"`) {
		t.Fatalf("a False written by %q: causality failures %q, want one naming the writer", got, failures)
	}
	// The shim's True then False again (taking back every value), then a foreign writer keeping
	// the status but changing the reason: the status is shared, the reason the foreign writer's —
	// no longer the shim's alone.
	apply(harness.ShimFieldManager, "True", "VMRunning")
	apply(harness.ShimFieldManager, "False", "GuestNetworkSilent")
	if got := owner(); got != harness.ShimFieldManager {
		t.Fatalf("after the shim's False the entry is owned by %q, want %q", got, harness.ShimFieldManager)
	}
	apply("kubectl-patch", "False", "SetByHand")
	if got := owner(); got != harness.ShimFieldManager+",kubectl-patch" {
		t.Fatalf("after a foreign writer changed the reason the entry is owned by %q, want both", got)
	}
	t.Logf("foreign writer %q: causality fails with %q", got, failures)
}
