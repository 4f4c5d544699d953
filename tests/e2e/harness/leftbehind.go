package harness

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1b3 "sigs.k8s.io/cluster-api-provider-cloudstack/api/v1beta3"
	clusterv1 "sigs.k8s.io/cluster-api/api/v1beta1"
)

// RaceClusterLeftBehind is the third case of scenario 8 (issue 29): the workload Cluster deleted
// while one worker's VM cannot be destroyed.
const RaceClusterLeftBehind = "cluster-left-behind"

// DestroyFailsFault is the simulator's fault that makes every destroyVirtualMachine of a VM
// fail until cleared.
const DestroyFailsFault = "destroy-fails"

// RemnantsCommandLog is where the run saves `capc-health-shim orphans` as printed while the
// Cluster was stuck deleting.
func RemnantsCommandLog(outDir, ns string) string {
	return filepath.Join(outDir, "logs", "shim-"+ns+"-remnants.txt")
}

// clusterLeftBehind, the seed's case, last in scenario 8: a running worker's VM gets the
// destroy-fails fault, then the workload Cluster is deleted as `kubectl delete cluster` does
// (background propagation). CAPC's destroy keeps failing, so that CloudStackMachine, its Machine
// and the Cluster (and whatever CAPI keeps while they wait: the harness reads it from the API
// server, RemnantWatch) stay deleting. The shim must name every object the API server shows
// stuck deleting or dangling past --remnant-grace, with the right reason, within the grace plus
// two polls, with a Warning ObjectLeftBehind Event each and in `capc-health-shim orphans`; none
// other (scored at the end of the run). Then the fault is cleared: CAPC's next destroy succeeds,
// the Cluster finishes deleting and the report must empty.
func clusterLeftBehind(ctx context.Context, r *RunContext) error {
	w := r.Remnants
	if w == nil {
		return errors.New("the remnant case needs the shim's remnant report")
	}
	c, sim := r.H.Mgmt.Direct, r.H.Sim

	// A running worker whose CloudStackMachine carries CAPC's finalizer and its VM id.
	var csm infrav1b3.CloudStackMachine
	var vmID string
	err := WaitFor(ctx, 2*time.Minute, time.Second, "a running worker whose CloudStackMachine has its VM id and CAPC's finalizer", func() (bool, error) {
		workers, err := workerMachines(ctx, c, r.Namespace)
		if err != nil {
			return false, err
		}
		for name := range workers {
			var m infrav1b3.CloudStackMachine
			if err := c.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: name}, &m); err != nil {
				continue
			}
			if m.Spec.InstanceID == nil || *m.Spec.InstanceID == "" || len(m.Finalizers) == 0 || !m.DeletionTimestamp.IsZero() {
				continue
			}
			vm, err := sim.VM(ctx, *m.Spec.InstanceID)
			if err != nil || vm.State != "Running" || vm.Gone() {
				continue
			}
			csm, vmID = m, vm.ID
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		return err
	}
	if err := sim.InjectFault(ctx, vmID, DestroyFailsFault); err != nil {
		return fmt.Errorf("fault %s on VM %s: %w", DestroyFailsFault, vmID, err)
	}
	r.TL.Add(fmt.Sprintf("%s: VM %s of CloudStackMachine %s (finalizers %v) gets fault %s: every destroyVirtualMachine fails", RaceClusterLeftBehind, vmID, csm.Name, csm.Finalizers, DestroyFailsFault))

	deletedAt := time.Now()
	bg := metav1.DeletePropagationBackground
	if err := c.Delete(ctx, &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: r.Namespace, Name: r.Cluster}}, &client.DeleteOptions{PropagationPolicy: &bg}); err != nil {
		return fmt.Errorf("deleting Cluster %s: %w", r.clusterKey(), err)
	}
	r.TL.Add(fmt.Sprintf("%s: operator: kubectl delete cluster -n %s %s", RaceClusterLeftBehind, r.Namespace, r.Cluster))

	// The objects that must stay: the faulty CloudStackMachine, its Machine, the Cluster.
	var machine string
	for _, o := range csm.OwnerReferences {
		if o.Kind == "Machine" {
			machine = o.Name
		}
	}
	must := []string{
		remnantKey("CloudStackMachine", r.Namespace, csm.Name),
		remnantKey("Cluster", r.Namespace, r.Cluster),
	}
	if machine != "" {
		must = append(must, remnantKey("Machine", r.Namespace, machine))
	}

	// Wait until every object the API server shows a remnant in the run's namespace is past its
	// grace and reported (or too late to be in time), none pending, and the three above are among
	// them. Nothing is asserted here on the report's accuracy: the row's score is.
	grace, bound := r.Shim.Config.RemnantGrace(), w.Bound()
	r.TL.Add(fmt.Sprintf("%s: waiting for the remnants: grace %.0fs, each due within %.1fs after its grace", RaceClusterLeftBehind, grace.Seconds(), bound.Seconds()))
	var last string
	err = WaitFor(ctx, grace+bound+3*time.Minute, time.Second, "every remnant past its grace reported, none pending", func() (bool, error) {
		st := w.Progress(r.Namespace)
		last = st.String()
		for _, k := range must {
			if !st.expected[k+"|"+RemnantStuckDeleting] {
				return false, nil
			}
		}
		return st.pending == 0 && st.unreported == 0, nil
	})
	var errs []error
	if err != nil {
		errs = append(errs, fmt.Errorf("%w (last: %s; must be stuck deleting: %v)", err, last, must))
	}
	sc := w.Score()
	for _, rec := range sc.Records {
		if !rec.Expected {
			continue
		}
		after := "never"
		if rec.SecondsAfterDue != nil {
			after = fmt.Sprintf("%.1fs after its grace", *rec.SecondsAfterDue)
		}
		r.TL.Add(fmt.Sprintf("%s: remnant %s (%s) due %s, reported %s (in time %v)", RaceClusterLeftBehind, rec.Key, rec.Reason, rec.Due, after, rec.InTime))
	}
	// The CloudStackMachine's why names its VM as CloudStack lists it and, from the account's
	// destroy jobs (listAsyncJobs, read once the remnant is reported), why CAPC's destroy keeps
	// failing: the error the simulator's destroy-fails fault gives each job.
	const destroyError = "its last destroy failed: Failed to destroy Instance"
	var why string
	if err := WaitFor(ctx, time.Minute, time.Second, "the CloudStackMachine's why names its VM and its failed destroy", func() (bool, error) {
		for _, x := range w.current(r.Namespace) {
			if x.Kind == "CloudStackMachine" && x.Name == csm.Name {
				why = x.Why
				return strings.Contains(x.Why, "CloudStack shows VM "+vmID) && strings.Contains(x.Why, destroyError), nil
			}
		}
		return false, nil
	}); err != nil {
		errs = append(errs, fmt.Errorf("remnant CloudStackMachine %s: why %q does not say what CloudStack shows of VM %s and %q: %w", csm.Name, why, vmID, destroyError, err))
	} else {
		r.TL.Add(fmt.Sprintf("%s: the shim says of CloudStackMachine %s: %s", RaceClusterLeftBehind, csm.Name, why))
	}

	// One Warning ObjectLeftBehind Event per remnant reported (on the Cluster, else the object).
	var want []RemnantRecord
	for _, rec := range sc.Records {
		if rec.Expected && rec.ReportedAt != "" {
			want = append(want, rec)
		}
	}
	if len(want) > 0 {
		found := map[string]bool{}
		err := WaitFor(ctx, 15*time.Second, 500*time.Millisecond, RemnantEventReason+" Events", func() (bool, error) {
			var events corev1.EventList
			if err := c.List(ctx, &events, client.InNamespace(r.Namespace)); err != nil {
				return false, err
			}
			for _, rec := range want {
				if msg, ok := RemnantEventFor(events.Items, rec.Key, rec.Reason); ok && !found[rec.Key] {
					found[rec.Key] = true
					r.TL.Add(fmt.Sprintf("Event Warning %s: %s", RemnantEventReason, msg))
				}
			}
			return len(found) == len(want), nil
		})
		if err != nil {
			var missing []string
			for _, rec := range want {
				if !found[rec.Key] {
					missing = append(missing, rec.Key)
				}
			}
			errs = append(errs, fmt.Errorf("%w: none for %v", err, missing))
		}
	}

	// The operator's view: `capc-health-shim orphans --url …` names each remnant.
	out, err := r.Shim.OrphansCommand(ctx)
	_ = os.WriteFile(RemnantsCommandLog(r.H.OutDir, r.Namespace), []byte(out), 0o644)
	if err != nil {
		errs = append(errs, err)
	}
	for _, rec := range want {
		if !RemnantInCommandOutput(out, rec.Key) {
			errs = append(errs, fmt.Errorf("capc-health-shim orphans does not name remnant %s (%s)", rec.Key, RemnantsCommandLog(r.H.OutDir, r.Namespace)))
		}
	}

	// The fault cleared: CAPC's next destroy succeeds, the Cluster goes, the report empties.
	if err := sim.ClearFaults(ctx, vmID); err != nil {
		return errors.Join(append(errs, fmt.Errorf("clearing the faults of VM %s: %w", vmID, err))...)
	}
	cleared := time.Now()
	r.TL.Add(fmt.Sprintf("%s: fault cleared on VM %s (%.1fs after the Cluster was deleted)", RaceClusterLeftBehind, vmID, cleared.Sub(deletedAt).Seconds()))
	var clusterGoneAt time.Time
	err = WaitFor(ctx, 6*time.Minute, 500*time.Millisecond, "the Cluster deleted and the remnant report empty", func() (bool, error) {
		if clusterGoneAt.IsZero() {
			err := c.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: r.Cluster}, &clusterv1.Cluster{})
			if apierrors.IsNotFound(err) {
				clusterGoneAt = time.Now()
				r.TL.Add(fmt.Sprintf("%s: Cluster %s deleted %.1fs after the fault was cleared", RaceClusterLeftBehind, r.clusterKey(), clusterGoneAt.Sub(cleared).Seconds()))
			}
		}
		_, present := w.Listed()
		return !clusterGoneAt.IsZero() && present && len(w.current(r.Namespace)) == 0, nil
	})
	if err != nil {
		var keys []string
		for _, x := range w.current(r.Namespace) {
			keys = append(keys, x.Key()+" ("+x.Reason+")")
		}
		errs = append(errs, fmt.Errorf("%w (still listed: %v)", err, keys))
	} else {
		d := time.Since(cleared).Seconds()
		r.RemnantsClearedSeconds = &d
		r.TL.Add(fmt.Sprintf("%s: the remnant report is empty %.1fs after the fault was cleared", RaceClusterLeftBehind, d))
	}
	return errors.Join(errs...)
}
