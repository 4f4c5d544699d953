//! `capc-health-shim check`: poll one CloudStack scope N times, keep the history between
//! polls and print one verdict per VM — the verdict engine without Kubernetes.

use std::collections::BTreeMap;
use std::path::PathBuf;

use crate::cli::OutputFormat;
use clap::{Args, ValueEnum};
use jiff::{SignedDuration, Timestamp};
use serde::Serialize;

use crate::cli::{duration_in, to_std, GraceArgs, ProbeArgs};
use crate::cloudstack::client::{CloudStackClient, VmListQuery};
use crate::cloudstack::error::CloudStackError;
use crate::probe::{Prober, ScopeHistories, StepOutcome};
use crate::scope::{Scope, ScopeObserver};
use crate::status::ProbeReport;
use crate::verdict::condition::{ConditionState, DEFAULT_CONDITION_TYPE};
use crate::verdict::probe::ProbeGraces;
use crate::verdict::{decide, Evidence, Graces, MachineFacts, MassFailureGuard, Status, Subject};

mod config;
use config::probe_client_config;
pub use config::{client_config, credentials, query, read_credentials_file};

/// `check` judges one scope: the mass-failure guard's one group.
const SCOPE: &str = "check";

/// Exit codes of `check` (and `demo`).
pub mod exit {
    /// The polls ran and verdicts were printed, whatever they are.
    pub const RAN: u8 = 0;
    /// Bad flags or configuration (clap uses 2 as well).
    pub const USAGE: u8 = 2;
    /// CloudStack could not be reached (transport, timeout, proxy page, 5xx) on any poll.
    pub const UNREACHABLE: u8 = 3;
    /// CloudStack rejected the credentials, the signature, or the role (401/432) on every poll.
    pub const UNAUTHORIZED: u8 = 4;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum UsageHistoryMode {
    /// Use `listVirtualMachinesUsageHistory` when the server and role allow it.
    Auto,
    /// Judge traffic from the counters of the listing alone.
    Off,
}

#[derive(Debug, Clone, Args)]
pub struct CheckArgs {
    /// CloudStack API endpoint, e.g. https://cloud.example.com/client/api.
    #[arg(long, env = "CLOUDSTACK_API_URL")]
    pub api_url: Option<String>,
    /// API key (prefer the environment or --credentials-file over argv).
    #[arg(long, env = "CLOUDSTACK_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Secret key (prefer the environment or --credentials-file over argv).
    #[arg(long, env = "CLOUDSTACK_SECRET_KEY", hide_env_values = true)]
    pub secret_key: Option<String>,
    /// Credentials in the CAPC Secret's keys (`api-url`, `api-key`, `secret-key`,
    /// `verify-ssl`): a file of `key: value` lines, or a directory with one file per key
    /// (a mounted Secret). Flags and environment override its values.
    #[arg(long, env = "CLOUDSTACK_CREDENTIALS_FILE", value_name = "PATH")]
    pub credentials_file: Option<PathBuf>,
    /// Project id (`-1` for all projects the key can see).
    #[arg(long, env = "CAPC_HEALTH_PROJECT")]
    pub project: Option<String>,
    /// Zone id.
    #[arg(long, env = "CAPC_HEALTH_ZONE")]
    pub zone: Option<String>,
    /// Account name (with --domain-id).
    #[arg(long, env = "CAPC_HEALTH_ACCOUNT", requires = "domain_id")]
    pub account: Option<String>,
    /// Domain id (with --account).
    #[arg(long, env = "CAPC_HEALTH_DOMAIN_ID")]
    pub domain_id: Option<String>,
    /// VM ids to judge (repeatable); default: every VM the listing shows.
    #[arg(
        long = "vm",
        env = "CAPC_HEALTH_VM",
        value_delimiter = ',',
        value_name = "ID"
    )]
    pub vms: Vec<String>,
    /// How many polls to run.
    #[arg(long, env = "CAPC_HEALTH_POLLS", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub polls: u32,
    /// Time between polls (also the poll interval the graces assume). Sub-second values are
    /// for simulators whose clock runs fast.
    #[arg(long, env = "CAPC_HEALTH_INTERVAL", default_value = "30s", value_parser = duration_in(SignedDuration::from_millis(100), SignedDuration::from_hours(1)))]
    pub interval: SignedDuration,
    /// Stop early once no verdict is waiting on a grace and the last two polls agree.
    #[arg(long, env = "CAPC_HEALTH_UNTIL_SETTLED")]
    pub until_settled: bool,
    /// Use listVirtualMachinesMetrics (CAPC's call) instead of listVirtualMachines.
    #[arg(long, env = "CAPC_HEALTH_METRICS_API")]
    pub metrics_api: bool,
    #[arg(
        long,
        env = "CAPC_HEALTH_USAGE_HISTORY",
        value_enum,
        default_value = "auto"
    )]
    pub usage_history: UsageHistoryMode,
    /// Do not verify the endpoint's TLS certificate (like `verify-ssl: "false"`).
    #[arg(long, env = "CAPC_HEALTH_INSECURE_SKIP_TLS_VERIFY")]
    pub insecure_skip_tls_verify: bool,
    /// Extra CA certificates (PEM) to trust for the endpoint.
    #[arg(
        long = "ca-file",
        visible_alias = "ca-bundle",
        env = "CAPC_HEALTH_CA_FILE",
        value_name = "FILE"
    )]
    pub ca_bundle: Option<PathBuf>,
    /// Timeout of one HTTP request.
    #[arg(long, env = "CAPC_HEALTH_REQUEST_TIMEOUT", default_value = "15s", value_parser = duration_in(SignedDuration::from_secs(1), SignedDuration::from_mins(10)))]
    pub request_timeout: SignedDuration,
    #[arg(
        short = 'o',
        long,
        env = "CAPC_HEALTH_OUTPUT",
        value_enum,
        default_value = "table"
    )]
    pub output: OutputFormat,
    #[command(flatten)]
    pub graces: GraceArgs,
    /// The opt-in guest probe's key (a file like --credentials-file, of an account whose role
    /// has type Admin; docs/guest-probe.md). Without it the probe is off.
    #[arg(long, env = "CAPC_HEALTH_PROBE_CREDENTIALS_FILE", value_name = "PATH")]
    pub probe_credentials_file: Option<PathBuf>,
    #[command(flatten)]
    pub probe: ProbeArgs,
}

/// One VM's line of output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VmReport {
    pub vm_id: String,
    pub name: String,
    pub state: String,
    pub verdict: Status,
    pub reason: String,
    pub message: String,
    /// When the verdict's status last changed (the condition's lastTransitionTime).
    pub since: Timestamp,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_change: Option<Timestamp>,
}

/// What one poll did.
#[derive(Debug, Clone, PartialEq)]
pub struct PollReport {
    pub listing_error: Option<CloudStackError>,
    pub vms_listed: usize,
    pub complete: bool,
    pub usage_history_note: Option<String>,
    /// Why statistics or capabilities are missing this poll, if they are.
    pub stats_notes: Vec<String>,
}

/// The state `check` and `demo` keep between polls of one scope.
pub struct Checker {
    scope: Scope,
    graces: Graces,
    guard: MassFailureGuard,
    conditions: BTreeMap<String, ConditionState>,
    previous: Vec<(String, Status, String)>,
    stable_since: Option<Timestamp>,
    /// The opt-in guest probe, when given a key.
    prober: Option<Prober>,
}

impl Checker {
    pub fn new(
        client: CloudStackClient,
        query: VmListQuery,
        tracked: &[String],
        graces: Graces,
        guard: MassFailureGuard,
        usage_history: UsageHistoryMode,
    ) -> Self {
        let observer = if tracked.is_empty() {
            ScopeObserver::tracking_all()
        } else {
            ScopeObserver::tracking(tracked.iter().map(|id| id.to_ascii_lowercase()))
        };
        Self {
            scope: Scope::new(
                client,
                query,
                observer,
                usage_history == UsageHistoryMode::Auto,
            ),
            graces,
            guard,
            conditions: BTreeMap::new(),
            previous: Vec::new(),
            stable_since: None,
            prober: None,
        }
    }

    /// Probes the guests of this scope with `prober` (its key must reach the same endpoint),
    /// paced by `pacing`. `check` sees VMs, not Machines: every tracked VM counts as one
    /// without a Node.
    pub fn with_prober(mut self, prober: Prober, pacing: ProbeGraces) -> Self {
        self.graces.probe = Some(pacing);
        self.prober = Some(prober);
        self
    }

    /// One step of the guest probe at `now`: collect finished jobs, start due ones (a no-op
    /// without a prober). `poll` runs one itself; call it between polls as time passes.
    pub async fn probe_step(&mut self, now: Timestamp) -> StepOutcome {
        let Some(prober) = self.prober.as_mut() else {
            return StepOutcome::default();
        };
        let mut scopes = [ScopeHistories {
            scope: SCOPE,
            histories: &mut self.scope.observer.histories,
        }];
        prober
            .step(
                &mut scopes,
                &|_| Some(MachineFacts::default()),
                &self.graces,
                now,
            )
            .await
    }

    /// What the probe has done, when there is one.
    pub fn probe_report(&self) -> Option<ProbeReport> {
        self.prober.as_ref().map(Prober::report)
    }

    /// How often `run_polls` steps the probe between polls (`None`: no probe).
    fn probe_tick(&self) -> Option<std::time::Duration> {
        self.prober.as_ref()?;
        Some(crate::probe::probe_tick(
            self.graces.probe.as_ref()?.spacing,
        ))
    }

    pub fn client(&self) -> &CloudStackClient {
        &self.scope.client
    }

    /// Stops judging a VM (its Machine is gone), as the controller drops the histories of
    /// Machines it no longer sees. Returns whether the VM was tracked. (A checker that
    /// tracks every listed VM picks it up again at the next listing.)
    pub fn forget(&mut self, vm_id: &str) -> bool {
        self.conditions.remove(vm_id);
        self.scope.observer.histories.remove(vm_id).is_some()
    }

    /// Polls the scope once and folds the result into every VM's history.
    pub async fn poll(&mut self, now: Timestamp) -> PollReport {
        let o = self.scope.poll(&self.graces, now).await;
        crate::verdict::mark_paused_collections(
            self.scope.observer.histories.values_mut().map(|h| &mut **h),
            &self.graces,
            now,
        );
        if o.listing_error.is_none() {
            self.probe_step(now).await;
        }
        PollReport {
            listing_error: o.listing_error,
            vms_listed: o.vms_listed,
            complete: o.complete,
            usage_history_note: o.usage_history_note,
            stats_notes: [o.stats_note, o.capabilities_note]
                .into_iter()
                .flatten()
                .collect(),
        }
    }

    /// Asks traffic statistics only for these VMs from now on, as the controller does for
    /// Machines without a Node (`check` itself asks for every VM).
    pub fn want_stats_for(&mut self, vm_ids: impl IntoIterator<Item = String>) {
        self.scope.observer.stats_wanted = Some(vm_ids.into_iter().collect());
    }

    /// The statistics cadence and semantics in force (shown by `check` on stderr).
    pub fn stats_summary(&self) -> crate::scope::StatsSummary {
        self.scope.observer.stats_summary(&self.graces)
    }

    /// Judges paused stats collection over several checkers of one CloudStack together (a
    /// host's VMs may belong to different scopes); `poll` already does it per checker.
    pub fn mark_paused_collections(checkers: &mut [Checker], now: Timestamp) {
        let Some(graces) = checkers.first().map(|c| c.graces.clone()) else {
            return;
        };
        crate::verdict::mark_paused_collections(
            checkers
                .iter_mut()
                .flat_map(|c| c.scope.observer.histories.values_mut())
                .map(|h| &mut **h),
            &graces,
            now,
        );
    }

    /// The verdicts at `now` from the decision pipeline the controller runs
    /// ([`crate::verdict::decide`]: evaluate → mass-failure guard → condition), with stable
    /// transition times. `check` sees VMs, not Machines: no Node, not deleting.
    pub fn verdicts(&mut self, now: Timestamp) -> Vec<VmReport> {
        let mut ids: Vec<&String> = self.scope.observer.histories.keys().collect();
        ids.sort();
        let subjects: Vec<Subject> = ids
            .iter()
            .map(|id| Subject {
                scope: Some(SCOPE),
                evidence: Evidence::Observed(&self.scope.observer.histories[*id]),
                facts: MachineFacts::default(),
                published: self.conditions.get(*id),
            })
            .collect();
        let decision = decide(&subjects, &self.graces, &self.guard, now);
        let conditions = decision.conditions(&subjects, DEFAULT_CONDITION_TYPE, now);
        let mut out = Vec::with_capacity(ids.len());
        let mut published = Vec::with_capacity(ids.len());
        for ((id, verdict), condition) in ids.iter().zip(&decision.verdicts).zip(conditions) {
            let (Some(verdict), Some(condition)) = (verdict, condition) else {
                continue;
            };
            let h = &self.scope.observer.histories[*id];
            out.push(VmReport {
                vm_id: (*id).clone(),
                name: h
                    .sighting
                    .as_ref()
                    .map(|s| s.name.clone())
                    .unwrap_or_default(),
                state: match (&h.sighting, h.absent_polls) {
                    (_, n) if n > 0 => "(absent)".to_string(),
                    (Some(s), _) => s.state.to_string(),
                    (None, _) => "(not seen)".to_string(),
                },
                verdict: condition.status,
                reason: condition.reason.clone(),
                message: condition.message.clone(),
                since: condition.last_transition_time,
                next_change: verdict.next_change,
            });
            published.push(((*id).clone(), condition));
        }
        drop(subjects);
        self.conditions.extend(published);
        out
    }

    /// Settled: nothing waits on a grace and no verdict has changed for a whole evidence
    /// window (the traffic samples needed to call a guest silent, plus two), so a VM whose
    /// stats have not arrived yet is not mistaken for a settled one.
    pub fn settled(&mut self, reports: &[VmReport], now: Timestamp) -> bool {
        let current: Vec<(String, Status, String)> = reports
            .iter()
            .map(|r| (r.vm_id.clone(), r.verdict, r.reason.clone()))
            .collect();
        if current.is_empty() || current != self.previous {
            self.previous = current;
            self.stable_since = Some(now);
            return false;
        }
        let window = self.graces.stats_interval
            * i32::try_from(self.graces.silent_samples.saturating_add(2)).unwrap_or(i32::MAX);
        let stable_for = self
            .stable_since
            .map_or(SignedDuration::ZERO, |t| now.duration_since(t));
        stable_for >= window && reports.iter().all(|r| r.next_change.is_none())
    }
}

/// Runs polls until done (or settled) and returns the final reports plus the exit code.
pub async fn run_polls(
    checker: &mut Checker,
    polls: u32,
    interval: SignedDuration,
    until_settled: bool,
    mut progress: impl FnMut(u32, &PollReport, &[VmReport]),
) -> (Vec<VmReport>, u8) {
    let mut any_success = false;
    let mut last_error: Option<CloudStackError> = None;
    let mut reports = Vec::new();
    for n in 1..=polls {
        let started = std::time::Instant::now();
        let now = Timestamp::now();
        let poll = checker.poll(now).await;
        match &poll.listing_error {
            None => any_success = true,
            Some(e) => last_error = Some(e.clone()),
        }
        reports = checker.verdicts(Timestamp::now());
        progress(n, &poll, &reports);
        if until_settled && checker.settled(&reports, Timestamp::now()) {
            break;
        }
        if n < polls {
            let wait = to_std(interval).saturating_sub(started.elapsed());
            match checker.probe_tick() {
                None => tokio::time::sleep(wait).await,
                Some(tick) => {
                    let deadline = tokio::time::Instant::now() + wait;
                    while tokio::time::Instant::now() < deadline {
                        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                        tokio::time::sleep(left.min(tick)).await;
                        checker.probe_step(Timestamp::now()).await;
                    }
                }
            }
        }
    }
    let code = match (any_success, last_error) {
        (true, _) | (false, None) => exit::RAN,
        (false, Some(e)) if matches!(e.kind(), "unauthorized" | "not_allowed") => {
            exit::UNAUTHORIZED
        }
        (false, Some(_)) => exit::UNREACHABLE,
    };
    (reports, code)
}

/// Renders reports as an aligned table.
pub fn render_table(reports: &[VmReport]) -> String {
    let headers = [
        "VM ID", "NAME", "STATE", "VERDICT", "REASON", "SINCE", "MESSAGE",
    ];
    let rows: Vec<[String; 7]> = reports
        .iter()
        .map(|r| {
            [
                r.vm_id.clone(),
                r.name.clone(),
                r.state.clone(),
                r.verdict.to_string(),
                r.reason.clone(),
                crate::verdict::at(r.since),
                r.message.clone(),
            ]
        })
        .collect();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row.iter()).take(6) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(cell);
                out.push_str(&" ".repeat(widths[i] - cell.chars().count() + 2));
            }
        }
        out.push('\n');
    };
    line(headers.to_vec());
    for row in &rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

pub fn render(reports: &[VmReport], format: OutputFormat) -> String {
    match format {
        OutputFormat::Table => render_table(reports),
        OutputFormat::Json => {
            serde_json::to_string_pretty(reports).unwrap_or_else(|_| "[]".into()) + "\n"
        }
    }
}

/// `capc-health-shim check`.
pub async fn main(args: CheckArgs) -> u8 {
    let cfg = match client_config(&args) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("check: {e}");
            return exit::USAGE;
        }
    };
    let client = match CloudStackClient::new(cfg) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("check: {e}");
            return exit::USAGE;
        }
    };
    let graces = args.graces.graces(args.interval);
    let pacing = args.probe.graces(graces.stats_interval);
    let mut checker = Checker::new(
        client,
        query(&args),
        &args.vms,
        graces,
        args.graces.guard(),
        args.usage_history,
    );
    if let Some(path) = &args.probe_credentials_file {
        let prober = match probe_client_config(&args, path).and_then(|cfg| {
            CloudStackClient::new(cfg)
                .map_err(|e| format!("probe credentials {}: {e}", path.display()))
        }) {
            Ok(client) => Prober::new(client, args.probe.limits()),
            Err(e) => {
                eprintln!("check: {e}");
                return exit::USAGE;
            }
        };
        if !prober.covers(checker.client().api_url()) {
            eprintln!(
                "check: the probe key's api-url is not the endpoint being checked ({})",
                checker.client().api_url()
            );
            return exit::USAGE;
        }
        checker = checker.with_prober(prober, pacing);
    }
    let (reports, code) = run_polls(
        &mut checker,
        args.polls,
        args.interval,
        args.until_settled,
        |n, poll, _| {
            if let Some(e) = &poll.listing_error {
                eprintln!("poll {n}: {e}");
            }
            if let Some(note) = &poll.usage_history_note {
                eprintln!("poll {n}: {note}");
            }
            for note in &poll.stats_notes {
                eprintln!("poll {n}: {note}");
            }
        },
    )
    .await;
    eprintln!("stats: {}", checker.stats_summary());
    if let Some(p) = checker.probe_report() {
        let c = &p.counts;
        eprintln!(
            "probe: {} jobs, {} replies, {} unanswered, {} without evidence{}",
            c.jobs_started,
            c.replies,
            c.no_replies,
            c.no_evidence,
            p.refused
                .map(|why| format!("; key refused: {why}"))
                .unwrap_or_default()
        );
    }
    print!("{}", render(&reports, args.output));
    code
}
