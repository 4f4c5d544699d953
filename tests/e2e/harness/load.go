package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// KeyCalls is what one CloudStack account's key cost the simulator (GET /sim/calls by_account):
// API requests, vm_stats rows read to answer them, async jobs queued.
type KeyCalls struct {
	Calls     uint64            `json:"calls"`
	StatsRows uint64            `json:"stats_rows"`
	AsyncJobs uint64            `json:"async_jobs"`
	ByCommand map[string]uint64 `json:"by_command,omitempty"`
}

// AccountCalls reads the simulator's per-account counters.
func (s *Sim) AccountCalls(ctx context.Context) (map[string]KeyCalls, error) {
	var out struct {
		ByAccount map[string]KeyCalls `json:"by_account"`
	}
	err := s.do(ctx, http.MethodGet, "/sim/calls", nil, &out)
	return out.ByAccount, err
}

// minus is what each account did between two readings.
func minus(after, before map[string]KeyCalls) map[string]KeyCalls {
	out := map[string]KeyCalls{}
	for account, a := range after {
		b := before[account]
		d := KeyCalls{Calls: a.Calls - b.Calls, StatsRows: a.StatsRows - b.StatsRows, AsyncJobs: a.AsyncJobs - b.AsyncJobs, ByCommand: map[string]uint64{}}
		for cmd, n := range a.ByCommand {
			if n > b.ByCommand[cmd] {
				d.ByCommand[cmd] = n - b.ByCommand[cmd]
			}
		}
		if d.Calls > 0 {
			out[account] = d
		}
	}
	return out
}

// LoadWindow is the CloudStack load of one phase of a run: its length in real and in product
// time (real ÷ the time scale), the Machine-hours it held in product time, and each key's calls.
type LoadWindow struct {
	RealSeconds   float64             `json:"real_seconds"`
	ScaledSeconds float64             `json:"scaled_seconds"`
	MachineHours  float64             `json:"machine_hours"`
	Accounts      map[string]KeyCalls `json:"accounts"`
}

func loadWindow(real time.Duration, machines int, before, after map[string]KeyCalls) LoadWindow {
	scaled := real.Seconds() / TimeScale
	return LoadWindow{RealSeconds: real.Seconds(), ScaledSeconds: scaled, MachineHours: float64(machines) * scaled / 3600, Accounts: minus(after, before)}
}

// Summary is one line per key: calls, stats rows and jobs.
func (w LoadWindow) Summary() string {
	var parts []string
	for _, account := range sortedKeys(w.Accounts) {
		k := w.Accounts[account]
		parts = append(parts, fmt.Sprintf("%s %d calls, %d stats rows, %d jobs", account, k.Calls, k.StatsRows, k.AsyncJobs))
	}
	return fmt.Sprintf("%.0fs (%.2f Machine-hours in product time): %s", w.RealSeconds, w.MachineHours, strings.Join(parts, "; "))
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// CloudStackLoad is a run's load per phase: provisioning (cluster created → ready) and steady
// (ready, every Machine with its Node, for Scenario.SteadyWindow).
type CloudStackLoad struct {
	Machines     int         `json:"machines"`
	Provisioning LoadWindow  `json:"provisioning"`
	Steady       *LoadWindow `json:"steady,omitempty"`
}

// The accounts of cloudstack-fixtures/scenarios/capc-e2e.json, by whose key they are.
var loadKeys = map[string]string{"capc": "admin", "shim": "shim-ro", "shim_probe": "shim-probe"}

// The product defaults the load file names (the bench converts with them).
const (
	// CAPCSyncPeriod is CAPC v0.6.1's --sync-period default (main.go:177-182), its manager's
	// cache resync; the harness runs CAPC's manager with it, scaled.
	CAPCSyncPeriod = time.Minute
)

// WriteLoadFile writes target/e2e/cloudstack-load.json, what make bench reads: per key (CAPC's,
// the shim's, the probe's) and phase, calls, stats rows and jobs, with the windows' Machine-hours.
func WriteLoadFile(outDir, capi string, l CloudStackLoad) (string, error) {
	if l.Steady == nil {
		return "", fmt.Errorf("no steady-state window measured: nothing to write")
	}
	type phase struct {
		Calls     uint64            `json:"calls"`
		StatsRows uint64            `json:"stats_rows"`
		AsyncJobs uint64            `json:"async_jobs"`
		ByCommand map[string]uint64 `json:"by_command"`
	}
	window := func(w LoadWindow) map[string]float64 {
		return map[string]float64{"real_seconds": w.RealSeconds, "scaled_seconds": w.ScaledSeconds, "machine_hours": w.MachineHours}
	}
	keys := map[string]map[string]phase{}
	for key, account := range loadKeys {
		keys[key] = map[string]phase{}
		for name, w := range map[string]*LoadWindow{"provisioning": &l.Provisioning, "steady": l.Steady} {
			k := w.Accounts[account]
			keys[key][name] = phase{k.Calls, k.StatsRows, k.AsyncJobs, k.ByCommand}
		}
	}
	doc := map[string]any{
		"capi_version":               capi,
		"time_scale":                 TimeScale,
		"machines":                   l.Machines,
		"capc_sync_period_seconds":   CAPCSyncPeriod.Seconds(),
		"shim_poll_interval_seconds": shimDefaultPollInterval.Seconds(),
		"windows":                    map[string]any{"provisioning": window(l.Provisioning), "steady": window(*l.Steady)},
		"keys":                       keys,
		"note": "Counted by cloudstack-sim per account while one cluster ran alone (TestCloudStackLoad): capc = CAPC v0.6.1's key, " +
			"shim = the shim's read-only key, shim_probe = the guest probe's key. Windows in product time = real ÷ time scale; " +
			"every shim and CloudStack duration and CAPC's sync period are scaled, CAPC's fixed requeue timers (5 s while a VM is not Running) are not, " +
			"so CAPC's provisioning calls per product hour are an underestimate (the shim's share an overestimate).",
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return "", err
	}
	p := filepath.Join(outDir, "cloudstack-load.json")
	return p, os.WriteFile(p, append(b, '\n'), 0o644)
}
