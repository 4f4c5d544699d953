//! What must hold for any story, whatever its events.

use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;

use super::*;
use crate::Status;
use capi_model::apis::Mode;

fn event() -> impl Strategy<Value = Event> {
    let status = prop_oneof![
        Just(Status::True),
        Just(Status::False),
        Just(Status::Unknown)
    ];
    let trigger = prop_oneof![
        Just(MhcTrigger::Condition),
        Just(MhcTrigger::NodeStartupTimeout),
        Just(MhcTrigger::Annotation),
        Just(MhcTrigger::Other),
    ];
    prop_oneof![
        4 => (status, any::<bool>()).prop_map(|(status, traffic_rising)| Event::Verdict {
            status,
            reason: format!("{status:?}"),
            evidence: String::new(),
            traffic_rising,
        }),
        1 => any::<bool>().prop_map(|by_shim| Event::Annotated { by_shim }),
        1 => trigger.prop_map(|trigger| Event::MhcMarked { trigger }),
        1 => Just(Event::NodeAppeared),
        1 => prop_oneof![Just(Deleter::Owner), Just(Deleter::Hand)]
            .prop_map(|by| Event::Deleted { by }),
        1 => Just(Event::Settled),
    ]
}

proptest! {
    #[test]
    fn outcomes_follow_from_the_story(
        events in prop::collection::vec((0i64..600, event()), 0..30),
        lag in 0i64..300,
    ) {
        let timing = Timing {
            action_lag: SignedDuration::from_secs(lag),
            stuck_after: SignedDuration::from_secs(600),
        };
        let mut s = Story::new("ns/m", Labels::default(), Mode::Observe, timing);
        let mut at = Timestamp::from_second(1_800_000_000).unwrap();
        let mut said_false = false;
        let mut ending = None;
        for (step, e) in events {
            at += SignedDuration::from_secs(step);
            said_false |= ending.is_none()
                && matches!(e, Event::Verdict { status: Status::False, .. });
            if ending.is_none() && matches!(e, Event::Deleted { .. } | Event::Settled) {
                ending = Some(e.clone());
            }
            s.record(at, e);
        }
        prop_assert_eq!(s.ended(), ending.is_some());
        prop_assert!(s.spells.len() <= outcome::SPELLS_KEPT);
        let Some(o) = s.outcome(at + SignedDuration::from_secs(3600)) else {
            return Ok(());
        };
        // (prop_assert! takes its condition's text as a format string: no braces in it.)
        let deleted = matches!(ending, Some(Event::Deleted { .. }));
        match o.kind {
            OutcomeKind::Missed { .. } => {
                prop_assert!(deleted);
            }
            OutcomeKind::RecycledOnSignal { false_to_delete_secs: secs } => {
                prop_assert!(said_false && secs >= 0);
                let by_owner = Some(Event::Deleted { by: Deleter::Owner });
                prop_assert_eq!(ending, by_owner);
            }
            OutcomeKind::WouldHaveSaved { saved_secs, .. } => {
                prop_assert!(said_false && saved_secs >= 0);
                prop_assert!(deleted);
            }
            OutcomeKind::FalseAlarm { false_to_node_secs: secs } => {
                prop_assert!(said_false && secs >= 0 && s.node_at.is_some());
                prop_assert_eq!(ending, Some(Event::Settled));
            }
            OutcomeKind::Recovered { false_for_secs } => {
                prop_assert!(said_false && false_for_secs >= 0);
                prop_assert_eq!(ending, Some(Event::Settled));
            }
            OutcomeKind::StillStuck { false_for_secs } => {
                prop_assert!(said_false && ending.is_none() && false_for_secs > 600);
            }
        }
    }
}
