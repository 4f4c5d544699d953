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
        prober.routers.insert(
            format!("net-{n}"),
            RouterSeen {
                router: None,
                at: t0,
            },
        );
        prober
            .started_per_scope
            .insert(format!("scope-{n}"), VecDeque::from([t0]));
    }
    let mut none = BTreeMap::new();
    let later = t0 + graces.poll_interval * NO_ROUTER_KEPT_POLLS;
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
