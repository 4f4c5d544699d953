package harness

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// MissingAnnotation is the causality failure of an annotate-mode Machine never annotated.
const MissingAnnotation = "the remediate annotation was never seen"

// NegativeControlFailures judges one muted row of the negative control (the shim in observe
// mode, so unable to act) against the baseline of the same run; mode is the mode the stack's
// shim would have acted in ("annotate" on CAPI v1.9, "condition" on v1.13+). The control holds —
// no failures — only if the muted row shows exactly what a shim that cannot act must show:
//   - the recorder saw every step of both rows (a dropped step could hide any link);
//   - the muted shim itself published False on each faulty Machine (else nothing was muted);
//   - each faulty Machine was recycled cleanly by the MHC's own backstop: HealthCheckSucceeded
//     NodeStartupTimeout naming the row's backstop timeout, then the owner's delete;
//   - causality failed with the missing link of the mode (annotate: the annotation never seen;
//     condition: the MHC never named the condition);
//   - speed failed by its ratio to the baseline, not because nothing was recycled.
//
// Each failure names what the control saw instead, so a control that fails says why.
func NegativeControlFailures(muted, baseline Row, mode string) []string {
	var out []string
	fail := func(format string, a ...any) { out = append(out, fmt.Sprintf(format, a...)) }

	for _, r := range []struct {
		name string
		row  Row
	}{{"muted", muted}, {"baseline", baseline}} {
		if r.row.RecorderSteps == 0 {
			fail("the %s row's recorder ran no step", r.name)
		}
		if r.row.RecorderFailedSteps > 0 {
			fail("the %s row's recorder dropped %d of %d step(s) (%s): what it saw is incomplete", r.name, r.row.RecorderFailedSteps, r.row.RecorderSteps, strings.Join(r.row.RecorderErrors, "; "))
		}
	}
	if muted.Mode != ModeShimObserve || muted.ShimMode != "observe" {
		fail("the muted row ran as %s with the shim in mode %q, not observe", muted.Mode, muted.ShimMode)
	}
	switch mode {
	case "annotate":
	case "condition":
		// Observe mode still publishes the condition: an MHC listing it would act on it.
		if muted.MHCReadAs != "v1beta2" {
			fail("the muted row's MHC was not read back as v1beta2 (read as %q): its conditions are unknown", muted.MHCReadAs)
		}
		for _, c := range muted.MHCMachineConditions {
			if strings.HasPrefix(c, ShimConditionType+"=") {
				fail("the muted row's MHC lists %s under unhealthyMachineConditions: the muted shim's condition could act", c)
			}
		}
	default:
		fail("mode %q: the control judges annotate or condition mode", mode)
		return out
	}

	// Recycled by the backstop, cleanly.
	if !muted.Converged {
		fail("the muted row did not converge within %.0fs: the MHC backstop did not recycle it in time (notes %v)", muted.DeadlineSeconds, muted.Notes)
	}
	if muted.SecondsFaultToRecycle == nil {
		fail("the muted row's faulty Machine was not recycled: the MHC backstop never acted")
	}
	if muted.FalseRecycles != 0 || muted.OrphanVMs != 0 || muted.LeftoverObjects != 0 || len(muted.SecretLeaks) != 0 {
		fail("the muted row is not clean: false recycles %d, orphan VMs %d, leftover objects %d, secret leaks %v",
			muted.FalseRecycles, muted.OrphanVMs, muted.LeftoverObjects, muted.SecretLeaks)
	}
	if len(muted.Causality) == 0 {
		fail("the muted row has no faulty Machine: nothing to judge")
	}
	for _, c := range muted.Causality {
		switch {
		case c.ShimFalse == nil:
			fail("%s: the muted shim never said False: nothing was muted", c.Machine)
		case c.ShimFalseBy != ShimFieldManager:
			fail("%s: %s=False was written by field manager %q, not the muted shim's %q", c.Machine, ShimConditionType, c.ShimFalseBy, ShimFieldManager)
		}
		switch {
		case c.MHCMarked == nil:
			fail("%s: the MHC never marked it", c.Machine)
		case c.MHCReason != MHCReasonNodeStartupTimeout:
			fail("%s: the MHC marked it %s (%s), not by its %s backstop", c.Machine, c.MHCReason, c.MHCMessage, MHCReasonNodeStartupTimeout)
		default:
			if d, ok := NodeStartupFinding(c.MHCMessage); !ok || d.Seconds() != muted.BackstopSeconds {
				fail("%s: the MHC's %s message %q does not name the row's %.0fs backstop", c.Machine, c.MHCReason, c.MHCMessage, muted.BackstopSeconds)
			}
		}
		if c.Deleting == nil {
			fail("%s: its owner never deleted it", c.Machine)
		} else if c.MHCMarked != nil && *c.Deleting < *c.MHCMarked {
			fail("%s: deleted (%.1fs) before the MHC marked it (%.1fs): not the backstop's recycle", c.Machine, *c.Deleting, *c.MHCMarked)
		}
	}

	// Causality fails at the link a muted shim leaves out.
	caused := CausalityFailures(muted.Causality, mode, ShimConditionType)
	for _, c := range muted.Causality {
		want := c.Machine + ": " + MissingAnnotation
		if mode == "condition" {
			want = c.Machine + ": " + MissingNamedCondition(ShimConditionType)
		}
		if !slices.ContainsFunc(caused, func(f string) bool { return strings.HasPrefix(f, want) }) {
			fail("causality (%s mode) did not fail with %q; it reported %v", mode, want, caused)
		}
	}

	// Speed fails by the ratio bound, with both rows recycled.
	if baseline.SecondsFaultToRecycle == nil {
		fail("the baseline recycled nothing: no ratio for the muted row to fail")
	}
	if muted.SecondsFaultToRecycle != nil && baseline.SecondsFaultToRecycle != nil {
		slow := SpeedFailures(muted.SecondsFaultToRecycle, baseline.SecondsFaultToRecycle, time.Duration(muted.BackstopSeconds*float64(time.Second)))
		if !slices.ContainsFunc(slow, func(f string) bool { return strings.Contains(f, RatioBoundFailure) }) {
			fail("speed did not fail by its ratio bound: fault → recycle %.1fs vs the baseline's %.1fs (bound %.1f ×); it reported %v",
				*muted.SecondsFaultToRecycle, *baseline.SecondsFaultToRecycle, SpeedRatioMax, slow)
		}
	}
	return out
}
