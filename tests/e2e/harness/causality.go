package harness

import (
	"fmt"
	"regexp"
	"slices"
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
	ShimFalse  *float64 `json:"shim_false_s"`
	ShimReason string   `json:"shim_reason,omitempty"`
	// ShimFalseBy is the field manager owning the condition entry's status (managedFields of
	// the status subresource) when the False was first seen; ShimFalseReasons every reason the
	// condition carried while False; ConditionByAtMark the entry's owner when the MHC marked
	// the Machine (the condition the MHC read, in condition mode).
	ShimFalseBy       string   `json:"shim_false_by,omitempty"`
	ShimFalseReasons  []string `json:"shim_false_reasons,omitempty"`
	ConditionByAtMark string   `json:"condition_by_at_mark,omitempty"`
	Annotated         *float64 `json:"annotated_s"`
	AnnotatedBy       string   `json:"annotated_by,omitempty"`
	MHCMarked         *float64 `json:"mhc_marked_s"`
	MHCReason         string   `json:"mhc_reason,omitempty"`
	MHCMessage        string   `json:"mhc_message,omitempty"`
	Deleting          *float64 `json:"deleting_s"`
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
			ShimFalseBy: m.ShimFalseBy, ShimFalseReasons: m.ShimFalseReasons, ConditionByAtMark: m.ConditionByAtMark,
			Annotated: since(m.Annotated), AnnotatedBy: m.AnnotatedBy,
			MHCMarked: since(m.MHCUnhealthy), MHCReason: m.MHCReason, MHCMessage: m.MHCMessage,
			Deleting: since(m.Deleting),
		})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Machine < out[j].Machine })
	return out
}

// CausalityFailures says why a row does not show that the shim caused the recycle, in the
// shim's mode ("annotate" or "condition"); none when every faulty Machine went: the shim's False
// (its condition entry owned by the shim's field manager), then (annotate) the remediate
// annotation by the shim's field manager, then the MHC marking it for that reason (annotate: the
// annotation; condition: a finding that names the condition at False with a reason the shim
// wrote, the entry still the shim's), then its owner deleting it — in that order, as the recorder
// saw them (two steps seen in the same 200 ms poll count as in order).
func CausalityFailures(chains []CausalChain, mode, conditionType string) []string {
	if len(chains) == 0 {
		return []string{"no faulty Machine: nothing to trace"}
	}
	var out []string
	for _, c := range chains {
		fail := func(format string, a ...any) {
			out = append(out, c.Machine+": "+fmt.Sprintf(format, a...))
		}
		if mode != "annotate" && mode != "condition" {
			fail("the shim ran in mode %q, which never acts", mode)
			continue
		}
		steps := []step{{"the shim's False", c.ShimFalse}}
		if mode == "annotate" {
			steps = append(steps, step{"the remediate annotation", c.Annotated})
		}
		// The MHC's step counts only if it acted for the shim's reason: a mark for anything
		// else (its node-startup timer) is a missing link, not a link of another kind.
		marked := c.MHCMarked
		why := mhcActedFor(c, mode, conditionType)
		if marked != nil && why != "" {
			marked = nil
		}
		steps = append(steps, step{"the MHC's HealthCheckSucceeded=False", marked}, step{"the owner's deletion", c.Deleting})
		missing := false
		for _, s := range steps {
			if s.at != nil {
				continue
			}
			missing = true
			if s.name == "the MHC's HealthCheckSucceeded=False" && c.MHCMarked != nil {
				fail("%s", why)
			} else {
				fail("%s was never seen", s.name)
			}
		}
		if !missing {
			for i := 1; i < len(steps); i++ {
				if *steps[i].at < *steps[i-1].at {
					fail("%s (%.1fs after the fault) came before %s (%.1fs)", steps[i].name, *steps[i].at, steps[i-1].name, *steps[i-1].at)
				}
			}
		}
		if c.ShimFalse != nil && c.ShimFalseBy != ShimFieldManager {
			fail("%s=False was written by field manager %q, not the shim's %q", conditionType, c.ShimFalseBy, ShimFieldManager)
		}
		switch mode {
		case "annotate":
			if c.Annotated != nil && c.AnnotatedBy != ShimFieldManager {
				fail("the remediate annotation is owned by field manager %q, not the shim's %q", c.AnnotatedBy, ShimFieldManager)
			}
		case "condition":
			if c.MHCMarked != nil && why == "" && c.ConditionByAtMark != ShimFieldManager {
				fail("when the MHC marked it, %s was owned by field manager %q, not the shim's %q", conditionType, c.ConditionByAtMark, ShimFieldManager)
			}
		}
	}
	return out
}

// Reasons of the MHC's HealthCheckSucceeded=False (cluster-api v1.9.6 api/v1beta1/machine_types.go,
// condition_consts.go; v1.13.5 api/core/v1beta2/machine_types.go:314-326,
// v1beta1_condition_consts.go:153-164), v1beta2 and v1beta1 names where they differ.
const (
	MHCReasonNodeStartupTimeout = "NodeStartupTimeout"
	MHCReasonUnhealthyMachine   = "UnhealthyMachine"
)

// MissingNamedCondition starts the causality failure of a condition-mode row whose MHC marked
// the Machine for something other than the shim's condition.
func MissingNamedCondition(conditionType string) string {
	return "the MHC never named " + conditionType
}

// mhcActedFor says why the MHC's mark is not the shim's doing ("" when it is): annotate mode,
// the reason for the remediate annotation; condition mode, reason UnhealthyMachine with a finding
// "Condition <type> on Machine is reporting status False [with reason <r>] …" whose reason is one
// the shim's False carried (machinehealthcheck_targets.go:166-203 at v1.13.5).
func mhcActedFor(c CausalChain, mode, conditionType string) string {
	if c.MHCMarked == nil {
		return ""
	}
	switch mode {
	case "annotate":
		if !annotationReasons[c.MHCReason] {
			return fmt.Sprintf("the MHC marked it for another reason than the remediate annotation: %s (%s)", c.MHCReason, c.MHCMessage)
		}
	case "condition":
		if c.MHCReason != MHCReasonUnhealthyMachine {
			return fmt.Sprintf("%s: it marked the Machine %s (%s)", MissingNamedCondition(conditionType), c.MHCReason, c.MHCMessage)
		}
		var named []MachineFinding
		for _, f := range MHCFindings(c.MHCMessage) {
			if f.Condition == conditionType {
				named = append(named, f)
			}
		}
		if len(named) == 0 {
			return fmt.Sprintf("%s: its findings are %q", MissingNamedCondition(conditionType), c.MHCMessage)
		}
		for _, f := range named {
			if f.Status == "False" && (f.Reason == "" || slices.Contains(c.ShimFalseReasons, f.Reason)) {
				return ""
			}
		}
		return fmt.Sprintf("the MHC named %s but not at False with a reason the shim wrote (%v): %q", conditionType, c.ShimFalseReasons, c.MHCMessage)
	}
	return ""
}

// MachineFinding is one "Condition <type> on Machine is reporting status <status> …" finding
// of an MHC's HealthCheckSucceeded message.
type MachineFinding struct{ Condition, Status, Reason, Timeout string }

var machineFinding = regexp.MustCompile(`^Condition (\S+) on Machine is reporting status (\S+)(?: with reason (\S+))? for more than (\S+)$`)
var startupFinding = regexp.MustCompile(`^Node failed to report startup in (\S+)$`)

// mhcItems splits an MHC message into its findings: v1beta2 "Health check failed:\n  * a\n  * b"
// (v1.13) or "Health check failed: a" (v1.9), v1beta1 "a; b".
func mhcItems(message string) []string {
	message = strings.TrimPrefix(strings.TrimSpace(message), "Health check failed:")
	var out []string
	for _, line := range strings.Split(message, "\n") {
		for _, item := range strings.Split(line, "; ") {
			if item = strings.TrimPrefix(strings.TrimSpace(item), "* "); item != "" {
				out = append(out, item)
			}
		}
	}
	return out
}

// MHCFindings are the Machine-condition findings of an MHC message, parsed whole (not a
// substring: "Condition X on Machine" inside another finding does not count).
func MHCFindings(message string) []MachineFinding {
	var out []MachineFinding
	for _, item := range mhcItems(message) {
		if m := machineFinding.FindStringSubmatch(item); m != nil {
			out = append(out, MachineFinding{Condition: m[1], Status: m[2], Reason: m[3], Timeout: m[4]})
		}
	}
	return out
}

// NodeStartupFinding is the timeout of the MHC message's "Node failed to report startup in <d>".
func NodeStartupFinding(message string) (time.Duration, bool) {
	for _, item := range mhcItems(message) {
		if m := startupFinding.FindStringSubmatch(item); m != nil {
			d, err := time.ParseDuration(m[1])
			return d, err == nil
		}
	}
	return 0, false
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

// RatioBoundFailure is in SpeedFailures' message when the ratio to the baseline is exceeded.
const RatioBoundFailure = "× the baseline's"

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
		out = append(out, fmt.Sprintf("fault → recycle %.1fs, more than %.1f %s %.1fs (%.1fs)", *shim, SpeedRatioMax, RatioBoundFailure, *baseline, bound))
	}
	if bound := BackstopFractionMax * backstop.Seconds(); *shim >= bound {
		out = append(out, fmt.Sprintf("fault → recycle %.1fs, not under %.1f × the MHC's %.0fs backstop (%.1fs)", *shim, BackstopFractionMax, backstop.Seconds(), bound))
	}
	return out
}
