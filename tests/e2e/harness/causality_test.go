package harness

import (
	"strings"
	"testing"
	"time"
)

func at(s float64) *float64 { return &s }

const condType = "CloudStackVMHealthy"

func annotateChain() CausalChain {
	return CausalChain{
		Machine: "m1", Fault: "nic-down",
		ShimFalse: at(18), ShimReason: "GuestNetworkSilent", ShimFalseBy: ShimFieldManager, ShimFalseReasons: []string{"GuestNetworkSilent"},
		Annotated: at(24), AnnotatedBy: ShimFieldManager,
		MHCMarked: at(24.2), MHCReason: "HasRemediateMachineAnnotation", MHCMessage: "Marked for remediation via remediate-machine annotation",
		Deleting: at(24.4),
	}
}

func conditionChain() CausalChain {
	// As CAPI v1.13.5 writes it (machinehealthcheck_targets.go:126-142).
	return CausalChain{
		Machine: "m1", Fault: "nic-down", ShimFalse: at(18), ShimReason: "GuestNetworkSilent",
		ShimFalseBy: ShimFieldManager, ShimFalseReasons: []string{"GuestNetworkSilent"}, ConditionByAtMark: ShimFieldManager,
		MHCMarked: at(25), MHCReason: "UnhealthyMachine",
		MHCMessage: "Health check failed:\n  * Condition " + condType + " on Machine is reporting status False with reason GuestNetworkSilent for more than 6s",
		Deleting:   at(25.2),
	}
}

func TestCausalityHoldsForTheShimsPath(t *testing.T) {
	if f := CausalityFailures([]CausalChain{annotateChain()}, "annotate", condType); len(f) != 0 {
		t.Errorf("annotate: %v", f)
	}
	if f := CausalityFailures([]CausalChain{conditionChain()}, "condition", condType); len(f) != 0 {
		t.Errorf("condition: %v", f)
	}
	// The MHC and the owner seen in the same poll as the annotation still count as in order.
	c := annotateChain()
	c.MHCMarked, c.Deleting = at(24), at(24)
	if f := CausalityFailures([]CausalChain{c}, "annotate", condType); len(f) != 0 {
		t.Errorf("same poll: %v", f)
	}
	// The v1beta1 form of the MHC's verdict (reason and findings joined by "; "), and a node
	// finding next to the condition's, still name the condition.
	c = conditionChain()
	c.MHCMessage = "Condition " + condType + " on Machine is reporting status False with reason GuestNetworkSilent for more than 6s; Node failed to report startup in 3m0s"
	if f := CausalityFailures([]CausalChain{c}, "condition", condType); len(f) != 0 {
		t.Errorf("v1beta1 message: %v", f)
	}
	// A reason the shim moved to while False (VMNotRunning → GuestNetworkSilent) counts.
	c = conditionChain()
	c.ShimFalseReasons = []string{"VMNotRunning", "GuestNetworkSilent"}
	if f := CausalityFailures([]CausalChain{c}, "condition", condType); len(f) != 0 {
		t.Errorf("second reason: %v", f)
	}
}

// Each way a recycle can happen without the shim causing it is refused, with the reason named.
func TestCausalityRefusesEveryOtherPath(t *testing.T) {
	cases := []struct {
		name, mode, want string
		edit             func(*CausalChain)
	}{
		{"backstop timer (observe mode)", "annotate", "remediate annotation was never seen", func(c *CausalChain) {
			c.Annotated, c.AnnotatedBy, c.MHCReason, c.MHCMessage = nil, "", "NodeStartupTimeout", "Node failed to report startup in 3m0s"
		}},
		{"annotation by someone else", "annotate", "field manager \"kubectl-annotate\"", func(c *CausalChain) { c.AnnotatedBy = "kubectl-annotate" }},
		{"MHC acted before the annotation", "annotate", "came before the remediate annotation", func(c *CausalChain) { c.MHCMarked = at(20) }},
		{"annotation before the False", "annotate", "came before the shim's False", func(c *CausalChain) { c.Annotated = at(10) }},
		{"MHC's own timer though annotated", "annotate", "another reason than the remediate annotation: NodeStartupTimeout", func(c *CausalChain) { c.MHCReason = "NodeStartupTimeout" }},
		{"False by someone else (annotate)", "annotate", "CloudStackVMHealthy=False was written by field manager \"kubectl-patch\"", func(c *CausalChain) { c.ShimFalseBy = "kubectl-patch" }},
		{"no False at all", "annotate", "the shim's False was never seen", func(c *CausalChain) { c.ShimFalse = nil }},
		{"never deleted", "annotate", "the owner's deletion was never seen", func(c *CausalChain) { c.Deleting = nil }},
		{"deleted before the MHC marked it (CAPC on Error)", "annotate", "the owner's deletion (20.0s after the fault) came before", func(c *CausalChain) { c.Deleting = at(20) }},
		{"condition mode, node-startup timer", "condition", "the MHC never named CloudStackVMHealthy: it marked the Machine NodeStartupTimeout", func(c *CausalChain) {
			*c = conditionChain()
			c.MHCReason, c.MHCMessage = "NodeStartupTimeout", "Health check failed:\n  * Node failed to report startup in 3m0s"
		}},
		{"condition mode, foreign writer of the condition", "condition", "CloudStackVMHealthy=False was written by field manager \"kubectl-patch\", not the shim's", func(c *CausalChain) {
			*c = conditionChain()
			c.ShimFalseBy = "kubectl-patch"
		}},
		{"condition mode, no owner found", "condition", "written by field manager \"\"", func(c *CausalChain) {
			*c = conditionChain()
			c.ShimFalseBy = ""
		}},
		{"condition mode, the entry taken over before the MHC read it", "condition", "when the MHC marked it, CloudStackVMHealthy was owned by field manager \"rogue\"", func(c *CausalChain) {
			*c = conditionChain()
			c.ConditionByAtMark = "rogue"
		}},
		{"condition mode, another Machine condition", "condition", "the MHC never named CloudStackVMHealthy: its findings are", func(c *CausalChain) {
			*c = conditionChain()
			c.MHCMessage = "Health check failed:\n  * Condition EtcdMemberHealthy on Machine is reporting status False with reason X for more than 6s"
		}},
		{"condition mode, the name only inside another finding", "condition", "the MHC never named CloudStackVMHealthy", func(c *CausalChain) {
			*c = conditionChain()
			c.MHCMessage = "Health check failed:\n  * Condition Other on Machine is reporting status False with reason X for more than 6s (see Condition " + condType + " on Machine is reporting status False)"
		}},
		{"condition mode, a condition whose name only starts with the shim's", "condition", "the MHC never named CloudStackVMHealthy: its findings are", func(c *CausalChain) {
			*c = conditionChain()
			c.MHCMessage = "Health check failed:\n  * Condition " + condType + "V2 on Machine is reporting status False with reason GuestNetworkSilent for more than 6s"
		}},
		{"condition mode, named at Unknown", "condition", "not at False with a reason the shim wrote", func(c *CausalChain) {
			*c = conditionChain()
			c.MHCMessage = "Health check failed:\n  * Condition " + condType + " on Machine is reporting status Unknown with reason GuestNetworkSilent for more than 6s"
		}},
		{"condition mode, a reason the shim never wrote", "condition", "not at False with a reason the shim wrote", func(c *CausalChain) {
			*c = conditionChain()
			c.MHCMessage = "Health check failed:\n  * Condition " + condType + " on Machine is reporting status False with reason ForgedByHand for more than 6s"
		}},
		{"condition mode, MHC before the False", "condition", "came before the shim's False", func(c *CausalChain) {
			*c = conditionChain()
			c.MHCMarked = at(10)
		}},
		{"condition mode, never deleted", "condition", "the owner's deletion was never seen", func(c *CausalChain) {
			*c = conditionChain()
			c.Deleting = nil
		}},
		{"observe mode", "observe", "never acts", func(c *CausalChain) {}},
	}
	for _, tc := range cases {
		c := annotateChain()
		tc.edit(&c)
		f := CausalityFailures([]CausalChain{c}, tc.mode, condType)
		if !strings.Contains(strings.Join(f, "; "), tc.want) {
			t.Errorf("%s: failures %v, want one naming %q", tc.name, f, tc.want)
		}
	}
	if f := CausalityFailures(nil, "annotate", condType); len(f) == 0 {
		t.Error("no faulty Machine passed")
	}
}

func TestMHCFindingsParseWholeFindings(t *testing.T) {
	msg := "Health check failed:\n  * Condition " + condType + " on Machine is reporting status False with reason GuestNetworkSilent for more than 6s\n  * Node failed to report startup in 3m0s"
	f := MHCFindings(msg)
	if len(f) != 1 || f[0] != (MachineFinding{Condition: condType, Status: "False", Reason: "GuestNetworkSilent", Timeout: "6s"}) {
		t.Errorf("findings %+v", f)
	}
	if d, ok := NodeStartupFinding(msg); !ok || d != 3*time.Minute {
		t.Errorf("node startup %v %v", d, ok)
	}
	if d, ok := NodeStartupFinding("Health check failed: Node failed to report startup in 1m0s"); !ok || d != time.Minute {
		t.Errorf("v1.9 form: %v %v", d, ok)
	}
	if f := MHCFindings("Marked for remediation via remediate-machine annotation"); len(f) != 0 {
		t.Errorf("annotation message: %+v", f)
	}
}

func TestCausalChainsAreTimedFromTheFault(t *testing.T) {
	t0 := time.Now()
	inj := []Injection{{Machine: "w1", Fault: "nic-down", At: t0}, {Machine: "w2", Fault: "slow-boot", At: t0}}
	recs := []MachineRecord{{Name: "w1", ShimFalse: t0.Add(18 * time.Second), Deleting: t0.Add(25 * time.Second)}, {Name: "w2"}}
	ch := CausalChains(inj, recs)
	if len(ch) != 1 || ch[0].Machine != "w1" || *ch[0].ShimFalse != 18 || *ch[0].Deleting != 25 || ch[0].Annotated != nil {
		t.Errorf("chains %+v", ch)
	}
}

func TestSpeedBound(t *testing.T) {
	backstop := 180 * time.Second
	if f := SpeedFailures(at(22), at(62), backstop); len(f) != 0 {
		t.Errorf("22 s vs 62 s: %v", f)
	}
	// A backstop-only recycle fails both bounds; a slow shim fails the ratio.
	if f := SpeedFailures(at(170), at(62), backstop); len(f) != 2 {
		t.Errorf("170 s vs 62 s: %v", f)
	}
	if f := SpeedFailures(at(50), at(62), backstop); len(f) != 1 || !strings.Contains(f[0], "0.7 × the baseline") {
		t.Errorf("50 s vs 62 s: %v", f)
	}
	if f := SpeedFailures(nil, at(62), backstop); len(f) != 1 {
		t.Errorf("not recycled: %v", f)
	}
	if f := SpeedFailures(at(22), nil, backstop); len(f) != 1 {
		t.Errorf("no baseline: %v", f)
	}
}
