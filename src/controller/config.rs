//! Flags of `capc-health-shim run`, each with an environment fallback. Invalid values fail at
//! start-up with a message naming the flag (clap does the naming).

use clap::{Args, ValueEnum};
use jiff::SignedDuration;

use crate::cli::{duration_in, parse_duration, parse_rate_limit, GraceArgs, ProbeArgs};
use capi_model::apis::Mode;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModeFlag {
    /// Detect from the served APIs (annotate for CAPI ≤ 1.11, condition for 1.12+).
    Auto,
    Annotate,
    Condition,
    Observe,
}

impl ModeFlag {
    pub fn forced(self) -> Option<Mode> {
        match self {
            Self::Auto => None,
            Self::Annotate => Some(Mode::Annotate),
            Self::Condition => Some(Mode::Condition),
            Self::Observe => Some(Mode::Observe),
        }
    }
}

/// `URL=NAMESPACE/NAME`: use that Secret's keys for the CloudStack endpoint at URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointOverride {
    pub api_url: String,
    pub namespace: String,
    pub name: String,
}

pub fn parse_override(s: &str) -> Result<EndpointOverride, String> {
    let (url, secret) = s
        .rsplit_once('=')
        .ok_or_else(|| format!("{s:?}: expected API_URL=NAMESPACE/SECRET"))?;
    let (namespace, name) = secret
        .split_once('/')
        .filter(|(ns, n)| !ns.is_empty() && !n.is_empty())
        .ok_or_else(|| format!("{s:?}: the Secret must be given as NAMESPACE/NAME"))?;
    url::Url::parse(url).map_err(|e| format!("{s:?}: {url:?} is not a URL ({e})"))?;
    Ok(EndpointOverride {
        api_url: url.to_string(),
        namespace: namespace.to_string(),
        name: name.to_string(),
    })
}

/// The leader Lease: valid this long after each renewal, renewed this long before it runs out.
pub const LEASE_SECONDS: u64 = 15;
pub const LEASE_RENEW_BEFORE_SECONDS: u64 = 7;
/// How long before the Lease's end a write must be over (clock skew between replicas).
pub const LEASE_SKEW_MARGIN: SignedDuration = SignedDuration::from_secs(1);

/// Longest `--kube-timeout`: a write is sent only if it ends, with the skew margin, strictly
/// before the Lease does; when the renewal is due `LEASE_RENEW_BEFORE_SECONDS` are left, and
/// the renewal call itself takes up to a second more. A longer timeout would refuse writes in
/// part of every Lease period (8–10 s once were accepted and did).
/// `lease_leaves_room_for_every_write` checks it against `lease::may_write`.
pub const MAX_KUBE_TIMEOUT: SignedDuration =
    SignedDuration::from_secs(LEASE_RENEW_BEFORE_SECONDS as i64 - LEASE_SKEW_MARGIN.as_secs() - 1);

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Time between polls of each CloudStack scope (jittered by ±10%).
    #[arg(long, env = "CAPC_HEALTH_POLL_INTERVAL", default_value = "30s", value_parser = duration_in(SignedDuration::from_secs(1), SignedDuration::from_hours(1)))]
    pub poll_interval: SignedDuration,
    /// How long a verdict must stay False before the remediate-machine annotation is set (annotate mode).
    #[arg(long, env = "CAPC_HEALTH_ESCALATION_DELAY", default_value = "60s", value_parser = parse_duration)]
    pub escalation_delay: SignedDuration,
    /// The Machine condition type the shim owns.
    #[arg(long, env = "CAPC_HEALTH_CONDITION_TYPE", default_value = crate::verdict::condition::DEFAULT_CONDITION_TYPE)]
    pub condition_type: String,
    /// Remediation mode.
    #[arg(long, env = "CAPC_HEALTH_MODE", value_enum, default_value = "auto")]
    pub mode: ModeFlag,
    /// Namespaces whose Machines are judged (repeatable; default: all).
    #[arg(
        long = "namespace",
        env = "CAPC_HEALTH_NAMESPACES",
        value_delimiter = ','
    )]
    pub namespaces: Vec<String>,
    /// Listener for /status and /metrics (HTTPS; a bearer token the Kubernetes API
    /// authenticates and authorizes, see docs/status-and-metrics.md) and /healthz, /readyz
    /// (open to anyone).
    #[arg(long, env = "CAPC_HEALTH_STATUS_ADDR", default_value = "0.0.0.0:8443")]
    pub status_addr: String,
    #[command(flatten)]
    pub serving: crate::http::ServingArgs,
    /// Use another Secret's keys (e.g. a read-only key) for an endpoint: API_URL=NAMESPACE/NAME (repeatable).
    #[arg(long = "endpoint-credentials", env = "CAPC_HEALTH_ENDPOINT_CREDENTIALS", value_delimiter = ',', value_parser = parse_override)]
    pub endpoint_credentials: Vec<EndpointOverride>,
    /// Timeout for the workload-cluster Node lookup of the NodeNotLinked guard (unused with
    /// --no-workload-node-lookup).
    #[arg(long, env = "CAPC_HEALTH_WORKLOAD_TIMEOUT", default_value = "5s", value_parser = duration_in(SignedDuration::from_secs(1), SignedDuration::from_mins(5)))]
    pub workload_timeout: SignedDuration,
    /// Timeout of one CloudStack HTTP request.
    #[arg(long, env = "CAPC_HEALTH_REQUEST_TIMEOUT", default_value = "15s", value_parser = duration_in(SignedDuration::from_secs(1), SignedDuration::from_mins(10)))]
    pub request_timeout: SignedDuration,
    /// How long one scope's poll (all its pages and retries) may take before it counts as
    /// failed. Scopes are polled at once, so a cycle waits for the slowest of them, at most this
    /// long, instead of for the sum of every slow endpoint. The usage history stops shortly
    /// before it and keeps what came back; the VMs it did not reach are asked first next poll.
    /// It also sets the budgets of a cycle's other waits: the Secret reads may take a quarter of
    /// it, the remnant report's destroy-job listings a quarter, the NodeNotLinked lookups half.
    #[arg(long, env = "CAPC_HEALTH_POLL_DEADLINE", default_value = "60s", value_parser = duration_in(SignedDuration::from_secs(1), SignedDuration::from_hours(1)))]
    pub poll_deadline: SignedDuration,
    /// Client-side rate limit per endpoint and key (one budget for all its zones and projects), requests per second; 0 turns it off.
    #[arg(long, env = "CAPC_HEALTH_RATE_LIMIT", default_value_t = 5.0, value_parser = parse_rate_limit)]
    pub rate_limit: f64,
    /// Timeout of each call to the management cluster's API server: every write (condition,
    /// annotation, Event), Secret read and Lease confirmation. A write must end this long before
    /// the leader Lease could expire, or it is not sent; at most 5s, so that every write fits
    /// between two renewals of the 15 s Lease.
    #[arg(long, env = "CAPC_HEALTH_KUBE_TIMEOUT", default_value = "5s", value_parser = duration_in(SignedDuration::from_secs(1), MAX_KUBE_TIMEOUT))]
    pub kube_timeout: SignedDuration,
    /// Condition writes (each with its Event) in flight at once; a cold start writes one per Machine.
    #[arg(long, env = "CAPC_HEALTH_MAX_CONCURRENT_WRITES", default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub max_concurrent_writes: u16,
    /// Writes waiting for the writer task at most; a cycle's writes past it are dropped and
    /// decided again next cycle (`capc_health_writes_total{outcome="dropped"}`).
    #[arg(long, env = "CAPC_HEALTH_WRITE_QUEUE", default_value_t = 16384, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub write_queue: u32,
    /// Skip leader election (single replica, tests).
    #[arg(long, env = "CAPC_HEALTH_NO_LEADER_ELECTION")]
    pub no_leader_election: bool,
    /// Lease name for leader election.
    #[arg(
        long,
        env = "CAPC_HEALTH_LEASE_NAME",
        default_value = "capc-health-shim"
    )]
    pub lease_name: String,
    /// Lease namespace (default: the pod's namespace, else `default`).
    #[arg(long, env = "CAPC_HEALTH_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,
    #[command(flatten)]
    pub graces: GraceArgs,
    /// The opt-in guest probe's key: a Secret (api-url, api-key, secret-key[, verify-ssl]) of
    /// a CloudStack account whose role has type Admin (runDiagnostics is Admin-only), used for
    /// nothing else; see hack/cloudstack-role/ and docs/guest-probe.md. Without it the probe
    /// is off.
    #[arg(long, env = "CAPC_HEALTH_PROBE_CREDENTIALS", value_name = "NAMESPACE/NAME", value_parser = parse_secret_ref)]
    pub probe_credentials: Option<SecretRef>,
    #[command(flatten)]
    pub probe: ProbeArgs,
    /// How long a CloudStack VM must be owned by no CloudStackMachine before it is reported as
    /// an orphan (`/status`, a metric, one Warning Event on its Cluster; never deleted). See
    /// docs/orphans.md.
    #[arg(long, env = "CAPC_HEALTH_ORPHAN_GRACE", default_value = "15m", value_parser = duration_in(SignedDuration::from_secs(1), SignedDuration::from_hours(24 * 7)))]
    pub orphan_grace: SignedDuration,
    /// Do not look for orphan VMs (the scope listings are then kept only for the remnant report).
    #[arg(long, env = "CAPC_HEALTH_NO_ORPHAN_REPORT")]
    pub no_orphan_report: bool,
    /// The ConfigMap, in the shim's own namespace (the Lease's), where the leader keeps what
    /// the orphan report remembers of CloudStackMachines, so that the next leader reports the
    /// VM of one deleted while no shim was watching. See docs/orphans.md.
    #[arg(long, env = "CAPC_HEALTH_ORPHAN_MEMORY_CONFIGMAP", default_value = "capc-health-shim-memory", value_parser = parse_object_name)]
    pub orphan_memory_configmap: String,
    /// How long an object of a CAPC cluster must be stuck deleting (finalizers still on it) or
    /// dangling (its controller owner or its Cluster gone) before it is reported as a remnant
    /// (`/status`, a metric, one Warning Event; never deleted or patched). See docs/orphans.md.
    #[arg(long, env = "CAPC_HEALTH_REMNANT_GRACE", default_value = "15m", value_parser = duration_in(SignedDuration::from_secs(1), SignedDuration::from_hours(24 * 7)))]
    pub remnant_grace: SignedDuration,
    /// Do not look for remnants (no metadata watches of the other CAPI, CABPK, KCP and CAPC
    /// kinds).
    #[arg(long, env = "CAPC_HEALTH_NO_REMNANT_REPORT")]
    pub no_remnant_report: bool,
    /// Never read a workload cluster's `<cluster>-kubeconfig` Secret: turns off the
    /// NodeNotLinked guard's Node lookup, so a Node-less Machine whose VM joined but was not
    /// linked by CAPI is judged on CloudStack's evidence alone (docs/configuration.md). For
    /// installs whose RBAC grants no access to those Secrets.
    #[arg(long, env = "CAPC_HEALTH_NO_WORKLOAD_NODE_LOOKUP")]
    pub no_workload_node_lookup: bool,
    /// How long a Machine with its Node must stay `True` before its story ends in the
    /// scorecard (a `False` before it is then a false alarm; docs/scorecard.md).
    #[arg(long, env = "CAPC_HEALTH_SCORECARD_SETTLE", default_value = "10m", value_parser = duration_in(SignedDuration::from_secs(1), SignedDuration::from_hours(24)))]
    pub scorecard_settle: SignedDuration,
    /// The window of the scorecard's boot baselines (p50/p95/max per template, offering and
    /// zone); a template's p95 is compared with the window before.
    #[arg(long, env = "CAPC_HEALTH_SCORECARD_WINDOW", default_value = "168h", value_parser = duration_in(SignedDuration::from_mins(1), SignedDuration::from_hours(24 * 90)))]
    pub scorecard_window: SignedDuration,
    /// Failing Machines (False, or held by the mass-failure guard) in one CloudStack scope that
    /// make an incident even while the guard does not hold it: the shim then names the host,
    /// router, network, template, offering or zone their VMs share, or says none explains
    /// them (docs/incidents.md).
    #[arg(long, env = "CAPC_HEALTH_INCIDENT_MIN_FAILING", default_value = "5", value_parser = clap::value_parser!(u32).range(2..=100_000))]
    pub incident_min_failing: u32,
}

/// A Secret named as `NAMESPACE/NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRef {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for SecretRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

pub fn parse_secret_ref(s: &str) -> Result<SecretRef, String> {
    s.trim()
        .split_once('/')
        .filter(|(ns, n)| !ns.is_empty() && !n.is_empty() && !n.contains('/'))
        .map(|(namespace, name)| SecretRef {
            namespace: namespace.to_string(),
            name: name.to_string(),
        })
        .ok_or_else(|| format!("{s:?}: the Secret must be given as NAMESPACE/NAME"))
}

/// A Kubernetes object name (a DNS subdomain: lowercase letters, digits, `-` and `.`, at
/// most 253 characters, starting and ending with a letter or digit).
pub fn parse_object_name(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 253
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?} is not a Kubernetes object name (lowercase letters, digits, '-' and '.')"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_names_are_checked() {
        assert_eq!(
            parse_object_name("capc-health-shim-memory").as_deref(),
            Ok("capc-health-shim-memory")
        );
        for bad in ["", "Memory", "-a", "a-", "a/b", "a_b"] {
            assert!(parse_object_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn lease_leaves_room_for_every_write() {
        use crate::k8s::lease::may_write;
        let renewed = jiff::Timestamp::from_second(1_800_000_000).unwrap();
        let expires = renewed + SignedDuration::from_secs(LEASE_SECONDS as i64);
        let renewal_due = LEASE_SECONDS - LEASE_RENEW_BEFORE_SECONDS;
        // Anywhere between two renewals (and a second into a slow renewal), a write of the
        // longest timeout still fits...
        for ms in 0..=(renewal_due * 1000 + 999) {
            let now = renewed + SignedDuration::from_millis(ms as i64);
            assert!(
                may_write(expires, now, MAX_KUBE_TIMEOUT, LEASE_SKEW_MARGIN),
                "a {MAX_KUBE_TIMEOUT:?} write refused {ms} ms after the renewal"
            );
        }
        // ... and one second more would be refused just before the renewal.
        let late = renewed + SignedDuration::from_secs(renewal_due as i64);
        assert!(!may_write(
            expires,
            late,
            MAX_KUBE_TIMEOUT + SignedDuration::from_secs(1),
            LEASE_SKEW_MARGIN
        ));
    }

    #[test]
    fn probe_secrets_are_namespace_slash_name() {
        let r = parse_secret_ref("capc-system/probe-key").unwrap();
        assert_eq!(r.to_string(), "capc-system/probe-key");
        for bad in ["probe-key", "/x", "ns/", "a/b/c", ""] {
            assert!(
                parse_secret_ref(bad)
                    .unwrap_err()
                    .contains("NAMESPACE/NAME"),
                "{bad}"
            );
        }
    }

    #[test]
    fn endpoint_overrides_name_what_is_wrong() {
        let o = parse_override("https://cloud.example/client/api=capc-system/ro-key").unwrap();
        assert_eq!(o.api_url, "https://cloud.example/client/api");
        assert_eq!(
            (o.namespace.as_str(), o.name.as_str()),
            ("capc-system", "ro-key")
        );
        assert!(parse_override("https://x/client/api")
            .unwrap_err()
            .contains("API_URL=NAMESPACE/SECRET"));
        assert!(parse_override("https://x/client/api=justaname")
            .unwrap_err()
            .contains("NAMESPACE/NAME"));
        assert!(parse_override("not a url=ns/n")
            .unwrap_err()
            .contains("not a URL"));
    }
}
