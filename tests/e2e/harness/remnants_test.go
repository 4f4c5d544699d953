package harness

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The watch scores an expected remnant reported in time, one reported late, one never
// reported, an object reported that the API server never showed so, and one reported with
// another reason or before its grace as false.
func TestRemnantWatchScoresExpectedLateAndFalse(t *testing.T) {
	w := newRemnantWatch(nil, nil, "ns", nil, time.Second)
	w.grace, w.poll = 90*time.Second, 3*time.Second
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	stuck := func(kind, name string, at time.Time) RemnantCandidate {
		return RemnantCandidate{Key: remnantKey(kind, "ns", name), Reason: RemnantStuckDeleting, Since: at, Finalizers: []string{"f"}}
	}
	cands := []RemnantCandidate{stuck("Cluster", "c", t0), stuck("Machine", "m", t0), stuck("CloudStackMachine", "csm", t0), stuck("MachineSet", "early", t0.Add(30*time.Second))}
	rem := func(kind, name, reason string) ShimRemnant {
		return ShimRemnant{Kind: kind, Namespace: "ns", Name: name, Reason: reason}
	}
	// Before the grace: the shim already reports MachineSet early (false: before its grace).
	w.observe(t0.Add(60*time.Second), cands, []ShimRemnant{rem("MachineSet", "early", RemnantStuckDeleting)}, true)
	if p := w.Progress("ns"); p.pending != 4 || len(p.expected) != 0 {
		t.Fatalf("progress within the grace: %+v", p)
	}
	// Past the grace: Cluster and Machine reported at once; KubeadmConfig x never a candidate;
	// the Machine also under another reason.
	at := t0.Add(92 * time.Second)
	w.observe(at, cands, []ShimRemnant{rem("Cluster", "c", RemnantStuckDeleting), rem("Machine", "m", RemnantStuckDeleting), rem("Machine", "m", RemnantOwnerGone), rem("KubeadmConfig", "x", RemnantClusterGone)}, true)
	// The CloudStackMachine only long after the bound.
	w.observe(t0.Add(200*time.Second), cands, []ShimRemnant{rem("CloudStackMachine", "csm", RemnantStuckDeleting)}, true)
	sc := w.Score()
	if sc.Expected != 4 || sc.Reported != 2 || sc.False != 3 {
		t.Fatalf("score %+v: %v", sc, RemnantSummary(sc.Records))
	}
	if cur := w.current("ns"); len(cur) != 1 || cur[0].Name != "csm" {
		t.Errorf("current %v", cur)
	}
	if w.current("other") != nil {
		t.Error("another namespace's list is not empty")
	}
	ev := func(msg string) corev1.Event {
		return corev1.Event{Reason: RemnantEventReason, Type: corev1.EventTypeWarning, Message: msg}
	}
	events := []corev1.Event{ev("CloudStackMachine ns/m is left behind (stuck-deleting): x")}
	if _, ok := RemnantEventFor(events, "Machine ns/m", RemnantStuckDeleting); ok {
		t.Error("the CloudStackMachine's Event counted for the Machine of the same name")
	}
	if _, ok := RemnantEventFor(append(events, ev("Machine ns/m is left behind (stuck-deleting): y")), "Machine ns/m", RemnantStuckDeleting); !ok {
		t.Error("the Machine's Event not found")
	}
	if !RemnantInCommandOutput("x\n# Cluster ns/c: deleting\n", "Cluster ns/c") || RemnantInCommandOutput("# Cluster ns/cc: x", "Cluster ns/c") {
		t.Error("command output match")
	}
}
