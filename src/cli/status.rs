//! `capc-health-shim status`: fetch a running shim's `/status` and render it for humans (or
//! re-print it as JSON with `-o json`). The shim serves `/status` over HTTPS to bearer tokens
//! the Kubernetes API authorizes (docs/status-and-metrics.md).
//!
//! - Without `--url` ([`leader`]): the kubeconfig alone — the Lease names the leader's pod, a
//!   port-forward through the API server reaches it, the token is `--token`/`--token-file`, a
//!   short-lived one of `--service-account`, or the kubeconfig user's own.
//! - With `--url` ([`client`]): that address; the token comes from `--token-file`/`--token`,
//!   or in a pod from its ServiceAccount; its self-signed certificate is accepted only with
//!   `--insecure-skip-tls-verify` (or pinned with `--ca-file`).

mod client;
pub mod leader;

use std::fmt::Write as _;
use std::time::Duration;

use clap::Args;
use jiff::{SignedDuration, Timestamp};

use crate::cli::parse_duration;
use crate::cli::OutputFormat;
use crate::status::{MachineReport, StatusReport};

pub use self::client::{
    fetch, status_url, token_source, BearerToken, ClientAuthArgs, FetchError, FetchOptions,
    TokenSource, IN_CLUSTER_TOKEN,
};

/// Exit codes of `status`.
pub mod exit {
    /// The document was fetched and rendered.
    pub const RENDERED: u8 = 0;
    /// The answer is not a status document (non-200, not JSON, wrong shape, too large).
    pub const NOT_A_STATUS: u8 = 1;
    /// Bad flags (clap uses 2 as well).
    pub const USAGE: u8 = 2;
    /// The URL could not be reached (connection refused, DNS, TLS, timeout).
    pub const UNREACHABLE: u8 = 3;
    /// The shim refused the request: 401 (no token, or one the Kubernetes API does not accept)
    /// or 403 (the token's user may not read `/status`).
    pub const REFUSED: u8 = 4;
    /// Without `--url`: the way to the shim through the Kubernetes API failed (kubeconfig,
    /// Lease, pod, TokenRequest, port-forward refused).
    pub const KUBE: u8 = 5;
}

/// Where and how to ask a running shim for its `/status`: the flags `status` and `orphans`
/// share.
#[derive(Debug, Clone, Args)]
pub struct ShimConnection {
    /// The shim's address, e.g. https://localhost:8443 (`/status` is appended when the URL
    /// has no path) [default: the leader's pod, found through the kubeconfig: its Lease, a
    /// port-forward].
    #[arg(long, env = "CAPC_HEALTH_URL")]
    pub url: Option<String>,
    /// Timeout of the whole request.
    #[arg(long, env = "CAPC_HEALTH_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub timeout: SignedDuration,
    #[command(flatten)]
    pub auth: ClientAuthArgs,
    #[command(
        flatten,
        next_help_heading = "Without --url: through the Kubernetes API"
    )]
    pub kube: leader::KubeTarget,
}

impl ShimConnection {
    /// Fetches `/status` and prints what `render` makes of it; returns the exit code
    /// ([`exit`]). `command` begins every message on stderr.
    pub async fn print(&self, command: &str, render: impl FnOnce(&StatusReport) -> String) -> u8 {
        self.print_view(command, &View::default(), render).await
    }

    /// [`Self::print`] of one view of `/status` (the endpoint's `?cluster=` and `?problems=`,
    /// one Machine's rows).
    pub async fn print_view(
        &self,
        command: &str,
        view: &View,
        render: impl FnOnce(&StatusReport) -> String,
    ) -> u8 {
        let timeout = Duration::try_from(self.timeout).unwrap_or(Duration::from_secs(5));
        let given = match leader::route(self.url.as_deref(), &self.kube) {
            Ok(leader::Route::Url(u)) => u,
            Ok(leader::Route::Kube) => {
                return match leader::via_kube(&self.kube, &self.auth, timeout, view).await {
                    Ok(fetched) => {
                        if let Some(note) = leader::hops_note(&self.kube.namespace, &fetched.hops) {
                            eprintln!("{command}: {note}");
                        }
                        print!("{}", render(&fetched.report));
                        exit::RENDERED
                    }
                    Err(e) => {
                        eprintln!("{command}: {}", e.message());
                        e.exit_code()
                    }
                };
            }
            Err(e) => {
                eprintln!("{command}: {e}");
                return exit::USAGE;
            }
        };
        let url = match status_url(&given) {
            Ok(u) => view.url(u),
            Err(e) => {
                eprintln!("{command}: {e}");
                return exit::USAGE;
            }
        };
        let opts = match self.auth.options(&url, timeout) {
            Ok((opts, warnings)) => {
                for w in warnings {
                    eprintln!("{command}: warning: {w}");
                }
                opts
            }
            Err(e) => {
                eprintln!("{command}: {e}");
                return exit::USAGE;
            }
        };
        match fetch(&url, &opts).await {
            Ok(mut report) => {
                view.keep_machine(&mut report);
                print!("{}", render(&report));
                exit::RENDERED
            }
            Err(e) => {
                eprintln!("{command}: {}", e.message());
                e.exit_code()
            }
        }
    }
}

/// Which part of `/status` to show: the endpoint filters by Cluster and to problems; the
/// Machine filter is applied to what it sent.
#[derive(Debug, Clone, Default, Args)]
pub struct View {
    /// Only this Cluster's Machines and orphans, as `namespace/name` (the endpoint's
    /// `?cluster=`; a Cluster `/status` does not show is an error).
    #[arg(long, env = "CAPC_HEALTH_CLUSTER")]
    pub cluster: Option<String>,
    /// Only the Machines of this name (in every Cluster shown).
    #[arg(long, env = "CAPC_HEALTH_MACHINE")]
    pub machine: Option<String>,
    /// Only what needs a look (the endpoint's `?problems=true`): verdicts not `True`, failed
    /// writes, pending or held escalations, scopes with an error.
    #[arg(long, env = "CAPC_HEALTH_PROBLEMS")]
    pub problems: bool,
}

impl View {
    /// `url` with the view's query.
    pub fn url(&self, mut url: url::Url) -> url::Url {
        {
            let mut q = url.query_pairs_mut();
            if let Some(c) = &self.cluster {
                q.append_pair("cluster", c.trim());
            }
            if self.problems {
                q.append_pair("problems", "true");
            }
        }
        if url.query() == Some("") {
            url.set_query(None);
        }
        url
    }

    /// Drops every Machine but those named `--machine`, and the Clusters left without one.
    pub fn keep_machine(&self, r: &mut StatusReport) {
        let Some(name) = self.machine.as_deref().map(str::trim) else {
            return;
        };
        for c in r.clusters.values_mut() {
            c.machines.retain(|m, _| m == name);
        }
        r.clusters.retain(|_, c| !c.machines.is_empty());
    }
}

#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub shim: ShimConnection,
    #[command(flatten, next_help_heading = "What to show")]
    pub view: View,
    #[arg(
        short = 'o',
        long,
        env = "CAPC_HEALTH_OUTPUT",
        value_enum,
        default_value = "table"
    )]
    pub output: OutputFormat,
}

/// Terminal-safe: control characters (newlines, escapes) become spaces.
pub(crate) fn printable(c: char) -> char {
    if c.is_control() {
        ' '
    } else {
        c
    }
}

pub(crate) fn cell(s: &str) -> String {
    s.chars().map(printable).collect()
}

fn opt(s: Option<&str>) -> String {
    s.map(cell).unwrap_or_else(|| "-".to_string())
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

pub(crate) fn time(t: Option<Timestamp>) -> String {
    t.map(crate::verdict::at).unwrap_or_else(|| "-".to_string())
}

/// An aligned table in the house style (`check`): two spaces between columns, the last
/// column unpadded.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let cells: Vec<&str> = cells.collect();
        for (i, c) in cells.iter().enumerate() {
            out.push_str(c);
            if i + 1 < cells.len() {
                let w = widths.get(i).copied().unwrap_or(0);
                out.push_str(&" ".repeat(w.saturating_sub(c.chars().count()) + 2));
            }
        }
        out.push('\n');
    };
    line(&mut headers.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

fn escalation(m: &MachineReport) -> String {
    match &m.escalation_detail {
        Some(d) if !d.is_empty() => format!("{} ({})", cell(&m.escalation), cell(d)),
        _ => cell(&m.escalation),
    }
}

/// The human view of a status document.
/// What a standby's table must say first: its table is empty by design, the verdicts are on
/// the leader (a port-forward to the Deployment or the Service may land on either replica).
/// `None` on the leader, and without leader election (`leader` false only before it starts).
fn standby_note(r: &StatusReport) -> Option<String> {
    if r.leader {
        return None;
    }
    let identity = r.leader_identity.as_deref()?;
    Some(format!(
        "STANDBY: this replica does not lead; the verdicts are on the leader, pod {} (without --url, `capc-health-shim status` asks the Lease's holder; or port-forward to that pod: kubectl port-forward pod/{} 8443:8443)",
        cell(identity),
        cell(identity)
    ))
}

pub fn render_human(r: &StatusReport) -> String {
    let mut out = String::new();
    let mode = match &r.api {
        Some(api) => format!("{} ({})", api.mode, cell(&api.mode_source)),
        None => "unknown (discovery not done)".to_string(),
    };
    let _ = write!(
        out,
        "mode: {mode}  leader: {}  ready: {}",
        yes_no(r.leader),
        yes_no(r.ready)
    );
    if let Some(api) = &r.api {
        let _ = write!(
            out,
            "  APIs: Machine {}, Cluster {}, MHC {}, CloudStackMachine {}, CloudStackFailureDomain {}",
            api.layout.api_version(),
            cell(&api.cluster_version),
            cell(&api.mhc_version),
            cell(&api.cloudstack_machine_version),
            cell(&api.cloudstack_failure_domain_version),
        );
    }
    out.push('\n');
    let _ = writeln!(
        out,
        "version: {}  generated: {}",
        if r.version.is_empty() {
            "-".to_string()
        } else {
            cell(&r.version)
        },
        time(r.generated_at)
    );
    if let Some(note) = standby_note(r) {
        let _ = writeln!(out, "\n{note}");
    }
    if !r.problems.is_empty() {
        out.push_str("\nPROBLEMS\n");
        for p in &r.problems {
            let _ = writeln!(out, "- {}", cell(p));
        }
    }
    if !r.incidents.is_empty() {
        out.push_str("\nINCIDENTS (many Machines of one scope failing at once)\n");
        for i in &r.incidents {
            let _ = writeln!(
                out,
                "- since {} in {}: {}",
                time(Some(i.since)),
                cell(&i.scope),
                cell(&i.summary)
            );
        }
    }

    out.push('\n');
    let machines: Vec<Vec<String>> = r
        .clusters
        .iter()
        .flat_map(|(cluster, c)| {
            c.machines.iter().map(move |(name, m)| {
                vec![
                    cell(cluster),
                    cell(if m.name.is_empty() { name } else { &m.name }),
                    yes_no(m.control_plane).to_string(),
                    opt(m.vm_id.as_deref()),
                    opt(m.vm_state.as_deref()),
                    m.verdict
                        .map(|v| v.to_string())
                        .unwrap_or_else(|| "-".to_string()),
                    opt(m.reason.as_deref()),
                    time(m.since),
                    escalation(m),
                    // How a False verdict is acted on; a shim before `acted_on` says only
                    // whether an MHC selects the Machine.
                    if m.acted_on.is_empty() {
                        format!("mhc: {}", yes_no(m.mhc_covered))
                    } else {
                        cell(&m.acted_on)
                    },
                    opt(m.message.as_deref()),
                ]
            })
        })
        .collect();
    if machines.is_empty() {
        out.push_str("no Machines tracked\n");
    } else {
        out.push_str(&table(
            &[
                "CLUSTER",
                "MACHINE",
                "CP",
                "VM",
                "STATE",
                "VERDICT",
                "REASON",
                "SINCE",
                "ESCALATION",
                "ACTED ON",
                "MESSAGE",
            ],
            &machines,
        ));
    }

    out.push('\n');
    if r.scopes.is_empty() {
        out.push_str("no CloudStack scopes polled\n");
    } else {
        let rows: Vec<Vec<String>> = r
            .scopes
            .iter()
            .map(|s| {
                vec![
                    cell(&s.key),
                    s.machines.to_string(),
                    time(s.last_poll),
                    opt(s.last_error.as_deref()),
                    s.calls_total.to_string(),
                    yes_no(s.held).to_string(),
                ]
            })
            .collect();
        out.push_str(&table(
            &[
                "SCOPE",
                "MACHINES",
                "LAST POLL",
                "LAST ERROR",
                "CALLS",
                "HELD",
            ],
            &rows,
        ));
    }

    if !r.failure_domains.is_empty() {
        out.push('\n');
        let rows: Vec<Vec<String>> = r
            .failure_domains
            .iter()
            .map(|f| {
                let ratio = if f.failure_ratio.is_finite() {
                    format!("{:.0}%", f.failure_ratio * 100.0)
                } else {
                    "-".to_string()
                };
                vec![
                    format!("{}/{}", cell(&f.namespace), cell(&f.name)),
                    f.machines.to_string(),
                    f.failing.to_string(),
                    ratio,
                ]
            })
            .collect();
        out.push_str(&table(
            &["FAILURE DOMAIN", "MACHINES", "FAILING", "FAILURE RATIO"],
            &rows,
        ));
    }
    if let Some(p) = &r.probe {
        out.push('\n');
        out.push_str(&probe_line(p));
    }
    out.push('\n');
    out.push_str(&crate::cli::orphans::render_table(r));
    out.push_str(&crate::cli::orphans::render_remnants_table(r));
    out
}

/// The guest probe in one line: where it asks, what it got, and whether it is refused.
fn probe_line(p: &crate::status::ProbeReport) -> String {
    let c = &p.counts;
    let mut line = format!(
        "guest probe ({}): {} jobs started, {} in flight; {} replies, {} unanswered, {} without evidence; \
         {} skipped for the budget, {} for the in-flight cap, {} behind a busy router",
        cell(p.endpoint.as_deref().unwrap_or("key not loaded")),
        c.jobs_started,
        p.in_flight,
        c.replies,
        c.no_replies,
        c.no_evidence,
        c.skipped_for_budget,
        c.skipped_in_flight_cap,
        c.skipped_router_busy
    );
    if let Some(why) = &p.refused {
        line.push_str(&format!(
            "; REFUSED, off until its key changes: {}",
            cell(why)
        ));
    }
    if let Some(e) = &p.last_error {
        line.push_str(&format!("; last error: {}", cell(e)));
    }
    line.push('\n');
    line
}

pub fn render(r: &StatusReport, format: OutputFormat) -> String {
    match format {
        OutputFormat::Table => render_human(r),
        OutputFormat::Json => match serde_json::to_string_pretty(r) {
            Ok(s) => s + "\n",
            Err(e) => format!("{{\"error\": \"cannot encode: {e}\"}}\n"),
        },
    }
}

/// `capc-health-shim status`.
pub async fn main(args: StatusArgs) -> u8 {
    args.shim
        .print_view("status", &args.view, |r| render(r, args.output))
        .await
}

#[cfg(test)]
mod tests;
