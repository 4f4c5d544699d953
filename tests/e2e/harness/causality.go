package harness

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// ShimFieldManager is the field manager the shim writes with (its condition by server-side
// apply, the remediate annotation by a merge patch): crates/capi-model/src/condition.rs.
const ShimFieldManager = "capc-health-shim"

// The speed bound of every shim row that must recycle a faulty Machine (issue 27), in one place.
//
// What the shim should take: its False after the silent stats collections (3 × the scaled
// 60 s stats interval = 18 s) plus, in annotate mode, the escalation delay (6 s), then the MHC's
// and the owner's reaction (seconds) — about 25 s from the fault. What the baseline takes: the
// stock MHC's nodeStartupTimeout (10 min → 60 s) from the Machine's creation, less the boot —
// about 60 s. A recycle by the recommended MHC's own backstop (30 min → 180 s) takes ~170 s
// from the fault. The bounds sit between: the shim must need at most SpeedRatioMax of the
// baseline's fault → recycle of the same run (noise on 2 cores moved the ratio between 0.33 and
// 0.37 in earlier runs, 0.7 leaves twice that), and under BackstopFractionMax of the backstop,
// which a backstop-only recycle cannot reach by construction. A shim that published nothing,
// or whose signal CAPI ignored, fails both.
const (
	SpeedRatioMax       = 0.7
	BackstopFractionMax = 0.5
)

// CausalChain is what the recorder saw of one faulty Machine on its way from the fault to its
// replacement, in seconds after the fault (nil: never seen).
type CausalChain struct {
	Machine string `json:"machine"`
	Fault   string `json:"fault"`
	// ShimFalse: the shim's condition first False; Annotated: the remediate annotation first
	// seen, and the field manager owning it then; MHCMarked: HealthCheckSucceeded=False first
	// seen, with the MHC's reason and message; Deleting: deletionTimestamp first seen.
	ShimFalse   *float64 `json:"shim_false_s"`
	ShimReason  string   `json:"shim_reason,omitempty"`
	Annotated   *float64 `json:"annotated_s"`
	AnnotatedBy string   `json:"annotated_by,omitempty"`
	MHCMarked   *float64 `json:"mhc_marked_s"`
	MHCReason   string   `json:"mhc_reason,omitempty"`
	MHCMessage  string   `json:"mhc_message,omitempty"`
	Deleting    *float64 `json:"deleting_s"`
}

// CausalChains builds the chain of every Machine a fault was injected into (benign faults
// such as a slow boot excluded), in injection order.
func CausalChains(injections []Injection, machines []MachineRecord) []CausalChain {
	byName := map[string]MachineRecord{}
	for _, m := range machines {
		byName[m.Name] = m
	}
	var out []CausalChain
	for _, inj := range injections {
		if benignFault(inj.Fault) {
			continue
		}
		m := byName[inj.Machine]
		since := func(t time.Time) *float64 {
			if t.IsZero() {
				return nil
			}
			return secs(t.Sub(inj.At))
		}
		out = append(out, CausalChain{
			Machine: inj.Machine, Fault: inj.Fault,
			ShimFalse: since(m.ShimFalse), ShimReason: m.ShimReason,
			Annotated: since(m.Annotated), AnnotatedBy: m.AnnotatedBy,
			MHCMarked: since(m.MHCUnhealthy), MHCReason: m.MHCReason, MHCMessage: m.MHCMessage,
			Deleting: since(m.Deleting),
		})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Machine < out[j].Machine })
	return out
}

// CausalityFailures says why a row does not show that the shim caused the recycle, in the
// shim's mode ("annotate" or "condition"); none when every faulty Machine went: the shim's False,
// then (annotate) the remediate annotation by the shim's field manager, then the MHC marking it
// for that reason, then its owner deleting it — in that order, as the recorder saw them (two
// steps seen in the same 200 ms poll count as in order).
func CausalityFailures(chains []CausalChain, mode, conditionType string) []string {
	if len(chains) == 0 {
		return []string{"no faulty Machine: nothing to trace"}
	}
	var out []string
	for _, c := range chains {
		fail := func(format string, a ...any) {
			out = append(out, c.Machine+": "+fmt.Sprintf(format, a...))
		}
		steps := []step{{"the shim's False", c.ShimFalse}}
		if mode == "annotate" {
			steps = append(steps, step{"the remediate annotation", c.Annotated})
		}
		steps = append(steps, step{"the MHC's HealthCheckSucceeded=False", c.MHCMarked}, step{"the owner's deletion", c.Deleting})
		missing := false
		for _, s := range steps {
			if s.at == nil {
				fail("%s was never seen", s.name)
				missing = true
			}
		}
		if !missing {
			for i := 1; i < len(steps); i++ {
				if *steps[i].at < *steps[i-1].at {
					fail("%s (%.1fs after the fault) came before %s (%.1fs)", steps[i].name, *steps[i].at, steps[i-1].name, *steps[i-1].at)
				}
			}
		}
		switch mode {
		case "annotate":
			if c.Annotated != nil && c.AnnotatedBy != ShimFieldManager {
				fail("the remediate annotation is owned by field manager %q, not the shim's %q", c.AnnotatedBy, ShimFieldManager)
			}
			if c.MHCMarked != nil && !annotationReasons[c.MHCReason] {
				fail("the MHC marked it for another reason: %s (%s)", c.MHCReason, c.MHCMessage)
			}
		case "condition":
			if c.MHCMarked != nil && !strings.Contains(c.MHCMessage, "Condition "+conditionType+" on Machine is reporting status False") {
				fail("the MHC marked it for another reason: %s (%s)", c.MHCReason, c.MHCMessage)
			}
		default:
			fail("the shim ran in mode %q, which never acts", mode)
		}
	}
	return out
}

// annotationReasons are the MHC's reasons for a Machine carrying the remediate annotation:
// v1beta2 and v1beta1 (cluster-api v1.9.6 api/v1beta1/machine_types.go:286,
// condition_consts.go:157; set in machinehealthcheck_targets.go:90-97).
var annotationReasons = map[string]bool{"HasRemediateAnnotation": true, "HasRemediateMachineAnnotation": true}

// step is one link of a causal chain: what happened, seconds after the fault.
type step struct {
	name string
	at   *float64
}

// SpeedFailures says why a shim row's fault → recycle does not beat its baseline of the same
// run by the bound above; backstop is the shim row's MHC nodeStartupTimeout.
func SpeedFailures(shim, baseline *float64, backstop time.Duration) []string {
	if shim == nil {
		return []string{"the faulty Machine was not recycled"}
	}
	if baseline == nil {
		return []string{fmt.Sprintf("fault → recycle %.1fs, but the baseline recycled nothing to compare with", *shim)}
	}
	var out []string
	if bound := SpeedRatioMax * *baseline; *shim > bound {
		out = append(out, fmt.Sprintf("fault → recycle %.1fs, more than %.1f × the baseline's %.1fs (%.1fs)", *shim, SpeedRatioMax, *baseline, bound))
	}
	if bound := BackstopFractionMax * backstop.Seconds(); *shim >= bound {
		out = append(out, fmt.Sprintf("fault → recycle %.1fs, not under %.1f × the MHC's %.0fs backstop (%.1fs)", *shim, BackstopFractionMax, backstop.Seconds(), bound))
	}
	return out
}
