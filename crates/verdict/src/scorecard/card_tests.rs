//! The scorecard over cycles: what it counts, once, and what it keeps across a leader change.

use jiff::{SignedDuration, Timestamp};

use super::card::{MAX_GROUP_VALUES, OTHER, RECENT};
use super::*;
use crate::{reason, Status};
use capi_model::apis::Mode;

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn key(template: &str) -> BootKey {
    BootKey {
        template: template.into(),
        offering: "medium".into(),
        zone: "zone-a".into(),
    }
}

/// A Node-less Machine created at t(0), owned by a MachineSet, its VM Running, no verdict.
fn machine(name: &str) -> Observation {
    Observation {
        uid: format!("uid-{name}"),
        machine: format!("default/{name}"),
        labels: Labels {
            cluster: "default/prod".into(),
            zone: "zone-a".into(),
            template: "ubuntu".into(),
            offering: "medium".into(),
            hypervisor: "KVM".into(),
        },
        mode: Mode::Observe,
        timing: Timing {
            action_lag: SignedDuration::from_secs(60),
            stuck_after: SignedDuration::from_secs(600),
        },
        created: Some(t(0)),
        verdict: None,
        vm_running: true,
        annotated: None,
        mhc_marked: None,
        has_node: false,
        deleting: false,
        owned: true,
        boot_key: Some(key("ubuntu")),
        mhcs: vec![(
            "default/prod-workers".into(),
            SignedDuration::from_secs(600),
        )],
    }
}

fn says(mut o: Observation, status: Status, why: &str, since: i64) -> Observation {
    o.verdict = Some(Seen {
        status,
        reason: why.into(),
        evidence: format!("{why} evidence"),
        traffic_rising: status == Status::True,
        since: t(since),
    });
    o
}

fn card() -> Scorecard {
    Scorecard::new(
        t(0),
        SignedDuration::from_secs(120),
        SignedDuration::from_hours(24),
    )
}

/// Runs `cycles` (second, observations) and returns every outcome recorded.
fn run(c: &mut Scorecard, cycles: Vec<(i64, Vec<Observation>)>) -> Vec<Outcome> {
    cycles
        .into_iter()
        .flat_map(|(at, seen)| c.observe(t(at), &seen))
        .collect()
}

#[test]
fn a_silent_vm_that_then_joins_is_one_false_alarm_counted_once() {
    let mut c = card();
    let m = machine("slow");
    let silent = says(m.clone(), Status::False, reason::GUEST_NETWORK_SILENT, 100);
    let mut joined = says(m.clone(), Status::True, reason::VM_HEALTHY, 400);
    joined.has_node = true;
    let mut cycles = vec![(50, vec![m.clone()])];
    cycles.extend((100..400).step_by(10).map(|s| (s, vec![silent.clone()])));
    // Healthy with its Node from t(400): settled after 120 s, observed until t(900).
    cycles.extend((400..900).step_by(10).map(|s| (s, vec![joined.clone()])));
    let out = run(&mut c, cycles);
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(
        out[0].kind,
        OutcomeKind::FalseAlarm {
            false_to_node_secs: 300
        }
    );
    assert_eq!(out[0].reason, reason::GUEST_NETWORK_SILENT);
    assert_eq!(c.kept.count("false-alarm"), 1);
    assert_eq!(c.kept.groups["cluster"]["default/prod"]["false-alarm"], 1);
    assert_eq!(
        c.kept.by_reason["false-alarm"][reason::GUEST_NETWORK_SILENT],
        1
    );
    assert_eq!(c.following(), 0, "its story ended");
    // Its boot was measured: created t(0), Node first seen t(400).
    let rows = c.kept.baselines.rows();
    assert_eq!(rows.len(), 1);
    let p50 = rows[0].from_creation.unwrap().p50;
    assert!((p50 - 400.0).abs() / 400.0 < 0.02, "{p50}");
}

#[test]
fn a_healthy_boot_says_nothing_about_the_shim_and_a_healthy_node_is_not_followed() {
    let mut c = card();
    let booting = says(machine("fine"), Status::True, reason::VM_RUNNING, 30);
    let mut joined = says(machine("fine"), Status::True, reason::VM_HEALTHY, 200);
    joined.has_node = true;
    let mut old = joined.clone();
    old.uid = "uid-old".into();
    let mut cycles: Vec<_> = (30..200)
        .step_by(10)
        .map(|s| (s, vec![booting.clone(), old.clone()]))
        .collect();
    cycles.extend(
        (200..600)
            .step_by(10)
            .map(|s| (s, vec![joined.clone(), old.clone()])),
    );
    let out = run(&mut c, cycles);
    assert!(out.is_empty(), "{out:?}");
    // One story, ended when it settled; the Node already healthy when first seen had none.
    assert_eq!(c.kept.uneventful, 1);
    assert_eq!(c.following(), 0);
    assert!(c.kept.totals.is_empty());
}

#[test]
fn false_then_recycled_by_the_mhc_timer_would_have_saved_the_difference() {
    let mut c = card();
    let silent = says(machine("stuck"), Status::False, reason::VM_ERROR, 100);
    let mut marked = silent.clone();
    marked.mhc_marked = Some(MhcTrigger::NodeStartupTimeout);
    let mut deleting = marked.clone();
    deleting.deleting = true;
    let out = run(
        &mut c,
        vec![
            (100, vec![silent.clone()]),
            (200, vec![silent]),
            (600, vec![marked]),
            (610, vec![deleting]),
        ],
    );
    assert_eq!(out.len(), 1, "{out:?}");
    // False at 100, recycled at 610, acting would have started at 100 + 60.
    assert_eq!(
        out[0].kind,
        OutcomeKind::WouldHaveSaved {
            saved_secs: 450,
            recycled_by: Recycler::Mhc(MhcTrigger::NodeStartupTimeout)
        }
    );
    assert_eq!(c.kept.totals["would-have-saved"].seconds, 450);
}

#[test]
fn the_deleting_placeholder_does_not_replace_what_the_shim_said_when_the_mhc_recycled() {
    // What the controller really observes: a slow VM with traffic, `True`, recycled by the
    // MHC's timer; the cycle that sees it deleting carries `Unknown`/`MachineDeleting`.
    let mut c = card();
    let slow = says(machine("slow"), Status::True, reason::VM_HEALTHY, 100);
    let mut marked = slow.clone();
    marked.mhc_marked = Some(MhcTrigger::NodeStartupTimeout);
    marked.deleting = true;
    marked.verdict = Some(Seen {
        status: Status::Unknown,
        reason: reason::MACHINE_DELETING.into(),
        evidence: "Machine is being deleted".into(),
        traffic_rising: false,
        since: t(600),
    });
    // And a silent one: its `False` is what acting would have recycled on.
    let silent = says(machine("silent"), Status::False, reason::VM_ERROR, 100);
    let mut gone = marked.clone();
    gone.uid = silent.uid.clone();
    gone.machine = silent.machine.clone();
    let out = run(
        &mut c,
        vec![
            (100, vec![slow.clone(), silent.clone()]),
            (590, vec![slow, silent]),
            (600, vec![marked, gone]),
        ],
    );
    assert_eq!(out.len(), 2, "{out:?}");
    let of = |m: &str| out.iter().find(|o| o.machine == m).expect(m).clone();
    let missed = of("default/slow");
    assert_eq!(
        missed.kind,
        OutcomeKind::Missed {
            shim_said: ShimSaid::HealthyWithTraffic,
            trigger: MhcTrigger::NodeStartupTimeout
        }
    );
    assert_eq!(missed.reason, reason::VM_HEALTHY);
    assert_eq!(
        of("default/silent").kind,
        OutcomeKind::WouldHaveSaved {
            saved_secs: 440,
            recycled_by: Recycler::Mhc(MhcTrigger::NodeStartupTimeout)
        }
    );
}

#[test]
fn a_machine_marked_and_gone_between_cycles_takes_the_mark_from_its_departed_record() {
    // The MHC marks a Machine and its owner deletes it within one poll interval: no cycle
    // sees it marked or deleting. Its last state from the watch says who recycled it.
    let mut c = card();
    let silent = says(machine("silent"), Status::False, reason::VM_ERROR, 100);
    let slow = says(machine("slow"), Status::True, reason::VM_HEALTHY, 100);
    let scaled_down = says(machine("spare"), Status::False, reason::VM_ERROR, 100);
    for (at, seen) in [
        (100, vec![silent.clone(), slow.clone(), scaled_down.clone()]),
        (590, vec![silent, slow, scaled_down]),
    ] {
        assert!(c.observe(t(at), &seen).is_empty());
    }
    let marked = |uid: &str| Departed {
        uid: uid.into(),
        annotated: false,
        mhc_marked: Some(MhcTrigger::NodeStartupTimeout),
    };
    // "spare" went unmarked: a scale-down, nothing to say.
    let gone = [
        marked("uid-silent"),
        marked("uid-slow"),
        Departed {
            uid: "uid-spare".into(),
            annotated: false,
            mhc_marked: None,
        },
    ];
    let out = c.observe_with(t(600), &[], &gone);
    let of = |m: &str| out.iter().find(|o| o.machine == m).map(|o| o.kind);
    assert_eq!(
        of("default/silent"),
        Some(OutcomeKind::WouldHaveSaved {
            saved_secs: 440,
            recycled_by: Recycler::Mhc(MhcTrigger::NodeStartupTimeout)
        })
    );
    assert_eq!(
        of("default/slow"),
        Some(OutcomeKind::Missed {
            shim_said: ShimSaid::HealthyWithTraffic,
            trigger: MhcTrigger::NodeStartupTimeout
        })
    );
    assert_eq!(out.len(), 2, "{out:?}");
    assert_eq!(c.kept.uneventful, 1);
}

#[test]
fn a_machine_gone_between_cycles_ends_as_deleted_by_its_owner_or_by_hand() {
    let mut c = card();
    let owned = says(machine("a"), Status::False, reason::VM_ERROR, 100);
    let mut bare = says(machine("b"), Status::False, reason::VM_ERROR, 100);
    bare.owned = false;
    let out = run(
        &mut c,
        vec![
            (100, vec![owned.clone(), bare.clone()]),
            (300, vec![owned, bare]),
            (310, vec![]),
        ],
    );
    // The owner deleted `a` with no mark: a scale-down, nothing to say. `b` was deleted by
    // hand after 210 s of False: acting would have saved 150 s.
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].machine, "default/b");
    assert_eq!(
        out[0].kind,
        OutcomeKind::WouldHaveSaved {
            saved_secs: 150,
            recycled_by: Recycler::Hand
        }
    );
    assert_eq!(c.kept.uneventful, 1);
}

#[test]
fn still_stuck_is_counted_once_and_its_end_is_counted_too() {
    let mut c = card();
    let stuck = says(machine("stuck"), Status::False, reason::VM_ERROR, 100);
    let mut cycles: Vec<_> = (100..1000)
        .step_by(10)
        .map(|s| (s, vec![stuck.clone()]))
        .collect();
    let mut gone = stuck.clone();
    gone.owned = false;
    gone.deleting = true;
    cycles.push((1000, vec![gone]));
    let out = run(&mut c, cycles);
    let labels: Vec<_> = out.iter().map(|o| o.kind.label()).collect();
    assert_eq!(labels, ["still-stuck", "would-have-saved"], "{out:?}");
    assert_eq!(c.kept.count("still-stuck"), 1);
}

#[test]
fn a_new_leader_dates_a_standing_false_by_its_transition_and_keeps_the_counts() {
    let mut before = card();
    let silent = says(
        machine("slow"),
        Status::False,
        reason::GUEST_NETWORK_SILENT,
        100,
    );
    let mut other = says(machine("other"), Status::False, reason::VM_ERROR, 100);
    other.owned = false;
    run(
        &mut before,
        vec![
            (100, vec![silent.clone(), other.clone()]),
            (200, vec![silent.clone()]),
        ],
    );
    assert_eq!(before.kept.count("would-have-saved"), 1);
    // The leader's memory, as JSON, taken back by a new process at t(300).
    let json = serde_json::to_string(&before.kept).unwrap();
    let mut after = card();
    after.restore(serde_json::from_str(&json).unwrap());
    assert_eq!(after.kept, before.kept);
    let mut joined = says(machine("slow"), Status::True, reason::VM_HEALTHY, 400);
    joined.has_node = true;
    let mut cycles = vec![(300, vec![silent])];
    cycles.extend((400..700).step_by(10).map(|s| (s, vec![joined.clone()])));
    let out = run(&mut after, cycles);
    // Its False began at t(100) under the former leader (not t(300) when this one came).
    assert_eq!(
        out.iter().map(|o| o.kind).collect::<Vec<_>>(),
        [OutcomeKind::FalseAlarm {
            false_to_node_secs: 300
        }]
    );
    assert_eq!(after.kept.count("would-have-saved"), 1);
    assert_eq!(after.kept.count("false-alarm"), 1);
}

#[test]
fn a_machine_seen_first_with_its_node_gives_no_boot_time() {
    let mut c = card();
    let mut m = says(machine("old"), Status::True, reason::VM_HEALTHY, 30);
    m.has_node = true;
    run(&mut c, vec![(500, vec![m])]);
    assert!(c.kept.baselines.rows().is_empty());
}

#[test]
fn groups_recent_and_stories_are_bounded() {
    let mut c = card();
    let n = MAX_GROUP_VALUES + 5;
    let mut seen = Vec::new();
    for i in 0..n {
        let mut m = says(
            machine(&format!("m{i}")),
            Status::False,
            reason::VM_ERROR,
            100,
        );
        m.labels.cluster = format!("ns{i}/c");
        m.owned = false;
        seen.push(m);
    }
    run(
        &mut c,
        vec![(100, seen.clone()), (300, seen), (400, vec![])],
    );
    assert_eq!(c.kept.count("would-have-saved"), n as u64);
    let clusters = &c.kept.groups["cluster"];
    assert_eq!(clusters.len(), MAX_GROUP_VALUES + 1);
    assert_eq!(clusters[OTHER]["would-have-saved"], 5);
    assert_eq!(c.kept.recent.len(), RECENT);
}

#[test]
fn warnings_name_the_mhc_whose_timeout_is_below_the_boot_p95() {
    let mut c = card();
    // Ten Machines of a slow template become Nodes 500 s after creation; their MHC waits 600 s
    // (below 500 × 1.5).
    let cycles = vec![
        (10, (0..10).map(|i| machine(&format!("m{i}"))).collect()),
        (
            500,
            (0..10)
                .map(|i| {
                    let mut m = says(
                        machine(&format!("m{i}")),
                        Status::True,
                        reason::VM_HEALTHY,
                        500,
                    );
                    m.has_node = true;
                    m
                })
                .collect(),
        ),
    ];
    run(&mut c, cycles);
    let w = c.warnings(DEFAULT_WARN_POLICY);
    assert_eq!(w.len(), 1, "{w:?}");
    let Warning::MhcTimeoutBelowBoot {
        mhc, timeout_secs, ..
    } = &w[0]
    else {
        panic!("{w:?}")
    };
    assert_eq!((mhc.as_str(), *timeout_secs), ("default/prod-workers", 600));
}

#[test]
fn the_kept_part_fits_its_bound_and_keeps_every_count() {
    let mut c = card();
    // 300 boot keys with one sample each, and RECENT outcomes with long evidence.
    let mut first = Vec::new();
    let mut second = Vec::new();
    for i in 0..300 {
        let mut m = machine(&format!("m{i}"));
        m.boot_key = Some(key(&format!("template-{i}")));
        first.push(m.clone());
        m.has_node = true;
        m = says(m, Status::True, reason::VM_HEALTHY, 200);
        second.push(m);
    }
    for i in 0..RECENT {
        let mut m = says(
            machine(&format!("x{i}")),
            Status::False,
            reason::VM_ERROR,
            100,
        );
        m.owned = false;
        m.verdict.as_mut().unwrap().evidence = "e".repeat(2000);
        first.push(m);
    }
    run(
        &mut c,
        vec![(100, first.clone()), (200, second), (400, vec![])],
    );
    let (whole, left_out) = c.kept.encode(usize::MAX);
    assert!(left_out.is_empty());
    let max = whole.len() / 4;
    let (json, left_out) = c.kept.encode(max);
    assert!(json.len() <= max, "{} > {max}", json.len());
    assert!(!left_out.is_empty());
    let back: Kept = serde_json::from_str(&json).unwrap();
    assert_eq!(back.totals, c.kept.totals);
    assert_eq!(back.groups, c.kept.groups);
    assert!(back.baselines.current.keys.len() < 300);
    assert_eq!(serde_json::from_str::<Kept>(&whole).unwrap(), c.kept);
}

#[test]
fn ended_incidents_are_remembered_within_the_window_and_survive_a_leader_change() {
    use crate::incidents::book::EndedIncident;
    let window = SignedDuration::from_hours(1);
    let mut card = Scorecard::new(t(0), SignedDuration::from_mins(10), window);
    let ended = |until: i64, scope: &str| EndedIncident {
        scope: scope.into(),
        since: t(until - 60),
        until: t(until),
        peak_failing: 7,
        cause: None,
        summary: "7 Machines failing: no shared cause explains them".into(),
    };
    card.remember_incident(ended(100, "a"));
    card.remember_incident(ended(200, "b"));
    assert_eq!(card.kept.incidents.len(), 2);
    // One ending past the window forgets those before it.
    card.remember_incident(ended(100 + 3601, "c"));
    let scopes: Vec<&str> = card
        .kept
        .incidents
        .iter()
        .map(|i| i.scope.as_str())
        .collect();
    assert_eq!(scopes, ["b", "c"]);
    // Bounded.
    for i in 0..(card::INCIDENTS as i64 + 5) {
        card.remember_incident(ended(4000 + i, "d"));
    }
    assert_eq!(card.kept.incidents.len(), card::INCIDENTS);
    // Kept with the counts for the next leader; an older copy without incidents still reads.
    let (json, left_out) = card.kept.encode(200 * 1024);
    assert!(left_out.is_empty());
    let back: card::Kept = serde_json::from_str(&json).unwrap();
    assert_eq!(back.incidents, card.kept.incidents);
    let mut old: serde_json::Value = serde_json::from_str(&json).unwrap();
    old.as_object_mut().unwrap().remove("incidents");
    let back: card::Kept = serde_json::from_value(old).unwrap();
    assert!(back.incidents.is_empty());
}
