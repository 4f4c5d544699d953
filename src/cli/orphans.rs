//! `capc-health-shim orphans --url URL`: a running shim's orphan report as a table, with the
//! CloudMonkey commands an operator could run to remove each VM. It prints them; it never
//! runs them (the shim's CloudStack role cannot destroy anything anyway).

use std::fmt::Write as _;

use clap::Args;

use crate::cli::status::{cell, table, time, ShimConnection};
use crate::cli::OutputFormat;
use crate::status::{OrphanReport, StatusReport};

#[derive(Debug, Clone, Args)]
pub struct OrphansArgs {
    #[command(flatten)]
    pub shim: ShimConnection,
    /// `table` (with the CloudMonkey commands) or `json` (the `orphans` section of `/status`).
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: OutputFormat,
}

/// A CloudStack id is a UUID (or, in old clouds, a number): anything else is not put in a
/// command line an operator may paste.
fn safe_id(id: &str) -> bool {
    !id.is_empty() && id.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}

/// The CloudMonkey commands that remove one orphan: its data disks first (CAPC passes them to
/// `destroyVirtualMachine` as `volumeids`; the root disk goes with the VM), then the VM,
/// expunged (CAPC expunges too when `allowuserexpungerecovervm` lets it).
pub fn cloudmonkey(o: &OrphanReport) -> Option<String> {
    if !safe_id(&o.vm_id) {
        return None;
    }
    Some(format!(
        "cmk list volumes virtualmachineid={id} type=DATADISK listall=true filter=id\n\
         cmk destroy virtualmachine id={id} expunge=true   # add volumeids=<ids above> to remove its data disks too",
        id = o.vm_id
    ))
}

fn rows(orphans: &[OrphanReport]) -> Vec<Vec<String>> {
    orphans
        .iter()
        .map(|o| {
            vec![
                cell(o.cluster.as_deref().unwrap_or("-")),
                cell(&o.vm_name),
                cell(&o.vm_id),
                cell(&o.vm_state),
                cell(&o.cloudstack_machine),
                o.kind.as_str().to_string(),
                time(Some(o.since)),
                cell(&o.scope),
            ]
        })
        .collect()
}

const HEADERS: [&str; 8] = [
    "CLUSTER",
    "VM NAME",
    "VM ID",
    "STATE",
    "CLOUDSTACKMACHINE",
    "KIND",
    "OWNED BY NOTHING SINCE",
    "SCOPE",
];

/// The orphans section of `capc-health-shim status`.
pub fn render_table(r: &StatusReport) -> String {
    let d = &r.orphan_detection;
    if !d.enabled {
        return "orphan report: off\n".to_string();
    }
    let mut out = format!(
        "orphan VMs: {} reported, {} within their {} s grace\n",
        r.orphans.len(),
        d.suspects,
        d.grace_seconds
    );
    if !r.orphans.is_empty() {
        out.push_str(&table(&HEADERS, &rows(&r.orphans)));
    }
    out
}

/// The human view of `capc-health-shim orphans`: the table, then per orphan why and the
/// commands.
pub fn render_human(r: &StatusReport) -> String {
    let mut out = render_table(r);
    for o in &r.orphans {
        let _ = writeln!(
            out,
            "\n# {} ({}): {}",
            cell(&o.vm_name),
            cell(&o.vm_id),
            cell(&o.why)
        );
        match cloudmonkey(o) {
            Some(c) => out.push_str(&c),
            None => out.push_str("# (its id is not a CloudStack id; no command printed)"),
        }
        out.push('\n');
    }
    if !r.orphans.is_empty() {
        out.push_str(
            "\nThe shim never runs these. Check each VM first: it is owned by no \
             CloudStackMachine this shim has seen.\n",
        );
    }
    out
}

pub fn render(r: &StatusReport, format: OutputFormat) -> String {
    match format {
        OutputFormat::Table => render_human(r),
        OutputFormat::Json => match serde_json::to_string_pretty(&r.orphans) {
            Ok(s) => s + "\n",
            Err(e) => format!("{{\"error\": \"cannot encode: {e}\"}}\n"),
        },
    }
}

/// `capc-health-shim orphans`: exit codes as `status`.
pub async fn main(args: OrphansArgs) -> u8 {
    args.shim.print("orphans", |r| render(r, args.output)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{OrphanDetectionReport, OrphanKind};

    fn orphan(id: &str) -> OrphanReport {
        OrphanReport {
            vm_id: id.into(),
            vm_name: "w-1\u{1b}[31m".into(),
            vm_state: "Running".into(),
            scope: "https://cloud/client/api project=- zone=z1".into(),
            cluster: Some("ns/c1".into()),
            cloudstack_machine: "ns/w-1".into(),
            kind: OrphanKind::NameOfDeleted,
            since: "2026-12-01T10:00:00Z".parse().unwrap(),
            reported_at: Some("2026-12-01T10:15:00Z".parse().unwrap()),
            why: "it has the name of CloudStackMachine ns/w-1, which was deleted".into(),
        }
    }

    fn report(orphans: Vec<OrphanReport>) -> StatusReport {
        StatusReport {
            orphans,
            orphan_detection: OrphanDetectionReport {
                enabled: true,
                grace_seconds: 900.0,
                suspects: 1,
                remembered_machines: 4,
            },
            ..Default::default()
        }
    }

    #[test]
    fn each_orphan_gets_its_row_why_and_commands() {
        let id = "5d1c8f54-1a6e-4c1b-9f6e-0c2b8a7d9e10";
        let out = render_human(&report(vec![orphan(id)]));
        assert!(out.starts_with("orphan VMs: 1 reported, 1 within their 900 s grace\n"));
        assert!(out.contains("name-of-deleted"));
        assert!(out.contains(&format!("cmk destroy virtualmachine id={id} expunge=true")));
        assert!(out.contains(&format!(
            "cmk list volumes virtualmachineid={id} type=DATADISK"
        )));
        assert!(out.contains("which was deleted"));
        // A name from CloudStack cannot drive the terminal.
        assert!(!out.contains('\u{1b}'));
    }

    #[test]
    fn an_id_that_is_no_cloudstack_id_gets_no_command() {
        let o = orphan("x; cmk delete account id=1");
        assert_eq!(cloudmonkey(&o), None);
        let out = render_human(&report(vec![o]));
        assert!(!out.contains("cmk destroy"));
        assert!(out.contains("no command printed"));
    }

    #[test]
    fn json_is_the_orphans_section_and_off_says_so() {
        let r = report(vec![orphan("5d1c8f54")]);
        let v: serde_json::Value = serde_json::from_str(&render(&r, OutputFormat::Json)).unwrap();
        assert_eq!(v[0]["kind"], "name-of-deleted");
        assert_eq!(v[0]["vm_id"], "5d1c8f54");
        assert_eq!(
            render_table(&StatusReport::default()),
            "orphan report: off\n"
        );
        assert_eq!(
            render_human(&report(vec![])),
            "orphan VMs: 0 reported, 1 within their 900 s grace\n"
        );
    }
}
