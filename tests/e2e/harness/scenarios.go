package harness

import (
	"context"
	"strings"
	"time"

	clusterv1 "sigs.k8s.io/cluster-api/api/v1beta1"
)

func worker(m *clusterv1.Machine) bool { return !IsControlPlane(m) }

func nth(role func(*clusterv1.Machine) bool, n int) func(*clusterv1.Machine, int) bool {
	return func(m *clusterv1.Machine, i int) bool { return role(m) && i == n }
}

// The seed scenarios (product brief §8; issue 4). Deadlines are generous: convergence is
// measured, the deadline only bounds a run that never converges.
var (
	ScenarioWorkerNICDown = Scenario{
		Key: "1-worker-nic-down", Title: "cluster creation (1 CP + 2 workers): one worker VM's NICs go down right after boot",
		ControlPlanes: 1, Workers: 2, Deadline: 5 * time.Minute, NoMHCDeadline: 150 * time.Second,
		Faults: func() []*FaultRule {
			return []*FaultRule{{Describe: "first worker, right after boot", Match: nth(worker, 0), Fault: "nic-down", Count: 1}}
		},
	}
	ScenarioScaleUpCPNICDown = Scenario{
		Key: "2-cp-scale-up-nic-down", Title: "control plane of 3: the second control-plane VM's NICs go down during scale-up",
		ControlPlanes: 3, Workers: 1, Deadline: 6 * time.Minute,
		Faults: func() []*FaultRule {
			return []*FaultRule{{Describe: "second control-plane VM, right after boot", Match: nth(IsControlPlane, 1), Fault: "nic-down", Count: 1}}
		},
	}
	ScenarioFirstCPNICDown = Scenario{
		Key: "3-first-cp-nic-down", Title: "the first control-plane VM (the endpoint) loses its NICs before kubeadm init completes",
		ControlPlanes: 1, Workers: 1, Deadline: 5 * time.Minute,
		Faults: func() []*FaultRule {
			return []*FaultRule{{Describe: "first control-plane VM, right after boot", Match: nth(IsControlPlane, 0), Fault: "nic-down", Count: 1}}
		},
	}
	ScenarioFirstCPError = Scenario{
		Key: "3b-first-cp-error", Title: "the first control-plane VM (the endpoint) goes to Error right after boot, before kubeadm init",
		ControlPlanes: 1, Workers: 1, Deadline: 5 * time.Minute,
		Faults: func() []*FaultRule {
			return []*FaultRule{{Describe: "first control-plane VM, right after boot", Match: nth(IsControlPlane, 0), Fault: "error", Count: 1}}
		},
	}
	ScenarioServicesFail = Scenario{
		Key: "4-services-fail", Title: "a worker VM with working network whose services fail (never joins)",
		ControlPlanes: 1, Workers: 1, Deadline: 7 * time.Minute,
		Faults: func() []*FaultRule {
			return []*FaultRule{{Describe: "first worker: kubelet never starts", Match: nth(worker, 0), Fault: "services-fail", Count: 1}}
		},
	}
	ScenarioSlowHealthy = Scenario{
		Key: "5-slow-but-healthy", Title: "a slow but healthy worker VM (traffic flowing, joins after 20 scaled minutes)",
		ControlPlanes: 1, Workers: 1, Deadline: 6 * time.Minute,
		Faults: func() []*FaultRule {
			return []*FaultRule{{Describe: "first worker boots slowly", Match: nth(worker, 0), Fault: "slow-boot", Count: 1}}
		},
	}
	// ScenarioCloudStackLoad measures, not judges: one healthy cluster alone on the simulator,
	// its keys' CloudStack calls while provisioning and in 10 scaled minutes of steady state
	// (target/e2e/cloudstack-load.json, the bench's load table).
	ScenarioCloudStackLoad = Scenario{
		Key: "9-cloudstack-load", Title: "one healthy cluster (1 CP + 2 workers) alone on the simulator: CloudStack calls per key, provisioning and steady state",
		ControlPlanes: 1, Workers: 2, Deadline: 5 * time.Minute, SteadyWindow: Scaled(10 * time.Minute),
	}
	ScenarioOutage = Scenario{
		Key: "7-api-outage-429", Title: "CloudStack API outage, then a 429 storm, in the middle of provisioning",
		ControlPlanes: 1, Workers: 2, Deadline: 6 * time.Minute,
		During: apiOutageThen429,
	}
)

// apiOutageThen429: once the first VM of the cluster runs, CloudStack stops answering for 5
// scaled minutes, then throttles non-admin keys (the shim's read-only key) for 5 more.
func apiOutageThen429(ctx context.Context, r *RunContext) error {
	err := WaitFor(ctx, 3*time.Minute, 500*time.Millisecond, "first VM running", func() (bool, error) {
		vms, err := r.H.Sim.VMs(ctx)
		if err != nil {
			return false, err
		}
		for _, v := range vms {
			if v.State == "Running" && strings.HasPrefix(v.Name, r.Cluster+"-") {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		return err
	}
	r.TL.Add("CloudStack API OUTAGE begins (every call fails)")
	if err := r.H.Sim.SetAPI(ctx, map[string]any{"outage": true}); err != nil {
		return err
	}
	sleep(ctx, Scaled(5*time.Minute))
	r.TL.Add("CloudStack API back; 429 storm begins (2 calls per 10 s per account)")
	if err := r.H.Sim.SetAPI(ctx, map[string]any{"outage": false, "throttle": map[string]any{"max": 2, "interval_seconds": 10}}); err != nil {
		return err
	}
	sleep(ctx, Scaled(5*time.Minute))
	r.TL.Add("429 storm over")
	return r.H.Sim.SetAPI(context.Background(), map[string]any{"throttle": nil})
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// ScenarioUpgradeNICDown: a ready cluster is upgraded (KCP version bump, MachineDeployment with
// a new version and a new infrastructure template); the first new worker VM loses its NICs.
var ScenarioUpgradeNICDown = Scenario{
	Key: "6-upgrade-nic-down", Title: "rolling upgrade (KCP version bump + MachineDeployment template change): a new worker VM's NICs go down",
	ControlPlanes: 1, Workers: 2, Deadline: 8 * time.Minute, TargetVersion: UpgradeVersion,
	Faults: func() []*FaultRule {
		return []*FaultRule{{Describe: "first worker created by the upgrade, right after boot", Match: nth(worker, 2), Fault: "nic-down", Count: 1}}
	},
	During: upgradeWhenReady,
}

// UpgradeVersion is the Kubernetes version scenario 6 upgrades to.
const UpgradeVersion = "v1.31.4"

func upgradeWhenReady(ctx context.Context, r *RunContext) error {
	c := r.H.Mgmt.Client
	err := WaitFor(ctx, 4*time.Minute, time.Second, "cluster ready before the upgrade", func() (bool, error) {
		ok, _ := ClusterReady(ctx, c, r.Namespace, r.Cluster, 1, 2, "")
		return ok, nil
	})
	if err != nil {
		return err
	}
	r.TL.Add("UPGRADE: KubeadmControlPlane " + KubernetesVersion + " → " + UpgradeVersion + ", MachineDeployment to a new CloudStackMachineTemplate")
	return Upgrade(ctx, c, r.Namespace, r.Cluster, UpgradeVersion)
}
