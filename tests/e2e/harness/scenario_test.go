package harness

import (
	"testing"
	"time"
)

func TestScoreRecycles(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	injections := []Injection{
		{Machine: "silent", Fault: "nic-down", At: at(10)},
		{Machine: "errored", Fault: "error", At: at(5)},
		{Machine: "slow", Fault: "slow-boot", At: at(5)},
	}
	machines := []MachineRecord{
		{Name: "silent", MHCUnhealthy: at(40), Deleting: at(40)}, // remediated: 30 s
		{Name: "errored", Deleting: at(30)},                      // deleted by CAPC, no MHC: still its recycle, 25 s
		{Name: "slow", MHCUnhealthy: at(60), Deleting: at(60)},   // benign behaviour remediated: false recycle
		{Name: "rolled", Deleting: at(50), MHCUnhealthy: at(52)}, // rollout first, MHC saw the Node gone later
		{Name: "late", MHCUnhealthy: at(100), Deleting: at(100)}, // after teardown began
		{Name: "healthy"},
	}
	s := ScoreRecycles(injections, machines, at(90))
	if s.Recycled != 3 || s.FalseRecycles != 1 {
		t.Fatalf("recycled %d, false %d, want 3 and 1 (notes %v)", s.Recycled, s.FalseRecycles, s.Notes)
	}
	if s.FirstFaultToRecycle == nil || *s.FirstFaultToRecycle != 25 {
		t.Fatalf("first fault→recycle %v, want 25 s", s.FirstFaultToRecycle)
	}
	if len(s.Faults) != 3 || len(s.Notes) != 1 || s.Notes[0] != "false recycle: slow" {
		t.Fatalf("faults %v notes %v", s.Faults, s.Notes)
	}
	if none := ScoreRecycles(nil, machines[3:], at(90)); none.Recycled != 0 || none.FirstFaultToRecycle != nil {
		t.Fatalf("without faults: %+v", none)
	}
}

func TestRemediatedNeedsTheMHCFirst(t *testing.T) {
	t0 := time.Now()
	cases := []struct {
		rec  MachineRecord
		want bool
	}{
		{MachineRecord{}, false},
		{MachineRecord{Deleting: t0}, false},
		{MachineRecord{Deleting: t0, MHCUnhealthy: t0}, true},
		{MachineRecord{Deleting: t0, MHCUnhealthy: t0.Add(-time.Second)}, true},
		{MachineRecord{Deleting: t0, MHCUnhealthy: t0.Add(time.Second)}, false},
	}
	for i, c := range cases {
		if got := c.rec.Remediated(); got != c.want {
			t.Errorf("case %d: Remediated() = %v, want %v", i, got, c.want)
		}
	}
}

func TestResultDelta(t *testing.T) {
	before := map[string]any{"by_command": map[string]any{
		"listVirtualMachines": map[string]any{"200": 10.0, "429": 1.0},
	}}
	after := map[string]any{"by_command": map[string]any{
		"listVirtualMachines":  map[string]any{"200": 14.0, "429": 1.0, "503": 2.0},
		"deployVirtualMachine": map[string]any{"200": 3.0},
	}}
	got := resultDelta(before, after)
	if len(got) != 2 || got["200"] != 7 || got["503"] != 2 {
		t.Fatalf("delta %v, want 200:7 503:2 (unchanged 429 dropped)", got)
	}
}

func TestShimDurationsAreScaledAndAtLeastASecond(t *testing.T) {
	if got := scaled(60*time.Second, 0.1); got != "6s" {
		t.Errorf("60s × 0.1 = %s", got)
	}
	if got := scaled(2*time.Second, 0.1); got != "1s" {
		t.Errorf("2s × 0.1 = %s, want the 1 s floor", got)
	}
	args := ShimArgs(ShimConfig{Namespace: "ns", APIURL: "http://x/client/api", Scale: 0.1}, "127.0.0.1:1")
	want := map[string]string{"--poll-interval": "3s", "--escalation-delay": "6s", "--stats-interval": "6s", "--transition-grace": "90s", "--orphan-grace": "90s", "--remnant-grace": "90s", "--endpoint-credentials": "http://x/client/api=ns/" + ShimSecret}
	for i := 0; i+1 < len(args); i++ {
		if v, ok := want[args[i]]; ok {
			if args[i+1] != v {
				t.Errorf("%s %s, want %s", args[i], args[i+1], v)
			}
			delete(want, args[i])
		}
	}
	if len(want) != 0 {
		t.Errorf("flags missing: %v", want)
	}
}

// The module zips' webhook manifests load with unique configuration names and only served paths.
func TestWebhookManifestsLoadWithUniqueNames(t *testing.T) {
	files, err := webhookManifests(false)
	if err != nil {
		t.Fatal(err)
	}
	// Process A of the CAPI v1.13 stack serves CAPC's alone.
	capcOnly, err := webhookManifests(true)
	if err != nil {
		t.Fatal(err)
	}
	if len(capcOnly) != 1 || capcOnly[0] != files[3] {
		t.Fatalf("CAPC-only manifests %v, want just %s", capcOnly, files[3])
	}
	muts, vals, err := loadWebhooks(files)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	hooks := 0
	for _, m := range muts {
		names[m.Name] = true
		hooks += len(m.Webhooks)
		for _, w := range m.Webhooks {
			if !servedWebhook(w.ClientConfig) {
				t.Errorf("%s: unserved webhook %s kept", m.Name, w.Name)
			}
		}
	}
	for _, v := range vals {
		names[v.Name] = true
		hooks += len(v.Webhooks)
	}
	if len(names) != len(muts)+len(vals) || len(muts) != 4 || len(vals) != 4 {
		t.Fatalf("%d mutating + %d validating configurations, %d distinct names: %v", len(muts), len(vals), len(names), names)
	}
	if hooks < 20 {
		t.Fatalf("only %d webhooks loaded", hooks)
	}
}
