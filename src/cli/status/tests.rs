use super::*;
use crate::status::{ClusterReport, FailureDomainReport, ScopeReport};
use crate::verdict::Status;

#[test]
fn a_view_asks_the_endpoint_for_its_cluster_and_problems_and_keeps_one_machine() {
    let base = url::Url::parse("https://localhost:8443/status").unwrap();
    assert_eq!(View::default().url(base.clone()).as_str(), base.as_str());
    let view = View {
        cluster: Some("team-a/prod".into()),
        machine: Some("m-2".into()),
        problems: true,
    };
    assert_eq!(
        view.url(base).as_str(),
        "https://localhost:8443/status?cluster=team-a%2Fprod&problems=true"
    );
    let mut r = StatusReport::default();
    for (cluster, machine) in [("a/x", "m-1"), ("a/x", "m-2"), ("b/y", "m-3")] {
        r.clusters
            .entry(cluster.into())
            .or_default()
            .machines
            .insert(machine.into(), Default::default());
    }
    view.keep_machine(&mut r);
    assert_eq!(r.clusters.keys().collect::<Vec<_>>(), ["a/x"]);
    assert_eq!(
        r.clusters["a/x"].machines.keys().collect::<Vec<_>>(),
        ["m-2"]
    );
}

#[test]
fn tables_align_and_leave_the_last_column_unpadded() {
    let t = table(
        &["A", "LONGER", "LAST"],
        &[
            vec!["xxxx".into(), "y".into(), "tail".into()],
            vec!["z".into(), "w".into(), "".into()],
        ],
    );
    assert_eq!(
        t,
        "A     LONGER  LAST\nxxxx  y       tail\nz     w       \n"
    );
}

#[test]
fn the_human_view_keeps_one_row_per_machine_and_strips_control_characters() {
    let mut r = StatusReport {
        leader: true,
        ready: false,
        problems: vec!["credentials: secret default/cs not found".into()],
        ..Default::default()
    };
    let mut c = ClusterReport::default();
    c.machines.insert(
        "m1".into(),
        MachineReport {
            namespace: "default".into(),
            name: "m1".into(),
            vm_id: Some("vm-1".into()),
            verdict: Some(Status::False),
            reason: Some("VMError".into()),
            message: Some("line one\nline two \u{1b}[31mred".into()),
            escalation: "held".into(),
            escalation_detail: Some("MassFailure".into()),
            ..Default::default()
        },
    );
    r.clusters.insert("default/c1".into(), c);
    r.scopes.push(ScopeReport {
        key: "https://cs/client/api zone=z1".into(),
        machines: 1,
        last_error: Some("timed out".into()),
        calls_total: 4,
        held: true,
        ..Default::default()
    });
    r.failure_domains.push(FailureDomainReport {
        namespace: "default".into(),
        name: "fd1".into(),
        machines: 3,
        failing: 1,
        failure_ratio: 1.0 / 3.0,
    });
    let text = render_human(&r);
    assert!(
        text.starts_with("mode: unknown (discovery not done)  leader: yes  ready: no\n"),
        "{text}"
    );
    assert!(!text.contains("STANDBY"), "{text}");
    let standby = StatusReport {
        leader: false,
        leader_identity: Some("capc-health-shim-7d9f-x2k4p".into()),
        ..r.clone()
    };
    assert!(
        render_human(&standby).contains(
            "STANDBY: this replica does not lead; the verdicts are on the leader, pod capc-health-shim-7d9f-x2k4p"
        ),
        "{}",
        render_human(&standby)
    );
    assert!(
        text.contains("- credentials: secret default/cs not found\n"),
        "{text}"
    );
    let row = text
        .lines()
        .find(|l| l.starts_with("default/c1"))
        .expect("machine row");
    assert!(row.contains("held (MassFailure)"), "{row}");
    assert!(row.ends_with("line one line two  [31mred"), "{row:?}");
    assert!(!text.contains('\u{1b}'));
    assert!(text.contains("33%"), "{text}");
    let scope = text
        .lines()
        .find(|l| l.starts_with("https://cs/client/api zone=z1"))
        .expect("scope row");
    let cols: Vec<&str> = scope.split("  ").filter(|c| !c.is_empty()).collect();
    assert_eq!(cols[1].trim(), "1");
    assert_eq!(cols.last().copied(), Some("yes"));
}

#[test]
fn the_human_view_names_each_incidents_cause() {
    use crate::verdict::incidents::{Cause, CauseKind, Trigger};
    let cause = Cause {
        kind: CauseKind::Router,
        id: "r-1".into(),
        name: Some("r-123-VM".into()),
        state: Some("Stopped".into()),
        host: None,
        failing: 9,
        healthy: 0,
        failing_coverage: 1.0,
        healthy_coverage: 0.0,
        score: 1.0,
        contrast: 1.0,
    };
    let incident = crate::verdict::incidents::Incident {
        trigger: Trigger::Threshold,
        failing: 9,
        healthy: 30,
        cause: Some(cause.clone()),
        candidates: vec![cause.clone()],
    };
    let r = StatusReport {
        incidents: vec![crate::status::IncidentReport {
            scope: "https://cs/client/api project=- zone=z1 key=k".into(),
            since: "2026-12-06T10:00:00Z".parse().unwrap(),
            trigger: Trigger::Threshold,
            failing: 9,
            healthy: 30,
            machines: vec!["ns/m1".into()],
            clusters: vec!["ns/c1".into()],
            cause: Some(cause),
            candidates: vec![],
            summary: incident.summary(),
            router_lookup: None,
        }],
        ..Default::default()
    };
    let text = render_human(&r);
    assert!(
        text.contains("INCIDENTS (many Machines of one scope failing at once)\n- since 2026-12-06"),
        "{text}"
    );
    assert!(
        text.contains(
            "9 of 9 failing Machines share router r-123-VM (state Stopped); 0 of 30 healthy ones do"
        ),
        "{text}"
    );
    // No incident, no section.
    assert!(!render_human(&StatusReport::default()).contains("INCIDENTS"));
}
