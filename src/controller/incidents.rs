//! Phase 5b of a cycle, incidents (issue 45): per scope, the VMs of its Machines — failing
//! (`False`, or held by the mass-failure guard) or not — into [`verdict::incidents::find`];
//! an incident whose best network candidate has not been looked up gets its one
//! `listRouters` (within [`Phase::IncidentLookups`], counted in the call metrics), and the
//! finding is made again with the network's router. The [`IncidentBook`] says what opened,
//! changed or ended: a Warning Event on each affected Cluster once per incident and cause, the
//! `capc_health_incidents` series, an ended incident into the scorecard's window, and the
//! `/status` `incidents[]` handed to the report.

use std::collections::{BTreeMap, BTreeSet};

use jiff::Timestamp;
use k8s_openapi::api::core::v1::ObjectReference;

use super::budget::{Phase, Window};
use super::cycle::{Controller, CycleSummary};
use super::decide::Decided;
use super::gather::Gathered;
use super::writer::{EventNote, Job};
use crate::cli::to_std;
use crate::metrics::IncidentLabels;
use crate::status::{IncidentReport, INCIDENT_MACHINES_SHOWN};
use crate::verdict::history::Sighting;
use crate::verdict::incidents::book::{
    apply_lookup, cause_kind_label, network_to_look_up, Change, Lookup,
};
use crate::verdict::incidents::{find, Incident, Policy, RouterFacts, Thing, VmFacts};
use crate::verdict::{reason, ConditionState, Status};
use cloudstack_api::model::Router;

/// The reason of the Warning Event an incident puts on each affected Cluster.
pub const INCIDENT_EVENT_REASON: &str = "IncidentCause";

/// A condition that counts as failing in an incident: `False`, or a `False` the mass-failure
/// guard holds back (published `Unknown/RemediationHeld`).
pub fn is_failing(c: &ConditionState) -> bool {
    c.status == Status::False || c.reason == reason::REMEDIATION_HELD
}

/// One scope's VMs this cycle (as last seen, failing or not), with the Machines and Clusters
/// behind its failing ones.
#[derive(Debug, Default)]
struct ScopeVms<'s> {
    seen: Vec<(&'s Sighting, bool)>,
    affected: Affected,
}

/// The failing Machines of a scope and their Clusters.
#[derive(Debug, Default)]
struct Affected {
    failing_machines: Vec<String>,
    clusters: BTreeSet<String>,
}

impl ScopeVms<'_> {
    /// What the incident finder compares; made only for scopes that may have an incident, so
    /// that a calm fleet pays for a count, not for copies.
    fn facts(&self) -> Vec<VmFacts> {
        self.seen
            .iter()
            .map(|(s, failing)| VmFacts::from_sighting(s, *failing))
            .collect()
    }
}

/// The router facts an incident is after, from what `listRouters` returned.
pub fn router_facts(r: &Router) -> RouterFacts {
    RouterFacts {
        router: if r.name.trim().is_empty() {
            Thing::new(r.id.clone())
        } else {
            Thing::named(r.id.clone(), r.name.clone())
        },
        state: Some(r.state.as_str().to_string()),
        host: r.hostid.clone().filter(|h| !h.trim().is_empty()),
    }
}

/// The Event an affected Cluster gets: the incident's line and where to read on.
pub fn event_note(scope: &str, incident: &Incident) -> String {
    // The summary names a cause by its name; CloudStack's API finds it by id.
    let id = incident
        .cause
        .as_ref()
        .filter(|c| c.name.as_deref().is_some_and(|n| n != c.id))
        .map(|c| format!(" ({} id {})", c.kind.as_str(), c.id))
        .unwrap_or_default();
    format!(
        "Incident in CloudStack scope {scope}: {}{id}. `capc-health-shim status` and /status \
         incidents[] show the candidates; docs/alerts.md has the runbook per cause.",
        incident.summary()
    )
}

impl Controller {
    /// The incident phase; returns what `/status` shows.
    pub(super) async fn find_incidents(
        &mut self,
        g: &Gathered,
        d: &Decided,
        now: Timestamp,
        summary: &mut CycleSummary,
    ) -> Vec<IncidentReport> {
        let policy = Policy {
            min_failing: self.args.incident_min_failing as usize,
            ..Policy::default()
        };
        let by_scope = self.scope_vms(g, d);
        // Scopes whose poll failed this cycle keep their incident as it was: not seeing is no
        // reason to say it ended. The others are judged; only those that may have an incident
        // (guard held, enough failing, or one open) have their VMs compared.
        let mut facts: BTreeMap<String, Vec<VmFacts>> = BTreeMap::new();
        let mut found: BTreeMap<String, Option<Incident>> = BTreeMap::new();
        for (key, s) in &by_scope {
            let Some(scope) = self.scopes.get(key) else {
                continue;
            };
            if scope.report.last_error.is_some() {
                continue;
            }
            let held = scope.report.held;
            let open = self.incidents.lookup(key).is_some()
                || self.incidents.open().any(|(k, _)| k == key);
            if !(held || open || s.affected.failing_machines.len() >= policy.min_failing) {
                found.insert(key.clone(), None);
                continue;
            }
            let vms = s.facts();
            found.insert(key.clone(), find(&vms, &policy, held));
            facts.insert(key.clone(), vms);
        }
        // What follows changes the controller: the sightings are let go.
        let affected: BTreeMap<String, Affected> =
            by_scope.into_iter().map(|(k, s)| (k, s.affected)).collect();
        let lookups = self.look_up_routers(&found).await;
        for (key, lookup) in &lookups {
            if let Some(vms) = facts.get_mut(key) {
                apply_lookup(vms, lookup);
                let held = self.scopes.get(key).is_some_and(|s| s.report.held);
                found.insert(key.clone(), find(vms, &policy, held));
            }
        }
        // Lookups made earlier in this incident apply to this cycle's VMs too.
        for (key, incident) in found.iter_mut() {
            if lookups.contains_key(key) || incident.is_none() {
                continue;
            }
            if let (Some(lookup), Some(vms)) = (self.incidents.lookup(key), facts.get_mut(key)) {
                apply_lookup(vms, lookup);
                let held = self.scopes.get(key).is_some_and(|s| s.report.held);
                *incident = find(vms, &policy, held);
            }
        }
        let mut lookups = lookups;
        for (key, incident) in found {
            let change = self
                .incidents
                .step(&key, incident, lookups.remove(&key), now);
            self.note_change(&key, change);
        }
        // Scopes that no longer exist end theirs; scopes not judged (poll failed) keep theirs.
        let present: BTreeSet<&str> = affected.keys().map(String::as_str).collect();
        for ended in self.incidents.end_others(&present, now) {
            self.note_change(&ended.scope.clone(), Change::Ended(Box::new(ended)));
        }
        self.tell_clusters(&affected, summary);
        self.incident_reports(&affected)
    }

    /// Per scope in use, its Machines' VMs as last seen, failing or not.
    fn scope_vms<'s>(&'s self, g: &Gathered, d: &Decided) -> BTreeMap<String, ScopeVms<'s>> {
        let mut out: BTreeMap<String, ScopeVms<'s>> = BTreeMap::new();
        for (i, t) in g.targets.iter().enumerate() {
            let Some(key) = g.scope_key(t) else { continue };
            let Some(scope) = self.scopes.get(key) else {
                continue;
            };
            let entry = out.entry(key.clone()).or_default();
            let sighting = t
                .instance_id()
                .and_then(|id| scope.polled.observer.histories.get(id))
                .and_then(|h| h.sighting.as_ref());
            let Some(sighting) = sighting else { continue };
            let decided = if d.first_write_held[i] {
                None
            } else {
                d.conditions[i].as_ref()
            };
            let failing = decided.or(t.current.as_deref()).is_some_and(is_failing);
            if failing {
                entry
                    .affected
                    .failing_machines
                    .push(format!("{}/{}", t.machine.namespace, t.machine.name));
                entry.affected.clusters.insert(format!(
                    "{}/{}",
                    t.machine.namespace, t.machine.cluster_name
                ));
            }
            entry.seen.push((sighting, failing));
        }
        out
    }

    /// One `listRouters` per incident that has none yet and a network to ask about, all at
    /// once within the phase's budget; each counted in the call metrics.
    async fn look_up_routers(
        &self,
        found: &BTreeMap<String, Option<Incident>>,
    ) -> BTreeMap<String, Lookup> {
        let wanted: Vec<(&String, String)> = found
            .iter()
            .filter(|(k, _)| self.incidents.lookup(k).is_none())
            .filter_map(|(k, i)| Some((k, network_to_look_up(i.as_ref()?)?.to_string())))
            .collect();
        if wanted.is_empty() {
            return BTreeMap::new();
        }
        let window = Window::start(Phase::IncidentLookups, to_std(self.args.poll_deadline));
        let asks = wanted.iter().filter_map(|(key, network)| {
            let client = &self.scopes.get(*key)?.polled.client;
            let window = &window;
            Some(async move {
                let before = client.stats();
                let answer = window.call(client.routers_of_network(network)).await;
                super::poll::record_call_deltas(&self.metrics, &before, &client.stats());
                let lookup = match answer {
                    Some(Ok(listing)) => Lookup::Done {
                        network: network.clone(),
                        routers: listing.items.iter().map(router_facts).collect(),
                    },
                    Some(Err(e)) => Lookup::Failed {
                        network: network.clone(),
                        error: e.to_string(),
                    },
                    None => Lookup::Failed {
                        network: network.clone(),
                        error: "listRouters did not answer within the incident lookups' share \
                                of --poll-deadline"
                            .to_string(),
                    },
                };
                ((*key).clone(), lookup)
            })
        });
        futures::future::join_all(asks).await.into_iter().collect()
    }

    fn note_change(&mut self, scope: &str, change: Change) {
        match change {
            Change::Quiet
            | Change::Continues {
                cause_changed: false,
            } => {}
            Change::Opened
            | Change::Continues {
                cause_changed: true,
            } => {
                if let Some((_, open)) = self.incidents.open().find(|(k, _)| k.as_str() == scope) {
                    tracing::warn!(scope, since = %open.since,
                        cause_kind = cause_kind_label(open.incident.cause.as_ref()),
                        lookup = ?open.lookup,
                        "incident: {}", open.incident.summary());
                }
            }
            Change::Ended(ended) => {
                tracing::info!(scope, since = %ended.since, until = %ended.until,
                    peak_failing = ended.peak_failing,
                    "incident ended (fewer failing than --incident-min-failing and not held \
                     by the mass-failure guard): {}", ended.summary);
                self.scorecard.remember_incident(*ended);
            }
        }
    }

    /// A Warning Event on each affected Cluster not yet told of its incident's cause.
    fn tell_clusters(&mut self, by_scope: &BTreeMap<String, Affected>, summary: &mut CycleSummary) {
        let known = self.stores.clusters.state();
        let mut jobs = Vec::new();
        let open: Vec<(String, String)> = self
            .incidents
            .open()
            .map(|(k, o)| (k.clone(), event_note(k, &o.incident)))
            .collect();
        for (scope, note) in open {
            let Some(s) = by_scope.get(&scope) else {
                continue;
            };
            for cluster in self
                .incidents
                .untold(&scope, s.clusters.iter().map(String::as_str))
            {
                let Some((namespace, name)) = cluster.split_once('/') else {
                    continue;
                };
                let uid = known
                    .iter()
                    .find(|c| c.namespace == namespace && c.name == name)
                    .and_then(|c| c.uid.clone());
                jobs.push(Job::Event {
                    reference: Box::new(ObjectReference {
                        api_version: Some(self.resources.cluster.api_version.clone()),
                        kind: Some("Cluster".into()),
                        namespace: Some(namespace.to_string()),
                        name: Some(name.to_string()),
                        uid,
                        ..Default::default()
                    }),
                    related: None,
                    event: EventNote {
                        warning: true,
                        reason: INCIDENT_EVENT_REASON.into(),
                        note: note.clone(),
                    },
                });
            }
        }
        for job in jobs {
            self.enqueue(job, summary);
        }
    }

    /// `/status` `incidents[]`, and the series brought up to them.
    fn incident_reports(&self, by_scope: &BTreeMap<String, Affected>) -> Vec<IncidentReport> {
        let mut series = BTreeMap::new();
        let reports = self
            .incidents
            .open()
            .map(|(scope, open)| {
                let i = &open.incident;
                series.insert(
                    IncidentLabels {
                        scope: scope.clone(),
                        cause_kind: cause_kind_label(i.cause.as_ref()).to_string(),
                    },
                    i.failing as i64,
                );
                let s = by_scope.get(scope);
                IncidentReport {
                    scope: scope.clone(),
                    since: open.since,
                    trigger: i.trigger,
                    failing: i.failing,
                    healthy: i.healthy,
                    machines: s
                        .map(|s| {
                            s.failing_machines
                                .iter()
                                .take(INCIDENT_MACHINES_SHOWN)
                                .cloned()
                                .collect()
                        })
                        .unwrap_or_default(),
                    clusters: s
                        .map(|s| s.clusters.iter().cloned().collect())
                        .unwrap_or_default(),
                    cause: i.cause.clone(),
                    candidates: i.candidates.clone(),
                    summary: i.summary(),
                    router_lookup: open.lookup.clone(),
                }
            })
            .collect();
        self.metrics.set_incidents(&series);
        reports
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(status: Status, reason: &str) -> ConditionState {
        ConditionState {
            type_: "CloudStackVMHealthy".into(),
            status,
            reason: reason.into(),
            message: String::new(),
            last_transition_time: Timestamp::UNIX_EPOCH,
        }
    }

    #[test]
    fn false_and_held_verdicts_fail_unknown_and_true_do_not() {
        assert!(is_failing(&condition(Status::False, "VMError")));
        assert!(is_failing(&condition(
            Status::Unknown,
            reason::REMEDIATION_HELD
        )));
        assert!(!is_failing(&condition(Status::Unknown, "PollFailed")));
        assert!(!is_failing(&condition(Status::True, "VMHealthy")));
    }

    #[test]
    fn a_router_without_a_name_goes_by_its_id_and_keeps_its_state_and_host() {
        let r: Router = serde_json::from_value(serde_json::json!({
            "id": "r-1", "name": "", "state": "Stopped", "hostid": ""
        }))
        .unwrap();
        let f = router_facts(&r);
        assert_eq!(f.router, Thing::new("r-1"));
        assert_eq!(f.state.as_deref(), Some("Stopped"));
        assert_eq!(f.host, None);
        let r: Router = serde_json::from_value(serde_json::json!({
            "id": "r-2", "name": "r-2-VM", "state": "Running", "hostid": "h-7"
        }))
        .unwrap();
        let f = router_facts(&r);
        assert_eq!(f.router.name.as_deref(), Some("r-2-VM"));
        assert_eq!(f.host.as_deref(), Some("h-7"));
    }
}
