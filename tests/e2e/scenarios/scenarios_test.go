package scenarios

import (
	"strings"
	"testing"

	"github.com/capc-health-shim/tests/e2e/harness"
)

var (
	withShim   = [2]string{shimMode, recommended}
	withProbe  = [2]string{probeMode, recommended}
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
	rows := run(t, harness.ScenarioWorkerNICDown, withShim, withProbe, baseline, withoutMHC)
	s, p, b, n := rows[shimRun], rows[probeRun], rows[baseRun], rows[baseNoMHC]
	requireRecycled(t, "shim", s)
	requireMHCActedOnCondition(t, "shim", s)
	requireRecycled(t, "shim-probe", p)
	requireMHCActedOnCondition(t, "shim-probe", p)
	requireProbed(t, "shim-probe", p)
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
	rows := run(t, harness.ScenarioFirstCPNICDown, withShim, withProbe, baseline)
	requireRecycled(t, "shim", rows[shimRun])
	requireMHCActedOnCondition(t, "shim", rows[shimRun])
	requireRecycled(t, "shim-probe", rows[probeRun])
	requireMHCActedOnCondition(t, "shim-probe", rows[probeRun])
	requireProbed(t, "shim-probe", rows[probeRun])
	requireRecycled(t, "baseline", rows[baseRun])
}

// The Error variant of scenario 3 (make e2e only).
func TestScenario3FirstControlPlaneError(t *testing.T) {
	rows := run(t, harness.ScenarioFirstCPError, withShim, baseline)
	requireRecycled(t, "shim", rows[shimRun])
	requireRecycled(t, "baseline", rows[baseRun])
}

func TestScenario7APIOutageAnd429(t *testing.T) {
	// One run at a time: the outage is the simulator's, so concurrent runs would share it.
	for _, r := range [][2]string{withShim, baseline} {
		rows := run(t, harness.ScenarioOutage, r)
		row := rows[r[0]+"/"+r[1]]
		if !row.Converged {
			t.Errorf("%s: did not converge after the outage: %v", r[0], row.Notes)
		}
		if r[0] == shimMode {
			// The outage and the storm reached the shim (its read-only key is throttled; CAPC's
			// root-admin key is exempt, as in CloudStack).
			if row.CloudStackResults["503"] == 0 || row.CloudStackResults["429"] == 0 {
				t.Errorf("shim run saw no outage or no 429s: %v", row.CloudStackResults)
			}
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

func TestScenario2ControlPlaneScaleUpNICDown(t *testing.T) {
	rows := run(t, harness.ScenarioScaleUpCPNICDown, withShim, baseline)
	requireRecycled(t, "shim", rows[shimRun])
	requireMHCActedOnCondition(t, "shim", rows[shimRun])
	requireRecycled(t, "baseline", rows[baseRun])
}

// A VM whose network works but whose services fail: after boot it sends only NTP and ARP
// (cloudstack-sim's quiet profile, ~4 B/s). CloudStack counts whole KiB, so over the shim's
// window that reads exactly like silence (issue 14: silence = samples of 0 KiB); the shim may
// flag it GuestNetworkSilent — the Machine never joins, MHC would recycle it later — and must
// flag it with nothing else. Either way it is recycled, and nothing healthy is.
func TestScenario4ServicesFail(t *testing.T) {
	rows := run(t, harness.ScenarioServicesFail, withShim, baseline)
	s := rows[shimRun]
	for _, v := range s.ShimVerdicts {
		if !strings.HasSuffix(v, "False/GuestNetworkSilent") {
			t.Errorf("shim flagged the services-failed VM with another reason: %v", s.ShimVerdicts)
		}
	}
	requireRecycled(t, "shim", s)
	requireRecycled(t, "baseline", rows[baseRun])
}

// A slow but healthy VM (traffic rising, joins after 20 scaled minutes) is recycled by nobody
// with the shim and the recommended MHC; the stock MHC's 10-minute timer recycles it (shown, not
// required: that is the baseline's known flaw).
func TestScenario5SlowButHealthy(t *testing.T) {
	rows := run(t, harness.ScenarioSlowHealthy, withShim, baseline)
	s, b := rows[shimRun], rows[baseRun]
	if !s.Converged || s.RecycledMachines != 0 || len(s.ShimVerdicts) != 0 {
		t.Errorf("shim: converged=%v recycled=%d verdicts=%v, want the slow VM kept", s.Converged, s.RecycledMachines, s.ShimVerdicts)
	}
	clean(t, "shim", s)
	if b.OrphanVMs != 0 || b.LeftoverObjects != 0 {
		t.Errorf("baseline: orphans=%d leftovers=%d", b.OrphanVMs, b.LeftoverObjects)
	}
	t.Logf("baseline recycled %d Machines of a healthy-but-slow boot (false recycles: %d)", b.RecycledMachines, b.FalseRecycles)
}

func TestScenario6RollingUpgradeNICDown(t *testing.T) {
	rows := run(t, harness.ScenarioUpgradeNICDown, withShim, baseline)
	requireRecycled(t, "shim", rows[shimRun])
	requireMHCActedOnCondition(t, "shim", rows[shimRun])
	requireRecycled(t, "baseline", rows[baseRun])
}
