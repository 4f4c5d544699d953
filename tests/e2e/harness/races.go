package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	infrav1b3 "sigs.k8s.io/cluster-api-provider-cloudstack/api/v1beta3"
	clusterv1 "sigs.k8s.io/cluster-api/api/v1beta1"
)

// ScenarioDeletionRaces (issue 17): two ways CAPI loses a CloudStack VM for good, each made on
// the real CAPI + CAPC controllers, and the shim must report exactly those two VMs as orphans,
// each within its grace plus two poll intervals, with a Warning Event on the Cluster; then the
// operator destroys them as `capc-health-shim orphans` says and the report clears.
//
//   - deploy-in-flight: a worker Machine deleted after CloudStack created its VM and before CAPC
//     recorded the VM's id and its finalizer on the CloudStackMachine (a slow deployVirtualMachine
//     answer, capc#190; see raceDeployInFlight for how the harness opens that window): the
//     CloudStackMachine is gone at once and the VM — named after it — runs on: name-of-deleted.
//   - finalizer-removed: an operator removes the finalizer from a running worker's
//     CloudStackMachine and its Machine is deleted; CAPC never destroys the VM:
//     instance-of-deleted.
//
// The MachineSet replaces both Machines and the cluster must converge after both races.
//
// Then, last (issue 29, the seed's case; leftbehind.go): one running worker's VM gets the
// simulator's destroy-fails fault and the workload Cluster is deleted: the objects that stay
// deleting behind CAPC's failing destroy must be reported as remnants, and the report must
// empty once the fault is cleared and the Cluster is gone.
var ScenarioDeletionRaces = Scenario{
	Key:   "8-deletion-races",
	Title: "deletion races: a worker Machine deleted while CAPC's deploy job is in flight, a running worker's CloudStackMachine finalizer removed by hand; the shim reports exactly those two VMs; then the Cluster deleted while one VM's destroy keeps failing: the shim reports what is left behind",
	// Both workers are raced; the replacements make the cluster whole.
	ControlPlanes: 1, Workers: 2, Deadline: 5 * time.Minute,
	During:    deletionRaces,
	HoldReady: true,
	// After the cluster converged: the rest of the orphan grace, the reports, the cleanup; then
	// the Cluster deleted behind a failing destroy: the remnant grace, the reports, the fault
	// cleared and the deletion finished.
	DuringWait: 16 * time.Minute,
}

// The races, as the rows name them.
const (
	RaceDeployInFlight   = "deploy-in-flight"
	RaceFinalizerRemoved = "finalizer-removed"
)

// abortErr ends a wait at once (waitOrAbort); other errors are retried until the deadline.
type abortErr struct{ err error }

func (e abortErr) Error() string { return e.err.Error() }

func abort(format string, args ...any) error { return abortErr{fmt.Errorf(format, args...)} }

// waitOrAbort is WaitFor whose condition can give up for good by returning abort(…).
func waitOrAbort(ctx context.Context, timeout, interval time.Duration, what string, cond func() (bool, error)) error {
	var stop error
	err := WaitFor(ctx, timeout, interval, what, func() (bool, error) {
		ok, err := cond()
		var a abortErr
		if errors.As(err, &a) {
			stop = a.err
			return true, nil
		}
		return ok, err
	})
	if stop != nil {
		return fmt.Errorf("%s: %w", what, stop)
	}
	return err
}

func deletionRaces(ctx context.Context, r *RunContext) error {
	if r.Shim == nil || r.Orphans == nil {
		return errors.New("the deletion races need the shim (its orphan report is what they test)")
	}
	var planned []DeliberateOrphan
	var errs []error
	a, err := raceDeployInFlight(ctx, r)
	if a.VMID != "" {
		planned = append(planned, a.DeliberateOrphan)
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("race %s: %w", RaceDeployInFlight, err))
	} else {
		b, err := raceFinalizerRemoved(ctx, r, a.machine)
		if b.VMID != "" {
			planned = append(planned, b.DeliberateOrphan)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("race %s: %w", RaceFinalizerRemoved, err))
		}
	}
	r.ReleaseReady()
	// Whatever happened, the VMs orphaned on purpose are destroyed at the end.
	errs = append(errs, operatorCleansUp(ctx, r, planned))
	// Last, as it deletes the workload Cluster: the seed's case (issue 29).
	if err := clusterLeftBehind(ctx, r); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", RaceClusterLeftBehind, err))
	}
	return errors.Join(errs...)
}

// racedMachine is a raced Machine and what the race orphaned.
type racedMachine struct {
	DeliberateOrphan
	machine string
}

// workerMachines are the namespace's worker Machines not being deleted, by CloudStackMachine name.
func workerMachines(ctx context.Context, c client.Client, ns string) (map[string]clusterv1.Machine, error) {
	var ms clusterv1.MachineList
	if err := c.List(ctx, &ms, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	out := map[string]clusterv1.Machine{}
	for _, m := range ms.Items {
		if !IsControlPlane(&m) && m.DeletionTimestamp.IsZero() && m.Spec.InfrastructureRef.Name != "" {
			out[m.Spec.InfrastructureRef.Name] = m
		}
	}
	return out, nil
}

func (r *RunContext) clusterKey() string { return r.Namespace + "/" + r.Cluster }

// raceDeployInFlight: a worker Machine is deleted after CloudStack created its VM and before
// CAPC recorded it. In CAPC v0.6.1 that window is one reconcile long: DeployVM calls
// deployVirtualMachine through cloudstack-go's non-async client (`c.cs`, NewClient), which
// answers with the VM id at once without waiting for the job; the in-memory instanceID and the
// finalizer GetOrCreateVMInstance then adds reach the API server only in the reconcile's
// deferred patch (controllers/utils/base_reconciler.go). A slow deployVirtualMachine answer
// (capc#190) is what stretches it. The harness stretches it from the Kubernetes side: a
// ValidatingAdmissionPolicy refuses, for this cluster's worker CloudStackMachines, the update that
// first sets spec.instanceID, so CAPC's patch (instanceID + finalizer) fails and it retries,
// finding its VM by name each time — the API server shows what it would during a slow answer:
// the VM exists, named after a CloudStackMachine that has neither instanceID nor finalizer.
// Once the shim tracks that Machine and CAPC's "Created" Event shows it holds the VM, the
// Machine is deleted; its CloudStackMachine is gone at once; the policy is removed and the VM
// runs on, owned by nothing.
func raceDeployInFlight(ctx context.Context, r *RunContext) (rm racedMachine, err error) {
	c, sim := r.H.Mgmt.Direct, r.H.Sim
	release, err := holdInstanceIDs(ctx, c, r)
	if err != nil {
		return rm, err
	}
	defer release()
	var vm SimVM
	var csmName string
	err = waitOrAbort(ctx, 4*time.Minute, 200*time.Millisecond, "a worker VM deployed whose CloudStackMachine has no instanceID nor finalizer, CAPC holding it, the shim tracking its Machine", func() (bool, error) {
		workers, err := workerMachines(ctx, c, r.Namespace)
		if err != nil {
			return false, err
		}
		vms, err := sim.VMs(ctx)
		if err != nil {
			return false, err
		}
		byName := map[string]SimVM{}
		for _, v := range vms {
			if v.Deployed && !v.Gone() {
				byName[v.Name] = v
			}
		}
		var events corev1.EventList
		if err := c.List(ctx, &events, client.InNamespace(r.Namespace)); err != nil {
			return false, err
		}
		names := make([]string, 0, len(workers))
		for n := range workers {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			v, ok := byName[n]
			if !ok {
				continue
			}
			csm := &infrav1b3.CloudStackMachine{}
			if err := c.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: n}, csm); err != nil {
				continue
			}
			if csm.Spec.InstanceID != nil && *csm.Spec.InstanceID != "" {
				return false, abort("CAPC recorded instanceID %s on CloudStackMachine %s: the admission policy did not hold it", *csm.Spec.InstanceID, n)
			}
			if controllerutil.ContainsFinalizer(csm, infrav1b3.MachineFinalizer) {
				return false, abort("CAPC recorded its finalizer on CloudStackMachine %s without instanceID", n)
			}
			if !capcCreatedEvent(events.Items, n) {
				continue
			}
			m := workers[n]
			tracked, _, err := r.Shim.Tracks(ctx, r.clusterKey(), m.Name)
			if err != nil || !tracked {
				continue
			}
			rm.machine, vm, csmName = m.Name, v, n
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		return rm, err
	}
	r.TL.Add(fmt.Sprintf("RACE %s: CloudStack created VM %s (%s, %s) and CAPC holds it (Event Created on its CloudStackMachine), but CloudStackMachine %s has neither instanceID nor finalizer yet (CAPC's patch is held: stands in for a slow deployVirtualMachine answer); the shim tracks Machine %s: deleting the Machine",
		RaceDeployInFlight, short(vm.ID), vm.Name, vm.State, csmName, rm.machine))
	deleted := time.Now()
	if err := c.Delete(ctx, &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: rm.machine}}); err != nil {
		return rm, fmt.Errorf("delete Machine %s: %w", rm.machine, err)
	}
	key := client.ObjectKey{Namespace: r.Namespace, Name: csmName}
	gone, err := waitGone(ctx, c, key, 30*time.Second, false)
	if err != nil {
		return rm, err
	}
	rm.DeliberateOrphan = DeliberateOrphan{VMID: vm.ID, VMName: vm.Name, Kind: OrphanNameOfDeleted, Race: RaceDeployInFlight,
		CloudStackMachine: r.Namespace + "/" + csmName, GoneAt: gone}
	r.Orphans.Expect(rm.DeliberateOrphan)
	release()
	r.TL.Add(fmt.Sprintf("RACE %s: CloudStackMachine %s is gone %.1fs after its Machine's deletion, without instanceID or finalizer: CAPC will never destroy VM %s; admission policy removed (CAPC records the other workers' VMs again)",
		RaceDeployInFlight, csmName, gone.Sub(deleted).Seconds(), short(vm.ID)))
	err = waitOrAbort(ctx, 30*time.Second, 200*time.Millisecond, "VM "+vm.ID+" Running", func() (bool, error) {
		v, err := sim.VM(ctx, vm.ID)
		if err != nil {
			return false, err
		}
		if v.Gone() {
			return false, abort("VM %s was destroyed (%s)", vm.ID, v.State)
		}
		return v.State == "Running", nil
	})
	if err != nil {
		return rm, err
	}
	r.TL.Add(fmt.Sprintf("RACE %s: VM %s (%s) is Running, owned by no CloudStackMachine", RaceDeployInFlight, short(vm.ID), vm.Name))
	return rm, nil
}

// capcCreatedEvent: CAPC's "Created" Event on the CloudStackMachine (CSMachineCreationSuccess),
// which it records when GetOrCreateVMInstance returned the VM and it adds its finalizer.
func capcCreatedEvent(events []corev1.Event, csm string) bool {
	for _, e := range events {
		if e.InvolvedObject.Kind == "CloudStackMachine" && e.InvolvedObject.Name == csm && e.Reason == "Created" {
			return true
		}
	}
	return false
}

// holdInstanceIDs installs the admission policy of raceDeployInFlight for the run's worker
// CloudStackMachines (label cluster.x-k8s.io/deployment-name=<cluster>-md-0 in its namespace):
// an update that sets spec.instanceID where there was none is refused. The returned release
// removes it (idempotent).
func holdInstanceIDs(ctx context.Context, c client.Client, r *RunContext) (func(), error) {
	name := "e2e-" + r.Namespace + "-hold-instance-id"
	fail := admissionregistrationv1.Fail
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: &fail,
			MatchConstraints: &admissionregistrationv1.MatchResources{
				ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Update},
						Rule: admissionregistrationv1.Rule{
							APIGroups: []string{infrav1b3.GroupVersion.Group}, APIVersions: []string{"*"}, Resources: []string{"cloudstackmachines"},
						},
					},
				}},
			},
			Validations: []admissionregistrationv1.Validation{{
				Expression: "has(oldObject.spec.instanceID) || !has(object.spec.instanceID)",
				Message:    "e2e scenario 8: this worker's instanceID is held (a slow deployVirtualMachine answer)",
			}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName:        name,
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{corev1.LabelMetadataName: r.Namespace}},
				ObjectSelector:    &metav1.LabelSelector{MatchLabels: map[string]string{clusterv1.MachineDeploymentNameLabel: r.Cluster + "-md-0"}},
			},
		},
	}
	if err := CreateAll(ctx, c, policy, binding); err != nil {
		return nil, fmt.Errorf("admission policy %s: %w", name, err)
	}
	r.TL.Add("admission policy " + name + ": the update that first records spec.instanceID on a worker CloudStackMachine of " + r.Cluster + " is refused until the race is done")
	released := false
	return func() {
		if released {
			return
		}
		released = true
		bg := context.Background()
		_ = c.Delete(bg, binding)
		_ = c.Delete(bg, policy)
	}, nil
}

// raceFinalizerRemoved: a worker whose Machine has its Node, whose VM runs and whose
// CloudStackMachine has CAPC's finalizer and instanceID (and which the shim tracks with that VM)
// loses the finalizer by hand; its Machine is deleted; the CloudStackMachine is gone without
// CAPC destroying the VM.
func raceFinalizerRemoved(ctx context.Context, r *RunContext, skip string) (racedMachine, error) {
	c, sim := r.H.Mgmt.Direct, r.H.Sim
	var rm racedMachine
	var csm *infrav1b3.CloudStackMachine
	var vm SimVM
	err := WaitFor(ctx, 4*time.Minute, 250*time.Millisecond, "a running worker with its Node, its CloudStackMachine finalized", func() (bool, error) {
		workers, err := workerMachines(ctx, c, r.Namespace)
		if err != nil {
			return false, err
		}
		names := make([]string, 0, len(workers))
		for n := range workers {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			m := workers[n]
			if m.Name == skip || m.Status.NodeRef == nil {
				continue
			}
			cand := &infrav1b3.CloudStackMachine{}
			if err := c.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: n}, cand); err != nil {
				continue
			}
			if cand.Spec.InstanceID == nil || !controllerutil.ContainsFinalizer(cand, infrav1b3.MachineFinalizer) || !cand.DeletionTimestamp.IsZero() {
				continue
			}
			v, err := sim.VM(ctx, *cand.Spec.InstanceID)
			if err != nil || v.State != "Running" {
				continue
			}
			tracked, vmID, err := r.Shim.Tracks(ctx, r.clusterKey(), m.Name)
			if err != nil || !tracked || vmID != v.ID {
				continue
			}
			rm.machine, csm, vm = m.Name, cand, v
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		return rm, err
	}
	patch := client.MergeFromWithOptions(csm.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(csm, infrav1b3.MachineFinalizer)
	if err := c.Patch(ctx, csm, patch); err != nil {
		return rm, fmt.Errorf("remove the finalizer of CloudStackMachine %s: %w", csm.Name, err)
	}
	r.TL.Add(fmt.Sprintf("RACE %s: finalizer %s removed by hand from CloudStackMachine %s (VM %s Running, instanceID recorded, Machine %s has its Node)",
		RaceFinalizerRemoved, infrav1b3.MachineFinalizer, csm.Name, short(vm.ID), rm.machine))
	deleted := time.Now()
	if err := c.Delete(ctx, &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: rm.machine}}); err != nil {
		return rm, fmt.Errorf("delete Machine %s: %w", rm.machine, err)
	}
	r.TL.Add(fmt.Sprintf("RACE %s: Machine %s deleted", RaceFinalizerRemoved, rm.machine))
	gone, err := waitGone(ctx, c, client.ObjectKeyFromObject(csm), time.Minute, true)
	if err != nil {
		return rm, err
	}
	v, err := sim.VM(ctx, vm.ID)
	if err != nil {
		return rm, err
	}
	if v.Gone() {
		return rm, fmt.Errorf("VM %s is %s: CAPC destroyed it, the finalizer came back before the CloudStackMachine was deleted", vm.ID, v.State)
	}
	rm.DeliberateOrphan = DeliberateOrphan{VMID: vm.ID, VMName: vm.Name, Kind: OrphanInstanceOfDeleted, Race: RaceFinalizerRemoved,
		CloudStackMachine: r.Namespace + "/" + csm.Name, GoneAt: gone}
	r.Orphans.Expect(rm.DeliberateOrphan)
	r.TL.Add(fmt.Sprintf("RACE %s: CloudStackMachine %s is gone %.1fs after its Machine's deletion; VM %s (%s) is still %s and no one will destroy it",
		RaceFinalizerRemoved, csm.Name, gone.Sub(deleted).Seconds(), short(vm.ID), vm.Name, v.State))
	return rm, nil
}

// waitGone waits until the CloudStackMachine is gone and returns when the harness saw it so.
// With finalizerGone, a deletion held by CAPC's finalizer (it came back) ends the wait at once.
func waitGone(ctx context.Context, c client.Client, key client.ObjectKey, timeout time.Duration, finalizerGone bool) (time.Time, error) {
	var gone time.Time
	err := waitOrAbort(ctx, timeout, 100*time.Millisecond, "CloudStackMachine "+key.Name+" gone", func() (bool, error) {
		csm := &infrav1b3.CloudStackMachine{}
		err := c.Get(ctx, key, csm)
		if apierrors.IsNotFound(err) {
			gone = time.Now()
			return true, nil
		}
		if err != nil {
			return false, err
		}
		if finalizerGone && !csm.DeletionTimestamp.IsZero() && controllerutil.ContainsFinalizer(csm, infrav1b3.MachineFinalizer) {
			return false, abort("CAPC put its finalizer back: the CloudStackMachine is being deleted the normal way (its VM destroyed)")
		}
		return false, nil
	})
	return gone, err
}

// commandCalls is how many times the simulator answered a command so far (all accounts).
func commandCalls(ctx context.Context, sim *Sim, command string) int {
	calls, err := sim.Calls(ctx)
	if err != nil {
		return 0
	}
	byCommand, _ := calls["by_command"].(map[string]any)
	results, _ := byCommand[command].(map[string]any)
	n := 0
	for _, v := range results {
		if f, ok := v.(float64); ok {
			n += int(f)
		}
	}
	return n
}

// operatorCleansUp waits for the shim to report each VM orphaned on purpose (at most the bound
// after its CloudStackMachine was gone, plus a minute to measure a late report), checks its
// Warning Event on the Cluster, runs `capc-health-shim orphans`, destroys each VM as the
// printed `cmk destroy virtualmachine id=<id> expunge=true` would, and waits until the shim
// lists no orphan. Only the VMs orphaned on purpose are destroyed.
func operatorCleansUp(ctx context.Context, r *RunContext, planned []DeliberateOrphan) error {
	w := r.Orphans
	var errs []error
	if len(planned) > 0 {
		bound := OrphanReportBound(r.Shim.Config)
		last := planned[0].GoneAt
		for _, p := range planned[1:] {
			if p.GoneAt.After(last) {
				last = p.GoneAt
			}
		}
		r.TL.Add(fmt.Sprintf("waiting for the shim to report %d orphan VM(s): grace %.0fs, each due within %.1fs of its CloudStackMachine being gone",
			len(planned), r.Shim.Config.OrphanGrace().Seconds(), bound.Seconds()))
		err := WaitFor(ctx, time.Until(last.Add(bound+time.Minute)), 250*time.Millisecond, "orphans reported", func() (bool, error) {
			for _, p := range planned {
				if _, ok := w.Reported(p.VMID); !ok {
					return false, nil
				}
			}
			return true, nil
		})
		if err != nil {
			errs = append(errs, err)
		}
	}

	// One Warning Event on the Cluster per orphan (the shim writes it when it reports).
	var reported []DeliberateOrphan
	for _, p := range planned {
		if _, ok := w.Reported(p.VMID); ok {
			reported = append(reported, p)
		}
	}
	if len(reported) > 0 {
		found := map[string]bool{}
		var events corev1.EventList
		err := WaitFor(ctx, 15*time.Second, 500*time.Millisecond, OrphanEventReason+" Events on Cluster "+r.Cluster, func() (bool, error) {
			if err := r.H.Mgmt.Direct.List(ctx, &events, client.InNamespace(r.Namespace)); err != nil {
				return false, err
			}
			for _, p := range reported {
				if msg, ok := OrphanEventFor(events.Items, r.Cluster, p.VMID, p.VMName); ok && !found[p.VMID] {
					found[p.VMID] = true
					w.NoteEvent(p.VMID, msg)
					r.TL.Add(fmt.Sprintf("Event Warning %s on Cluster %s: %s", OrphanEventReason, r.Cluster, msg))
				}
			}
			return len(found) == len(reported), nil
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("%w (%d such Events on the Cluster)", err, CountOrphanEvents(events.Items, r.Cluster)))
		}
	}

	// The operator's view: `capc-health-shim orphans --url …`, one cmk command per orphan.
	out, err := r.Shim.OrphansCommand(ctx)
	_ = os.WriteFile(OrphansCommandLog(r.H.OutDir, r.Namespace), []byte(out), 0o644)
	if err != nil {
		errs = append(errs, err)
	}
	cmds := CmkDestroyCommands(out)
	r.TL.Add(fmt.Sprintf("capc-health-shim orphans printed %d cmk destroy command(s) (%s)", len(cmds), OrphansCommandLog(r.H.OutDir, r.Namespace)))
	for id, cmd := range cmds {
		w.NoteCommand(id, cmd)
	}

	for _, p := range planned {
		cmd := cmds[p.VMID]
		if cmd == "" {
			cmd = "cmk destroy virtualmachine id=" + p.VMID + " expunge=true"
			r.TL.Add("capc-health-shim orphans printed no command for VM " + p.VMID + "; destroying it all the same")
		}
		r.TL.Add(fmt.Sprintf("operator: %s (VM %s, %s)", cmd, p.VMName, p.Race))
		if err := r.H.Sim.DestroyVM(ctx, p.VMID, true); err != nil {
			errs = append(errs, err)
			continue
		}
		w.NoteDestroyed(p.VMID, time.Now())
	}
	for id := range cmds {
		if !isPlanned(planned, id) {
			r.TL.Add("capc-health-shim orphans names VM " + id + ", which the scenario did not orphan: left alone")
		}
	}
	err = WaitFor(ctx, 30*time.Second, 250*time.Millisecond, "the shim lists no orphan", func() (bool, error) {
		return w.Listed() == 0, nil
	})
	if err != nil {
		errs = append(errs, err)
	} else {
		r.TL.Add("the shim lists no orphan any more")
	}
	return errors.Join(errs...)
}

func isPlanned(planned []DeliberateOrphan, id string) bool {
	for _, p := range planned {
		if p.VMID == id {
			return true
		}
	}
	return false
}

// DuringFailed lists a row's notes from a scenario's During that failed or did not finish.
func DuringFailed(r Row) []string {
	var out []string
	for _, n := range r.Notes {
		if strings.HasPrefix(n, "during: ") {
			out = append(out, n)
		}
	}
	return out
}
