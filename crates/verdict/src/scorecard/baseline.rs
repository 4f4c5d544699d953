//! How long the operator's VMs really take to become Nodes, per (template, offering, zone),
//! over a window; and the warnings that follow (issue 44 item 2): a MachineHealthCheck whose
//! `nodeStartupTimeout` would recycle healthy-but-slow VMs, a template that got twice as slow.
//!
//! Bounded: a [`Sketch`] pair per key (see [`super::sketch`] for its bound and error), at
//! most [`MAX_KEYS`] keys per window, two windows (this one and the one before).

use std::collections::BTreeMap;

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};

use super::sketch::Sketch;

/// Keys kept per window; samples of further keys are counted in [`Window::dropped`] only.
pub const MAX_KEYS: usize = 1024;

/// What a boot time is grouped by.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct BootKey {
    pub template: String,
    pub offering: String,
    pub zone: String,
}

/// One Machine that got its Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootSample {
    pub key: BootKey,
    /// The Machine's creationTimestamp.
    pub created: Timestamp,
    /// When its VM was first seen Running, if the shim saw it.
    pub vm_running: Option<Timestamp>,
    pub node_at: Timestamp,
}

/// The boot times of one key.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BootTimes {
    /// Machine creation → Node.
    pub from_creation: Sketch,
    /// VM Running → Node.
    pub from_running: Sketch,
}

impl BootTimes {
    fn merge(&mut self, other: &BootTimes) {
        self.from_creation.merge(&other.from_creation);
        self.from_running.merge(&other.from_running);
    }
}

/// The boot times recorded from `start` for `length`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Window {
    pub start: Timestamp,
    /// A list of pairs in JSON: its keys are not strings.
    #[serde(with = "pairs")]
    pub keys: BTreeMap<BootKey, BootTimes>,
    /// Samples not kept because [`MAX_KEYS`] keys were already there.
    pub dropped: u64,
}

impl Window {
    fn new(start: Timestamp) -> Self {
        Self {
            start,
            keys: BTreeMap::new(),
            dropped: 0,
        }
    }

    /// All keys that `keep` accepts, merged.
    fn merged(&self, keep: impl Fn(&BootKey) -> bool) -> BootTimes {
        let mut all = BootTimes::default();
        for (_, t) in self.keys.iter().filter(|(k, _)| keep(k)) {
            all.merge(t);
        }
        all
    }
}

/// This window and the one before it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Baselines {
    pub length: SignedDuration,
    pub current: Window,
    pub previous: Option<Window>,
}

fn secs(from: Timestamp, to: Timestamp) -> f64 {
    to.duration_since(from).as_secs_f64().max(0.0)
}

impl Baselines {
    pub fn new(start: Timestamp, length: SignedDuration) -> Self {
        Self {
            length,
            current: Window::new(start),
            previous: None,
        }
    }

    /// Starts a new window when `now` is past the current one. A window that ended more than
    /// one window ago is no "previous window" to compare with: it is dropped.
    pub fn roll(&mut self, now: Timestamp) {
        let len = self.length.max(SignedDuration::from_secs(1));
        let elapsed = now.duration_since(self.current.start);
        if elapsed < len {
            return;
        }
        let windows = elapsed.as_secs() / len.as_secs();
        let start = crate::later(
            self.current.start,
            len * i32::try_from(windows).unwrap_or(i32::MAX),
        );
        let ended = std::mem::replace(&mut self.current, Window::new(start));
        self.previous = (windows == 1).then_some(ended);
    }

    pub fn record(&mut self, sample: &BootSample) {
        self.roll(sample.node_at);
        let w = &mut self.current;
        if !w.keys.contains_key(&sample.key) && w.keys.len() >= MAX_KEYS {
            w.dropped += 1;
            return;
        }
        let t = w.keys.entry(sample.key.clone()).or_default();
        t.from_creation.add(secs(sample.created, sample.node_at));
        if let Some(running) = sample.vm_running {
            t.from_running.add(secs(running, sample.node_at));
        }
    }

    /// One row per key of the current window.
    pub fn rows(&self) -> Vec<BaselineRow> {
        self.current
            .keys
            .iter()
            .map(|(k, t)| BaselineRow {
                key: k.clone(),
                count: t.from_creation.count(),
                from_creation: Summary::of(&t.from_creation),
                from_running: Summary::of(&t.from_running),
            })
            .collect()
    }
}

/// p50/p95/max of one sketch, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub count: u64,
    pub p50: f64,
    pub p95: f64,
    pub max: f64,
}

impl Summary {
    pub fn of(s: &Sketch) -> Option<Self> {
        Some(Self {
            count: s.count(),
            p50: s.quantile(0.5)?,
            p95: s.quantile(0.95)?,
            max: s.max()?,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaselineRow {
    pub key: BootKey,
    pub count: u64,
    pub from_creation: Option<Summary>,
    pub from_running: Option<Summary>,
}

/// A MachineHealthCheck and the keys of the Machines it selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MhcCoverage {
    /// `namespace/name`.
    pub name: String,
    pub node_startup_timeout: SignedDuration,
    pub covers: Vec<BootKey>,
}

/// When a baseline is worth a warning.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarnPolicy {
    /// The timeout should exceed p95 × this (e.g. 1.5).
    pub margin: f64,
    /// Keys (or templates) with fewer samples in a window say nothing yet.
    pub min_samples: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "warning", rename_all = "kebab-case")]
pub enum Warning {
    /// `nodeStartupTimeout` is below the p95 × margin of creation → Node of some key the MHC
    /// covers: it will recycle healthy-but-slow VMs. Names the slowest such key.
    MhcTimeoutBelowBoot {
        mhc: String,
        timeout_secs: i64,
        key: BootKey,
        p95_secs: f64,
        margin: f64,
    },
    /// A template's p95 creation → Node at least doubled against the previous window.
    TemplateSlower {
        template: String,
        p95_secs: f64,
        previous_p95_secs: f64,
    },
}

/// The warnings of the current window: one per MHC at most, then one per template at most.
pub fn warnings(b: &Baselines, mhcs: &[MhcCoverage], policy: WarnPolicy) -> Vec<Warning> {
    let mut out = Vec::new();
    for mhc in mhcs {
        let timeout = mhc.node_startup_timeout.as_secs_f64();
        let slowest = mhc
            .covers
            .iter()
            .filter_map(|k| {
                let s = &b.current.keys.get(k)?.from_creation;
                (s.count() >= policy.min_samples).then(|| (k, s.quantile(0.95)))
            })
            .filter_map(|(k, p95)| Some((k, p95?)))
            .filter(|(_, p95)| timeout < p95 * policy.margin)
            .max_by(|a, b| a.1.total_cmp(&b.1));
        if let Some((key, p95)) = slowest {
            out.push(Warning::MhcTimeoutBelowBoot {
                mhc: mhc.name.clone(),
                timeout_secs: mhc.node_startup_timeout.as_secs(),
                key: key.clone(),
                p95_secs: p95,
                margin: policy.margin,
            });
        }
    }
    let Some(previous) = &b.previous else {
        return out;
    };
    let templates: std::collections::BTreeSet<&str> =
        b.current.keys.keys().map(|k| k.template.as_str()).collect();
    for template in templates {
        let p95_of = |w: &Window| {
            let s = w.merged(|k| k.template == template).from_creation;
            (s.count() >= policy.min_samples)
                .then(|| s.quantile(0.95))
                .flatten()
        };
        if let (Some(now), Some(before)) = (p95_of(&b.current), p95_of(previous)) {
            if now >= 2.0 * before {
                out.push(Warning::TemplateSlower {
                    template: template.to_string(),
                    p95_secs: now,
                    previous_p95_secs: before,
                });
            }
        }
    }
    out
}

mod pairs {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serializer};

    use super::{BootKey, BootTimes};

    pub fn serialize<S: Serializer>(
        m: &BTreeMap<BootKey, BootTimes>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        s.collect_seq(m.iter())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<BTreeMap<BootKey, BootTimes>, D::Error> {
        Ok(Vec::<(BootKey, BootTimes)>::deserialize(d)?
            .into_iter()
            .collect())
    }
}
