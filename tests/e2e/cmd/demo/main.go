// The demo behind `make demo`: the whole stack on this machine — a real kube-apiserver, the
// real CAPI and CAPC controllers, cloudstack-sim, simulated workload clusters and
// capc-health-shim — playing two seed scenarios with the shim: a worker VM whose NICs go down
// during cluster creation, and the first control-plane VM losing its NICs before kubeadm init.
// It prints what happens as it happens, shows `capc-health-shim status` once each cluster is
// ready, stops everything it started, and exits 0 only if both clusters became ready.
package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/capc-health-shim/tests/e2e/harness"
)

func main() { os.Exit(run()) }

func run() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Printf("capc-health-shim demo — times are scaled by %.1f (CloudStack stats every %.0f s, MHC timers %.0f s / %.0f s)\n\n",
		harness.TimeScale, 60*harness.TimeScale, 600*harness.TimeScale, 1800*harness.TimeScale)
	h, err := harness.Start(ctx, os.Stdout)
	if err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		if h != nil {
			h.Stop()
		}
		return 1
	}
	defer h.Stop()
	fmt.Printf("demo: stack %s — CAPI %s core (%s), CAPC v0.6.1; set CAPC_E2E_CAPI=1.13 or 1.9 to choose\n",
		h.Stack.Name, h.Stack.CAPI, map[bool]string{true: "its own process, condition mode", false: "same process as CAPC, annotate mode"}[h.Stack.TwoProcess()])
	h.OnSettled = func(ctx context.Context, rc *harness.RunContext) {
		if rc.Shim == nil {
			return
		}
		bin, err := harness.CargoBinary(h.Root, "capc-health-shim")
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("\n$ capc-health-shim status --url %s\n", rc.Shim.StatusURL)
		cmd := exec.CommandContext(ctx, bin, "status", "--url", rc.Shim.StatusURL)
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Printf("(status: %v)\n", err)
		}
		fmt.Println()
	}
	ok := true
	for _, sc := range []harness.Scenario{harness.ScenarioWorkerNICDown, harness.ScenarioFirstCPNICDown} {
		fmt.Printf("\n=== scenario %s: %s\n", sc.Key, sc.Title)
		start := time.Now()
		row, err := h.Run(ctx, sc, harness.ModeShim, harness.MHCRecommended)
		if err != nil {
			fmt.Fprintf(os.Stderr, "demo: %s: %v\n", sc.Key, err)
			return 1
		}
		fmt.Printf("=== %s: ready=%v", sc.Key, row.Converged)
		if row.SecondsToReady != nil {
			fmt.Printf(" in %.0f s", *row.SecondsToReady)
		}
		if row.SecondsFaultToRecycle != nil {
			fmt.Printf(", fault → owner deletes the Machine in %.0f s", *row.SecondsFaultToRecycle)
		}
		fmt.Printf(", recycled %d (healthy ones: %d), orphan VMs %d, leftovers %d (%.0f s)\n",
			row.RecycledMachines, row.FalseRecycles, row.OrphanVMs, row.LeftoverObjects, time.Since(start).Seconds())
		ok = ok && row.Converged
	}
	if !ok {
		fmt.Println("\ndemo: a cluster did not become ready; logs in target/e2e/logs, timelines in target/e2e/timelines")
		return 1
	}
	fmt.Println("\ndemo: both clusters became ready; the shim only signalled, CAPI's MHC and the owners recycled the VMs")
	return 0
}
