use super::storms::{self, Rng, StormKind};
use super::*;

/// A VM on `host` (in `cluster`, pod `pod`), network `net` with router `r-<net>` Running,
/// template `tpl`, offering `small`, zone `z1`.
fn vm(failing: bool, host: &str, cluster: &str, net: &str, tpl: &str) -> VmFacts {
    VmFacts {
        failing,
        host: Some(Thing::new(host)),
        host_state: Some(HostControlState::Enabled),
        cluster: Some(Thing::new(cluster)),
        pod: Some(Thing::new("pod1")),
        network: Some(Thing::new(net)),
        router: Some(RouterFacts {
            router: Thing::named(format!("r-{net}"), format!("r-{net}-VM")),
            state: Some("Running".into()),
            host: Some("h9".into()),
        }),
        template: Some(Thing::new(tpl)),
        offering: Some(Thing::new("small")),
        zone: Some(Thing::named("z1-id", "z1")),
    }
}

/// 40 healthy VMs over hosts h0–h7 (clusters c0/c1 by host parity), networks n0–n3,
/// templates t0/t1.
fn fleet() -> Vec<VmFacts> {
    (0..40)
        .map(|i| {
            vm(
                false,
                &format!("h{}", i % 8),
                &format!("c{}", i % 2),
                &format!("n{}", i % 4),
                &format!("t{}", i % 2),
            )
        })
        .collect()
}

fn cause(inc: &Incident) -> (CauseKind, &str) {
    let c = inc.cause.as_ref().expect("a cause is named");
    (c.kind, c.id.as_str())
}

#[test]
fn below_the_threshold_there_is_no_incident_unless_the_guard_holds() {
    let mut vms = fleet();
    for v in vms
        .iter_mut()
        .filter(|v| v.host.as_ref().unwrap().id == "h3")
    {
        v.failing = true; // 5 VMs: i = 3, 11, 19, 27, 35
    }
    vms[3].failing = false;
    let p = Policy::default();
    assert_eq!(find(&vms, &p, false), None, "4 failing < 5");
    let held = find(&vms, &p, true).expect("the guard holds the scope");
    assert_eq!(held.trigger, Trigger::GuardHeld);
    assert_eq!(held.failing, 4);
    vms[3].failing = true;
    let inc = find(&vms, &p, false).expect("5 failing");
    assert_eq!(inc.trigger, Trigger::Threshold);
    assert_eq!(cause(&inc), (CauseKind::Host, "h3"));
    let p6 = Policy {
        min_failing: 6,
        ..p
    };
    assert_eq!(find(&vms, &p6, false), None);
    assert_eq!(
        find(&fleet(), &p, true),
        None,
        "nothing failing: nothing to explain"
    );
}

#[test]
fn a_host_down_is_named_with_its_state() {
    let mut vms = fleet();
    for v in vms
        .iter_mut()
        .filter(|v| v.host.as_ref().unwrap().id == "h2")
    {
        v.failing = true;
        v.host_state = Some(HostControlState::Offline);
    }
    let inc = find(&vms, &Policy::default(), false).unwrap();
    let c = inc.cause.as_ref().unwrap();
    assert_eq!((c.kind, c.id.as_str()), (CauseKind::Host, "h2"));
    assert_eq!(c.state.as_deref(), Some("Offline"));
    assert_eq!((c.failing, c.healthy), (5, 0));
    assert_eq!(c.failing_coverage, 1.0);
    assert_eq!(c.healthy_coverage, 0.0);
    assert_eq!(c.score, 1.0);
    assert!(inc
        .summary()
        .starts_with("5 of 5 failing Machines share host h2 (state Offline)"));
}

#[test]
fn a_stopped_router_is_named_before_its_network() {
    let mut vms = fleet();
    for v in vms
        .iter_mut()
        .filter(|v| v.network.as_ref().unwrap().id == "n1")
    {
        v.failing = true;
        let r = v.router.as_mut().unwrap();
        r.state = Some("Stopped".into());
        r.host = None;
    }
    let inc = find(&vms, &Policy::default(), false).unwrap();
    assert_eq!(cause(&inc), (CauseKind::Router, "r-n1"));
    assert_eq!(inc.cause.as_ref().unwrap().name.as_deref(), Some("r-n1-VM"));
    assert_eq!(
        inc.cause.as_ref().unwrap().state.as_deref(),
        Some("Stopped")
    );
    // Same VMs, same score: the network is the runner-up.
    assert_eq!(inc.candidates[1].kind, CauseKind::Network);
    assert_eq!(inc.candidates[1].score, inc.candidates[0].score);
}

#[test]
fn a_network_behind_a_running_router_is_named_as_the_network() {
    let mut vms = fleet();
    for v in vms
        .iter_mut()
        .filter(|v| v.network.as_ref().unwrap().id == "n2")
    {
        v.failing = true;
    }
    let inc = find(&vms, &Policy::default(), false).unwrap();
    assert_eq!(cause(&inc), (CauseKind::Network, "n2"));
    assert_eq!(inc.candidates[1].kind, CauseKind::Router);
    // A router whose state is unknown is more specific than its network.
    for v in &mut vms {
        v.router.as_mut().unwrap().state = None;
    }
    let inc = find(&vms, &Policy::default(), false).unwrap();
    assert_eq!(cause(&inc), (CauseKind::Router, "r-n2"));
}

#[test]
fn a_template_is_named() {
    let mut vms = fleet();
    // t2: 8 new VMs on every host, all failing.
    for i in 0..8 {
        vms.push(vm(
            true,
            &format!("h{i}"),
            &format!("c{}", i % 2),
            "n0",
            "t2",
        ));
    }
    let inc = find(&vms, &Policy::default(), false).unwrap();
    assert_eq!(cause(&inc), (CauseKind::Template, "t2"));
}

#[test]
fn a_zone_is_named_and_ties_go_to_the_more_specific_host() {
    let mut vms = fleet();
    for i in 0..10 {
        let mut v = vm(true, &format!("hz{}", i % 3), "cz", "nz", "t0");
        v.pod = Some(Thing::new(format!("pz{}", i % 2)));
        v.zone = Some(Thing::new("z2"));
        vms.push(v);
    }
    let inc = find(&vms, &Policy::default(), false).unwrap();
    // Cluster cz, network nz and its router cover the same 10 VMs as zone z2: the most
    // specific of them wins (network: its router is known Running).
    assert_eq!(cause(&inc), (CauseKind::Network, "nz"));
    // Without the network facts, cluster beats zone.
    for v in &mut vms {
        v.network = None;
        v.router = None;
    }
    let inc = find(&vms, &Policy::default(), false).unwrap();
    assert_eq!(cause(&inc), (CauseKind::Cluster, "cz"));
    // With only zones known, the zone.
    for v in &mut vms {
        v.cluster = None;
    }
    let inc = find(&vms, &Policy::default(), false).unwrap();
    assert_eq!(cause(&inc), (CauseKind::Zone, "z2"));
    assert_eq!(inc.cause.as_ref().unwrap().name, None);
}

#[test]
fn a_host_beats_its_cluster_when_both_cover_the_failing() {
    let mut vms = fleet();
    for v in vms
        .iter_mut()
        .filter(|v| v.host.as_ref().unwrap().id == "h4")
    {
        v.failing = true;
    }
    let inc = find(&vms, &Policy::default(), false).unwrap();
    // h4's cluster c0 covers them too, but also 15 healthy VMs: a lower score.
    assert_eq!(cause(&inc), (CauseKind::Host, "h4"));
    let c0 = inc.candidates.iter().find(|c| c.kind == CauseKind::Cluster);
    assert!(c0.is_none_or(|c| c.score < 1.0));
    // A one-host cluster ties with its host: the host, being more specific.
    for v in vms
        .iter_mut()
        .filter(|v| v.host.as_ref().unwrap().id == "h4")
    {
        v.cluster = Some(Thing::new("c-solo"));
    }
    let inc = find(&vms, &Policy::default(), false).unwrap();
    assert_eq!(cause(&inc), (CauseKind::Host, "h4"));
    assert_eq!(inc.candidates[1].kind, CauseKind::Cluster);
    assert_eq!(inc.candidates[1].score, 1.0);
}

#[test]
fn a_bad_state_wins_a_tie_against_a_more_specific_kind() {
    // Eight VMs share host h1 and router r-x; the host is Enabled, the router Stopped.
    let mut vms = fleet();
    for _ in 0..8 {
        let mut v = vm(true, "h-x", "c-x", "n-x", "t0");
        v.router.as_mut().unwrap().state = Some("Stopped".into());
        vms.push(v);
    }
    let inc = find(&vms, &Policy::default(), false).unwrap();
    assert_eq!(cause(&inc), (CauseKind::Router, "r-n-x"));
    // Host Disconnected as well: both bad, the host is more specific.
    for v in vms.iter_mut().filter(|v| v.failing) {
        v.host_state = Some(HostControlState::Other("Disconnected".into()));
    }
    let inc = find(&vms, &Policy::default(), false).unwrap();
    assert_eq!(cause(&inc), (CauseKind::Host, "h-x"));
}

#[test]
fn independent_failures_have_no_shared_cause() {
    let mut vms = fleet();
    // Six failures on six hosts, three networks, both templates, both clusters.
    for i in [0, 9, 18, 27, 4, 13] {
        vms[i].failing = true;
    }
    let inc = find(&vms, &Policy::default(), false).unwrap();
    assert_eq!(inc.cause, None);
    assert_eq!(inc.candidates.len(), TOP);
    assert!(inc
        .summary()
        .starts_with("6 Machines failing: no shared cause explains them; the closest"));
    // The zone and the offering cover all of them, and all the healthy too.
    let best = &inc.candidates[0];
    assert!(best.healthy_coverage > 0.2 || best.score < 0.6, "{best:?}");
}

#[test]
fn the_rule_refuses_a_weak_score_a_weak_contrast_or_too_few_failing() {
    let c = Cause {
        kind: CauseKind::Template,
        id: "t".into(),
        name: None,
        state: None,
        host: None,
        failing: 10,
        healthy: 10,
        failing_coverage: 1.0,
        healthy_coverage: 0.21,
        score: 0.49,
        contrast: 0.9,
    };
    let p = Policy::default();
    assert!(!names(&c, &p), "score 0.49");
    let c = Cause { score: 0.5, ..c };
    assert!(names(&c, &p));
    assert!(
        !names(
            &Cause {
                contrast: 0.49,
                ..c.clone()
            },
            &p
        ),
        "contrast 0.49"
    );
    assert!(
        !names(
            &Cause {
                contrast: -1.0,
                ..c.clone()
            },
            &p
        ),
        "the whole scope"
    );
    assert!(
        !names(
            &Cause {
                failing: 2,
                ..c.clone()
            },
            &p
        ),
        "2 failing VMs"
    );
    // The coverage rule, when asked for.
    let coverage = Policy {
        min_failing_coverage: 0.8,
        max_healthy_coverage: 0.2,
        ..p
    };
    assert!(!names(&c, &coverage), "21 % of the healthy");
    let c = Cause {
        healthy_coverage: 0.2,
        ..c
    };
    assert!(names(&c, &coverage));
    assert!(!names(
        &Cause {
            failing_coverage: 0.79,
            ..c
        },
        &coverage
    ));
}

#[test]
fn a_value_the_whole_scope_shares_is_not_named() {
    // 30 of 40 VMs of one zone fail on many hosts: the zone covers them all, but every
    // healthy VM too; nothing contrasts.
    let mut vms = fleet();
    for v in vms.iter_mut().take(30) {
        v.failing = true;
    }
    let inc = find(&vms, &Policy::default(), false).unwrap();
    assert_eq!(inc.cause, None, "{:?}", inc.candidates);
    let zone = inc
        .candidates
        .iter()
        .find(|c| c.kind == CauseKind::Zone)
        .expect("the zone scores best");
    assert_eq!(zone.contrast, -1.0);
    assert!(zone.score >= 0.5);
}

#[test]
fn the_result_does_not_depend_on_input_order() {
    let mut rng = Rng::new(3);
    for kind in StormKind::ALL {
        let Some(s) = storms::storm(&mut rng, 300, kind) else {
            continue;
        };
        let a = find(&s.vms, &Policy::default(), false);
        let mut rev = s.vms.clone();
        rev.reverse();
        assert_eq!(a, find(&rev, &Policy::default(), false), "{kind:?}");
    }
}

#[test]
fn facts_from_a_listing() {
    let vm: VirtualMachine = serde_json::from_value(serde_json::json!({
        "id": "vm-1", "name": "m1", "state": "Running",
        "hostid": "h-1", "hostname": "kvm1", "hostcontrolstate": "Offline",
        "zoneid": "z-1", "zonename": "zone1",
        "templatename": "ubuntu-2404-kube", "serviceofferingname": "medium",
        "nic": [
            {"id": "n1", "networkid": "net-a", "isdefault": false},
            {"id": "n2", "networkid": "net-b", "isdefault": true}
        ]
    }))
    .unwrap();
    let f = VmFacts::from_vm(&vm, true);
    assert!(f.failing);
    assert_eq!(f.host, Some(Thing::named("h-1", "kvm1")));
    assert_eq!(f.host_state, Some(HostControlState::Offline));
    assert_eq!(f.network, Some(Thing::new("net-b")));
    assert_eq!(
        f.template,
        Some(Thing::named("ubuntu-2404-kube", "ubuntu-2404-kube"))
    );
    assert_eq!(f.offering.as_ref().map(|t| t.id.as_str()), Some("medium"));
    assert_eq!(f.zone, Some(Thing::named("z-1", "zone1")));
    assert_eq!((f.router, f.cluster, f.pod), (None, None, None));
}

#[test]
fn serde_round_trip_and_wire_names() {
    let mut vms = fleet();
    for v in vms
        .iter_mut()
        .filter(|v| v.host.as_ref().unwrap().id == "h2")
    {
        v.failing = true;
    }
    let inc = find(&vms, &Policy::default(), true).unwrap();
    let json = serde_json::to_value(&inc).unwrap();
    assert_eq!(json["trigger"], "guardHeld");
    assert_eq!(json["cause"]["kind"], "host");
    assert_eq!(json["cause"]["failingCoverage"], 1.0);
    let back: Incident = serde_json::from_value(json).unwrap();
    assert_eq!(back, inc);
}

/// The benchmark's targets, at the default policy: a test so that `cargo test` fails when the
/// finder regresses (`make bench` reports the same numbers over more storms).
#[test]
fn the_benchmark_targets_hold_at_the_default_policy() {
    let s = storms::evaluate(45, 50, &Policy::default());
    assert_eq!(s.storms(), 250);
    assert!(
        s.precision() >= 0.95,
        "precision {:.3}: {s:?}",
        s.precision()
    );
    assert!(s.recall() >= 0.95, "recall {:.3}: {s:?}", s.recall());
    assert_eq!(s.false_causes, 0, "{s:?}");
    assert_eq!(s.threshold_false_causes, 0, "{s:?}");
}
