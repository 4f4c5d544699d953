//! What the running controller reports: the `/status` document (product.md §7) and the
//! Prometheus metrics. The controller fills a [`StatusReport`] after every poll cycle; the
//! HTTP side only reads it, through the [`board::StatusBoard`] that renders it once per change.
//! No secret ever enters these types.

pub mod board;

use std::collections::BTreeMap;

use jiff::Timestamp;
use serde::{Deserialize, Serialize};

use crate::verdict::{self, Status};
use capi_model::apis::ApiChoice;

/// The whole `/status` document.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    /// `capc-health-shim` version.
    pub version: String,
    pub generated_at: Option<Timestamp>,
    /// This replica holds the leader Lease (only the leader polls and writes).
    pub leader: bool,
    /// Who holds the leader Lease (its holder identity: the pod's name), as this replica last
    /// read it: on a standby, where the verdicts are. `None` without leader election, or before
    /// the Lease was first read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_identity: Option<String>,
    /// Discovery succeeded and the caches are synced.
    pub ready: bool,
    /// Mode and API versions in use; `None` until discovery succeeded.
    pub api: Option<ApiChoice>,
    /// Problems an operator should look at (discovery, credentials, …), newest last.
    pub problems: Vec<String>,
    /// Per cluster (`namespace/name`) → per Machine name.
    pub clusters: BTreeMap<String, ClusterReport>,
    pub scopes: Vec<ScopeReport>,
    pub failure_domains: Vec<FailureDomainReport>,
    /// The opt-in guest probe; `None` when no probe credentials are configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<ProbeReport>,
    /// CloudStack VMs no CloudStackMachine owns (remnants), by VM id: reported, never deleted.
    #[serde(default)]
    pub orphans: Vec<OrphanReport>,
    #[serde(default)]
    pub orphan_detection: OrphanDetectionReport,
    /// Objects of CAPC clusters left behind (stuck deleting, or their owner or Cluster gone):
    /// reported, never deleted or patched.
    #[serde(default)]
    pub remnants: Vec<crate::remnants::Remnant>,
    #[serde(default)]
    pub remnant_detection: RemnantDetectionReport,
    /// What became of the writes this leader decided, `"<kind>/<outcome>"` → count since it
    /// started leading (the outcomes of `capc_health_writes_total`, `unchanged` aside).
    #[serde(default)]
    pub writes: BTreeMap<String, u64>,
    /// What the shim did, or would have done, on the Machines whose story ended (issue 44);
    /// `None` on a standby (only the leader follows the stories).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scorecard: Option<ScorecardReport>,
    /// Scopes where many Machines fail at once, with the one thing their VMs share (issue 45).
    #[serde(default)]
    pub incidents: Vec<IncidentReport>,
}

/// `/status` `incidents[]`: a scope's open incident — since when, the Machines it affects, the
/// cause their VMs share (kind, id, name, state, coverage among the failing and the healthy)
/// or that none explains them, with the best candidates either way.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IncidentReport {
    pub scope: String,
    pub since: Timestamp,
    /// `guardHeld` or `threshold`.
    pub trigger: verdict::incidents::Trigger,
    /// Failing and healthy Machines of the scope.
    pub failing: usize,
    pub healthy: usize,
    /// The failing Machines (`namespace/name`), at most [`INCIDENT_MACHINES_SHOWN`].
    pub machines: Vec<String>,
    /// Their Clusters (`namespace/name`): each got a Warning Event naming the cause.
    pub clusters: Vec<String>,
    /// The named cause; absent: no shared cause explains them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<verdict::incidents::Cause>,
    pub candidates: Vec<verdict::incidents::Cause>,
    /// One line, as in the Events and `capc-health-shim status`.
    pub summary: String,
    /// The incident's one router lookup, when it made one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub router_lookup: Option<verdict::incidents::book::Lookup>,
}

/// Failing Machines an incident lists by name (the count is always whole).
pub const INCIDENT_MACHINES_SHOWN: usize = 50;

/// `/status` `scorecard`: the outcomes counted since `since`, by outcome, reason and group, the
/// latest ones, and the boot baselines of the current window with their warnings
/// (docs/scorecard.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScorecardReport {
    /// When counting began (kept across leaders with the shim's memory).
    pub since: Timestamp,
    /// How long a Machine with its Node must stay `True` for its story to end.
    pub settle_seconds: i64,
    /// Stories going on now.
    pub following: usize,
    /// Outcome → count and the seconds they add up (saved, `False` → delete, …).
    pub totals: BTreeMap<String, verdict::scorecard::Total>,
    /// Outcome → reason of the `False` → count.
    pub by_reason: BTreeMap<String, BTreeMap<String, u64>>,
    /// `cluster`/`zone`/`template` → value → outcome → count.
    pub groups: BTreeMap<String, BTreeMap<String, BTreeMap<String, u64>>>,
    /// Stories that ended with nothing to say about the shim.
    pub uneventful: u64,
    /// Machines not followed because too many stories were.
    pub untracked: u64,
    /// The latest outcomes, newest last, with their evidence.
    pub recent: Vec<verdict::scorecard::Outcome>,
    pub window_start: Timestamp,
    pub window_seconds: i64,
    pub baselines: Vec<verdict::scorecard::BaselineRow>,
    pub warnings: Vec<verdict::scorecard::Warning>,
    /// Incidents that ended within the window, oldest first.
    #[serde(default)]
    pub incidents: Vec<verdict::incidents::book::EndedIncident>,
    /// `None` where nothing keeps it (tests without a ConfigMap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<ScorecardMemoryReport>,
}

/// `/status` `scorecard.memory`: where the counts are kept and how that goes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ScorecardMemoryReport {
    /// `namespace/name`.
    pub configmap: String,
    pub read: MemoryRead,
    pub written_at: Option<Timestamp>,
    pub bytes: usize,
    /// What did not fit in its bound at the last write.
    pub left_out: Vec<String>,
    /// A stored scorecard that could not be read is kept aside: the key and why.
    pub kept_aside: Option<String>,
    pub last_error: Option<String>,
}

impl ScorecardMemoryReport {
    /// Whether something keeps the counts from being kept: its read failed (nothing is
    /// written), its last write failed, or an unreadable stored copy is kept aside.
    pub fn troubled(&self) -> bool {
        self.last_error.is_some() || self.kept_aside.is_some()
    }

    /// The `/status` problem lines.
    pub fn problems(&self) -> Vec<String> {
        let mut out: Vec<String> = self.last_error.iter().cloned().collect();
        if let Some(k) = &self.kept_aside {
            out.push(format!(
                "scorecard: ConfigMap {} holds stored counts this shim could not read, kept under {k}; counting started again (remove the key once looked at)",
                self.configmap
            ));
        }
        out
    }
}

/// What `/status` says of the remnant report itself.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RemnantDetectionReport {
    pub enabled: bool,
    pub grace_seconds: f64,
    /// The kinds whose metadata watch has synced: only these are judged.
    pub kinds: Vec<String>,
    /// Served kinds whose watch has not synced (not yet, or RBAC refuses the list).
    pub kinds_not_synced: Vec<String>,
    /// Objects of those kinds seen at the last cycle.
    pub objects: usize,
    /// Objects seen dangling, still within the grace.
    pub suspects: usize,
}

/// How a VM came to be owned by nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OrphanKind {
    /// It was a CloudStackMachine's `instanceID`; that CloudStackMachine is gone and the VM
    /// was never destroyed (a finalizer removed by hand).
    InstanceOfDeleted,
    /// It has the name of a CloudStackMachine that is gone (deleted between CloudStack creating
    /// the VM and CAPC recording it, capc#190).
    NameOfDeleted,
    /// It has the name of a CloudStackMachine that records another VM (a second deploy).
    NameTaken,
}

impl OrphanKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InstanceOfDeleted => "instance-of-deleted",
            Self::NameOfDeleted => "name-of-deleted",
            Self::NameTaken => "name-taken",
        }
    }
}

/// A VM owned by nothing (a suspect until `reported_at` is set, after the grace).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrphanReport {
    pub vm_id: String,
    pub vm_name: String,
    /// Its state at the latest listing.
    pub vm_state: String,
    /// The scope whose listing shows it.
    pub scope: String,
    /// `namespace/name` of the Cluster its CloudStackMachine belonged to, when labelled.
    pub cluster: Option<String>,
    /// `namespace/name` of the CloudStackMachine it belonged to (or is named after).
    pub cloudstack_machine: String,
    pub kind: OrphanKind,
    /// When the shim first saw it owned by nothing.
    pub since: Timestamp,
    /// When it was reported (at least the grace after `since`).
    pub reported_at: Option<Timestamp>,
    pub why: String,
}

/// What `/status` says of the orphan report itself.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct OrphanDetectionReport {
    pub enabled: bool,
    pub grace_seconds: f64,
    /// VMs owned by nothing, still within their grace.
    pub suspects: usize,
    /// CloudStackMachines remembered (present, or gone within the memory).
    pub remembered_machines: usize,
    /// Where that memory is kept for the next leader; `None` when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<MemoryReport>,
}

/// The orphan finder's memory in its ConfigMap.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct MemoryReport {
    /// `namespace/name`.
    pub configmap: String,
    /// CloudStackMachines taken back from it when this leader began.
    pub restored: usize,
    /// CloudStackMachines in the last write, and those left out to fit (the longest gone first).
    pub stored_machines: usize,
    pub dropped: usize,
    /// Compressed size of the last write.
    pub bytes: usize,
    pub written_at: Option<Timestamp>,
    /// The last read or write that failed (the shim goes on without it).
    pub last_error: Option<String>,
    /// How this leader's read of the stored memory went. Until it is `ok` or `absent` (or,
    /// once `unreadable`, until the stored bytes are kept aside) nothing is written over it.
    pub read: MemoryRead,
    /// Whether this leader writes nothing over the stored memory yet: not read (or its reads
    /// fail), or an unreadable one not yet kept aside.
    pub held: bool,
    /// Reads that failed in a row (timeout, 5xx, refused); each cycle tries again.
    pub read_failures: u32,
    /// A stored memory this build could not read, copied aside in the same ConfigMap (an
    /// earlier leader's copy, or this one's); it stays until an operator removes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept_aside: Option<KeptAside>,
}

impl MemoryReport {
    /// What `/status` lists among its problems: the last failure, and a copy kept aside until
    /// an operator has looked at it and removed it.
    pub fn problems(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .last_error
            .iter()
            .map(|e| format!("orphan report: its memory for the next leader: {e}"))
            .collect();
        if let Some(k) = &self.kept_aside {
            out.push(format!(
                "orphan report: ConfigMap {} holds an unreadable memory kept aside under key {} ({} bytes, kept {}): {}; remove that key once looked at",
                self.configmap,
                k.key,
                k.bytes,
                k.kept_at.map_or_else(|| "at an unknown time".to_string(), |t| format!("at {t}")),
                k.reason
            ));
        }
        out
    }
}

/// How a leader's read of the stored orphan memory went.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemoryRead {
    /// Not tried yet.
    #[default]
    Pending,
    /// Read and taken back.
    Ok,
    /// No ConfigMap or no key: nothing to lose.
    Absent,
    /// The GET failed; tried again each cycle, nothing written meanwhile.
    Failed,
    /// Read but not decodable (corrupt, another format, a bad index): kept aside first.
    Unreadable,
}

impl MemoryRead {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Ok => "ok",
            Self::Absent => "absent",
            Self::Failed => "failed",
            Self::Unreadable => "unreadable",
        }
    }
}

/// A stored memory kept aside because it could not be read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct KeptAside {
    /// The ConfigMap key holding the bytes as they were read.
    pub key: String,
    pub bytes: usize,
    /// When and why it was kept aside (from the note stored next to it).
    pub kept_at: Option<Timestamp>,
    pub reason: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterReport {
    pub machines: BTreeMap<String, MachineReport>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MachineReport {
    pub namespace: String,
    pub name: String,
    pub control_plane: bool,
    /// The CloudStack VM id (`CloudStackMachine.spec.instanceID`); `None` before deploy.
    pub vm_id: Option<String>,
    pub vm_state: Option<String>,
    /// `None` when there is nothing to judge yet (no instance id).
    pub verdict: Option<Status>,
    pub reason: Option<String>,
    /// The evidence, as in the condition message.
    pub message: Option<String>,
    /// The condition's lastTransitionTime.
    pub since: Option<Timestamp>,
    /// `none`, `annotated`, `held` or `pending`.
    pub escalation: String,
    /// Why an escalation is held or pending (a `k8s::escalation::hold` reason and detail).
    pub escalation_detail: Option<String>,
    pub mhc_covered: bool,
    /// How a `False` verdict of this Machine will be acted on: `condition` (a covering
    /// MachineHealthCheck lists the shim's condition), `annotation` (the shim sets
    /// `cluster.x-k8s.io/remediate-machine`) or `none: <why>`.
    #[serde(default)]
    pub acted_on: String,
    /// Which MachineHealthCheck acts and after how long, or why the annotation is the path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acted_on_detail: Option<String>,
    /// Scope key the VM is polled in (one shared copy per scope: the key is long, and
    /// thousands of Machines share a few).
    pub scope: Option<std::sync::Arc<str>>,
    /// Console URL for a `False` Machine; reserved: console links are not implemented yet, always `None`.
    pub console_url: Option<String>,
    /// This cycle's condition write failed: what it could not write and why. The verdict
    /// fields then show what the Machine still carries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub write_error: Option<String>,
    /// A verdict decided and not on the Machine yet; the verdict fields show what it carries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending: Option<PendingVerdict>,
}

/// A Machine's verdict that is decided but not published on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PendingVerdict {
    pub verdict: Status,
    pub reason: String,
    /// `held`: a new Machine's first condition waits for its traffic samples; `queued`: handed
    /// to the writer and not written yet.
    pub state: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ScopeReport {
    /// e.g. `https://cloud.example/client/api project=… zone=…` (never a key).
    pub key: String,
    pub api_url: String,
    pub machines: usize,
    pub last_poll: Option<Timestamp>,
    pub last_success: Option<Timestamp>,
    pub last_error: Option<String>,
    pub calls_total: u64,
    /// `command/outcome` → count.
    pub calls: BTreeMap<String, u64>,
    pub rate_limit_wait_seconds: f64,
    /// The mass-failure guard holds this scope's new `False` verdicts.
    pub held: bool,
    /// Backing off after failed polls: the next poll is not before this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_poll: Option<Timestamp>,
    /// The statistics cadence and semantics in force for this scope.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<crate::scope::StatsSummary>,
    /// VMs whose statistics the last poll asked for (Machines without a Node).
    #[serde(default)]
    pub stats_vms_asked: usize,
    /// The Secrets (`namespace/name`) whose credentials this scope polls with: every failure
    /// domain's Secret carrying the same key shares one listing.
    #[serde(default)]
    pub secrets: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FailureDomainReport {
    pub namespace: String,
    pub name: String,
    pub machines: usize,
    pub failing: usize,
    /// `failing / machines` (0 when empty).
    pub failure_ratio: f64,
}

/// What the probe has done since it started: `/status` and the metrics show it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProbeCounts {
    /// Attempts finished, by answer.
    pub replies: u64,
    pub no_replies: u64,
    pub no_evidence: u64,
    /// `runDiagnostics` jobs started (an attempt that falls back to ping starts two).
    pub jobs_started: u64,
    /// `listRouters` calls.
    pub router_lookups: u64,
    /// Due probes not started because their scope's budget for the minute was spent.
    pub skipped_for_budget: u64,
    /// Due probes not started because the jobs in flight were at their cap.
    pub skipped_in_flight_cap: u64,
    /// Due probes not started because their router was still running a job of ours.
    pub skipped_router_busy: u64,
}

/// What `/status` shows of the probe.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct ProbeReport {
    pub enabled: bool,
    /// The endpoint the probe key belongs to (only scopes of this endpoint are probed).
    pub endpoint: Option<String>,
    pub in_flight: usize,
    pub counts: ProbeCounts,
    /// CloudStack refused the probe key: why, once; the probe stays off until the key changes.
    pub refused: Option<String>,
    /// The latest error that was not about one VM (a router lookup that failed, …).
    pub last_error: Option<String>,
}
