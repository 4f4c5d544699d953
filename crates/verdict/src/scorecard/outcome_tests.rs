//! One test per outcome, and the stories between them.

use jiff::{SignedDuration, Timestamp};

use super::outcome::{Spell, SPELLS_KEPT};
use super::*;
use crate::{reason, Status};
use capi_model::apis::Mode;

fn t(secs: i64) -> Timestamp {
    Timestamp::from_second(1_800_000_000 + secs).unwrap()
}

fn labels() -> Labels {
    Labels {
        cluster: "default/prod".into(),
        zone: "zone-a".into(),
        template: "ubuntu-2404".into(),
        offering: "medium".into(),
        hypervisor: "KVM".into(),
    }
}

/// The escalation delay (or condition timeout) is 2 min, the nodeStartupTimeout 10 min.
fn story(mode: Mode) -> Story {
    let timing = Timing {
        action_lag: SignedDuration::from_secs(120),
        stuck_after: SignedDuration::from_secs(600),
    };
    Story::new("default/prod-md-0-abc", labels(), mode, timing)
}

fn verdict(status: Status, why: &str, rising: bool) -> Event {
    Event::Verdict {
        status,
        reason: why.into(),
        evidence: format!("{why} evidence"),
        traffic_rising: rising,
    }
}

fn silent() -> Event {
    verdict(Status::False, reason::GUEST_NETWORK_SILENT, false)
}

fn healthy() -> Event {
    verdict(Status::True, reason::VM_HEALTHY, true)
}

fn play(mut s: Story, events: Vec<(i64, Event)>) -> Story {
    for (at, e) in events {
        s.record(t(at), e);
    }
    s
}

/// The outcome once the story ended (asserts it did).
fn ended(s: &Story) -> Option<Outcome> {
    assert!(s.ended(), "the story should have ended");
    s.outcome(t(1_000_000))
}

fn kind(s: &Story) -> Option<OutcomeKind> {
    ended(s).map(|o| o.kind)
}

const MARK_TIMER: Event = Event::MhcMarked {
    trigger: MhcTrigger::NodeStartupTimeout,
};
const BY_OWNER: Event = Event::Deleted { by: Deleter::Owner };

#[test]
fn recycled_on_signal_in_annotate_mode() {
    let s = play(
        story(Mode::Annotate),
        vec![
            (0, silent()),
            (120, Event::Annotated { by_shim: true }),
            (
                125,
                Event::MhcMarked {
                    trigger: MhcTrigger::Annotation,
                },
            ),
            (150, BY_OWNER),
        ],
    );
    let o = ended(&s).unwrap();
    assert_eq!(
        o.kind,
        OutcomeKind::RecycledOnSignal {
            false_to_delete_secs: 150
        }
    );
    assert_eq!(o.kind.label(), "recycled-on-signal");
    assert_eq!(o.reason, reason::GUEST_NETWORK_SILENT);
    assert_eq!(o.evidence, "GuestNetworkSilent evidence");
    assert_eq!((o.labels, o.mode, o.at), (labels(), Mode::Annotate, t(150)));
}

#[test]
fn recycled_on_signal_when_the_mhc_lists_the_condition() {
    let s = play(
        story(Mode::Condition),
        vec![
            (10, verdict(Status::False, reason::VM_STOPPED, false)),
            (
                130,
                Event::MhcMarked {
                    trigger: MhcTrigger::Condition,
                },
            ),
            (200, BY_OWNER),
        ],
    );
    assert_eq!(
        kind(&s),
        Some(OutcomeKind::RecycledOnSignal {
            false_to_delete_secs: 190
        })
    );
}

#[test]
fn would_have_saved_when_the_mhc_timer_recycled_a_false_machine() {
    // Observe mode: False at 60 s, MHC's nodeStartupTimeout at 600 s, deleted at 610 s;
    // acting would have recycled at 60 + 120 s.
    let s = play(
        story(Mode::Observe),
        vec![
            (0, verdict(Status::True, reason::VM_RUNNING, false)),
            (60, silent()),
            (600, MARK_TIMER),
            (610, BY_OWNER),
        ],
    );
    let o = ended(&s).unwrap();
    assert_eq!(
        o.kind,
        OutcomeKind::WouldHaveSaved {
            saved_secs: 610 - 60 - 120,
            recycled_by: Recycler::Mhc(MhcTrigger::NodeStartupTimeout),
        }
    );
    assert_eq!(o.reason, reason::GUEST_NETWORK_SILENT);
}

#[test]
fn would_have_saved_when_deleted_by_hand() {
    let s = play(
        story(Mode::Observe),
        vec![(0, silent()), (1000, Event::Deleted { by: Deleter::Hand })],
    );
    assert_eq!(
        kind(&s),
        Some(OutcomeKind::WouldHaveSaved {
            saved_secs: 880,
            recycled_by: Recycler::Hand
        })
    );
}

#[test]
fn a_recycle_sooner_than_acting_saves_nothing() {
    let s = play(
        story(Mode::Observe),
        vec![(0, silent()), (50, MARK_TIMER), (60, BY_OWNER)],
    );
    assert_eq!(
        kind(&s),
        Some(OutcomeKind::WouldHaveSaved {
            saved_secs: 0,
            recycled_by: Recycler::Mhc(MhcTrigger::NodeStartupTimeout)
        })
    );
}

#[test]
fn false_alarm_when_a_false_machine_joins_and_stays_healthy() {
    // The silent-then-joins VM of issue 44's "done when", in observe mode: one false alarm.
    let s = play(
        story(Mode::Observe),
        vec![
            (0, verdict(Status::True, reason::VM_RUNNING, false)),
            (200, silent()),
            (260, healthy()),
            (300, Event::NodeAppeared),
            (900, Event::Settled),
        ],
    );
    let o = ended(&s).unwrap();
    assert_eq!(
        o.kind,
        OutcomeKind::FalseAlarm {
            false_to_node_secs: 100
        }
    );
    assert_eq!(o.kind.label(), "false-alarm");
    assert_eq!(o.reason, reason::GUEST_NETWORK_SILENT);
}

#[test]
fn false_alarm_even_while_still_false_when_the_node_came() {
    let s = play(
        story(Mode::Condition),
        vec![
            (0, silent()),
            (30, Event::NodeAppeared),
            (40, healthy()),
            (700, Event::Settled),
        ],
    );
    assert_eq!(
        kind(&s),
        Some(OutcomeKind::FalseAlarm {
            false_to_node_secs: 30
        })
    );
}

#[test]
fn recovered_when_a_noded_machine_false_is_contradicted() {
    let s = play(
        story(Mode::Annotate),
        vec![
            (0, Event::NodeAppeared),
            (10, healthy()),
            (100, verdict(Status::False, reason::VM_STOPPED, false)),
            (160, healthy()),
            (800, Event::Settled),
        ],
    );
    let o = ended(&s).unwrap();
    assert_eq!(o.kind, OutcomeKind::Recovered { false_for_secs: 60 });
    assert_eq!(o.reason, reason::VM_STOPPED);
}

#[test]
fn missed_a_slow_but_healthy_vm() {
    let s = play(
        story(Mode::Observe),
        vec![
            (0, verdict(Status::True, reason::VM_RUNNING, false)),
            (90, healthy()),
            (600, MARK_TIMER),
            (605, BY_OWNER),
        ],
    );
    let o = ended(&s).unwrap();
    assert_eq!(
        o.kind,
        OutcomeKind::Missed {
            shim_said: ShimSaid::HealthyWithTraffic,
            trigger: MhcTrigger::NodeStartupTimeout,
        }
    );
    assert_eq!(o.kind.label(), "missed");
    assert_eq!(o.reason, reason::VM_HEALTHY, "the last verdict's reason");
}

#[test]
fn missed_without_evidence() {
    for first in [
        Some(verdict(
            Status::Unknown,
            reason::CLOUDSTACK_API_UNAVAILABLE,
            false,
        )),
        None,
    ] {
        let mut events: Vec<(i64, Event)> = first.into_iter().map(|e| (0, e)).collect();
        events.extend([(600, MARK_TIMER), (601, BY_OWNER)]);
        let s = play(story(Mode::Condition), events);
        assert_eq!(
            kind(&s),
            Some(OutcomeKind::Missed {
                shim_said: ShimSaid::NoEvidence,
                trigger: MhcTrigger::NodeStartupTimeout,
            })
        );
    }
}

#[test]
fn missed_while_true_without_rising_traffic() {
    let s = play(
        story(Mode::Observe),
        vec![
            (0, verdict(Status::True, reason::VM_RUNNING, false)),
            (600, MARK_TIMER),
            (601, BY_OWNER),
        ],
    );
    assert_eq!(
        kind(&s),
        Some(OutcomeKind::Missed {
            shim_said: ShimSaid::HealthyWithoutTraffic,
            trigger: MhcTrigger::NodeStartupTimeout,
        })
    );
}

#[test]
fn a_false_too_short_to_act_on_is_still_a_miss() {
    let s = play(
        story(Mode::Observe),
        vec![
            (0, silent()),
            (30, healthy()),
            (600, MARK_TIMER),
            (601, BY_OWNER),
        ],
    );
    assert_eq!(
        kind(&s),
        Some(OutcomeKind::Missed {
            shim_said: ShimSaid::HealthyWithTraffic,
            trigger: MhcTrigger::NodeStartupTimeout,
        })
    );
}

#[test]
fn still_stuck_after_the_mhc_timeout_with_nothing_acting() {
    let s = play(story(Mode::Observe), vec![(100, silent())]);
    assert!(!s.ended());
    assert_eq!(
        s.outcome(t(700)),
        None,
        "exactly the timeout is not past it"
    );
    let o = s.outcome(t(701)).unwrap();
    assert_eq!(
        o.kind,
        OutcomeKind::StillStuck {
            false_for_secs: 601
        }
    );
    assert_eq!((o.kind.label(), o.at), ("still-stuck", t(701)));

    let marked = play(s.clone(), vec![(650, MARK_TIMER)]);
    assert_eq!(marked.outcome(t(701)), None, "the MHC acted");
    let noded = play(s.clone(), vec![(650, Event::NodeAppeared)]);
    assert_eq!(noded.outcome(t(701)), None, "a Machine with its Node");
    let withdrawn = play(s, vec![(650, healthy())]);
    assert_eq!(withdrawn.outcome(t(701)), None, "no longer False");
}

#[test]
fn false_true_false_then_the_timer_counts_the_spell_that_would_have_acted() {
    // The first False lasted 30 s (< 120 s): acting would not have recycled on it.
    let s = play(
        story(Mode::Observe),
        vec![
            (0, silent()),
            (30, healthy()),
            (100, verdict(Status::False, reason::NIC_DETACHED, false)),
            (600, MARK_TIMER),
            (600, BY_OWNER),
        ],
    );
    let o = ended(&s).unwrap();
    assert_eq!(
        o.kind,
        OutcomeKind::WouldHaveSaved {
            saved_secs: 500 - 120,
            recycled_by: Recycler::Mhc(MhcTrigger::NodeStartupTimeout)
        }
    );
    assert_eq!(o.reason, reason::NIC_DETACHED);

    // A first False long enough to act on counts from its start, though withdrawn since.
    let s = play(
        story(Mode::Observe),
        vec![
            (0, silent()),
            (200, healthy()),
            (300, silent()),
            (600, MARK_TIMER),
            (600, BY_OWNER),
        ],
    );
    assert_eq!(
        kind(&s),
        Some(OutcomeKind::WouldHaveSaved {
            saved_secs: 480,
            recycled_by: Recycler::Mhc(MhcTrigger::NodeStartupTimeout)
        })
    );
}

#[test]
fn false_true_false_then_settled_is_one_false_alarm() {
    let s = play(
        story(Mode::Observe),
        vec![
            (0, silent()),
            (30, healthy()),
            (100, silent()),
            (130, Event::NodeAppeared),
            (140, healthy()),
            (900, Event::Settled),
        ],
    );
    assert_eq!(
        kind(&s),
        Some(OutcomeKind::FalseAlarm {
            false_to_node_secs: 130
        }),
        "counted from the first False"
    );
}

#[test]
fn deleted_before_settle_without_any_recycle_says_nothing() {
    // A scale-down between the Node and the settle time.
    let s = play(
        story(Mode::Annotate),
        vec![(0, healthy()), (60, Event::NodeAppeared), (120, BY_OWNER)],
    );
    assert_eq!(kind(&s), None);
    // Even after a False before its Node: no recycle, and it never settled as healthy.
    let s = play(
        story(Mode::Observe),
        vec![
            (0, silent()),
            (30, healthy()),
            (60, Event::NodeAppeared),
            (120, BY_OWNER),
        ],
    );
    assert_eq!(kind(&s), None);
}

#[test]
fn a_machine_that_never_had_a_verdict() {
    let settled = play(
        story(Mode::Condition),
        vec![(60, Event::NodeAppeared), (700, Event::Settled)],
    );
    assert_eq!(kind(&settled), None);
    let by_hand = play(
        story(Mode::Condition),
        vec![(60, Event::Deleted { by: Deleter::Hand })],
    );
    assert_eq!(kind(&by_hand), None, "a repair or a decommission");
    let unjudged = play(story(Mode::Condition), vec![]);
    assert_eq!(unjudged.outcome(t(10_000)), None);
}

#[test]
fn observe_and_acting_modes_differ_only_by_what_acted() {
    // The same VM: in annotate mode the shim's annotation recycles it; in observe mode the
    // MHC's timer does, later.
    let acting = play(
        story(Mode::Annotate),
        vec![
            (0, silent()),
            (120, Event::Annotated { by_shim: true }),
            (180, BY_OWNER),
        ],
    );
    let observing = play(
        story(Mode::Observe),
        vec![(0, silent()), (600, MARK_TIMER), (660, BY_OWNER)],
    );
    assert_eq!(
        kind(&acting),
        Some(OutcomeKind::RecycledOnSignal {
            false_to_delete_secs: 180
        })
    );
    assert_eq!(
        kind(&observing),
        Some(OutcomeKind::WouldHaveSaved {
            saved_secs: 540,
            recycled_by: Recycler::Mhc(MhcTrigger::NodeStartupTimeout)
        })
    );
    // An annotation by someone else is no signal of the shim's.
    let by_someone = play(
        story(Mode::Observe),
        vec![
            (0, silent()),
            (300, Event::Annotated { by_shim: false }),
            (
                301,
                Event::MhcMarked {
                    trigger: MhcTrigger::Annotation,
                },
            ),
            (360, BY_OWNER),
        ],
    );
    assert_eq!(
        kind(&by_someone),
        Some(OutcomeKind::WouldHaveSaved {
            saved_secs: 240,
            recycled_by: Recycler::Mhc(MhcTrigger::Annotation)
        })
    );
}

#[test]
fn an_mhc_acting_on_a_withdrawn_false_is_not_the_shims_signal() {
    let s = play(
        story(Mode::Condition),
        vec![
            (0, silent()),
            (30, healthy()),
            (
                200,
                Event::MhcMarked {
                    trigger: MhcTrigger::Condition,
                },
            ),
            (210, BY_OWNER),
        ],
    );
    assert_eq!(
        kind(&s),
        Some(OutcomeKind::Missed {
            shim_said: ShimSaid::HealthyWithTraffic,
            trigger: MhcTrigger::Condition
        })
    );
}

#[test]
fn events_after_the_end_change_nothing() {
    let s = play(
        story(Mode::Observe),
        vec![(0, silent()), (600, MARK_TIMER), (610, BY_OWNER)],
    );
    let before = ended(&s);
    let after = play(s, vec![(700, Event::NodeAppeared), (800, Event::Settled)]);
    assert_eq!(ended(&after), before);
}

#[test]
fn a_flapping_vm_keeps_its_first_and_newest_spells() {
    let mut events = Vec::new();
    for i in 0..100 {
        events.push((i * 20, silent()));
        events.push((i * 20 + 10, healthy()));
    }
    let s = play(story(Mode::Observe), events);
    assert_eq!(s.spells.len(), SPELLS_KEPT);
    let froms: Vec<Timestamp> = s.spells.iter().map(|sp: &Spell| sp.from).collect();
    assert_eq!(froms[0], t(0));
    assert_eq!(froms[SPELLS_KEPT - 1], t(99 * 20));
    assert_eq!(froms[1], t((100 - SPELLS_KEPT as i64 + 1) * 20));
}

#[test]
fn labels_are_distinct_and_listed() {
    let kinds = [
        OutcomeKind::RecycledOnSignal {
            false_to_delete_secs: 0,
        },
        OutcomeKind::WouldHaveSaved {
            saved_secs: 0,
            recycled_by: Recycler::Hand,
        },
        OutcomeKind::FalseAlarm {
            false_to_node_secs: 0,
        },
        OutcomeKind::Recovered { false_for_secs: 0 },
        OutcomeKind::Missed {
            shim_said: ShimSaid::NoEvidence,
            trigger: MhcTrigger::Other,
        },
        OutcomeKind::StillStuck { false_for_secs: 0 },
    ];
    let labels: Vec<&str> = kinds.iter().map(OutcomeKind::label).collect();
    assert_eq!(labels, OUTCOMES);
}

#[test]
fn stories_and_outcomes_survive_a_json_round_trip() {
    let s = play(
        story(Mode::Observe),
        vec![
            (0, silent()),
            (30, healthy()),
            (100, silent()),
            (300, Event::Annotated { by_shim: false }),
            (600, MARK_TIMER),
        ],
    );
    let back: Story = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
    assert_eq!(back, s);
    let done = play(back, vec![(610, BY_OWNER)]);
    let o = ended(&done).unwrap();
    let json = serde_json::to_value(&o).unwrap();
    assert_eq!(json["kind"]["outcome"], "would-have-saved");
    assert_eq!(json["mode"], "observe");
    let back: Outcome = serde_json::from_value(json).unwrap();
    assert_eq!(back, o);
}
