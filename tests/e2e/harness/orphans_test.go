package harness

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The shim's /status "orphans" entries decode with their RFC 3339 times and null fields.
func TestShimOrphanDecodes(t *testing.T) {
	doc := `{"api": {"mode": "annotate"}, "orphans": [
	  {"vm_id": "a1", "vm_name": "s8s-md-0-x", "vm_state": "Running", "scope": "http://sim/client/api domain=ROOT",
	   "cluster": "e2e-s8-shim/s8s", "cloudstack_machine": "e2e-s8-shim/s8s-md-0-x", "kind": "name-of-deleted",
	   "since": "2026-12-01T10:00:00.5Z", "reported_at": "2026-12-01T10:01:30.75Z", "why": "named after a CloudStackMachine that is gone"},
	  {"vm_id": "b2", "vm_name": "n", "vm_state": "Starting", "scope": "s", "cluster": null, "cloudstack_machine": "ns/n",
	   "kind": "instance-of-deleted", "since": "2026-12-01T10:00:00Z", "reported_at": null, "why": ""}]}`
	var st shimStatus
	if err := json.Unmarshal([]byte(doc), &st); err != nil {
		t.Fatal(err)
	}
	if st.Orphans == nil || len(*st.Orphans) != 2 {
		t.Fatalf("orphans %v", st.Orphans)
	}
	a, b := (*st.Orphans)[0], (*st.Orphans)[1]
	if !a.Reported() || a.ReportedAt.Sub(*a.Since) != 90250*time.Millisecond || a.cluster() != "e2e-s8-shim/s8s" {
		t.Errorf("first entry %+v", a)
	}
	if b.Reported() || b.cluster() != "—" {
		t.Errorf("second entry %+v", b)
	}
	var none shimStatus
	if err := json.Unmarshal([]byte(`{"api": {}}`), &none); err != nil || none.Orphans != nil {
		t.Errorf("a /status without orphans: %v %v", none.Orphans, err)
	}
}

func TestOrphanWatchScoresDeliberateAndFalseOrphans(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	tp := func(s float64) *time.Time { v := at(s); return &v }
	w := newOrphanWatch(nil, nil, time.Second)
	w.Expect(DeliberateOrphan{VMID: "a", VMName: "va", Kind: OrphanNameOfDeleted, Race: RaceDeployInFlight, CloudStackMachine: "ns/va", GoneAt: at(10)})
	w.Expect(DeliberateOrphan{VMID: "b", VMName: "vb", Kind: OrphanInstanceOfDeleted, Race: RaceFinalizerRemoved, CloudStackMachine: "ns/vb", GoneAt: at(20)})
	suspectA := ShimOrphan{VMID: "a", VMName: "va", Kind: OrphanNameOfDeleted, CloudStackMachine: "ns/va", Since: tp(11)}
	reportedA := suspectA
	reportedA.ReportedAt = tp(101)
	reportedB := ShimOrphan{VMID: "b", VMName: "vb", Kind: OrphanInstanceOfDeleted, CloudStackMachine: "ns/vb", Since: tp(22), ReportedAt: tp(112)}
	falseC := ShimOrphan{VMID: "c", VMName: "vc", Kind: OrphanNameTaken, CloudStackMachine: "ns/vc", Since: tp(30), ReportedAt: tp(120)}
	suspectD := ShimOrphan{VMID: "d", VMName: "vd", Kind: OrphanNameOfDeleted, Since: tp(40)}

	w.observe(at(5), nil, -1, false)
	if !w.Absent() || w.Listed() != -1 {
		t.Fatalf("absent %v listed %d", w.Absent(), w.Listed())
	}
	w.observe(at(12), []ShimOrphan{suspectA}, 2, true)
	w.observe(at(101.2), []ShimOrphan{reportedA, suspectD}, 3, true)
	w.observe(at(112.3), []ShimOrphan{reportedA, reportedB, falseC, suspectD}, 1, true)
	if got := w.Listed(); got != 4 {
		t.Fatalf("listed %d", got)
	}
	if _, ok := w.Reported("b"); !ok {
		t.Fatal("b not reported")
	}
	w.NoteEvent("a", "VM a is an orphan")
	w.NoteCommand("a", "cmk destroy virtualmachine id=a expunge=true")
	w.NoteDestroyed("a", at(130))
	w.NoteDestroyed("b", at(130))
	w.observe(at(132), []ShimOrphan{falseC}, 0, true)
	sc := w.Score()
	if sc.Reported != 3 || sc.False != 1 || sc.OpenAtEnd != 1 || sc.MaxSuspects != 3 {
		t.Fatalf("reported %d false %d open %d suspects %d, want 3 1 1 3", sc.Reported, sc.False, sc.OpenAtEnd, sc.MaxSuspects)
	}
	if len(sc.Records) != 4 {
		t.Fatalf("records %+v", sc.Records)
	}
	a := sc.Records[0]
	if a.VMID != "a" || !a.Reported || a.Kind != OrphanNameOfDeleted || *a.SecondsToReport != 91 || *a.SecondsToReportSeen != 91.2 ||
		*a.SecondsGraceApplied != 90 || *a.SecondsToClear != 2 || a.Event == "" || a.Command == "" || a.ExpectedCloudStackMachine != "ns/va" {
		t.Errorf("record a %+v", a)
	}
	if b := sc.Records[1]; b.VMID != "b" || *b.SecondsToReport != 92 || *b.SecondsToReportSeen != 92.3 || b.Event != "" {
		t.Errorf("record b %+v", b)
	}
	// Then the VMs listed without being orphaned on purpose, in the order first listed.
	if c := sc.Records[3]; c.VMID != "c" || c.Race != "" || !c.Reported || c.SecondsToClear != nil {
		t.Errorf("record c %+v", c)
	}
	if d := sc.Records[2]; d.VMID != "d" || d.Reported || d.Kind != OrphanNameOfDeleted {
		t.Errorf("record d (a suspect never reported) %+v", d)
	}
	if sum := strings.Join(OrphanSummary(sc.Records), "\n"); !strings.Contains(sum, "c (vc; FALSE ORPHAN): reported name-taken") {
		t.Errorf("summary:\n%s", sum)
	}
}

func TestOrphanReportBoundIsGracePlusTwoJitteredPolls(t *testing.T) {
	c := ShimConfig{Scale: TimeScale}
	if c.OrphanGrace() != 90*time.Second || c.PollInterval() != 3*time.Second {
		t.Fatalf("grace %s poll %s", c.OrphanGrace(), c.PollInterval())
	}
	if got := OrphanReportBound(c); got != 96600*time.Millisecond {
		t.Fatalf("bound %s, want 96.6s", got)
	}
}

func TestOrphanEventForMatchesTheClusterAndTheVM(t *testing.T) {
	ev := func(typ, reason, kind, name, msg string) corev1.Event {
		return corev1.Event{Type: typ, Reason: reason, InvolvedObject: corev1.ObjectReference{Kind: kind, Name: name}, Message: msg}
	}
	events := []corev1.Event{
		ev("Normal", OrphanEventReason, "Cluster", "s8s", "VM id-1 is an orphan"),
		ev("Warning", OrphanEventReason, "Machine", "s8s", "VM id-1 is an orphan"),
		ev("Warning", OrphanEventReason, "Cluster", "other", "VM id-1 is an orphan"),
		ev("Warning", "CloudStackVMHealthy", "Cluster", "s8s", "VM id-1"),
		ev("Warning", OrphanEventReason, "Cluster", "s8s", "CloudStack VM s8s-md-0-b (id-2) left behind"),
	}
	if _, ok := OrphanEventFor(events, "s8s", "id-1", "s8s-md-0-a"); ok {
		t.Error("matched an Event of another type, object or reason")
	}
	if msg, ok := OrphanEventFor(events, "s8s", "id-2", ""); !ok || !strings.Contains(msg, "id-2") {
		t.Errorf("by id: %q %v", msg, ok)
	}
	if _, ok := OrphanEventFor(events, "s8s", "id-9", "s8s-md-0-b"); !ok {
		t.Error("by name")
	}
	if n := CountOrphanEvents(events, "s8s"); n != 1 {
		t.Errorf("count %d", n)
	}
}

func TestCmkDestroyCommands(t *testing.T) {
	out := `VM ID                                  NAME         KIND
0f9c2d3e-1111-4a5b-9c8d-222233334444   s8s-md-0-a   name-of-deleted
  cmk destroy virtualmachine id=0f9c2d3e-1111-4a5b-9c8d-222233334444 expunge=true
  cmk destroy virtualmachine id=abc expunge=false
cmk destroy virtualmachine id=5e6f expunge=true
cmk destroy virtualmachine id=5e6f expunge=true
`
	got := CmkDestroyCommands(out)
	if len(got) != 2 || got["5e6f"] != "cmk destroy virtualmachine id=5e6f expunge=true" ||
		got["0f9c2d3e-1111-4a5b-9c8d-222233334444"] == "" {
		t.Fatalf("%v", got)
	}
}
