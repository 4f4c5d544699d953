package harness

import (
	"strings"
	"testing"
)

func TestShimArgsTurnTheProbeOnOnlyWithItsSecret(t *testing.T) {
	flag := func(args []string) string {
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "--probe-credentials" {
				return args[i+1]
			}
		}
		return ""
	}
	if got := flag(ShimArgs(ShimConfig{Namespace: "ns", APIURL: "http://x/client/api", Scale: 0.1}, "127.0.0.1:1")); got != "" {
		t.Errorf("probe on without a probe Secret: --probe-credentials %s", got)
	}
	if got := flag(ShimArgs(ShimConfig{Namespace: "ns", APIURL: "http://x/client/api", Scale: 0.1, ProbeSecret: ProbeSecret}, "127.0.0.1:1")); got != "ns/"+ProbeSecret {
		t.Errorf("--probe-credentials %q, want ns/%s", got, ProbeSecret)
	}
	if !ModeShimProbe.WithShim() || !ModeShimProbe.Probing() || ModeShim.Probing() || ModeBaseline.WithShim() {
		t.Error("modes: shim-probe runs the shim with the probe, shim without, baseline no shim")
	}
	if ModeShimProbe.clusterLetter() == ModeShim.clusterLetter() {
		t.Error("shim and shim-probe runs of a scenario would share cluster (and VM) names")
	}
}

func TestProbeEventsListWhatChanged(t *testing.T) {
	st := func(jobs, replies, noReplies, noEvidence int) *ProbeStatus {
		return &ProbeStatus{Enabled: true, Counts: ProbeCounts{JobsStarted: jobs, Replies: replies, NoReplies: noReplies, NoEvidence: noEvidence}}
	}
	if ev := probeEvents(nil, st(0, 0, 0, 0)); len(ev) != 0 {
		t.Errorf("nothing done yet: %v", ev)
	}
	ev := probeEvents(st(0, 0, 0, 0), st(2, 1, 0, 0))
	if len(ev) != 2 || !strings.Contains(ev[0], "first runDiagnostics job") || !strings.Contains(ev[1], "first ARP reply") {
		t.Errorf("first job and reply: %v", ev)
	}
	if ev := probeEvents(st(2, 1, 0, 0), st(5, 4, 0, 0)); len(ev) != 0 {
		t.Errorf("more replies are not news: %v", ev)
	}
	ev = probeEvents(st(5, 4, 0, 0), st(7, 4, 2, 1))
	if len(ev) != 2 || !strings.Contains(ev[0], "2 attempt(s) without an ARP reply, 2 in all") || !strings.Contains(ev[1], "without evidence") {
		t.Errorf("unanswered attempts: %v", ev)
	}
	refused := st(1, 0, 0, 0)
	refused.Refused = "The API runDiagnostics is denied for the account's role."
	if ev := probeEvents(st(1, 0, 0, 0), refused); len(ev) != 1 || !strings.Contains(ev[0], "REFUSED") {
		t.Errorf("refused: %v", ev)
	}
	if ev := probeEvents(refused, refused); len(ev) != 0 {
		t.Errorf("a refusal is listed once: %v", ev)
	}
}

func TestProbeRowsInTheReport(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	rows := []Row{
		{Scenario: "1-worker-nic-down", CAPIVersion: "v1.9.6", Mode: ModeBaseline, MHC: MHCDefault, SecondsFaultToRecycle: f(60)},
		{Scenario: "1-worker-nic-down", CAPIVersion: "v1.9.6", Mode: ModeShim, MHC: MHCRecommended, SecondsFaultToRecycle: f(22.2)},
		{Scenario: "1-worker-nic-down", CAPIVersion: "v1.9.6", Mode: ModeShimProbe, MHC: MHCRecommended, Converged: true, SecondsFaultToRecycle: f(15),
			ShimProbe: true, Faults: []string{"nic-down on s1p-md-0-abc"},
			ShimFalseMessages: []string{"s1p-md-0-abc: VM x is Running but no ARP reply for 10.10.0.5 from its virtual router r-1-VM to 3 attempts since …"},
			Probe:             &ProbeStatus{Enabled: true, Counts: ProbeCounts{JobsStarted: 12, Replies: 8, NoReplies: 4}}},
	}
	if ratio, base, ok := RecycleRatio(rows, rows[2]); !ok || base != 60 || ratio != 0.25 {
		t.Errorf("shim-probe ratio %v over %v (%v), want 0.25 over 60", ratio, base, ok)
	}
	if FaultyMachines(rows[2])[0] != "s1p-md-0-abc" {
		t.Errorf("faulty Machines %v", FaultyMachines(rows[2]))
	}
	if msg, ok := FalseMessageOf(rows[2], "s1p-md-0-abc"); !ok || !strings.Contains(msg, "no ARP reply") {
		t.Errorf("False message %q (%v)", msg, ok)
	}
	md := Markdown(rows)
	for _, want := range []string{
		"| v1.9.6 | 1-worker-nic-down | true | 15.0 | 0.25 | 22.2 | 0.37 | 12 | 8 | 4 | 0 | no | s1p-md-0-abc: VM x is Running but no ARP reply",
		"| v1.9.6 | — | 1-worker-nic-down | shim-probe | 15.0 | 60.0 | 0.25 |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report.md lacks %q:\n%s", want, md)
		}
	}
	if ProbeSection(rows[:2]) != "" {
		t.Error("a probe section without shim-probe rows")
	}
}
