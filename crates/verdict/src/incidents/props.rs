//! What must hold for any scope: the numbers of every listed candidate are its true counts,
//! candidates come best first, and a named cause obeys the rule.

use proptest::prelude::*;

use super::*;

/// Small value sets so that VMs share values often.
fn facts() -> impl Strategy<Value = VmFacts> {
    let thing = |prefix: &'static str, n: u8| {
        prop::option::weighted(
            0.9,
            (0..n).prop_map(move |i| Thing::new(format!("{prefix}{i}"))),
        )
    };
    (
        any::<bool>(),
        thing("h", 6),
        prop::option::of(prop_oneof![
            Just(HostControlState::Enabled),
            Just(HostControlState::Offline),
        ]),
        (thing("c", 3), thing("p", 2), thing("n", 4)),
        prop::option::of(prop_oneof![Just("Running"), Just("Stopped")]),
        (thing("t", 3), thing("o", 2), thing("z", 2)),
    )
        .prop_map(
            |(failing, host, host_state, (cluster, pod, network), rstate, (t, o, z))| {
                let router = network.as_ref().map(|n| RouterFacts {
                    router: Thing::new(format!("r-{}", n.id)),
                    state: rstate.map(str::to_string),
                    host: None,
                });
                VmFacts {
                    failing,
                    host,
                    host_state,
                    cluster,
                    pod,
                    network,
                    router,
                    template: t,
                    offering: o,
                    zone: z,
                }
            },
        )
}

fn id_of(vm: &VmFacts, kind: CauseKind) -> Option<&str> {
    vm.attributes()
        .find(|(k, _)| *k == kind)
        .map(|(_, t)| t.id.as_str())
}

proptest! {
    #[test]
    fn coverage_numbers_are_the_true_counts(
        vms in prop::collection::vec(facts(), 0..80),
        held in any::<bool>(),
    ) {
        let p = Policy::default();
        let f_total = vms.iter().filter(|v| v.failing).count();
        let h_total = vms.len() - f_total;
        let Some(inc) = find(&vms, &p, held) else {
            prop_assert!(f_total == 0 || (!held && f_total < p.min_failing));
            return Ok(());
        };
        prop_assert!(f_total > 0 && (held || f_total >= p.min_failing));
        prop_assert_eq!((inc.failing, inc.healthy), (f_total, h_total));
        prop_assert!(!inc.candidates.is_empty() || vms.iter().all(|v| !v.failing || v.attributes().next().is_none()));
        for c in &inc.candidates {
            let sharing = |failing: bool| vms
                .iter()
                .filter(|v| v.failing == failing && id_of(v, c.kind) == Some(c.id.as_str()))
                .count();
            prop_assert_eq!(c.failing, sharing(true), "{:?}", c);
            prop_assert_eq!(c.healthy, sharing(false), "{:?}", c);
            prop_assert!(c.failing >= 1);
            prop_assert!((c.failing_coverage - c.failing as f64 / f_total as f64).abs() < 1e-12);
            let hc = if h_total == 0 { 0.0 } else { c.healthy as f64 / h_total as f64 };
            prop_assert!((c.healthy_coverage - hc).abs() < 1e-12);
            prop_assert!((c.score - c.failing as f64 / (f_total + c.healthy) as f64).abs() < 1e-12);
        }
        for w in inc.candidates.windows(2) {
            prop_assert!(w[0].score >= w[1].score, "{:?}", inc.candidates);
        }
        // No value outside the list scores higher than the last listed one.
        if inc.candidates.len() == TOP {
            let last = inc.candidates[TOP - 1].score;
            for v in vms.iter().filter(|v| v.failing) {
                for (kind, t) in v.attributes() {
                    if inc.candidates.iter().any(|c| c.kind == kind && c.id == t.id) {
                        continue;
                    }
                    let f = vms.iter().filter(|w| w.failing && id_of(w, kind) == Some(t.id.as_str())).count();
                    let h = vms.iter().filter(|w| !w.failing && id_of(w, kind) == Some(t.id.as_str())).count();
                    prop_assert!(f as f64 / (f_total + h) as f64 <= last + 1e-12);
                }
            }
        }
        match &inc.cause {
            Some(c) => {
                prop_assert_eq!(c, &inc.candidates[0]);
                prop_assert!(names(c, &p));
            }
            None => prop_assert!(inc.candidates.first().is_none_or(|c| !names(c, &p))),
        }
    }
}
