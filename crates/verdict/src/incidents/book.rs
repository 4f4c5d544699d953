//! Incidents across cycles: when a scope's incident opens, what its one router lookup found,
//! which Clusters were told of which cause, and when it ends — the failing set fell below
//! the threshold and the guard no longer holds the scope ([`find`](super::find) returns
//! nothing), or the scope is gone. Pure: the controller feeds each cycle's findings and does
//! the I/O (the lookup, the Events, the series) from what comes back.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use super::{Cause, CauseKind, Incident, RouterFacts, VmFacts};

/// The one router lookup an incident may make, and what it gave.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum Lookup {
    /// `listRouters` for the incident's best network candidate answered.
    Done {
        network: String,
        routers: Vec<RouterFacts>,
    },
    /// It was asked and failed (refused, timed out): the routers stay unknown for this
    /// incident; the network is named in their place when it explains the failures.
    Failed { network: String, error: String },
}

/// A scope's open incident.
#[derive(Debug, Clone, PartialEq)]
pub struct OpenIncident {
    pub since: Timestamp,
    /// This cycle's finding.
    pub incident: Incident,
    /// The most Machines failing at once so far.
    pub peak_failing: usize,
    pub lookup: Option<Lookup>,
    /// (Cluster, cause key) pairs already told by an Event.
    told: BTreeSet<(String, String)>,
}

/// An incident that ended: what the scorecard window remembers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndedIncident {
    pub scope: String,
    pub since: Timestamp,
    pub until: Timestamp,
    pub peak_failing: usize,
    /// The last named cause (`None`: no shared cause explained them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
    pub summary: String,
}

/// What a cycle's finding did to a scope's incident.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// Nothing open, nothing found.
    Quiet,
    Opened,
    /// Still open; `cause_changed` when the named cause is another than last cycle's.
    Continues {
        cause_changed: bool,
    },
    Ended(Box<EndedIncident>),
}

/// The open incidents by scope.
#[derive(Debug, Clone, Default)]
pub struct IncidentBook {
    open: BTreeMap<String, OpenIncident>,
}

/// `kind:id` of a named cause, `none` when nothing shared explains the failures.
pub fn cause_key(c: Option<&Cause>) -> String {
    match c {
        Some(c) => format!("{}:{}", c.kind.as_str(), c.id),
        None => "none".to_string(),
    }
}

/// The label a named cause goes by in series and alerts (`none` when unexplained).
pub fn cause_kind_label(c: Option<&Cause>) -> &'static str {
    c.map_or("none", |c| c.kind.as_str())
}

impl IncidentBook {
    /// The scope's lookup, if its open incident made one: the next cycle reuses it.
    pub fn lookup(&self, scope: &str) -> Option<&Lookup> {
        self.open.get(scope)?.lookup.as_ref()
    }

    /// Records this cycle's finding for `scope` (with the lookup made for it this cycle, if
    /// one was).
    pub fn step(
        &mut self,
        scope: &str,
        found: Option<Incident>,
        lookup: Option<Lookup>,
        now: Timestamp,
    ) -> Change {
        match (self.open.get_mut(scope), found) {
            (None, None) => Change::Quiet,
            (Some(_), None) => self
                .end(scope, now)
                .map_or(Change::Quiet, |e| Change::Ended(Box::new(e))),
            (None, Some(incident)) => {
                self.open.insert(
                    scope.to_string(),
                    OpenIncident {
                        since: now,
                        peak_failing: incident.failing,
                        incident,
                        lookup,
                        told: BTreeSet::new(),
                    },
                );
                Change::Opened
            }
            (Some(open), Some(incident)) => {
                let cause_changed =
                    cause_key(open.incident.cause.as_ref()) != cause_key(incident.cause.as_ref());
                open.peak_failing = open.peak_failing.max(incident.failing);
                open.incident = incident;
                if lookup.is_some() {
                    open.lookup = lookup;
                }
                Change::Continues { cause_changed }
            }
        }
    }

    /// Ends the incidents of scopes not in `seen` (the scope is gone, or was not judged this
    /// cycle because nothing could be seen of it: an incident is not kept open blind).
    pub fn end_others(&mut self, seen: &BTreeSet<&str>, now: Timestamp) -> Vec<EndedIncident> {
        let gone: Vec<String> = self
            .open
            .keys()
            .filter(|k| !seen.contains(k.as_str()))
            .cloned()
            .collect();
        gone.iter().filter_map(|k| self.end(k, now)).collect()
    }

    fn end(&mut self, scope: &str, now: Timestamp) -> Option<EndedIncident> {
        let open = self.open.remove(scope)?;
        Some(EndedIncident {
            scope: scope.to_string(),
            since: open.since,
            until: now,
            peak_failing: open.peak_failing,
            summary: open.incident.summary(),
            cause: open.incident.cause,
        })
    }

    /// Of `clusters` (the affected Clusters of `scope`'s incident), those not yet told of its
    /// current cause; they count as told from now on. Once per incident and cause.
    pub fn untold<'c>(
        &mut self,
        scope: &str,
        clusters: impl IntoIterator<Item = &'c str>,
    ) -> Vec<String> {
        let Some(open) = self.open.get_mut(scope) else {
            return Vec::new();
        };
        let key = cause_key(open.incident.cause.as_ref());
        clusters
            .into_iter()
            .filter(|c| open.told.insert((c.to_string(), key.clone())))
            .map(str::to_string)
            .collect()
    }

    pub fn open(&self) -> impl Iterator<Item = (&String, &OpenIncident)> {
        self.open.iter()
    }
}

/// The network whose routers an incident should look up: its best network candidate, when
/// it has one (a stopped router covers exactly its network's VMs, so the network ranks
/// with it).
pub fn network_to_look_up(incident: &Incident) -> Option<&str> {
    incident
        .candidates
        .iter()
        .find(|c| c.kind == CauseKind::Network)
        .map(|c| c.id.as_str())
}

/// Gives every VM on the looked-up network its router. With a redundant pair the one that
/// serves is the Running one (`PRIMARY` first); with none Running, the first listed.
pub fn apply_lookup(vms: &mut [VmFacts], lookup: &Lookup) {
    let Lookup::Done { network, routers } = lookup else {
        return;
    };
    let running = |r: &&RouterFacts| {
        r.state
            .as_deref()
            .is_some_and(|s| s.trim().eq_ignore_ascii_case("Running"))
    };
    let Some(router) = routers
        .iter()
        .find(running)
        .or_else(|| routers.first())
        .cloned()
    else {
        return;
    };
    for vm in vms
        .iter_mut()
        .filter(|v| v.network.as_ref().is_some_and(|n| &n.id == network))
    {
        vm.router = Some(router.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::super::{find, Policy, Thing};
    use super::*;

    fn vm(failing: bool, network: &str, host: &str) -> VmFacts {
        VmFacts {
            failing,
            host: Some(Thing::new(host)),
            network: Some(Thing::new(network)),
            template: Some(Thing::new("ubuntu")),
            zone: Some(Thing::new("zone-a")),
            ..Default::default()
        }
    }

    /// 6 failing VMs on net-a spread over 3 hosts, 20 healthy on net-b over the same hosts.
    fn storm() -> Vec<VmFacts> {
        let mut vms: Vec<VmFacts> = (0..6)
            .map(|i| vm(true, "net-a", &format!("h{}", i % 3)))
            .collect();
        vms.extend((0..20).map(|i| vm(false, "net-b", &format!("h{}", i % 3))));
        vms
    }

    fn t(s: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + s).unwrap()
    }

    #[test]
    fn the_lookup_names_the_stopped_router_of_the_failing_network() {
        let mut vms = storm();
        let policy = Policy::default();
        let first = find(&vms, &policy, false).expect("an incident");
        assert_eq!(first.cause.as_ref().unwrap().kind, CauseKind::Network);
        assert_eq!(network_to_look_up(&first), Some("net-a"));
        let lookup = Lookup::Done {
            network: "net-a".into(),
            routers: vec![RouterFacts {
                router: Thing::named("r-1", "r-123-VM"),
                state: Some("Stopped".into()),
                host: None,
            }],
        };
        apply_lookup(&mut vms, &lookup);
        let second = find(&vms, &policy, false).unwrap();
        let c = second.cause.unwrap();
        assert_eq!((c.kind, c.id.as_str()), (CauseKind::Router, "r-1"));
        assert_eq!(c.state.as_deref(), Some("Stopped"));
        assert_eq!((c.failing, c.healthy), (6, 0));
    }

    #[test]
    fn a_redundant_pair_is_represented_by_its_running_router() {
        let mut vms = storm();
        let router = |id: &str, state: &str| RouterFacts {
            router: Thing::new(id),
            state: Some(state.into()),
            host: None,
        };
        apply_lookup(
            &mut vms,
            &Lookup::Done {
                network: "net-a".into(),
                routers: vec![router("r-b", "Stopped"), router("r-p", "Running")],
            },
        );
        assert_eq!(vms[0].router.as_ref().unwrap().router.id, "r-p");
        // VMs of other networks get no router.
        assert!(vms[10].router.is_none());
        // A failed lookup gives none.
        let mut vms = storm();
        apply_lookup(
            &mut vms,
            &Lookup::Failed {
                network: "net-a".into(),
                error: "refused".into(),
            },
        );
        assert!(vms.iter().all(|v| v.router.is_none()));
    }

    #[test]
    fn an_incident_opens_continues_changes_cause_and_ends() {
        let mut book = IncidentBook::default();
        let policy = Policy::default();
        let vms = storm();
        assert_eq!(book.step("s", None, None, t(0)), Change::Quiet);
        let found = find(&vms, &policy, false);
        assert_eq!(book.step("s", found.clone(), None, t(1)), Change::Opened);
        assert_eq!(
            book.step("s", found.clone(), None, t(2)),
            Change::Continues {
                cause_changed: false
            }
        );
        let mut with_router = vms.clone();
        let lookup = Lookup::Done {
            network: "net-a".into(),
            routers: vec![RouterFacts {
                router: Thing::new("r-1"),
                state: Some("Stopped".into()),
                host: None,
            }],
        };
        apply_lookup(&mut with_router, &lookup);
        let changed = find(&with_router, &policy, false);
        assert_eq!(
            book.step("s", changed, Some(lookup.clone()), t(3)),
            Change::Continues {
                cause_changed: true
            }
        );
        assert_eq!(book.lookup("s"), Some(&lookup));
        // Below the threshold: find gives nothing, the incident ends.
        let calm: Vec<VmFacts> = vms.iter().skip(3).cloned().collect();
        assert!(find(&calm, &policy, false).is_none());
        match book.step("s", None, None, t(9)) {
            Change::Ended(e) => {
                assert_eq!((e.since, e.until, e.peak_failing), (t(1), t(9), 6));
                assert_eq!(e.cause.unwrap().id, "r-1");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(book.open().count(), 0);
        assert_eq!(book.step("s", None, None, t(10)), Change::Quiet);
    }

    #[test]
    fn each_cluster_is_told_once_per_incident_and_cause() {
        let mut book = IncidentBook::default();
        let policy = Policy::default();
        let vms = storm();
        book.step("s", find(&vms, &policy, false), None, t(0));
        assert_eq!(book.untold("s", ["ns/a", "ns/b"]), vec!["ns/a", "ns/b"]);
        assert!(book.untold("s", ["ns/a", "ns/b"]).is_empty());
        assert_eq!(book.untold("s", ["ns/b", "ns/c"]), vec!["ns/c"]);
        // A new cause: told again.
        let mut with_router = vms.clone();
        let lookup = Lookup::Done {
            network: "net-a".into(),
            routers: vec![RouterFacts {
                router: Thing::new("r-1"),
                state: Some("Stopped".into()),
                host: None,
            }],
        };
        apply_lookup(&mut with_router, &lookup);
        book.step("s", find(&with_router, &policy, false), None, t(1));
        assert_eq!(book.untold("s", ["ns/a"]), vec!["ns/a"]);
        // After it ends and a new one opens, told again.
        book.step("s", None, None, t(2));
        book.step("s", find(&vms, &policy, false), None, t(3));
        assert_eq!(book.untold("s", ["ns/a"]), vec!["ns/a"]);
        // No open incident: nobody to tell.
        assert!(book.untold("other", ["ns/a"]).is_empty());
    }

    #[test]
    fn scopes_not_judged_end_their_incidents() {
        let mut book = IncidentBook::default();
        let vms = storm();
        let found = find(&vms, &Policy::default(), false);
        book.step("a", found.clone(), None, t(0));
        book.step("b", found, None, t(0));
        let ended = book.end_others(&BTreeSet::from(["a"]), t(5));
        assert_eq!(ended.len(), 1);
        assert_eq!(ended[0].scope, "b");
        assert_eq!(
            book.open().map(|(k, _)| k.as_str()).collect::<Vec<_>>(),
            ["a"]
        );
    }

    #[test]
    fn keys_and_labels_say_none_when_nothing_is_named() {
        assert_eq!(cause_key(None), "none");
        assert_eq!(cause_kind_label(None), "none");
    }
}
