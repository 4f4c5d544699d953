// Package scenarios runs the seed scenarios end to end: real CAPI + CAPC controllers,
// cloudstack-sim, simulated workload clusters, and capc-health-shim as its own process.
package scenarios

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capc-health-shim/tests/e2e/harness"
)

var h *harness.Harness

func TestMain(m *testing.M) {
	ctx := context.Background()
	var err error
	h, err = harness.Start(ctx, os.Stdout)
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e harness: %v\n", err)
		if h != nil {
			h.Stop()
		}
		os.Exit(1)
	}
	// Rows of this stack's earlier runs are dropped unless CAPC_E2E_KEEP_ROWS is set (to add
	// scenarios to a report run by run); the other CAPI stack's rows stay in the report.
	if os.Getenv("CAPC_E2E_KEEP_ROWS") == "" {
		if err := harness.DropRows(h.OutDir, h.Stack.StackKey()); err != nil {
			fmt.Fprintf(os.Stderr, "e2e rows: %v\n", err)
		}
	}
	code := m.Run()
	rows, err := harness.LoadRows(h.OutDir)
	if err == nil && len(rows) > 0 {
		err = harness.WriteReport(h.OutDir, rows)
		fmt.Printf("e2e: report %s (%d runs)\n", filepath.Join(h.OutDir, "report.md"), len(rows))
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "e2e report: %v\n", err)
		code = 1
	}
	h.Stop()
	os.Exit(code)
}

// run plays a scenario in the given runs concurrently (separate namespaces) and saves the rows.
func run(t *testing.T, sc harness.Scenario, runs ...[2]string) map[string]harness.Row {
	t.Helper()
	type result struct {
		key string
		row harness.Row
		err error
	}
	ch := make(chan result, len(runs))
	ctx, cancel := context.WithTimeout(context.Background(), sc.Deadline+sc.DuringWait+6*time.Minute)
	defer cancel()
	for _, r := range runs {
		r := r
		go func() {
			row, err := h.Run(ctx, sc, harness.Mode(r[0]), r[1])
			ch <- result{key: r[0] + "/" + r[1], row: row, err: err}
		}()
	}
	out := map[string]harness.Row{}
	for range runs {
		res := <-ch
		if res.err != nil {
			t.Fatalf("%s %s: harness error: %v", sc.Key, res.key, res.err)
		}
		if err := harness.SaveRow(h.OutDir, res.row); err != nil {
			t.Fatal(err)
		}
		out[res.key] = res.row
		t.Logf("%s %s: converged=%v ready=%s fault→recycle=%s recycled=%d false=%d orphans=%d orphans_reported=%d false_orphans=%d remnants_reported=%d/%d false_remnants=%d suspects_max=%s leftovers=%d notes=%v timeline=%s",
			sc.Key, res.key, res.row.Converged, fmtp(res.row.SecondsToReady), fmtp(res.row.SecondsFaultToRecycle),
			res.row.RecycledMachines, res.row.FalseRecycles, res.row.OrphanVMs, res.row.OrphansReported, res.row.FalseOrphans,
			res.row.RemnantsReported, res.row.RemnantsExpected, res.row.FalseRemnants,
			fmtInt(res.row.OrphanSuspectsMax), res.row.LeftoverObjects, res.row.Notes, res.row.Timeline)
		noFalseOrphans(t, sc.Key+" "+res.key, res.row)
		recorderComplete(t, sc.Key+" "+res.key, res.row)
		noFalseRemnants(t, sc.Key+" "+res.key, res.row)
	}
	return out
}

func fmtInt(p *int) string {
	if p == nil {
		return "—"
	}
	return fmt.Sprint(*p)
}

func fmtp(p *float64) string {
	if p == nil {
		return "—"
	}
	return fmt.Sprintf("%.1fs", *p)
}

const (
	shimRun     = "shim/" + harness.MHCRecommended
	probeRun    = "shim-probe/" + harness.MHCRecommended
	legacyRun   = "shim/" + harness.MHCLegacy
	baseRun     = "baseline/" + harness.MHCDefault
	baseNoMHC   = "baseline/" + harness.MHCNone
	shimMode    = string(harness.ModeShim)
	probeMode   = string(harness.ModeShimProbe)
	baseMode    = string(harness.ModeBaseline)
	recommended = harness.MHCRecommended
)

// clean asserts what every run must show: nothing orphaned, nothing left, nothing healthy recycled.
func clean(t *testing.T, name string, r harness.Row) {
	t.Helper()
	if r.OrphanVMs != 0 {
		t.Errorf("%s: %d orphan VMs", name, r.OrphanVMs)
	}
	if r.LeftoverObjects != 0 {
		t.Errorf("%s: %d objects left after deleting the cluster: %v", name, r.LeftoverObjects, r.Notes)
	}
	if len(r.SecretLeaks) != 0 {
		t.Errorf("%s: a CloudStack secret or signature was written out: %v", name, r.SecretLeaks)
	}
	if r.FalseRecycles != 0 {
		t.Errorf("%s: %d healthy Machines recycled: %v", name, r.FalseRecycles, r.Notes)
	}
	if r.ShimRan() {
		// The shim discovers its mode: annotate on CAPI v1.9, condition on v1.13 (v1beta2 MHC).
		want, source := "annotate", "auto"
		if h.Stack.V1Beta2() {
			want = "condition"
		}
		if r.Mode == harness.ModeShimObserve || r.ShimObserver {
			want, source = "observe", "forced"
		}
		if r.ShimMode != want || r.ShimModeSource != source {
			t.Errorf("%s: shim mode %q (%s) on CAPI %s, want %q (%s)", name, r.ShimMode, r.ShimModeSource, r.CAPIVersion, want, source)
		}
	}
}

// recorderComplete asserts, for every row of every scenario (run calls it), that the recorder
// read the namespace and that none of its reads failed: a dropped read can hide a link of the
// causal chain or a false recycle.
func recorderComplete(t *testing.T, name string, r harness.Row) {
	t.Helper()
	if r.RecorderSteps == 0 {
		t.Errorf("%s: the recorder took no step", name)
	}
	if r.RecorderFailedSteps > 0 {
		t.Errorf("%s: the recorder failed %d of %d steps: %v (timeline %s)", name, r.RecorderFailedSteps, r.RecorderSteps, r.RecorderErrors, r.Timeline)
	}
}

// noFalseOrphans asserts, for every row of every scenario (run calls it), that the shim
// reported no VM as an orphan that the scenario did not orphan on purpose, and that a shim row
// had the orphan report to read at all.
func noFalseOrphans(t *testing.T, name string, r harness.Row) {
	t.Helper()
	if r.FalseOrphans != 0 {
		t.Errorf("%s: the shim reported %d VM(s) as orphans that nothing orphaned: %v (timeline %s)", name, r.FalseOrphans, harness.OrphanSummary(r.OrphanReports), r.Timeline)
	}
	if r.ShimRan() {
		for _, n := range r.Notes {
			if n == harness.NoteNoOrphanReport {
				t.Errorf("%s: %s", name, n)
			}
		}
	} else if r.OrphansReported != 0 {
		t.Errorf("%s: %d orphans reported in a run without the shim", name, r.OrphansReported)
	}
}

// noFalseRemnants asserts, for every row of every scenario (run calls it), that the shim's
// remnant report named no object the API server did not show stuck deleting or dangling past
// the grace (or with another reason), and that a shim row had the report to read.
func noFalseRemnants(t *testing.T, name string, r harness.Row) {
	t.Helper()
	if r.FalseRemnants != 0 {
		t.Errorf("%s: the shim reported %d object(s) as remnants that were not: %v (timeline %s)", name, r.FalseRemnants, harness.RemnantSummary(r.RemnantReports), r.Timeline)
	}
	if r.ShimRan() {
		for _, n := range r.Notes {
			if n == harness.NoteNoRemnantReport {
				t.Errorf("%s: %s", name, n)
			}
		}
	} else if r.RemnantsReported != 0 || r.FalseRemnants != 0 {
		t.Errorf("%s: remnants reported in a run without the shim", name)
	}
}

// requireCaused: the shim caused the faulty Machine's recycle — its False, then (annotate) the
// remediate annotation under its field manager, then the MHC marking the Machine for that
// reason, then the owner deleting it, in that order (harness.CausalityFailures).
func requireCaused(t *testing.T, name string, r harness.Row) {
	t.Helper()
	requireCausedAs(t, name, r, r.ShimMode)
}

// requireCausedAs is requireCaused judged on the path of mode ("annotate" or "condition"),
// which may differ from the mode the shim discovered: in auto mode on CAPI v1.13 a Machine
// whose MHC does not list the condition gets the annotation (src/k8s/coverage.rs).
func requireCausedAs(t *testing.T, name string, r harness.Row, mode string) {
	t.Helper()
	for _, f := range harness.CausalityFailures(r.Causality, mode, harness.ShimConditionType) {
		t.Errorf("%s: not caused by the shim (%s path): %s (timeline %s)", name, mode, f, r.Timeline)
	}
}

// requireFaster: the shim row's fault → recycle beats the baseline's of the same run by the
// bound of harness.SpeedFailures.
func requireFaster(t *testing.T, name string, r, baseline harness.Row) {
	t.Helper()
	for _, f := range speedFailures(r, baseline) {
		t.Errorf("%s: too slow: %s", name, f)
	}
	if ratio, _, ok := harness.RecycleRatio([]harness.Row{baseline}, r); ok {
		t.Logf("%s: fault → recycle %.1fs vs baseline %.1fs: ratio %.2f (asserted ≤ %.1f), backstop %.0fs", name, *r.SecondsFaultToRecycle, *baseline.SecondsFaultToRecycle, ratio, harness.SpeedRatioMax, r.BackstopSeconds)
	}
}

func speedFailures(r, baseline harness.Row) []string {
	return harness.SpeedFailures(r.SecondsFaultToRecycle, baseline.SecondsFaultToRecycle, time.Duration(r.BackstopSeconds*float64(time.Second)))
}

// requireMHCActedOnCondition: in condition mode the faulty Machine was recycled because the MHC
// read the shim's condition. Its evidence (the Machine read as v1beta2 when the MHC marked it)
// must show CloudStackVMHealthy=False in status.conditions and the MHC's HealthCheckSucceeded=False
// naming that condition. In annotate mode (CAPI v1.9) the annotation path is covered by
// requireRecycled and the timeline.
func requireMHCActedOnCondition(t *testing.T, name string, r harness.Row) {
	t.Helper()
	if !h.Stack.V1Beta2() {
		return
	}
	if len(r.ConditionEvidence) == 0 {
		t.Errorf("%s: no Machine was marked unhealthy by the MHC after a False verdict (verdicts %v, timeline %s)", name, r.ShimVerdicts, r.Timeline)
	}
	for _, e := range r.ConditionEvidence {
		landed, marked, ok := strings.Cut(e, "; when the MHC marked it: ")
		// Read as v1beta2 the condition is at status.conditions; read as v1beta1 in the same
		// step (the Machine already gone from the v1beta2 list), the same list is served at
		// status.v1beta2.conditions. The evidence names which.
		inV1beta2 := strings.Contains(landed, " at status.conditions (") ||
			(strings.Contains(landed, " at status.v1beta2.conditions (") && strings.Contains(landed, "[read as v1beta1 in the same step"))
		if !ok || !strings.Contains(landed, harness.ShimConditionType+"=False/") || !inV1beta2 {
			t.Errorf("%s: the shim's False is not in the v1beta2 status.conditions: %s", name, e)
		}
		if !(strings.Contains(marked, "HealthCheckSucceeded=False/UnhealthyMachine at status.conditions (Health check failed:") ||
			strings.Contains(marked, "HealthCheckSucceeded=False/UnhealthyMachine at status.v1beta2.conditions (Health check failed:")) ||
			!strings.Contains(marked, "Condition "+harness.ShimConditionType+" on Machine is reporting status False") {
			t.Errorf("%s: the MHC's verdict does not name the shim's condition: %s", name, e)
		}
	}
}

// requireProbed: the run had the guest probe on and it did its work — jobs ran, healthy Machines
// answered ARP, the key was not refused — and the faulty Machine's False names the unanswered
// ARP probe ("no ARP reply"), as the recorder read the condition's message when the shim first
// said False. How fast is reported (report.md), not asserted.
func requireProbed(t *testing.T, name string, r harness.Row) {
	t.Helper()
	if !r.ShimProbe {
		t.Errorf("%s: the row does not say the probe was on", name)
	}
	p := r.Probe
	if p == nil {
		t.Errorf("%s: no probe state read from the shim's /status (notes %v)", name, r.Notes)
		return
	}
	if !p.Enabled || p.Refused != "" {
		t.Errorf("%s: probe enabled=%v refused=%q (%s)", name, p.Enabled, p.Refused, p.Summary())
	}
	if p.Counts.JobsStarted == 0 || p.Counts.Replies == 0 {
		t.Errorf("%s: the probe ran %d jobs and got %d replies, want some of each (%s; timeline %s)", name, p.Counts.JobsStarted, p.Counts.Replies, p.Summary(), r.Timeline)
	}
	if p.Counts.NoReplies == 0 {
		t.Errorf("%s: no attempt went unanswered, yet a guest's NICs were down (%s)", name, p.Summary())
	}
	faulty := harness.FaultyMachines(r)
	if len(faulty) == 0 {
		t.Errorf("%s: no fault was injected (faults %v)", name, r.Faults)
	}
	for _, m := range faulty {
		msg, ok := harness.FalseMessageOf(r, m)
		if !ok {
			t.Errorf("%s: the shim never said False on the faulty Machine %s (False messages %v)", name, m, r.ShimFalseMessages)
			continue
		}
		if !strings.Contains(msg, "no ARP reply") {
			t.Errorf("%s: the faulty Machine %s's False does not name the ARP probe: %q (timeline %s)", name, m, msg, r.Timeline)
		}
	}
	for _, e := range r.ConditionEvidence {
		if landed, _, _ := strings.Cut(e, "; when the MHC marked it: "); !strings.Contains(landed, "no ARP reply") {
			t.Errorf("%s: the condition the MHC acted on does not name the ARP probe: %s", name, e)
		}
	}
}
