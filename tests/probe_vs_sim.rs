//! The guest probe end to end on the CloudStack side: our client, `Prober` and verdict engine
//! (the `check` machinery) against `cloudstack-sim`'s `listRouters` / `runDiagnostics`, in
//! simulated time (the simulator's clock frozen and moved in lockstep, as the benches do), with
//! the controller's pacing: a probe step every `probe_tick` between 30 s polls.

use std::time::Duration;

use capc_health_shim::check::{Checker, UsageHistoryMode, VmReport};
use capc_health_shim::cloudstack::client::{
    ClientConfig, CloudStackClient, Credentials, VmListQuery,
};
use capc_health_shim::probe::probe_tick;
use capc_health_shim::probe::{ProbeLimits, Prober};
use capc_health_shim::verdict::probe::ProbeGraces;
use capc_health_shim::verdict::{reason, Graces, MassFailureGuard, Status};
use cloudstack_sim::{
    self as sim, AccountType, Fault, NetworkSpec, NetworkType, RouterState, Settings, SimServer,
    Simulator, VmSpec, VmState, World,
};
use jiff::Timestamp;

const ROOT_KEY: &str = "probe-root-key";
const ROOT_SECRET: &str = "probe-root-secret";
const USER_KEY: &str = "tenant-key";
const USER_SECRET: &str = "tenant-secret";
const POLL_SECS: i64 = 30;

struct Sim {
    sim: Simulator,
    server: SimServer,
    /// Names of the VMs in creation order.
    vms: Vec<String>,
}

/// The default world (a Shared network with its virtual router, KVM), a tenant account, a
/// network without a router, and `vms` Running healthy guests (`on_routerless`: on that one).
async fn start(vms: &[(&str, bool)]) -> Sim {
    let mut w = World::empty(Settings::default(), sim::real_now_ms());
    w.populate_default(ROOT_KEY, ROOT_SECRET);
    w.add_account(
        "tenant",
        None,
        AccountType::User,
        USER_KEY,
        USER_SECRET,
        None,
        None,
    )
    .expect("tenant account");
    let mut bare = NetworkSpec::new("no-router", "10.7.0.0/24", NetworkType::Shared);
    bare.virtual_router = Some(false);
    w.add_network_spec(&bare).expect("router-less network");
    let mut names = Vec::new();
    for (name, routerless) in vms {
        let mut spec = VmSpec::new(*name);
        spec.state = VmState::Running;
        spec.boot_seconds = Some(0.0);
        if *routerless {
            spec.network = Some("no-router".into());
        }
        w.add_vm(&spec).expect("vm");
        names.push(name.to_string());
    }
    let (simulator, server) = sim::serve_loopback(w, 0.0).await.expect("serve");
    Sim {
        sim: simulator,
        server,
        vms: names,
    }
}

fn client(server: &SimServer, key: &str, secret: &str) -> CloudStackClient {
    let mut cfg =
        ClientConfig::new(&server.api_url(), Credentials::new(key, secret).unwrap()).unwrap();
    cfg.rate_limit = None;
    cfg.request_timeout = Duration::from_secs(5);
    CloudStackClient::new(cfg).expect("client")
}

/// A checker of every VM at default graces (60 s stats, 30 s polls), with a probe when given
/// its key.
fn checker(s: &Sim, probe: Option<(&str, &str, ProbeLimits)>) -> Checker {
    let graces = Graces::default();
    let pacing = ProbeGraces::from_stats_interval(graces.stats_interval);
    let c = Checker::new(
        client(&s.server, ROOT_KEY, ROOT_SECRET),
        VmListQuery::default(),
        &[],
        graces,
        MassFailureGuard::default(),
        UsageHistoryMode::Auto,
    );
    match probe {
        Some((key, secret, limits)) => {
            c.with_prober(Prober::new(client(&s.server, key, secret), limits), pacing)
        }
        None => c,
    }
}

fn now(s: &Sim) -> Timestamp {
    Timestamp::from_millisecond(s.sim.now_ms()).unwrap()
}

/// One poll interval of the controller: probe steps every tick, then a poll and the verdicts
/// of every checker. Returns the verdicts of the last checker polled, per checker.
async fn interval(s: &Sim, checkers: &mut [Checker]) -> Vec<Vec<VmReport>> {
    let tick =
        probe_tick(ProbeGraces::from_stats_interval(Graces::default().stats_interval).spacing);
    let mut waited = Duration::ZERO;
    while waited + tick <= Duration::from_secs(POLL_SECS as u64) {
        s.sim.advance(tick.as_secs_f64());
        waited += tick;
        for c in checkers.iter_mut() {
            c.probe_step(now(s)).await;
        }
    }
    s.sim
        .advance((Duration::from_secs(POLL_SECS as u64) - waited).as_secs_f64());
    let mut out = Vec::new();
    for c in checkers.iter_mut() {
        c.poll(now(s)).await;
        out.push(c.verdicts(now(s)));
    }
    out
}

fn verdict_of<'r>(reports: &'r [VmReport], name: &str) -> &'r VmReport {
    reports
        .iter()
        .find(|r| r.name == name)
        .unwrap_or_else(|| panic!("no verdict for {name}: {reports:?}"))
}

fn calls(s: &Sim, command: &str) -> u64 {
    let c = s.sim.calls();
    c["by_command"][command]
        .as_object()
        .map(|r| r.values().filter_map(|v| v.as_u64()).sum())
        .unwrap_or(0)
}

#[tokio::test]
async fn a_nic_down_guest_is_false_sooner_with_the_probe_and_a_healthy_one_never() {
    let s = start(&[("healthy", false), ("victim", false)]).await;
    let mut checkers = vec![
        checker(&s, None),
        checker(&s, Some((ROOT_KEY, ROOT_SECRET, ProbeLimits::default()))),
    ];
    // Ten minutes of healthy traffic first: the counters have risen, the guests answer.
    for _ in 0..20 {
        for reports in interval(&s, &mut checkers).await {
            assert_ne!(verdict_of(&reports, "healthy").verdict, Status::False);
            assert_ne!(verdict_of(&reports, "victim").verdict, Status::False);
        }
    }
    let report = checkers[1].probe_report().expect("probe on");
    assert!(report.counts.replies > 0, "{report:?}");
    assert_eq!(report.counts.no_replies, 0, "{report:?}");
    assert!(report.refused.is_none());

    let injected = s.sim.now_ms();
    s.sim.inject_fault("victim", Fault::NicDown).unwrap();
    let mut false_at: [Option<i64>; 2] = [None, None];
    let mut messages = [String::new(), String::new()];
    for _ in 0..30 {
        let all = interval(&s, &mut checkers).await;
        for (i, reports) in all.iter().enumerate() {
            let healthy = verdict_of(reports, "healthy");
            assert_ne!(healthy.verdict, Status::False, "{healthy:?}");
            let v = verdict_of(reports, "victim");
            if v.verdict == Status::False && false_at[i].is_none() {
                assert_eq!(v.reason, reason::GUEST_NETWORK_SILENT, "{v:?}");
                false_at[i] = Some((s.sim.now_ms() - injected) / 1000);
                messages[i] = v.message.clone();
            }
        }
        if false_at.iter().all(Option::is_some) {
            break;
        }
    }
    let (Some(counters), Some(probed)) = (false_at[0], false_at[1]) else {
        panic!("not both False: {false_at:?}");
    };
    eprintln!("NIC down → False: with the probe {probed}s, counters alone {counters}s");
    assert!(
        probed < counters,
        "with the probe {probed}s, counters alone {counters}s"
    );
    assert!(
        messages[1].contains("no ARP reply for 10.0.")
            && messages[1].contains("from its virtual router r-"),
        "{}",
        messages[1]
    );
    assert!(!messages[0].contains("ARP"), "{}", messages[0]);
    let report = checkers[1].probe_report().unwrap();
    assert!(report.counts.no_replies >= 3, "{report:?}");
    assert_eq!(
        calls(&s, "runDiagnostics"),
        report.counts.jobs_started,
        "every job the probe counted reached CloudStack once"
    );
    s.server.shutdown().await;
}

#[tokio::test]
async fn no_router_or_a_stopped_router_is_no_evidence_never_false() {
    let s = start(&[("routerless", true), ("behind-stopped", false)]).await;
    let router = s
        .sim
        .routers_of("DefaultSharedNetwork")
        .unwrap()
        .pop()
        .expect("the shared network has a router");
    let mut checkers = vec![
        checker(&s, None),
        checker(&s, Some((ROOT_KEY, ROOT_SECRET, ProbeLimits::default()))),
    ];
    for _ in 0..10 {
        interval(&s, &mut checkers).await;
    }
    s.sim
        .set_router_state(&router, RouterState::Stopped)
        .unwrap();
    for name in &s.vms {
        s.sim.inject_fault(name, Fault::NicDown).unwrap();
    }
    // Both checkers must say the same at every poll: the probe adds nothing here.
    for _ in 0..16 {
        let all = interval(&s, &mut checkers).await;
        for name in &s.vms {
            let (a, b) = (verdict_of(&all[0], name), verdict_of(&all[1], name));
            assert_eq!(
                (a.verdict, &a.reason, &a.message),
                (b.verdict, &b.reason, &b.message),
                "{name}"
            );
        }
    }
    let report = checkers[1].probe_report().unwrap();
    eprintln!(
        "{report:?}; last verdicts: {:?}",
        checkers[1].verdicts(now(&s))
    );
    assert!(report.counts.no_evidence >= 2, "{report:?}");
    assert_eq!(report.counts.no_replies, 0, "{report:?}");
    s.server.shutdown().await;
}

#[tokio::test]
async fn a_refused_key_is_reported_once_and_not_retried() {
    let s = start(&[("a", false), ("b", false)]).await;
    let mut checkers = vec![checker(
        &s,
        Some((USER_KEY, USER_SECRET, ProbeLimits::default())),
    )];
    for _ in 0..10 {
        interval(&s, &mut checkers).await;
    }
    let report = checkers[0].probe_report().unwrap();
    let refused = report.refused.expect("refused");
    assert!(
        refused.contains("not available") || refused.contains("denied"),
        "{refused}"
    );
    assert!(!refused.contains(USER_SECRET) && !refused.contains(USER_KEY));
    let tried = calls(&s, "listRouters") + calls(&s, "runDiagnostics");
    assert_eq!(tried, 1, "one refused call, then none");
    s.server.shutdown().await;
}

#[tokio::test]
async fn the_budget_caps_jobs_per_scope_per_minute() {
    let names: Vec<String> = (0..6).map(|i| format!("vm-{i}")).collect();
    let spec: Vec<(&str, bool)> = names.iter().map(|n| (n.as_str(), false)).collect();
    let s = start(&spec).await;
    let limits = ProbeLimits {
        per_scope_per_minute: 2,
        ..ProbeLimits::default()
    };
    let mut checkers = vec![checker(&s, Some((ROOT_KEY, ROOT_SECRET, limits)))];
    let minutes = 10;
    for _ in 0..minutes * 2 {
        interval(&s, &mut checkers).await;
    }
    let report = checkers[0].probe_report().unwrap();
    let jobs = calls(&s, "runDiagnostics");
    eprintln!("{jobs} jobs; {report:?}");
    assert!(
        jobs > 0 && jobs <= 2 * minutes + 2,
        "{jobs} jobs in {minutes} min"
    );
    assert!(report.counts.skipped_for_budget > 0, "{report:?}");
    s.server.shutdown().await;
}
