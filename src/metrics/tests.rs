//! The metrics' names, label sets and encoding, as Prometheus scrapes them.

use super::*;

fn has_line(text: &str, line: &str) -> bool {
    text.lines().any(|l| l == line)
}

#[test]
fn probe_counts_become_counters_that_only_grow() {
    let m = Metrics::new();
    let mut r = crate::status::ProbeReport {
        enabled: true,
        in_flight: 3,
        ..Default::default()
    };
    r.counts.jobs_started = 5;
    r.counts.replies = 4;
    m.observe_probe(&r);
    r.counts.jobs_started = 7;
    r.counts.no_replies = 1;
    r.refused = Some("The API runDiagnostics is denied for the account's role.".into());
    m.observe_probe(&r);
    let text = m.encode();
    assert!(
        has_line(
            &text,
            "capc_health_probe_events_total{event=\"job_started\"} 7"
        ),
        "{text}"
    );
    assert!(has_line(
        &text,
        "capc_health_probe_events_total{event=\"reply\"} 4"
    ));
    assert!(has_line(
        &text,
        "capc_health_probe_events_total{event=\"no_reply\"} 1"
    ));
    assert!(has_line(&text, "capc_health_probe_in_flight 3"));
    assert!(has_line(&text, "capc_health_probe_refused 1"));
    // A new prober (a rotated key) starts its counts at 0: the counter still grows.
    r.counts.jobs_started = 2;
    m.observe_probe(&r);
    assert!(has_line(
        &m.encode(),
        "capc_health_probe_events_total{event=\"job_started\"} 9"
    ));
}

#[track_caller]
fn assert_line(text: &str, line: &str) {
    assert!(has_line(text, line), "missing line {line:?} in:\n{text}");
}

#[test]
fn every_metric_is_prefixed_and_described() {
    let fresh = Metrics::new().encode();
    // Label families without series are left out; the plain gauges and counter start at 0.
    assert!(!fresh.contains("capc_health_verdicts"), "{fresh}");
    assert_line(&fresh, "capc_health_leader 0");
    assert_line(&fresh, "capc_health_ready 0");
    assert_line(&fresh, "capc_health_rate_limit_wait_seconds_total 0.0");

    let m = Metrics::new();
    m.set_verdict_counts(&BTreeMap::from([((Status::True, "VMHealthy".into()), 1)]));
    m.record_transition(Status::True, "VMHealthy");
    m.record_escalation("annotated");
    m.observe_poll("s", 1.0);
    m.record_calls("listVirtualMachines", "ok", 1);
    m.observe_time_to_false("VMError", 60.0);
    m.set_mass_failure_held("s", false);
    m.record_write("condition", "ok");
    m.observe_cycle(0.5);
    let text = m.encode();
    for name in [
        "capc_health_kube_writes counter",
        "capc_health_cycle_duration_seconds histogram",
        "capc_health_verdicts gauge",
        "capc_health_transitions counter",
        "capc_health_escalations counter",
        "capc_health_poll_duration_seconds histogram",
        "capc_health_cloudstack_calls counter",
        "capc_health_rate_limit_wait_seconds counter",
        "capc_health_time_to_verdict_seconds histogram",
        "capc_health_mass_failure_held gauge",
        "capc_health_leader gauge",
        "capc_health_ready gauge",
    ] {
        assert_line(&text, &format!("# TYPE {name}"));
    }
    assert!(text.ends_with("# EOF\n"), "{text}");
}

#[test]
fn counters_carry_their_labels_and_values() {
    let m = Metrics::new();
    m.record_transition(Status::False, "VMError");
    m.record_transition(Status::False, "VMError");
    m.record_transition(Status::True, "VMHealthy");
    m.record_escalation("annotated");
    m.record_escalation("MassFailure");
    m.record_calls("listVirtualMachines", "ok", 3);
    m.record_calls("listVirtualMachines", "timeout", 1);
    m.record_rate_limit_wait(1.5);
    m.record_rate_limit_wait(-4.0);
    m.record_write("condition", "ok");
    m.record_write("condition", "conflict");
    m.record_write("annotation", "not_leader");
    let writes = m.encode();
    assert_line(
        &writes,
        r#"capc_health_kube_writes_total{kind="condition",result="conflict"} 1"#,
    );
    assert_line(
        &writes,
        r#"capc_health_kube_writes_total{kind="annotation",result="not_leader"} 1"#,
    );
    m.record_rate_limit_wait(f64::NAN);
    m.set_leader(true);
    m.set_ready(true);
    m.set_mass_failure_held("https://cs/client/api zone=z1", true);
    m.set_mass_failure_held("https://cs/client/api zone=z2", false);
    let text = m.encode();
    assert_line(
        &text,
        r#"capc_health_transitions_total{status="False",reason="VMError"} 2"#,
    );
    assert_line(
        &text,
        r#"capc_health_transitions_total{status="True",reason="VMHealthy"} 1"#,
    );
    assert_line(
        &text,
        r#"capc_health_escalations_total{result="annotated"} 1"#,
    );
    assert_line(
        &text,
        r#"capc_health_escalations_total{result="MassFailure"} 1"#,
    );
    assert_line(
        &text,
        r#"capc_health_cloudstack_calls_total{command="listVirtualMachines",result="ok"} 3"#,
    );
    assert_line(
        &text,
        r#"capc_health_cloudstack_calls_total{command="listVirtualMachines",result="timeout"} 1"#,
    );
    assert_line(&text, "capc_health_rate_limit_wait_seconds_total 1.5");
    assert_line(&text, "capc_health_leader 1");
    assert_line(&text, "capc_health_ready 1");
    assert_line(
        &text,
        r#"capc_health_mass_failure_held{scope="https://cs/client/api zone=z1"} 1"#,
    );
    assert_line(
        &text,
        r#"capc_health_mass_failure_held{scope="https://cs/client/api zone=z2"} 0"#,
    );
}

#[test]
fn verdict_counts_zero_label_sets_that_disappeared() {
    let m = Metrics::new();
    let mut counts = BTreeMap::new();
    counts.insert((Status::True, "VMHealthy".to_string()), 7);
    counts.insert((Status::False, "VMStopped".to_string()), 2);
    m.set_verdict_counts(&counts);
    let text = m.encode();
    assert_line(
        &text,
        r#"capc_health_verdicts{status="True",reason="VMHealthy"} 7"#,
    );
    assert_line(
        &text,
        r#"capc_health_verdicts{status="False",reason="VMStopped"} 2"#,
    );

    let mut counts = BTreeMap::new();
    counts.insert((Status::True, "VMHealthy".to_string()), 9);
    counts.insert((Status::Unknown, "CloudStackAPIUnavailable".to_string()), 1);
    m.set_verdict_counts(&counts);
    let text = m.encode();
    assert_line(
        &text,
        r#"capc_health_verdicts{status="True",reason="VMHealthy"} 9"#,
    );
    assert_line(
        &text,
        r#"capc_health_verdicts{status="False",reason="VMStopped"} 0"#,
    );
    assert_line(
        &text,
        r#"capc_health_verdicts{status="Unknown",reason="CloudStackAPIUnavailable"} 1"#,
    );
}

#[test]
fn histograms_bucket_observations_and_ignore_nonsense() {
    let m = Metrics::new();
    m.observe_poll("s1", 0.3);
    m.observe_poll("s1", 1.2);
    m.observe_poll("s1", -1.0);
    m.observe_poll("s1", f64::INFINITY);
    m.observe_time_to_false("VMError", 45.0);
    m.observe_time_to_false("VMError", 4000.0);
    m.observe_time_to_false("VMError", f64::NAN);
    let text = m.encode();
    assert_line(
        &text,
        r#"capc_health_poll_duration_seconds_count{scope="s1"} 2"#,
    );
    assert_line(
        &text,
        r#"capc_health_poll_duration_seconds_sum{scope="s1"} 1.5"#,
    );
    assert_line(
        &text,
        r#"capc_health_poll_duration_seconds_bucket{le="0.2",scope="s1"} 0"#,
    );
    assert_line(
        &text,
        r#"capc_health_poll_duration_seconds_bucket{le="0.5",scope="s1"} 1"#,
    );
    assert_line(
        &text,
        r#"capc_health_poll_duration_seconds_bucket{le="2.0",scope="s1"} 2"#,
    );
    assert_line(
        &text,
        r#"capc_health_time_to_verdict_seconds_bucket{le="10.0",reason="VMError"} 0"#,
    );
    assert_line(
        &text,
        r#"capc_health_time_to_verdict_seconds_bucket{le="60.0",reason="VMError"} 1"#,
    );
    assert_line(
        &text,
        r#"capc_health_time_to_verdict_seconds_bucket{le="3600.0",reason="VMError"} 1"#,
    );
    assert_line(
        &text,
        r#"capc_health_time_to_verdict_seconds_bucket{le="+Inf",reason="VMError"} 2"#,
    );
    assert_line(
        &text,
        r#"capc_health_time_to_verdict_seconds_count{reason="VMError"} 2"#,
    );
}

#[test]
fn label_values_are_escaped() {
    let m = Metrics::new();
    m.record_escalation("held \"quoted\"\nline");
    let text = m.encode();
    assert!(
        text.lines()
            .any(|l| l.starts_with("capc_health_escalations_total{result=\"held \\\"quoted\\\"")),
        "{text}"
    );
    assert!(!has_line(&text, "line\"} 1"), "{text}");
}

#[test]
fn series_of_gone_scopes_and_clusters_are_removed_not_kept_at_zero() {
    let m = Metrics::new();
    let orphan = |cluster: &str, scope: &str| crate::status::OrphanReport {
        vm_id: "vm".into(),
        vm_name: "vm".into(),
        vm_state: "Running".into(),
        scope: scope.into(),
        cluster: Some(cluster.into()),
        cloudstack_machine: "ns/csm".into(),
        kind: crate::status::OrphanKind::InstanceOfDeleted,
        since: jiff::Timestamp::UNIX_EPOCH,
        reported_at: None,
        why: String::new(),
    };
    for scope in ["scope-a", "scope-b"] {
        m.observe_poll(scope, 0.1);
        m.set_mass_failure_held(scope, false);
    }
    m.set_orphans(&[orphan("ns/c1", "scope-a"), orphan("ns/c2", "scope-b")]);
    let series = |text: &str, needle: &str| {
        text.lines()
            .filter(|l| !l.starts_with('#') && l.contains(needle))
            .count()
    };
    let before = m.encode();
    assert!(series(&before, "scope-b") > 0);
    // scope-b and cluster c2 are gone; scope-a and c1 live on (their orphan resolved).
    m.set_orphans(&[]);
    m.forget_gone(
        &BTreeSet::from(["scope-a".to_string()]),
        &BTreeSet::from(["ns/c1".to_string()]),
    );
    let after = m.encode();
    assert_eq!(series(&after, "scope-b"), 0, "{after}");
    assert_eq!(series(&after, "ns/c2"), 0, "{after}");
    assert!(series(&after, "scope-a") > 0, "{after}");
    // A live cluster's resolved orphans read 0, not absent.
    assert!(
        has_line(
            &after,
            r#"capc_health_orphan_vms{cluster="ns/c1",scope="scope-a"} 0"#
        ),
        "{after}"
    );
}

/// VMs left behind by a cluster deletion name a Cluster that is gone: their series stays as
/// long as they are reported (the alert `CAPCHealthOrphanVMs` reads it), and goes after.
#[test]
fn orphans_of_a_deleted_cluster_keep_their_series_while_reported() {
    let m = Metrics::new();
    let orphan = |cluster: &str, scope: &str| crate::status::OrphanReport {
        vm_id: "vm".into(),
        vm_name: "vm".into(),
        vm_state: "Running".into(),
        scope: scope.into(),
        cluster: Some(cluster.into()),
        cloudstack_machine: "ns/csm".into(),
        kind: crate::status::OrphanKind::InstanceOfDeleted,
        since: jiff::Timestamp::UNIX_EPOCH,
        reported_at: None,
        why: String::new(),
    };
    let live_scopes = BTreeSet::from(["scope-a".to_string()]);
    let no_clusters = BTreeSet::new();
    let line = r#"capc_health_orphan_vms{cluster="ns/gone",scope="scope-a"}"#;
    // Both orphans of ns/gone, one in a scope no longer polled either: reported, so counted.
    m.set_orphans(&[
        orphan("ns/gone", "scope-a"),
        orphan("ns/gone", "scope-gone"),
    ]);
    for _ in 0..3 {
        m.forget_gone(&live_scopes, &no_clusters);
        let text = m.encode();
        assert!(has_line(&text, &format!("{line} 1")), "{text}");
        assert!(
            has_line(
                &text,
                r#"capc_health_orphan_vms{cluster="ns/gone",scope="scope-gone"} 1"#
            ),
            "{text}"
        );
    }
    // Destroyed: no longer reported, and their Cluster is gone: the series go.
    m.set_orphans(&[]);
    m.forget_gone(&live_scopes, &no_clusters);
    let text = m.encode();
    assert!(!text.contains("ns/gone"), "{text}");
    // Reported again later (another VM of the same deletion found): the series comes back.
    m.set_orphans(&[orphan("ns/gone", "scope-a")]);
    m.forget_gone(&live_scopes, &no_clusters);
    assert!(has_line(&m.encode(), &format!("{line} 1")));
}

#[test]
fn machines_count_per_cluster_and_verdict_and_the_oldest_false_ages() {
    use crate::status::{ClusterReport, MachineReport};
    let now: jiff::Timestamp = "2026-01-01T01:00:00Z".parse().unwrap();
    let machine = |verdict, reason: &str, since: &str| MachineReport {
        verdict: Some(verdict),
        reason: Some(reason.to_string()),
        since: Some(since.parse().unwrap()),
        ..Default::default()
    };
    let mut clusters = BTreeMap::new();
    let mut a = ClusterReport::default();
    a.machines.insert(
        "a-1".into(),
        machine(Status::False, "VMStopped", "2026-01-01T00:30:00Z"),
    );
    a.machines.insert(
        "a-2".into(),
        machine(Status::False, "VMStopped", "2026-01-01T00:50:00Z"),
    );
    a.machines.insert(
        "a-3".into(),
        machine(Status::True, "VMHealthy", "2026-01-01T00:00:00Z"),
    );
    // Not judged yet: not counted.
    a.machines.insert("a-4".into(), MachineReport::default());
    clusters.insert("ns/a".to_string(), a);
    let mut b = ClusterReport::default();
    b.machines.insert(
        "b-1".into(),
        machine(
            Status::Unknown,
            "CloudStackUnreachable",
            "2026-01-01T00:00:00Z",
        ),
    );
    clusters.insert("ns/b".to_string(), b);
    let m = Metrics::new();
    m.set_standing(&clusters, now);
    let text = m.encode();
    for line in [
        r#"capc_health_machines{cluster="ns/a",status="False",reason="VMStopped"} 2"#,
        r#"capc_health_machines{cluster="ns/a",status="True",reason="VMHealthy"} 1"#,
        r#"capc_health_machines{cluster="ns/b",status="Unknown",reason="CloudStackUnreachable"} 1"#,
        r#"capc_health_oldest_false_seconds{cluster="ns/a"} 1800"#,
    ] {
        assert_line(&text, line);
    }
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("capc_health_machines{"))
            .count(),
        3,
        "{text}"
    );
    assert!(
        !text.contains(r#"capc_health_oldest_false_seconds{cluster="ns/b"}"#),
        "{text}"
    );
    // The False Machines recycled: their series and the cluster's age go (the alert's silence).
    let a = clusters.get_mut("ns/a").unwrap();
    a.machines.remove("a-1");
    a.machines.remove("a-2");
    m.set_standing(&clusters, now);
    let text = m.encode();
    assert!(!text.contains(r#"status="False""#), "{text}");
    assert!(
        !text.contains("capc_health_oldest_false_seconds{"),
        "{text}"
    );
    assert_line(
        &text,
        r#"capc_health_machines{cluster="ns/a",status="True",reason="VMHealthy"} 1"#,
    );
    // A deleted Cluster's Machines leave the report: its series go.
    clusters.clear();
    m.set_standing(&clusters, now);
    assert!(!m.encode().contains("capc_health_machines{"));
}

#[test]
fn scope_polls_set_up_and_count_failures_by_kind_until_the_scope_goes() {
    let m = Metrics::new();
    let s = "https://cs.example/client/api zone=z1";
    m.record_scope_poll(s, Err("unauthorized"));
    m.record_scope_poll(s, Err("unauthorized"));
    let text = m.encode();
    assert_line(&text, &format!("capc_health_scope_up{{scope=\"{s}\"}} 0"));
    assert_line(
        &text,
        &format!("capc_health_scope_poll_failures_total{{scope=\"{s}\",kind=\"unauthorized\"}} 2"),
    );
    m.record_scope_poll(s, Ok(()));
    assert_line(
        &m.encode(),
        &format!("capc_health_scope_up{{scope=\"{s}\"}} 1"),
    );
    m.forget_gone(&BTreeSet::new(), &BTreeSet::new());
    let text = m.encode();
    assert!(!text.contains(s), "{text}");
}
