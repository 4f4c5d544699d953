package scenarios

import (
	"testing"

	"github.com/capc-health-shim/tests/e2e/harness"
)

func runs(sets ...[2]string) [][2]string { return sets }

var (
	withShim   = [2]string{shimMode, recommended}
	baseline   = [2]string{baseMode, harness.MHCDefault}
	withoutMHC = [2]string{baseMode, harness.MHCNone}
)

// requireRecycled: the run converged by replacing the faulty Machine.
func requireRecycled(t *testing.T, name string, r harness.Row) {
	t.Helper()
	if !r.Converged {
		t.Errorf("%s: did not converge within %.0fs: %v (timeline %s)", name, r.DeadlineSeconds, r.Notes, r.Timeline)
	}
	if r.SecondsFaultToRecycle == nil {
		t.Errorf("%s: the faulty Machine was not recycled (timeline %s)", name, r.Timeline)
	}
	clean(t, name, r)
}

func TestScenario1WorkerNICDown(t *testing.T) {
	rows := run(t, harness.ScenarioWorkerNICDown, runs(withShim, baseline, withoutMHC)...)
	s, b, n := rows[shimRun], rows[baseRun], rows[baseNoMHC]
	requireRecycled(t, "shim", s)
	requireRecycled(t, "baseline", b)
	if len(s.ShimVerdicts) == 0 {
		t.Errorf("shim: no False verdict published")
	}
	// Without any MHC, stock CAPI never replaces the silent VM: it must not converge.
	if n.Converged || n.RecycledMachines != 0 {
		t.Errorf("no MHC: converged=%v recycled=%d, want a cluster stuck until the deadline", n.Converged, n.RecycledMachines)
	}
	if n.OrphanVMs != 0 || n.LeftoverObjects != 0 {
		t.Errorf("no MHC: orphans=%d leftovers=%d", n.OrphanVMs, n.LeftoverObjects)
	}
}

func TestScenario3FirstControlPlaneNICDown(t *testing.T) {
	rows := run(t, harness.ScenarioFirstCPNICDown, runs(withShim, baseline)...)
	requireRecycled(t, "shim", rows[shimRun])
	requireRecycled(t, "baseline", rows[baseRun])
}

func TestScenario7APIOutageAnd429(t *testing.T) {
	// One run at a time: the outage is the simulator's, so concurrent runs would share it.
	for _, r := range runs(withShim, baseline) {
		rows := run(t, harness.ScenarioOutage, r)
		row := rows[r[0]+"/"+r[1]]
		if !row.Converged {
			t.Errorf("%s: did not converge after the outage: %v", r[0], row.Notes)
		}
		if r[0] == shimMode {
			if row.RecycledMachines != 0 || len(row.ShimVerdicts) != 0 {
				t.Errorf("shim: recycled %d, False verdicts %v during an API outage", row.RecycledMachines, row.ShimVerdicts)
			}
			clean(t, "shim", row)
		} else if row.OrphanVMs != 0 || row.LeftoverObjects != 0 {
			t.Errorf("baseline: orphans=%d leftovers=%d", row.OrphanVMs, row.LeftoverObjects)
		}
	}
}

// TestManagementWebhooksAndConversion checks the harness itself: CAPC's conversion webhook
// answers (a v1beta3 object read as v1beta2) and CAPI's defaulting webhook ran.
func TestManagementWebhooksAndConversion(t *testing.T) {
	checkConversion(t)
}
