package harness

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// SaveRow writes one run's row to target/e2e/rows/ (the report is assembled from them).
func SaveRow(outDir string, r Row) error {
	dir := filepath.Join(outDir, "rows")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, rowFile(r.StackKey(), r.Scenario, string(r.Mode), r.MHC)), b, 0o644)
}

// StackKey names the stack a row ran on: the CAPI version, and the feature gates set away
// from that release's defaults.
func (r Row) StackKey() string {
	if r.CAPIFeatureGates == "" {
		return r.CAPIVersion
	}
	return r.CAPIVersion + " " + r.CAPIFeatureGates
}

// StackKey is what the rows of this stack carry (Row.StackKey).
func (s Stack) StackKey() string {
	return Row{CAPIVersion: s.CAPI, CAPIFeatureGates: s.FeatureGates}.StackKey()
}

func rowFile(stack, scenario, mode, mhc string) string {
	return fmt.Sprintf("capi-%s--%s--%s--%s.json", strings.NewReplacer(" ", "-", "=", "-", ",", "-").Replace(stack), scenario, mode, mhc)
}

// DropRows removes the saved rows of one stack (a new run of that stack replaces them; the
// other stacks' rows stay, so one report covers them all).
func DropRows(outDir, stack string) error {
	files, err := filepath.Glob(filepath.Join(outDir, "rows", rowFile(stack, "*", "*", "*")))
	if err != nil {
		return err
	}
	for _, f := range files {
		if err := os.Remove(f); err != nil {
			return err
		}
	}
	return nil
}

// LoadRows reads the saved rows, sorted by scenario then mode.
func LoadRows(outDir string) ([]Row, error) {
	files, err := filepath.Glob(filepath.Join(outDir, "rows", "*.json"))
	if err != nil {
		return nil, err
	}
	var rows []Row
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var r Row
		if err := json.Unmarshal(b, &r); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		rows = append(rows, r)
	}
	sort.SliceStable(rows, func(i, j int) bool {
		if rows[i].StackKey() != rows[j].StackKey() {
			return rows[i].StackKey() < rows[j].StackKey()
		}
		if rows[i].Scenario != rows[j].Scenario {
			return rows[i].Scenario < rows[j].Scenario
		}
		return string(rows[i].Mode)+rows[i].MHC > string(rows[j].Mode)+rows[j].MHC
	})
	return rows, nil
}

// WriteReport writes target/e2e/report.json and report.md from the rows.
func WriteReport(outDir string, rows []Row) error {
	b, err := json.MarshalIndent(rows, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(outDir, "report.json"), append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(outDir, "report.md"), []byte(Markdown(rows)), 0o644)
}

func f1(p *float64) string {
	if p == nil {
		return "—"
	}
	return fmt.Sprintf("%.1f", *p)
}

// Markdown renders the rows as a table plus the shim/baseline fault-to-recycle ratios per CAPI
// version, and the CAPI × mode × scenario matrix.
func Markdown(rows []Row) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# capc-health-shim end-to-end report\n\n")
	fmt.Fprintf(&b, "CAPC v0.6.1 against a real kube-apiserver with CAPI core of one of two generations: CAPI v1.9.6 (what CAPC links) in the same process, the shim in annotate mode; or CAPI v1.13.5 core, KCP, CABPK and MHC in a process of their own (v1beta2 storage, their own conversion webhooks) next to CAPC in its process, the shim in condition mode with a v1beta2 MachineHealthCheck. cloudstack-sim as CloudStack; CAPI's in-memory API servers as workload clusters; the shim as its own process.\n\n")
	fmt.Fprintf(&b, "Time scale %.2f: every default duration is multiplied by it (CloudStack stats 60 s → %.0f s, VM boot 30 s → 3 s, MHC nodeStartupTimeout 10 min → %.0f s (baseline) and 30 min → %.0f s (recommended, with the shim), the shim's poll interval, escalation delay and graces, and condition mode's unhealthyMachineConditions timeout 60 s → %.0f s). CAPI's and CAPC's own requeue timers run unscaled, except two through hooks: ClusterCache's connection retry (30 s → 2 s) and, on CAPI ≥ 1.13, the MachineHealthCheck's 15 s reconcile limit (feature gate ReconcilerRateLimiting=false; the CAPI column names the gates a stack ran with, a bare version = that release's defaults).\n\n",
		TimeScale, 60*TimeScale, 600*TimeScale, 1800*TimeScale, 60*TimeScale)
	fmt.Fprintf(&b, "`orphan VMs` are the cluster's VMs left in the simulator without a CloudStackMachine (after teardown too); `orphans reported` the VMs the shim's orphan report named during the run (read from /status every 250 ms up to teardown), `false orphans` those of them the scenario did not orphan on purpose (goal: 0). `remnants reported` are the objects the API server showed stuck deleting or dangling past --remnant-grace that the shim's /status remnants named with the right reason within the grace plus two polls (of `remnants expected`), `false remnants` the objects it named that the API server did not show so, with another reason or early (goal: 0).\n\n")
	fmt.Fprintf(&b, "| CAPI | scenario | mode | shim mode | MHC | converged | s to ready | s fault→recycle | recycled | false recycles | orphan VMs | orphans reported | false orphans | remnants reported/expected | false remnants | leftover objects | faults | shim False verdicts | CloudStack errors |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %v | %s | %s | %d | %d | %d | %d | %d | %d/%d | %d | %d | %s | %s | %s |\n",
			r.StackKey(), r.Scenario, r.Mode, shimModeCell(r), r.MHC, r.Converged, f1(r.SecondsToReady), f1(r.SecondsFaultToRecycle),
			r.RecycledMachines, r.FalseRecycles, r.OrphanVMs, r.OrphansReported, r.FalseOrphans, r.RemnantsReported, r.RemnantsExpected, r.FalseRemnants, r.LeftoverObjects,
			strings.Join(r.Faults, "; "), strings.Join(r.ShimVerdicts, "; "), errorCounts(r.CloudStackResults))
	}
	fmt.Fprintf(&b, "\n## Fault → recycle, shim vs baseline on the same stack\n\nAsserted for the shim rows of scenarios 1, 2, 3 and 6 (harness/causality.go): ratio ≤ %.1f and fault → recycle under %.1f × the shim run's MHC backstop; the negative control (mode shim-observe) must fail both.\n\n| CAPI | shim mode | scenario | run | shim s | baseline s | ratio |\n|---|---|---|---|---|---|---|\n", SpeedRatioMax, BackstopFractionMax)
	for _, r := range rows {
		if ratio, base, ok := RecycleRatio(rows, r); ok {
			run := string(r.Mode)
			if r.MHC != MHCRecommended {
				run += " (MHC " + r.MHC + ")"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %.1f | %.1f | %.2f |\n", r.StackKey(), shimModeCell(r), r.Scenario, run, *r.SecondsFaultToRecycle, base, ratio)
		}
	}
	fmt.Fprintf(&b, "\nThe goal applies to the network and VM-state faults the shim sees (1, 2, 3, 6). 3b: CAPC itself deletes a Machine whose VM it sees in Error while it is still reconciling it, in both modes. 4: a VM whose services failed sends only NTP/ARP (~4 B/s), under CloudStack's whole-KiB resolution over the shim's window: the shim may read it as silent (GuestNetworkSilent) and it is recycled early; otherwise the recommended MHC's 30-minute backstop (scaled) recycles it. Slow-but-healthy VMs (5) send far more and are never recycled.\n")
	b.WriteString(ProbeSection(rows))
	b.WriteString(ScorecardSection(rows))
	b.WriteString(OrphanSection(rows))
	b.WriteString(Matrix(rows))
	scannedRuns, leaks := 0, 0
	for _, r := range rows {
		if r.SecretLeaks != nil {
			scannedRuns++
			leaks += len(r.SecretLeaks)
		}
	}
	fmt.Fprintf(&b, "\n## Secret scan\n\n%d run(s) scanned (shim log, /status, /metrics, Events, timeline and the row itself) for the CloudStack secret keys (CAPC's, the read-only key's, the guest probe's), the probe's API key and `signature=`: %d finding(s).\n", scannedRuns, leaks)
	return b.String()
}

func shimModeCell(r Row) string {
	if r.ShimMode == "" {
		return "—"
	}
	if r.ShimModeSource == "" {
		return r.ShimMode
	}
	return r.ShimMode + " (" + r.ShimModeSource + ")"
}

// RecycleRatio is a shim (or shim-probe) row's fault→recycle time over its stack's baseline
// (default MHC) row.
func RecycleRatio(rows []Row, r Row) (ratio, base float64, ok bool) {
	if !r.Mode.WithShim() || r.SecondsFaultToRecycle == nil {
		return 0, 0, false
	}
	for _, b := range rows {
		if b.StackKey() == r.StackKey() && b.Scenario == r.Scenario && b.Mode == ModeBaseline && b.MHC == MHCDefault && b.SecondsFaultToRecycle != nil {
			return *r.SecondsFaultToRecycle / *b.SecondsFaultToRecycle, *b.SecondsFaultToRecycle, true
		}
	}
	return 0, 0, false
}

// Matrix is the CAPI × mode × scenario table of docs/versions.md: per scenario and stack, whether
// the shim run converged, its fault→recycle ratio to the stack's baseline, and its false recycles,
// orphans and leftovers.
func Matrix(rows []Row) string {
	var capis, scenarios []string
	seen := map[string]bool{}
	cells := map[string]Row{}
	for _, r := range rows {
		if r.Mode != ModeShim || r.MHC != MHCRecommended {
			continue
		}
		if !seen["c"+r.StackKey()] {
			seen["c"+r.StackKey()] = true
			capis = append(capis, r.StackKey())
		}
		if !seen["s"+r.Scenario] {
			seen["s"+r.Scenario] = true
			scenarios = append(scenarios, r.Scenario)
		}
		cells[r.StackKey()+"|"+r.Scenario] = r
	}
	sort.Strings(capis)
	sort.Strings(scenarios)
	var b strings.Builder
	fmt.Fprintf(&b, "\n## Matrix: CAPI × shim mode × scenario (shim runs)\n\nEach cell: converged, fault→recycle shim/baseline ratio on the same stack (— when nothing faulty was recycled), false recycles / orphan VMs / leftover objects / false orphans / false remnants.\n\n| scenario |")
	for _, c := range capis {
		mode := ""
		for _, s := range scenarios {
			if r, ok := cells[c+"|"+s]; ok && r.ShimMode != "" {
				mode = " " + r.ShimMode
				break
			}
		}
		fmt.Fprintf(&b, " CAPI %s%s |", c, mode)
	}
	fmt.Fprintf(&b, "\n|---|%s\n", strings.Repeat("---|", len(capis)))
	for _, s := range scenarios {
		fmt.Fprintf(&b, "| %s |", s)
		for _, c := range capis {
			r, ok := cells[c+"|"+s]
			if !ok {
				b.WriteString(" not run |")
				continue
			}
			ratio := "—"
			if v, _, ok := RecycleRatio(rows, r); ok {
				ratio = fmt.Sprintf("%.2f", v)
			}
			conv := "converged"
			if !r.Converged {
				conv = "NOT converged"
			}
			fmt.Fprintf(&b, " %s, %s, %d/%d/%d/%d/%d |", conv, ratio, r.FalseRecycles, r.OrphanVMs, r.LeftoverObjects, r.FalseOrphans, r.FalseRemnants)
		}
		b.WriteString("\n")
	}
	return b.String()
}

// errorCounts renders the non-200 answers as "429×3, 503×12".
func errorCounts(results map[string]int) string {
	var keys []string
	for k := range results {
		if k != "200" {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s×%d", k, results[k]))
	}
	return strings.Join(parts, ", ")
}

// ProbeSection is the guest probe's table: per shim-probe row, its fault→recycle time and ratio
// to the same stack's baseline next to the plain shim row's, and what the probe did (from the
// shim's /status at the end of the run). Empty when no row ran with the probe.
func ProbeSection(rows []Row) string {
	var b strings.Builder
	for _, r := range rows {
		if r.Mode != ModeShimProbe {
			continue
		}
		if b.Len() == 0 {
			fmt.Fprintf(&b, "\n## Guest probe (shim-probe runs: the shim with --probe-credentials, arping from the network's virtual router)\n\n")
			fmt.Fprintf(&b, "Ratios are fault→recycle over the same stack's baseline; speed is reported, not asserted.\n\n")
			fmt.Fprintf(&b, "| CAPI | scenario | converged | probe s fault→recycle | probe ratio | shim s | shim ratio | jobs | replies | no replies | no evidence | refused | faulty Machine's False evidence |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		}
		ratio := "—"
		if v, _, ok := RecycleRatio(rows, r); ok {
			ratio = fmt.Sprintf("%.2f", v)
		}
		shimS, shimRatio := "—", "—"
		for _, o := range rows {
			if o.Mode == ModeShim && o.StackKey() == r.StackKey() && o.Scenario == r.Scenario && o.MHC == r.MHC {
				shimS = f1(o.SecondsFaultToRecycle)
				if v, _, ok := RecycleRatio(rows, o); ok {
					shimRatio = fmt.Sprintf("%.2f", v)
				}
			}
		}
		jobs, replies, noReplies, noEvidence, refused := "—", "—", "—", "—", "—"
		if p := r.Probe; p != nil {
			c := p.Counts
			jobs, replies, noReplies, noEvidence = fmt.Sprint(c.JobsStarted), fmt.Sprint(c.Replies), fmt.Sprint(c.NoReplies), fmt.Sprint(c.NoEvidence)
			refused = "no"
			if p.Refused != "" {
				refused = p.Refused
			}
		}
		var evidence []string
		for _, m := range FaultyMachines(r) {
			if msg, ok := FalseMessageOf(r, m); ok {
				evidence = append(evidence, m+": "+msg)
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %v | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
			r.StackKey(), r.Scenario, r.Converged, f1(r.SecondsFaultToRecycle), ratio, shimS, shimRatio,
			jobs, replies, noReplies, noEvidence, strings.ReplaceAll(refused, "|", "/"), strings.ReplaceAll(strings.Join(evidence, "; "), "|", "/"))
	}
	return b.String()
}

// OrphanSection is the orphan report's table: per VM a row orphaned on purpose (scenario 8) or
// the shim listed without being so, what the shim said and when. Empty when there is none.
func OrphanSection(rows []Row) string {
	var b strings.Builder
	for _, r := range rows {
		for _, o := range r.OrphanReports {
			if b.Len() == 0 {
				fmt.Fprintf(&b, "\n## Orphan reports (VMs CAPI lost; the shim reports, never deletes)\n\n")
				fmt.Fprintf(&b, "s to report: the shim's `reported_at` − when the harness saw the CloudStackMachine gone; seen: the harness's own clock to the first /status read listing it as reported; bound: grace + two poll intervals with 10 %% jitter. A race of — is a VM the scenario did not orphan (a false orphan).\n\n")
				fmt.Fprintf(&b, "| CAPI | scenario | race | VM | expected kind | reported kind | s to report | s seen | bound s | reported_at − since s | Event | cmk command | s destroyed → cleared |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
			}
			race, kind := o.Race, o.Kind
			if race == "" {
				race = "—"
			}
			if !o.Reported {
				kind = "not reported"
				if o.Kind != "" {
					kind = "suspected " + o.Kind
				}
			}
			event, cmd := "no", "no"
			if o.Event != "" {
				event = "yes"
			}
			if o.Command != "" {
				cmd = "yes"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s (%s) | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n",
				r.StackKey(), r.Scenario, race, o.VMID, o.VMName, o.ExpectedKind, kind, f1(o.SecondsToReport), f1(o.SecondsToReportSeen),
				f1(r.OrphanBoundSeconds), f1(o.SecondsGraceApplied), event, cmd, f1(o.SecondsToClear))
		}
	}
	return b.String()
}
