package harness

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"time"

	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

// TimeScale is the factor applied to every default duration in the scenarios: CloudStack's
// stats interval, VM boot, MHC timeouts and the shim's interval and graces (0.1 = 60 s → 6 s).
// The CAPI and CAPC controllers' own requeue timers are not scaled: they are their real code.
const TimeScale = 0.1

// Scaled is a real-world duration on the scenarios' clock.
func Scaled(d time.Duration) time.Duration { return time.Duration(float64(d) * TimeScale) }

// Harness is one management cluster, one cloudstack-sim, the workload-cluster simulator and
// the guest player, shared by scenario runs in separate namespaces.
type Harness struct {
	Root      string
	OutDir    string // target/e2e
	Stack     Stack
	API       *APIServer
	Core      *CoreProcess // process B (CAPI core) on a two-process stack, else nil
	Mgmt      *Management
	Sim       *Sim
	Workloads *Workloads
	Player    *Player
	Out       io.Writer // progress lines (nil = quiet)
	// OnSettled, when set, runs after a scenario run converged (or hit its deadline) and before
	// its teardown, with the shim still running (the demo shows `capc-health-shim status`).
	OnSettled func(ctx context.Context, rc *RunContext)

	cancel context.CancelFunc
	mu     sync.Mutex
	active map[string]bool // namespaces the garbage collector watches
}

// Start brings everything up; Stop tears it down. Logs go to target/e2e/logs.
func Start(ctx context.Context, out io.Writer) (*Harness, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	outDir := filepath.Join(root, "target", "e2e")
	logDir := filepath.Join(outDir, "logs")
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, err
	}
	// controller-runtime's and CAPI's logs go to a file: they are for debugging a failed run.
	logFile, err := os.Create(filepath.Join(logDir, "controllers.log"))
	if err != nil {
		return nil, err
	}
	logger := zap.New(zap.WriteTo(logFile), zap.UseDevMode(false))
	ctrl.SetLogger(logger)
	klog.SetLogger(logger) // client-go's reflector warnings too

	// KCP's etcd client logs its retries to stderr at warn level; keep them out of the timeline.
	if os.Getenv("ETCD_CLIENT_DEBUG") == "" {
		_ = os.Setenv("ETCD_CLIENT_DEBUG", "error")
	}
	stack, err := StackFromEnv()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	h := &Harness{Root: root, OutDir: outDir, Stack: stack, Out: out, cancel: cancel, active: map[string]bool{}}
	fail := func(err error) (*Harness, error) { h.Stop(); return nil, err }
	h.progress("starting etcd + kube-apiserver (hack/apiserver, profile %s: CAPI %s + CAPC v0.6.1 CRDs)", stack.Name, stack.CAPI)
	if h.API, err = StartAPIServer(ctx, root, filepath.Join(outDir, "apiserver"), stack.Name); err != nil {
		return fail(err)
	}
	h.progress("starting cloudstack-sim (%s)", SimScenario)
	if h.Sim, err = StartSim(ctx, root, filepath.Join(logDir, "cloudstack-sim.log"), ScenarioPath(root, SimScenario)); err != nil {
		return fail(err)
	}
	if stack.TwoProcess() {
		h.progress("starting process B: CAPI %s core, KCP, CABPK and MHC with their webhooks and conversion (%s, feature gates %q)", stack.CAPI, stack.CoreBinary, stack.FeatureGates)
		if h.Core, err = StartCore(ctx, root, stack, h.API.Kubeconfig, filepath.Join(logDir, stack.CoreBinary+".log")); err != nil {
			return fail(err)
		}
		h.progress("process B ready (links cluster-api %s); starting process A: CAPC v0.6.1 controllers and webhooks (CAPI v1.9.6 libraries)", h.Core.Version)
	} else {
		h.progress("starting the CAPI core, KCP, CABPK and CAPC controllers with their webhooks")
	}
	if h.Mgmt, err = StartManagement(ctx, h.API.Kubeconfig, stack.TwoProcess()); err != nil {
		return fail(err)
	}
	base, err := portBase()
	if err != nil {
		return fail(err)
	}
	if h.Workloads, err = StartWorkloads(ctx, base, base+999, base-1); err != nil {
		return fail(err)
	}
	h.Player = NewPlayer(h.Mgmt, h.Sim, h.Workloads, GuestTiming{Init: Scaled(30 * time.Second), Join: Scaled(20 * time.Second)})
	go h.Player.Run(ctx)
	go RunGarbageCollector(ctx, h.Mgmt.Direct, h.namespaces, time.Second)
	return h, nil
}

// portBase is where the workload clusters' listeners start (CAPC_E2E_PORT_BASE, default 31000:
// listeners on 31000–31998, the mux's debug listener on 30999), so two harnesses can run at once.
func portBase() (int, error) {
	v := os.Getenv("CAPC_E2E_PORT_BASE")
	if v == "" {
		return 31000, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1025 || n > 64000 {
		return 0, fmt.Errorf("CAPC_E2E_PORT_BASE=%q: want a port number between 1025 and 64000", v)
	}
	return n, nil
}

func (h *Harness) progress(format string, args ...any) {
	if h.Out != nil {
		fmt.Fprintf(h.Out, "e2e: "+format+"\n", args...)
	}
}

func (h *Harness) namespaces() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]string, 0, len(h.active))
	for ns := range h.active {
		out = append(out, ns)
	}
	sort.Strings(out)
	return out
}

func (h *Harness) watch(ns string, on bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if on {
		h.active[ns] = true
	} else {
		delete(h.active, ns)
	}
}

// Stop ends every process and goroutine the harness started.
func (h *Harness) Stop() {
	if h.cancel != nil {
		h.cancel()
	}
	if h.Mgmt != nil {
		h.Mgmt.Stop()
	}
	if h.Core != nil {
		h.Core.Stop()
	}
	if h.Workloads != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		h.Workloads.Shutdown(ctx)
		cancel()
	}
	if h.Sim != nil {
		h.Sim.Stop()
	}
	if h.API != nil {
		h.API.Stop()
	}
}
