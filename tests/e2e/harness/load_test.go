package harness

import (
	"encoding/json"
	"os"
	"testing"
	"time"
)

func TestLoadWindowsAndTheLoadFile(t *testing.T) {
	before := map[string]KeyCalls{"admin": {Calls: 10, ByCommand: map[string]uint64{"listZones": 10}}}
	after := map[string]KeyCalls{
		"admin":   {Calls: 16, AsyncJobs: 1, ByCommand: map[string]uint64{"listZones": 12, "deployVirtualMachine": 4}},
		"shim-ro": {Calls: 3, StatsRows: 5, ByCommand: map[string]uint64{"listVirtualMachines": 3}},
		"idle":    {Calls: 0},
	}
	w := loadWindow(6*time.Second, 3, before, after)
	// 6 s real at scale 0.1 = 60 s of product time; 3 Machines → 0.05 Machine-hours.
	if w.ScaledSeconds != 60 || w.MachineHours != 3*60.0/3600 {
		t.Errorf("window %+v", w)
	}
	a := w.Accounts["admin"]
	if a.Calls != 6 || a.AsyncJobs != 1 || a.ByCommand["listZones"] != 2 || a.ByCommand["deployVirtualMachine"] != 4 {
		t.Errorf("admin %+v", a)
	}
	if _, ok := w.Accounts["idle"]; ok {
		t.Errorf("an account without calls in the window is listed: %+v", w.Accounts)
	}
	dir := t.TempDir()
	if _, err := WriteLoadFile(dir, "v1.9.6", CloudStackLoad{Machines: 3, Provisioning: w}); err == nil {
		t.Error("a load without a steady window was written")
	}
	p, err := WriteLoadFile(dir, "v1.9.6", CloudStackLoad{Machines: 3, Provisioning: w, Steady: &w})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	var doc struct {
		Keys map[string]map[string]struct{ Calls uint64 } `json:"keys"`
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Keys["capc"]["steady"].Calls != 6 || doc.Keys["shim"]["provisioning"].Calls != 3 || doc.Keys["shim_probe"]["steady"].Calls != 0 {
		t.Errorf("load file keys %s", b)
	}
}
