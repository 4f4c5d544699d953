package harness

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The remnant report (docs/orphans.md "Remnants on the management side"), judged from the API
// server independently of the shim: which objects of the 13 kinds are stuck deleting or
// dangling, and whether the shim's /status "remnants" named exactly those, with the right
// reason, within the grace plus two polls.

// RemnantKinds are the 13 kinds the shim's remnant report watches.
var RemnantKinds = []schema.GroupVersionKind{
	{Group: "cluster.x-k8s.io", Version: "v1beta1", Kind: "Cluster"},
	{Group: "cluster.x-k8s.io", Version: "v1beta1", Kind: "Machine"},
	{Group: "cluster.x-k8s.io", Version: "v1beta1", Kind: "MachineSet"},
	{Group: "cluster.x-k8s.io", Version: "v1beta1", Kind: "MachineDeployment"},
	{Group: "cluster.x-k8s.io", Version: "v1beta1", Kind: "MachineHealthCheck"},
	{Group: "bootstrap.cluster.x-k8s.io", Version: "v1beta1", Kind: "KubeadmConfig"},
	{Group: "controlplane.cluster.x-k8s.io", Version: "v1beta1", Kind: "KubeadmControlPlane"},
	{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta3", Kind: "CloudStackCluster"},
	{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta3", Kind: "CloudStackMachine"},
	{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta3", Kind: "CloudStackMachineTemplate"},
	{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta3", Kind: "CloudStackFailureDomain"},
	{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta3", Kind: "CloudStackAffinityGroup"},
	{Group: "infrastructure.cluster.x-k8s.io", Version: "v1beta3", Kind: "CloudStackIsolatedNetwork"},
}

// The reasons of the remnant report.
const (
	RemnantStuckDeleting = "stuck-deleting"
	RemnantOwnerGone     = "owner-gone"
	RemnantClusterGone   = "cluster-gone"
	// RemnantEventReason is the reason of the shim's Warning Event per remnant.
	RemnantEventReason = "ObjectLeftBehind"
)

// Annotations and labels the report's rules read (CAPI v1.9.6 api/v1beta1/common_types.go).
const (
	clusterNameLabel    = "cluster.x-k8s.io/cluster-name"
	pausedAnnotation    = "cluster.x-k8s.io/paused"
	deleteForMoveAnnot  = "clusterctl.cluster.x-k8s.io/delete-for-move"
	remnantWatchSlack   = time.Second
	remnantsPollsToSeeA = 2
)

// ShimRemnant is one entry of the shim's /status "remnants".
type ShimRemnant struct {
	Group              string     `json:"group"`
	Kind               string     `json:"kind"`
	Namespace          string     `json:"namespace"`
	Name               string     `json:"name"`
	Cluster            *string    `json:"cluster"`
	Since              *time.Time `json:"since"`
	Reason             string     `json:"reason"`
	Why                string     `json:"why"`
	BlockingFinalizers []string   `json:"blocking_finalizers"`
	RelatedVM          *string    `json:"related_vm"`
}

// Key names the object: "Kind namespace/name".
func (r ShimRemnant) Key() string { return r.Kind + " " + r.Namespace + "/" + r.Name }

// RemnantCandidate is an object the report's rules make a remnant once its grace has passed.
type RemnantCandidate struct {
	Key    string // "Kind namespace/name"
	Reason string
	// Since: the deletionTimestamp of a stuck-deleting object (zero for a dangling one: the
	// watch counts from when it first saw it so).
	Since      time.Time
	Finalizers []string
}

func remnantKey(kind, ns, name string) string { return kind + " " + ns + "/" + name }

// RemnantCandidates lists, in every namespace, the objects of RemnantKinds that are stuck
// deleting (deletionTimestamp, finalizers) or dangling (controller owner of a watched kind gone;
// cluster-name label naming no Cluster), whatever their age. Objects being moved and objects
// of paused Clusters are left out, as docs/orphans.md says.
func RemnantCandidates(ctx context.Context, c client.Client) ([]RemnantCandidate, error) {
	var all []unstructured.Unstructured
	for _, gvk := range RemnantKinds {
		l := &unstructured.UnstructuredList{}
		l.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
		if err := c.List(ctx, l); err != nil {
			if apimeta.IsNoMatchError(err) {
				continue
			}
			return nil, fmt.Errorf("listing %s: %w", gvk.Kind, err)
		}
		all = append(all, l.Items...)
	}
	watched := map[string]bool{}
	for _, gvk := range RemnantKinds {
		watched[gvk.Kind] = true
	}
	uids := map[string]bool{}
	clusters := map[string]bool{}       // ns/name
	pausedClusters := map[string]bool{} // ns/name
	for i := range all {
		o := &all[i]
		uids[string(o.GetUID())] = true
		if o.GetKind() == "Cluster" {
			clusters[o.GetNamespace()+"/"+o.GetName()] = true
			if p, _, _ := unstructured.NestedBool(o.Object, "spec", "paused"); p {
				pausedClusters[o.GetNamespace()+"/"+o.GetName()] = true
			}
			if _, ok := o.GetAnnotations()[pausedAnnotation]; ok {
				pausedClusters[o.GetNamespace()+"/"+o.GetName()] = true
			}
		}
	}
	var out []RemnantCandidate
	for i := range all {
		o := &all[i]
		ann := o.GetAnnotations()
		if _, moving := ann[deleteForMoveAnnot]; moving {
			continue
		}
		key := remnantKey(o.GetKind(), o.GetNamespace(), o.GetName())
		if dt := o.GetDeletionTimestamp(); dt != nil {
			if len(o.GetFinalizers()) > 0 {
				out = append(out, RemnantCandidate{Key: key, Reason: RemnantStuckDeleting, Since: dt.Time, Finalizers: o.GetFinalizers()})
			}
			continue
		}
		clusterName := o.GetLabels()[clusterNameLabel]
		if o.GetKind() == "Cluster" {
			clusterName = o.GetName()
		}
		if _, p := ann[pausedAnnotation]; p || pausedClusters[o.GetNamespace()+"/"+clusterName] {
			continue
		}
		for _, r := range o.GetOwnerReferences() {
			if r.Controller != nil && *r.Controller && watched[r.Kind] && !uids[string(r.UID)] {
				out = append(out, RemnantCandidate{Key: key, Reason: RemnantOwnerGone})
			}
		}
		if o.GetKind() != "Cluster" && clusterName != "" && !clusters[o.GetNamespace()+"/"+clusterName] {
			out = append(out, RemnantCandidate{Key: key, Reason: RemnantClusterGone})
		}
	}
	return out, nil
}

// remnantCand is what the watch knows of one candidate (key and reason).
type remnantCand struct {
	c         RemnantCandidate
	firstSeen time.Time
	lastSeen  time.Time
	// due: when the grace has passed (deletionTimestamp or first sighting, plus the grace).
	due time.Time
	// expected: still a candidate at a read at or after due.
	expected bool
}

// remnantSighting is what the watch saw the shim list for one key and reason.
type remnantSighting struct {
	first   ShimRemnant
	firstAt time.Time
	listed  bool
}

// RemnantWatch reads the shim's /status "remnants" and the API server every interval for a
// run: what the shim listed and what the rules make a remnant.
type RemnantWatch struct {
	shim     *Shim
	c        client.Client
	tl       *Timeline
	ns       string
	grace    time.Duration
	poll     time.Duration
	interval time.Duration
	cancel   context.CancelFunc
	done     chan struct{}

	mu        sync.Mutex
	stopped   bool
	reads     int
	absent    bool
	listed    []ShimRemnant
	sightings map[string]*remnantSighting // key|reason
	sOrder    []string
	cands     map[string]*remnantCand // key|reason
	cOrder    []string
	errs      int
	lastRead  time.Time
}

// WatchRemnants starts reading every interval until Stop. ns is the run's namespace: the
// remnants expected of the run are those in it; a report anywhere is judged.
func WatchRemnants(ctx context.Context, s *Shim, c client.Client, ns string, tl *Timeline, interval time.Duration) *RemnantWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := newRemnantWatch(s, c, ns, tl, interval)
	w.cancel = cancel
	go func() {
		defer close(w.done)
		Every(ctx, interval, func() { w.read(ctx) })
	}()
	return w
}

func newRemnantWatch(s *Shim, c client.Client, ns string, tl *Timeline, interval time.Duration) *RemnantWatch {
	w := &RemnantWatch{shim: s, c: c, ns: ns, tl: tl, interval: interval, done: make(chan struct{}),
		sightings: map[string]*remnantSighting{}, cands: map[string]*remnantCand{}}
	if s != nil {
		w.grace, w.poll = s.Config.RemnantGrace(), s.Config.PollInterval()
	}
	return w
}

// Stop ends the polling after one last read.
func (w *RemnantWatch) Stop(ctx context.Context) {
	w.cancel()
	<-w.done
	w.read(ctx)
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
}

func (w *RemnantWatch) read(ctx context.Context) {
	// The API server first: a candidate is always seen before (or with) the report of it.
	cands, err := RemnantCandidates(ctx, w.c)
	if err != nil {
		w.mu.Lock()
		w.errs++
		w.mu.Unlock()
		return
	}
	list, present, err := w.shim.Remnants(ctx)
	if err != nil {
		return
	}
	w.observe(time.Now(), cands, list, present)
}

func (w *RemnantWatch) observe(now time.Time, cands []RemnantCandidate, list []ShimRemnant, present bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	w.reads++
	w.lastRead = now
	for _, c := range cands {
		id := c.Key + "|" + c.Reason
		s := w.cands[id]
		if s == nil {
			s = &remnantCand{c: c, firstSeen: now}
			if c.Reason == RemnantStuckDeleting {
				s.due = c.Since.Add(w.grace)
			} else {
				s.due = now.Add(w.grace)
			}
			w.cands[id] = s
			w.cOrder = append(w.cOrder, id)
		}
		s.lastSeen = now
		if !now.Before(s.due) && !s.expected {
			s.expected = true
			w.add(fmt.Sprintf("API server: %s is a remnant (%s) since %s", c.Key, c.Reason, s.due.Format(time.RFC3339)))
		}
	}
	if !present {
		if !w.absent {
			w.add("shim /status has no \"remnants\" array")
		}
		w.absent = true
		return
	}
	w.absent = false
	w.listed = list
	seen := map[string]bool{}
	for _, r := range list {
		id := r.Key() + "|" + r.Reason
		seen[id] = true
		s := w.sightings[id]
		if s == nil {
			s = &remnantSighting{first: r, firstAt: now}
			w.sightings[id] = s
			w.sOrder = append(w.sOrder, id)
			w.add(fmt.Sprintf("shim REPORTS remnant %s (%s): %s", r.Key(), r.Reason, r.Why))
		} else if !s.listed {
			w.add(fmt.Sprintf("shim lists remnant %s (%s) again", r.Key(), r.Reason))
		}
		s.listed = true
	}
	for _, id := range w.sOrder {
		if s := w.sightings[id]; s.listed && !seen[id] {
			s.listed = false
			w.add(fmt.Sprintf("shim no longer lists remnant %s (%s)", s.first.Key(), s.first.Reason))
		}
	}
}

func (w *RemnantWatch) add(msg string) {
	if w.tl != nil {
		w.tl.Add(msg)
	}
}

// Listed is what the latest read of /status listed, and whether /status had the array at all.
func (w *RemnantWatch) Listed() ([]ShimRemnant, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]ShimRemnant(nil), w.listed...), !w.absent && w.reads > 0
}

// current is what the latest read of /status listed in namespace ns.
func (w *RemnantWatch) current(ns string) []ShimRemnant {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []ShimRemnant
	for _, x := range w.listed {
		if x.Namespace == ns {
			out = append(out, x)
		}
	}
	return out
}

// remnantProgress is where the report of namespace ns stands at the latest read.
type remnantProgress struct {
	expected   map[string]bool // key|reason of the candidates past their grace
	pending    int             // candidates present now, still within their grace
	unreported int             // expected, not reported yet, still within the bound
	reported   int
}

func (p remnantProgress) String() string {
	return fmt.Sprintf("%d expected, %d reported, %d not yet reported, %d within their grace", len(p.expected), p.reported, p.unreported, p.pending)
}

// Progress says where the remnant report of namespace ns stands at the latest read.
func (w *RemnantWatch) Progress(ns string) remnantProgress {
	w.mu.Lock()
	defer w.mu.Unlock()
	p := remnantProgress{expected: map[string]bool{}}
	bound := w.Bound()
	for _, id := range w.cOrder {
		c := w.cands[id]
		if !inNamespace(c.c.Key, ns) {
			continue
		}
		switch {
		case c.expected:
			p.expected[id] = true
			if w.sightings[id] != nil {
				p.reported++
			} else if !w.lastRead.After(c.due.Add(bound)) {
				p.unreported++
			}
		case c.lastSeen.Equal(w.lastRead):
			p.pending++
		}
	}
	return p
}

func inNamespace(key, ns string) bool {
	_, rest, _ := strings.Cut(key, " ")
	return strings.HasPrefix(rest, ns+"/")
}

// Absent: the latest read of /status had no "remnants" array.
func (w *RemnantWatch) Absent() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.absent
}

// RemnantRecord is one expected or reported remnant of a run, in its row.
type RemnantRecord struct {
	Key    string `json:"key"`
	Reason string `json:"reason"`
	// Expected: the API server showed it a remnant past its grace (in the run's namespace).
	Expected bool `json:"expected"`
	// Due: when its grace ended (RFC 3339); ReportedAt: when the watch first saw the shim list it.
	Due        string `json:"due,omitempty"`
	ReportedAt string `json:"reported_at,omitempty"`
	// SecondsAfterDue: how long after its grace the shim was seen reporting it.
	SecondsAfterDue *float64 `json:"seconds_after_due,omitempty"`
	// InTime: reported with this reason within the grace plus two polls.
	InTime bool `json:"in_time"`
	// False: reported without the API server showing it so, or before its grace ended.
	False bool   `json:"false"`
	Why   string `json:"why,omitempty"`
}

// RemnantScore is the row's view of a run's remnant report.
type RemnantScore struct {
	Expected, Reported, False int
	Records                   []RemnantRecord
}

// Bound is the latest a remnant may be reported after its grace: two polls (with their 10 %
// jitter), plus the watch's own read interval and a second of slack.
func (w *RemnantWatch) Bound() time.Duration {
	return time.Duration(float64(remnantsPollsToSeeA*w.poll)*(1+ShimPollJitter)) + w.interval + remnantWatchSlack
}

// Score compares what the shim reported with what the API server showed.
func (w *RemnantWatch) Score() RemnantScore {
	w.mu.Lock()
	defer w.mu.Unlock()
	return scoreRemnants(w.cands, w.cOrder, w.sightings, w.sOrder, w.ns, w.Bound())
}

func scoreRemnants(cands map[string]*remnantCand, cOrder []string, sightings map[string]*remnantSighting, sOrder []string, ns string, bound time.Duration) RemnantScore {
	var sc RemnantScore
	inNS := func(key string) bool { return inNamespace(key, ns) }
	for _, id := range cOrder {
		c := cands[id]
		if !c.expected || !inNS(c.c.Key) {
			continue
		}
		sc.Expected++
		rec := RemnantRecord{Key: c.c.Key, Reason: c.c.Reason, Expected: true, Due: c.due.UTC().Format(time.RFC3339)}
		if s := sightings[id]; s != nil {
			d := s.firstAt.Sub(c.due).Seconds()
			rec.ReportedAt, rec.SecondsAfterDue, rec.Why = s.firstAt.UTC().Format(time.RFC3339), &d, s.first.Why
			// In time: not after the bound, and not before the grace ended (that is false).
			early := c.c.Reason == RemnantStuckDeleting && s.firstAt.Add(remnantWatchSlack).Before(c.due)
			rec.InTime = !s.firstAt.After(c.due.Add(bound)) && !early
			if rec.InTime {
				sc.Reported++
			}
		}
		sc.Records = append(sc.Records, rec)
	}
	for _, id := range sOrder {
		s := sightings[id]
		c := cands[id]
		rec := RemnantRecord{Key: s.first.Key(), Reason: s.first.Reason, ReportedAt: s.firstAt.UTC().Format(time.RFC3339), Why: s.first.Why}
		switch {
		case c == nil:
			rec.False = true
		case c.c.Reason == RemnantStuckDeleting && s.firstAt.Add(remnantWatchSlack).Before(c.due):
			// Reported before its grace ended.
			rec.False = true
		default:
			continue
		}
		sc.False++
		sc.Records = append(sc.Records, rec)
	}
	sort.SliceStable(sc.Records, func(i, j int) bool { return sc.Records[i].Key < sc.Records[j].Key })
	return sc
}

// RemnantEventFor finds the shim's Warning ObjectLeftBehind Event of one remnant: its message
// starts with "Kind ns/name is left behind (reason)" (a prefix, so that Machine m does not match
// CloudStackMachine m).
func RemnantEventFor(events []corev1.Event, key, reason string) (string, bool) {
	want := fmt.Sprintf("%s is left behind (%s)", key, reason)
	for _, e := range events {
		if e.Reason == RemnantEventReason && e.Type == corev1.EventTypeWarning && strings.HasPrefix(e.Message, want) {
			return e.Message, true
		}
	}
	return "", false
}

// RemnantInCommandOutput: `capc-health-shim orphans` printed the remnant's header line.
func RemnantInCommandOutput(out, key string) bool {
	return strings.Contains(out, "\n# "+key+": ")
}

// RemnantSummary is one line per record, for failure messages.
func RemnantSummary(recs []RemnantRecord) []string {
	var out []string
	for _, r := range recs {
		s := fmt.Sprintf("%s (%s) expected=%v in_time=%v false=%v", r.Key, r.Reason, r.Expected, r.InTime, r.False)
		if r.SecondsAfterDue != nil {
			s += fmt.Sprintf(" +%.1fs", *r.SecondsAfterDue)
		}
		out = append(out, s)
	}
	return out
}
