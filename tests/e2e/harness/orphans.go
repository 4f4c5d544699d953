package harness

import (
	"context"
	"fmt"
	"regexp"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The shim's orphan report (issue 17): a CloudStack VM that CAPI lost — the VM of a
// CloudStackMachine that is gone, or one named after a CloudStackMachine that is gone or records
// another VM — is listed in /status "orphans" and reported, after --orphan-grace, with one
// Warning Event on its Cluster. The shim never deletes it.
const (
	OrphanInstanceOfDeleted = "instance-of-deleted"
	OrphanNameOfDeleted     = "name-of-deleted"
	OrphanNameTaken         = "name-taken"
	// OrphanEventReason is the reason of the Warning Event on the Cluster, one per orphan.
	OrphanEventReason = "CloudStackVMOrphaned"
	// NoteNoOrphanReport is the row note of a shim whose /status has no "orphans" array.
	NoteNoOrphanReport = `orphan report: the shim's /status has no "orphans" array`
)

// ShimOrphan is one entry of the shim's /status "orphans" array.
type ShimOrphan struct {
	VMID              string  `json:"vm_id"`
	VMName            string  `json:"vm_name"`
	VMState           string  `json:"vm_state"`
	Scope             string  `json:"scope"`
	Cluster           *string `json:"cluster"`
	CloudStackMachine string  `json:"cloudstack_machine"`
	Kind              string  `json:"kind"`
	// Since: when the shim first saw the VM owned by nothing.
	Since *time.Time `json:"since"`
	// ReportedAt: when it was reported (the grace after Since at the earliest); nil while the
	// VM is only a suspect, should the shim list suspects.
	ReportedAt *time.Time `json:"reported_at"`
	Why        string     `json:"why"`
}

// Reported says whether the shim reports the VM (and does not merely suspect it).
func (o ShimOrphan) Reported() bool { return o.ReportedAt != nil }

func (o ShimOrphan) cluster() string {
	if o.Cluster == nil {
		return "—"
	}
	return *o.Cluster
}

// DeliberateOrphan is a VM a scenario orphaned on purpose, and how.
type DeliberateOrphan struct {
	VMID, VMName string
	// Kind is what the shim must call it (OrphanNameOfDeleted, OrphanInstanceOfDeleted, …).
	Kind string
	// Race says what the scenario did (e.g. "deploy-in-flight", "finalizer-removed").
	Race string
	// CloudStackMachine ("namespace/name") is the one that is gone.
	CloudStackMachine string
	// GoneAt is when the harness first saw that CloudStackMachine gone (its own clock).
	GoneAt time.Time
}

// OrphanRecord is one VM of the row's orphan_reports: deliberately orphaned by the scenario,
// or listed by the shim (reported or suspected) without being so — a false orphan.
type OrphanRecord struct {
	VMID   string `json:"vm_id"`
	VMName string `json:"vm_name"`
	// Race is how the scenario orphaned it; empty when it did not (a false orphan).
	Race         string `json:"race,omitempty"`
	ExpectedKind string `json:"expected_kind,omitempty"`
	// ExpectedCloudStackMachine is the CloudStackMachine ("namespace/name") the race removed.
	ExpectedCloudStackMachine string `json:"expected_cloudstack_machine,omitempty"`
	// What the shim said: kind, CloudStackMachine and cluster, why, since and reported_at
	// (RFC 3339), as /status listed it when first seen reported (else when first listed).
	Kind              string `json:"kind,omitempty"`
	CloudStackMachine string `json:"cloudstack_machine,omitempty"`
	Cluster           string `json:"cluster,omitempty"`
	Why               string `json:"why,omitempty"`
	Since             string `json:"since,omitempty"`
	ReportedAt        string `json:"reported_at,omitempty"`
	Reported          bool   `json:"reported"`
	// SecondsToReport: the shim's reported_at − when the harness saw the CloudStackMachine gone.
	SecondsToReport *float64 `json:"seconds_to_orphan_report,omitempty"`
	// SecondsToReportSeen: the harness's clock, CloudStackMachine gone → first /status read
	// listing the VM as reported (read every 250 ms).
	SecondsToReportSeen *float64 `json:"seconds_to_orphan_report_seen,omitempty"`
	// SecondsGraceApplied: reported_at − since (the grace as the shim applied it).
	SecondsGraceApplied *float64 `json:"seconds_since_to_reported_at,omitempty"`
	// Event is the message of its Warning CloudStackVMOrphaned Event on the Cluster.
	Event string `json:"event,omitempty"`
	// Command is the line `capc-health-shim orphans` printed for it.
	Command string `json:"cli_command,omitempty"`
	// SecondsToClear: the VM destroyed (as the operator did) → the shim no longer lists it.
	SecondsToClear *float64 `json:"seconds_destroyed_to_cleared,omitempty"`
}

// orphanSighting is what the watch saw of one VM id in the shim's list.
type orphanSighting struct {
	first          ShimOrphan // as first listed
	reported       ShimOrphan // as first listed with reported_at
	listedAt       time.Time  // harness clock: first listed
	reportedSeenAt time.Time  // harness clock: first listed as reported (zero: never)
	unlistedAt     time.Time  // harness clock: left the list (zero while listed)
	listed         bool
}

type deliberateState struct {
	DeliberateOrphan
	event       string
	command     string
	destroyedAt time.Time
}

// OrphanWatch reads the shim's /status "orphans" every interval for a run, writes what changes
// to the timeline and keeps every VM id it saw listed; Stop freezes it (before teardown).
type OrphanWatch struct {
	shim     *Shim
	tl       *Timeline
	interval time.Duration
	cancel   context.CancelFunc
	done     chan struct{}

	mu          sync.Mutex
	stopped     bool
	reads       int  // successful /status reads
	absent      bool // the latest successful read had no "orphans" array
	suspects    int  // orphan_detection.suspects at the latest read (-1: not shown)
	maxSuspects int  // the most seen at once (-1: never shown)
	sightings   map[string]*orphanSighting
	order       []string
	deliberate  []*deliberateState
}

// WatchOrphans starts reading the shim's orphan list every interval until Stop.
func WatchOrphans(ctx context.Context, s *Shim, tl *Timeline, interval time.Duration) *OrphanWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := newOrphanWatch(s, tl, interval)
	w.cancel = cancel
	go func() {
		defer close(w.done)
		Every(ctx, interval, func() { w.read(ctx) })
	}()
	return w
}

// Stop ends the polling after one last read: what the row reports is what the shim listed up
// to now (teardown's own transients are not the run's).
func (w *OrphanWatch) Stop(ctx context.Context) {
	w.cancel()
	<-w.done
	w.read(ctx)
	w.mu.Lock()
	w.stopped = true
	w.mu.Unlock()
}

func newOrphanWatch(s *Shim, tl *Timeline, interval time.Duration) *OrphanWatch {
	return &OrphanWatch{shim: s, tl: tl, interval: interval, done: make(chan struct{}),
		sightings: map[string]*orphanSighting{}, suspects: -1, maxSuspects: -1}
}

func (w *OrphanWatch) read(ctx context.Context) {
	list, suspects, present, err := w.shim.Orphans(ctx)
	if err != nil {
		return
	}
	w.observe(time.Now(), list, suspects, present)
}

// observe applies one /status read taken at now.
func (w *OrphanWatch) observe(now time.Time, list []ShimOrphan, suspects int, present bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	w.reads++
	if !present {
		if !w.absent && w.tl != nil {
			w.tl.Add(NoteNoOrphanReport)
		}
		w.absent = true
		return
	}
	w.absent = false
	if suspects != w.suspects && suspects >= 0 {
		w.add(fmt.Sprintf("shim: %d VM(s) owned by nothing within their grace (orphan suspects, not reported yet)", suspects))
	}
	w.suspects = suspects
	if suspects > w.maxSuspects {
		w.maxSuspects = suspects
	}
	listed := map[string]bool{}
	for _, o := range list {
		if o.VMID == "" || listed[o.VMID] {
			continue
		}
		listed[o.VMID] = true
		s := w.sightings[o.VMID]
		if s == nil {
			s = &orphanSighting{first: o, listedAt: now}
			w.sightings[o.VMID] = s
			w.order = append(w.order, o.VMID)
			if !o.Reported() {
				w.add(fmt.Sprintf("shim suspects VM %s (%s, %s) is owned by nothing: %s of CloudStackMachine %s — %s",
					o.VMID, o.VMName, o.VMState, o.Kind, o.CloudStackMachine, o.Why))
			}
		} else if !s.listed {
			s.unlistedAt = time.Time{}
			w.add(fmt.Sprintf("shim lists VM %s as owned by nothing again", o.VMID))
		}
		s.listed = true
		if o.Reported() && s.reportedSeenAt.IsZero() {
			s.reported, s.reportedSeenAt = o, now
			w.add(fmt.Sprintf("shim REPORTS orphan VM %s (%s, %s): %s of CloudStackMachine %s, cluster %s, since %s, reported_at %s — %s",
				o.VMID, o.VMName, o.VMState, o.Kind, o.CloudStackMachine, o.cluster(), rfc3339(o.Since), rfc3339(o.ReportedAt), o.Why))
		}
	}
	for _, id := range w.order {
		s := w.sightings[id]
		if s.listed && !listed[id] {
			s.listed, s.unlistedAt = false, now
			w.add(fmt.Sprintf("shim no longer lists VM %s as an orphan", id))
		}
	}
}

func (w *OrphanWatch) add(msg string) {
	if w.tl != nil {
		w.tl.Add(msg)
	}
}

func rfc3339(t *time.Time) string {
	if t == nil {
		return "—"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

// Expect records a VM the scenario orphaned on purpose.
func (w *OrphanWatch) Expect(d DeliberateOrphan) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.deliberate = append(w.deliberate, &deliberateState{DeliberateOrphan: d})
}

func (w *OrphanWatch) deliberateOf(vmID string) *deliberateState {
	for _, d := range w.deliberate {
		if d.VMID == vmID {
			return d
		}
	}
	return nil
}

// NoteEvent records the message of the Event found for a deliberately orphaned VM.
func (w *OrphanWatch) NoteEvent(vmID, message string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if d := w.deliberateOf(vmID); d != nil {
		d.event = message
	}
}

// NoteCommand records the line `capc-health-shim orphans` printed for a deliberate orphan.
func (w *OrphanWatch) NoteCommand(vmID, command string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if d := w.deliberateOf(vmID); d != nil {
		d.command = command
	}
}

// NoteDestroyed records when the operator destroyed a deliberately orphaned VM.
func (w *OrphanWatch) NoteDestroyed(vmID string, at time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if d := w.deliberateOf(vmID); d != nil {
		d.destroyedAt = at
	}
}

// Reported returns the shim's entry for a VM when it has been seen reported.
func (w *OrphanWatch) Reported(vmID string) (ShimOrphan, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.sightings[vmID]
	if s == nil || s.reportedSeenAt.IsZero() {
		return ShimOrphan{}, false
	}
	return s.reported, true
}

// Listed is how many VMs the latest read listed (reported or suspected); -1 before any read
// that had the "orphans" array.
func (w *OrphanWatch) Listed() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.reads == 0 || w.absent {
		return -1
	}
	n := 0
	for _, s := range w.sightings {
		if s.listed {
			n++
		}
	}
	return n
}

// Absent says whether the latest read of /status had no "orphans" array.
func (w *OrphanWatch) Absent() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.absent
}

// OrphanScore is what a run's shim reported, against what the scenario orphaned on purpose.
type OrphanScore struct {
	// Reported: distinct VM ids the shim reported (reported_at set) at any read of the run.
	Reported int
	// False: reported VM ids the scenario did not orphan on purpose.
	False int
	// OpenAtEnd: VMs listed (reported or suspected) at the last read before teardown.
	OpenAtEnd int
	// MaxSuspects: the most VMs the shim held as suspects (owned by nothing, within the grace)
	// at one read; -1 when /status never showed orphan_detection.suspects.
	MaxSuspects int
	Records     []OrphanRecord
}

// Score scores the watch (call after Stop).
func (w *OrphanWatch) Score() OrphanScore {
	w.mu.Lock()
	defer w.mu.Unlock()
	sc := scoreOrphans(w.sightings, w.order, w.deliberate)
	sc.MaxSuspects = w.maxSuspects
	return sc
}

func scoreOrphans(sightings map[string]*orphanSighting, order []string, deliberate []*deliberateState) OrphanScore {
	var sc OrphanScore
	planned := map[string]bool{}
	for _, d := range deliberate {
		planned[d.VMID] = true
		rec := OrphanRecord{VMID: d.VMID, VMName: d.VMName, Race: d.Race, ExpectedKind: d.Kind, ExpectedCloudStackMachine: d.CloudStackMachine,
			Event: d.event, Command: d.command}
		if s := sightings[d.VMID]; s != nil {
			fillRecord(&rec, s)
			if !s.reportedSeenAt.IsZero() {
				if s.reported.ReportedAt != nil {
					rec.SecondsToReport = secs(s.reported.ReportedAt.Sub(d.GoneAt))
				}
				rec.SecondsToReportSeen = secs(s.reportedSeenAt.Sub(d.GoneAt))
			}
			if !d.destroyedAt.IsZero() && !s.listed && s.unlistedAt.After(d.destroyedAt) {
				rec.SecondsToClear = secs(s.unlistedAt.Sub(d.destroyedAt))
			}
		}
		sc.Records = append(sc.Records, rec)
	}
	for _, id := range order {
		s := sightings[id]
		if s.listed {
			sc.OpenAtEnd++
		}
		if !s.reportedSeenAt.IsZero() {
			sc.Reported++
			if !planned[id] {
				sc.False++
			}
		}
		if planned[id] {
			continue
		}
		rec := OrphanRecord{VMID: id, VMName: s.first.VMName}
		fillRecord(&rec, s)
		sc.Records = append(sc.Records, rec)
	}
	return sc
}

func fillRecord(rec *OrphanRecord, s *orphanSighting) {
	o := s.first
	if !s.reportedSeenAt.IsZero() {
		o = s.reported
		rec.Reported = true
	}
	rec.Kind, rec.CloudStackMachine, rec.Why = o.Kind, o.CloudStackMachine, o.Why
	if o.Cluster != nil {
		rec.Cluster = *o.Cluster
	}
	if o.Since != nil {
		rec.Since = rfc3339(o.Since)
	}
	if o.ReportedAt != nil {
		rec.ReportedAt = rfc3339(o.ReportedAt)
		if o.Since != nil {
			rec.SecondsGraceApplied = secs(o.ReportedAt.Sub(*o.Since))
		}
	}
	if rec.VMName == "" {
		rec.VMName = o.VMName
	}
}

// OrphanReportBound is how late an orphan may be reported after its CloudStackMachine is gone:
// the grace plus two poll intervals (one to see it owned by nothing, one to pass the grace),
// each up to 10 % longer (the shim's poll jitter).
func OrphanReportBound(c ShimConfig) time.Duration {
	return c.OrphanGrace() + time.Duration(2*(1+ShimPollJitter)*float64(c.PollInterval()))
}

// OrphanEventFor finds the Warning CloudStackVMOrphaned Event on the Cluster that names the VM
// (its id, or its name) and returns its message.
func OrphanEventFor(events []corev1.Event, cluster, vmID, vmName string) (string, bool) {
	for _, e := range events {
		if e.Type != corev1.EventTypeWarning || e.Reason != OrphanEventReason ||
			e.InvolvedObject.Kind != "Cluster" || e.InvolvedObject.Name != cluster {
			continue
		}
		if strings.Contains(e.Message, vmID) || (vmName != "" && strings.Contains(e.Message, vmName)) {
			return e.Message, true
		}
	}
	return "", false
}

// CountOrphanEvents counts the Warning CloudStackVMOrphaned Events on the Cluster.
func CountOrphanEvents(events []corev1.Event, cluster string) int {
	n := 0
	for _, e := range events {
		if e.Type == corev1.EventTypeWarning && e.Reason == OrphanEventReason && e.InvolvedObject.Kind == "Cluster" && e.InvolvedObject.Name == cluster {
			n++
		}
	}
	return n
}

var cmkDestroy = regexp.MustCompile(`cmk destroy virtualmachine id=([0-9A-Za-z][0-9A-Za-z-]*) expunge=true`)

// CmkDestroyCommands are the `cmk destroy virtualmachine id=<id> expunge=true` lines of
// `capc-health-shim orphans` output, by VM id.
func CmkDestroyCommands(out string) map[string]string {
	cmds := map[string]string{}
	for _, m := range cmkDestroy.FindAllStringSubmatch(out, -1) {
		if _, dup := cmds[m[1]]; !dup {
			cmds[m[1]] = m[0]
		}
	}
	return cmds
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// OrphanSummary is one line per record, for notes and logs.
func OrphanSummary(recs []OrphanRecord) []string {
	out := make([]string, 0, len(recs))
	for _, r := range recs {
		what := "FALSE ORPHAN"
		if r.Race != "" {
			what = r.Race + ", want " + r.ExpectedKind
		}
		state := "never reported"
		if r.Reported {
			state = "reported " + r.Kind
		} else if r.Kind != "" {
			state = "suspected " + r.Kind
		}
		out = append(out, fmt.Sprintf("%s (%s; %s): %s, %s s after its CloudStackMachine was gone (seen %s s)",
			r.VMID, r.VMName, what, state, f1(r.SecondsToReport), f1(r.SecondsToReportSeen)))
	}
	sort.Strings(out)
	return out
}
