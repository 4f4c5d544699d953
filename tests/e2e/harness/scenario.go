package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1b3 "sigs.k8s.io/cluster-api-provider-cloudstack/api/v1beta3"
	clusterv1 "sigs.k8s.io/cluster-api/api/v1beta1"
	controlplanev1 "sigs.k8s.io/cluster-api/controlplane/kubeadm/api/v1beta1"
)

// Mode says whether the shim runs next to CAPI in a scenario run.
type Mode string

const (
	ModeShim     Mode = "shim"
	ModeBaseline Mode = "baseline"
	// ModeShimProbe is ModeShim with the opt-in guest probe on (--probe-credentials, the probe
	// account of capc-e2e.json): the shim asks the network's virtual router to arping silent
	// guests (docs/guest-probe.md).
	ModeShimProbe Mode = "shim-probe"
	// ModeShimObserve is the negative control (make e2e-negative-control): the shim runs with
	// --mode observe — it publishes its condition and never escalates —, so on CAPI v1.9, whose
	// MHC reads no conditions, nothing it says can cause a recycle; the causality and speed
	// assertions must then fail.
	ModeShimObserve Mode = "shim-observe"
)

// WithShim reports whether the shim runs in this mode.
func (m Mode) WithShim() bool { return m == ModeShim || m == ModeShimProbe || m == ModeShimObserve }

// Probing reports whether the shim runs with the guest probe on.
func (m Mode) Probing() bool { return m == ModeShimProbe }

// clusterLetter tells the runs of one scenario apart in cluster (and so VM) names.
func (m Mode) clusterLetter() string {
	switch m {
	case ModeShimProbe:
		return "p"
	case ModeShimObserve:
		return "o"
	}
	return string(m)[:1]
}

// MHC kinds a run can use.
const (
	// MHCRecommended is deploy/examples/mhc-annotate-mode.yaml: the timer is only a backstop (30 min).
	MHCRecommended = "recommended"
	// MHCDefault is stock CAPI: nodeStartupTimeout 10 min.
	MHCDefault = "default"
	// MHCNone is no MachineHealthCheck at all.
	MHCNone = "none"
	// MHCLegacy is the recommended annotate-mode MHC of CAPI v1.9 (v1beta1, 30-min backstop, no
	// unhealthyMachineConditions), written as v1beta1 on every stack: on CAPI v1.13 it is the
	// MHC a user kept through the upgrade, which does not act on the shim's condition (issue 41).
	MHCLegacy = "legacy"
)

// Scenario is one seed scenario of the product brief (§8).
type Scenario struct {
	Key           string // report name, e.g. "1-worker-nic-down"
	Title         string
	ControlPlanes int32
	Workers       int32
	Faults        func() []*FaultRule
	// During runs next to the cluster's creation (e.g. an API outage); nil = nothing.
	During   func(ctx context.Context, r *RunContext) error
	Deadline time.Duration
	// TargetVersion, when set, is the version every Machine must run to count as converged.
	TargetVersion string
	// NoMHCDeadline bounds the run without any MHC, which must never converge.
	NoMHCDeadline time.Duration
	// HoldReady keeps the run from counting as converged until During calls
	// RunContext.ReleaseReady (or returns): the cluster must converge after what During does.
	HoldReady bool
	// DuringWait is how long the run waits for During once the cluster converged (or missed its
	// deadline) before scoring; 0 = 30 s.
	DuringWait time.Duration
	// SteadyWindow, when set, keeps a converged cluster this long (real time) and counts the
	// CloudStack calls of each key in it: the steady-state load (Row.CloudStackLoad).
	SteadyWindow time.Duration
	// ObserveBaseline runs the shim in --mode observe beside the stock MHC in the baseline run
	// (Row.ShimObserver): it publishes its condition, never escalates, and its scorecard says
	// what acting would have done while the MHC's own timer recycles (issue 44). Only where no
	// MHC acts on the condition (CAPI v1.9: the scenarios set it there).
	ObserveBaseline bool
	// SettleStories: a run with the shim reads its scorecard only once every story has ended
	// (the Machines with their Node after --scorecard-settle), so a false alarm would be counted.
	SettleStories bool
}

// RunContext is one scenario run in progress.
type RunContext struct {
	H         *Harness
	Namespace string
	Cluster   string
	Mode      Mode
	MHC       string
	TL        *Timeline
	Rec       *Recorder
	Shim      *Shim // nil in baseline runs
	// Orphans reads the shim's orphan report through the run (nil without the shim); a
	// scenario registers the VMs it orphans on purpose with Orphans.Expect.
	Orphans *OrphanWatch
	// Remnants reads the shim's remnant report and the API server through the run (nil
	// without the shim).
	Remnants *RemnantWatch
	// RemnantsClearedSeconds: set by a scenario that clears what held a deleting Cluster, how
	// long the remnant report took to empty after.
	RemnantsClearedSeconds *float64

	hold     chan struct{} // closed by ReleaseReady; nil unless the scenario holds readiness
	holdOnce sync.Once
}

// ReleaseReady lets the run count as converged (Scenario.HoldReady); safe to call twice.
func (rc *RunContext) ReleaseReady() {
	if rc.hold != nil {
		rc.holdOnce.Do(func() { close(rc.hold) })
	}
}

func (rc *RunContext) readyHeld() bool {
	if rc.hold == nil {
		return false
	}
	select {
	case <-rc.hold:
		return false
	default:
		return true
	}
}

// Row is one line of target/e2e/report.json.
type Row struct {
	Scenario string `json:"scenario"`
	// CAPIVersion is the CAPI core release of the run's stack (CAPC is v0.6.1 on every stack).
	CAPIVersion string `json:"capi_version"`
	// CAPIFeatureGates are the CAPI feature gates set away from the release's defaults.
	CAPIFeatureGates string `json:"capi_feature_gates,omitempty"`
	Mode             Mode   `json:"mode"`
	// ShimMode is the mode the shim's discovery chose (annotate, condition), "" without the shim;
	// ShimModeSource says whether it was discovered (auto) or forced by a flag.
	ShimMode              string   `json:"shim_mode"`
	ShimModeSource        string   `json:"shim_mode_source,omitempty"`
	MHC                   string   `json:"mhc"`
	Converged             bool     `json:"converged"`
	SecondsToReady        *float64 `json:"seconds_to_ready"`
	SecondsFaultToRecycle *float64 `json:"seconds_fault_to_recycle"`
	TimeScale             float64  `json:"time_scale"`
	RecycledMachines      int      `json:"recycled_machines"` // deleted by their owner after an MHC found them unhealthy
	FalseRecycles         int      `json:"false_recycles"`
	OrphanVMs             int      `json:"orphan_vms"`
	// OrphansReported is how many distinct VM ids the shim's /status "orphans" reported
	// (reported_at set) during the run, read every 250 ms up to teardown (0 without the shim);
	// FalseOrphans those of them the scenario did not orphan on purpose (goal: 0), and
	// OrphansOpenAtEnd the VMs it still listed at the last read before teardown.
	OrphansReported  int `json:"orphans_reported"`
	FalseOrphans     int `json:"false_orphans"`
	OrphansOpenAtEnd int `json:"orphans_open_at_end"`
	// RemnantsReported is how many of the objects the API server showed stuck deleting or
	// dangling past --remnant-grace (in the run's namespace, up to teardown: RemnantsExpected)
	// the shim's /status "remnants" reported with the right reason within the grace plus two
	// polls; FalseRemnants the objects it reported that the API server did not show so, or
	// with another reason, or before the grace (goal: 0). 0 without the shim.
	RemnantsExpected int             `json:"remnants_expected"`
	RemnantsReported int             `json:"remnants_reported"`
	FalseRemnants    int             `json:"false_remnants"`
	RemnantReports   []RemnantRecord `json:"remnant_reports,omitempty"`
	// RemnantsClearedSeconds: in scenario 8, how long after the harness cleared the destroy
	// fault the Cluster was gone and the report empty.
	RemnantsClearedSeconds *float64 `json:"remnants_cleared_seconds,omitempty"`
	// OrphanSuspectsMax is the most VMs the shim held at once as owned by nothing but still
	// within the grace (its /status orphan_detection.suspects; omitted when not shown): what a
	// run shorter than the grace would report later.
	OrphanSuspectsMax *int `json:"orphan_suspects_max,omitempty"`
	// OrphanGraceSeconds is the shim's --orphan-grace; OrphanBoundSeconds, in runs that orphan
	// VMs on purpose, how late after its CloudStackMachine was gone each may be reported
	// (grace + two poll intervals with their 10 % jitter).
	OrphanGraceSeconds float64  `json:"orphan_grace_seconds,omitempty"`
	OrphanBoundSeconds *float64 `json:"orphan_bound_seconds,omitempty"`
	// OrphanReports: per VM orphaned on purpose, or listed by the shim without being so, what
	// the shim said and when.
	OrphanReports   []OrphanRecord `json:"orphan_reports,omitempty"`
	LeftoverObjects int            `json:"leftover_objects"`
	Faults          []string       `json:"faults"`
	ShimVerdicts    []string       `json:"shim_verdicts,omitempty"`
	// ShimFalseMessages is, per Machine the shim judged False, the condition's message (its
	// evidence) when it first said False.
	ShimFalseMessages []string `json:"shim_false_messages,omitempty"`
	// ShimObserver says a baseline run had the shim beside it in observe mode
	// (Scenario.ObserveBaseline): it cannot act there, its scorecard says what acting would have
	// done.
	ShimObserver bool `json:"shim_observer,omitempty"`
	// Scorecard is the shim's /status scorecard at the end of the run, before the shim stopped:
	// its counts and this run's Machines' outcomes (nil without the shim, or when /status had
	// none).
	Scorecard *ScorecardRecord `json:"scorecard,omitempty"`
	// ShimProbe says the shim ran with the guest probe on (mode shim-probe); Probe is the
	// probe's state from the shim's /status at the end of the run (before teardown).
	ShimProbe bool         `json:"shim_probe,omitempty"`
	Probe     *ProbeStatus `json:"probe,omitempty"`
	// ConditionEvidence is, per Machine the shim judged False, where its condition was found on
	// the Machine as the MHC's own API version serves it, and the MHC's verdict on that Machine.
	ConditionEvidence []string `json:"condition_evidence,omitempty"`
	// Causality is, per faulty Machine, the recorder's path from the fault to its deletion (the
	// shim's False, the annotation and its field manager, the MHC's verdict, the owner's delete).
	Causality []CausalChain `json:"causality,omitempty"`
	// BackstopSeconds is the run's MHC nodeStartupTimeout (0 without an MHC).
	BackstopSeconds float64 `json:"backstop_seconds,omitempty"`
	// MHCReadAs is the API version the run's MHC was read back in after its creation (v1beta2
	// on stacks that store it, "" otherwise), MHCMachineConditions its
	// checks.unhealthyMachineConditions as Type=Status: what the MHC acts on, as CAPI stores it.
	MHCReadAs            string   `json:"mhc_read_as,omitempty"`
	MHCMachineConditions []string `json:"mhc_machine_conditions,omitempty"`
	// RecorderSteps is how many times the recorder read the namespace, RecorderFailedSteps how
	// many of those reads failed (RecorderErrors: the first errors). A failed step is a gap in
	// every causal chain of the row.
	RecorderSteps       int      `json:"recorder_steps"`
	RecorderFailedSteps int      `json:"recorder_failed_steps"`
	RecorderErrors      []string `json:"recorder_errors,omitempty"`
	DeadlineSeconds     float64  `json:"deadline_seconds"`
	// CloudStackLoad is each CloudStack key's calls while provisioning and, with a
	// SteadyWindow, in steady state (exact only for a run that has the simulator to itself).
	CloudStackLoad *CloudStackLoad `json:"cloudstack_load,omitempty"`
	// CloudStackResults counts the simulator's answers by HTTP status while the run was
	// converging (all accounts; exact for runs that have the simulator to themselves).
	CloudStackResults map[string]int `json:"cloudstack_results"`
	Timeline          string         `json:"timeline"`
	Notes             []string       `json:"notes,omitempty"`
	// SecretLeaks lists where a CloudStack secret key or a request signature showed up in the
	// shim's log, /status, /metrics, the namespace's Events, the timeline or this row (goal: none).
	SecretLeaks []string `json:"secret_leaks"`
}

func secs(d time.Duration) *float64 {
	v := float64(d.Milliseconds()) / 1000
	return &v
}

// ClusterReady reports whether the cluster is fully up: control plane initialized with every
// replica ready, the MachineDeployment's replicas ready and up to date, and exactly the
// desired Machines, none deleting, each with its Node.
func ClusterReady(ctx context.Context, c client.Client, ns, cluster string, cps, workers int32, version string) (bool, string) {
	kcp := &controlplanev1.KubeadmControlPlane{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: cluster + "-control-plane"}, kcp); err != nil {
		return false, err.Error()
	}
	if !kcp.Status.Initialized || kcp.Status.ReadyReplicas != cps || kcp.Status.Replicas != cps || kcp.Status.UnavailableReplicas != 0 {
		return false, fmt.Sprintf("control plane: initialized=%v ready %d/%d", kcp.Status.Initialized, kcp.Status.ReadyReplicas, cps)
	}
	md := &clusterv1.MachineDeployment{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: cluster + "-md-0"}, md); err != nil {
		return false, err.Error()
	}
	if md.Status.ReadyReplicas != workers || md.Status.UpdatedReplicas != workers || md.Status.Replicas != workers {
		return false, fmt.Sprintf("workers ready %d/%d", md.Status.ReadyReplicas, workers)
	}
	var ms clusterv1.MachineList
	if err := c.List(ctx, &ms, client.InNamespace(ns)); err != nil {
		return false, err.Error()
	}
	if int32(len(ms.Items)) != cps+workers {
		return false, fmt.Sprintf("%d Machines, want %d", len(ms.Items), cps+workers)
	}
	for _, m := range ms.Items {
		if !m.DeletionTimestamp.IsZero() || m.Status.NodeRef == nil || m.Status.Phase != string(clusterv1.MachinePhaseRunning) {
			return false, fmt.Sprintf("Machine %s: phase %s", m.Name, m.Status.Phase)
		}
		if version != "" && (m.Spec.Version == nil || *m.Spec.Version != version) {
			return false, fmt.Sprintf("Machine %s not yet at %s", m.Name, version)
		}
	}
	return true, "ready"
}

// Run plays one scenario in one mode in its own namespace and returns its report row.
// Errors are harness failures (not scenario outcomes: those are in the row).
func (h *Harness) Run(ctx context.Context, sc Scenario, mode Mode, mhc string) (Row, error) {
	suffix := string(mode)
	short := strings.SplitN(sc.Key, "-", 2)[0]
	cluster := fmt.Sprintf("s%s%s", short, mode.clusterLetter())
	switch mhc {
	case MHCNone:
		suffix, cluster = "nomhc", fmt.Sprintf("s%sn", short)
	case MHCLegacy:
		// A row of its own next to the same mode with the recommended MHC.
		suffix, cluster = suffix+"-legacy", cluster+"l"
	}
	ns := fmt.Sprintf("e2e-s%s-%s", short, suffix)
	tl := &Timeline{Start: time.Now(), Label: fmt.Sprintf("%s/%s", sc.Key, suffix), Out: h.Out}
	deadline := sc.Deadline
	if mhc == MHCNone && sc.NoMHCDeadline > 0 {
		deadline = sc.NoMHCDeadline
	}
	row := Row{Scenario: sc.Key, CAPIVersion: h.Stack.CAPI, CAPIFeatureGates: h.Stack.FeatureGates, Mode: mode, MHC: mhc, TimeScale: TimeScale, DeadlineSeconds: deadline.Seconds(), ShimProbe: mode.Probing()}
	c := h.Mgmt.Client

	if err := CreateAll(ctx, c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		return row, err
	}
	h.watch(ns, true)
	defer h.watch(ns, false)
	host, port, err := h.Workloads.AddCluster(ctx, ns, cluster)
	if err != nil {
		return row, err
	}
	defer h.Workloads.RemoveCluster(ns, cluster)

	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	rec := NewRecorder(c, ns, ShimConditionType, h.Stack.MachineVersion(), tl)
	go rec.Run(runCtx)
	var rules []*FaultRule
	if sc.Faults != nil {
		rules = sc.Faults()
	}
	h.Player.Plan(ns, rules, tl)
	rc := &RunContext{H: h, Namespace: ns, Cluster: cluster, Mode: mode, MHC: mhc, TL: tl, Rec: rec}
	if sc.HoldReady {
		rc.hold = make(chan struct{})
	}

	userObjs := ClusterObjects(ClusterSpec{Namespace: ns, Name: cluster, ControlPlanes: sc.ControlPlanes, Workers: sc.Workers, Host: host, Port: port, APIURL: h.Sim.APIURL()})
	userObjs = append(userObjs, ShimCredentials(ns, h.Sim.APIURL()))
	if mode.Probing() {
		userObjs = append(userObjs, ProbeCredentials(ns, h.Sim.APIURL()))
	}
	if o := h.machineHealthCheck(ns, cluster, mhc); o != nil {
		userObjs = append(userObjs, o)
		row.BackstopSeconds = mhcNodeStartupTimeout(mhc).Seconds()
	}

	var shim *Shim
	observer := mode == ModeBaseline && mhc != MHCNone && sc.ObserveBaseline
	row.ShimObserver = observer
	if mode.WithShim() || observer {
		cfg := ShimConfig{
			Namespace: ns, Kubeconfig: h.API.Kubeconfig, APIURL: h.Sim.APIURL(), Scale: TimeScale,
			LogPath: filepath.Join(h.OutDir, "logs", "shim-"+ns+".log"),
		}
		if mode.Probing() {
			cfg.ProbeSecret = ProbeSecret
		}
		if mode == ModeShimObserve || observer {
			cfg.ExtraArgs = append(cfg.ExtraArgs, "--mode", "observe")
		}
		shim, err = StartShim(ctx, h.Root, cfg)
		if err != nil {
			return row, err
		}
		defer func() {
			if shim != nil {
				_ = shim.Stop()
			}
		}()
		rc.Shim = shim
		rc.Orphans = WatchOrphans(runCtx, shim, tl, 250*time.Millisecond)
		rc.Remnants = WatchRemnants(runCtx, shim, c, ns, tl, time.Second)
		row.OrphanGraceSeconds = cfg.OrphanGrace().Seconds()
		api, err := shim.API(ctx)
		if err != nil {
			return row, err
		}
		row.ShimMode, row.ShimModeSource = api.Mode, api.ModeSource
		probe := ""
		if mode.Probing() {
			probe = ", guest probe on (--probe-credentials " + ns + "/" + ProbeSecret + ")"
			go watchProbe(runCtx, shim, tl)
		}
		tl.Add(fmt.Sprintf("capc-health-shim run started (%s): mode %s (%s), Machine layout %s, MHC %s%s",
			shim.StatusURL, api.Mode, api.ModeSource, api.Layout, api.MHCVersion, probe))
	}
	tl.Add(fmt.Sprintf("creating cluster %s/%s: %d control plane, %d workers, MHC %s, shim %v, probe %v, observer %v", ns, cluster, sc.ControlPlanes, sc.Workers, mhc, mode.WithShim(), mode.Probing(), observer))
	if err := CreateAll(ctx, c, userObjs...); err != nil {
		return row, err
	}
	if mhc != MHCNone && h.Stack.V1Beta2() {
		conds, err := mhcMachineConditions(ctx, h.Mgmt.Direct, ns, cluster+"-mhc")
		if err != nil {
			return row, err
		}
		row.MHCReadAs, row.MHCMachineConditions = "v1beta2", conds
		tl.Add(fmt.Sprintf("MachineHealthCheck %s read as v1beta2: unhealthyMachineConditions %v", cluster+"-mhc", conds))
	}
	callsBefore, err := h.Sim.Calls(ctx)
	if err != nil {
		return row, err
	}
	keysBefore, err := h.Sim.AccountCalls(ctx)
	if err != nil {
		return row, err
	}
	var keysReady map[string]KeyCalls
	start := time.Now()
	duringErr := make(chan error, 1)
	if sc.During != nil {
		go func() {
			err := sc.During(runCtx, rc)
			rc.ReleaseReady()
			duringErr <- err
		}()
	} else {
		rc.ReleaseReady()
		duringErr <- nil
	}

	// Converged: ready and nothing pending (a fault rule not yet applied keeps it open).
	var readyAt time.Duration
	var last string
	_ = WaitFor(ctx, deadline, time.Second, "cluster ready", func() (bool, error) {
		ok, why := ClusterReady(ctx, c, ns, cluster, sc.ControlPlanes, sc.Workers, sc.TargetVersion)
		last = why
		if ok && rc.readyHeld() {
			last = "ready, but the scenario holds readiness until what it does is done"
		}
		if ok && pendingRules(rules) == 0 && !rc.readyHeld() {
			readyAt = time.Since(start)
			keysReady, _ = h.Sim.AccountCalls(ctx)
			return true, nil
		}
		return false, nil
	})
	if readyAt > 0 {
		row.Converged = true
		row.SecondsToReady = secs(readyAt)
		tl.Add(fmt.Sprintf("cluster %s is READY (%.1fs after creation)", cluster, readyAt.Seconds()))
		if keysReady != nil {
			row.CloudStackLoad = h.measureLoad(ctx, sc, tl, readyAt, keysBefore, keysReady)
		}
	} else {
		tl.Add(fmt.Sprintf("cluster %s NOT ready after the %.0fs deadline (last: %s)", cluster, deadline.Seconds(), last))
	}
	duringWait := 30 * time.Second
	if sc.DuringWait > 0 {
		duringWait = sc.DuringWait
	}
	stopDuring := time.After(duringWait)
	select {
	case err := <-duringErr:
		if err != nil {
			row.Notes = append(row.Notes, "during: "+err.Error())
		}
	case <-stopDuring:
		row.Notes = append(row.Notes, "during: still running at the end")
	}
	if shim != nil {
		row.ShimVerdicts = shimSummary(rec)
		row.ShimFalseMessages = shimFalseMessages(rec)
		row.ConditionEvidence = conditionEvidence(rec)
		if mode.Probing() {
			p, err := shim.Probe(ctx)
			switch {
			case err != nil:
				row.Notes = append(row.Notes, "probe status: "+err.Error())
			case p == nil:
				row.Notes = append(row.Notes, "probe status: the shim's /status has no probe object")
			default:
				row.Probe = p
				tl.Add("guest probe at the end: " + p.Summary())
			}
		}
	}
	if shim != nil {
		row.Scorecard = scorecardAtEnd(ctx, shim, ns, h.Player.Injections(ns), rec.Machines(), sc.SettleStories, tl)
		_ = os.Remove(ScorecardCommandLog(h.OutDir, ns))
		if row.Scorecard == nil {
			row.Notes = append(row.Notes, NoteNoScorecard)
		} else if out, err := shim.ScorecardCommand(ctx); err != nil {
			row.Notes = append(row.Notes, "scorecard command: "+err.Error())
		} else {
			_ = os.WriteFile(ScorecardCommandLog(h.OutDir, ns), []byte(out), 0o644)
			row.Scorecard.Printed = linesNaming(out, ns+"/")
		}
	}
	if callsAfter, err := h.Sim.Calls(ctx); err == nil {
		row.CloudStackResults = resultDelta(callsBefore, callsAfter)
	}
	if h.OnSettled != nil {
		h.OnSettled(ctx, rc)
	}
	orphansLive, err := h.orphanVMs(ctx, cluster, true)
	if err != nil {
		return row, err
	}

	// Score before teardown: what was recycled, and was it broken?
	score := ScoreRecycles(h.Player.Injections(ns), rec.Machines(), time.Now())
	row.Faults, row.RecycledMachines, row.FalseRecycles = score.Faults, score.Recycled, score.FalseRecycles
	row.SecondsFaultToRecycle = score.FirstFaultToRecycle
	row.Causality = CausalChains(h.Player.Injections(ns), rec.Machines())
	row.RecorderSteps, row.RecorderFailedSteps, row.RecorderErrors = rec.Health()
	if row.RecorderFailedSteps > 0 {
		tl.Add(fmt.Sprintf("the recorder failed %d of %d steps: %v", row.RecorderFailedSteps, row.RecorderSteps, row.RecorderErrors))
	}
	row.Notes = append(row.Notes, score.Notes...)
	scanned := map[string]string{}
	if rc.Orphans != nil {
		rc.Orphans.Stop(ctx)
		scoreOrphanWatch(&row, rc.Orphans, shim.Config)
		tl.Add(fmt.Sprintf("orphan report: %d VM(s) reported, %d of them not orphaned on purpose, %d listed at the end", row.OrphansReported, row.FalseOrphans, row.OrphansOpenAtEnd))
	}
	if rc.Remnants != nil {
		rc.Remnants.Stop(ctx)
		scoreRemnantWatch(&row, rc.Remnants)
		row.RemnantsClearedSeconds = rc.RemnantsClearedSeconds
		tl.Add(fmt.Sprintf("remnant report: %d of %d expected remnant(s) reported in time, %d false", row.RemnantsReported, row.RemnantsExpected, row.FalseRemnants))
	}
	if shim != nil {
		scanned = shimSurfaces(ctx, c, shim, ns, filepath.Join(h.OutDir, "logs"))
		if err := shim.Stop(); err != nil {
			row.Notes = append(row.Notes, fmt.Sprintf("shim exit: %v", err))
		}
		shim = nil
	}

	leftovers, orphansAfter, notes, err := h.teardown(ctx, rc, userObjs)
	if err != nil {
		return row, err
	}
	row.LeftoverObjects = len(leftovers)
	row.Notes = append(row.Notes, notes...)
	row.OrphanVMs = orphansLive + orphansAfter
	tl.Add(fmt.Sprintf("cluster deleted: %d leftover objects, %d orphan VMs", row.LeftoverObjects, row.OrphanVMs))
	row.Timeline = filepath.Join(h.OutDir, "timelines", ns+".txt")
	if err := os.MkdirAll(filepath.Dir(row.Timeline), 0o755); err == nil {
		_ = os.WriteFile(row.Timeline, []byte(strings.Join(tl.Entries(), "\n")+"\n"), 0o644)
	}
	readFiles(scanned, row.Timeline, filepath.Join(h.OutDir, "logs", "shim-"+ns+".log"), OrphansCommandLog(h.OutDir, ns), ScorecardCommandLog(h.OutDir, ns))
	if b, err := json.Marshal(row); err == nil {
		scanned["report row"] = string(b)
	}
	row.SecretLeaks = ScanForSecrets(scanned)
	if row.SecretLeaks == nil {
		row.SecretLeaks = []string{}
	}
	return row, nil
}

// measureLoad is the run's CloudStack load per key: provisioning from the readings at creation
// and at ready, steady over the scenario's SteadyWindow after ready (nil without one).
func (h *Harness) measureLoad(ctx context.Context, sc Scenario, tl *Timeline, provisioning time.Duration, atCreation, atReady map[string]KeyCalls) *CloudStackLoad {
	if sc.SteadyWindow <= 0 {
		return nil
	}
	machines := int(sc.ControlPlanes + sc.Workers)
	load := &CloudStackLoad{Machines: machines, Provisioning: loadWindow(provisioning, machines, atCreation, atReady)}
	tl.Add(fmt.Sprintf("steady state: counting CloudStack calls per key for %s", sc.SteadyWindow))
	from := time.Now()
	sleep(ctx, sc.SteadyWindow)
	atEnd, err := h.Sim.AccountCalls(ctx)
	if err != nil {
		tl.Add("steady state: calls unreadable: " + err.Error())
		return load
	}
	steady := loadWindow(time.Since(from), machines, atReady, atEnd)
	load.Steady = &steady
	tl.Add(fmt.Sprintf("steady state: %s", steady.Summary()))
	return load
}

// scoreOrphanWatch puts what the shim's orphan report said in the row.
func scoreOrphanWatch(row *Row, w *OrphanWatch, cfg ShimConfig) {
	sc := w.Score()
	row.OrphansReported, row.FalseOrphans, row.OrphansOpenAtEnd = sc.Reported, sc.False, sc.OpenAtEnd
	row.OrphanReports = sc.Records
	if sc.MaxSuspects >= 0 {
		row.OrphanSuspectsMax = &sc.MaxSuspects
	}
	for _, r := range sc.Records {
		if r.Race != "" {
			row.OrphanBoundSeconds = secs(OrphanReportBound(cfg))
			break
		}
	}
	if w.Absent() {
		row.Notes = append(row.Notes, NoteNoOrphanReport)
	}
}

// scoreRemnantWatch puts what the shim's remnant report said in the row.
func scoreRemnantWatch(row *Row, w *RemnantWatch) {
	sc := w.Score()
	row.RemnantsExpected, row.RemnantsReported, row.FalseRemnants = sc.Expected, sc.Reported, sc.False
	row.RemnantReports = sc.Records
	if w.Absent() {
		row.Notes = append(row.Notes, NoteNoRemnantReport)
	}
}

// NoteNoRemnantReport: the shim's /status had no "remnants" array at the end of the run.
const NoteNoRemnantReport = "the shim's /status has no remnants array (remnant report off or an older shim)"

// OrphansCommandLog is where a run saves what `capc-health-shim orphans` printed.
func OrphansCommandLog(outDir, ns string) string {
	return filepath.Join(outDir, "logs", "shim-"+ns+"-orphans.txt")
}

// machineHealthCheck is the run's MHC as a user of the stack's CAPI writes it: v1beta1 with the
// shim's annotation (CAPI v1.9, annotate mode), v1beta2 with the shim's condition among
// unhealthyMachineConditions (CAPI v1.13, condition mode); nil for MHCNone. The recommended one
// (with the shim) keeps the node-startup timer as a 30-minute backstop, the default is stock
// CAPI's 10 minutes.
func (h *Harness) machineHealthCheck(ns, cluster, mhc string) client.Object {
	spec := MHCSpec{UnhealthyTimeout: Scaled(5 * time.Minute), NodeStartupTimeout: mhcNodeStartupTimeout(mhc)}
	switch mhc {
	case MHCLegacy:
		return MachineHealthCheck(ns, cluster, spec)
	case MHCRecommended:
		if h.Stack.V1Beta2() {
			spec.ShimConditionTimeout = Scaled(60 * time.Second)
		}
	case MHCDefault:
	default:
		return nil
	}
	if h.Stack.V1Beta2() {
		return MachineHealthCheckV1Beta2(ns, cluster, spec)
	}
	return MachineHealthCheck(ns, cluster, spec)
}

// mhcNodeStartupTimeout is the MHC kind's node-startup timer, scaled: the recommended MHC's is
// only a backstop (30 min, deploy/examples), stock CAPI's 10 min; 0 without an MHC.
func mhcNodeStartupTimeout(mhc string) time.Duration {
	switch mhc {
	case MHCRecommended, MHCLegacy:
		return Scaled(30 * time.Minute)
	case MHCDefault:
		return Scaled(10 * time.Minute)
	}
	return 0
}

// mhcMachineConditions reads a MachineHealthCheck back as v1beta2 and lists its
// checks.unhealthyMachineConditions as Type=Status.
func mhcMachineConditions(ctx context.Context, c client.Client, ns, name string) ([]string, error) {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(clusterv1.GroupVersion.Group + "/v1beta2")
	u.SetKind("MachineHealthCheck")
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, u); err != nil {
		return nil, fmt.Errorf("read MachineHealthCheck %s/%s as v1beta2: %w", ns, name, err)
	}
	list, _, err := unstructured.NestedSlice(u.Object, "spec", "checks", "unhealthyMachineConditions")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, item := range list {
		m, _ := item.(map[string]any)
		out = append(out, fmt.Sprintf("%v=%v", m["type"], m["status"]))
	}
	return out, nil
}

// Score is what a run recycled.
type Score struct {
	Faults              []string
	Recycled            int
	FalseRecycles       int
	FirstFaultToRecycle *float64
	Notes               []string
}

// ScoreRecycles decides what counts as a recycle among the Machines deleted before teardown
// began: a faulty Machine's deletion whoever asked for it (CAPC itself deletes Machines whose VM
// it sees in Error), a healthy Machine's only when an MHC found it unhealthy first — a false
// recycle; Machines replaced by a rollout or a scale-down are not recycles.
func ScoreRecycles(injections []Injection, machines []MachineRecord, teardown time.Time) Score {
	var s Score
	faulty := map[string]Injection{}
	for _, inj := range injections {
		s.Faults = append(s.Faults, fmt.Sprintf("%s on %s", inj.Fault, inj.Machine))
		if !benignFault(inj.Fault) {
			faulty[inj.Machine] = inj
		}
	}
	for _, m := range machines {
		inj, broken := faulty[m.Name]
		if m.Deleting.IsZero() || m.Deleting.After(teardown) || (!broken && !m.Remediated()) {
			continue
		}
		s.Recycled++
		if !broken {
			s.FalseRecycles++
			s.Notes = append(s.Notes, "false recycle: "+m.Name)
			continue
		}
		if d := m.Deleting.Sub(inj.At); s.FirstFaultToRecycle == nil || d.Seconds() < *s.FirstFaultToRecycle {
			s.FirstFaultToRecycle = secs(d)
		}
	}
	return s
}

// teardown does what a user does: delete the Cluster and wait for it, then delete the objects
// they applied. It returns the managed objects left behind, the cluster's VMs still alive, and
// notes on what did not finish.
func (h *Harness) teardown(ctx context.Context, rc *RunContext, userObjs []client.Object) ([]string, int, []string, error) {
	c, ns, cluster := h.Mgmt.Client, rc.Namespace, rc.Cluster
	var notes []string
	rc.TL.Add("deleting cluster " + cluster)
	if err := c.Delete(ctx, &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: cluster}}); err != nil && !apierrors.IsNotFound(err) {
		return nil, 0, nil, err
	}
	gone := WaitFor(ctx, 3*time.Minute, time.Second, "cluster deleted", func() (bool, error) {
		err := h.Mgmt.Direct.Get(ctx, client.ObjectKey{Namespace: ns, Name: cluster}, &clusterv1.Cluster{})
		return apierrors.IsNotFound(err), nil
	})
	if gone != nil {
		notes = append(notes, gone.Error())
	}
	userSecrets := map[string]bool{CredentialsSecret: true, ShimSecret: true, ProbeSecret: true}
	var leftovers []string
	_ = WaitFor(ctx, 30*time.Second, time.Second, "garbage collected", func() (bool, error) {
		l, err := Leftovers(ctx, h.Mgmt.Direct, ns, userSecrets)
		leftovers = l
		return err == nil && len(l) == 0, err
	})
	for _, l := range leftovers {
		notes = append(notes, "leftover: "+l)
	}
	for _, o := range userObjs {
		if _, isCluster := o.(*clusterv1.Cluster); !isCluster {
			_ = c.Delete(ctx, o)
		}
	}
	var orphans int
	_ = WaitFor(ctx, 20*time.Second, time.Second, "VMs gone", func() (bool, error) {
		n, err := h.orphanVMs(ctx, cluster, false)
		orphans = n
		return err == nil && n == 0, err
	})
	return leftovers, orphans, notes, nil
}

// benignFault marks behaviours that are not failures (a slow but healthy boot).
func benignFault(f string) bool { return f == "slow-boot" }

func pendingRules(rules []*FaultRule) int {
	n := 0
	for _, r := range rules {
		n += r.Count
	}
	return n
}

func conditionEvidence(rec *Recorder) []string {
	var out []string
	for _, m := range rec.Machines() {
		if m.Evidence != "" {
			out = append(out, m.Name+": "+m.Evidence)
		}
	}
	return out
}

func shimFalseMessages(rec *Recorder) []string {
	var out []string
	for _, m := range rec.Machines() {
		if !m.ShimFalse.IsZero() {
			out = append(out, m.Name+": "+m.ShimMessage)
		}
	}
	return out
}

func shimSummary(rec *Recorder) []string {
	var out []string
	for _, m := range rec.Machines() {
		if !m.ShimFalse.IsZero() {
			out = append(out, fmt.Sprintf("%s: False/%s", m.Name, m.ShimReason))
		}
	}
	return out
}

// orphanVMs counts the cluster's live VMs (named after its Machines) that no CloudStackMachine
// points at; with live=false every live VM of the cluster counts (after deletion none may remain).
func (h *Harness) orphanVMs(ctx context.Context, cluster string, live bool) (int, error) {
	vms, err := h.Sim.VMs(ctx)
	if err != nil {
		return 0, err
	}
	var csms infrav1b3.CloudStackMachineList
	if err := h.Mgmt.Direct.List(ctx, &csms); err != nil {
		return 0, err
	}
	owned := map[string]bool{}
	for _, c := range csms.Items {
		if c.Spec.InstanceID != nil {
			owned[*c.Spec.InstanceID] = true
		}
	}
	n := 0
	for _, v := range vms {
		if v.Gone() || !strings.HasPrefix(v.Name, cluster+"-") {
			continue
		}
		if !live || !owned[v.ID] {
			n++
		}
	}
	return n, nil
}

// resultDelta sums GET /sim/calls answers by result (HTTP status) between two snapshots.
func resultDelta(before, after map[string]any) map[string]int {
	sum := func(calls map[string]any) map[string]int {
		out := map[string]int{}
		byCommand, _ := calls["by_command"].(map[string]any)
		for _, results := range byCommand {
			r, _ := results.(map[string]any)
			for status, n := range r {
				if f, ok := n.(float64); ok {
					out[status] += int(f)
				}
			}
		}
		return out
	}
	b, a := sum(before), sum(after)
	for k, v := range b {
		a[k] -= v
	}
	for k, v := range a {
		if v == 0 {
			delete(a, k)
		}
	}
	return a
}
