//! `capc-health-shim orphans --url URL`: a running shim's orphan report as a table, with the
//! CloudMonkey commands an operator could run to remove each VM, then its remnant report (the
//! objects of CAPC clusters left behind on the management side), with what holds each and
//! the `kubectl` commands to inspect it. It prints them; it never runs them (the shim's
//! CloudStack role cannot destroy anything, its RBAC cannot delete or patch those objects).

use std::fmt::Write as _;

use clap::Args;

use crate::cli::status::{cell, table, time, ShimConnection};
use crate::cli::OutputFormat;
use crate::remnants::{commands, Remnant};
use crate::status::{OrphanReport, StatusReport};

#[derive(Debug, Clone, Args)]
pub struct OrphansArgs {
    #[command(flatten)]
    pub shim: ShimConnection,
    /// `table` (with the CloudMonkey commands) or `json` (the `orphans` section of `/status`).
    #[arg(
        short = 'o',
        long,
        help_heading = "Output",
        env = "CAPC_HEALTH_OUTPUT",
        value_enum,
        default_value = "table"
    )]
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
    if let Some(m) = &d.memory {
        let _ = writeln!(
            out,
            "memory for the next leader: ConfigMap {}, read {}{}, {} CloudStackMachines stored ({} left out), {} restored at start{}",
            cell(&m.configmap),
            m.read.as_str(),
            if m.held { " (writes held until it is read)" } else { "" },
            m.stored_machines,
            m.dropped,
            m.restored,
            m.last_error
                .as_deref()
                .map(|e| format!("; last error: {}", cell(e)))
                .unwrap_or_default()
        );
        if let Some(k) = &m.kept_aside {
            let _ = writeln!(
                out,
                "an unreadable memory is kept aside under key {} ({} bytes): {}",
                cell(&k.key),
                k.bytes,
                cell(&k.reason)
            );
        }
    }
    if !r.orphans.is_empty() {
        out.push_str(&table(&HEADERS, &rows(&r.orphans)));
    }
    out
}

/// A Kubernetes name or namespace (a DNS subdomain): anything else is not put in a command
/// line an operator may paste.
fn safe_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
}

const REMNANT_HEADERS: [&str; 7] = [
    "CLUSTER",
    "KIND",
    "NAMESPACE/NAME",
    "REASON",
    "SINCE",
    "BLOCKING FINALIZERS",
    "VM",
];

/// The remnants section of `capc-health-shim status`.
pub fn render_remnants_table(r: &StatusReport) -> String {
    let d = &r.remnant_detection;
    if !d.enabled {
        return "remnant report: off\n".to_string();
    }
    let mut out = format!(
        "remnants: {} reported, {} within their {} s grace ({} objects of {} kinds watched)\n",
        r.remnants.len(),
        d.suspects,
        d.grace_seconds,
        d.objects,
        d.kinds.len()
    );
    if !d.kinds_not_synced.is_empty() {
        let _ = writeln!(
            out,
            "not judged (watch not synced: not yet, or RBAC refuses it): {}",
            cell(&d.kinds_not_synced.join(", "))
        );
    }
    let rows: Vec<Vec<String>> = r
        .remnants
        .iter()
        .map(|x| {
            vec![
                cell(x.cluster.as_deref().unwrap_or("-")),
                cell(&x.kind),
                cell(&format!("{}/{}", x.namespace, x.name)),
                x.reason.as_str().to_string(),
                time(Some(x.since)),
                cell(&x.blocking_finalizers.join(",")).replace(' ', ""),
                cell(x.related_vm.as_deref().unwrap_or("-")),
            ]
        })
        .collect();
    if !rows.is_empty() {
        out.push_str(&table(&REMNANT_HEADERS, &rows));
    }
    out
}

/// Per remnant: what holds it and the commands (the finalizer removal with its warning).
fn render_remnant_commands(remnants: &[Remnant], out: &mut String) {
    for x in remnants {
        let _ = writeln!(
            out,
            "\n# {} {}/{}: {}",
            cell(&x.kind),
            cell(&x.namespace),
            cell(&x.name),
            cell(&x.why)
        );
        if !(safe_name(&x.namespace) && safe_name(&x.name)) {
            out.push_str("# (its name is not a Kubernetes name; no command printed)\n");
            continue;
        }
        for c in commands(x) {
            if let Some(w) = &c.warning {
                let _ = writeln!(out, "# {}", cell(w));
            }
            let _ = writeln!(out, "{}", c.line);
        }
    }
    if !remnants.is_empty() {
        out.push_str(
            "\nThe shim never runs these. Remove a finalizer only when what it waits for is \
             gone or done by hand.\n",
        );
    }
}

/// The human view of `capc-health-shim orphans`: the orphans' table, then per orphan why and
/// the commands; then the remnants likewise.
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
    out.push('\n');
    out.push_str(&render_remnants_table(r));
    render_remnant_commands(&r.remnants, &mut out);
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
    use crate::remnants::RemnantReason;
    use crate::status::{OrphanDetectionReport, OrphanKind, RemnantDetectionReport};

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
                memory: None,
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
            "orphan VMs: 0 reported, 1 within their 900 s grace\n\nremnant report: off\n"
        );
    }

    fn remnant(name: &str, reason: RemnantReason, why: &str) -> Remnant {
        Remnant {
            group: "infrastructure.cluster.x-k8s.io".into(),
            kind: "CloudStackMachine".into(),
            namespace: "team-a".into(),
            name: name.into(),
            cluster: Some("team-a/c1".into()),
            since: "2026-12-01T10:00:00Z".parse().unwrap(),
            reason,
            why: why.into(),
            blocking_finalizers: vec!["cloudstackmachine.infrastructure.cluster.x-k8s.io".into()],
            related_vm: Some("5d1c8f54".into()),
        }
    }

    #[test]
    fn each_remnant_gets_its_row_what_holds_it_and_the_commands_never_run() {
        let mut r = report(vec![]);
        r.remnant_detection = RemnantDetectionReport {
            enabled: true,
            grace_seconds: 900.0,
            kinds: vec!["CloudStackMachine".into()],
            kinds_not_synced: vec!["KubeadmConfig".into()],
            objects: 12,
            suspects: 0,
        };
        r.remnants = vec![
            remnant(
                "w-1",
                RemnantReason::StuckDeleting,
                "deleting, held by finalizer(s) cloudstackmachine.infrastructure.cluster.x-k8s.io; CloudStack shows VM 5d1c8f54 Error",
            ),
            remnant("w-2;rm", RemnantReason::OwnerGone, "its controller owner Machine w-2 is gone"),
        ];
        let out = render_human(&r);
        assert!(
            out.contains(
                "remnants: 2 reported, 0 within their 900 s grace (12 objects of 1 kinds watched)"
            ),
            "{out}"
        );
        assert!(out
            .contains("not judged (watch not synced: not yet, or RBAC refuses it): KubeadmConfig"));
        assert!(out.contains("stuck-deleting") && out.contains("owner-gone"));
        assert!(out.contains(
            "kubectl -n team-a get cloudstackmachine.infrastructure.cluster.x-k8s.io w-1 -o yaml"
        ));
        // Nothing else to wait for: the finalizer removal, with what it skips.
        assert!(out.contains("kubectl -n team-a patch cloudstackmachine.infrastructure.cluster.x-k8s.io w-1 --type=merge"));
        assert!(out.contains("# last resort — removing the finalizers skips"));
        assert!(out.contains("CAPC will not destroy the VM"));
        // A name that is no Kubernetes name is never put in a command.
        assert!(out.contains("its name is not a Kubernetes name; no command printed"));
        assert!(!out.contains("w-2;rm -o yaml"));
        assert!(out.contains("The shim never runs these."));
        assert!(crate::cli::status::render_human(&r).contains("remnants: 2 reported"));
    }
}
