//! Measurements for the controller's closing note, not pass/fail speed tests (they assert
//! only that each fault is caught and escalated): time from fault injection to `False` and to
//! the remediate annotation per fault kind, at the default graces and at the scaled graces
//! the other tests use, and CloudStack calls per poll cycle for 1, 100 and 1 000 Machines in
//! one scope. Simulated time: the simulator's clock is frozen and moved in lockstep with the
//! `now` given to each cycle, so the default 30 s interval costs no wall time; writes go to
//! the real API server. Run with `make timings` (ignored in `make test`: the 1 000-Machine
//! set-up takes minutes on two cores).

mod kube_support;

use std::collections::BTreeMap;
use std::time::Duration;

use capi_model::apis::Mode;
use cloudstack_sim::Fault;
use jiff::{SignedDuration, Timestamp};
use kube_support::{kube_client, simulator_with, Fixture};
use serde_json::json;

const FAULTS: [(&str, Fault, &str); 4] = [
    ("m-nicdown", Fault::NicDown, "GuestNetworkSilent"),
    ("m-error", Fault::Error, "VMError"),
    ("m-stop", Fault::Stop, "VMStopped"),
    ("m-vanish", Fault::Vanish, "VMNotFound"),
];

/// Cycles every `step` of simulated time after injecting all four faults at once, and
/// returns per Machine (seconds to False, seconds to annotation).
async fn measure(
    settings: serde_json::Value,
    step_secs: i64,
    boot_secs: f64,
    extra: &[&str],
) -> BTreeMap<String, (Option<i64>, Option<i64>)> {
    let client = kube_client().await;
    // Six healthy bystanders keep the four simultaneous faults (40 %) under the default
    // mass-failure guard (≥ 5 or ≥ 50 %).
    let mut vms: Vec<(String, &str, &str)> = FAULTS
        .iter()
        .map(|(m, _, _)| (format!("vm-{m}"), "healthy", "Starting"))
        .collect();
    vms.extend((0..6).map(|i| (format!("vm-ok-{i}"), "healthy", "Starting")));
    let vm_refs: Vec<(&str, &str, &str)> =
        vms.iter().map(|(n, g, s)| (n.as_str(), *g, *s)).collect();
    let f = Fixture::with_simulator(client, simulator_with(settings, &vm_refs, 0.0).await).await;
    for (m, _, _) in FAULTS {
        f.machine(m, Some(&format!("vm-{m}")), false, "fd1").await;
    }
    for i in 0..6 {
        f.machine(
            &format!("m-ok-{i}"),
            Some(&format!("vm-ok-{i}")),
            false,
            "fd1",
        )
        .await;
    }
    let (mut c, c_report) = if extra.is_empty() {
        f.controller_with_defaults(&[]).await
    } else {
        f.controller(extra).await
    };
    let step = SignedDuration::from_secs(step_secs);
    let mut now = Timestamp::now();
    // Boot and settle healthy first (ten cycles past boot).
    let warmup = ((boot_secs as i64) / step_secs + 10).max(12);
    for _ in 0..warmup {
        f.sim.advance(step_secs as f64);
        now += step;
        c.cycle(now).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for (m, _, _) in FAULTS {
        assert!(
            kube_support::is(&f.verdict(m).await, "True", "VMHealthy"),
            "{m} healthy before the fault"
        );
    }
    for (m, fault, _) in FAULTS {
        f.sim
            .inject_fault(&format!("vm-{m}"), fault)
            .expect("fault");
    }
    let injected = now;
    let annotate = f.choice.mode == Mode::Annotate;
    let mut out: BTreeMap<String, (Option<i64>, Option<i64>)> = BTreeMap::new();
    for _ in 0..200 {
        f.sim.advance(step_secs as f64);
        now += step;
        c.cycle(now).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
        for (m, _, reason) in FAULTS {
            let (cond, annotated) = f.verdict(m).await;
            let e = out.entry(m.to_string()).or_default();
            if e.0.is_none()
                && cond
                    .as_ref()
                    .is_some_and(|(s, r)| s == "False" && r == reason)
            {
                e.0 = Some(now.duration_since(injected).as_secs());
            }
            if e.1.is_none() && annotated {
                e.1 = Some(now.duration_since(injected).as_secs());
            }
        }
        if out
            .values()
            .all(|(f, a)| f.is_some() && (a.is_some() || !annotate))
            && out.len() == FAULTS.len()
        {
            break;
        }
    }
    let mut last = BTreeMap::new();
    for (m, _, _) in FAULTS {
        last.insert(m, f.verdict(m).await);
    }
    for (m, (fals, ann)) in &out {
        assert!(
            fals.is_some(),
            "{m} never turned False: {out:?}; last verdicts {last:?}; /status {:?}",
            c_report.read().await.clone()
        );
        assert!(!annotate || ann.is_some(), "{m} never escalated: {out:?}");
    }
    f.cleanup().await;
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement; run with `make timings`"]
async fn measure_time_to_false_and_to_annotation() {
    let defaults = measure(
        json!({"stats_interval_seconds": 60, "boot_seconds": 30}),
        30,
        30.0,
        &[],
    )
    .await;
    let scaled = measure(
        json!({"stats_interval_seconds": 1, "boot_seconds": 1, "guest_speedup": 60, "guest_boot_seconds": 1.5, "guest_join_seconds": 3}),
        1,
        1.0,
        &["--stopped-grace", "5s"],
    )
    .await;
    println!(
        "\nfault → False / → annotation, simulated seconds (profile {})",
        kube_support::profile()
    );
    println!(
        "{:<12} {:>22} {:>22}",
        "machine", "default graces", "scaled graces"
    );
    for (m, _, _) in FAULTS {
        let d = defaults[m];
        let s = scaled[m];
        let show = |p: (Option<i64>, Option<i64>)| {
            format!(
                "{}s / {}",
                p.0.unwrap(),
                p.1.map(|a| format!("{a}s")).unwrap_or("-".into())
            )
        };
        println!("{m:<12} {:>22} {:>22}", show(d), show(s));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "measurement; run with `make timings`"]
async fn measure_cloudstack_calls_per_cycle_by_fleet_size() {
    let client = kube_client().await;
    println!("\nCloudStack calls per poll cycle, one scope");
    for n in [1usize, 100, 1000] {
        let names: Vec<String> = (0..n).map(|i| format!("vm-{i}")).collect();
        let vms: Vec<(&str, &str, &str)> = names
            .iter()
            .map(|v| (v.as_str(), "healthy", "Running"))
            .collect();
        let f = Fixture::with_simulator(
            client.clone(),
            simulator_with(json!({"stats_interval_seconds": 60}), &vms, 0.0).await,
        )
        .await;
        for i in 0..n {
            f.machine(&format!("m-{i}"), Some(&format!("vm-{i}")), false, "fd1")
                .await;
        }
        let (mut c, _) = f.controller_with_defaults(&[]).await;
        let mut now = Timestamp::now();
        // Warm-up: a few stats intervals so every VM's counters have been seen rising.
        for _ in 0..6 {
            f.sim.advance(30.0);
            now += SignedDuration::from_secs(30);
            c.cycle(now).await;
        }
        let before = f.sim.calls()["total"].as_u64().unwrap();
        let cycles = 5u64;
        for _ in 0..cycles {
            f.sim.advance(30.0);
            now += SignedDuration::from_secs(30);
            let summary = c.cycle(now).await;
            assert_eq!(summary.machines, n);
        }
        let after = f.sim.calls();
        let per_cycle = (after["total"].as_u64().unwrap() - before) as f64 / cycles as f64;
        println!(
            "{n:>5} Machines: {per_cycle:.1} calls per cycle ({})",
            after["by_command"]
        );
        assert!(per_cycle >= 1.0);
        f.cleanup().await;
    }
}
