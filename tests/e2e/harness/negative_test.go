package harness

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// mutedRows is a negative control that holds: the muted shim's False, the backstop's recycle at
// ~171 s after the fault (180 s backstop), the baseline's at ~62 s.
func mutedRows(mode string) (Row, Row) {
	mhc, mhcConds, readAs := MHCRecommended, []string(nil), ""
	if mode == "condition" {
		mhc, readAs = MHCLegacy, "v1beta2"
	}
	muted := Row{
		Scenario: "1c-worker-nic-down", Mode: ModeShimObserve, ShimMode: "observe", ShimModeSource: "forced", MHC: mhc,
		MHCReadAs: readAs, MHCMachineConditions: mhcConds, Converged: true, SecondsFaultToRecycle: at(171.4),
		RecycledMachines: 1, BackstopSeconds: 180, DeadlineSeconds: 300, RecorderSteps: 1400, SecretLeaks: []string{},
		Causality: []CausalChain{{
			Machine: "s1co-md-0-abc", Fault: "nic-down",
			ShimFalse: at(18.3), ShimReason: "GuestNetworkSilent", ShimFalseBy: ShimFieldManager, ShimFalseReasons: []string{"GuestNetworkSilent"},
			ConditionByAtMark: ShimFieldManager,
			MHCMarked:         at(171.2), MHCReason: MHCReasonNodeStartupTimeout,
			MHCMessage: "Health check failed:\n  * Node failed to report startup in 3m0s",
			Deleting:   at(171.4),
		}},
	}
	baseline := Row{Scenario: muted.Scenario, Mode: ModeBaseline, MHC: MHCDefault, Converged: true, SecondsFaultToRecycle: at(61.8), RecycledMachines: 1, RecorderSteps: 900}
	return muted, baseline
}

func TestNegativeControlHoldsForAMutedShim(t *testing.T) {
	for _, mode := range []string{"annotate", "condition"} {
		m, b := mutedRows(mode)
		if f := NegativeControlFailures(m, b, mode); len(f) != 0 {
			t.Errorf("%s: %v", mode, f)
		}
	}
}

// Each way the control could pass on nothing makes it fail, naming what it saw instead.
func TestNegativeControlFailsForTheWrongReasons(t *testing.T) {
	cases := []struct {
		name, mode, want string
		edit             func(m, b *Row)
	}{
		{"the recorder dropped one step", "annotate", "the muted row's recorder dropped 1 of 1400 step(s) (41.2s: list Machines: context deadline exceeded)", func(m, b *Row) {
			m.RecorderFailedSteps, m.RecorderErrors = 1, []string{"41.2s: list Machines: context deadline exceeded"}
		}},
		{"the baseline's recorder dropped a step", "condition", "the baseline row's recorder dropped 1 of 900", func(m, b *Row) {
			b.RecorderFailedSteps, b.RecorderErrors = 1, []string{"12.0s: list KubeadmControlPlanes: connection refused"}
		}},
		{"a recorder that never ran", "annotate", "recorder ran no step", func(m, b *Row) { m.RecorderSteps = 0 }},
		{"observe mode, not recycled", "condition", "the muted row's faulty Machine was not recycled: the MHC backstop never acted", func(m, b *Row) {
			m.Converged, m.SecondsFaultToRecycle, m.RecycledMachines = false, nil, 0
			m.Causality[0].MHCMarked, m.Causality[0].MHCReason, m.Causality[0].MHCMessage, m.Causality[0].Deleting = nil, "", "", nil
		}},
		{"condition mode, a foreign writer of the condition", "condition", "s1co-md-0-abc: CloudStackVMHealthy=False was written by field manager \"kubectl-patch\", not the muted shim's \"capc-health-shim\"", func(m, b *Row) {
			m.Causality[0].ShimFalseBy, m.Causality[0].ConditionByAtMark = "kubectl-patch", "kubectl-patch"
		}},
		{"the shim was not muted (annotate)", "annotate", "causality (annotate mode) did not fail with \"s1co-md-0-abc: the remediate annotation was never seen\"", func(m, b *Row) {
			c := &m.Causality[0]
			c.Annotated, c.AnnotatedBy, c.MHCMarked, c.MHCReason, c.MHCMessage, c.Deleting = at(24), ShimFieldManager, at(24.2), "HasRemediateAnnotation", "Health check failed: marked for remediation via cluster.x-k8s.io/remediate-machine annotation", at(24.4)
			m.SecondsFaultToRecycle = at(24.4)
		}},
		{"causality fails, but not at the missing link", "annotate", "causality (annotate mode) did not fail with \"s1co-md-0-abc: the remediate annotation was never seen\"", func(m, b *Row) {
			// Someone else annotated it; the MHC's backstop came first anyway.
			m.Causality[0].Annotated, m.Causality[0].AnnotatedBy = at(30), "kubectl-annotate"
		}},
		{"the MHC acted on the observed condition", "condition", "not by its NodeStartupTimeout backstop", func(m, b *Row) {
			c := &m.Causality[0]
			c.MHCMarked, c.MHCReason, c.MHCMessage = at(25), MHCReasonUnhealthyMachine, "Health check failed:\n  * Condition "+ShimConditionType+" on Machine is reporting status False with reason GuestNetworkSilent for more than 6s"
		}},
		{"the MHC lists the condition", "condition", "lists CloudStackVMHealthy=False under unhealthyMachineConditions", func(m, b *Row) {
			m.MHCMachineConditions = []string{ShimConditionType + "=False"}
		}},
		{"the MHC was not read back", "condition", "not read back as v1beta2", func(m, b *Row) { m.MHCReadAs = "" }},
		{"another timer than the row's backstop", "annotate", "does not name the row's 180s backstop", func(m, b *Row) {
			m.Causality[0].MHCMessage = "Health check failed: Node failed to report startup in 1m0s"
		}},
		{"the muted shim published nothing", "annotate", "the muted shim never said False: nothing was muted", func(m, b *Row) { m.Causality[0].ShimFalse = nil }},
		{"speed within the ratio", "annotate", "speed did not fail by its ratio bound", func(m, b *Row) { b.SecondsFaultToRecycle = at(250) }},
		{"no baseline recycle", "condition", "the baseline recycled nothing", func(m, b *Row) { b.SecondsFaultToRecycle = nil }},
		{"the shim not in observe mode", "annotate", "not observe", func(m, b *Row) { m.ShimMode = "annotate" }},
		{"an orphan left", "annotate", "the muted row is not clean: false recycles 0, orphan VMs 1", func(m, b *Row) { m.OrphanVMs = 1 }},
		{"deleted before the MHC marked it", "condition", "deleted (100.0s) before the MHC marked it", func(m, b *Row) { m.Causality[0].Deleting = at(100) }},
		{"no faulty Machine", "annotate", "no faulty Machine", func(m, b *Row) { m.Causality = nil }},
	}
	for _, tc := range cases {
		m, b := mutedRows(tc.mode)
		tc.edit(&m, &b)
		f := NegativeControlFailures(m, b, tc.mode)
		if !strings.Contains(strings.Join(f, "\n"), tc.want) {
			t.Errorf("%s: failures %q, want one naming %q", tc.name, f, tc.want)
		}
	}
}

func TestConditionManagerReadsTheStatusSubresource(t *testing.T) {
	entry := func(manager, apiVersion, subresource, fields string) metav1.ManagedFieldsEntry {
		return metav1.ManagedFieldsEntry{Manager: manager, APIVersion: apiVersion, Subresource: subresource, Operation: metav1.ManagedFieldsOperationApply, FieldsV1: &metav1.FieldsV1{Raw: []byte(fields)}}
	}
	ours := `{"f:status":{"f:conditions":{"k:{\"type\":\"CloudStackVMHealthy\"}":{".":{},"f:lastTransitionTime":{},"f:message":{},"f:reason":{},"f:status":{},"f:type":{}}}}}`
	oursV1beta1 := `{"f:status":{"f:v1beta2":{"f:conditions":{"k:{\"type\":\"CloudStackVMHealthy\"}":{".":{},"f:reason":{},"f:status":{},"f:type":{}}}}}}`
	capi := `{"f:status":{"f:conditions":{"k:{\"type\":\"HealthCheckSucceeded\"}":{".":{},"f:status":{},"f:type":{}}}}}`
	cases := []struct {
		name    string
		managed []metav1.ManagedFieldsEntry
		want    string
	}{
		{"v1beta2 writer", []metav1.ManagedFieldsEntry{entry("manager", "cluster.x-k8s.io/v1beta2", "status", capi), entry(ShimFieldManager, "cluster.x-k8s.io/v1beta2", "status", ours)}, ShimFieldManager},
		{"v1beta1 writer (CAPI v1.9 layout)", []metav1.ManagedFieldsEntry{entry(ShimFieldManager, "cluster.x-k8s.io/v1beta1", "status", oursV1beta1)}, ShimFieldManager},
		{"a v1beta1 entry's status.conditions is another list", []metav1.ManagedFieldsEntry{entry(ShimFieldManager, "cluster.x-k8s.io/v1beta1", "status", ours)}, ""},
		{"not the status subresource", []metav1.ManagedFieldsEntry{entry(ShimFieldManager, "cluster.x-k8s.io/v1beta2", "", ours)}, ""},
		{"a foreign writer", []metav1.ManagedFieldsEntry{entry("kubectl-patch", "cluster.x-k8s.io/v1beta2", "status", ours)}, "kubectl-patch"},
		{"shared", []metav1.ManagedFieldsEntry{entry(ShimFieldManager, "cluster.x-k8s.io/v1beta2", "status", ours), entry("kubectl-patch", "cluster.x-k8s.io/v1beta2", "status", ours)}, "capc-health-shim,kubectl-patch"},
		{"only another condition", []metav1.ManagedFieldsEntry{entry("manager", "cluster.x-k8s.io/v1beta2", "status", capi)}, ""},
		{"a second writer of the reason only", []metav1.ManagedFieldsEntry{entry(ShimFieldManager, "cluster.x-k8s.io/v1beta2", "status", ours),
			entry("kubectl-patch", "cluster.x-k8s.io/v1beta2", "status", `{"f:status":{"f:conditions":{"k:{\"type\":\"CloudStackVMHealthy\"}":{"f:reason":{}}}}}`)}, "capc-health-shim,kubectl-patch"},
		{"the key alone is no ownership", []metav1.ManagedFieldsEntry{entry("kubectl-patch", "cluster.x-k8s.io/v1beta2", "status", `{"f:status":{"f:conditions":{"k:{\"type\":\"CloudStackVMHealthy\"}":{".":{},"f:type":{}}}}}`)}, ""},
	}
	for _, tc := range cases {
		if got := ConditionManager(tc.managed, ShimConditionType); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
