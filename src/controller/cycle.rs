//! One poll cycle of the controller: gather (watched objects, credentials) → poll (one
//! listing per scope) → decide (verdict engine, mass-failure guard, escalation guards — all
//! pure) → act (condition, annotation, Events) → report (`/status`).

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use futures::stream::{self, StreamExt};
use jiff::{SignedDuration, Timestamp};
use kube::Client;
use tokio::sync::RwLock;

use super::config::RunArgs;
use super::kube_io::{self, Events, Resources, Stores};
use super::targets::{self, EndpointRef, Objects, Target, TargetProblem};
use crate::cli::to_std;
use crate::cloudstack::client::{ClientConfig, CloudStackClient, VmListQuery};
use crate::cloudstack::ratelimit::RateLimit;
use crate::k8s::capi::ApiChoice;
use crate::k8s::escalation::{self, Escalation, EscalationFacts};
use crate::k8s::objects::{matching_node, well_known};
use crate::metrics::Metrics;
use crate::scope::ScopeObserver;
use crate::status::{ClusterReport, FailureDomainReport, MachineReport, ScopeReport, StatusReport};
use crate::verdict::condition::{is_unchanged, needs_event, next_condition};
use crate::verdict::{
    evaluate, reason, ConditionState, Graces, MachineFacts, MassFailureGuard, ScopeMember, Status,
    Verdict,
};

/// The reason for Machines whose CloudStack credentials cannot be had.
pub const CREDENTIALS_UNAVAILABLE: &str = "CredentialsUnavailable";

struct ScopeState {
    client: CloudStackClient,
    fingerprint: u64,
    observer: ScopeObserver,
    usage_history: bool,
    report: ScopeReport,
    /// Some Machine of this cycle is polled through this scope.
    in_use: bool,
    last_in_use: Timestamp,
    /// Failed polls in a row, for the back-off.
    failed_polls: u32,
}

/// How long a scope no Machine uses keeps its histories: a Secret deleted and recreated (or a
/// failure domain briefly gone) must not restart every grace.
const SCOPE_RETENTION: SignedDuration = SignedDuration::from_hours(1);

/// Poll intervals to wait after `failed` polls of a scope failed in a row: 1, 2, then 4 — fewer
/// calls into an outage or a 429 storm (each poll retries already), without going blind for long.
pub fn backoff_intervals(failed: u32) -> i32 {
    1 << failed.saturating_sub(1).min(2)
}

/// The controller's state between cycles.
pub struct Controller {
    client: Client,
    args: RunArgs,
    api: ApiChoice,
    resources: Resources,
    stores: Stores,
    events: Events,
    graces: Graces,
    guard: MassFailureGuard,
    report: Arc<RwLock<StatusReport>>,
    metrics: Arc<Metrics>,
    scopes: BTreeMap<String, ScopeState>,
    /// What this process last wrote per Machine uid: the watch cache can lag behind our own
    /// writes, and a lagging read must not cause a second write.
    written: HashMap<String, Written>,
}

/// A condition this process wrote, and the version of the Machine it was based on.
#[derive(Debug, Clone)]
struct Written {
    condition: ConditionState,
    based_on: Option<String>,
}

/// What the Machine's condition is, given the watch cache's view and our last write: while the
/// cache still shows the version our write was based on, it lags and our write is newer; once
/// it shows any other version, the cache is the truth — even if another writer dropped or
/// changed our condition (then it is written again).
fn current_condition<'a>(
    cached: Option<&'a ConditionState>,
    cached_version: Option<&str>,
    written: Option<&'a Written>,
) -> (Option<&'a ConditionState>, bool) {
    match written {
        Some(w) if w.based_on.as_deref() == cached_version => (Some(&w.condition), true),
        _ => (cached, false),
    }
}

/// What a cycle did, for logs and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CycleSummary {
    pub machines: usize,
    pub scopes: usize,
    pub condition_writes: usize,
    pub annotations: usize,
    pub problems: Vec<String>,
}

fn fingerprint(data: &BTreeMap<String, String>) -> u64 {
    let mut h = DefaultHasher::new();
    for k in ["api-url", "api-key", "secret-key", "verify-ssl"] {
        data.get(k).hash(&mut h);
    }
    h.finish()
}

fn is_uuid(s: &str) -> bool {
    s.len() == 36 && s.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}

fn scope_key(api_url: &str, e: &EndpointRef) -> String {
    format!(
        "{api_url} project={} zone={}",
        e.project.as_deref().unwrap_or("-"),
        e.zone_id.as_deref().unwrap_or("-")
    )
}

impl Controller {
    pub fn new(
        client: Client,
        args: RunArgs,
        api: ApiChoice,
        resources: Resources,
        stores: Stores,
        report: Arc<RwLock<StatusReport>>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let graces = args.graces.graces(args.poll_interval);
        let guard = args.graces.guard();
        let events = Events::new(&client, &resources.machine);
        Self {
            client,
            args,
            api,
            resources,
            stores,
            events,
            graces,
            guard,
            report,
            metrics,
            scopes: BTreeMap::new(),
            written: HashMap::new(),
        }
    }

    /// Reads the endpoint's Secret (and the operator's override for that URL) into a client
    /// configuration. Errors name Secrets and keys, never values.
    async fn credentials(
        &self,
        e: &EndpointRef,
    ) -> Result<(BTreeMap<String, String>, ClientConfig), String> {
        let mut data =
            kube_io::secret_data(&self.client, &e.secret_namespace, &e.secret_name).await?;
        if let Some(url) = data.get("api-url").map(|u| u.trim().to_string()) {
            if let Some(o) = self
                .args
                .endpoint_credentials
                .iter()
                .find(|o| o.api_url == url)
            {
                let over = kube_io::secret_data(&self.client, &o.namespace, &o.name).await?;
                for k in ["api-key", "secret-key", "verify-ssl"] {
                    if let Some(v) = over.get(k) {
                        data.insert(k.to_string(), v.clone());
                    }
                }
            }
        }
        let mut cfg = ClientConfig::from_secret_data(&data)
            .map_err(|err| format!("Secret {}/{}: {err}", e.secret_namespace, e.secret_name))?;
        cfg.request_timeout = to_std(self.args.request_timeout);
        cfg.rate_limit = (self.args.rate_limit > 0.0).then(|| RateLimit {
            per_second: self.args.rate_limit,
            burst: (self.args.rate_limit.ceil() as u32).max(1) * 2,
        });
        Ok((data, cfg))
    }

    /// Runs one cycle at `now`.
    pub async fn cycle(&mut self, now: Timestamp) -> CycleSummary {
        let mut summary = CycleSummary::default();
        let targets = targets::build(
            &Objects {
                machines: &self.stores.machines.state(),
                cloudstack_machines: &self.stores.cloudstack_machines.state(),
                failure_domains: &self.stores.failure_domains.state(),
                clusters: &self.stores.clusters.state(),
                health_checks: &self.stores.health_checks.state(),
            },
            &self.args.namespaces,
        );
        summary.machines = targets.len();
        let mut targets = targets;
        let live_uids: BTreeSet<String> = targets
            .iter()
            .filter_map(|t| t.machine.uid.clone())
            .collect();
        self.written.retain(|uid, _| live_uids.contains(uid));
        for t in targets.iter_mut() {
            let Some(uid) = t.machine.uid.clone() else {
                continue;
            };
            let (current, lagging) = current_condition(
                t.current.as_ref(),
                t.machine.resource_version.as_deref(),
                self.written.get(&uid),
            );
            let current = current.cloned();
            if lagging {
                t.current = current;
            } else {
                self.written.remove(&uid);
            }
        }

        // Gather: credentials and scopes.
        let mut by_endpoint: BTreeMap<EndpointRef, Vec<String>> = BTreeMap::new();
        for t in &targets {
            if let (Some(e), Some(id), None) = (&t.endpoint, &t.instance_id, &t.problem) {
                by_endpoint.entry(e.clone()).or_default().push(id.clone());
            }
        }
        for scope in self.scopes.values_mut() {
            scope.in_use = false;
        }
        let mut scope_of: HashMap<EndpointRef, String> = HashMap::new();
        let mut credential_errors: HashMap<EndpointRef, String> = HashMap::new();
        for (endpoint, ids) in &by_endpoint {
            match self.credentials(endpoint).await {
                Err(e) => {
                    summary.problems.push(e.clone());
                    credential_errors.insert(endpoint.clone(), e);
                }
                Ok((data, cfg)) => {
                    let key = scope_key(cfg.api_url.as_str(), endpoint);
                    let fp = fingerprint(&data);
                    let needs_client = self.scopes.get(&key).is_none_or(|s| s.fingerprint != fp);
                    if needs_client {
                        match CloudStackClient::new(cfg) {
                            Ok(client) => {
                                let observer = self
                                    .scopes
                                    .remove(&key)
                                    .map(|s| s.observer)
                                    .unwrap_or_else(|| ScopeObserver::tracking(Vec::new()));
                                let report = ScopeReport {
                                    key: key.clone(),
                                    api_url: client.api_url().to_string(),
                                    ..Default::default()
                                };
                                self.scopes.insert(
                                    key.clone(),
                                    ScopeState {
                                        client,
                                        fingerprint: fp,
                                        observer,
                                        usage_history: true,
                                        report,
                                        in_use: true,
                                        last_in_use: now,
                                        failed_polls: 0,
                                    },
                                );
                            }
                            Err(e) => {
                                let msg = format!(
                                    "Secret {}/{}: {e}",
                                    endpoint.secret_namespace, endpoint.secret_name
                                );
                                summary.problems.push(msg.clone());
                                credential_errors.insert(endpoint.clone(), msg);
                                continue;
                            }
                        }
                    }
                    let scope = self.scopes.get_mut(&key).expect("inserted above");
                    scope.in_use = true;
                    scope.last_in_use = now;
                    let wanted: BTreeSet<&String> = ids.iter().collect();
                    scope.observer.histories.retain(|id, _| wanted.contains(id));
                    for id in ids {
                        scope
                            .observer
                            .histories
                            .entry(id.clone())
                            .or_insert_with(|| crate::verdict::VmHistory::new(id.clone()));
                    }
                    scope_of.insert(endpoint.clone(), key);
                }
            }
        }
        self.scopes
            .retain(|_, s| s.in_use || now.duration_since(s.last_in_use) < SCOPE_RETENTION);
        summary.scopes = self.scopes.values().filter(|s| s.in_use).count();

        // Poll: one listing per scope.
        let project_of: HashMap<String, Option<String>> = scope_of
            .iter()
            .map(|(e, k)| (k.clone(), e.project.clone()))
            .collect();
        let zone_of: HashMap<String, Option<String>> = scope_of
            .iter()
            .map(|(e, k)| (k.clone(), e.zone_id.clone()))
            .collect();
        for (key, scope) in self.scopes.iter_mut() {
            let backing_off = scope.report.next_poll.is_some_and(|due| now < due);
            if !scope.in_use || backing_off {
                continue;
            }
            let project = project_of.get(key).cloned().flatten();
            let query = VmListQuery {
                // A project name cannot be sent as projectid: list every project the key
                // sees (`-1`) and match by VM id, which is what decides anyway.
                project_id: project.map(|p| if is_uuid(&p) { p } else { "-1".to_string() }),
                zone_id: zone_of.get(key).cloned().flatten(),
                ..Default::default()
            };
            let started = std::time::Instant::now();
            let calls_before = scope.client.stats();
            poll_scope(scope, &query, &self.graces, now).await;
            self.metrics
                .observe_poll(key, started.elapsed().as_secs_f64());
            let after = scope.client.stats();
            for ((command, outcome), n) in &after.by_command {
                let before = calls_before
                    .by_command
                    .get(&(command.clone(), outcome.clone()))
                    .copied()
                    .unwrap_or(0);
                if *n > before {
                    self.metrics.record_calls(command, outcome, n - before);
                }
            }
            let waited = after
                .rate_limit_wait
                .saturating_sub(calls_before.rate_limit_wait);
            self.metrics.record_rate_limit_wait(waited.as_secs_f64());
        }

        // A host whose stats collection paused makes all its VMs look flat at once; judge
        // each CloudStack's hosts over all of its scopes.
        let mut by_cloud: BTreeMap<String, Vec<&mut crate::verdict::VmHistory>> = BTreeMap::new();
        for scope in self.scopes.values_mut().filter(|s| s.in_use) {
            by_cloud
                .entry(scope.report.api_url.clone())
                .or_default()
                .extend(scope.observer.histories.values_mut());
        }
        for (api_url, histories) in by_cloud {
            for p in crate::verdict::mark_paused_collections(histories, &self.graces, now) {
                tracing::debug!(
                    api_url = %api_url,
                    host = p.host_id.as_deref().unwrap_or("(no host id)"),
                    since = %p.since,
                    witnesses = p.witnesses,
                    vms = p.vms,
                    "stats collection looks paused; flat traffic there is no evidence"
                );
            }
        }

        // Decide.
        let mut verdicts: Vec<Option<Verdict>> = Vec::with_capacity(targets.len());
        for t in &targets {
            verdicts.push(self.verdict_for(t, &scope_of, &credential_errors, None, now));
        }
        // NodeNotLinked guard, before anything is published or counted as failing: a Node-less
        // Machine about to turn False whose VM matches a workload Node becomes Unknown. It must
        // never be published False first — in condition mode the MHC acts on False itself.
        let unlinked = self.unlinked_nodes(&targets, &verdicts, &scope_of).await;
        for (&i, node) in &unlinked {
            verdicts[i] = self.verdict_for(
                &targets[i],
                &scope_of,
                &credential_errors,
                Some(node.clone()),
                now,
            );
        }
        // Mass-failure guard, per scope.
        let mut members_by_scope: BTreeMap<String, Vec<usize>> = BTreeMap::new();
        for (i, t) in targets.iter().enumerate() {
            if let (Some(e), Some(_)) = (&t.endpoint, &verdicts[i]) {
                if let Some(k) = scope_of.get(e) {
                    members_by_scope.entry(k.clone()).or_default().push(i);
                }
            }
        }
        for (key, idx) in &members_by_scope {
            let mut members: Vec<ScopeMember> = idx
                .iter()
                .map(|&i| ScopeMember {
                    candidate: verdicts[i].clone().expect("filtered above"),
                    false_since: targets[i]
                        .current
                        .as_ref()
                        .filter(|c| c.status == Status::False)
                        .map(|c| c.last_transition_time),
                })
                .collect();
            let outcome = self.guard.apply(&mut members, now);
            self.metrics.set_mass_failure_held(key, outcome.held);
            if let Some(s) = self.scopes.get_mut(key) {
                s.report.held = outcome.held;
                s.report.machines = idx.len();
            }
            if outcome.held {
                summary.problems.push(format!(
                    "mass-failure guard holds scope {key}: {} of {} Machines failing",
                    outcome.failing, outcome.total
                ));
            }
            for (member, &i) in members.into_iter().zip(idx) {
                verdicts[i] = Some(member.candidate);
            }
        }

        // Act and report.
        let mut reports: BTreeMap<String, ClusterReport> = BTreeMap::new();
        let mut cp_in_flight: BTreeSet<(String, String)> = targets
            .iter()
            .filter(|t| {
                t.machine.is_control_plane() && t.machine.annotated(well_known::REMEDIATE_MACHINE)
            })
            .map(|t| (t.machine.namespace.clone(), t.machine.cluster_name.clone()))
            .collect();
        let nexts: Vec<Option<ConditionState>> = targets
            .iter()
            .zip(&verdicts)
            .map(|(t, v)| {
                let v = v.as_ref()?;
                Some(next_condition(
                    t.current.as_ref(),
                    &self.args.condition_type,
                    v,
                    now,
                ))
            })
            .collect();
        for (t, next, outcome) in self.write_conditions(&targets, &nexts).await {
            self.record_write(t, next, outcome, now, &mut summary);
        }
        for (i, (t, next)) in targets.iter().zip(nexts).enumerate() {
            let mut report = MachineReport {
                namespace: t.machine.namespace.clone(),
                name: t.machine.name.clone(),
                control_plane: t.machine.is_control_plane(),
                vm_id: t.instance_id.clone(),
                mhc_covered: t.mhc_covered,
                escalation: if t.machine.annotated(well_known::REMEDIATE_MACHINE) {
                    "annotated"
                } else {
                    "none"
                }
                .into(),
                scope: t.endpoint.as_ref().and_then(|e| scope_of.get(e).cloned()),
                ..Default::default()
            };
            if let Some(h) = report
                .scope
                .as_ref()
                .and_then(|k| self.scopes.get(k))
                .and_then(|s| {
                    t.instance_id
                        .as_ref()
                        .and_then(|id| s.observer.histories.get(id))
                })
            {
                report.vm_state = h.sighting.as_ref().map(|s| s.state.to_string());
            }
            match &t.problem {
                Some(TargetProblem::NoCloudStackMachine(name)) => {
                    report.message = Some(format!(
                        "CloudStackMachine {name} not found; nothing to judge yet"
                    ))
                }
                Some(TargetProblem::NoInstanceId) => {
                    report.message =
                        Some("the CloudStackMachine has no instanceID yet (VM not deployed)".into())
                }
                _ => {}
            }
            if let Some(published) = next {
                report.verdict = Some(published.status);
                report.reason = Some(published.reason.clone());
                report.message = Some(published.message.clone());
                report.since = Some(published.last_transition_time);
                if let Some(node) = unlinked.get(&i) {
                    report.escalation = "held".into();
                    report.escalation_detail =
                        Some(format!("{}: Node {node} exists", reason::NODE_NOT_LINKED));
                }
                self.escalate(
                    t,
                    &published,
                    now,
                    &mut cp_in_flight,
                    &mut report,
                    &mut summary,
                )
                .await;
            }
            reports
                .entry(format!(
                    "{}/{}",
                    t.machine.namespace, t.machine.cluster_name
                ))
                .or_default()
                .machines
                .insert(t.machine.name.clone(), report);
        }
        self.write_report(reports, &summary, now).await;
        summary
    }

    fn verdict_for(
        &mut self,
        t: &Target,
        scope_of: &HashMap<EndpointRef, String>,
        credential_errors: &HashMap<EndpointRef, String>,
        unlinked_node: Option<String>,
        now: Timestamp,
    ) -> Option<Verdict> {
        match &t.problem {
            Some(TargetProblem::NoCloudStackMachine(_)) | Some(TargetProblem::NoInstanceId) => {
                return None
            }
            Some(TargetProblem::NoFailureDomain(fd)) => {
                return Some(Verdict::new(
                    Status::Unknown,
                    CREDENTIALS_UNAVAILABLE,
                    format!(
                    "failure domain {fd} (and so the CloudStack endpoint and its Secret) not found"
                ),
                ))
            }
            None => {}
        }
        let endpoint = t.endpoint.as_ref()?;
        if let Some(e) = credential_errors.get(endpoint) {
            return Some(Verdict::new(
                Status::Unknown,
                CREDENTIALS_UNAVAILABLE,
                e.clone(),
            ));
        }
        let scope = self.scopes.get_mut(scope_of.get(endpoint)?)?;
        let id = t.instance_id.as_ref()?;
        let history = scope.observer.histories.get_mut(id)?;
        // After a restart, CAPC's record of when the state last changed keeps graces from
        // starting over (only ever moves the start earlier, and only for the same state).
        if let (Some(state), Some(since), Some(seen)) =
            (&t.csm_state, t.csm_state_since, &history.sighting)
        {
            if seen.state.as_str() == state {
                history.anchor_state_since(since);
            }
        }
        if let Some(current) = t.current.as_ref().filter(|c| c.status == Status::False) {
            history.credit_published_false(&current.reason, &self.graces);
        }
        let facts = MachineFacts {
            has_node: t.machine.has_node_ref,
            deleting: t.machine.deleting,
            unlinked_node,
        };
        Some(evaluate(history, &facts, &self.graces, now))
    }

    /// Writes every changed condition, [`RunArgs::max_concurrent_writes`] at a time (a cold
    /// start has one to write per Machine), each followed by its Event when the status
    /// changed. Each written target with its condition and the outcome, in target order.
    async fn write_conditions<'a>(
        &self,
        targets: &'a [Target],
        nexts: &'a [Option<ConditionState>],
    ) -> Vec<(&'a Target, &'a ConditionState, Result<(), String>)> {
        let changed = targets
            .iter()
            .zip(nexts)
            .enumerate()
            .filter_map(|(i, (t, next))| {
                let next = next.as_ref()?;
                (!is_unchanged(t.current.as_ref(), next)).then_some((i, t, next))
            });
        let mut outcomes: Vec<(usize, Result<(), String>)> = stream::iter(changed)
            .map(|(i, t, next)| async move { (i, self.write_condition(t, next).await) })
            .buffer_unordered(usize::from(self.args.max_concurrent_writes))
            .collect()
            .await;
        outcomes.sort_by_key(|(i, _)| *i);
        outcomes
            .into_iter()
            .filter_map(|(i, outcome)| Some((&targets[i], nexts[i].as_ref()?, outcome)))
            .collect()
    }

    async fn write_condition(&self, t: &Target, next: &ConditionState) -> Result<(), String> {
        kube_io::apply_condition(
            &self.client,
            &self.resources.machine,
            self.api.layout,
            &t.machine.namespace,
            &t.machine.name,
            next,
        )
        .await?;
        let previous = t.current.as_ref().map(|c| c.status);
        if previous != Some(next.status) {
            tracing::info!(machine = %format!("{}/{}", t.machine.namespace, t.machine.name),
                status = %next.status, reason = %next.reason, message = %next.message, "verdict changed");
        }
        if needs_event(previous, next.status) {
            self.events
                .publish(
                    &t.machine.namespace,
                    &t.machine.name,
                    None,
                    next.status != Status::True,
                    &next.reason,
                    format!(
                        "{} is {}: {}",
                        self.args.condition_type, next.status, next.message
                    ),
                )
                .await;
        }
        Ok(())
    }

    /// The bookkeeping of one condition write: our record of it, metrics, the cycle's count.
    fn record_write(
        &mut self,
        t: &Target,
        next: &ConditionState,
        outcome: Result<(), String>,
        now: Timestamp,
        summary: &mut CycleSummary,
    ) {
        if let Err(e) = outcome {
            tracing::warn!(error = %e, "condition write failed; retried next cycle");
            summary.problems.push(e);
            return;
        }
        summary.condition_writes += 1;
        if let Some(uid) = &t.machine.uid {
            self.written.insert(
                uid.clone(),
                Written {
                    condition: next.clone(),
                    based_on: t.machine.resource_version.clone(),
                },
            );
        }
        if t.current.as_ref().map(|c| c.status) != Some(next.status) {
            self.metrics.record_transition(next.status, &next.reason);
            if next.status == Status::False {
                if let Some(created) = t.created {
                    self.metrics.observe_time_to_false(
                        &next.reason,
                        now.duration_since(created).as_secs_f64(),
                    );
                }
            }
        }
    }

    async fn escalate(
        &mut self,
        t: &Target,
        published: &ConditionState,
        now: Timestamp,
        cp_in_flight: &mut BTreeSet<(String, String)>,
        report: &mut MachineReport,
        summary: &mut CycleSummary,
    ) {
        let cluster = (t.machine.namespace.clone(), t.machine.cluster_name.clone());
        let decision = escalation::decide(&EscalationFacts {
            mode: self.api.mode,
            machine: &t.machine,
            status: published.status,
            since: published.last_transition_time,
            now,
            delay: self.args.escalation_delay,
            covered_by_mhc: t.mhc_covered,
            cluster_paused: t.cluster_paused,
            control_plane_escalation_in_flight: cp_in_flight.contains(&cluster),
        });
        match decision {
            Escalation::NotNeeded => {}
            Escalation::AlreadyAnnotated => report.escalation = "annotated".into(),
            Escalation::Held {
                reason,
                message,
                until,
            } => {
                report.escalation = if until.is_some() { "pending" } else { "held" }.into();
                report.escalation_detail = Some(format!("{reason}: {message}"));
            }
            Escalation::Annotate => {
                match kube_io::annotate_for_remediation(
                    &self.client,
                    &self.resources.machine,
                    &t.machine.namespace,
                    &t.machine.name,
                    &published.reason,
                )
                .await
                {
                    Ok(()) => {
                        summary.annotations += 1;
                        self.metrics.record_escalation("annotated");
                        report.escalation = "annotated".into();
                        if t.machine.is_control_plane() {
                            cp_in_flight.insert(cluster);
                        }
                        tracing::warn!(machine = %format!("{}/{}", t.machine.namespace, t.machine.name),
                            reason = %published.reason, "escalated: remediate-machine annotation set");
                        self.events
                            .publish(
                                &t.machine.namespace,
                                &t.machine.name,
                                None,
                                true,
                                "RemediationRequested",
                                format!(
                                    "set {} after {} False since {}: {}",
                                    well_known::REMEDIATE_MACHINE,
                                    self.args.condition_type,
                                    crate::verdict::at(published.last_transition_time),
                                    published.message
                                ),
                            )
                            .await;
                    }
                    Err(e) => summary.problems.push(e),
                }
            }
        }
    }

    /// The NodeNotLinked guard: for each Node-less, not deleting Machine whose verdict is
    /// `False`, a workload Node matching the VM (by name or InternalIP) — index → Node name.
    /// Each workload cluster is asked at most once per cycle, and only when needed; when it
    /// cannot be asked the verdict stands (the guard holds only when a Node is found).
    async fn unlinked_nodes(
        &self,
        targets: &[Target],
        verdicts: &[Option<Verdict>],
        scope_of: &HashMap<EndpointRef, String>,
    ) -> BTreeMap<usize, String> {
        let mut nodes_of: HashMap<(String, String), Option<Vec<serde_json::Value>>> =
            HashMap::new();
        let mut out = BTreeMap::new();
        for (i, t) in targets.iter().enumerate() {
            let is_false = verdicts[i]
                .as_ref()
                .is_some_and(|v| v.status == Status::False);
            if !is_false || t.machine.has_node_ref || t.machine.deleting {
                continue;
            }
            let cluster = (t.machine.namespace.clone(), t.machine.cluster_name.clone());
            if !nodes_of.contains_key(&cluster) {
                let nodes = match kube_io::workload_nodes(
                    &self.client,
                    &cluster.0,
                    &cluster.1,
                    to_std(self.args.workload_timeout),
                )
                .await
                {
                    Ok(nodes) => Some(nodes),
                    Err(e) => {
                        tracing::debug!(error = %e, "NodeNotLinked check skipped");
                        None
                    }
                };
                nodes_of.insert(cluster.clone(), nodes);
            }
            let Some(Some(nodes)) = nodes_of.get(&cluster) else {
                continue;
            };
            let addresses: Vec<String> = t
                .endpoint
                .as_ref()
                .and_then(|e| scope_of.get(e))
                .and_then(|k| self.scopes.get(k))
                .and_then(|s| {
                    t.instance_id
                        .as_ref()
                        .and_then(|id| s.observer.histories.get(id))
                })
                .and_then(|h| h.sighting.as_ref())
                .map(|s| s.addresses.clone())
                .unwrap_or_default();
            if let Some(node) = matching_node(nodes, &t.machine.name, &addresses) {
                out.insert(i, node.to_string());
            }
        }
        out
    }

    async fn write_report(
        &self,
        clusters: BTreeMap<String, ClusterReport>,
        summary: &CycleSummary,
        now: Timestamp,
    ) {
        let mut fds: BTreeMap<(String, String), (usize, usize)> = BTreeMap::new();
        for (key, c) in &clusters {
            let ns = key.split('/').next().unwrap_or_default().to_string();
            for m in c.machines.values() {
                let entry = fds
                    .entry((ns.clone(), m.scope.clone().unwrap_or_else(|| "-".into())))
                    .or_default();
                entry.0 += 1;
                if m.verdict == Some(Status::False) {
                    entry.1 += 1;
                }
            }
        }
        let mut counts: BTreeMap<(Status, String), i64> = BTreeMap::new();
        for c in clusters.values() {
            for m in c.machines.values() {
                if let (Some(s), Some(r)) = (m.verdict, &m.reason) {
                    *counts.entry((s, r.clone())).or_default() += 1;
                }
            }
        }
        self.metrics.set_verdict_counts(&counts);
        let mut r = self.report.write().await;
        r.generated_at = Some(now);
        r.api = Some(self.api.clone());
        r.problems = summary.problems.clone();
        r.clusters = clusters;
        r.scopes = self
            .scopes
            .values()
            .filter(|s| s.in_use)
            .map(|s| s.report.clone())
            .collect();
        r.failure_domains = fds
            .into_iter()
            .map(
                |((namespace, name), (machines, failing))| FailureDomainReport {
                    namespace,
                    name,
                    machines,
                    failing,
                    failure_ratio: if machines == 0 {
                        0.0
                    } else {
                        failing as f64 / machines as f64
                    },
                },
            )
            .collect();
    }
}

async fn poll_scope(scope: &mut ScopeState, query: &VmListQuery, graces: &Graces, now: Timestamp) {
    let was_failing = scope.report.last_error.is_some();
    scope.report.last_poll = Some(now);
    let o = crate::scope::poll(
        &scope.client,
        &mut scope.observer,
        query,
        graces,
        &mut scope.usage_history,
        now,
    )
    .await;
    match &o.listing_error {
        Some(e) => scope.report.last_error = Some(e.to_string()),
        None => {
            scope.report.last_success = Some(now);
            scope.report.last_error = (!o.complete).then(|| {
                format!(
                    "listing incomplete: {} item(s) could not be read",
                    o.unreadable
                )
            });
        }
    }
    // Say so once when a scope starts failing and once when it recovers, not every cycle.
    if o.listing_error.is_some() {
        scope.failed_polls = scope.failed_polls.saturating_add(1);
        let wait = graces.poll_interval * backoff_intervals(scope.failed_polls);
        scope.report.next_poll = (scope.failed_polls > 1).then(|| now + wait);
    } else {
        scope.failed_polls = 0;
        scope.report.next_poll = None;
    }
    match (&scope.report.last_error, was_failing) {
        (Some(error), false) => tracing::warn!(
            scope = %scope.report.key,
            error = %error,
            "CloudStack poll failed; this scope's verdicts are Unknown until a poll succeeds"
        ),
        (None, true) => {
            tracing::info!(scope = %scope.report.key, "CloudStack poll succeeded again")
        }
        _ => {}
    }
    if let Some(note) = &o.usage_history_note {
        tracing::debug!(note = %note, "usage history");
    }
    let stats = scope.client.stats();
    scope.report.calls_total = stats.calls;
    scope.report.calls = stats
        .by_command
        .iter()
        .map(|((cmd, outcome), n)| (format!("{cmd}/{outcome}"), *n))
        .collect();
    scope.report.rate_limit_wait_seconds = stats.rate_limit_wait.as_secs_f64();
}

#[cfg(test)]
mod tests {
    use super::*;

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
            condition: condition(Status::False, crate::verdict::reason::VM_ERROR),
            based_on: Some("41".into()),
        };
        let cached = condition(Status::True, crate::verdict::reason::VM_HEALTHY);
        // The cache still shows the version we wrote on top of: ours is newer.
        let (c, lagging) = current_condition(Some(&cached), Some("41"), Some(&ours));
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
    fn failed_polls_back_off_to_four_intervals_at_most() {
        let waits: Vec<i32> = (0..7).map(backoff_intervals).collect();
        assert_eq!(waits, [1, 1, 2, 4, 4, 4, 4]);
        assert_eq!(backoff_intervals(u32::MAX), 4);
    }
}
