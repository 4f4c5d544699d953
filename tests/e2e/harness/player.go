package harness

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	infrav1b3 "sigs.k8s.io/cluster-api-provider-cloudstack/api/v1beta3"
	clusterv1 "sigs.k8s.io/cluster-api/api/v1beta1"
)

// FaultRule injects a fault into the VM of a matching Machine when that VM is first seen
// Running (e.g. "the NICs go down right after boot"); Count bounds how many VMs it hits.
type FaultRule struct {
	Describe string
	Match    func(m *clusterv1.Machine, nth int) bool // nth: how many Machines of this role were seen before
	Fault    string
	Count    int
	Delay    time.Duration // after Running
}

// Injection is one fault the player applied.
type Injection struct {
	Machine, VM, Fault string
	At                 time.Time
}

// GuestTiming is how long simulated kubeadm takes once the guest is up (scaled).
type GuestTiming struct {
	Init, Join time.Duration
}

// Player plays every guest: it watches cloudstack-sim's VMs and the Machines, injects the
// scenario's faults, and for a VM whose guest is healthy (the simulator's `joined`) does what
// cloud-init + kubeadm would do in the workload cluster after the configured delay. A guest with
// a fault never joins. It also stands in for kube-controller-manager's garbage collector, which
// the test API server lacks (see gc.go).
type Player struct {
	Mgmt      *Management
	Sim       *Sim
	Workloads *Workloads
	Timing    GuestTiming

	mu         sync.Mutex
	rules      map[string][]*FaultRule // by namespace
	seenRole   map[string]int          // namespace/role → Machines seen
	guests     map[string]*guestState  // by VM id
	injections map[string][]Injection  // by namespace
	events     map[string]*Timeline
}

type guestState struct {
	machine     string
	namespace   string
	cluster     string
	cp          bool
	checked     bool // fault rules evaluated
	readySince  time.Time
	joined      bool
	left        bool
	runningSeen bool
	runningAt   time.Time
	pending     *FaultRule
	waiting     bool // playing a guest whose kubeadm waits for the cluster's endpoint
}

// NewPlayer makes a player; Run starts it.
func NewPlayer(m *Management, s *Sim, w *Workloads, t GuestTiming) *Player {
	return &Player{
		Mgmt: m, Sim: s, Workloads: w, Timing: t,
		rules: map[string][]*FaultRule{}, seenRole: map[string]int{}, guests: map[string]*guestState{},
		injections: map[string][]Injection{}, events: map[string]*Timeline{},
	}
}

// Plan sets the fault rules and the timeline for a namespace's cluster.
func (p *Player) Plan(namespace string, rules []*FaultRule, tl *Timeline) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rules[namespace] = rules
	p.events[namespace] = tl
}

// Injections returns the faults applied in a namespace.
func (p *Player) Injections(namespace string) []Injection {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Injection(nil), p.injections[namespace]...)
}

// Run plays until ctx ends.
func (p *Player) Run(ctx context.Context) {
	Every(ctx, 250*time.Millisecond, func() {
		if err := p.step(ctx); err != nil && ctx.Err() == nil {
			// Not a namespace's event: it goes to the controllers' log.
			ctrl.Log.WithName("player").Error(err, "guest player step failed")
		}
	})
}

func (p *Player) logf(namespace, format string, args ...any) {
	p.mu.Lock()
	tl := p.events[namespace]
	p.mu.Unlock()
	if tl != nil {
		tl.Add(fmt.Sprintf(format, args...))
	}
}

func (p *Player) step(ctx context.Context) error {
	vms, err := p.Sim.VMs(ctx)
	if err != nil {
		return err
	}
	byID := map[string]SimVM{}
	for _, v := range vms {
		byID[v.ID] = v
	}
	var machines clusterv1.MachineList
	if err := p.Mgmt.Client.List(ctx, &machines); err != nil {
		return err
	}
	var csms infrav1b3.CloudStackMachineList
	if err := p.Mgmt.Client.List(ctx, &csms); err != nil {
		return err
	}
	instance := map[string]string{} // namespace/CSMachine name → VM id
	for _, c := range csms.Items {
		if c.Spec.InstanceID != nil && *c.Spec.InstanceID != "" {
			instance[c.Namespace+"/"+c.Name] = *c.Spec.InstanceID
		}
	}
	for i := range machines.Items {
		m := &machines.Items[i]
		vmID := instance[m.Namespace+"/"+m.Spec.InfrastructureRef.Name]
		if vmID == "" {
			continue
		}
		p.mu.Lock()
		g := p.guests[vmID]
		if g == nil {
			role := "worker"
			if _, ok := m.Labels[clusterv1.MachineControlPlaneLabel]; ok {
				role = "control-plane"
			}
			g = &guestState{machine: m.Name, namespace: m.Namespace, cluster: m.Spec.ClusterName, cp: role == "control-plane"}
			p.guests[vmID] = g
		}
		p.mu.Unlock()
		vm, present := byID[vmID]
		if err := p.playGuest(ctx, m, g, vmID, vm, present); err != nil {
			p.logf(m.Namespace, "guest of %s: %v", m.Name, err)
		}
	}
	return nil
}

func (p *Player) playGuest(ctx context.Context, m *clusterv1.Machine, g *guestState, vmID string, vm SimVM, present bool) error {
	now := time.Now()
	if present && vm.State == "Running" && !g.runningSeen {
		g.runningSeen, g.runningAt = true, now
		p.logf(m.Namespace, "VM %s of Machine %s is Running (%s)", short(vmID), m.Name, ipOf(vm))
	}
	if g.runningSeen && !g.checked {
		g.checked = true
		g.pending = p.matchRule(m, g)
	}
	if g.pending != nil && now.Sub(g.runningAt) >= g.pending.Delay && present && !vm.Gone() {
		rule := g.pending
		g.pending = nil
		if err := p.Sim.InjectFault(ctx, vmID, rule.Fault); err != nil {
			return err
		}
		p.mu.Lock()
		p.injections[m.Namespace] = append(p.injections[m.Namespace], Injection{Machine: m.Name, VM: vmID, Fault: rule.Fault, At: time.Now()})
		p.mu.Unlock()
		p.logf(m.Namespace, "FAULT %s injected into VM %s of Machine %s (%s)", rule.Fault, short(vmID), m.Name, rule.Describe)
	}
	if err := p.playWaiting(ctx, g, vmID, vm, present); err != nil {
		return err
	}
	gone := !present || vm.Gone()
	if gone {
		if g.joined && g.cp && !g.left {
			g.left = true
			p.logf(m.Namespace, "VM %s of %s is gone: its control-plane components stop", short(vmID), m.Name)
			return p.Workloads.LeaveControlPlane(ctx, g.namespace, g.cluster, g.machine)
		}
		return nil
	}
	if g.joined || !vm.Joined || !m.DeletionTimestamp.IsZero() || g.pending != nil {
		if !vm.Joined {
			g.readySince = time.Time{}
		}
		return nil
	}
	if g.readySince.IsZero() {
		g.readySince = now
	}
	delay := p.Timing.Join
	init := g.cp && !p.Workloads.Initialized(ctx, g.namespace, g.cluster)
	if init {
		delay = p.Timing.Init
	}
	if now.Sub(g.readySince) < delay {
		return nil
	}
	node := GuestNode{
		Namespace: g.namespace, Cluster: g.cluster, NodeName: m.Name, ProviderID: "cloudstack:///" + vmID,
		Address: ipOf(vm), ControlPlane: g.cp, Version: KubernetesVersion,
	}
	if g.cp {
		initialized, err := p.Workloads.JoinControlPlane(ctx, p.Mgmt.Direct, node)
		if err != nil {
			return err
		}
		if initialized {
			p.logf(m.Namespace, "kubeadm init done on %s: the workload cluster's API server is up", m.Name)
		} else {
			p.logf(m.Namespace, "kubeadm join (control plane) done on %s", m.Name)
		}
	} else {
		if err := p.Workloads.JoinWorker(ctx, node); err != nil {
			return err
		}
		p.logf(m.Namespace, "kubeadm join done on %s: Node registered", m.Name)
	}
	g.joined = true
	return nil
}

// playWaiting makes a worker's traffic what a real one sends while the workload cluster's
// endpoint is not up yet — kubeadm's discovery retrying every few seconds, a trickle the shim
// must not take for silence — and hands it back to its guest kind's plan once the endpoint
// is up (scenario 3 keeps its workers waiting for good).
func (p *Player) playWaiting(ctx context.Context, g *guestState, vmID string, vm SimVM, present bool) error {
	if g.cp || g.joined || !present || vm.Gone() || vm.State != "Running" || !vm.Joined {
		return nil
	}
	initialized := p.Workloads.Initialized(ctx, g.namespace, g.cluster)
	switch {
	case !initialized && !g.waiting:
		g.waiting = true
		p.logf(g.namespace, "guest of %s waits for the cluster endpoint (traffic: kubeadm discovery retries)", g.machine)
		return p.Sim.SetProfile(ctx, vmID, "waiting-for-endpoint")
	case initialized && g.waiting:
		g.waiting = false
		return p.Sim.SetProfile(ctx, vmID, "default")
	}
	return nil
}

func (p *Player) matchRule(m *clusterv1.Machine, g *guestState) *FaultRule {
	p.mu.Lock()
	defer p.mu.Unlock()
	role := "worker"
	if g.cp {
		role = "cp"
	}
	key := m.Namespace + "/" + role
	nth := p.seenRole[key]
	p.seenRole[key] = nth + 1
	for _, r := range p.rules[m.Namespace] {
		if r.Count > 0 && r.Match(m, nth) {
			r.Count--
			return r
		}
	}
	return nil
}

func ipOf(vm SimVM) string {
	if vm.IPAddress == nil {
		return ""
	}
	return *vm.IPAddress
}

func short(id string) string {
	if i := strings.IndexByte(id, '-'); i > 0 {
		return id[:i]
	}
	return id
}

// IsControlPlane reports whether a Machine belongs to the control plane.
func IsControlPlane(m *clusterv1.Machine) bool {
	_, ok := m.Labels[clusterv1.MachineControlPlaneLabel]
	return ok
}
