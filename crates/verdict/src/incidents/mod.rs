//! Incidents (issue 45 item 1): when many Machines of one scope fail at once, the one thing
//! their VMs share — host, CloudStack cluster or pod, guest network, the network's virtual
//! router, template, service offering or zone — or the plain statement that nothing shared
//! explains them. Pure: the controller passes one scope's VMs at a cycle, each marked failing
//! (its Machine's verdict is `False`, or held as `RemediationHeld`) or not, with what the
//! listings (and at most one router/host lookup) say about it.
//!
//! # The score and the rule
//!
//! Every attribute value `v` shared by at least one failing VM is a candidate. With `F` failing
//! and `H` healthy VMs in the scope, `f` of the failing and `h` of the healthy sharing `v`:
//!
//! - coverage among the failing `f / F`, among the healthy `h / H`;
//! - **score** `f / (F + h)`: the failing VMs that share `v` over everything that is either
//!   failing or shares `v` (the Jaccard index of the two sets). It is 1 exactly when the
//!   failing VMs are the VMs of `v`; every failing VM that `v` does not explain and every
//!   healthy VM that shares `v` lowers it.
//!
//! - **contrast**: the share of `v`'s VMs that fail, `f / (f + h)`, minus the share of the
//!   scope's other VMs that fail, `(F − f) / (N − f − h)` (−1 when every VM of the scope
//!   shares `v`: then `v` says nothing the scope does not).
//!
//! The best candidate is **named** when its score is at least [`Policy::min_score`] (0.5),
//! its contrast at least [`Policy::min_contrast`] (0.5) and at least [`Policy::min_shared`]
//! (3) failing VMs share it. Otherwise the incident says that no shared cause explains the
//! failures, and still lists the best candidates with their numbers.
//!
//! The rule comes from the benchmark (`make bench` section 7, `make bench-incidents` alone:
//! 100 generated storms per kind — host, router, network, template, zone — in fleets of
//! 100–2 000 VMs with 0–15 % of the cause's VMs healthy and 0–5 independent failures, 500
//! sets of independent failures of the storms' sizes and 500 of the threshold's size). There
//! this rule named the right cause in 499 of 500 storms, never a wrong one, and no cause for
//! any set of independent failures. Against the alternatives, on the same storms:
//!
//! - score ≥ 0.6 or ≥ 0.7: recall 0.992 or 0.944 (storms whose cause keeps some healthy VMs,
//!   with noise);
//! - no contrast: 12 of 500 sets of independent failures got a cause (when most of a
//!   single-zone fleet fails, the zone scores high);
//! - the coverage rule "at least 80 % of the failing, at most 20 % of the healthy": recall
//!   0.940 (noise pushes a small storm under 80 %; a zone storm that takes most of the scope
//!   leaves its few healthy VMs over 20 % of the healthy) and 2 causes for 500 sets of 5
//!   independent failures; it stays available in [`Policy`] for that comparison.
//!
//! A score of 0.5 implies at least half of the failing VMs share the value and at least half
//! of the VMs sharing it fail.
//!
//! # Ties and nesting
//!
//! Nested attributes often cover exactly the same VMs: the VMs behind a router are the VMs
//! of its network; a host's VMs are its cluster's when the cluster has one host. Candidates
//! are ordered by score (compared exactly, in integers), then:
//!
//! 1. a candidate whose own state is bad (host unreachable — `Offline`, `Unknown`,
//!    `Disconnected` — or in `Maintenance`, router not `Running`) before one whose state is
//!    fine or unknown;
//! 2. the more specific kind, in the order of [`CauseKind::ALL`]: host, router, network,
//!    cluster, pod, template, offering, zone — except that a router known to be Running
//!    comes after its network (a network can lose its uplink behind a Running router);
//! 3. the id, so that the result never depends on input order.
//!
//! # Cost
//!
//! One pass over the VMs with at most eight counters each (`O(VMs × attributes)`), one pass
//! over the candidates keeping the best [`TOP`]; nothing sorts the whole candidate set.

use std::cmp::Ordering;
use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use cloudstack_api::model::{HostControlState, VirtualMachine};

pub mod book;
pub mod storms;

#[cfg(test)]
mod props;
#[cfg(test)]
mod tests;

/// Candidates an incident lists, best first.
pub const TOP: usize = 3;

/// What kind of thing a cause is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CauseKind {
    Host,
    Router,
    Network,
    Cluster,
    Pod,
    Template,
    Offering,
    Zone,
}

impl CauseKind {
    /// Most specific first: the order ties are broken in.
    pub const ALL: [CauseKind; 8] = [
        Self::Host,
        Self::Router,
        Self::Network,
        Self::Cluster,
        Self::Pod,
        Self::Template,
        Self::Offering,
        Self::Zone,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Host => "host",
            Self::Router => "router",
            Self::Network => "network",
            Self::Cluster => "cluster",
            Self::Pod => "pod",
            Self::Template => "template",
            Self::Offering => "offering",
            Self::Zone => "zone",
        }
    }

    /// Position in the specificity order, in halves so that a Running router can sit
    /// between network and cluster.
    fn rank(self, known_fine: bool) -> u8 {
        let base = 2 * self as u8;
        match self {
            // After Network (4), before Cluster (6).
            Self::Router if known_fine => 5,
            _ => base,
        }
    }
}

/// A thing a VM runs on or from: its id and, when known, its name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Thing {
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Thing {
    pub fn new(id: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            name: None,
        }
    }

    pub fn named(id: impl Into<String>, name: impl Into<String>) -> Self {
        Self {
            id: id.into(),
            name: Some(name.into()),
        }
    }

    /// From an id and a name either of which may be missing or blank; the name stands in
    /// for the id when only it is known (templates and offerings are listed by name).
    fn from_parts(id: Option<&str>, name: Option<&str>) -> Option<Self> {
        fn clean(s: Option<&str>) -> Option<&str> {
            s.map(str::trim).filter(|s| !s.is_empty())
        }
        let (id, name) = (clean(id), clean(name));
        Some(Self {
            id: id.or(name)?.to_string(),
            name: name.map(str::to_string),
        })
    }
}

/// A guest network's virtual router as one lookup (`listRouters`) saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouterFacts {
    pub router: Thing,
    /// `Running`, `Stopped`, `Starting`, … (`VirtualMachine.State`).
    pub state: Option<String>,
    /// The host it runs on (none when Stopped).
    pub host: Option<String>,
}

impl RouterFacts {
    fn state_bad(&self) -> Option<bool> {
        self.state
            .as_deref()
            .map(|s| !s.trim().eq_ignore_ascii_case("Running"))
    }
}

/// One VM of the scope at this cycle: failing or not, and what it shares with others.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VmFacts {
    /// Its Machine's verdict is `False` (or a `False` held by the mass-failure guard).
    pub failing: bool,
    pub host: Option<Thing>,
    pub host_state: Option<HostControlState>,
    pub cluster: Option<Thing>,
    pub pod: Option<Thing>,
    /// The default NIC's network.
    pub network: Option<Thing>,
    /// That network's virtual router, when a lookup found one.
    pub router: Option<RouterFacts>,
    pub template: Option<Thing>,
    pub offering: Option<Thing>,
    pub zone: Option<Thing>,
}

impl VmFacts {
    /// What a listing says about a VM (no router, cluster or pod: those need a lookup).
    pub fn from_vm(vm: &VirtualMachine, failing: bool) -> Self {
        let nic = match vm.nics.as_slice() {
            [only] => Some(only),
            nics => nics.iter().find(|n| n.isdefault),
        };
        Self {
            failing,
            host: Thing::from_parts(vm.hostid.as_deref(), vm.hostname.as_deref()),
            host_state: vm.hostcontrolstate.clone(),
            cluster: None,
            pod: None,
            network: nic.and_then(|n| Thing::from_parts(n.networkid.as_deref(), None)),
            router: None,
            template: Thing::from_parts(None, vm.templatename.as_deref()),
            offering: Thing::from_parts(None, vm.serviceofferingname.as_deref()),
            zone: Thing::from_parts(vm.zoneid.as_deref(), vm.zonename.as_deref()),
        }
    }

    /// What the shim last saw of a VM (its [`Sighting`](crate::history::Sighting)): the same
    /// facts as [`VmFacts::from_vm`], kept between cycles.
    pub fn from_sighting(s: &crate::history::Sighting, failing: bool) -> Self {
        Self {
            failing,
            host: Thing::from_parts(s.host_id.as_deref(), s.host_name.as_deref()),
            host_state: s.host_control.clone(),
            cluster: None,
            pod: None,
            network: Thing::from_parts(s.network_id.as_deref(), None).map(|mut t| {
                t.name = s.network_name.clone().filter(|n| !n.trim().is_empty());
                t
            }),
            router: None,
            template: Thing::from_parts(None, s.template.as_deref()),
            offering: Thing::from_parts(None, s.offering.as_deref()),
            zone: Thing::from_parts(None, s.zone.as_deref()),
        }
    }

    /// Each attribute the VM has, as (kind, id).
    fn attributes(&self) -> impl Iterator<Item = (CauseKind, &Thing)> {
        [
            (CauseKind::Host, self.host.as_ref()),
            (CauseKind::Router, self.router.as_ref().map(|r| &r.router)),
            (CauseKind::Network, self.network.as_ref()),
            (CauseKind::Cluster, self.cluster.as_ref()),
            (CauseKind::Pod, self.pod.as_ref()),
            (CauseKind::Template, self.template.as_ref()),
            (CauseKind::Offering, self.offering.as_ref()),
            (CauseKind::Zone, self.zone.as_ref()),
        ]
        .into_iter()
        .filter_map(|(k, t)| Some((k, t?)))
    }
}

/// When an incident is declared and when its cause is named (see the module's docs).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    /// Failing VMs in a scope that make an incident without the guard (`--incident-min-failing`).
    pub min_failing: usize,
    /// The score a cause needs to be named.
    pub min_score: f64,
    /// The share of its VMs that fail must exceed the share of the scope's other VMs that fail
    /// by at least this much.
    pub min_contrast: f64,
    /// A cause shared by fewer failing VMs than this is not named.
    pub min_shared: usize,
    /// Coverage limits (failing at least, healthy at most): off by default (0 and 1), kept to
    /// measure the rule they make against the default one (`make bench`, section "incidents").
    pub min_failing_coverage: f64,
    pub max_healthy_coverage: f64,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            min_failing: 5,
            min_score: 0.5,
            min_contrast: 0.5,
            min_shared: 3,
            min_failing_coverage: 0.0,
            max_healthy_coverage: 1.0,
        }
    }
}

/// Why the scope has an incident.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Trigger {
    /// The mass-failure guard holds the scope.
    GuardHeld,
    /// At least [`Policy::min_failing`] VMs fail.
    Threshold,
}

/// A candidate cause with its numbers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cause {
    pub kind: CauseKind,
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The host's control state or the router's state, as the first VM sharing it saw it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// A router's host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Failing VMs sharing it, and healthy VMs sharing it.
    pub failing: usize,
    pub healthy: usize,
    /// `failing / F` and `healthy / H` (0 when the scope has no healthy VM).
    pub failing_coverage: f64,
    pub healthy_coverage: f64,
    /// `failing / (F + healthy)`.
    pub score: f64,
    /// The share of its VMs that fail minus the share of the scope's other VMs that fail (-1
    /// when it is shared by every VM of the scope: nothing to contrast it with).
    pub contrast: f64,
}

/// One scope's incident at a cycle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Incident {
    pub trigger: Trigger,
    /// Failing and healthy VMs in the scope.
    pub failing: usize,
    pub healthy: usize,
    /// The named cause; `None`: no shared cause explains them.
    pub cause: Option<Cause>,
    /// The best candidates (at most [`TOP`]), best first, named or not.
    pub candidates: Vec<Cause>,
}

impl Incident {
    /// One line for Events, logs and `capc-health-shim status`.
    pub fn summary(&self) -> String {
        match &self.cause {
            Some(c) => format!(
                "{} of {} failing Machines share {} {}{}{}; {} of {} healthy ones do",
                c.failing,
                self.failing,
                c.kind.as_str(),
                c.name.as_deref().unwrap_or(&c.id),
                c.state
                    .as_deref()
                    .map(|s| format!(" (state {s})"))
                    .unwrap_or_default(),
                c.host
                    .as_deref()
                    .map(|h| format!(" on host {h}"))
                    .unwrap_or_default(),
                c.healthy,
                self.healthy
            ),
            None => {
                let best = self
                    .candidates
                    .first()
                    .map(|c| {
                        format!(
                            "; the closest, {} {}, covers {} of them and {} of {} healthy",
                            c.kind.as_str(),
                            c.name.as_deref().unwrap_or(&c.id),
                            c.failing,
                            c.healthy,
                            self.healthy
                        )
                    })
                    .unwrap_or_default();
                format!(
                    "{} Machines failing: no shared cause explains them{best}",
                    self.failing
                )
            }
        }
    }
}

/// Per candidate while counting.
struct Tally<'a> {
    kind: CauseKind,
    thing: &'a Thing,
    failing: usize,
    healthy: usize,
    /// Its own state is bad (Some(true)), fine (Some(false)) or unknown.
    bad: Option<bool>,
    state: Option<String>,
    host: Option<&'a str>,
}

/// Score as a fraction `failing / (F + healthy)`, compared exactly.
fn cmp_score(a: &Tally, b: &Tally, f_total: usize) -> Ordering {
    let (an, ad) = (a.failing as u128, (f_total + a.healthy) as u128);
    let (bn, bd) = (b.failing as u128, (f_total + b.healthy) as u128);
    (an * bd).cmp(&(bn * ad))
}

/// `Less` when `a` is the better candidate.
fn better(a: &Tally, b: &Tally, f_total: usize) -> Ordering {
    cmp_score(b, a, f_total)
        .then_with(|| (b.bad == Some(true)).cmp(&(a.bad == Some(true))))
        .then_with(|| {
            a.kind
                .rank(a.bad == Some(false))
                .cmp(&b.kind.rank(b.bad == Some(false)))
        })
        .then_with(|| a.thing.id.cmp(&b.thing.id))
}

/// The scope's incident, if it has one: when `guard_held`, or when at least
/// `policy.min_failing` of `vms` fail.
pub fn find(vms: &[VmFacts], policy: &Policy, guard_held: bool) -> Option<Incident> {
    let f_total = vms.iter().filter(|v| v.failing).count();
    let h_total = vms.len() - f_total;
    let trigger = if guard_held {
        Trigger::GuardHeld
    } else if f_total >= policy.min_failing.max(1) {
        Trigger::Threshold
    } else {
        return None;
    };
    if f_total == 0 {
        return None;
    }
    let mut tallies: HashMap<(CauseKind, &str), Tally> = HashMap::new();
    // Healthy VMs only count towards values some failing VM has: count failing first.
    for pass_failing in [true, false] {
        for vm in vms.iter().filter(|v| v.failing == pass_failing) {
            for (kind, thing) in vm.attributes() {
                let key = (kind, thing.id.as_str());
                if pass_failing {
                    let t = tallies.entry(key).or_insert_with(|| {
                        let (bad, state, host) = own_state(vm, kind);
                        Tally {
                            kind,
                            thing,
                            failing: 0,
                            healthy: 0,
                            bad,
                            state,
                            host,
                        }
                    });
                    t.failing += 1;
                } else if let Some(t) = tallies.get_mut(&key) {
                    t.healthy += 1;
                }
            }
        }
    }
    // The best TOP, by one pass.
    let mut top: Vec<&Tally> = Vec::with_capacity(TOP + 1);
    for t in tallies.values() {
        let pos = top.partition_point(|b| better(b, t, f_total) == Ordering::Less);
        if pos < TOP {
            top.insert(pos, t);
            top.truncate(TOP);
        }
    }
    let candidates: Vec<Cause> = top.iter().map(|t| to_cause(t, f_total, h_total)).collect();
    let cause = candidates.first().filter(|c| names(c, policy)).cloned();
    Some(Incident {
        trigger,
        failing: f_total,
        healthy: h_total,
        cause,
        candidates,
    })
}

/// Whether the rule names this candidate (see the module's docs).
pub fn names(c: &Cause, policy: &Policy) -> bool {
    c.score >= policy.min_score
        && c.contrast >= policy.min_contrast
        && c.failing >= policy.min_shared
        && c.failing_coverage >= policy.min_failing_coverage
        && c.healthy_coverage <= policy.max_healthy_coverage
}

fn own_state(vm: &VmFacts, kind: CauseKind) -> (Option<bool>, Option<String>, Option<&str>) {
    match kind {
        CauseKind::Host => match &vm.host_state {
            Some(s) => (
                Some(s.is_unreachable() || *s == HostControlState::Maintenance),
                Some(s.as_str().to_string()),
                None,
            ),
            None => (None, None, None),
        },
        CauseKind::Router => match &vm.router {
            Some(r) => (r.state_bad(), r.state.clone(), r.host.as_deref()),
            None => (None, None, None),
        },
        _ => (None, None, None),
    }
}

fn to_cause(t: &Tally, f_total: usize, h_total: usize) -> Cause {
    let ratio = |n: usize, d: usize| if d == 0 { 0.0 } else { n as f64 / d as f64 };
    Cause {
        kind: t.kind,
        id: t.thing.id.clone(),
        name: t.thing.name.clone(),
        state: t.state.clone(),
        host: t.host.map(str::to_string),
        failing: t.failing,
        healthy: t.healthy,
        failing_coverage: ratio(t.failing, f_total),
        healthy_coverage: ratio(t.healthy, h_total),
        score: ratio(t.failing, f_total + t.healthy),
        contrast: {
            let others = f_total + h_total - t.failing - t.healthy;
            if others == 0 {
                -1.0
            } else {
                ratio(t.failing, t.failing + t.healthy) - ratio(f_total - t.failing, others)
            }
        },
    }
}
