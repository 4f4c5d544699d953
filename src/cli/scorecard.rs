//! `capc-health-shim scorecard --url URL`: what a running shim did, or would have done, on the
//! operator's fleet (issue 44): the outcomes since counting began, per outcome and per cluster,
//! zone and template, the latest ones with their evidence, and the boot baselines with the
//! warnings that follow (an MHC timer that would recycle healthy-but-slow VMs).

use std::fmt::Write as _;

use clap::Args;

use crate::cli::status::{cell, table, time, ShimConnection};
use crate::cli::OutputFormat;
use crate::status::{ScorecardReport, StatusReport};
use crate::verdict::scorecard::{OutcomeKind, Warning, OUTCOMES};

#[derive(Debug, Clone, Args)]
pub struct ScorecardArgs {
    #[command(flatten)]
    pub shim: ShimConnection,
    /// `table` or `json` (the `scorecard` section of `/status`).
    #[arg(
        short = 'o',
        long,
        env = "CAPC_HEALTH_OUTPUT",
        value_enum,
        default_value = "table"
    )]
    pub output: OutputFormat,
}

/// What an outcome means, in the table's words.
fn meaning(outcome: &str) -> &'static str {
    match outcome {
        "recycled-on-signal" => "the shim said False, then the owner recycled it",
        "would-have-saved" => "False, recycled later by a timer or by hand",
        "false-alarm" => "False before its Node, then a healthy Node: must stay 0",
        "recovered" => "False on a Node, contradicted before anyone acted",
        "missed" => "the MHC recycled it; the shim never said False",
        "still-stuck" => "False, no Node, nothing acted past the MHC timeout",
        _ => "",
    }
}

fn minutes(secs: i64) -> String {
    format!("{:.1} min", secs as f64 / 60.0)
}

/// One line per outcome: count, the time it adds up, what it means.
fn totals(s: &ScorecardReport) -> String {
    let rows: Vec<Vec<String>> = OUTCOMES
        .iter()
        .map(|o| {
            let t = s.totals.get(*o).cloned().unwrap_or_default();
            let time = match (*o, t.count) {
                (_, 0) | ("missed", _) => "-".to_string(),
                ("would-have-saved", _) => format!("{} saved", minutes(t.seconds)),
                ("recycled-on-signal", _) => {
                    format!(
                        "{} False → delete, mean",
                        minutes(t.seconds / t.count as i64)
                    )
                }
                _ => format!("{} False, mean", minutes(t.seconds / t.count as i64)),
            };
            vec![
                o.to_string(),
                t.count.to_string(),
                time,
                meaning(o).to_string(),
            ]
        })
        .collect();
    table(&["OUTCOME", "MACHINES", "TIME", "MEANING"], &rows)
}

fn groups(s: &ScorecardReport) -> String {
    let mut rows = Vec::new();
    for (kind, values) in &s.groups {
        for (value, counts) in values {
            let mut row = vec![kind.clone(), cell(value)];
            row.extend(
                OUTCOMES
                    .iter()
                    .map(|o| counts.get(*o).copied().unwrap_or(0).to_string()),
            );
            rows.push(row);
        }
    }
    let mut headers = vec!["BY", "VALUE"];
    headers.extend(OUTCOMES);
    table(&headers, &rows)
}

fn detail(k: &OutcomeKind) -> String {
    match *k {
        OutcomeKind::RecycledOnSignal {
            false_to_delete_secs,
        } => format!("False → delete {false_to_delete_secs} s"),
        OutcomeKind::WouldHaveSaved {
            saved_secs,
            recycled_by,
        } => format!("saved {saved_secs} s (recycled by {recycled_by:?})"),
        OutcomeKind::FalseAlarm { false_to_node_secs } => {
            format!("Node {false_to_node_secs} s after the False")
        }
        OutcomeKind::Recovered { false_for_secs } | OutcomeKind::StillStuck { false_for_secs } => {
            format!("False for {false_for_secs} s")
        }
        OutcomeKind::Missed { shim_said, trigger } => {
            let said = match shim_said {
                crate::verdict::scorecard::ShimSaid::HealthyWithTraffic => {
                    "MHC recycled a VM the shim judged healthy (traffic rising)"
                }
                crate::verdict::scorecard::ShimSaid::HealthyWithoutTraffic => {
                    "the shim said True without rising traffic"
                }
                crate::verdict::scorecard::ShimSaid::NoEvidence => "the shim had no evidence",
            };
            format!("{said}; MHC: {trigger:?}")
        }
    }
}

fn warning_line(w: &Warning) -> String {
    match w {
        Warning::MhcTimeoutBelowBoot {
            mhc,
            timeout_secs,
            key,
            p95_secs,
            margin,
        } => format!(
            "MachineHealthCheck {}: nodeStartupTimeout {timeout_secs} s is below {margin} × the p95 boot time ({p95_secs:.0} s) of template {} / offering {} / zone {}: it will recycle healthy-but-slow VMs",
            cell(mhc),
            cell(&key.template),
            cell(&key.offering),
            cell(&key.zone)
        ),
        Warning::TemplateSlower {
            template,
            p95_secs,
            previous_p95_secs,
        } => format!(
            "template {}: p95 boot time {p95_secs:.0} s, at least twice the previous window's {previous_p95_secs:.0} s",
            cell(template)
        ),
    }
}

pub fn render_table(r: &StatusReport) -> String {
    let Some(s) = &r.scorecard else {
        return "scorecard: none (this replica is not the leader, or an older shim)\n".into();
    };
    let mut out = format!(
        "scorecard since {} ({} stories going on, {} ended with nothing to say, settle {} s)\n",
        time(Some(s.since)),
        s.following,
        s.uneventful,
        s.settle_seconds
    );
    if s.untracked > 0 {
        let _ = writeln!(
            out,
            "{} Machines not followed (too many at once)",
            s.untracked
        );
    }
    if let Some(m) = &s.memory {
        let _ = writeln!(
            out,
            "kept in ConfigMap {} (read {}, {} bytes{}{})",
            cell(&m.configmap),
            m.read.as_str(),
            m.bytes,
            if m.left_out.is_empty() {
                String::new()
            } else {
                format!(", left out: {}", cell(&m.left_out.join(", ")))
            },
            m.last_error
                .as_deref()
                .map(|e| format!("; last error: {}", cell(e)))
                .unwrap_or_default()
        );
    }
    out.push_str(&totals(s));
    if !s.groups.is_empty() {
        out.push('\n');
        out.push_str(&groups(s));
    }
    if !s.recent.is_empty() {
        out.push_str("\nlatest outcomes:\n");
        let rows: Vec<Vec<String>> = s
            .recent
            .iter()
            .rev()
            .map(|o| {
                vec![
                    time(Some(o.at)),
                    cell(&o.machine),
                    o.kind.label().to_string(),
                    cell(&o.reason),
                    cell(&detail(&o.kind)),
                    cell(&o.labels.template),
                ]
            })
            .collect();
        out.push_str(&table(
            &["AT", "MACHINE", "OUTCOME", "REASON", "DETAIL", "TEMPLATE"],
            &rows,
        ));
    }
    let _ = writeln!(
        out,
        "\nboot to Node, window from {} ({} h):",
        time(Some(s.window_start)),
        s.window_seconds / 3600
    );
    let rows: Vec<Vec<String>> = s
        .baselines
        .iter()
        .map(|b| {
            let q = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0} s"));
            vec![
                cell(&b.key.template),
                cell(&b.key.offering),
                cell(&b.key.zone),
                b.count.to_string(),
                q(b.from_creation.map(|s| s.p50)),
                q(b.from_creation.map(|s| s.p95)),
                q(b.from_creation.map(|s| s.max)),
                q(b.from_running.map(|s| s.p95)),
            ]
        })
        .collect();
    if rows.is_empty() {
        out.push_str("no Machine became a Node in this window yet\n");
    } else {
        out.push_str(&table(
            &[
                "TEMPLATE",
                "OFFERING",
                "ZONE",
                "NODES",
                "P50",
                "P95",
                "MAX",
                "P95 FROM RUNNING",
            ],
            &rows,
        ));
    }
    for w in &s.warnings {
        let _ = writeln!(out, "WARNING: {}", warning_line(w));
    }
    out
}

pub fn render(r: &StatusReport, format: OutputFormat) -> String {
    match format {
        OutputFormat::Table => render_table(r),
        OutputFormat::Json => match serde_json::to_string_pretty(&r.scorecard) {
            Ok(s) => s + "\n",
            Err(e) => format!("{{\"error\": \"cannot encode: {e}\"}}\n"),
        },
    }
}

/// `capc-health-shim scorecard`: exit codes as `status`.
pub async fn main(args: ScorecardArgs) -> u8 {
    args.shim
        .print("scorecard", |r| render(r, args.output))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verdict::scorecard::{BootKey, Labels, Outcome, Recycler, Total};
    use std::collections::BTreeMap;

    fn at(s: &str) -> jiff::Timestamp {
        s.parse().unwrap()
    }

    fn report() -> StatusReport {
        let labels = Labels {
            cluster: "ns/prod".into(),
            zone: "zone-a".into(),
            template: "ubuntu\u{1b}[31m".into(),
            offering: "medium".into(),
            hypervisor: "KVM".into(),
        };
        let outcome = Outcome {
            machine: "ns/prod-md-0-x".into(),
            labels: labels.clone(),
            mode: capi_model::apis::Mode::Observe,
            kind: OutcomeKind::WouldHaveSaved {
                saved_secs: 600,
                recycled_by: Recycler::Hand,
            },
            reason: "GuestNetworkSilent".into(),
            evidence: "silent".into(),
            at: at("2026-12-06T10:00:00Z"),
        };
        StatusReport {
            scorecard: Some(ScorecardReport {
                since: at("2026-12-01T00:00:00Z"),
                settle_seconds: 600,
                following: 3,
                totals: BTreeMap::from([(
                    "would-have-saved".to_string(),
                    Total {
                        count: 2,
                        seconds: 1200,
                    },
                )]),
                by_reason: BTreeMap::new(),
                groups: BTreeMap::from([(
                    "cluster".to_string(),
                    BTreeMap::from([(
                        "ns/prod".to_string(),
                        BTreeMap::from([("would-have-saved".to_string(), 2)]),
                    )]),
                )]),
                uneventful: 7,
                untracked: 0,
                recent: vec![outcome],
                window_start: at("2026-12-01T00:00:00Z"),
                window_seconds: 7 * 86400,
                baselines: vec![],
                warnings: vec![Warning::MhcTimeoutBelowBoot {
                    mhc: "ns/workers".into(),
                    timeout_secs: 300,
                    key: BootKey {
                        template: "ubuntu".into(),
                        offering: "medium".into(),
                        zone: "zone-a".into(),
                    },
                    p95_secs: 420.0,
                    margin: 1.5,
                }],
                incidents: Vec::new(),
                memory: None,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn the_table_shows_totals_groups_latest_and_warnings() {
        let out = render_table(&report());
        assert!(out.starts_with("scorecard since 2026-12-01"), "{out}");
        let saved = out
            .lines()
            .find(|l| l.starts_with("would-have-saved"))
            .expect(&out);
        assert!(
            saved.contains(" 2 ") && saved.contains("20.0 min saved"),
            "{saved}"
        );
        assert!(
            out.lines()
                .any(|l| l.starts_with("false-alarm") && l.contains(" 0 ")),
            "{out}"
        );
        assert!(out.contains("cluster  ns/prod"), "{out}");
        assert!(out.contains("saved 600 s (recycled by Hand)"), "{out}");
        assert!(out.contains("no Machine became a Node in this window yet"));
        assert!(out.contains(
            "WARNING: MachineHealthCheck ns/workers: nodeStartupTimeout 300 s is below 1.5 × the p95 boot time (420 s)"
        ), "{out}");
        assert!(
            !out.contains('\u{1b}'),
            "a template name cannot drive the terminal"
        );
    }

    #[test]
    fn a_standby_has_no_scorecard_and_json_is_the_section() {
        assert!(render_table(&StatusReport::default()).starts_with("scorecard: none"));
        let v: serde_json::Value =
            serde_json::from_str(&render(&report(), OutputFormat::Json)).unwrap();
        assert_eq!(v["totals"]["would-have-saved"]["count"], 2);
    }
}
