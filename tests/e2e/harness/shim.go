package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"
)

// Shim is `capc-health-shim run` as its own process against the management API server, as in
// production (only the kubeconfig differs from in-cluster config).
type Shim struct {
	StatusURL string
	Config    ShimConfig
	bin       string
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
	return strconv.FormatInt(int64(scaledDuration(d, scale)/time.Second), 10) + "s"
}

// scaledDuration is what scaled passes: the product in whole seconds, at least one.
func scaledDuration(d time.Duration, scale float64) time.Duration {
	ms := int64(float64(d.Milliseconds()) * scale)
	if ms < 1000 {
		ms = 1000
	}
	return time.Duration(ms/1000) * time.Second
}

// The shim's defaults that the harness scales and that scenarios time against.
const (
	shimDefaultPollInterval = 30 * time.Second
	shimDefaultOrphanGrace  = 15 * time.Minute
	shimDefaultRemnantGrace = 15 * time.Minute
	// ShimPollJitter is the spread of the shim's poll interval (±10 %).
	ShimPollJitter = 0.1
)

// PollInterval is the --poll-interval the shim runs with.
func (c ShimConfig) PollInterval() time.Duration {
	return scaledDuration(shimDefaultPollInterval, c.Scale)
}

// OrphanGrace is the --orphan-grace the shim runs with.
func (c ShimConfig) OrphanGrace() time.Duration {
	return scaledDuration(shimDefaultOrphanGrace, c.Scale)
}

// RemnantGrace is the --remnant-grace the shim runs with.
func (c ShimConfig) RemnantGrace() time.Duration {
	return scaledDuration(shimDefaultRemnantGrace, c.Scale)
}

// ShimArgs are the run flags: every duration the shim defaults to, scaled, and the flags of
// NonDefaultShimFlags (each with its reason; tests/e2e/README.md lists them). shim_test.go
// checks every value against the defaults the built binary's `run --help` prints.
func ShimArgs(c ShimConfig, statusAddr string) []string {
	s := c.Scale
	args := []string{
		"run",
		"--namespace", c.Namespace,
		"--status-addr", statusAddr,
		// Plain HTTP on loopback: the harness reads /status and /metrics without a token.
		"--insecure-serving",
		"--no-leader-election",
		"--endpoint-credentials", fmt.Sprintf("%s=%s/%s", c.APIURL, c.Namespace, ShimSecret),
		"--poll-interval", scaled(shimDefaultPollInterval, s),
		"--escalation-delay", scaled(60*time.Second, s),
		"--stats-interval", scaled(60*time.Second, s),
		"--stopped-grace", scaled(60*time.Second, s),
		"--transition-grace", scaled(15*time.Minute, s),
		"--host-unreachable-grace", scaled(10*time.Minute, s),
		"--nic-detached-grace", scaled(60*time.Second, s),
		"--nic-no-address-grace", scaled(60*time.Second, s),
		"--mass-failure-window", scaled(10*time.Minute, s),
		// A VM left behind by a deleted CloudStackMachine is reported after this (15 min → 90 s).
		"--orphan-grace", scaled(shimDefaultOrphanGrace, s),
		// An object stuck deleting or dangling is reported after this (15 min → 90 s).
		"--remnant-grace", scaled(shimDefaultRemnantGrace, s),
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

// NonDefaultShimFlags are the flags the harness passes away from their default and unscaled,
// with the reason. Everything else it passes is the default times the time scale.
var NonDefaultShimFlags = map[string]string{
	"--namespace":                      "one shim per run namespace, so concurrent runs do not see each other's Machines (a deployment watches all namespaces)",
	"--status-addr":                    "a free loopback port per shim instead of 0.0.0.0:8443",
	"--insecure-serving":               "plain HTTP on loopback: the harness reads /status and /metrics without a token (TLS and auth are tested by the Rust tests and make test-image)",
	"--no-leader-election":             "one replica per run; leader election is tested by tests/fault_matrix_kube.rs",
	"--endpoint-credentials":           "the shim reads CloudStack with its own read-only key (Secret e2e-shim-credentials), as docs/install.md recommends, not with CAPC's root-admin key",
	"--probe-credentials":              "turns the opt-in guest probe on (runs in mode shim-probe only)",
	"--probe-max-per-scope-per-minute": "a rate: the default 60 per minute divided by the time scale (600), so the scaled minute holds the same budget",
	"--probe-arping-params":            "-c 1 -f: arping's one request a second is not shortened by any flag; one request per attempt stands for the default's three (3 s × 0.1)",
	"--mode":                           "observe, in the negative control only (mode shim-observe): the shim publishes and never escalates",
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
	s := &Shim{StatusURL: "http://" + addr, Config: c, bin: bin, proc: p}
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
	// Orphans is nil when /status has no "orphans" array (a shim without the orphan report).
	Orphans *[]ShimOrphan `json:"orphans"`
	// Remnants is nil when /status has no "remnants" array (a shim without the remnant report).
	Remnants *[]ShimRemnant               `json:"remnants"`
	Clusters map[string]shimClusterStatus `json:"clusters"`
	// OrphanDetection.Suspects: VMs owned by nothing still within their grace (not reported).
	OrphanDetection *struct {
		Suspects int `json:"suspects"`
	} `json:"orphan_detection"`
}

// shimClusterStatus is one cluster of /status: its Machines by name.
type shimClusterStatus struct {
	Machines map[string]struct {
		VMID *string `json:"vm_id"`
	} `json:"machines"`
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

// Orphans reads the shim's orphan report from /status; present is false when the document has
// no "orphans" array at all (a shim built without the orphan report); suspects is
// orphan_detection.suspects (VMs owned by nothing within their grace), -1 when absent.
func (s *Shim) Orphans(ctx context.Context) (orphans []ShimOrphan, suspects int, present bool, err error) {
	st, err := s.status(ctx)
	if err != nil || st.Orphans == nil {
		return nil, -1, false, err
	}
	suspects = -1
	if st.OrphanDetection != nil {
		suspects = st.OrphanDetection.Suspects
	}
	return *st.Orphans, suspects, true, nil
}

// Remnants is the shim's /status "remnants"; present is false when /status has no such array.
func (s *Shim) Remnants(ctx context.Context) (remnants []ShimRemnant, present bool, err error) {
	st, err := s.status(ctx)
	if err != nil || st.Remnants == nil {
		return nil, false, err
	}
	return *st.Remnants, true, nil
}

// Tracks reports whether the shim's /status lists a Machine of cluster ("namespace/name"), and
// the VM id it has for it ("" before CAPC recorded one): the shim has joined the Machine to its
// CloudStackMachine.
func (s *Shim) Tracks(ctx context.Context, cluster, machine string) (bool, string, error) {
	st, err := s.status(ctx)
	if err != nil {
		return false, "", err
	}
	m, ok := st.Clusters[cluster].Machines[machine]
	if !ok {
		return false, "", nil
	}
	if m.VMID == nil {
		return true, "", nil
	}
	return true, *m.VMID, nil
}

// OrphansCommand runs `capc-health-shim orphans --url <this shim>` as an operator would and
// returns what it printed.
func (s *Shim) OrphansCommand(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, s.bin, "orphans", "--url", s.StatusURL).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("capc-health-shim orphans --url %s: %w: %s", s.StatusURL, err, lastLines(string(out), 5))
	}
	return string(out), nil
}
