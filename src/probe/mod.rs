//! The opt-in guest probe's I/O (docs/guest-probe.md): for each VM that `verdict::probe`
//! says is due, find its network's Running virtual router (`listRouters`), start `arping`
//! there (`runDiagnostics`, an async job; `ping` when arping cannot run), and read the job
//! when it has finished. The answers go into the VM's history, where the verdict engine reads
//! them.
//!
//! [`Prober::step`] never waits for a job: it collects the jobs that finished since the last
//! step and starts the ones now due, so the controller calls it every few seconds between
//! polls and the benches call it as they move simulated time. Bounded by a budget per scope
//! per minute and by the jobs in flight; a key CloudStack refuses is reported once and not
//! used again until it changes.

mod answers;
mod routers;

use std::collections::{HashMap, VecDeque};

use jiff::{SignedDuration, Timestamp};
use tracing::{debug, warn};

use crate::cloudstack::client::{AsyncJobState, CloudStackClient, DiagnosticsKind};
use crate::cloudstack::model::pick_router;
use crate::status::ProbeReport;
use crate::verdict::probe::{
    assess_probe, following_up, probe_due, probe_wanted, ProbeAnswer, ProbeAttempt, ProbeEvidence,
    ProbeNic,
};
use crate::verdict::{Graces, MachineFacts, VmHistory};

/// Time between probe steps while waiting for the next cycle: a fifteenth of the spacing
/// between attempts (1 s at the defaults), within 0.25–5 s. A router runs one job at a time and
/// an arping that is answered takes about a second there, so a finished job is seen — and the
/// router free for the next VM — about as soon as it ends.
pub fn probe_tick(spacing: jiff::SignedDuration) -> std::time::Duration {
    crate::cli::to_std(spacing / 15).clamp(
        std::time::Duration::from_millis(250),
        std::time::Duration::from_secs(5),
    )
}

pub use answers::same_endpoint;
use answers::{error_end, read_job_output, JobEnd};

/// The probe's bounds (flags of `run` and `check`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeLimits {
    pub per_scope_per_minute: u32,
    pub max_in_flight: usize,
    pub job_timeout: SignedDuration,
    /// `params` of the arping job.
    pub arping_params: String,
}

impl Default for ProbeLimits {
    fn default() -> Self {
        Self {
            per_scope_per_minute: 60,
            max_in_flight: 16,
            job_timeout: SignedDuration::from_mins(2),
            arping_params: "-c 3 -f".to_string(),
        }
    }
}

/// How one step went, for the caller's scheduling.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepOutcome {
    /// Some VM's probe evidence changed kind (e.g. its unanswered attempts now count): a
    /// decision now would differ from the last one.
    pub evidence_changed: bool,
    pub started: usize,
    pub finished: usize,
}

/// One scope's VM histories, offered to a step.
pub struct ScopeHistories<'a> {
    pub scope: &'a str,
    pub histories: &'a mut crate::scope::Histories,
}

#[derive(Debug, Clone)]
struct InFlight {
    scope: String,
    vm_id: String,
    router_id: String,
    router: String,
    nic: ProbeNic,
    /// When the attempt began (its first job), which pacing counts from.
    began: Timestamp,
    /// When the current job was started.
    job_started: Timestamp,
    job: String,
    kind: DiagnosticsKind,
}

/// Start order of due probes: follow-ups of unanswered attempts (`false` first), then the
/// oldest last attempt.
type DueOrder = (bool, Option<Timestamp>);

/// The probe's client, budget and jobs in flight.
pub struct Prober {
    client: CloudStackClient,
    limits: ProbeLimits,
    in_flight: Vec<InFlight>,
    routers: routers::RouterSightings,
    started_per_scope: HashMap<String, VecDeque<Timestamp>>,
    report: ProbeReport,
}

impl Prober {
    pub fn new(client: CloudStackClient, limits: ProbeLimits) -> Self {
        let report = ProbeReport {
            enabled: true,
            endpoint: Some(client.api_url().to_string()),
            ..ProbeReport::default()
        };
        Self {
            client,
            limits,
            in_flight: Vec::new(),
            routers: Default::default(),
            started_per_scope: HashMap::new(),
            report,
        }
    }

    /// Whether VMs listed through `api_url` can be probed with this key: same endpoint.
    /// The client it calls with (for clients of the same account to share its rate limit).
    pub fn client(&self) -> &CloudStackClient {
        &self.client
    }

    pub fn covers(&self, api_url: &str) -> bool {
        same_endpoint(self.client.api_url(), api_url)
    }

    pub fn report(&self) -> ProbeReport {
        ProbeReport {
            in_flight: self.in_flight.len(),
            ..self.report.clone()
        }
    }

    /// Collects finished jobs into the histories and starts the probes due at `now`.
    /// `facts` gives each VM's Machine facts; `None` means "not a Machine's VM: never probe".
    pub async fn step(
        &mut self,
        scopes: &mut [ScopeHistories<'_>],
        facts: &dyn Fn(&str) -> Option<MachineFacts>,
        graces: &Graces,
        now: Timestamp,
    ) -> StepOutcome {
        let mut outcome = StepOutcome::default();
        if graces.probe.is_none() {
            return outcome;
        }
        self.forget_old(graces, now);
        self.abandon_unwanted(scopes, facts);
        self.collect(scopes, graces, now, &mut outcome).await;
        self.end_lost_attempts(scopes, graces, now, &mut outcome);
        if self.report.refused.is_none() {
            self.start_due(scopes, facts, graces, now, &mut outcome)
                .await;
        }
        outcome
    }

    /// Stops following the jobs of VMs the probe no longer asks about: their Machine got its
    /// Node, is being deleted or is gone since the job started ([`probe_wanted`]). Their answer
    /// could change no verdict, so reading it (`queryAsyncJobResult` every step until the job
    /// ends, then a `ping` retry) would be calls for nothing; the job ends on the router by
    /// itself. The VM's history forgets the attempt, as it never finished.
    fn abandon_unwanted(
        &mut self,
        scopes: &mut [ScopeHistories<'_>],
        facts: &dyn Fn(&str) -> Option<MachineFacts>,
    ) {
        let (kept, dropped): (Vec<InFlight>, Vec<InFlight>) = std::mem::take(&mut self.in_flight)
            .into_iter()
            .partition(|f| facts(&f.vm_id).is_some_and(|m| probe_wanted(&m)));
        self.in_flight = kept;
        for f in dropped {
            debug!(vm = %f.vm_id, router = %f.router,
                "the Machine has a Node now (or is deleting, or is gone): its probe job is not followed");
            if let Some(h) = history_mut(scopes, &f.scope, &f.vm_id) {
                if h.probe.in_flight_since == Some(f.began) {
                    h.probe.in_flight_since = None;
                }
            }
        }
    }

    async fn collect(
        &mut self,
        scopes: &mut [ScopeHistories<'_>],
        graces: &Graces,
        now: Timestamp,
        outcome: &mut StepOutcome,
    ) {
        if self.in_flight.is_empty() {
            return;
        }
        let polls = futures::future::join_all(
            self.in_flight
                .iter()
                .map(|f| self.client.query_async_job(&f.job)),
        )
        .await;
        let mut still = Vec::new();
        let mut retry_with_ping = Vec::new();
        for (f, polled) in std::mem::take(&mut self.in_flight).into_iter().zip(polls) {
            let end = match polled {
                Ok(AsyncJobState::Pending) => {
                    if now.duration_since(f.job_started) >= self.limits.job_timeout {
                        JobEnd::Answer(ProbeAnswer::NoEvidence(format!(
                            "the {} job on router {} did not finish within {}",
                            f.kind.as_str(),
                            f.router,
                            crate::verdict::human_duration(self.limits.job_timeout)
                        )))
                    } else {
                        still.push(f);
                        continue;
                    }
                }
                Ok(AsyncJobState::Succeeded(value)) => {
                    read_job_output(f.kind, &f.router, &f.nic, &value)
                }
                Ok(AsyncJobState::Failed { text, .. }) => {
                    JobEnd::Answer(ProbeAnswer::NoEvidence(format!(
                        "the {} job on router {} failed: {text}",
                        f.kind.as_str(),
                        f.router
                    )))
                }
                Err(e) => error_end(&e, &format!("reading the {} job", f.kind.as_str())),
            };
            match end {
                JobEnd::TryPing(why) if f.kind == DiagnosticsKind::Arping => {
                    debug!(vm = %f.vm_id, %why, "arping could not run; trying ping");
                    retry_with_ping.push(f);
                }
                end => self.end_attempt(scopes, &f, end, graces, now, outcome),
            }
        }
        self.in_flight = still;
        for f in retry_with_ping {
            match self
                .start_job(&f.router_id, &f.nic, DiagnosticsKind::Ping)
                .await
            {
                Ok(job) => self.in_flight.push(InFlight {
                    job,
                    job_started: now,
                    kind: DiagnosticsKind::Ping,
                    ..f
                }),
                Err(end) => self.end_attempt(scopes, &f, end, graces, now, outcome),
            }
        }
    }

    /// Drops router sightings too old to be used again (networks come and go with clusters)
    /// and the budgets of scopes that started nothing for a minute: bounded over weeks.
    fn forget_old(&mut self, graces: &Graces, now: Timestamp) {
        self.routers.forget_old(graces.poll_interval, now);
        let minute_ago = now - SignedDuration::from_mins(1);
        self.started_per_scope.retain(|_, started| {
            while started.front().is_some_and(|t| *t <= minute_ago) {
                started.pop_front();
            }
            !started.is_empty()
        });
    }

    /// Ends the attempts a history still marks in flight that no job of this prober carries —
    /// the probe key was rotated mid-job (a new prober), or the job ended while its scope was
    /// not offered — as no evidence, so the VM is due again instead of never probed again.
    fn end_lost_attempts(
        &mut self,
        scopes: &mut [ScopeHistories<'_>],
        graces: &Graces,
        now: Timestamp,
        outcome: &mut StepOutcome,
    ) {
        for s in scopes.iter_mut() {
            for h in s.histories.values_mut() {
                let Some(began) = h.probe.in_flight_since else {
                    continue;
                };
                let carried = self
                    .in_flight
                    .iter()
                    .any(|f| f.vm_id == h.vm_id && f.began == began);
                if carried {
                    continue;
                }
                self.report.counts.no_evidence += 1;
                let attempt = ProbeAttempt {
                    at: began,
                    router: String::new(),
                    answer: ProbeAnswer::NoEvidence(
                        "the attempt's job was lost (probe key rotated, or its scope was not \
                         offered when it ended)"
                            .into(),
                    ),
                };
                record_attempt(h, attempt, graces, now, outcome);
            }
        }
    }

    /// Ends an attempt the way its job (or the call starting it) ended: a refused key turns the
    /// probe off; anything but an answer is no evidence.
    fn end_attempt(
        &mut self,
        scopes: &mut [ScopeHistories<'_>],
        f: &InFlight,
        end: JobEnd,
        graces: &Graces,
        now: Timestamp,
        outcome: &mut StepOutcome,
    ) {
        let answer = match end {
            JobEnd::Answer(a) => a,
            JobEnd::TryPing(why) => ProbeAnswer::NoEvidence(why),
            JobEnd::Refused(why) => {
                self.refuse(why);
                ProbeAnswer::NoEvidence("probe key refused".into())
            }
        };
        self.finish(scopes, f, answer, graces, now, outcome);
    }

    /// Records a finished attempt in its VM's history (if the VM is still tracked).
    fn finish(
        &mut self,
        scopes: &mut [ScopeHistories<'_>],
        f: &InFlight,
        answer: ProbeAnswer,
        graces: &Graces,
        now: Timestamp,
        outcome: &mut StepOutcome,
    ) {
        match &answer {
            ProbeAnswer::Reply => self.report.counts.replies += 1,
            ProbeAnswer::NoReply => self.report.counts.no_replies += 1,
            ProbeAnswer::NoEvidence(why) => {
                self.report.counts.no_evidence += 1;
                debug!(vm = %f.vm_id, router = %f.router, %why, "probe gave no evidence");
            }
        }
        outcome.finished += 1;
        let Some(h) = history_mut(scopes, &f.scope, &f.vm_id) else {
            return;
        };
        // A job whose VM left Running (or changed address) meanwhile asked about a guest that
        // is no longer there: its history forgot the attempt, and so does the answer.
        if !f.job.is_empty() && h.probe.in_flight_since != Some(f.began) {
            return;
        }
        let attempt = ProbeAttempt {
            at: f.began,
            router: f.router.clone(),
            answer,
        };
        record_attempt(h, attempt, graces, now, outcome);
    }

    async fn start_due(
        &mut self,
        scopes: &mut [ScopeHistories<'_>],
        facts: &dyn Fn(&str) -> Option<MachineFacts>,
        graces: &Graces,
        now: Timestamp,
        outcome: &mut StepOutcome,
    ) {
        // Follow-ups of unanswered attempts first (they decide a verdict), then the oldest last
        // attempt first, so that a shortfall rotates over the VMs.
        let pacing = graces.probe.as_ref();
        let mut due: Vec<(DueOrder, String, String, ProbeNic)> = Vec::new();
        for s in scopes.iter() {
            for h in s.histories.values() {
                let Some(machine) = facts(&h.vm_id) else {
                    continue;
                };
                if self.in_flight.iter().any(|f| f.vm_id == h.vm_id) {
                    continue;
                }
                if let Some(target) = probe_due(h, &machine, graces, now) {
                    let follow_up = pacing.is_some_and(|pg| following_up(h, pg));
                    let key = (!follow_up, h.probe.attempts.back().map(|a| a.at));
                    due.push((key, s.scope.to_string(), target.vm_id, target.nic));
                }
            }
        }
        due.sort_by_key(|a| a.0);
        let minute_ago = now - SignedDuration::from_mins(1);
        for (_, scope, vm_id, nic) in due {
            if self.report.refused.is_some() {
                break;
            }
            if self.in_flight.len() >= self.limits.max_in_flight {
                self.report.counts.skipped_in_flight_cap += 1;
                continue;
            }
            let router = match self.router_for(&nic.network_id, graces, now).await {
                Ok(Some(r)) => r,
                Err(JobEnd::Refused(why)) => {
                    self.refuse(why);
                    break;
                }
                lookup => {
                    let why = match lookup {
                        Err(
                            JobEnd::Answer(ProbeAnswer::NoEvidence(why)) | JobEnd::TryPing(why),
                        ) => why,
                        _ => format!(
                            "network {} has no Running virtual router to probe from",
                            nic.network_id
                        ),
                    };
                    let f = self.pending(&scope, &vm_id, ("", ""), &nic, now);
                    self.finish(
                        scopes,
                        &f,
                        ProbeAnswer::NoEvidence(why),
                        graces,
                        now,
                        outcome,
                    );
                    continue;
                }
            };
            // A router runs diagnostics one at a time (every command for it takes the same
            // lock on the agent, VirtualRoutingResource): a second job would only queue there,
            // and time out behind a busy router. Wait for the next step instead.
            if self.in_flight.iter().any(|f| f.router_id == router.0) {
                self.report.counts.skipped_router_busy += 1;
                continue;
            }
            let starts = self.started_per_scope.entry(scope.clone()).or_default();
            while starts.front().is_some_and(|t| *t <= minute_ago) {
                starts.pop_front();
            }
            if starts.len() >= self.limits.per_scope_per_minute as usize {
                self.report.counts.skipped_for_budget += 1;
                continue;
            }
            starts.push_back(now);
            let f = self.pending(&scope, &vm_id, (&router.0, &router.1), &nic, now);
            if let Some(h) = history_mut(scopes, &scope, &vm_id) {
                h.probe.started(now);
            }
            match self
                .start_job(&router.0, &nic, DiagnosticsKind::Arping)
                .await
            {
                Ok(job) => {
                    outcome.started += 1;
                    self.in_flight.push(InFlight { job, ..f });
                }
                Err(end) => {
                    let refused = matches!(end, JobEnd::Refused(_));
                    self.end_attempt(scopes, &f, end, graces, now, outcome);
                    if refused {
                        break;
                    }
                }
            }
        }
    }

    fn pending(
        &self,
        scope: &str,
        vm_id: &str,
        (router_id, router): (&str, &str),
        nic: &ProbeNic,
        now: Timestamp,
    ) -> InFlight {
        InFlight {
            scope: scope.to_string(),
            vm_id: vm_id.to_string(),
            router_id: router_id.to_string(),
            router: router.to_string(),
            nic: nic.clone(),
            began: now,
            job_started: now,
            job: String::new(),
            kind: DiagnosticsKind::Arping,
        }
    }

    /// The network's Running router (PRIMARY first), looked up at most once per poll
    /// interval per network.
    async fn router_for(
        &mut self,
        network_id: &str,
        graces: &Graces,
        now: Timestamp,
    ) -> Result<Option<(String, String)>, JobEnd> {
        if let Some(router) = self.routers.fresh(network_id, graces.poll_interval, now) {
            return Ok(router);
        }
        self.report.counts.router_lookups += 1;
        match self.client.list_routers(network_id).await {
            Ok(listing) => {
                let router =
                    pick_router(&listing.items, network_id).map(|r| (r.id.clone(), r.name.clone()));
                self.routers.record(network_id, router.clone(), now);
                Ok(router)
            }
            Err(e) => {
                let end = error_end(&e, "looking up the network's router");
                if let JobEnd::Answer(ProbeAnswer::NoEvidence(why)) = &end {
                    self.report.last_error = Some(why.clone());
                }
                Err(end)
            }
        }
    }

    async fn start_job(
        &mut self,
        router_id: &str,
        nic: &ProbeNic,
        kind: DiagnosticsKind,
    ) -> Result<String, JobEnd> {
        self.report.counts.jobs_started += 1;
        let params = match kind {
            DiagnosticsKind::Arping => Some(self.limits.arping_params.as_str()),
            DiagnosticsKind::Ping => Some("-c 3"),
        };
        self.client
            .run_diagnostics(router_id, nic.address, kind, params)
            .await
            .map_err(|e| error_end(&e, &format!("starting {}", kind.as_str())))
    }

    fn refuse(&mut self, why: String) {
        if self.report.refused.is_none() {
            warn!(%why, "CloudStack refused the probe key; the guest probe is off until its Secret changes");
            self.report.refused = Some(why);
        }
    }
}

/// Records a finished attempt and notes whether the VM's probe evidence changed kind.
fn record_attempt(
    h: &mut VmHistory,
    attempt: ProbeAttempt,
    graces: &Graces,
    now: Timestamp,
    outcome: &mut StepOutcome,
) {
    // Only a change that can flip the verdict's status counts: silence that now suffices for
    // False, or a reply that ends it. (A first reply, or one aging out, changes nothing the
    // next regular cycle would not see; deciding early for those only re-polls every scope.)
    let unanswered = |h: &VmHistory| {
        h.sighting.as_ref().is_some_and(|seen| {
            matches!(
                assess_probe(h, seen, graces, now),
                ProbeEvidence::Unanswered { .. }
            )
        })
    };
    let before = unanswered(h);
    h.probe.record(attempt);
    if unanswered(h) != before {
        outcome.evidence_changed = true;
    }
}

fn history_mut<'h>(
    scopes: &'h mut [ScopeHistories<'_>],
    scope: &str,
    vm_id: &str,
) -> Option<&'h mut VmHistory> {
    scopes
        .iter_mut()
        .find(|s| s.scope == scope)?
        .histories
        .get_mut(vm_id)
        .map(|h| &mut **h)
}

#[cfg(test)]
mod tests;
