package harness

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Summary is the probe's state in one line (for the timeline and the report).
func (p *ProbeStatus) Summary() string {
	if p == nil {
		return "off"
	}
	c := p.Counts
	s := fmt.Sprintf("enabled %v, jobs %d, replies %d, no replies %d, no evidence %d, router lookups %d, in flight %d",
		p.Enabled, c.JobsStarted, c.Replies, c.NoReplies, c.NoEvidence, c.RouterLookups, p.InFlight)
	if n := c.SkippedForBudget + c.SkippedInFlightCap + c.SkippedRouterBusy; n > 0 {
		s += fmt.Sprintf(", skipped %d (budget %d, in-flight cap %d, router busy %d)", n, c.SkippedForBudget, c.SkippedInFlightCap, c.SkippedRouterBusy)
	}
	if p.Refused != "" {
		s += ", REFUSED: " + p.Refused
	}
	if p.LastError != "" {
		s += ", last error: " + p.LastError
	}
	return s
}

// probeEvents says what changed between two reads of the probe's state, as timeline entries:
// the first job and the first reply (healthy guests answer every few seconds, so later replies
// are not listed), every attempt without a reply or without evidence, and a refused key or a
// new error. Pure, so the harness unit tests can check it.
func probeEvents(prev, cur *ProbeStatus) []string {
	if cur == nil {
		return nil
	}
	var p ProbeStatus
	if prev != nil {
		p = *prev
	}
	c, was := cur.Counts, p.Counts
	var out []string
	if was.JobsStarted == 0 && c.JobsStarted > 0 {
		out = append(out, fmt.Sprintf("guest probe: first runDiagnostics job started (%s)", cur.Summary()))
	}
	if was.Replies == 0 && c.Replies > 0 {
		out = append(out, fmt.Sprintf("guest probe: first ARP reply (%s)", cur.Summary()))
	}
	if c.NoReplies > was.NoReplies {
		out = append(out, fmt.Sprintf("guest probe: %d attempt(s) without an ARP reply, %d in all (%s)", c.NoReplies-was.NoReplies, c.NoReplies, cur.Summary()))
	}
	if c.NoEvidence > was.NoEvidence {
		out = append(out, fmt.Sprintf("guest probe: %d attempt(s) without evidence, %d in all", c.NoEvidence-was.NoEvidence, c.NoEvidence))
	}
	if cur.Refused != "" && cur.Refused != p.Refused {
		out = append(out, "guest probe: CloudStack REFUSED the probe key: "+cur.Refused)
	}
	if cur.LastError != "" && cur.LastError != p.LastError {
		out = append(out, "guest probe: error: "+cur.LastError)
	}
	return out
}

// watchProbe reads the shim's probe state twice a second and writes what changed to the
// timeline, until ctx ends.
func watchProbe(ctx context.Context, s *Shim, tl *Timeline) {
	var prev *ProbeStatus
	Every(ctx, 500*time.Millisecond, func() {
		cur, err := s.Probe(ctx)
		if err != nil || cur == nil {
			return
		}
		for _, e := range probeEvents(prev, cur) {
			tl.Add(e)
		}
		prev = cur
	})
}

// FalseMessageOf is the shim's first False message on the Machine from a row's
// ShimFalseMessages ("<machine>: <message>"); ok is false when the shim never said False on it.
func FalseMessageOf(r Row, machine string) (string, bool) {
	for _, m := range r.ShimFalseMessages {
		if name, msg, ok := strings.Cut(m, ": "); ok && name == machine {
			return msg, true
		}
	}
	return "", false
}

// FaultyMachines are the Machines a row's faults were injected on (benign behaviours left out).
func FaultyMachines(r Row) []string {
	var out []string
	for _, f := range r.Faults {
		if fault, machine, ok := strings.Cut(f, " on "); ok && !benignFault(fault) {
			out = append(out, machine)
		}
	}
	return out
}
