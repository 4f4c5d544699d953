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
	// shimDefaultEscalationDelay: --escalation-delay, how long a False stands before the shim
	// annotates.
	shimDefaultEscalationDelay = 60 * time.Second
	shimDefaultOrphanGrace     = 15 * time.Minute
	shimDefaultRemnantGrace    = 15 * time.Minute
	// shimDefaultScorecardSettle: --scorecard-settle, how long a Machine with its Node stays
	// True before its scorecard story ends.
	shimDefaultScorecardSettle = 10 * time.Minute
	// ShimPollJitter is the spread of the shim's poll interval (±10 %).
	ShimPollJitter = 0.1
)

// ScorecardSettle is the --scorecard-settle the shim runs with.
func (c ShimConfig) ScorecardSettle() time.Duration {
	return scaledDuration(shimDefaultScorecardSettle, c.Scale)
}

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
		"--escalation-delay", scaled(shimDefaultEscalationDelay, s),
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
		// A Machine with its Node ends its scorecard story after this long True (10 min → 60 s).
		"--scorecard-settle", scaled(shimDefaultScorecardSettle, s),
		"--scorecard-window", scaled(168*time.Hour, s),
		// The shim's memory ConfigMap (orphan memory and scorecard counts) in the run's own
		// namespace: concurrent shims must not restore each other's counts.
		"--lease-namespace", c.Namespace,
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
	"--mode":                           "observe, in the negative control (mode shim-observe) and beside the baselines of scenarios 1, 3 and 5 on CAPI v1.9 (shim_observer): the shim publishes and never escalates",
	"--lease-namespace":                "the run's namespace: the shim keeps its memory ConfigMap (orphan memory, scorecard counts) in the Lease's namespace, which outside a pod defaults to `default`, shared by every concurrent shim; there a shim would start from another run's scorecard counts (no Lease is taken: --no-leader-election)",
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
	API ShimAPI `json:"api"`
	// Scorecard is nil when /status has no "scorecard" (a shim without it, or a standby).
	Scorecard *ShimScorecard `json:"scorecard"`
	Probe     *ProbeStatus   `json:"probe"`
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

// ShimScorecard is the `scorecard` section of the shim's /status (docs/scorecard.md): what the
// shim did, or would have done, on the Machines whose story ended.
type ShimScorecard struct {
	SettleSeconds int `json:"settle_seconds"`
	// Following is how many Machines' stories are still going on.
	Following  int                       `json:"following"`
	Totals     map[string]ScorecardTotal `json:"totals"`
	Uneventful int                       `json:"uneventful"`
	Untracked  int                       `json:"untracked"`
	Recent     []ShimOutcome             `json:"recent"`
}

// ScorecardTotal is one outcome's count and the seconds it adds up.
type ScorecardTotal struct {
	Count   int   `json:"count"`
	Seconds int64 `json:"seconds"`
}

// ShimOutcome is one entry of /status scorecard.recent.
type ShimOutcome struct {
	Machine  string      `json:"machine"` // namespace/name
	Kind     OutcomeKind `json:"kind"`
	Reason   string      `json:"reason"`
	Evidence string      `json:"evidence"`
	At       string      `json:"at"`
}

// OutcomeKind is an outcome's `kind`: `outcome` and the fields of that outcome (absent ones
// stay nil or empty).
type OutcomeKind struct {
	Outcome           string `json:"outcome"`
	SavedSecs         *int64 `json:"saved_secs,omitempty"`
	FalseToDeleteSecs *int64 `json:"false_to_delete_secs,omitempty"`
	FalseToNodeSecs   *int64 `json:"false_to_node_secs,omitempty"`
	FalseForSecs      *int64 `json:"false_for_secs,omitempty"`
	// RecycledBy (would-have-saved): "hand", or {"mhc": trigger}.
	RecycledBy json.RawMessage `json:"recycled_by,omitempty"`
	// ShimSaid and Trigger (missed): what the shim said, why the MHC marked the Machine.
	ShimSaid string `json:"shim_said,omitempty"`
	Trigger  string `json:"trigger,omitempty"`
}

// Recycler reads RecycledBy as "hand" or "mhc:<trigger>" ("" when absent).
func (k OutcomeKind) Recycler() string {
	if len(k.RecycledBy) == 0 {
		return ""
	}
	var word string
	if json.Unmarshal(k.RecycledBy, &word) == nil {
		return word
	}
	var mhc struct {
		MHC string `json:"mhc"`
	}
	if json.Unmarshal(k.RecycledBy, &mhc) == nil && mhc.MHC != "" {
		return "mhc:" + mhc.MHC
	}
	return string(k.RecycledBy)
}

// Scorecard reads the shim's /status scorecard; nil when the document has none.
func (s *Shim) Scorecard(ctx context.Context) (*ShimScorecard, error) {
	st, err := s.status(ctx)
	return st.Scorecard, err
}

// ScorecardCommand runs `capc-health-shim scorecard --url <this shim>` as an operator would and
// returns what it printed.
func (s *Shim) ScorecardCommand(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, s.bin, "scorecard", "--url", s.StatusURL).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("capc-health-shim scorecard --url %s: %w: %s", s.StatusURL, err, lastLines(string(out), 5))
	}
	return string(out), nil
}
