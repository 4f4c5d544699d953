package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/v1beta1"
	controlplanev1 "sigs.k8s.io/cluster-api/controlplane/kubeadm/api/v1beta1"
)

// Timeline is what happened in one scenario run, with times relative to its start.
type Timeline struct {
	Start time.Time
	Label string
	Out   io.Writer // when set, entries are printed as they happen

	mu      sync.Mutex
	entries []string
}

// Add records an entry now.
func (t *Timeline) Add(msg string) {
	line := fmt.Sprintf("%7.1fs  %s", time.Since(t.Start).Seconds(), msg)
	t.mu.Lock()
	t.entries = append(t.entries, line)
	t.mu.Unlock()
	if t.Out != nil {
		if t.Label != "" {
			fmt.Fprintf(t.Out, "[%s] %s\n", t.Label, line)
		} else {
			fmt.Fprintln(t.Out, line)
		}
	}
}

// Entries returns a copy of the entries.
func (t *Timeline) Entries() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.entries...)
}

// MachineRecord is what the recorder saw of one Machine.
type MachineRecord struct {
	Name         string
	ControlPlane bool
	Created      time.Time
	NodeRef      time.Time
	ShimFalse    time.Time
	ShimReason   string
	ShimMessage  string // the condition's message when the shim first said False
	// ShimFalseBy is the field manager owning the condition entry's status when the False was
	// first seen (managedFields of the status subresource); ShimFalseReasons every reason seen
	// while False; ConditionByAtMark the entry's owner when the MHC marked the Machine.
	ShimFalseBy       string
	ShimFalseReasons  []string
	ConditionByAtMark string
	Annotated         time.Time
	// AnnotatedBy is the field manager that owned the remediate annotation when it was first
	// seen (metadata.managedFields): the shim's is "capc-health-shim".
	AnnotatedBy  string
	MHCUnhealthy time.Time
	// MHCReason and MHCMessage are the MHC's HealthCheckSucceeded=False when it first marked
	// the Machine: why it acted (the shim's annotation or condition, or its own node-startup timer).
	MHCReason  string
	MHCMessage string
	Deleting   time.Time
	Gone       time.Time
	// Evidence: where the shim's condition was on the Machine (as the MHC's API version serves
	// it) when it first said False, and the MHC's own condition when it marked it unhealthy.
	Evidence string
	landed   string
	lastShim string
}

// Remediated reports whether the Machine was deleted because a MachineHealthCheck found it
// unhealthy (and not by a rollout, a scale-down or the cluster's deletion): the MHC's verdict
// came first. Both can be seen in the same poll, hence "not after".
func (m *MachineRecord) Remediated() bool {
	return !m.Deleting.IsZero() && !m.MHCUnhealthy.IsZero() && !m.MHCUnhealthy.After(m.Deleting)
}

// Recorder watches one namespace's Machines and writes their transitions to the timeline.
type Recorder struct {
	c              client.Client
	namespace      string
	conditionType  string
	machineVersion string // the Machine API version the MHC reads: v1beta1 or v1beta2
	tl             *Timeline

	mu          sync.Mutex
	machines    map[string]*MachineRecord
	snapshotErr error // the last step's failure to list Machines as the MHC reads them
	kcpInit     time.Time
	// steps counts the recorder's polls, failed those that could not read all they read (the
	// run's context still live), errs the first of their errors: a dropped step can hide a link
	// of a causal chain, so a row with one fails (scenarios' run, NegativeControlFailures).
	steps, failed int
	errs          []string
}

// maxRecorderErrors bounds the errors a recorder keeps for the row.
const maxRecorderErrors = 5

// NewRecorder records the Machines of namespace; conditionType is the shim's condition,
// machineVersion the Machine API version the stack's MHC reads.
func NewRecorder(c client.Client, namespace, conditionType, machineVersion string, tl *Timeline) *Recorder {
	return &Recorder{c: c, namespace: namespace, conditionType: conditionType, machineVersion: machineVersion, tl: tl, machines: map[string]*MachineRecord{}}
}

// Run records until ctx ends.
func (r *Recorder) Run(ctx context.Context) {
	Every(ctx, 200*time.Millisecond, func() {
		err := r.step(ctx)
		r.mu.Lock()
		defer r.mu.Unlock()
		if ctx.Err() != nil {
			return // the run ended mid-step: not a step
		}
		r.steps++
		if err != nil {
			r.failed++
			if len(r.errs) < maxRecorderErrors {
				r.errs = append(r.errs, fmt.Sprintf("%.1fs: %v", time.Since(r.tl.Start).Seconds(), err))
			}
		}
	})
}

// Health is how many steps the recorder took, how many failed, and the first errors.
func (r *Recorder) Health() (steps, failed int, errs []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.steps, r.failed, append([]string(nil), r.errs...)
}

func (r *Recorder) step(ctx context.Context) error {
	var list clusterv1.MachineList
	if err := r.c.List(ctx, &list, client.InNamespace(r.namespace)); err != nil {
		return fmt.Errorf("list Machines: %w", err)
	}
	// The same Machines as the MHC's API version serves them, read right after: the evidence
	// comes from this snapshot, not from a read after the fact — a Machine the MHC just marked
	// can be deleted and gone within one step (seen on CAPI v1.13: "read failed: not found").
	snapshot, snapshotErr := r.snapshot(ctx)
	var stepErr error
	if snapshotErr != nil {
		stepErr = fmt.Errorf("list Machines as %s: %w", r.machineVersion, snapshotErr)
	}
	now := time.Now()
	seen := map[string]bool{}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.snapshotErr = snapshotErr
	for i := range list.Items {
		m := &list.Items[i]
		seen[m.Name] = true
		rec := r.machines[m.Name]
		if rec == nil {
			rec = &MachineRecord{Name: m.Name, ControlPlane: IsControlPlane(m), Created: now}
			r.machines[m.Name] = rec
			role := "worker"
			if rec.ControlPlane {
				role = "control-plane"
			}
			r.tl.Add(fmt.Sprintf("Machine %s created (%s)", m.Name, role))
		}
		if m.Status.NodeRef != nil && rec.NodeRef.IsZero() {
			rec.NodeRef = now
			r.tl.Add(fmt.Sprintf("Machine %s has its Node (nodeRef %s)", m.Name, m.Status.NodeRef.Name))
		}
		if c := shimCondition(m, r.conditionType); c != nil {
			key := string(c.Status) + "/" + c.Reason
			if key != rec.lastShim {
				rec.lastShim = key
				r.tl.Add(fmt.Sprintf("shim verdict on %s: %s/%s — %s", m.Name, c.Status, c.Reason, c.Message))
				if c.Status == "False" && !slices.Contains(rec.ShimFalseReasons, c.Reason) {
					rec.ShimFalseReasons = append(rec.ShimFalseReasons, c.Reason)
				}
				if c.Status == "False" && rec.ShimFalse.IsZero() {
					rec.ShimFalse, rec.ShimReason, rec.ShimMessage = now, c.Reason, c.Message
					rec.ShimFalseBy = ConditionManager(m.ManagedFields, r.conditionType)
					r.tl.Add(fmt.Sprintf("%s=False on %s written by field manager %q", r.conditionType, m.Name, rec.ShimFalseBy))
					// Where the False landed, read now: by the time the MHC acts the owner may
					// already be deleting the Machine and the shim saying Unknown.
					rec.landed = r.evidence(snapshot, m, r.conditionType)
				}
			}
		}
		if _, ok := m.Annotations[clusterv1.RemediateMachineAnnotation]; ok && rec.Annotated.IsZero() {
			rec.Annotated = now
			rec.AnnotatedBy = annotationManager(m, clusterv1.RemediateMachineAnnotation)
			r.tl.Add(fmt.Sprintf("annotation %s set on %s (field manager %q)", clusterv1.RemediateMachineAnnotation, m.Name, rec.AnnotatedBy))
		}
		if reason, message, ok := mhcUnhealthy(m); ok && rec.MHCUnhealthy.IsZero() {
			rec.MHCUnhealthy, rec.MHCReason, rec.MHCMessage = now, reason, message
			rec.ConditionByAtMark = ConditionManager(m.ManagedFields, r.conditionType)
			r.tl.Add(fmt.Sprintf("MachineHealthCheck marks %s unhealthy (%s: %s)", m.Name, reason, message))
			if !rec.ShimFalse.IsZero() {
				rec.Evidence = "when the shim said False: " + rec.landed + "; when the MHC marked it: " +
					r.evidence(snapshot, m, string(clusterv1.MachineHealthCheckSucceededCondition))
				r.tl.Add(fmt.Sprintf("on %s as %s: %s", m.Name, r.machineVersion, rec.Evidence))
			}
		}
		if !m.DeletionTimestamp.IsZero() && rec.Deleting.IsZero() {
			rec.Deleting = now
			why := "rollout, scale-down or cluster deletion"
			if rec.Remediated() {
				why = "remediation"
			}
			r.tl.Add(fmt.Sprintf("Machine %s is being deleted by its owner (%s)", m.Name, why))
		}
	}
	for name, rec := range r.machines {
		if !seen[name] && rec.Gone.IsZero() {
			rec.Gone = now
			r.tl.Add(fmt.Sprintf("Machine %s is gone", name))
		}
	}
	if r.kcpInit.IsZero() {
		var kcps controlplanev1.KubeadmControlPlaneList
		if err := r.c.List(ctx, &kcps, client.InNamespace(r.namespace)); err != nil {
			stepErr = errors.Join(stepErr, fmt.Errorf("list KubeadmControlPlanes: %w", err))
		} else {
			for _, k := range kcps.Items {
				if k.Status.Initialized {
					r.kcpInit = now
					r.tl.Add(fmt.Sprintf("KubeadmControlPlane %s is initialized", k.Name))
				}
			}
		}
	}
	return stepErr
}

// Machines returns the records, oldest first.
func (r *Recorder) Machines() []MachineRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]MachineRecord, 0, len(r.machines))
	for _, m := range r.machines {
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out
}

// shimCondition is the shim's entry in the metav1 condition list CAPI v1.9 serves
// (status.v1beta2.conditions), nil when absent.
func shimCondition(m *clusterv1.Machine, conditionType string) *shimCond {
	if m.Status.V1Beta2 == nil {
		return nil
	}
	for _, c := range m.Status.V1Beta2.Conditions {
		if c.Type == conditionType {
			return &shimCond{Status: string(c.Status), Reason: c.Reason, Message: c.Message}
		}
	}
	return nil
}

type shimCond struct{ Status, Reason, Message string }

// mhcUnhealthy is the MHC's HealthCheckSucceeded=False on the Machine: CAPI v1.9 writes it in
// the v1beta1 conditions (and v1beta2 ones), v1.13 in v1beta2 status.conditions, which this
// module's v1beta1 type shows as status.v1beta2.conditions.
func mhcUnhealthy(m *clusterv1.Machine) (reason, message string, ok bool) {
	if m.Status.V1Beta2 != nil {
		for _, c := range m.Status.V1Beta2.Conditions {
			if c.Type == string(clusterv1.MachineHealthCheckSucceededCondition) && c.Status == metav1.ConditionFalse {
				return c.Reason, c.Message, true
			}
		}
	}
	for _, c := range m.Status.Conditions {
		if c.Type == clusterv1.MachineHealthCheckSucceededCondition && c.Status == corev1.ConditionFalse {
			return c.Reason, c.Message, true
		}
	}
	return "", "", false
}

// snapshot lists the namespace's Machines in the MHC's API version, by name (empty when the
// list fails: evidence then reads each Machine on its own).
func (r *Recorder) snapshot(ctx context.Context) (map[string]*unstructured.Unstructured, error) {
	list := &unstructured.UnstructuredList{}
	list.SetAPIVersion(clusterv1.GroupVersion.Group + "/" + r.machineVersion)
	list.SetKind("MachineList")
	out := map[string]*unstructured.Unstructured{}
	if err := r.c.List(ctx, list, client.InNamespace(r.namespace)); err != nil {
		return out, err
	}
	for i := range list.Items {
		out[list.Items[i].GetName()] = &list.Items[i]
	}
	return out, nil
}

// evidence says where a condition type is on the Machine and what it says, from what this
// step already read — never from a read after the fact, which can find the Machine gone (CAPI
// v1.13: "read failed: not found" when the owner deleted it within the step). The source is
// named: the Machine as the MHC's API version serves it (the step's snapshot), or, when that
// list no longer had it, the same step's typed list (v1beta1, whose status.v1beta2.conditions
// are the v1beta2 status.conditions).
func (r *Recorder) evidence(snapshot map[string]*unstructured.Unstructured, m *clusterv1.Machine, conditionType string) string {
	source := "read as " + r.machineVersion
	obj := map[string]any(nil)
	if u, ok := snapshot[m.Name]; ok {
		obj = u.Object
	} else {
		converted, err := runtime.DefaultUnstructuredConverter.ToUnstructured(m)
		if err != nil {
			return "unreadable: " + err.Error()
		}
		why := "the " + r.machineVersion + " list no longer had it"
		if r.snapshotErr != nil {
			why = "the " + r.machineVersion + " list failed: " + r.snapshotErr.Error()
		}
		obj, source = converted, "read as v1beta1 in the same step ("+why+")"
	}
	return conditionIn(obj, conditionType) + " [" + source + "]"
}

// conditionIn finds a condition type in every condition list of a Machine object.
func conditionIn(obj map[string]any, conditionType string) string {
	var parts []string
	for _, path := range conditionPaths {
		list, _, _ := unstructured.NestedSlice(obj, path...)
		for _, item := range list {
			c, _ := item.(map[string]any)
			typ, _ := c["type"].(string)
			if typ == conditionType {
				parts = append(parts, fmt.Sprintf("%s=%v/%v at %s (%v)", typ, c["status"], c["reason"], strings.Join(path, "."), c["message"]))
			}
		}
	}
	if len(parts) == 0 {
		return conditionType + " not found"
	}
	return strings.Join(parts, "; ")
}

// annotationManager is the field manager owning metadata.annotations[key] ("" if none does).
func annotationManager(m *clusterv1.Machine, key string) string {
	want := "f:" + key
	for _, f := range m.ManagedFields {
		if f.FieldsV1 == nil {
			continue
		}
		var fields map[string]any
		if json.Unmarshal(f.FieldsV1.Raw, &fields) != nil {
			continue
		}
		meta, _ := fields["f:metadata"].(map[string]any)
		annotations, _ := meta["f:annotations"].(map[string]any)
		if _, ok := annotations[want]; ok {
			return f.Manager
		}
	}
	return ""
}

// ConditionManager is the field manager (managers, sorted and comma-separated, when several)
// owning any value of the conditionType entry of a Machine's condition list — status, reason,
// message, lastTransitionTime, not just the key — from the managedFields of its status
// subresource: v1beta2 writers own status.conditions[type], v1beta1 writers (CAPI v1.9's layout)
// status.v1beta2.conditions[type]; "" if none does. Server-side apply shares a field among
// appliers of the same value, so a second writer shows here even when it kept the status.
func ConditionManager(managed []metav1.ManagedFieldsEntry, conditionType string) string {
	var owners []string
	for _, f := range managed {
		if f.Subresource != "status" || f.FieldsV1 == nil {
			continue
		}
		var fields map[string]any
		if json.Unmarshal(f.FieldsV1.Raw, &fields) != nil {
			continue
		}
		path := []string{"f:status", "f:v1beta2", "f:conditions"}
		if strings.HasSuffix(f.APIVersion, "/v1beta2") {
			path = []string{"f:status", "f:conditions"}
		}
		list := fields
		for _, p := range path {
			list, _ = list[p].(map[string]any)
		}
		for key, v := range list {
			raw, ok := strings.CutPrefix(key, "k:")
			if !ok {
				continue
			}
			var k map[string]any
			if json.Unmarshal([]byte(raw), &k) != nil || k["type"] != conditionType {
				continue
			}
			entry, _ := v.(map[string]any)
			for field := range entry {
				if field != "." && field != "f:type" && !slices.Contains(owners, f.Manager) {
					owners = append(owners, f.Manager)
				}
			}
		}
	}
	sort.Strings(owners)
	return strings.Join(owners, ",")
}

// conditionPaths are the condition lists a Machine can carry across CAPI versions.
var conditionPaths = [][]string{
	{"status", "conditions"},
	{"status", "v1beta2", "conditions"},
	{"status", "deprecated", "v1beta1", "conditions"},
}
