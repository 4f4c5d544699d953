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
	name := fmt.Sprintf("%s--%s--%s.json", r.Scenario, r.Mode, r.MHC)
	return os.WriteFile(filepath.Join(dir, name), b, 0o644)
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

// Markdown renders the rows as a table plus the shim/baseline fault-to-recycle ratios.
func Markdown(rows []Row) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# capc-health-shim end-to-end report\n\n")
	fmt.Fprintf(&b, "Real CAPI v1.9.6 (core, KCP, CABPK) and CAPC v0.6.1 controllers in one process against a real kube-apiserver; cloudstack-sim as CloudStack; CAPI's in-memory API servers as workload clusters; the shim as its own process.\n\n")
	fmt.Fprintf(&b, "Time scale %.2f: every default duration is multiplied by it (CloudStack stats 60 s → %.0f s, VM boot 30 s → 3 s, MHC nodeStartupTimeout 10 min → %.0f s (baseline) and 30 min → %.0f s (recommended, with the shim), the shim's poll interval, escalation delay and graces). CAPI's and CAPC's own requeue timers run unscaled.\n\n",
		TimeScale, 60*TimeScale, 600*TimeScale, 1800*TimeScale)
	fmt.Fprintf(&b, "| scenario | mode | MHC | converged | s to ready | s fault→recycle | recycled | false recycles | orphan VMs | leftover objects | faults | shim False verdicts | CloudStack errors |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %v | %s | %s | %d | %d | %d | %d | %s | %s | %s |\n",
			r.Scenario, r.Mode, r.MHC, r.Converged, f1(r.SecondsToReady), f1(r.SecondsFaultToRecycle),
			r.RecycledMachines, r.FalseRecycles, r.OrphanVMs, r.LeftoverObjects,
			strings.Join(r.Faults, "; "), strings.Join(r.ShimVerdicts, "; "), errorCounts(r.CloudStackResults))
	}
	fmt.Fprintf(&b, "\n## Fault → recycle, shim vs baseline (goal: ratio ≤ 0.5)\n\n| scenario | shim s | baseline s | ratio |\n|---|---|---|---|\n")
	for _, r := range rows {
		if r.Mode != ModeShim || r.SecondsFaultToRecycle == nil {
			continue
		}
		for _, base := range rows {
			if base.Scenario == r.Scenario && base.Mode == ModeBaseline && base.MHC == MHCDefault && base.SecondsFaultToRecycle != nil {
				fmt.Fprintf(&b, "| %s | %.1f | %.1f | %.2f |\n", r.Scenario, *r.SecondsFaultToRecycle, *base.SecondsFaultToRecycle, *r.SecondsFaultToRecycle / *base.SecondsFaultToRecycle)
			}
		}
	}
	fmt.Fprintf(&b, "\nThe goal applies to the network and VM-state faults the shim sees (1, 2, 3, 6). 3b: CAPC itself deletes a Machine whose VM it sees in Error while it is still reconciling it, in both modes. 4: a VM whose services failed sends only NTP/ARP (~4 B/s), under CloudStack's whole-KiB resolution over the shim's window: the shim may read it as silent (GuestNetworkSilent) and it is recycled early; otherwise the recommended MHC's 30-minute backstop (scaled) recycles it. Slow-but-healthy VMs (5) send far more and are never recycled.\n")
	scannedRuns, leaks := 0, 0
	for _, r := range rows {
		if r.SecretLeaks != nil {
			scannedRuns++
			leaks += len(r.SecretLeaks)
		}
	}
	fmt.Fprintf(&b, "\n## Secret scan\n\n%d run(s) scanned (shim log, /status, /metrics, Events, timeline and the row itself) for both CloudStack secret keys and `signature=`: %d finding(s).\n", scannedRuns, leaks)
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
