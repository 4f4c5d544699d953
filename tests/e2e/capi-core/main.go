// capi-core runs the CAPI core controllers of one CAPI release — Cluster, Machine, MachineSet,
// MachineDeployment, MachineHealthCheck, KubeadmControlPlane, the kubeadm bootstrap provider
// (CABPK) and ClusterCache — with their admission and conversion webhooks, against an existing
// API server: process B of the two-process e2e harness (../README.md, "CAPI v1.13 stack").
// CAPC v0.6.1 runs in another process linking CAPI v1.9.6, as platforms ship it next to newer
// CAPI core.
//
//	capi-core --kubeconfig K --ready-file F [--clustercache-retry 2s]
//
// It writes F once its webhooks answer and its caches have synced, and runs until SIGTERM.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	"go.uber.org/zap"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	ctrlzap "sigs.k8s.io/controller-runtime/pkg/log/zap"

	"sigs.k8s.io/cluster-api/feature"
)

type options struct {
	kubeconfig string
	readyFile  string
	// ClusterCache waits 30 s between attempts to reach a workload API server that is not up
	// yet; the harness's workload clusters come up on a 0.1 time scale.
	connectionRetry time.Duration
	// featureGates is CAPI's --feature-gates (e.g. "ReconcilerRateLimiting=false"); empty keeps
	// the release's defaults.
	featureGates string
}

func main() {
	var o options
	// A flag set of its own: controller-runtime registers --kubeconfig on the global one.
	fs := flag.NewFlagSet("capi-core", flag.ExitOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the management API server")
	fs.StringVar(&o.readyFile, "ready-file", "", "written once webhooks answer and caches synced")
	fs.DurationVar(&o.connectionRetry, "clustercache-retry", 2*time.Second, "ClusterCache's connection creation retry interval")
	fs.StringVar(&o.featureGates, "feature-gates", "", "CAPI feature gates, as CAPI's managers take them (key=bool,...); empty = the release's defaults")
	_ = fs.Parse(os.Args[1:])
	if o.kubeconfig == "" || o.readyFile == "" {
		fmt.Fprintln(os.Stderr, "capi-core: --kubeconfig and --ready-file are required")
		os.Exit(2)
	}
	if o.featureGates != "" {
		if err := feature.MutableGates.Set(o.featureGates); err != nil {
			fmt.Fprintf(os.Stderr, "capi-core: --feature-gates: %v\n", err)
			os.Exit(2)
		}
	}
	logger := ctrlzap.New(ctrlzap.WriteTo(os.Stdout), ctrlzap.UseDevMode(false))
	ctrl.SetLogger(logger)
	klog.SetLogger(logger)
	if err := run(o); err != nil {
		fmt.Fprintf(os.Stderr, "capi-core: %v\n", err)
		os.Exit(1)
	}
}

func run(o options) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return err
	}
	cfg.QPS, cfg.Burst = 200, 400
	ctrl.Log.Info("starting", "capi", capiVersion(), "featureGatesFlag", o.featureGates, "reconcilerRateLimiting", feature.Gates.Enabled(feature.ReconcilerRateLimiting))
	core, err := installWebhooks(ctx, cfg)
	if err != nil {
		return fmt.Errorf("install webhooks and conversion: %w", err)
	}
	defer func() { _ = core.env.Stop() }()
	// KCP's etcd client logs through zap; keep its retries at error level.
	etcdLogger, err := zap.NewProduction(zap.IncreaseLevel(zap.ErrorLevel))
	if err != nil {
		return err
	}
	done, err := startControllers(ctx, core, etcdLogger, o.connectionRetry)
	if err != nil {
		return err
	}
	if err := os.WriteFile(o.readyFile, []byte(capiVersion()+"\n"), 0o644); err != nil {
		return err
	}
	ctrl.Log.Info("ready")
	return <-done
}

// capiVersion is the CAPI module this binary links (its go.mod pin), for logs and the ready file.
func capiVersion() string {
	if v := moduleVersion("sigs.k8s.io/cluster-api"); v != "" {
		return v
	}
	return "unknown"
}

// moduleVersion is the version of a module linked into this binary ("" if none).
func moduleVersion(path string) string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, dep := range info.Deps {
			if dep.Path == path {
				return dep.Version
			}
		}
	}
	return ""
}
