package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/apache/cloudstack-go/v2/cloudstack"
)

// Sim is a running cloudstack-sim process and a client of its admin API (/sim/...).
type Sim struct {
	BaseURL string // http://127.0.0.1:PORT
	proc    *Process
	http    *http.Client
}

// APIURL is the CloudStack API endpoint CAPC and the shim are pointed at.
func (s *Sim) APIURL() string { return s.BaseURL + "/client/api" }

var simListening = regexp.MustCompile(`listening on (\S+)`)

// StartSim runs cloudstack-sim on a free loopback port with a scenario file.
func StartSim(ctx context.Context, root, logPath, scenario string) (*Sim, error) {
	bin, err := CargoBinary(root, "cloudstack-sim")
	if err != nil {
		return nil, err
	}
	p, err := StartProcess("cloudstack-sim", logPath, nil, bin,
		"--listen", "127.0.0.1:0", "--scenario", scenario)
	if err != nil {
		return nil, err
	}
	url, err := p.WaitLine(ctx, simListening, 30*time.Second)
	if err != nil {
		_ = p.Stop(time.Second)
		return nil, err
	}
	return &Sim{BaseURL: strings.TrimRight(url, "/"), proc: p, http: &http.Client{Timeout: 10 * time.Second}}, nil
}

// ScenarioPath is a scenario file of cloudstack-fixtures/scenarios.
func ScenarioPath(root, name string) string {
	return filepath.Join(root, "cloudstack-fixtures", "scenarios", name)
}

// Stop ends the simulator.
func (s *Sim) Stop() { _ = s.proc.Stop(3 * time.Second) }

// SimVM is the admin view of one simulated VM (GET /sim/vms).
type SimVM struct {
	ID        string   `json:"id"`
	Name      string   `json:"name"`
	State     string   `json:"state"`
	Removed   bool     `json:"removed"`
	Guest     string   `json:"guest"`
	Faults    []string `json:"faults"`
	IPAddress *string  `json:"ipaddress"`
	Joined    bool     `json:"joined"`
	// Deployed: created by deployVirtualMachine (not by the scenario file or the admin API).
	Deployed bool `json:"deployed"`
}

// Gone reports whether the VM is destroyed or on its way out.
func (v SimVM) Gone() bool {
	return v.Removed || v.State == "Destroyed" || v.State == "Expunging" || v.State == "Expunged"
}

// VMs lists every VM the simulator knows, including destroyed ones still present.
func (s *Sim) VMs(ctx context.Context) ([]SimVM, error) {
	var out struct {
		VMs []SimVM `json:"vms"`
	}
	if err := s.do(ctx, http.MethodGet, "/sim/vms", nil, &out); err != nil {
		return nil, err
	}
	return out.VMs, nil
}

// InjectFault applies a fault (nic-down, error, stop, ...) to a VM now.
func (s *Sim) InjectFault(ctx context.Context, vmID, fault string) error {
	return s.do(ctx, http.MethodPost, "/sim/vms/"+vmID+"/faults", map[string]string{"fault": fault}, nil)
}

// ClearFaults removes every injected fault of a VM (DELETE /sim/vms/{id}/faults): a
// destroy-fails VM's next destroyVirtualMachine succeeds.
func (s *Sim) ClearFaults(ctx context.Context, vmID string) error {
	return s.do(ctx, http.MethodDelete, "/sim/vms/"+vmID+"/faults", nil, nil)
}

// VM returns one VM by id (GET /sim/vms/{id}).
func (s *Sim) VM(ctx context.Context, vmID string) (SimVM, error) {
	var vm SimVM
	err := s.do(ctx, http.MethodGet, "/sim/vms/"+vmID, nil, &vm)
	return vm, err
}

// DestroyVM is what an operator's `cmk destroy virtualmachine id=<id> expunge=true` does: the
// signed destroyVirtualMachine call (with the e2e admin key, as cmk would with an admin's),
// waiting for its async job like cmk.
func (s *Sim) DestroyVM(ctx context.Context, vmID string, expunge bool) error {
	cs := cloudstack.NewAsyncClient(s.APIURL(), SimAdminKey, SimAdminSecret, false)
	cs.AsyncTimeout(60)
	p := cs.VirtualMachine.NewDestroyVirtualMachineParams(vmID)
	p.SetExpunge(expunge)
	done := make(chan error, 1)
	go func() {
		_, err := cs.VirtualMachine.DestroyVirtualMachine(p)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("destroyVirtualMachine id=%s expunge=%v: %w", vmID, expunge, err)
		}
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// SetProfile sets a VM's guest traffic profile (waiting-for-endpoint, idle-joined, ...) from now
// on; "default" returns it to the plan of its guest kind.
func (s *Sim) SetProfile(ctx context.Context, vmID, profile string) error {
	return s.do(ctx, http.MethodPost, "/sim/vms/"+vmID+"/guest", map[string]string{"profile": profile}, nil)
}

// SetAPI changes API-level fault settings (outage, throttle, latency, ...), as POST /sim/api.
func (s *Sim) SetAPI(ctx context.Context, settings map[string]any) error {
	return s.do(ctx, http.MethodPost, "/sim/api", settings, nil)
}

// Calls returns GET /sim/calls.
func (s *Sim) Calls(ctx context.Context) (map[string]any, error) {
	var out map[string]any
	err := s.do(ctx, http.MethodGet, "/sim/calls", nil, &out)
	return out, err
}

func (s *Sim) do(ctx context.Context, method, path string, body any, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, s.BaseURL+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(b)))
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("%s %s: %w", method, path, err)
		}
	}
	return nil
}
