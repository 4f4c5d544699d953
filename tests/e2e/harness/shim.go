package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"time"
)

// Shim is `capc-health-shim run` as its own process against the management API server, as in
// production (only the kubeconfig differs from in-cluster config).
type Shim struct {
	StatusURL string
	proc      *Process
}

// ShimConfig holds the flags the scenarios scale.
type ShimConfig struct {
	Namespace  string
	Kubeconfig string
	APIURL     string // the endpoint whose credentials are overridden by the read-only key
	LogPath    string
	Scale      float64 // time scale applied to every default duration
	// ProbeSecret, when set, turns the opt-in guest probe on with the key in this Secret of the
	// namespace (--probe-credentials NAMESPACE/NAME). Its pacing follows --stats-interval (three
	// attempts a quarter interval apart), which is scaled already.
	ProbeSecret string
	ExtraArgs   []string
}

// scaled is a default duration of the shim multiplied by the time scale, as a flag value.
func scaled(d time.Duration, scale float64) string {
	ms := int64(float64(d.Milliseconds()) * scale)
	if ms < 1000 {
		ms = 1000
	}
	return strconv.FormatInt(ms/1000, 10) + "s"
}

// ShimArgs are the run flags: every duration the shim defaults to, scaled.
func ShimArgs(c ShimConfig, statusAddr string) []string {
	s := c.Scale
	args := []string{
		"run",
		"--namespace", c.Namespace,
		"--status-addr", statusAddr,
		"--no-leader-election",
		"--endpoint-credentials", fmt.Sprintf("%s=%s/%s", c.APIURL, c.Namespace, ShimSecret),
		"--poll-interval", scaled(30*time.Second, s),
		"--escalation-delay", scaled(60*time.Second, s),
		"--stats-interval", scaled(60*time.Second, s),
		"--stopped-grace", scaled(60*time.Second, s),
		"--transition-grace", scaled(15*time.Minute, s),
		"--host-unreachable-grace", scaled(10*time.Minute, s),
		"--nic-detached-grace", scaled(2*time.Minute, s),
		"--nic-no-address-grace", scaled(5*time.Minute, s),
		"--mass-failure-window", scaled(10*time.Minute, s),
	}
	if c.ProbeSecret != "" {
		// Spacing, recheck and boot grace derive from the scaled --stats-interval. The rest is
		// scaled here: the job timeout; the per-minute budget (a rate: divided by the scale);
		// and arping's own duration, one request a second that no flag shortens — one request
		// per attempt stands for the product's three (3 s × 0.1).
		perMinute := int(60 / s)
		if perMinute < 60 {
			perMinute = 60
		}
		args = append(args,
			"--probe-credentials", c.Namespace+"/"+c.ProbeSecret,
			"--probe-job-timeout", scaled(2*time.Minute, s),
			"--probe-max-per-scope-per-minute", strconv.Itoa(perMinute),
			"--probe-arping-params=-c 1 -f",
		)
	}
	return append(args, c.ExtraArgs...)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// StartShim runs the shim and waits for /readyz.
func StartShim(ctx context.Context, root string, c ShimConfig) (*Shim, error) {
	bin, err := CargoBinary(root, "capc-health-shim")
	if err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	if c.LogPath == "" {
		c.LogPath = filepath.Join(root, "target", "e2e", "logs", "shim-"+c.Namespace+".log")
	}
	p, err := StartProcess("capc-health-shim", c.LogPath, []string{"KUBECONFIG=" + c.Kubeconfig, "RUST_LOG=info"}, bin, ShimArgs(c, addr)...)
	if err != nil {
		return nil, err
	}
	s := &Shim{StatusURL: "http://" + addr, proc: p}
	hc := &http.Client{Timeout: 2 * time.Second}
	err = WaitFor(ctx, 60*time.Second, 200*time.Millisecond, "shim /readyz", func() (bool, error) {
		if done, err := p.Exited(); done {
			return false, fmt.Errorf("shim exited (%v):\n%s", err, tail(p.Log, 20))
		}
		resp, err := hc.Get(s.StatusURL + "/readyz")
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		_ = p.Stop(2 * time.Second)
		return nil, err
	}
	return s, nil
}

// Stop sends SIGTERM and waits; returns the exit error (nil for exit 0).
func (s *Shim) Stop() error { return s.proc.Stop(10 * time.Second) }

// ShimAPI is what the shim's discovery chose, from the `api` section of its /status.
type ShimAPI struct {
	Mode       string `json:"mode"`        // annotate | condition | observe
	ModeSource string `json:"mode_source"` // auto (discovered) | forced
	Layout     string `json:"layout"`      // V1Beta1WithV1Beta2Conditions | V1Beta2
	MHCVersion string `json:"mhc_version"` // the MachineHealthCheck API version it read
}

// ProbeCounts is what the guest probe has done, from the `probe` object of the shim's /status.
type ProbeCounts struct {
	Replies            int `json:"replies"`
	NoReplies          int `json:"no_replies"`
	NoEvidence         int `json:"no_evidence"`
	JobsStarted        int `json:"jobs_started"`
	RouterLookups      int `json:"router_lookups"`
	SkippedForBudget   int `json:"skipped_for_budget"`
	SkippedInFlightCap int `json:"skipped_in_flight_cap"`
	SkippedRouterBusy  int `json:"skipped_router_busy"`
}

// ProbeStatus is the `probe` object of the shim's /status (absent without probe credentials).
type ProbeStatus struct {
	Enabled  bool        `json:"enabled"`
	Endpoint string      `json:"endpoint,omitempty"`
	InFlight int         `json:"in_flight"`
	Counts   ProbeCounts `json:"counts"`
	// Refused: CloudStack refused the probe key (why); the probe stays off until it changes.
	Refused string `json:"refused,omitempty"`
	// LastError: the latest error not about one VM (a router lookup that failed, …).
	LastError string `json:"last_error,omitempty"`
}

type shimStatus struct {
	API   ShimAPI      `json:"api"`
	Probe *ProbeStatus `json:"probe"`
}

func (s *Shim) status(ctx context.Context) (shimStatus, error) {
	var body shimStatus
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.StatusURL+"/status", nil)
	if err != nil {
		return body, err
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return body, err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return body, fmt.Errorf("shim /status: %w", err)
	}
	return body, nil
}

// API reads the shim's /status and returns its discovery result. /readyz can answer before the
// first /status document carries the discovery (seen with the guest probe on, whose first
// cycle also reads the probe's Secret), so it waits up to 15 s for a mode to appear.
func (s *Shim) API(ctx context.Context) (ShimAPI, error) {
	var api ShimAPI
	err := WaitFor(ctx, 15*time.Second, 200*time.Millisecond, "shim /status api", func() (bool, error) {
		st, err := s.status(ctx)
		if err != nil {
			return false, err
		}
		api = st.API
		return api.Mode != "", nil
	})
	if err != nil && ctx.Err() != nil {
		return api, err
	}
	// No mode within the wait: the row's empty shim_mode shows it (and the scenarios fail on it).
	return api, nil
}

// Probe reads the guest probe's state from the shim's /status; nil when the shim runs without
// probe credentials.
func (s *Shim) Probe(ctx context.Context) (*ProbeStatus, error) {
	st, err := s.status(ctx)
	return st.Probe, err
}
