package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Stack is the CAPI generation a harness runs: which CRDs the API server installs and who runs
// the CAPI core controllers.
type Stack struct {
	// Name is the report's capi_version and the API server profile (hack/apiserver).
	Name string
	// CAPI is the CAPI release of the core controllers.
	CAPI string
	// CoreBinary, when set, is process B: CAPI core in its own Go module (tests/e2e/capi-core,
	// built by `make e2e-build`), next to CAPC in this process; empty = CAPI v1.9.6 core in
	// this process with CAPC, as CAPC v0.6.1 links it.
	CoreBinary string
	// FeatureGates is process B's --feature-gates ("" = the CAPI release's defaults).
	FeatureGates string
}

var (
	// StackCAPI19 is CAPC v0.6.1 with the CAPI it links (v1.9.6) in one process: annotate mode.
	StackCAPI19 = Stack{Name: "capi-1.9", CAPI: "v1.9.6"}
	// StackCAPI113 is CAPC v0.6.1 (process A, CAPI v1.9.6 libraries) next to CAPI v1.13.5 core
	// (process B) with v1beta2 storage, as platforms pair them: condition mode.
	StackCAPI113 = Stack{Name: "capi-1.13", CAPI: "v1.13.5", CoreBinary: "capi-core-v1.13"}
	// StackCAPI114 is the same pairing with CAPI v1.14.2 core (process B built with
	// -tags capi114 -modfile=go.capi114.mod).
	StackCAPI114 = Stack{Name: "capi-1.14", CAPI: "v1.14.2", CoreBinary: "capi-core-v1.14"}
)

// ScaledFeatureGates are the CAPI feature gates process B runs with unless
// CAPC_E2E_CAPI_FEATURE_GATES says otherwise ("defaults" = the release's defaults).
// ReconcilerRateLimiting (beta, on by default since v1.13) holds each MachineHealthCheck to one
// reconcile per 15 s (util/controller/controller.go and machinehealthcheck_controller.go:106 at
// v1.13.5): a timer with no hook that would scale it to 1.5 s, which on the 0.1 time scale
// would stand for 150 s. Off, it becomes controller-runtime's default queue (no minimum
// interval), nearer to the scaled 1.5 s; the baseline runs on the same process B.
const ScaledFeatureGates = "ReconcilerRateLimiting=false"

// StackFromEnv picks the stack from CAPC_E2E_CAPI: "1.9" (default), "1.13" or "1.14".
func StackFromEnv() (Stack, error) {
	var s Stack
	switch v := strings.TrimPrefix(os.Getenv("CAPC_E2E_CAPI"), "v"); v {
	case "", "1.9":
		return StackCAPI19, nil
	case "1.13":
		s = StackCAPI113
	case "1.14":
		s = StackCAPI114
	default:
		return Stack{}, fmt.Errorf("CAPC_E2E_CAPI=%q: want 1.9, 1.13 or 1.14", v)
	}
	switch g := os.Getenv("CAPC_E2E_CAPI_FEATURE_GATES"); g {
	case "":
		s.FeatureGates = ScaledFeatureGates
	case "defaults":
		s.FeatureGates = ""
	default:
		s.FeatureGates = g
	}
	return s, nil
}

// MachineVersion is the Machine API version the stack's MachineHealthCheck reads.
func (s Stack) MachineVersion() string {
	if s.V1Beta2() {
		return "v1beta2"
	}
	return "v1beta1"
}

// V1Beta2 reports whether CAPI stores v1beta2 and users write v1beta2 MachineHealthChecks
// (checks.unhealthyMachineConditions): the shim's condition mode. Only CAPI ≥ 1.13 runs as
// process B (CAPC links v1.9 and nothing newer), so that is the two-process stacks.
func (s Stack) V1Beta2() bool { return s.TwoProcess() }

// TwoProcess reports whether CAPI core runs in its own process (B).
func (s Stack) TwoProcess() bool { return s.CoreBinary != "" }

// CoreProcess is process B: capi-core from tests/e2e/capi-core.
type CoreProcess struct {
	Version string // what the binary reports it links
	proc    *Process
}

// StartCore runs process B against kubeconfig and waits until its webhooks and conversion are
// installed and its caches synced (it writes its ready file last).
func StartCore(ctx context.Context, root string, s Stack, kubeconfig, logPath string) (*CoreProcess, error) {
	bin := filepath.Join(root, "target", "e2e", "bin", s.CoreBinary)
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("%s missing: run `make e2e-build` (builds tests/e2e/capi-core)", bin)
	}
	ready := filepath.Join(filepath.Dir(logPath), s.CoreBinary+".ready")
	_ = os.Remove(ready)
	p, err := StartProcess(s.CoreBinary, logPath, nil, bin, "--kubeconfig", kubeconfig, "--ready-file", ready, "--feature-gates", s.FeatureGates)
	if err != nil {
		return nil, err
	}
	var version []byte
	err = WaitFor(ctx, 2*time.Minute, 200*time.Millisecond, s.CoreBinary+" ready", func() (bool, error) {
		if done, err := p.Exited(); done {
			return false, fmt.Errorf("%s exited (%v):\n%s", s.CoreBinary, err, tail(p.Log, 30))
		}
		b, err := os.ReadFile(ready)
		version = b
		return err == nil, nil
	})
	if err != nil {
		_ = p.Stop(5 * time.Second)
		return nil, err
	}
	return &CoreProcess{Version: strings.TrimSpace(string(version)), proc: p}, nil
}

// Stop ends process B.
func (c *CoreProcess) Stop() { _ = c.proc.Stop(20 * time.Second) }
