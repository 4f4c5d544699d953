package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// APIServer is the repository's real etcd + kube-apiserver (hack/apiserver), with the CRDs of
// one profile (CAPI v1.9 or v1.13, and CAPC) installed by its runner.
type APIServer struct {
	Kubeconfig string
	proc       *Process
}

// StartAPIServer runs hack/apiserver's runner (built by `make apiserver-runner`) with a CRD
// profile (capi-1.9, capi-1.13) in dir and waits for its kubeconfig, which it writes last.
func StartAPIServer(ctx context.Context, root, dir, profile string) (*APIServer, error) {
	runner := os.Getenv("APISERVER_RUNNER")
	if runner == "" {
		runner = filepath.Join(root, "target", "hack", "apiserver-run")
	}
	if _, err := os.Stat(runner); err != nil {
		return nil, fmt.Errorf("%s missing: run `make apiserver-runner`", runner)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	_ = os.Remove(kubeconfig)
	p, err := StartProcess("apiserver", filepath.Join(dir, "..", "apiserver.log"), nil, runner,
		"--profile", profile, "--dir", dir)
	if err != nil {
		return nil, err
	}
	// A cold cache builds the binaries first (minutes); CI builds them up front.
	err = WaitFor(ctx, 40*time.Minute, 200*time.Millisecond, "API server kubeconfig", func() (bool, error) {
		if done, err := p.Exited(); done {
			return false, fmt.Errorf("API server runner exited (%v):\n%s", err, tail(p.Log, 30))
		}
		if strings.Contains(tail(p.Log, 5), "FAILED") {
			return false, fmt.Errorf("API server runner failed:\n%s", tail(p.Log, 30))
		}
		_, err := os.Stat(kubeconfig)
		return err == nil, nil
	})
	if err != nil {
		_ = p.Stop(5 * time.Second)
		return nil, err
	}
	return &APIServer{Kubeconfig: kubeconfig, proc: p}, nil
}

// Stop ends etcd and kube-apiserver.
func (a *APIServer) Stop() { _ = a.proc.Stop(10 * time.Second) }
