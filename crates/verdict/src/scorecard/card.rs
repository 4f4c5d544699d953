//! The scorecard itself (issue 44 item 3): every Machine's [`Story`] folded cycle by cycle
//! from what the controller observed, the outcome counted once when a story ends, the boot
//! baselines fed when a Machine first shows its Node. Pure: the controller builds one
//! [`Observation`] per Machine per cycle and passes the time in.
//!
//! What survives a leader change is [`Kept`] (counts, recent outcomes, baselines): small and
//! bounded. Stories are not kept: a new leader starts them again from what the Machines carry
//! (the condition's `lastTransitionTime` dates a standing `False`, see [`Seen::since`]).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use super::baseline::{warnings, BootKey, BootSample, MhcCoverage, WarnPolicy, Warning};
use super::outcome::{Deleter, Event, MhcTrigger, Outcome, OutcomeKind, Story, Timing};
use super::{Baselines, Labels};
use crate::Status;
use capi_model::apis::Mode;

/// Stories followed at once; Machines beyond are counted in [`Kept::untracked`] only.
pub const MAX_STORIES: usize = 50_000;
/// Values kept per group (cluster, zone, template); further ones count under [`OTHER`].
pub const MAX_GROUP_VALUES: usize = 200;
/// The group value that stands for every value past [`MAX_GROUP_VALUES`].
pub const OTHER: &str = "(other)";
/// Outcomes kept for `/status`, newest last.
pub const RECENT: usize = 50;
/// Ended incidents remembered (issue 45), the newest, within the window.
pub const INCIDENTS: usize = 50;

/// The verdict a Machine carries (or, where the shim writes nothing, would carry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub status: Status,
    pub reason: String,
    /// The verdict's message: the evidence.
    pub evidence: String,
    pub traffic_rising: bool,
    /// Since when it has held (the condition's `lastTransitionTime`): a new leader dates a
    /// `False` it did not see begin by it.
    pub since: Timestamp,
}

/// One Machine as a cycle saw it.
#[derive(Debug, Clone)]
pub struct Observation {
    pub uid: String,
    /// `namespace/name`.
    pub machine: String,
    pub labels: Labels,
    pub mode: Mode,
    pub timing: Timing,
    /// The Machine's creationTimestamp.
    pub created: Option<Timestamp>,
    pub verdict: Option<Seen>,
    /// Its VM is Running at this cycle's listing.
    pub vm_running: bool,
    /// The remediate annotation is on it: `Some(true)` when the shim set it.
    pub annotated: Option<bool>,
    /// A MachineHealthCheck marked it for remediation, and why.
    pub mhc_marked: Option<MhcTrigger>,
    pub has_node: bool,
    pub deleting: bool,
    /// A controller (MachineSet, KubeadmControlPlane) owns it: its deletion is the owner's.
    /// A Machine nothing owns can only have been deleted by hand.
    pub owned: bool,
    /// What its boot time is grouped by, when its VM's template, offering and zone are known.
    pub boot_key: Option<BootKey>,
    /// The MHCs covering it (`namespace/name`) with their `nodeStartupTimeout`.
    pub mhcs: Vec<(String, SignedDuration)>,
}

/// A Machine the watches saw deleted since the last cycle, as it last was: what a story needs
/// when no cycle saw the Machine marked or deleting (it went within one poll interval) to tell
/// an MHC's recycle from a scale-down.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Departed {
    pub uid: String,
    /// It carried the remediate annotation.
    pub annotated: bool,
    /// A MachineHealthCheck had marked it for remediation, and why.
    pub mhc_marked: Option<MhcTrigger>,
}

/// An outcome's count and the seconds it adds up (saved, or signal → delete, …).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Total {
    pub count: u64,
    pub seconds: i64,
}

/// What the leader's memory keeps of the scorecard.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Kept {
    /// When counting began (the first leader's first cycle).
    pub since: Timestamp,
    /// Per outcome label.
    pub totals: BTreeMap<String, Total>,
    /// Per outcome label → reason → count (the reason the outcome is about; "" for none).
    pub by_reason: BTreeMap<String, BTreeMap<String, u64>>,
    /// Per group kind (`cluster`, `zone`, `template`) → value → outcome label → count.
    pub groups: BTreeMap<String, BTreeMap<String, BTreeMap<String, u64>>>,
    pub recent: VecDeque<Outcome>,
    pub baselines: Baselines,
    /// Machines whose story ended without anything to say about the shim (healthy all along,
    /// scaled down).
    pub uneventful: u64,
    /// Machines not followed because [`MAX_STORIES`] were.
    pub untracked: u64,
    /// Incidents that ended within the window, oldest first (at most [`INCIDENTS`]).
    #[serde(default)]
    pub incidents: VecDeque<crate::incidents::book::EndedIncident>,
}

impl Kept {
    pub fn new(now: Timestamp, window: SignedDuration) -> Self {
        Self {
            since: now,
            totals: BTreeMap::new(),
            by_reason: BTreeMap::new(),
            groups: BTreeMap::new(),
            recent: VecDeque::new(),
            baselines: Baselines::new(now, window),
            uneventful: 0,
            untracked: 0,
            incidents: VecDeque::new(),
        }
    }

    /// The count of one outcome label.
    pub fn count(&self, outcome: &str) -> u64 {
        self.totals.get(outcome).map_or(0, |t| t.count)
    }

    /// As JSON within `max_bytes`: what does not fit goes first from what matters least —
    /// the previous baseline window, then the recent outcomes' evidence, then the current
    /// window's keys with the fewest samples. The counts always stay. Returns the JSON and
    /// what was left out (empty when everything fit).
    pub fn encode(&self, max_bytes: usize) -> (String, Vec<String>) {
        let mut k = self.clone();
        let mut left_out = Vec::new();
        let fits = |k: &Kept| serde_json::to_string(k).unwrap_or_default();
        let mut json = fits(&k);
        if json.len() > max_bytes && k.baselines.previous.take().is_some() {
            left_out.push("the previous baseline window".to_string());
            json = fits(&k);
        }
        if json.len() > max_bytes {
            for o in &mut k.recent {
                o.evidence.clear();
            }
            left_out.push("the recent outcomes' evidence".to_string());
            json = fits(&k);
        }
        let mut dropped_keys = 0;
        while json.len() > max_bytes && !k.baselines.current.keys.is_empty() {
            // A tenth of the keys at a time, the fewest samples first.
            let mut by_count: Vec<(u64, BootKey)> = k
                .baselines
                .current
                .keys
                .iter()
                .map(|(key, t)| (t.from_creation.count(), key.clone()))
                .collect();
            by_count.sort();
            let n = by_count.len().div_ceil(10);
            for (_, key) in by_count.into_iter().take(n) {
                k.baselines.current.keys.remove(&key);
                dropped_keys += 1;
            }
            json = fits(&k);
        }
        if dropped_keys > 0 {
            left_out.push(format!("{dropped_keys} boot baseline key(s)"));
        }
        while json.len() > max_bytes && !k.incidents.is_empty() {
            k.incidents.pop_front();
            json = fits(&k);
        }
        while json.len() > max_bytes && !k.recent.is_empty() {
            k.recent.pop_front();
            json = fits(&k);
        }
        (json, left_out)
    }

    fn add(&mut self, o: &Outcome) {
        let label = o.kind.label().to_string();
        let t = self.totals.entry(label.clone()).or_default();
        t.count += 1;
        t.seconds += seconds_of(&o.kind);
        *self
            .by_reason
            .entry(label.clone())
            .or_default()
            .entry(o.reason.clone())
            .or_default() += 1;
        for (kind, value) in [
            ("cluster", &o.labels.cluster),
            ("zone", &o.labels.zone),
            ("template", &o.labels.template),
        ] {
            let values = self.groups.entry(kind.to_string()).or_default();
            let value = if values.contains_key(value) || values.len() < MAX_GROUP_VALUES {
                value.clone()
            } else {
                OTHER.to_string()
            };
            *values
                .entry(value)
                .or_default()
                .entry(label.clone())
                .or_default() += 1;
        }
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(o.clone());
    }
}

/// The seconds an outcome adds to its total: what was saved, or how long the `False` lasted.
fn seconds_of(k: &OutcomeKind) -> i64 {
    match *k {
        OutcomeKind::RecycledOnSignal {
            false_to_delete_secs,
        } => false_to_delete_secs,
        OutcomeKind::WouldHaveSaved { saved_secs, .. } => saved_secs,
        OutcomeKind::FalseAlarm { false_to_node_secs } => false_to_node_secs,
        OutcomeKind::Recovered { false_for_secs } | OutcomeKind::StillStuck { false_for_secs } => {
            false_for_secs
        }
        OutcomeKind::Missed { .. } => 0,
    }
}

/// One followed Machine.
#[derive(Debug, Clone)]
struct Followed {
    story: Story,
    /// Seen without its Node at first: its boot time can be measured.
    boot_measurable: bool,
    created: Option<Timestamp>,
    vm_running_at: Option<Timestamp>,
    /// The last verdict recorded (recorded again only when it changes).
    last: Option<(Status, String, bool)>,
    annotated: bool,
    marked: bool,
    /// Has its Node and says `True` since.
    healthy_since: Option<Timestamp>,
    stuck_counted: bool,
    seen_at: Timestamp,
    owned: bool,
}

/// Every Machine's story and what the stories said.
#[derive(Debug, Clone)]
pub struct Scorecard {
    /// How long a Machine with its Node must stay `True` for its story to end.
    pub settle: SignedDuration,
    pub kept: Kept,
    followed: HashMap<String, Followed>,
    /// The MHCs seen in the last cycle with their timeout and the boot keys they cover.
    mhcs: BTreeMap<String, (SignedDuration, HashSet<BootKey>)>,
}

impl Scorecard {
    pub fn new(now: Timestamp, settle: SignedDuration, window: SignedDuration) -> Self {
        Self {
            settle,
            kept: Kept::new(now, window),
            followed: HashMap::new(),
            mhcs: BTreeMap::new(),
        }
    }

    /// Takes back what an earlier leader kept; the window length is this process's.
    pub fn restore(&mut self, mut kept: Kept) {
        kept.baselines.length = self.kept.baselines.length;
        self.kept = kept;
    }

    /// Remembers an incident that ended; those that ended before the window are forgotten.
    pub fn remember_incident(&mut self, ended: crate::incidents::book::EndedIncident) {
        let window = self.kept.baselines.length;
        let until = ended.until;
        self.kept.incidents.push_back(ended);
        self.kept
            .incidents
            .retain(|i| until.duration_since(i.until) <= window);
        while self.kept.incidents.len() > INCIDENTS {
            self.kept.incidents.pop_front();
        }
    }

    /// Stories followed now.
    pub fn following(&self) -> usize {
        self.followed.len()
    }

    /// Folds one cycle in: every Machine it saw; a followed Machine it did not see is gone.
    /// Returns the outcomes recorded by this cycle.
    pub fn observe(&mut self, now: Timestamp, seen: &[Observation]) -> Vec<Outcome> {
        self.observe_with(now, seen, &[])
    }

    /// [`Scorecard::observe`], with the Machines the watches saw deleted since the last cycle:
    /// a followed Machine gone without this cycle seeing it takes its last mark and
    /// annotation from there (an annotation not the shim's own: the shim's is recorded in the
    /// cycle that writes it).
    pub fn observe_with(
        &mut self,
        now: Timestamp,
        seen: &[Observation],
        departed: &[Departed],
    ) -> Vec<Outcome> {
        let mut out = Vec::new();
        self.kept.baselines.roll(now);
        self.mhcs.clear();
        for o in seen {
            for (name, timeout) in &o.mhcs {
                let entry = self
                    .mhcs
                    .entry(name.clone())
                    .or_insert_with(|| (*timeout, HashSet::new()));
                if let Some(k) = &o.boot_key {
                    entry.1.insert(k.clone());
                }
            }
            if !self.followed.contains_key(&o.uid) {
                if !worth_following(o) {
                    continue;
                }
                if self.followed.len() >= MAX_STORIES {
                    self.kept.untracked += 1;
                    continue;
                }
            }
            let f = self
                .followed
                .entry(o.uid.clone())
                .or_insert_with(|| follow(o, now));
            f.seen_at = now;
            if let Some(sample) = step(f, o, now, self.settle) {
                self.kept.baselines.record(&sample);
            }
        }
        // Gone from the watches without a deletion seen: deleted between two cycles.
        let last_seen: HashMap<&str, &Departed> =
            departed.iter().map(|d| (d.uid.as_str(), d)).collect();
        for (uid, f) in &mut self.followed {
            if f.seen_at != now && !f.story.ended() {
                if let Some(d) = last_seen.get(uid.as_str()) {
                    if d.annotated && !f.annotated {
                        f.annotated = true;
                        f.story.record(now, Event::Annotated { by_shim: false });
                    }
                    if let (Some(trigger), false) = (d.mhc_marked, f.marked) {
                        f.marked = true;
                        f.story.record(now, Event::MhcMarked { trigger });
                    }
                }
                let by = deleter(f.owned);
                f.story.record(now, Event::Deleted { by });
            }
        }
        let mut done = Vec::new();
        for (uid, f) in &mut self.followed {
            let outcome = f.story.outcome(now);
            match (&outcome, f.story.ended()) {
                (Some(o), false) if matches!(o.kind, OutcomeKind::StillStuck { .. }) => {
                    if !f.stuck_counted {
                        f.stuck_counted = true;
                        out.push(o.clone());
                    }
                }
                (_, false) => {}
                (Some(o), true) => {
                    out.push(o.clone());
                    done.push(uid.clone());
                }
                (None, true) => {
                    self.kept.uneventful += 1;
                    done.push(uid.clone());
                }
            }
        }
        for uid in done {
            self.followed.remove(&uid);
        }
        for o in &out {
            self.kept.add(o);
        }
        out
    }

    /// The warnings of the current window.
    pub fn warnings(&self, policy: WarnPolicy) -> Vec<Warning> {
        let mhcs: Vec<MhcCoverage> = self
            .mhcs
            .iter()
            .map(|(name, (timeout, keys))| MhcCoverage {
                name: name.clone(),
                node_startup_timeout: *timeout,
                covers: keys.iter().cloned().collect(),
            })
            .collect();
        warnings(&self.kept.baselines, &mhcs, policy)
    }
}

/// A story starts with a Machine that has no Node yet, or one whose verdict is not `True`:
/// a healthy Node (after its story settled, or when a new leader finds it so) has nothing to
/// tell until its verdict changes; a Machine being deleted, nothing at all.
fn worth_following(o: &Observation) -> bool {
    let healthy = o.verdict.as_ref().is_none_or(|v| v.status == Status::True);
    let healthy_node = o.has_node && healthy;
    !(o.deleting || healthy_node)
}

fn deleter(owned: bool) -> Deleter {
    if owned {
        Deleter::Owner
    } else {
        Deleter::Hand
    }
}

fn follow(o: &Observation, now: Timestamp) -> Followed {
    let mut story = Story::new(o.machine.clone(), o.labels.clone(), o.mode, o.timing);
    // A Machine that has its Node when first seen: its boot is not measurable, and its Node
    // came before now (its story begins with it).
    let created = o.created.unwrap_or(now);
    if o.has_node {
        story.record(created, Event::NodeAppeared);
    }
    Followed {
        story,
        boot_measurable: !o.has_node,
        created: o.created,
        vm_running_at: None,
        last: None,
        annotated: false,
        marked: false,
        healthy_since: None,
        stuck_counted: false,
        seen_at: now,
        owned: o.owned,
    }
}

/// One Machine's cycle into its story; the boot sample when its Node first shows.
fn step(
    f: &mut Followed,
    o: &Observation,
    now: Timestamp,
    settle: SignedDuration,
) -> Option<BootSample> {
    // The story's labels fill in as the VM becomes known (its first listing may come later).
    if f.story.labels.zone.is_empty() && !o.labels.zone.is_empty() {
        f.story.labels = o.labels.clone();
    }
    f.story.timing = o.timing;
    if o.vm_running {
        f.vm_running_at.get_or_insert(now);
    }
    // A Machine being deleted is judged `Unknown`/`MachineDeleting`: a placeholder that says
    // nothing of its health. The story keeps what the shim said before the deletion, which is
    // what a `missed` outcome reports (the shim's `True` with traffic when the MHC's timer
    // recycled it, not the placeholder that follows).
    let verdict = o.verdict.as_ref().filter(|_| !o.deleting);
    if let Some(v) = verdict {
        let key = (v.status, v.reason.clone(), v.traffic_rising);
        if f.last.as_ref() != Some(&key) {
            // The first verdict this process sees dates from the condition's transition (a
            // `False` a former leader published began then), never before the Machine.
            let at = if f.last.is_none() {
                f.created.map_or(v.since, |c| v.since.max(c)).min(now)
            } else {
                now
            };
            f.story.record(
                at,
                Event::Verdict {
                    status: v.status,
                    reason: v.reason.clone(),
                    evidence: v.evidence.clone(),
                    traffic_rising: v.traffic_rising,
                },
            );
            f.last = Some(key);
        }
    }
    if let (Some(by_shim), false) = (o.annotated, f.annotated) {
        f.annotated = true;
        f.story.record(now, Event::Annotated { by_shim });
    }
    if let (Some(trigger), false) = (o.mhc_marked, f.marked) {
        f.marked = true;
        f.story.record(now, Event::MhcMarked { trigger });
    }
    let mut sample = None;
    if o.has_node && f.story.node_at.is_none() {
        f.story.record(now, Event::NodeAppeared);
        if let (true, Some(created), Some(key)) = (f.boot_measurable, f.created, &o.boot_key) {
            sample = Some(BootSample {
                key: key.clone(),
                created,
                vm_running: f.vm_running_at,
                node_at: now,
            });
        }
    }
    f.owned = o.owned;
    if o.deleting {
        let by = deleter(o.owned);
        f.story.record(now, Event::Deleted { by });
        return sample;
    }
    let healthy = o.has_node && o.verdict.as_ref().is_some_and(|v| v.status == Status::True);
    if !healthy {
        f.healthy_since = None;
    } else if let Some(since) = f.healthy_since {
        if now.duration_since(since) >= settle {
            f.story.record(now, Event::Settled);
        }
    } else {
        f.healthy_since = Some(now);
    }
    sample
}

/// What the warnings use by default: an MHC's timeout should exceed the p95 by half, and a
/// key needs 5 boots in a window to say anything.
pub const DEFAULT_WARN_POLICY: WarnPolicy = WarnPolicy {
    margin: 1.5,
    min_samples: 5,
};
