package harness

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// ScorecardRecord is what the shim's /status scorecard said at the end of a run (issue 44,
// docs/scorecard.md), read before the shim stopped: its counts and the outcomes of this run's
// Machines. Every shim in the e2e keeps its memory ConfigMap in its run's namespace
// (--lease-namespace), so the counts are this run's alone.
type ScorecardRecord struct {
	SettleSeconds int `json:"settle_seconds"`
	// Following is how many stories were still going on at the read.
	Following int `json:"following"`
	// Totals: outcome → count.
	Totals     map[string]int `json:"totals"`
	Uneventful int            `json:"uneventful"`
	// Outcomes: the outcomes of this run's Machines, oldest first.
	Outcomes []ScorecardOutcome `json:"outcomes"`
	// Waited says what the read waited for and whether it came.
	Waited string `json:"waited"`
	// Printed: the lines of `capc-health-shim scorecard --url …` that name this run's Machines
	// (the whole output is in ScorecardCommandLog).
	Printed []string `json:"printed,omitempty"`
}

// ScorecardOutcome is one Machine's outcome as the shim's /status scorecard.recent has it.
type ScorecardOutcome struct {
	Machine           string `json:"machine"` // name, without the namespace
	Outcome           string `json:"outcome"`
	SavedSecs         *int64 `json:"saved_secs,omitempty"`
	RecycledBy        string `json:"recycled_by,omitempty"` // "hand" or "mhc:<trigger>"
	FalseToDeleteSecs *int64 `json:"false_to_delete_secs,omitempty"`
	FalseToNodeSecs   *int64 `json:"false_to_node_secs,omitempty"`
	ShimSaid          string `json:"shim_said,omitempty"`
	Trigger           string `json:"trigger,omitempty"`
	Reason            string `json:"reason,omitempty"`
}

// Summary is the outcome in one line.
func (o ScorecardOutcome) Summary() string {
	s := o.Machine + ": " + o.Outcome
	if o.SavedSecs != nil {
		s += fmt.Sprintf(" saved %d s", *o.SavedSecs)
	}
	if o.RecycledBy != "" {
		s += " (recycled by " + o.RecycledBy + ")"
	}
	if o.FalseToDeleteSecs != nil {
		s += fmt.Sprintf(" False → delete %d s", *o.FalseToDeleteSecs)
	}
	if o.FalseToNodeSecs != nil {
		s += fmt.Sprintf(" False → Node %d s", *o.FalseToNodeSecs)
	}
	if o.ShimSaid != "" {
		s += " shim said " + o.ShimSaid + ", MHC " + o.Trigger
	}
	if o.Reason != "" {
		s += " [" + o.Reason + "]"
	}
	return s
}

// Outcome is the scorecard's outcome for a Machine of the run.
func (r *ScorecardRecord) Outcome(machine string) (ScorecardOutcome, bool) {
	if r == nil {
		return ScorecardOutcome{}, false
	}
	for _, o := range r.Outcomes {
		if o.Machine == machine {
			return o, true
		}
	}
	return ScorecardOutcome{}, false
}

// Summary is the record in one line: the totals, what ended uneventfully, the outcomes.
func (r *ScorecardRecord) Summary() string {
	if r == nil {
		return "no scorecard"
	}
	keys := make([]string, 0, len(r.Totals))
	for k := range r.Totals {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var totals, outcomes []string
	for _, k := range keys {
		totals = append(totals, fmt.Sprintf("%s=%d", k, r.Totals[k]))
	}
	for _, o := range r.Outcomes {
		outcomes = append(outcomes, o.Summary())
	}
	return fmt.Sprintf("totals {%s}, uneventful %d, following %d; outcomes: %s", strings.Join(totals, " "), r.Uneventful, r.Following, strings.Join(outcomes, "; "))
}

// ShimRan reports whether the shim ran in this row: a shim mode, or observing a baseline.
func (r Row) ShimRan() bool { return r.Mode.WithShim() || r.ShimObserver }

// NoteNoScorecard: the shim's /status had no "scorecard" at the end of the run.
const NoteNoScorecard = "the shim's /status has no scorecard (an older shim, or not the leader)"

// ScorecardCommandLog is where a run saves what `capc-health-shim scorecard` printed.
func ScorecardCommandLog(outDir, ns string) string {
	return filepath.Join(outDir, "logs", "shim-"+ns+"-scorecard.txt")
}

func record(sc *ShimScorecard, ns string) *ScorecardRecord {
	r := &ScorecardRecord{SettleSeconds: sc.SettleSeconds, Following: sc.Following, Uneventful: sc.Uneventful, Totals: map[string]int{}}
	for k, t := range sc.Totals {
		r.Totals[k] = t.Count
	}
	for _, o := range sc.Recent {
		name, ok := strings.CutPrefix(o.Machine, ns+"/")
		if !ok {
			continue
		}
		r.Outcomes = append(r.Outcomes, ScorecardOutcome{
			Machine: name, Outcome: o.Kind.Outcome, SavedSecs: o.Kind.SavedSecs, RecycledBy: o.Kind.Recycler(),
			FalseToDeleteSecs: o.Kind.FalseToDeleteSecs, FalseToNodeSecs: o.Kind.FalseToNodeSecs,
			ShimSaid: o.Kind.ShimSaid, Trigger: o.Kind.Trigger, Reason: o.Reason,
		})
	}
	return r
}

// scorecardAtEnd reads the shim's /status scorecard once the stories the run is judged by have
// ended: every Machine a fault (a slow boot included) was injected into and that was deleted
// has its outcome — a deletion ends its story at the shim's next cycle — and, with settle,
// every story has ended (a Machine with its Node ends --scorecard-settle after it). The wait is
// bounded (the settle time, when waited for, plus three poll intervals and 5 s); the last read
// goes in the record either way, and Waited says whether what it waited for came. nil when
// /status never had a scorecard.
func scorecardAtEnd(ctx context.Context, shim *Shim, ns string, injections []Injection, machines []MachineRecord, settle bool, tl *Timeline) *ScorecardRecord {
	deleted := map[string]bool{}
	for _, m := range machines {
		if !m.Deleting.IsZero() {
			deleted[m.Name] = true
		}
	}
	var want []string
	for _, inj := range injections {
		if deleted[inj.Machine] {
			want = append(want, inj.Machine)
		}
	}
	limit := 3*shim.Config.PollInterval() + 5*time.Second
	what := fmt.Sprintf("the outcomes of %v", want)
	if settle {
		limit += shim.Config.ScorecardSettle()
		what += " and every story ended (following 0)"
	}
	var last *ShimScorecard
	var lastErr error
	err := WaitFor(ctx, limit, time.Second, "scorecard "+what, func() (bool, error) {
		sc, err := shim.Scorecard(ctx)
		if err != nil || sc == nil {
			lastErr = err
			return false, nil
		}
		last = sc
		r := record(sc, ns)
		for _, m := range want {
			if _, ok := r.Outcome(m); !ok {
				return false, nil
			}
		}
		return !settle || sc.Following == 0, nil
	})
	if last == nil {
		tl.Add(fmt.Sprintf("scorecard: /status has none (last error: %v)", lastErr))
		return nil
	}
	r := record(last, ns)
	r.Waited = what + ": came"
	if err != nil {
		r.Waited = fmt.Sprintf("%s: not within %s", what, limit)
	}
	tl.Add("scorecard at the end (" + r.Waited + "): " + r.Summary())
	return r
}

func linesNaming(out, s string) []string {
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, s) {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	return lines
}

// SavingToleranceMax bounds how far the observe-mode scorecard's saving may be from the
// saving measured in annotate mode, relative to the latter (issue 44: within 20 %).
const SavingToleranceMax = 0.2

// RecycledByNodeStartupTimeout is the scorecard's recycled_by for the MHC's own timer.
const RecycledByNodeStartupTimeout = "mhc:node-startup-timeout"

// SavingComparison is the issue-44 check of one scenario on one stack. Its baseline run had
// the shim beside the stock MHC in observe mode; the MHC's nodeStartupTimeout recycled the
// faulty Machine and the observer's scorecard says acting would have saved Observed seconds:
// the recycle's time − (its False + the escalation delay). The annotate-mode run of the same
// scenario (shim row) measured what acting saves: Measured = the baseline's fault → recycle −
// the shim row's fault → recycle, how much sooner the faulty Machine was recycled because the
// shim acted than when the stock MHC's timer did it.
type SavingComparison struct {
	Stack, Scenario, Machine string
	Observed                 int64   // saved_secs of the observer's would-have-saved outcome
	Baseline, Shim           float64 // fault → recycle of the baseline and the annotate-mode row
	Measured                 float64 // Baseline − Shim
	Off                      float64 // |Observed − Measured| / Measured
}

func (c SavingComparison) String() string {
	return fmt.Sprintf("%s %s: the observe-mode scorecard says acting would have saved %d s on %s; annotate mode saved %.1f s (baseline fault → recycle %.1f s − annotate-mode %.1f s): %.0f %% apart (allowed %.0f %%)",
		c.Stack, c.Scenario, c.Observed, c.Machine, c.Measured, c.Baseline, c.Shim, 100*c.Off, 100*SavingToleranceMax)
}

// CompareSavings judges a baseline run observed by the shim against the annotate-mode run of
// the same scenario: every faulty Machine of the baseline must be `would-have-saved`, recycled
// by the MHC's nodeStartupTimeout, with a saving within SavingToleranceMax of the measured one.
// Any failure is returned; a row without a scorecard or without outcomes fails.
func CompareSavings(baseline, annotated Row) ([]SavingComparison, []string) {
	var out []SavingComparison
	var fail []string
	if !baseline.ShimObserver {
		return nil, []string{"the baseline run had no shim observing it"}
	}
	if baseline.Scorecard == nil {
		return nil, []string{"the observer's /status had no scorecard"}
	}
	faulty := FaultyMachines(baseline)
	if len(faulty) == 0 {
		fail = append(fail, fmt.Sprintf("the baseline has no faulty Machine (faults %v)", baseline.Faults))
	}
	if baseline.SecondsFaultToRecycle == nil || annotated.SecondsFaultToRecycle == nil {
		fail = append(fail, fmt.Sprintf("no fault → recycle to measure the saving: baseline %s, annotate-mode %s", f1(baseline.SecondsFaultToRecycle), f1(annotated.SecondsFaultToRecycle)))
	}
	for _, m := range faulty {
		o, ok := baseline.Scorecard.Outcome(m)
		switch {
		case !ok:
			fail = append(fail, fmt.Sprintf("%s: no outcome in the observer's scorecard (%s)", m, baseline.Scorecard.Summary()))
			continue
		case o.Outcome != "would-have-saved":
			fail = append(fail, fmt.Sprintf("%s: outcome %s, want would-have-saved", m, o.Summary()))
			continue
		case o.RecycledBy != RecycledByNodeStartupTimeout:
			fail = append(fail, fmt.Sprintf("%s: recycled by %q, want the stock MHC's timer (%s)", m, o.RecycledBy, RecycledByNodeStartupTimeout))
		case o.SavedSecs == nil || *o.SavedSecs <= 0:
			fail = append(fail, fmt.Sprintf("%s: would-have-saved without a saving: %s", m, o.Summary()))
			continue
		}
		if baseline.SecondsFaultToRecycle == nil || annotated.SecondsFaultToRecycle == nil {
			continue
		}
		c := SavingComparison{Stack: baseline.StackKey(), Scenario: baseline.Scenario, Machine: m, Observed: *o.SavedSecs,
			Baseline: *baseline.SecondsFaultToRecycle, Shim: *annotated.SecondsFaultToRecycle}
		c.Measured = c.Baseline - c.Shim
		if c.Measured <= 0 {
			fail = append(fail, fmt.Sprintf("annotate mode saved nothing: fault → recycle %.1f s vs the baseline's %.1f s", c.Shim, c.Baseline))
			continue
		}
		c.Off = math.Abs(float64(c.Observed)-c.Measured) / c.Measured
		out = append(out, c)
		if c.Off > SavingToleranceMax {
			fail = append(fail, c.String())
		}
	}
	return out, fail
}

// MissedHealthy is the CLI's words for a missed outcome whose shim said healthy-with-traffic.
const MissedHealthy = "MHC recycled a VM the shim judged healthy"

// SlowHealthyShimFailures judges the shim run of scenario 5 (a slow but healthy worker) by
// its scorecard: every story must have ended (the slow Machine settled --scorecard-settle
// after its Node, so a false alarm would have been counted), none as `false-alarm`, every
// Machine of the run counted (machines: as many as the scenario creates), and the slow Machine
// without any outcome (an uneventful boot). An absent or empty scorecard fails.
func SlowHealthyShimFailures(shim Row, machines int) []string {
	s := shim.Scorecard
	if s == nil {
		return []string{"no scorecard"}
	}
	var fail []string
	if s.Following != 0 {
		fail = append(fail, fmt.Sprintf("%d stories still going on (%s): a false alarm would not be counted yet", s.Following, s.Waited))
	}
	if n := s.Totals["false-alarm"]; n != 0 {
		fail = append(fail, fmt.Sprintf("%d false-alarm(s): %s", n, s.Summary()))
	}
	ended := s.Uneventful
	for _, n := range s.Totals {
		ended += n
	}
	if ended < machines {
		fail = append(fail, fmt.Sprintf("%d stories ended, want one for each of the %d Machines: %s", ended, machines, s.Summary()))
	}
	slow := slowMachines(shim)
	if len(slow) == 0 {
		fail = append(fail, fmt.Sprintf("no slow boot injected (faults %v)", shim.Faults))
	}
	for _, m := range slow {
		if o, ok := s.Outcome(m); ok {
			fail = append(fail, fmt.Sprintf("the slow Machine has an outcome (%s), want an uneventful boot", o.Summary()))
		}
	}
	return fail
}

// SlowHealthyBaselineFailures judges the baseline run of scenario 5 with the shim observing
// it: the slow Machine the stock MHC's timer recycled must be `missed` with shim_said
// healthy-with-traffic (trigger node-startup-timeout), `capc-health-shim scorecard` must print
// it with MissedHealthy, and no story may be a `false-alarm`. No observer, no scorecard or no
// outcome for the slow Machine fails.
func SlowHealthyBaselineFailures(baseline Row) []string {
	b := baseline.Scorecard
	if !baseline.ShimObserver || b == nil {
		return []string{fmt.Sprintf("no observer's scorecard (observer %v)", baseline.ShimObserver)}
	}
	var fail []string
	if n := b.Totals["false-alarm"]; n != 0 {
		fail = append(fail, fmt.Sprintf("%d false-alarm(s): %s", n, b.Summary()))
	}
	slow := slowMachines(baseline)
	if len(slow) == 0 {
		fail = append(fail, fmt.Sprintf("no slow boot injected (faults %v)", baseline.Faults))
	}
	for _, m := range slow {
		o, ok := b.Outcome(m)
		if !ok {
			fail = append(fail, fmt.Sprintf("the slow Machine %s has no outcome (%s)", m, b.Summary()))
			continue
		}
		if o.Outcome != "missed" || o.ShimSaid != "healthy-with-traffic" || o.Trigger != "node-startup-timeout" {
			fail = append(fail, fmt.Sprintf("%s, want missed, shim said healthy-with-traffic, MHC node-startup-timeout", o.Summary()))
		}
		printed := false
		for _, l := range b.Printed {
			printed = printed || (strings.Contains(l, "/"+m) && strings.Contains(l, MissedHealthy))
		}
		if !printed {
			fail = append(fail, fmt.Sprintf("`capc-health-shim scorecard` printed no line naming %s with %q: %q", m, MissedHealthy, b.Printed))
		}
	}
	return fail
}

// slowMachines are the Machines a row's slow boots were injected into.
func slowMachines(r Row) []string {
	var out []string
	for _, f := range r.Faults {
		if fault, machine, ok := strings.Cut(f, " on "); ok && fault == "slow-boot" {
			out = append(out, machine)
		}
	}
	return out
}

// EscalationDelay is the --escalation-delay the e2e's shims run with at a time scale: what
// acting on a False adds in annotate mode, and what an observing shim's scorecard subtracts.
func EscalationDelay(scale float64) time.Duration {
	return scaledDuration(shimDefaultEscalationDelay, scale)
}

// MutedScorecardFailures judges the scorecard of a negative-control row (the shim in observe
// mode beside the MHC whose 30-min backstop recycles): each faulty Machine must be
// `would-have-saved`, recycled by the MHC's nodeStartupTimeout, with a saving within
// SavingToleranceMax of what the recorder saw in the same row — deleted − the shim's False −
// the escalation delay, on the recorder's clock. It returns the failures and, per Machine, the
// two numbers. An absent or empty scorecard fails.
func MutedScorecardFailures(muted Row) (fail, shown []string) {
	s := muted.Scorecard
	if s == nil {
		return []string{"no scorecard"}, nil
	}
	if len(muted.Causality) == 0 {
		return []string{"no faulty Machine to judge the scorecard by"}, nil
	}
	lag := EscalationDelay(muted.TimeScale).Seconds()
	for _, c := range muted.Causality {
		o, ok := s.Outcome(c.Machine)
		switch {
		case !ok:
			fail = append(fail, fmt.Sprintf("%s: no outcome in the scorecard (%s)", c.Machine, s.Summary()))
			continue
		case o.Outcome != "would-have-saved" || o.RecycledBy != RecycledByNodeStartupTimeout || o.SavedSecs == nil || *o.SavedSecs <= 0:
			fail = append(fail, fmt.Sprintf("%s: %s, want would-have-saved with a saving, recycled by %s", c.Machine, o.Summary(), RecycledByNodeStartupTimeout))
			continue
		case c.ShimFalse == nil || c.Deleting == nil:
			fail = append(fail, fmt.Sprintf("%s: the recorder saw no False (%s) or no deletion (%s) to check the saving by", c.Machine, f1(c.ShimFalse), f1(c.Deleting)))
			continue
		}
		seen := *c.Deleting - *c.ShimFalse - lag
		line := fmt.Sprintf("%s: the scorecard says acting would have saved %d s; the recorder saw the MHC's backstop delete it %.1f s after the shim's False, − the %.0f s escalation delay = %.1f s", c.Machine, *o.SavedSecs, *c.Deleting-*c.ShimFalse, lag, seen)
		shown = append(shown, line)
		if seen <= 0 || math.Abs(float64(*o.SavedSecs)-seen) > SavingToleranceMax*seen {
			fail = append(fail, line+fmt.Sprintf(": more than %.0f %% apart", 100*SavingToleranceMax))
		}
	}
	return fail, shown
}

// ScorecardSection is report.md's scorecard part (issue 44): per scenario whose baseline the
// shim observed, the saving its scorecard names next to the one annotate mode measured; then
// every run's scorecard at its end.
func ScorecardSection(rows []Row) string {
	var b strings.Builder
	var withCard []Row
	for _, r := range rows {
		if r.Scorecard != nil {
			withCard = append(withCard, r)
		}
	}
	if len(withCard) == 0 {
		return ""
	}
	fmt.Fprintf(&b, "\n## Scorecard (issue 44: what the shim did, or would have done)\n\n")
	var compared []SavingComparison
	for _, base := range withCard {
		if !base.ShimObserver || base.MHC != MHCDefault {
			continue
		}
		for _, s := range rows {
			if s.StackKey() == base.StackKey() && s.Scenario == base.Scenario && s.Mode == ModeShim && s.MHC == MHCRecommended {
				c, _ := CompareSavings(base, s)
				compared = append(compared, c...)
			}
		}
	}
	if len(compared) > 0 {
		fmt.Fprintf(&b, "Baselines with the shim beside the stock MHC in observe mode (`shim_observer`): the scorecard's `would-have-saved` on the faulty Machine (its recycle − (its False + the %.0f s escalation delay)) against what acting saved in the annotate-mode run of the same scenario (the baseline's fault → recycle − the shim run's). Asserted within %.0f %%.\n\n",
			EscalationDelay(TimeScale).Seconds(), 100*SavingToleranceMax)
		fmt.Fprintf(&b, "| CAPI | scenario | Machine | observe mode: would have saved s | baseline fault→recycle s | annotate-mode fault→recycle s | annotate mode saved s | apart |\n|---|---|---|---|---|---|---|---|\n")
		for _, c := range compared {
			fmt.Fprintf(&b, "| %s | %s | %s | %d | %.1f | %.1f | %.1f | %.0f %% |\n", c.Stack, c.Scenario, c.Machine, c.Observed, c.Baseline, c.Shim, c.Measured, 100*c.Off)
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "Every run with the shim: its /status scorecard at the end, before the shim stopped (outcomes of the run's Machines; `uneventful`: stories that said nothing about the shim).\n\n| CAPI | scenario | run | totals | uneventful | following | outcomes |\n|---|---|---|---|---|---|---|\n")
	for _, r := range withCard {
		run := string(r.Mode) + "/" + r.MHC
		if r.ShimObserver {
			run += " (shim observing)"
		}
		keys := make([]string, 0, len(r.Scorecard.Totals))
		for k := range r.Scorecard.Totals {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var totals, outcomes []string
		for _, k := range keys {
			totals = append(totals, fmt.Sprintf("%s %d", k, r.Scorecard.Totals[k]))
		}
		for _, o := range r.Scorecard.Outcomes {
			outcomes = append(outcomes, o.Summary())
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %d | %d | %s |\n", r.StackKey(), r.Scenario, run, strings.Join(totals, ", "), r.Scorecard.Uneventful, r.Scorecard.Following, strings.Join(outcomes, "; "))
	}
	return b.String()
}

// AppendToTimeline adds a line to a finished run's timeline file (a judgment that needs another
// run of the same test, such as CompareSavings).
func AppendToTimeline(path, line string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(f, "  (after the run)  "+line)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
