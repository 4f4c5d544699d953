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
	ExtraArgs  []string
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

// API reads the shim's /status and returns its discovery result.
func (s *Shim) API(ctx context.Context) (ShimAPI, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.StatusURL+"/status", nil)
	if err != nil {
		return ShimAPI{}, err
	}
	resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
	if err != nil {
		return ShimAPI{}, err
	}
	defer resp.Body.Close()
	var body struct {
		API ShimAPI `json:"api"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return ShimAPI{}, fmt.Errorf("shim /status: %w", err)
	}
	return body.API, nil
}
