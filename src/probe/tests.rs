//! The prober's bookkeeping without CloudStack: lost attempts, bounded caches.
use std::collections::BTreeMap;

use super::*;
use crate::cloudstack::client::ClientConfig;
use crate::cloudstack::model::{VirtualMachine, VmState};
use crate::verdict::PollOutcome;

fn nowhere() -> CloudStackClient {
    let data: BTreeMap<String, String> = [
        ("api-url", "http://127.0.0.1:1/client/api"),
        ("api-key", "k"),
        ("secret-key", "s"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect();
    CloudStackClient::new(ClientConfig::from_secret_data(&data).unwrap()).unwrap()
}

#[tokio::test]
async fn an_attempt_no_job_carries_is_ended_and_the_vm_is_due_again() {
    // A history marks an attempt in flight, but this prober has no job for it: the key
    // was rotated mid-job (a new prober), or the job ended while its scope was not offered.
    let mut graces = Graces::default();
    graces.probe = Some(crate::verdict::probe::ProbeGraces::from_stats_interval(
        graces.stats_interval,
    ));
    let t0 = Timestamp::from_second(1_800_000_000).unwrap();
    let vm: VirtualMachine = serde_json::from_value(serde_json::json!({
        "id": "vm-1", "name": "w-1", "state": "Running", "hypervisor": "KVM"}))
    .unwrap();
    assert_eq!(vm.state, VmState::Running);
    let mut h = VmHistory::new("vm-1");
    h.record(PollOutcome::Seen(&vm), t0, &graces);
    h.probe.started(t0);
    let mut histories = BTreeMap::from([("vm-1".to_string(), Box::new(h))]);
    let mut prober = Prober::new(nowhere(), ProbeLimits::default());
    let later = t0 + SignedDuration::from_secs(30);
    prober
        .step(
            &mut [ScopeHistories {
                scope: "s",
                histories: &mut histories,
            }],
            &|_| None,
            &graces,
            later,
        )
        .await;
    let h = &histories["vm-1"];
    assert_eq!(h.probe.in_flight_since, None, "still marked in flight");
    assert!(matches!(
        h.probe.attempts.back().map(|a| &a.answer),
        Some(ProbeAnswer::NoEvidence(why)) if why.contains("lost")
    ));
    assert_eq!(prober.report().counts.no_evidence, 1);
}

#[tokio::test]
async fn router_sightings_and_idle_budgets_do_not_pile_up() {
    let mut graces = Graces::default();
    graces.probe = Some(crate::verdict::probe::ProbeGraces::from_stats_interval(
        graces.stats_interval,
    ));
    let t0 = Timestamp::from_second(1_800_000_000).unwrap();
    let mut prober = Prober::new(nowhere(), ProbeLimits::default());
    for n in 0..100 {
        prober.routers.record(&format!("net-{n}"), None, t0);
        prober
            .started_per_scope
            .insert(format!("scope-{n}"), VecDeque::from([t0]));
    }
    let mut none = BTreeMap::new();
    let later = t0 + graces.poll_interval * routers::NO_ROUTER_KEPT_POLLS;
    prober
        .step(
            &mut [ScopeHistories {
                scope: "s",
                histories: &mut none,
            }],
            &|_| None,
            &graces,
            later,
        )
        .await;
    assert!(prober.routers.is_empty());
    assert!(prober.started_per_scope.is_empty());
}

/// One step of a prober holding a job in flight for `vm-1` (started at `t0`, its history
/// marking it so), with the Machine's `facts`: the history afterwards.
async fn step_with_a_job_in_flight(
    prober: &mut Prober,
    facts: MachineFacts,
) -> BTreeMap<String, Box<VmHistory>> {
    let mut graces = Graces::default();
    graces.probe = Some(crate::verdict::probe::ProbeGraces::from_stats_interval(
        graces.stats_interval,
    ));
    let t0 = Timestamp::from_second(1_800_000_000).unwrap();
    let vm: VirtualMachine = serde_json::from_value(serde_json::json!({
        "id": "vm-1", "name": "w-1", "state": "Running", "hypervisor": "KVM"}))
    .unwrap();
    let mut h = VmHistory::new("vm-1");
    h.record(PollOutcome::Seen(&vm), t0, &graces);
    h.probe.started(t0);
    prober.in_flight.push(InFlight {
        scope: "s".into(),
        vm_id: "vm-1".into(),
        router_id: "r-1".into(),
        router: "r-1-VM".into(),
        nic: ProbeNic {
            network_id: "net-1".into(),
            address: std::net::Ipv4Addr::new(10, 1, 0, 5),
            mac: None,
        },
        began: t0,
        job_started: t0,
        job: "job-1".into(),
        kind: DiagnosticsKind::Arping,
    });
    let mut histories = BTreeMap::from([("vm-1".to_string(), Box::new(h))]);
    let lookup = |id: &str| (id == "vm-1").then(|| facts.clone());
    prober
        .step(
            &mut [ScopeHistories {
                scope: "s",
                histories: &mut histories,
            }],
            &lookup,
            &graces,
            t0 + SignedDuration::from_secs(1),
        )
        .await;
    histories
}

#[tokio::test]
async fn a_job_of_a_machine_that_got_its_node_is_not_read_again() {
    // The control: a Machine without a Node has its job read (here the call fails: the
    // client points nowhere, and the attempt ends without evidence).
    let mut prober = Prober::new(nowhere(), ProbeLimits::default());
    let histories = step_with_a_job_in_flight(&mut prober, MachineFacts::default()).await;
    assert_eq!(prober.report().counts.no_evidence, 1, "the job was read");
    assert_eq!(histories["vm-1"].probe.attempts.len(), 1);
    // The Machine got its Node (or is deleting): the job is dropped unread, and the history
    // forgets it.
    for facts in [
        MachineFacts {
            has_node: true,
            ..Default::default()
        },
        MachineFacts {
            deleting: true,
            ..Default::default()
        },
    ] {
        let mut prober = Prober::new(nowhere(), ProbeLimits::default());
        let histories = step_with_a_job_in_flight(&mut prober, facts.clone()).await;
        let h = &histories["vm-1"];
        assert_eq!(prober.report().counts.no_evidence, 0, "{facts:?}: read");
        assert_eq!(prober.report().in_flight, 0, "{facts:?}");
        assert_eq!(h.probe.in_flight_since, None, "{facts:?}");
        assert!(h.probe.attempts.is_empty(), "{facts:?}: {:?}", h.probe);
    }
}
