//! Phase 1 of a cycle, gather: the watched objects joined into targets (with our own last
//! writes laid over a lagging cache), each target's CloudStack endpoint read from its Secret,
//! and one [`ScopeState`] per endpoint scope, kept between cycles with its client and the VM
//! histories.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use futures::stream::{self, StreamExt};
use jiff::{SignedDuration, Timestamp};

use super::budget::{self, Phase};
use super::credentials::{self, Account, Resolved};
use super::cycle::{Controller, CycleSummary, Written};
use super::targets::{EndpointRef, Target};
use crate::cli::to_std;
use crate::cloudstack::client::CloudStackClient;
use crate::cloudstack::client::VmListQuery;
use crate::k8s::watched::{CloudStackMachineRecord, MachineRecord};
use crate::scope::{ListedVm, Scope, ScopeObserver};
use crate::status::ScopeReport;
use crate::verdict::{ConditionState, VmHistory};

/// One CloudStack scope — API URL × credentials × project × zone, as CloudStack sees it: its
/// client (with its own rate limit and back-off), the histories of the VMs polled through it,
/// and what `/status` shows of it. Secrets that carry the same credentials share one scope;
/// different keys (another tenant, or a broken key) get scopes of their own.
pub(super) struct ScopeState {
    /// The scope as polled (client, listing, VM histories): the type `check` uses too.
    pub polled: Scope,
    pub report: ScopeReport,
    /// The endpoint (Secret, project, zone) it was made for.
    pub endpoint: EndpointRef,
    /// The CloudStack account it lists as: its client shares the account's rate-limit budget.
    pub account: Account,
    /// The client's `verify-ssl`: not part of the scope's identity, so a change rebuilds the
    /// client in place.
    verify_tls: bool,
    /// Some Machine of this cycle is polled through this scope.
    pub in_use: bool,
    last_in_use: Timestamp,
    /// Failed polls in a row, for the back-off.
    pub failed_polls: u32,
    /// Every VM of this cycle's listing, when it was complete (kept for the orphan report).
    pub listing: Option<Vec<ListedVm>>,
}

/// What an endpoint's Secret last gave: the scope it is polled through, and since when reading
/// the Secret has failed. A read that fails briefly keeps the last client and evidence.
#[derive(Debug, Clone)]
pub(super) struct EndpointMemory {
    scope: String,
    failing_since: Option<Timestamp>,
}

/// How long a scope no Machine uses keeps its histories: a Secret deleted and recreated (or a
/// failure domain briefly gone) must not restart every grace.
const SCOPE_RETENTION: SignedDuration = SignedDuration::from_hours(1);

/// What the gather phase found.
pub(super) struct Gathered {
    /// Shared with the kept joins: a target is copied only when our write is laid over it.
    pub targets: Vec<Arc<Target>>,
    /// The scope key each usable endpoint is polled through.
    pub scope_of: HashMap<EndpointRef, String>,
    /// Endpoints whose credentials cannot be had, with why (no Secret values in it) and since
    /// when reading them has failed, when this process knew the endpoint before.
    pub credential_errors: HashMap<EndpointRef, (String, Option<Timestamp>)>,
    /// Every watched CloudStackMachine with its failure domain's endpoint (orphan report on).
    pub cloudstack_machines: Vec<(Arc<CloudStackMachineRecord>, Option<Arc<EndpointRef>>)>,
    /// Endpoints polled through another scope than before — a new key —, as (old, new) scope
    /// keys: the orphan report follows the CloudStackMachines it remembers to the new one.
    pub rotations: Vec<(String, String)>,
    /// Machines deleted since the last cycle, as they last were (the scorecard reads who
    /// recycled one that went between two cycles).
    pub departed: Vec<MachineRecord>,
}

impl Gathered {
    /// The scope key of a target, when its endpoint is usable.
    pub fn scope_key(&self, t: &Target) -> Option<&String> {
        t.endpoint.as_ref().and_then(|e| self.scope_of.get(e))
    }
}

fn scope_key(api_url: &str, credentials: &str, e: &EndpointRef) -> String {
    format!(
        "{api_url} project={} zone={} key={credentials}",
        e.project.as_deref().unwrap_or("-"),
        e.zone_id.as_deref().unwrap_or("-")
    )
}

/// Per scope this cycle: the VMs to track, those whose statistics are wanted, and the
/// Secrets (`namespace/name`) that feed it.
#[derive(Default)]
struct ScopeWants<'a> {
    ids: HashSet<&'a str>,
    stats_wanted: BTreeSet<&'a str>,
    secrets: BTreeSet<String>,
}

impl Controller {
    pub(super) async fn gather(&mut self, now: Timestamp, summary: &mut CycleSummary) -> Gathered {
        let changed = self.stores.take_changed();
        let departed = self.stores.machines.take_departed();
        let mut targets = self
            .targets
            .update(&self.stores, &changed, &self.args.namespaces);
        summary.machines = targets.len();
        self.lay_our_writes_over(&mut targets);

        // Per endpoint: every VM to track, and those of Machines without a Node — the only
        // ones whose traffic statistics are asked (they cost CloudStack a sum over stored rows).
        // (Borrowed from this cycle's targets: nothing is copied per Machine.)
        let mut by_endpoint: BTreeMap<&EndpointRef, (Vec<&str>, BTreeSet<&str>)> = BTreeMap::new();
        for t in &targets {
            if let (Some(e), Some(id), None) = (&t.endpoint, t.instance_id(), &t.problem) {
                let (ids, stats_wanted) = by_endpoint.entry(&**e).or_default();
                ids.push(id);
                if !t.machine.has_node_ref {
                    stats_wanted.insert(id);
                }
            }
        }
        // The orphan report lists scopes where Machines are being created, or were.
        let cloudstack_machines = self.orphan_candidates();
        let orphan_endpoints = self.orphan_endpoints(&cloudstack_machines);
        for endpoint in &orphan_endpoints {
            by_endpoint.entry(endpoint).or_default();
        }
        for scope in self.scopes.values_mut() {
            scope.in_use = false;
        }
        let mut scope_of = HashMap::new();
        let mut credential_errors = HashMap::new();
        let mut wants: BTreeMap<String, ScopeWants> = BTreeMap::new();
        let mut rotations = Vec::new();
        let mut reads = read_all_credentials(
            &self.client,
            &self.args,
            read_order(by_endpoint.keys().copied(), &self.endpoints),
        )
        .await;
        for (endpoint, (ids, stats_wanted)) in &by_endpoint {
            let read = reads
                .remove(*endpoint)
                .unwrap_or_else(|| Err(not_read_in_time(endpoint, &self.args)));
            let before = self.endpoints.get(*endpoint).map(|m| m.scope.clone());
            let key = match self.scope_for(endpoint, read, now) {
                Ok(key) => key,
                Err(e) => match self.recent_scope(endpoint, now) {
                    // One failed read is not news: the last client polls on, verdicts stand.
                    Some(key) => {
                        summary.problems.push(format!(
                            "{e} (polling with the credentials read last; its Machines turn \
                             Unknown/CredentialsUnavailable if this lasts over {})",
                            crate::verdict::human_duration(self.graces.stale_after())
                        ));
                        key
                    }
                    None => {
                        let since = self.endpoints.get(endpoint).and_then(|m| m.failing_since);
                        summary.problems.push(format!(
                            "{e} (its Machines keep the conditions they carry for up to {} \
                             after this process first failed to read it, then turn \
                             Unknown/CredentialsUnavailable)",
                            crate::verdict::human_duration(self.graces.stale_after())
                        ));
                        credential_errors.insert((*endpoint).clone(), (e, since));
                        continue;
                    }
                },
            };
            if let Some(old) = before.filter(|old| *old != key) {
                rotations.push((old, key.clone()));
            }
            let w = wants.entry(key.clone()).or_default();
            w.ids.extend(ids.iter().copied());
            w.stats_wanted.extend(stats_wanted.iter().copied());
            w.secrets.insert(format!(
                "{}/{}",
                endpoint.secret_namespace, endpoint.secret_name
            ));
            scope_of.insert((*endpoint).clone(), key);
        }
        // Every endpoint that shares a scope adds its VMs: one listing serves them all.
        for (key, w) in wants {
            let scope = self.scopes.get_mut(&key).expect("scope_for keeps it");
            track_exactly(&mut scope.polled.observer, &w.ids);
            scope.polled.observer.stats_wanted =
                Some(w.stats_wanted.into_iter().map(str::to_string).collect());
            scope.report.secrets = w.secrets.into_iter().collect();
        }
        self.endpoints.retain(|e, _| by_endpoint.contains_key(e));
        self.scopes
            .retain(|_, s| s.in_use || now.duration_since(s.last_in_use) < SCOPE_RETENTION);
        summary.scopes = self.scopes.values().filter(|s| s.in_use).count();
        Gathered {
            targets,
            scope_of,
            credential_errors,
            cloudstack_machines,
            rotations,
            departed,
        }
    }

    /// The watch cache can lag behind our own writes: while it still shows the version a write
    /// of ours was based on, that write is what the Machine carries.
    fn lay_our_writes_over(&mut self, targets: &mut [Arc<Target>]) {
        if self.written.is_empty() {
            return;
        }
        let live: BTreeSet<&String> = targets
            .iter()
            .filter_map(|t| t.machine.uid.as_ref())
            .collect();
        self.written.retain(|uid, _| live.contains(uid));
        for t in targets.iter_mut() {
            let Some(uid) = t.machine.uid.as_ref() else {
                continue;
            };
            let (current, lagging) = current_condition(
                t.current.as_ref(),
                t.machine.resource_version.as_deref(),
                self.written.get(uid),
            );
            if lagging {
                let current = current.cloned();
                Arc::make_mut(t).current = current;
            } else {
                self.written.remove(uid);
            }
        }
    }

    /// The scope `endpoint` is polled through (created when its credentials, `read`, are new),
    /// marked in use. `Err` says why its credentials cannot be had.
    fn scope_for(
        &mut self,
        endpoint: &EndpointRef,
        read: Result<Resolved, String>,
        now: Timestamp,
    ) -> Result<String, String> {
        let resolved = match read {
            Ok(read) => read,
            Err(e) => {
                if let Some(m) = self.endpoints.get_mut(endpoint) {
                    m.failing_since.get_or_insert(now);
                }
                return Err(e);
            }
        };
        let Resolved {
            cfg, account, id, ..
        } = resolved;
        let key = scope_key(cfg.api_url.as_str(), &id, endpoint);
        let cant = |e: crate::cloudstack::CloudStackError| {
            format!(
                "Secret {}/{}: {e}",
                endpoint.secret_namespace, endpoint.secret_name
            )
        };
        if let Some(scope) = self.scopes.get_mut(&key) {
            // The first endpoint of the cycle decides the settings: Secrets that disagree do
            // not rebuild the client back and forth.
            if !scope.in_use && scope.verify_tls != cfg.verify_tls {
                let verify_tls = cfg.verify_tls;
                let client = CloudStackClient::new(cfg)
                    .map_err(cant)?
                    .sharing_rate_limit(&scope.polled.client);
                scope.polled.client = client;
                scope.verify_tls = verify_tls;
            }
        } else {
            let verify_tls = cfg.verify_tls;
            // One rate limit per CloudStack account, whatever zone or project a scope lists,
            // and the guest probe's when it uses the same key.
            let prober = self.probing.client();
            let client = credentials::client_of_account(
                cfg,
                &account,
                self.scopes
                    .values()
                    .map(|s| (&s.account, &s.polled.client))
                    .chain(prober),
            )
            .map_err(cant)?;
            // A rotated key gets a scope of its own, but keeps the histories its endpoint had:
            // a rotation must not restart every grace.
            let previous = self.endpoints.get(endpoint).map(|m| m.scope.clone());
            let mut observer = previous
                .and_then(|old| self.scopes.get(&old))
                .map(|s| s.polled.observer.clone())
                .unwrap_or_else(|| ScopeObserver::tracking(Vec::new()));
            // The orphan report reads the listings, and the remnant report the states of the
            // deleting CloudStackMachines' VMs in them.
            observer.keep_listing = self.orphans.is_some() || self.remnants.is_some();
            let report = ScopeReport {
                key: key.clone(),
                api_url: client.api_url().to_string(),
                ..Default::default()
            };
            self.scopes.insert(
                key.clone(),
                ScopeState {
                    polled: Scope::new(client, listing_query(endpoint), observer, true),
                    report,
                    endpoint: endpoint.clone(),
                    account,
                    verify_tls,
                    in_use: true,
                    last_in_use: now,
                    failed_polls: 0,
                    listing: None,
                },
            );
        }
        self.endpoints.insert(
            endpoint.clone(),
            EndpointMemory {
                scope: key.clone(),
                failing_since: None,
            },
        );
        Ok(self.mark_in_use(&key, now))
    }

    fn mark_in_use(&mut self, key: &str, now: Timestamp) -> String {
        let scope = self.scopes.get_mut(key).expect("present");
        scope.in_use = true;
        scope.last_in_use = now;
        key.to_string()
    }

    /// The scope an endpoint whose Secret cannot be read right now was polled through, while
    /// the failure is younger than the API-trouble grace (`--stale-poll-intervals` polls).
    fn recent_scope(&mut self, endpoint: &EndpointRef, now: Timestamp) -> Option<String> {
        let m = self.endpoints.get(endpoint)?;
        let since = m.failing_since?;
        if now.duration_since(since) > self.graces.stale_after() {
            return None;
        }
        let key = m.scope.clone();
        self.scopes
            .contains_key(&key)
            .then(|| self.mark_in_use(&key, now))
    }
}

/// Every endpoint's credentials, read at once ([`budget::CONCURRENT_CALLS`] at a time) within
/// the Secret reads' share of `--poll-deadline`: an endpoint whose Secret is not read in time
/// has a credential error of its own — its Machines stand on their record — and holds up no
/// other. (Free of the controller, so that the reads borrow only the client and the flags.)
async fn read_all_credentials<'e>(
    client: &kube::Client,
    args: &super::RunArgs,
    endpoints: Vec<&'e EndpointRef>,
) -> HashMap<&'e EndpointRef, Result<Resolved, String>> {
    let window = budget::Window::start(Phase::SecretReads, to_std(args.poll_deadline));
    stream::iter(endpoints)
        .map(|e| async move {
            let read = window
                .call(credentials(client, args, e))
                .await
                .unwrap_or_else(|| Err(not_read_in_time(e, args)));
            (e, read)
        })
        .buffer_unordered(budget::CONCURRENT_CALLS)
        .collect()
        .await
}

/// The order endpoints' Secrets are read in: those whose last read did not fail first, so that
/// Secrets that hang (or fail) queue behind the ones that answer, not ahead of them.
fn read_order<'e>(
    endpoints: impl Iterator<Item = &'e EndpointRef>,
    memory: &HashMap<EndpointRef, EndpointMemory>,
) -> Vec<&'e EndpointRef> {
    let mut order: Vec<&EndpointRef> = endpoints.collect();
    order.sort_by_key(|e| memory.get(*e).is_some_and(|m| m.failing_since.is_some()));
    order
}

/// The credential error of an endpoint whose Secret reads did not finish in time: a failed
/// read like any other (the Machines' records stand through the API-trouble grace).
fn not_read_in_time(e: &EndpointRef, args: &super::RunArgs) -> String {
    let budget = budget::budget(Phase::SecretReads, to_std(args.poll_deadline));
    format!(
        "Secret {}/{} (or its --endpoint-credentials override): not read in time (within {}, \
         this cycle's share of --poll-deadline for Secret reads)",
        e.secret_namespace,
        e.secret_name,
        crate::verdict::human_duration(SignedDuration::try_from(budget).unwrap_or_default())
    )
}

/// Reads the endpoint's Secret (and the operator's override for that URL) into a client
/// configuration. Errors name Secrets and keys, never values.
async fn credentials(
    client: &kube::Client,
    args: &super::RunArgs,
    e: &EndpointRef,
) -> Result<Resolved, String> {
    credentials::read(client, args, &e.secret_namespace, &e.secret_name, true).await
}

/// What the Machine's condition is, given the watch cache's view and our last write: while the
/// cache still shows the version our write was based on — or an older one (a relist from a
/// lagging cache) — it lags and our write is newer; once it shows a newer version, the cache
/// is the truth — even if another writer dropped or changed our condition (then it is written
/// again).
fn current_condition<'a>(
    cached: Option<&'a Arc<ConditionState>>,
    cached_version: Option<&str>,
    written: Option<&'a Written>,
) -> (Option<&'a Arc<ConditionState>>, bool) {
    match written {
        Some(w) if not_newer(cached_version, w.based_on.as_deref()) => (Some(&w.condition), true),
        _ => (cached, false),
    }
}

/// Whether the resourceVersion `cached` is no newer than `base`: the same, or a lower etcd
/// revision. Versions that do not parse as numbers compare by equality only.
fn not_newer(cached: Option<&str>, base: Option<&str>) -> bool {
    if cached == base {
        return true;
    }
    let number = |v: Option<&str>| v.and_then(|v| v.parse::<u64>().ok());
    matches!((number(cached), number(base)), (Some(c), Some(b)) if c < b)
}

/// The listing of an endpoint's scope: its zone, and its project — a project name cannot be
/// sent as `projectid`, so then every project the key sees (`-1`) is listed and matched by VM
/// id, which is what decides anyway.
fn listing_query(endpoint: &EndpointRef) -> VmListQuery {
    VmListQuery {
        project_id: endpoint
            .project
            .clone()
            .map(|p| if is_uuid(&p) { p } else { "-1".to_string() }),
        zone_id: endpoint.zone_id.clone(),
        ..Default::default()
    }
}

fn is_uuid(s: &str) -> bool {
    s.len() == 36 && uuid::Uuid::try_parse(s).is_ok()
}

/// Tracks exactly `ids` in `observer`: new ones get an empty history, gone ones are dropped.
fn track_exactly(observer: &mut ScopeObserver, ids: &HashSet<&str>) {
    observer.histories.retain(|id, _| ids.contains(id.as_str()));
    for &id in ids {
        if !observer.histories.contains_key(id) {
            observer
                .histories
                .insert(id.to_string(), Box::new(VmHistory::new(id)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::{reason, Status};

    #[test]
    fn a_project_name_lists_every_project_and_a_uuid_is_sent_as_is() {
        let endpoint = |project: Option<&str>| EndpointRef {
            secret_namespace: "ns".into(),
            secret_name: "s".into(),
            project: project.map(str::to_string),
            zone_id: Some("z1".into()),
        };
        let id = "1d8d87d4-1425-459c-8d81-c6f57dca2bd2";
        let q = listing_query(&endpoint(Some(id)));
        assert_eq!(
            (q.project_id.as_deref(), q.zone_id.as_deref()),
            (Some(id), Some("z1"))
        );
        assert_eq!(
            listing_query(&endpoint(Some("team-a")))
                .project_id
                .as_deref(),
            Some("-1")
        );
        assert_eq!(listing_query(&endpoint(None)).project_id, None);
    }

    fn condition(status: Status, reason: &'static str) -> ConditionState {
        ConditionState {
            type_: "CloudStackVMHealthy".into(),
            status,
            reason: reason.into(),
            message: String::new(),
            last_transition_time: "2026-12-01T00:00:00Z".parse().unwrap(),
        }
    }

    #[test]
    fn our_write_counts_only_while_the_cache_lags_behind_it() {
        let ours = Written {
            condition: condition(Status::False, reason::VM_ERROR).into(),
            based_on: Some("41".into()),
        };
        let cached = Arc::new(condition(Status::True, reason::VM_HEALTHY));
        // The cache still shows the version we wrote on top of: ours is newer.
        let (c, lagging) = current_condition(Some(&cached), Some("41"), Some(&ours));
        assert!(lagging);
        assert_eq!(c, Some(&ours.condition));
        // A relist from a lagging cache serves a version older than the one we wrote on: ours
        // is still newer.
        let (c, lagging) = current_condition(Some(&cached), Some("39"), Some(&ours));
        assert!(lagging);
        assert_eq!(c, Some(&ours.condition));
        // The cache moved on (our write, or someone's after it): it is the truth, also when
        // another writer dropped our condition.
        let (c, lagging) = current_condition(None, Some("57"), Some(&ours));
        assert!(!lagging);
        assert_eq!(c, None);
        let (c, _) = current_condition(Some(&cached), Some("57"), None);
        assert_eq!(c, Some(&cached));
    }

    #[test]
    fn secrets_that_failed_last_are_read_last() {
        let e = |name: &str| EndpointRef {
            secret_namespace: "ns".into(),
            secret_name: name.into(),
            project: None,
            zone_id: None,
        };
        let (a, b, c, d) = (e("a"), e("b"), e("c"), e("d"));
        let memory = |failing: bool| EndpointMemory {
            scope: "k".into(),
            failing_since: failing.then(Timestamp::now),
        };
        let known: HashMap<EndpointRef, EndpointMemory> = [
            (a.clone(), memory(true)),
            (b.clone(), memory(false)),
            (c.clone(), memory(true)),
        ]
        .into();
        // d is new: it has not failed yet.
        let order = read_order([&a, &b, &c, &d].into_iter(), &known);
        assert_eq!(order, [&b, &d, &a, &c]);
    }

    #[test]
    fn tracking_follows_the_targets_of_the_cycle() {
        let mut o = ScopeObserver::tracking(vec!["a".to_string(), "b".to_string()]);
        track_exactly(&mut o, &["b", "c"].into());
        let mut ids: Vec<&String> = o.histories.keys().collect();
        ids.sort();
        assert_eq!(ids, ["b", "c"]);
    }
}
