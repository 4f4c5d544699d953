//! One poll cycle of the controller, as named phases:
//!
//! 1. [gather](super::gather): watched objects → targets; credentials → scopes.
//! 2. [poll](super::poll): one CloudStack listing per scope into the VM histories; then
//!    [probing](super::probing): the opt-in guest probe collects answers and starts due
//!    probes (it also steps between cycles); then [orphans](super::orphans): the listings and
//!    the watched CloudStackMachines into the orphan report (and what the listings say of
//!    deleting CloudStackMachines' VMs into the [remnant](super::remnants) report).
//! 3. [decide](super::decide): the one decision pipeline (`verdict::decide`), with the
//!    NodeNotLinked lookup between its passes.
//! 4. [act](super::act): one Event per newly reported orphan and remnant (the remnant
//!    finder runs here, over the metadata watches), condition writes with their
//!    Events, the remediate annotation — handed to the [writer](super::writer) task, which
//!    sends each behind the leader Lease and its own timeout.
//! 5. [scoring](super::scoring): every Machine's cycle into the scorecard; the outcomes that
//!    ended into their counters.
//!    Then [incidents](super::incidents): a scope where many Machines fail at once, and the
//!    one thing their VMs share (one router lookup per incident; Events on its Clusters).
//! 6. [report](super::report): `/status` and the verdict gauges.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use jiff::Timestamp;
use kube::Client;
use tracing::Instrument;

use super::config::RunArgs;
use super::gather::ScopeState;
use super::kube_io::{Events, Resources, Stores};
use super::leadership::LeaseGate;
use crate::cli::to_std;
use crate::metrics::Metrics;
use crate::status::board::StatusBoard;
use crate::verdict::{ConditionState, Graces, MassFailureGuard};
use capi_model::apis::ApiChoice;

pub use super::decide::CREDENTIALS_UNAVAILABLE;
pub use super::poll::backoff_intervals;

/// The controller's state between cycles.
pub struct Controller {
    pub(super) client: Client,
    pub(super) args: RunArgs,
    pub(super) api: ApiChoice,
    pub(super) resources: Resources,
    pub(super) stores: Stores,
    pub(super) events: Events,
    pub(super) graces: Graces,
    pub(super) guard: MassFailureGuard,
    pub(super) report: Arc<StatusBoard>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) lease: Arc<LeaseGate>,
    pub(super) scopes: BTreeMap<String, ScopeState>,
    /// Per endpoint (failure domain Secret × project × zone): the scope it was last polled
    /// through, so a Secret read that fails briefly keeps it.
    pub(super) endpoints: HashMap<super::targets::EndpointRef, super::gather::EndpointMemory>,
    /// Per Machine uid that cannot be polled at all (credentials or failure domain missing):
    /// the first cycle this process found it so (`verdict::standing::blind_grace_holds`).
    pub(super) blind_since: HashMap<String, jiff::Timestamp>,
    /// What this process last wrote per Machine uid: the watch cache can lag behind our own
    /// writes, and a lagging read must not cause a second write.
    pub(super) written: HashMap<String, Written>,
    /// The Machines' targets, joined again per watch change (`joins`).
    pub(super) targets: super::joins::TargetIndex,
    /// The opt-in guest probe (off without `--probe-credentials`).
    pub(super) probing: super::probing::Probing,
    /// The orphan report (off with `--no-orphan-report`).
    pub(super) orphans: Option<crate::orphans::OrphanFinder>,
    /// The remnant report (on with [`Controller::with_remnant_report`]; `run` turns it on
    /// unless `--no-remnant-report`).
    pub(super) remnants: Option<super::remnants::RemnantReport>,
    /// Where the orphan finder's memory is kept for the next leader
    /// ([`Controller::with_memory`]).
    pub(super) memory: Option<super::memory::MemoryStore>,
    /// The writer task (started on the first write).
    pub(super) writer: Option<super::writer::Writer>,
    /// Writes handed to the writer and not finished.
    pub(super) pending: super::act::PendingWrites,
    /// Machines (`namespace/name`) whose last condition write failed, with why.
    pub(super) write_errors: HashMap<String, String>,
    /// Why writes were refused since the last cycle (the first refusal stands for all).
    pub(super) refusal: Option<String>,
    /// Whether a cycle waits for its writes (tests: a cycle and its writes as one step) or
    /// leaves them to the writer (`run`: [`Controller::detached_writes`]).
    pub(super) wait_for_writes: bool,
    /// What the shim did, or would have done, on each Machine (issue 44).
    pub(super) scorecard: crate::verdict::scorecard::Scorecard,
    /// Where the scorecard's counts are kept for the next leader
    /// ([`Controller::with_scorecard_memory`]).
    pub(super) scorecard_memory: Option<super::scorecard_memory::ScorecardStore>,
    /// The open incidents per scope (issue 45).
    pub(super) incidents: crate::verdict::incidents::book::IncidentBook,
}

/// A condition this process wrote, and the version of the Machine it was based on.
#[derive(Debug, Clone)]
pub(super) struct Written {
    pub condition: std::sync::Arc<ConditionState>,
    pub based_on: Option<String>,
}

/// What a cycle did, for logs and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CycleSummary {
    pub machines: usize,
    pub scopes: usize,
    /// Condition writes whose success this cycle took in from the writer (with detached
    /// writes: sent since the last cycle, not necessarily decided by this one).
    pub condition_writes: usize,
    /// Remediate annotations likewise.
    pub annotations: usize,
    /// Writes not sent because the leader Lease could not be confirmed.
    pub refused_writes: usize,
    /// Writes not queued because the writer's queue was full (decided again next cycle).
    pub dropped_writes: usize,
    /// Queued writes not sent: the cycle had decided otherwise for the Machine by their turn.
    pub superseded_writes: usize,
    /// Queued writes not sent: they waited past the writer's age bound.
    pub stale_writes: usize,
    /// Writes the API server refused: the Machine was recreated or changed since the decision.
    pub precondition_failed_writes: usize,
    /// The Lease turned out to be someone else's: this replica must stop.
    pub lost_lease: bool,
    pub problems: Vec<String>,
}

impl Controller {
    /// A controller that writes without leader election; [`Controller::leading_by`] puts a
    /// Lease in front of its writes.
    pub fn new(
        client: Client,
        args: RunArgs,
        api: ApiChoice,
        resources: Resources,
        stores: Stores,
        report: Arc<StatusBoard>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let mut graces = args.graces.graces(args.poll_interval);
        if args.probe_credentials.is_some() {
            graces.probe = Some(args.probe.graces(graces.stats_interval));
        }
        let guard = args.graces.guard();
        let events = Events::new(&client, &resources.machine);
        let lease = Arc::new(LeaseGate::unelected(to_std(args.kube_timeout)));
        let orphans =
            (!args.no_orphan_report).then(|| crate::orphans::OrphanFinder::new(args.orphan_grace));
        let scorecard = crate::verdict::scorecard::Scorecard::new(
            Timestamp::now(),
            args.scorecard_settle,
            args.scorecard_window,
        );
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
            lease,
            scopes: BTreeMap::new(),
            endpoints: HashMap::new(),
            blind_since: HashMap::new(),
            written: HashMap::new(),
            targets: Default::default(),
            probing: Default::default(),
            orphans,
            remnants: None,
            memory: None,
            writer: None,
            pending: Default::default(),
            write_errors: HashMap::new(),
            refusal: None,
            wait_for_writes: true,
            scorecard,
            scorecard_memory: None,
            incidents: Default::default(),
        }
    }

    /// Cycles hand their writes to the writer task and return without waiting for them
    /// (`run`); a cycle takes in the outcomes that arrived since the last.
    pub fn detached_writes(mut self) -> Self {
        self.wait_for_writes = false;
        self
    }

    /// The metrics it records into.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The watch caches it reads (a test waits on them to know what the next step sees).
    pub fn stores(&self) -> &Stores {
        &self.stores
    }

    /// Confirms `lease` before every write.
    pub fn leading_by(mut self, lease: Arc<LeaseGate>) -> Self {
        self.lease = lease;
        self
    }

    /// Runs one cycle at `now`: gather → poll → decide → act → report.
    pub async fn cycle(&mut self, now: Timestamp) -> CycleSummary {
        let started = std::time::Instant::now();
        let span = tracing::info_span!("cycle", at = %now);
        let summary = async {
            let mut summary = CycleSummary::default();
            // First, so that a write that failed since the last cycle is not laid over the
            // watch cache as if the Machine carried it.
            self.pending.annotated_now.clear();
            self.take_outcomes(&mut summary);
            let gathered = self.gather(now, &mut summary).await;
            self.refresh_probe_key().await;
            self.poll(now).await;
            // Right after the poll: a first flat sample is the moment to ask the guest, and
            // answers that came in since the last step count in this cycle's decisions.
            self.note_probe_facts(&gathered);
            self.probe_step(now).await;
            self.look_up_destroy_errors(&gathered).await;
            self.note_remnant_vms(&gathered);
            let new_orphans = self.find_orphans(&gathered, now);
            self.keep_memory(now).await;
            let decided = self.decide(&gathered, now, &mut summary).await;
            self.announce_orphans(&new_orphans, &mut summary);
            self.find_remnants(now, &mut summary);
            let acted = self.act(&gathered, &decided, now, &mut summary).await;
            self.score(&gathered, &decided, &acted, now);
            let incidents = self
                .find_incidents(&gathered, &decided, now, &mut summary)
                .await;
            self.keep_scorecard(now).await;
            self.report(&gathered, &decided, acted, incidents, &summary, now)
                .await;
            summary
        }
        .instrument(span)
        .await;
        self.metrics.observe_cycle(started.elapsed().as_secs_f64());
        summary
    }
}
