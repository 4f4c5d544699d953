package harness

import (
	"encoding/json"
	"strings"
	"testing"
)

// What /status scorecard looks like as the shim serializes it (verdict::scorecard::Outcome:
// `kind` internally tagged by `outcome`, recycled_by externally tagged).
const statusScorecard = `{"scorecard": {"since": "2026-12-06T07:00:00Z", "settle_seconds": 60, "following": 1,
 "totals": {"would-have-saved": {"count": 1, "seconds": 44}, "missed": {"count": 1, "seconds": 0}},
 "by_reason": {}, "groups": {}, "uneventful": 2, "untracked": 0,
 "recent": [
  {"machine": "e2e-s1-baseline/s1b-md-0-a", "labels": {"cluster": "e2e-s1-baseline/s1b"}, "mode": "Observe",
   "kind": {"outcome": "would-have-saved", "saved_secs": 44, "recycled_by": {"mhc": "node-startup-timeout"}},
   "reason": "GuestNetworkSilent", "evidence": "0 KiB", "at": "2026-12-06T07:01:05.123456Z"},
  {"machine": "e2e-s5-baseline/s5b-md-0-slow", "labels": {}, "mode": "Observe",
   "kind": {"outcome": "missed", "shim_said": "healthy-with-traffic", "trigger": "node-startup-timeout"},
   "reason": "VMHealthy", "evidence": "", "at": "2026-12-06T07:02:00Z"},
  {"machine": "other/x", "labels": {}, "mode": "Observe", "kind": {"outcome": "would-have-saved", "saved_secs": 3, "recycled_by": "hand"},
   "reason": "", "evidence": "", "at": "2026-12-06T07:02:00Z"}
 ],
 "window_start": "2026-12-06T07:00:00Z", "window_seconds": 60480, "baselines": [], "warnings": []}}`

func parsed(t *testing.T, ns string) *ScorecardRecord {
	t.Helper()
	var st shimStatus
	if err := json.Unmarshal([]byte(statusScorecard), &st); err != nil || st.Scorecard == nil {
		t.Fatalf("decode /status scorecard: %v", err)
	}
	return record(st.Scorecard, ns)
}

func TestScorecardRecordKeepsTheRunsOwnOutcomes(t *testing.T) {
	r := parsed(t, "e2e-s1-baseline")
	if len(r.Outcomes) != 1 || r.Following != 1 || r.Uneventful != 2 || r.Totals["would-have-saved"] != 1 || r.SettleSeconds != 60 {
		t.Fatalf("record %+v", r)
	}
	o, ok := r.Outcome("s1b-md-0-a")
	if !ok || o.Outcome != "would-have-saved" || o.SavedSecs == nil || *o.SavedSecs != 44 || o.RecycledBy != RecycledByNodeStartupTimeout {
		t.Fatalf("outcome %+v", o)
	}
	m, _ := parsed(t, "e2e-s5-baseline").Outcome("s5b-md-0-slow")
	if m.Outcome != "missed" || m.ShimSaid != "healthy-with-traffic" || m.Trigger != "node-startup-timeout" {
		t.Fatalf("missed %+v", m)
	}
	if h, _ := parsed(t, "other").Outcome("x"); h.RecycledBy != "hand" {
		t.Fatalf("by hand %+v", h)
	}
}

func f(v float64) *float64 { return &v }
func i(v int64) *int64     { return &v }

func observedBaseline(card *ScorecardRecord) Row {
	return Row{Scenario: "1-worker-nic-down", CAPIVersion: "v1.9.6", Mode: ModeBaseline, MHC: MHCDefault, ShimObserver: true,
		Faults: []string{"nic-down on w1"}, SecondsFaultToRecycle: f(64), Scorecard: card}
}

func TestCompareSavingsFailsWithoutTheScorecard(t *testing.T) {
	shim := Row{Scenario: "1-worker-nic-down", CAPIVersion: "v1.9.6", Mode: ModeShim, MHC: MHCRecommended, SecondsFaultToRecycle: f(21)}
	saved := func(n int64) *ScorecardRecord {
		return &ScorecardRecord{Outcomes: []ScorecardOutcome{{Machine: "w1", Outcome: "would-have-saved", SavedSecs: i(n), RecycledBy: RecycledByNodeStartupTimeout}}}
	}
	// 43 s measured (64 − 21): 44 s is within 20 %.
	c, fails := CompareSavings(observedBaseline(saved(44)), shim)
	if len(fails) != 0 || len(c) != 1 || c[0].Measured != 43 || c[0].Observed != 44 {
		t.Fatalf("a matching saving failed: %v %+v", fails, c)
	}
	for name, base := range map[string]Row{
		"scorecard switched off": observedBaseline(nil),
		"empty scorecard":        observedBaseline(&ScorecardRecord{}),
		"no observer":            {Mode: ModeBaseline, Faults: []string{"nic-down on w1"}, SecondsFaultToRecycle: f(64)},
		"25 % off":               observedBaseline(saved(54)),
		"nothing saved":          observedBaseline(saved(0)),
		"another outcome": observedBaseline(&ScorecardRecord{Outcomes: []ScorecardOutcome{
			{Machine: "w1", Outcome: "missed", ShimSaid: "no-evidence", Trigger: "node-startup-timeout"}}}),
		"recycled by hand": observedBaseline(&ScorecardRecord{Outcomes: []ScorecardOutcome{
			{Machine: "w1", Outcome: "would-have-saved", SavedSecs: i(43), RecycledBy: "hand"}}}),
	} {
		if _, fails := CompareSavings(base, shim); len(fails) == 0 {
			t.Errorf("%s: passed", name)
		}
	}
	noRecycle := observedBaseline(saved(44))
	noRecycle.SecondsFaultToRecycle = nil
	if _, fails := CompareSavings(noRecycle, shim); len(fails) == 0 {
		t.Errorf("no baseline recycle: passed")
	}
}

func TestSlowHealthyJudgesFailWithoutTheScorecard(t *testing.T) {
	shim := Row{Mode: ModeShim, Faults: []string{"slow-boot on w1"}, Scorecard: &ScorecardRecord{Uneventful: 2, Totals: map[string]int{}}}
	if fails := SlowHealthyShimFailures(shim, 2); len(fails) != 0 {
		t.Fatalf("a clean shim run failed: %v", fails)
	}
	for name, card := range map[string]*ScorecardRecord{
		"switched off":       nil,
		"empty":              {},
		"still following":    {Uneventful: 1, Following: 1},
		"a false alarm":      {Uneventful: 1, Totals: map[string]int{"false-alarm": 1}, Outcomes: []ScorecardOutcome{{Machine: "w1", Outcome: "false-alarm"}}},
		"slow one recovered": {Uneventful: 1, Totals: map[string]int{"recovered": 1}, Outcomes: []ScorecardOutcome{{Machine: "w1", Outcome: "recovered"}}},
	} {
		r := shim
		r.Scorecard = card
		if fails := SlowHealthyShimFailures(r, 2); len(fails) == 0 {
			t.Errorf("shim run, %s: passed", name)
		}
	}

	missed := ScorecardOutcome{Machine: "w1", Outcome: "missed", ShimSaid: "healthy-with-traffic", Trigger: "node-startup-timeout", Reason: "VMHealthy"}
	printed := []string{"2026-12-06 07:02:00  e2e-s5-baseline/w1  missed  VMHealthy  " + MissedHealthy + " (traffic rising); MHC: NodeStartupTimeout  -"}
	base := Row{Mode: ModeBaseline, ShimObserver: true, Faults: []string{"slow-boot on w1"},
		Scorecard: &ScorecardRecord{Outcomes: []ScorecardOutcome{missed}, Printed: printed}}
	if fails := SlowHealthyBaselineFailures(base); len(fails) != 0 {
		t.Fatalf("the baseline's missed slow Machine failed: %v", fails)
	}
	noEvidence := missed
	noEvidence.ShimSaid = "no-evidence"
	for name, card := range map[string]*ScorecardRecord{
		"switched off":   nil,
		"empty":          {},
		"no evidence":    {Outcomes: []ScorecardOutcome{noEvidence}, Printed: printed},
		"not printed":    {Outcomes: []ScorecardOutcome{missed}},
		"a false alarm":  {Outcomes: []ScorecardOutcome{missed}, Printed: printed, Totals: map[string]int{"false-alarm": 1}},
		"another's line": {Outcomes: []ScorecardOutcome{missed}, Printed: []string{strings.Replace(printed[0], "/w1", "/w2", 1)}},
	} {
		r := base
		r.Scorecard = card
		if fails := SlowHealthyBaselineFailures(r); len(fails) == 0 {
			t.Errorf("baseline, %s: passed", name)
		}
	}
}

func TestMutedScorecardIsCheckedAgainstTheRecorder(t *testing.T) {
	// The recorder: False 15 s after the fault, deleted by the backstop at 182 s: 182 − 15 − 6 = 161.
	muted := Row{Mode: ModeShimObserve, TimeScale: TimeScale, Causality: []CausalChain{{Machine: "w1", ShimFalse: f(15), Deleting: f(182)}}}
	card := func(o ScorecardOutcome) *ScorecardRecord { return &ScorecardRecord{Outcomes: []ScorecardOutcome{o}} }
	muted.Scorecard = card(ScorecardOutcome{Machine: "w1", Outcome: "would-have-saved", SavedSecs: i(163), RecycledBy: RecycledByNodeStartupTimeout})
	if fails, shown := MutedScorecardFailures(muted); len(fails) != 0 || len(shown) != 1 {
		t.Fatalf("a matching muted row failed: %v %v", fails, shown)
	}
	for name, c := range map[string]*ScorecardRecord{
		"switched off": nil,
		"empty":        {},
		"far off":      card(ScorecardOutcome{Machine: "w1", Outcome: "would-have-saved", SavedSecs: i(100), RecycledBy: RecycledByNodeStartupTimeout}),
		"uneventful":   {Uneventful: 3},
	} {
		r := muted
		r.Scorecard = c
		if fails, _ := MutedScorecardFailures(r); len(fails) == 0 {
			t.Errorf("%s: passed", name)
		}
	}
}
