// Command run starts a throwaway Kubernetes API server for capc-health-shim's tests.
//
//	go run ./hack/apiserver/run [--profile capi-1.9|capi-1.13|capi-1.13-v1beta2-only|capi-1.14] [--dir target/apiserver]
//
// Steps (each failure names the step and, where there is one, the log file):
//
//  1. lock --dir (via <dir>.lock: one run per directory) and remove everything in it (stale
//     kubeconfig, certs, logs, etcd data of an earlier run);
//  2. build etcd and kube-apiserver from the Go modules pinned in hack/apiserver/tools
//     (first use only; cached under $XDG_CACHE_HOME/capc-health-shim/apiserver/<pin-hash>/bin,
//     keyed by a hash of the tools module's go.mod/go.sum, the Go version and the build recipe);
//  3. generate a throwaway CA, serving cert, service-account key pair, an admin client cert and
//     an admin bearer token (both in group system:masters);
//  4. start etcd, then kube-apiserver (authorization-mode RBAC; an audit log in the
//     capi-1.13-v1beta2-only profile), both on 127.0.0.1 on free ports, and wait for etcd
//     /health and kube-apiserver /readyz (deadlines);
//  5. install the CRDs of the profile from the Go module cache, adding the labels kustomize
//     would add, and wait until every CRD is Established and each served version answers a list;
//  6. only then write <dir>/kubeconfig (the readiness signal), and run in the foreground until
//     SIGINT/SIGTERM, then stop kube-apiserver and etcd and remove the kubeconfig and env file.
//
// It exits non-zero if etcd or kube-apiserver dies.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

type options struct {
	profile      string
	dir          string
	toolsDir     string
	cacheDir     string
	buildOnly    bool
	readyTimeout time.Duration
	crdTimeout   time.Duration
}

func main() {
	// Children are started with Pdeathsig, which fires when the *thread* that started them
	// exits; pin the main goroutine (which starts them) to the main thread for the whole run.
	runtime.LockOSThread()

	o := options{}
	flag.StringVar(&o.profile, "profile", envOr("APISERVER_PROFILE", "capi-1.9"),
		"CRD profile: "+strings.Join(profileNames(), ", ")+" (env APISERVER_PROFILE)")
	flag.StringVar(&o.dir, "dir", envOr("APISERVER_DIR", "target/apiserver"),
		"output directory: kubeconfig, certs, token, logs, etcd data (env APISERVER_DIR); emptied first")
	flag.StringVar(&o.toolsDir, "tools", envOr("APISERVER_TOOLS_DIR", "hack/apiserver/tools"),
		"the tools Go module that pins etcd and kube-apiserver")
	flag.StringVar(&o.cacheDir, "cache", envOr("APISERVER_CACHE_DIR", defaultCacheDir()),
		"where built binaries are cached (env APISERVER_CACHE_DIR)")
	flag.BoolVar(&o.buildOnly, "build-only", false, "build (or find cached) binaries, print their directory and exit")
	flag.DurationVar(&o.readyTimeout, "ready-timeout", 90*time.Second, "deadline for etcd /health and kube-apiserver /readyz")
	flag.DurationVar(&o.crdTimeout, "crd-timeout", 90*time.Second, "deadline for CRDs to become Established and served")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	err := run(ctx, o)
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintf(os.Stderr, "apiserver: FAILED: %v\n", err)
		os.Exit(1)
	}
	if err != nil {
		logf("interrupted")
		os.Exit(130)
	}
}

func run(ctx context.Context, o options) error {
	sets, ok := profiles[o.profile]
	if !ok {
		return fmt.Errorf("unknown profile %q (known: %s)", o.profile, strings.Join(profileNames(), ", "))
	}
	toolsDir, err := filepath.Abs(o.toolsDir)
	if err != nil {
		return err
	}

	start := time.Now()
	if o.buildOnly {
		bins, err := ensureBinaries(ctx, toolsDir, o.cacheDir)
		if err != nil {
			return fmt.Errorf("step build: %w", err)
		}
		fmt.Println(bins.dir)
		return nil
	}

	// Stale files (a kubeconfig above all) go before anything slow, so nobody waiting for the
	// kubeconfig mistakes an earlier run's for this one's.
	dir, err := filepath.Abs(o.dir)
	if err != nil {
		return err
	}
	unlock, err := lockDir(dir)
	if err != nil {
		return fmt.Errorf("step lock %s: %w", dir, err)
	}
	defer unlock()
	if err := cleanDir(dir); err != nil {
		return fmt.Errorf("step clean %s: %w", dir, err)
	}

	bins, err := ensureBinaries(ctx, toolsDir, o.cacheDir)
	if err != nil {
		return fmt.Errorf("step build: %w", err)
	}

	pki, err := writePKI(dir)
	if err != nil {
		return fmt.Errorf("step certificates: %w", err)
	}

	// Fetch the CRD modules before starting anything: a proxy problem is reported early.
	crdSets, err := loadCRDSets(ctx, toolsDir, sets)
	if err != nil {
		return fmt.Errorf("step read CRDs (profile %s): %w", o.profile, err)
	}

	sup := &supervisor{dir: dir}
	defer sup.stopAll()

	etcdURL, err := sup.startEtcd(ctx, bins.etcd, o.readyTimeout)
	if err != nil {
		return fmt.Errorf("step start etcd: %w", err)
	}
	var apiArgs []string
	auditLog := ""
	if auditedProfiles[o.profile] {
		if apiArgs, auditLog, err = auditArgs(dir); err != nil {
			return fmt.Errorf("step audit policy: %w", err)
		}
	}
	apiURL, err := sup.startAPIServer(ctx, bins.apiserver, etcdURL, pki, apiArgs, o.readyTimeout)
	if err != nil {
		return fmt.Errorf("step start kube-apiserver: %w", err)
	}
	client := newAPIClient(apiURL, pki)

	n, err := installCRDs(ctx, client, dir, crdSets, o.crdTimeout)
	if err != nil {
		return fmt.Errorf("step install CRDs (profile %s): %w (kube-apiserver log: %s)", o.profile, err, sup.logPath("kube-apiserver"))
	}

	if err := writeEnvFile(dir, apiURL, etcdURL, o.profile, auditLog, pki); err != nil {
		return fmt.Errorf("step write env: %w", err)
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := writeKubeconfig(kubeconfig, apiURL, pki); err != nil {
		return fmt.Errorf("step write kubeconfig: %w", err)
	}
	envFile := filepath.Join(dir, "env")
	defer os.Remove(kubeconfig)
	defer os.Remove(envFile)

	logf("ready in %s: profile %s, %d CRDs, %s", time.Since(start).Round(100*time.Millisecond), o.profile, n, apiURL)
	logf("  export KUBECONFIG=%s", kubeconfig)
	logf("  logs: %s, %s — Ctrl-C to stop", sup.logPath("etcd"), sup.logPath("kube-apiserver"))

	select {
	case <-ctx.Done():
		logf("signal received, stopping kube-apiserver and etcd")
		os.Remove(kubeconfig)
		os.Remove(envFile)
		sup.stopAll()
		logf("stopped")
		return nil
	case p := <-sup.exited:
		os.Remove(kubeconfig)
		os.Remove(envFile)
		return fmt.Errorf("%s exited unexpectedly (%v); log: %s\n%s", p.name, p.waitErr, p.logPath, tail(p.logPath, 20))
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func defaultCacheDir() string {
	base := os.Getenv("XDG_CACHE_HOME")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			home = os.TempDir()
		}
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "capc-health-shim", "apiserver")
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "apiserver: "+format+"\n", args...)
}

// cleanDir empties dir (but keeps the directory itself).
func cleanDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// lockDir takes an exclusive lock on <dir>.lock so that two runs never share (and wipe) one
// directory. The lock dies with the process.
func lockDir(dir string) (func(), error) {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return nil, err
	}
	path := dir + ".lock"
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		return nil, fmt.Errorf("another hack/apiserver run holds %s (pid %s); stop it first or pass --dir", path, strings.TrimSpace(string(holder)))
	}
	f.Truncate(0)
	fmt.Fprintf(f, "%d\n", os.Getpid())
	return func() { f.Close() }, nil
}

// tail returns the last n lines of a file, indented, for error messages.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "    | " + strings.Join(lines, "\n    | ")
}
