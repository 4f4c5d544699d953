//! One Machine's story, folded as it happens, and what it says about the shim when it ends
//! (issue 44 item 1). Pure: the caller turns watch events and verdicts into [`Event`]s and
//! passes every time in.
//!
//! The one question behind every outcome is "would acting on the shim's `False` have
//! recycled this Machine, and was that right?". Acting takes a `False` that lasts
//! [`Timing::action_lag`] (the escalation delay in annotate mode, the MHC's condition timeout
//! in condition mode), so a shorter spell of `False` would not have recycled anything.

use std::collections::VecDeque;

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use super::Labels;
use crate::Status;
use capi_model::apis::Mode;

/// Why a MachineHealthCheck marked the Machine for remediation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MhcTrigger {
    /// The shim's condition, listed under the MHC's unhealthy conditions: the shim's signal.
    Condition,
    /// The MHC's own timer: no Node within `nodeStartupTimeout`.
    NodeStartupTimeout,
    /// The remediate-machine annotation (the shim's or someone's: see [`Event::Annotated`]).
    Annotation,
    /// Anything else the MHC watches (a Node condition).
    Other,
}

/// Who deleted the Machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Deleter {
    /// Its owner (MachineSet, KubeadmControlPlane), e.g. after remediation or a scale-down.
    Owner,
    /// Someone deleted the Machine itself.
    Hand,
}

/// What happened to the Machine, as the caller saw it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "kebab-case")]
pub enum Event {
    /// The shim's verdict, published or (where it writes nothing) the one it would have
    /// published. Recorded when status, reason or `traffic_rising` changes.
    Verdict {
        status: Status,
        reason: String,
        /// The verdict's message: the evidence at the time.
        evidence: String,
        /// The guest's traffic counter rose at the latest sample.
        traffic_rising: bool,
    },
    /// The remediate-machine annotation appeared.
    Annotated { by_shim: bool },
    /// A MachineHealthCheck marked the Machine for remediation.
    MhcMarked { trigger: MhcTrigger },
    /// The Machine got its Node.
    NodeAppeared,
    /// The Machine is gone (its deletionTimestamp was set).
    Deleted { by: Deleter },
    /// It has its Node and stayed healthy for the settle time.
    Settled,
}

/// The durations that say what acting would have done, for the MHC covering this Machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timing {
    /// How long after a `False` acting on it starts a recycle: the escalation delay
    /// (annotate) or the MHC's timeout for the shim's condition (condition).
    pub action_lag: SignedDuration,
    /// The covering MHC's `nodeStartupTimeout`: a Node-less Machine `False` for longer, with
    /// nothing acting, is still stuck.
    pub stuck_after: SignedDuration,
}

/// One stretch of time during which the shim said `False`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spell {
    pub from: Timestamp,
    /// When a verdict other than `False` ended it; `None` while it lasts.
    pub until: Option<Timestamp>,
    /// The status that ended it (`True` contradicts the `False`, `Unknown` only withdraws it).
    pub ended_by: Option<Status>,
    pub reason: String,
    pub evidence: String,
    /// The Machine had no Node when the spell began.
    pub before_node: bool,
}

impl Spell {
    /// How long it lasted, or has lasted by `end`.
    fn length(&self, end: Timestamp) -> SignedDuration {
        self.until.unwrap_or(end).duration_since(self.from)
    }

    /// Whether acting would have started a recycle by `end`.
    fn would_act_by(&self, end: Timestamp, lag: SignedDuration) -> bool {
        self.length(end) >= lag
    }
}

/// Spells kept per Machine: the first and the newest ones. A VM flapping more often than
/// this loses its middle spells, never the first (false alarms are about the first).
pub const SPELLS_KEPT: usize = 8;

/// The last verdict the shim reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LastVerdict {
    pub at: Timestamp,
    pub status: Status,
    pub reason: String,
    pub evidence: String,
    pub traffic_rising: bool,
}

/// How the story ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "end", rename_all = "kebab-case")]
pub enum Ending {
    Deleted { at: Timestamp, by: Deleter },
    Settled { at: Timestamp },
}

/// One Machine's story so far: bounded (at most [`SPELLS_KEPT`] spells), whatever its length.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Story {
    /// `namespace/name`.
    pub machine: String,
    pub labels: Labels,
    pub mode: Mode,
    pub timing: Timing,
    pub spells: VecDeque<Spell>,
    pub last_verdict: Option<LastVerdict>,
    pub node_at: Option<Timestamp>,
    /// The shim's signal reached the Machine (its annotation, or an MHC acting on its
    /// condition) while it said `False`.
    pub signalled_at: Option<Timestamp>,
    /// The MHC marked it for a reason other than the shim's signal.
    pub marked: Option<(Timestamp, MhcTrigger)>,
    /// Someone other than the shim set the remediate annotation.
    pub annotated_by_hand: Option<Timestamp>,
    pub ending: Option<Ending>,
}

/// How the shim did on one Machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum OutcomeKind {
    /// The shim's `False`, then its owner deleted it.
    RecycledOnSignal { false_to_delete_secs: i64 },
    /// `False`, and something else recycled it later (or someone deleted it by hand, even
    /// after the shim's signal): acting would have saved this much (never negative: a
    /// recycle sooner than acting would have been saves nothing).
    WouldHaveSaved {
        saved_secs: i64,
        recycled_by: Recycler,
    },
    /// `False` before the Node came, and then the Machine became a healthy Node: must be 0.
    FalseAlarm { false_to_node_secs: i64 },
    /// `False` on a Machine with its Node, contradicted before anyone acted.
    Recovered { false_for_secs: i64 },
    /// Recycled by the MHC while the shim did not say `False` (long enough to act).
    Missed {
        shim_said: ShimSaid,
        trigger: MhcTrigger,
    },
    /// `False`, no Node, nothing acted for longer than the MHC's `nodeStartupTimeout`.
    StillStuck { false_for_secs: i64 },
}

/// What recycled a Machine the shim's signal did not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Recycler {
    Mhc(MhcTrigger),
    Hand,
}

/// What the shim said when the MHC recycled a Machine it had not judged `False`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ShimSaid {
    /// `True` with rising traffic: likely a slow-but-healthy VM the MHC recycled.
    HealthyWithTraffic,
    /// `True` without a rising counter (e.g. `VMRunning` while samples come in).
    HealthyWithoutTraffic,
    /// `Unknown`, a `False` too short to act on, or no verdict at all.
    NoEvidence,
}

impl OutcomeKind {
    /// The outcome's label (`capc_health_outcomes_total{outcome}`).
    pub fn label(&self) -> &'static str {
        match self {
            Self::RecycledOnSignal { .. } => "recycled-on-signal",
            Self::WouldHaveSaved { .. } => "would-have-saved",
            Self::FalseAlarm { .. } => "false-alarm",
            Self::Recovered { .. } => "recovered",
            Self::Missed { .. } => "missed",
            Self::StillStuck { .. } => "still-stuck",
        }
    }
}

/// Every outcome label, for metrics label sets and docs.
pub const OUTCOMES: &[&str] = &[
    "recycled-on-signal",
    "would-have-saved",
    "false-alarm",
    "recovered",
    "missed",
    "still-stuck",
];

/// An outcome with what it is about: the Machine, its labels and the evidence at the time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    pub machine: String,
    pub labels: Labels,
    pub mode: Mode,
    pub kind: OutcomeKind,
    /// The reason of the `False` it is about, or of the last verdict for `missed` (empty
    /// when the shim had none).
    pub reason: String,
    pub evidence: String,
    /// When the story ended (for `still-stuck`, when it was judged).
    pub at: Timestamp,
}

impl Story {
    pub fn new(machine: impl Into<String>, labels: Labels, mode: Mode, timing: Timing) -> Self {
        Self {
            machine: machine.into(),
            labels,
            mode,
            timing,
            spells: VecDeque::new(),
            last_verdict: None,
            node_at: None,
            signalled_at: None,
            marked: None,
            annotated_by_hand: None,
            ending: None,
        }
    }

    pub fn ended(&self) -> bool {
        self.ending.is_some()
    }

    fn open_spell(&self) -> Option<&Spell> {
        self.spells.back().filter(|s| s.until.is_none())
    }

    /// Folds one event in. Events after the story ended change nothing: its outcome is kept.
    pub fn record(&mut self, at: Timestamp, event: Event) {
        if self.ended() {
            return;
        }
        match event {
            Event::Verdict {
                status,
                reason,
                evidence,
                traffic_rising,
            } => self.verdict(at, status, reason, evidence, traffic_rising),
            Event::Annotated { by_shim: true } => self.signal(at, MhcTrigger::Annotation),
            Event::Annotated { by_shim: false } => {
                self.annotated_by_hand.get_or_insert(at);
            }
            Event::MhcMarked {
                trigger: MhcTrigger::Condition,
            } => self.signal(at, MhcTrigger::Condition),
            // The annotation's author was recorded when it appeared.
            Event::MhcMarked {
                trigger: MhcTrigger::Annotation,
            } if self.signalled_at.is_some() => {}
            Event::MhcMarked { trigger } => {
                self.marked.get_or_insert((at, trigger));
            }
            Event::NodeAppeared => {
                self.node_at.get_or_insert(at);
            }
            Event::Deleted { by } => self.ending = Some(Ending::Deleted { at, by }),
            Event::Settled => {
                // Healthy for the settle time: a `False` still open is contradicted now.
                self.end_spell(at, Status::True);
                self.ending = Some(Ending::Settled { at });
            }
        }
    }

    fn verdict(
        &mut self,
        at: Timestamp,
        status: Status,
        reason: String,
        evidence: String,
        traffic_rising: bool,
    ) {
        if status == Status::False {
            if self.open_spell().is_none() {
                if self.spells.len() == SPELLS_KEPT {
                    self.spells.remove(1);
                }
                self.spells.push_back(Spell {
                    from: at,
                    until: None,
                    ended_by: None,
                    reason: reason.clone(),
                    evidence: evidence.clone(),
                    before_node: self.node_at.is_none(),
                });
            }
        } else {
            self.end_spell(at, status);
        }
        self.last_verdict = Some(LastVerdict {
            at,
            status,
            reason,
            evidence,
            traffic_rising,
        });
    }

    fn end_spell(&mut self, at: Timestamp, status: Status) {
        if let Some(open) = self.spells.back_mut().filter(|s| s.until.is_none()) {
            open.until = Some(at);
            open.ended_by = Some(status);
        }
    }

    /// A signal counts only while the shim says `False`; otherwise it is recorded as a mark
    /// like any other (the shim's `False` it answered was withdrawn meanwhile).
    fn signal(&mut self, at: Timestamp, trigger: MhcTrigger) {
        if self.open_spell().is_some() {
            self.signalled_at.get_or_insert(at);
        } else {
            self.marked.get_or_insert((at, trigger));
        }
    }

    /// What the story says at `now`: its outcome once it ended, `still-stuck` while a
    /// Node-less Machine stays `False` past the MHC's timeout with nothing acting, and `None`
    /// while it goes on or when it says nothing about the shim (a healthy Machine never
    /// judged `False`; one deleted by its owner or by hand without any recycle signal).
    pub fn outcome(&self, now: Timestamp) -> Option<Outcome> {
        let (kind, spell, at) = match self.ending {
            None => self.stuck(now)?,
            Some(Ending::Settled { at }) => self.settled(at)?,
            Some(Ending::Deleted { at, by }) => self.deleted(at, by)?,
        };
        let (reason, evidence) = match (spell, &self.last_verdict) {
            (Some(s), _) => (s.reason.clone(), s.evidence.clone()),
            (None, Some(v)) => (v.reason.clone(), v.evidence.clone()),
            (None, None) => (String::new(), String::new()),
        };
        Some(Outcome {
            machine: self.machine.clone(),
            labels: self.labels.clone(),
            mode: self.mode,
            kind,
            reason,
            evidence,
            at,
        })
    }

    fn stuck(&self, now: Timestamp) -> Option<(OutcomeKind, Option<&Spell>, Timestamp)> {
        let open = self.open_spell()?;
        let acted = self.signalled_at.is_some()
            || self.marked.is_some()
            || self.annotated_by_hand.is_some();
        let false_for = now.duration_since(open.from);
        (self.node_at.is_none() && !acted && false_for > self.timing.stuck_after).then(|| {
            let kind = OutcomeKind::StillStuck {
                false_for_secs: false_for.as_secs(),
            };
            (kind, Some(open), now)
        })
    }

    fn settled(&self, at: Timestamp) -> Option<(OutcomeKind, Option<&Spell>, Timestamp)> {
        // The first `False` of a Machine that then became a healthy Node is the alarm; a
        // `False` only after its Node came is a fault that went away.
        if let (Some(spell), Some(node_at)) =
            (self.spells.iter().find(|s| s.before_node), self.node_at)
        {
            let kind = OutcomeKind::FalseAlarm {
                false_to_node_secs: node_at.duration_since(spell.from).as_secs().max(0),
            };
            return Some((kind, Some(spell), at));
        }
        let spell = self.spells.back()?;
        let kind = OutcomeKind::Recovered {
            false_for_secs: spell.length(at).as_secs(),
        };
        Some((kind, Some(spell), at))
    }

    fn deleted(
        &self,
        at: Timestamp,
        by: Deleter,
    ) -> Option<(OutcomeKind, Option<&Spell>, Timestamp)> {
        let lag = self.timing.action_lag;
        if let (Some(signalled), Deleter::Owner) = (self.signalled_at, by) {
            let spell = self.spells.iter().rev().find(|s| s.from <= signalled);
            let from = spell.map_or(signalled, |s| s.from);
            let kind = OutcomeKind::RecycledOnSignal {
                false_to_delete_secs: at.duration_since(from).as_secs().max(0),
            };
            return Some((kind, spell, at));
        }
        let recycled_by = match (by, self.marked) {
            (Deleter::Hand, _) => Recycler::Hand,
            (Deleter::Owner, Some((_, trigger))) => Recycler::Mhc(trigger),
            // Someone's annotation, its MHC mark unseen: the annotation recycled it.
            (Deleter::Owner, None) if self.annotated_by_hand.is_some() => {
                Recycler::Mhc(MhcTrigger::Annotation)
            }
            // Its owner deleted it and nothing marked it: a scale-down or a rollout, no
            // recycle, whatever the shim said.
            (Deleter::Owner, None) => return None,
        };
        // The first spell acting would have recycled on, or a spell still open: the shim
        // agreed, acting would just not have been sooner.
        let acting = self.spells.iter().find(|s| s.would_act_by(at, lag));
        if let Some(spell) = acting.or_else(|| self.open_spell()) {
            let saved = at.duration_since(spell.from) - lag;
            let kind = OutcomeKind::WouldHaveSaved {
                saved_secs: saved.as_secs().max(0),
                recycled_by,
            };
            return Some((kind, Some(spell), at));
        }
        let Recycler::Mhc(trigger) = recycled_by else {
            // By hand, and the shim never judged it `False`: a repair or a decommission,
            // the story cannot tell which.
            return None;
        };
        let shim_said = match &self.last_verdict {
            Some(v) if v.status == Status::True && v.traffic_rising => ShimSaid::HealthyWithTraffic,
            Some(v) if v.status == Status::True => ShimSaid::HealthyWithoutTraffic,
            _ => ShimSaid::NoEvidence,
        };
        Some((OutcomeKind::Missed { shim_said, trigger }, None, at))
    }
}
