//! The CloudStack side end to end: our client and verdict engine (the `check` machinery)
//! against `cloudstack-sim` loaded with the seed scenario. Time is driven in lockstep: the
//! simulator's clock is frozen and advanced one second per poll, and the checker is given
//! the matching `now`, so nothing sleeps and every run is the same.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use capc_health_shim::check::{Checker, UsageHistoryMode, VmReport};
use capc_health_shim::cloudstack::client::{
    ClientConfig, CloudStackClient, Credentials, VmListQuery,
};
use capc_health_shim::verdict::{reason, Graces, MassFailureGuard, Status};
use cloudstack_sim::{self as sim, ApiFaults, SimServer, Simulator};
use jiff::{SignedDuration, Timestamp};

// The seed scenario's root admin.
const KEY: &str = "sim-api-key";
const SECRET: &str = "sim-secret-key";

async fn seed_sim() -> (Simulator, SimServer) {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("cloudstack-fixtures/scenarios/seed.json");
    let world = sim::load_scenario_file(&path, sim::real_now_ms(), (KEY, SECRET))
        .expect("seed scenario loads");
    serve_frozen(world).await
}

/// Serves `world` on loopback with its clock frozen (tests move it).
async fn serve_frozen(world: sim::World) -> (Simulator, SimServer) {
    sim::serve_loopback(world, 0.0).await.expect("serve")
}

fn checker(server: &SimServer, key: &str, secret: &str, usage: UsageHistoryMode) -> Checker {
    let mut cfg =
        ClientConfig::new(&server.api_url(), Credentials::new(key, secret).unwrap()).unwrap();
    cfg.rate_limit = None;
    cfg.request_timeout = Duration::from_secs(2);
    cfg.retry.max_attempts = 1;
    let client = CloudStackClient::new(cfg).expect("client");
    // The seed scenario samples stats every 2 s; poll every simulated second.
    let graces = Graces {
        poll_interval: SignedDuration::from_secs(1),
        stats_interval: SignedDuration::from_secs(2),
        stopped: SignedDuration::from_secs(5),
        nic_detached: SignedDuration::from_secs(5),
        nic_no_address: SignedDuration::from_secs(10),
        ..Graces::default()
    };
    Checker::new(
        client,
        VmListQuery::default(),
        &[],
        graces,
        MassFailureGuard::default(),
        usage,
    )
}

struct Run {
    sim: Simulator,
    checker: Checker,
    now: Timestamp,
    /// Every verdict each VM (by name) had during the run.
    seen: BTreeMap<String, Vec<(Status, String)>>,
}

impl Run {
    fn new(sim: Simulator, checker: Checker) -> Self {
        Self {
            sim,
            checker,
            now: Timestamp::now(),
            seen: BTreeMap::new(),
        }
    }

    async fn step(&mut self) -> Vec<VmReport> {
        self.sim.advance(1.0);
        self.now += SignedDuration::from_secs(1);
        self.checker.poll(self.now).await;
        let reports = self.checker.verdicts(self.now);
        for r in &reports {
            self.seen
                .entry(r.name.clone())
                .or_default()
                .push((r.verdict, r.reason.clone()));
        }
        reports
    }

    /// Polls until settled; panics after `max` polls (a deadline, not a sleep).
    async fn until_settled(&mut self, max: usize) -> BTreeMap<String, VmReport> {
        for _ in 0..max {
            let reports = self.step().await;
            if self.checker.settled(&reports, self.now) {
                return reports.into_iter().map(|r| (r.name.clone(), r)).collect();
            }
        }
        panic!(
            "verdicts did not settle within {max} polls: {:#?}",
            self.seen
        );
    }

    fn never_false(&self, name: &str) {
        let history = &self.seen[name];
        assert!(
            history.iter().all(|(s, _)| *s != Status::False),
            "{name} was False at some point: {history:?}"
        );
    }
}

fn verdict_of(reports: &BTreeMap<String, VmReport>, name: &str) -> (Status, String) {
    let r = &reports[name];
    (r.verdict, r.reason.clone())
}

async fn run_seed_as(
    key: &str,
    secret: &str,
    usage: UsageHistoryMode,
) -> (Run, BTreeMap<String, VmReport>, SimServer) {
    let (sim, server) = seed_sim().await;
    let checker = checker(&server, key, secret, usage);
    let mut run = Run::new(sim, checker);
    let reports = run.until_settled(120).await;
    (run, reports, server)
}

async fn run_seed(usage: UsageHistoryMode) -> (Run, BTreeMap<String, VmReport>, SimServer) {
    run_seed_as(KEY, SECRET, usage).await
}

fn assert_seed_verdicts(run: &Run, reports: &BTreeMap<String, VmReport>) {
    assert_eq!(reports.len(), 5, "{reports:#?}");
    assert_eq!(
        verdict_of(reports, "demo-md-0-b"),
        (Status::False, reason::GUEST_NETWORK_SILENT.into())
    );
    assert_eq!(
        verdict_of(reports, "demo-md-0-c"),
        (Status::False, reason::VM_ERROR.into())
    );
    for healthy in ["demo-cp-1", "demo-md-0-a", "demo-md-0-d"] {
        assert_eq!(
            verdict_of(reports, healthy),
            (Status::True, reason::VM_HEALTHY.into()),
            "{healthy}"
        );
        run.never_false(healthy);
    }
    assert!(
        reports["demo-md-0-b"].message.contains("flat"),
        "{}",
        reports["demo-md-0-b"].message
    );
}

#[tokio::test]
async fn seed_scenario_settles_with_the_silent_worker_and_the_error_vm_false() {
    let (run, reports, server) = run_seed(UsageHistoryMode::Auto).await;
    assert_seed_verdicts(&run, &reports);
    // The usage history was actually used, and one listing per poll was made.
    let calls = run.sim.calls();
    let total = |cmd: &str| -> u64 {
        calls["by_command"][cmd]
            .as_object()
            .map(|m| m.values().filter_map(|v| v.as_u64()).sum())
            .unwrap_or(0)
    };
    let lists = total("listVirtualMachines");
    let history = total("listVirtualMachinesUsageHistory");
    let polls = run.seen["demo-cp-1"].len() as u64;
    assert_eq!(lists, polls, "one listing per poll for the whole scope");
    assert!(history > 0);
    server.shutdown().await;
}

#[tokio::test]
async fn without_usage_history_the_listing_counters_reach_the_same_verdicts() {
    let (run, reports, server) = run_seed(UsageHistoryMode::Off).await;
    assert_seed_verdicts(&run, &reports);
    assert!(run.sim.calls()["by_command"]
        .get("listVirtualMachinesUsageHistory")
        .is_none());
    server.shutdown().await;
}

#[tokio::test]
async fn the_least_privilege_account_of_the_scenario_reaches_the_same_verdicts() {
    let (run, reports, server) =
        run_seed_as("capi-api-key", "capi-secret-key", UsageHistoryMode::Auto).await;
    assert_seed_verdicts(&run, &reports);
    server.shutdown().await;
}

#[tokio::test]
async fn an_api_outage_turns_everything_unknown_and_recycles_nothing() {
    let (run_before, before, server) = run_seed(UsageHistoryMode::Auto).await;
    let mut run = run_before;
    run.sim.set_api_faults(ApiFaults {
        outage: true,
        ..ApiFaults::default()
    });
    // One poll a second; the API-trouble grace is --stale-poll-intervals (3) intervals after
    // the first failed poll: until it has passed each verdict stands as it was (a brief outage
    // is not news, nothing new turns False), then everything is Unknown.
    for step in 1..=20 {
        let reports = run.step().await;
        for r in &reports {
            let was = verdict_of(&before, &r.name);
            if step <= 4 {
                assert_eq!((r.verdict, r.reason.clone()), was, "step {step}: {r:?}");
                continue;
            }
            assert_eq!(
                (r.verdict, r.reason.as_str()),
                (Status::Unknown, reason::CLOUDSTACK_API_UNAVAILABLE),
                "step {step}: {r:?}"
            );
            assert!(
                r.message.contains("503") || r.message.to_lowercase().contains("proxy"),
                "{}",
                r.message
            );
        }
    }
    run.sim.set_api_faults(ApiFaults::default());
    let reports = run.until_settled(120).await;
    assert_seed_verdicts(&run, &reports);
    server.shutdown().await;
}

#[tokio::test]
async fn a_wrong_secret_is_unknown_with_an_actionable_message() {
    let (sim, server) = seed_sim().await;
    let checker = checker(&server, KEY, "not-the-secret", UsageHistoryMode::Auto);
    let mut run = Run::new(sim, checker);
    let poll = run.checker.poll(run.now).await;
    let err = poll.listing_error.expect("401");
    assert_eq!(err.kind(), "unauthorized");
    assert!(!err.to_string().contains("not-the-secret"));
    server.shutdown().await;
}

/// The reported case (issue 14): a cloud at `vm.stats.increment.metrics=false` with three
/// management servers, per-interval usage-history rows, one guest sending its steady trickle
/// (kubeadm retrying an endpoint that is not up: ~2.7 KiB a minute, under 1 KiB in each
/// server's row) next to healthy guests and one whose NIC went down. The trickling guest is
/// never judged silent, so no mass-failure hold swallows the one that really is.
async fn reported_case(in_project: bool) {
    let mut world = sim::World::default_world(KEY, SECRET, sim::real_now_ms());
    world.settings.stats_increment_metrics = false;
    world.settings.management_servers = 3;
    let project = in_project.then(|| {
        world
            .add_project("capi", None, &["admin".to_string()])
            .expect("project");
        "capi".to_string()
    });
    let spec = |name: &str, guest: sim::GuestKind| {
        let mut s = sim::VmSpec::new(name);
        s.guest = guest;
        s.project = project.clone();
        s
    };
    world
        .add_vm(&spec("waiting", sim::GuestKind::Waiting))
        .expect("vm");
    for i in 0..3 {
        world
            .add_vm(&spec(&format!("healthy-{i}"), sim::GuestKind::Healthy))
            .expect("vm");
    }
    world
        .add_vm(&spec("nic-down", sim::GuestKind::NicDown))
        .expect("vm");
    let (simulator, server) = serve_frozen(world).await;
    let mut cfg =
        ClientConfig::new(&server.api_url(), Credentials::new(KEY, SECRET).unwrap()).unwrap();
    cfg.rate_limit = None;
    cfg.retry.max_attempts = 1;
    let query = VmListQuery {
        project_id: in_project.then(|| "-1".to_string()),
        ..VmListQuery::default()
    };
    let checker = Checker::new(
        CloudStackClient::new(cfg).expect("client"),
        query,
        &[],
        Graces::default(),
        MassFailureGuard::default(),
        UsageHistoryMode::Auto,
    );
    let mut run = Run::new(simulator, checker);
    // 30 simulated minutes at the shim's default 30 s poll interval.
    let mut last = Vec::new();
    for _ in 0..60 {
        run.sim.advance(29.0);
        run.now += SignedDuration::from_secs(29);
        last = run.step().await;
    }
    let last: BTreeMap<String, VmReport> = last.into_iter().map(|r| (r.name.clone(), r)).collect();
    run.never_false("waiting");
    for i in 0..3 {
        run.never_false(&format!("healthy-{i}"));
    }
    assert_eq!(
        verdict_of(&last, "nic-down"),
        (Status::False, reason::GUEST_NETWORK_SILENT.into()),
        "{:#?}",
        last["nic-down"]
    );
    let summary = run.checker.stats_summary();
    assert_eq!(summary.sums_rows, Some(true));
    if !in_project {
        // Three servers' rows at arbitrary phases still show the 60 s interval.
        assert_eq!(summary.inferred_interval_seconds, Some(60), "{summary:?}");
    }
    server.shutdown().await;
}

#[tokio::test]
async fn a_trickling_guest_at_increment_off_with_three_servers_is_never_silent() {
    reported_case(false).await;
}

#[tokio::test]
async fn the_same_in_a_project_judged_from_the_accumulated_counter_alone() {
    reported_case(true).await;
}

/// A poll that runs out of time for the usage history (at 10 000 new VMs, ten per request
/// behind the rate limit, it once took minutes) keeps its listing as evidence and says what
/// it left; the next poll with time asks them all.
#[tokio::test]
async fn a_poll_out_of_time_for_usage_history_keeps_its_listing() {
    use capc_health_shim::scope::{Scope, ScopeObserver};
    let (sim, server) = seed_sim().await;
    let mut cfg =
        ClientConfig::new(&server.api_url(), Credentials::new(KEY, SECRET).unwrap()).unwrap();
    cfg.rate_limit = None;
    cfg.retry.max_attempts = 1;
    let mut scope = Scope::new(
        CloudStackClient::new(cfg).expect("client"),
        VmListQuery::default(),
        ScopeObserver::tracking_all(),
        true,
    );
    let graces = Graces::default();
    // Past the seed's boot: its VMs Running, the usage history's candidates.
    sim.advance(120.0);
    let now = Timestamp::now();
    let history_calls = |sim: &Simulator| {
        sim.calls()["by_command"]["listVirtualMachinesUsageHistory"]
            .as_object()
            .map(|m| m.values().filter_map(|v| v.as_u64()).sum::<u64>())
            .unwrap_or(0)
    };

    let out_of_time = scope
        .poll_until(&graces, now, Some(tokio::time::Instant::now()))
        .await;
    assert!(out_of_time.listing_error.is_none() && out_of_time.complete);
    assert!(out_of_time.vms_listed > 0);
    let note = out_of_time
        .usage_history_note
        .expect("a note on what was left");
    assert!(note.contains("left for the next poll"), "{note}");
    assert!(
        scope
            .observer
            .histories
            .values()
            .all(|h| h.sighting.is_some() && h.last_error.is_none() && h.failing_since.is_none()),
        "the listing counts: every VM seen, none failing"
    );
    assert_eq!(history_calls(&sim), 0, "nothing answered in no time");

    sim.advance(1.0);
    let with_time = scope
        .poll_until(
            &graces,
            now + SignedDuration::from_secs(1),
            Some(tokio::time::Instant::now() + Duration::from_secs(30)),
        )
        .await;
    assert_eq!(with_time.usage_history_note, None);
    assert!(history_calls(&sim) > 0);
    assert_eq!(
        scope.observer.usage_cursor, None,
        "a whole round: start over"
    );
    server.shutdown().await;
}
