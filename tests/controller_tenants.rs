//! Many tenants on one zone, as CAPC users run them: each workload cluster in its own namespace
//! with its own `acsEndpoint` Secret, all on the same API URL and zone. Against a real
//! kube-apiserver (CAPI/CAPC CRDs) and one `cloudstack-sim`:
//!
//! - the same key in two Secrets: one scope, one listing, both tenants' Machines judged — also
//!   when one of them says `verify-ssl: "false"` (a setting, not another caller);
//! - different keys that see different VMs: a scope each, both judged; one tenant's broken key
//!   turns only its own Machines `Unknown` (after the API-trouble grace) and writes nothing to
//!   the other's;
//! - fifty tenants with the same key cost the CloudStack calls of one scope;
//! - one tenant's revoked key does not make another tenant's silent guest on the same host
//!   read as a paused stats collection: it turns `False` as soon as it would otherwise.
//!
//! Before scopes carried the credentials, each endpoint's VM set replaced the one processed
//! before it in the shared scope: the first tenant's Machines got no condition at all.

mod kube_support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use capc_health_shim::controller::cycle::Controller;
use capc_health_shim::status::StatusReport;
use kube_support::{
    ar, get, is, kube_client, merge_patch, simulator_from_scenario, Fixture, SIM_KEY, SIM_SECRET,
    ZONE_ID,
};
use serde_json::{json, Value};

const TEAM_A_KEY: &str = "team-a-key";
const TEAM_A_SECRET: &str = "team-a-secret";
const TEAM_B_KEY: &str = "team-b-key";
const TEAM_B_SECRET: &str = "team-b-secret";

/// The Machines of one tenant: name → (VM name, expected `(status, reason)`).
fn machines(prefix: &str) -> Vec<(String, String, &'static str, &'static str)> {
    vec![
        (
            format!("{prefix}-ok"),
            format!("{prefix}-vm-ok"),
            "True",
            "",
        ),
        (
            format!("{prefix}-err"),
            format!("{prefix}-vm-err"),
            "False",
            "VMError",
        ),
        (
            format!("{prefix}-nic"),
            format!("{prefix}-vm-nic"),
            "False",
            "GuestNetworkSilent",
        ),
    ]
}

/// One zone, an admin and two user accounts; each tenant's VMs belong to its account: a
/// healthy guest, one in Error and one whose NICs are down.
fn scenario() -> Value {
    let mut vms = Vec::new();
    for (tenant, account) in [("a", "team-a"), ("b", "team-b")] {
        for (suffix, guest, state) in [
            ("ok", "healthy", "Running"),
            ("err", "healthy", "Error"),
            ("nic", "nic-down", "Starting"),
        ] {
            vms.push(json!({"name": format!("{tenant}-vm-{suffix}"), "id": uuid::Uuid::new_v4().to_string(),
                "guest": guest, "state": state, "account": account}));
        }
    }
    json!({
        "settings": {"stats_interval_seconds": 1, "boot_seconds": 1, "guest_speedup": 60,
                     "guest_boot_seconds": 1.5, "guest_join_seconds": 3},
        "accounts": [
            {"name": "admin", "type": "Admin", "api_key": SIM_KEY, "secret_key": SIM_SECRET},
            {"name": "team-a", "type": "User", "api_key": TEAM_A_KEY, "secret_key": TEAM_A_SECRET},
            {"name": "team-b", "type": "User", "api_key": TEAM_B_KEY, "secret_key": TEAM_B_SECRET},
        ],
        "zones": [{"name": "zone-a", "id": ZONE_ID}],
        "networks": [{"name": "capi-shared", "zone": "zone-a", "cidr": "10.1.0.0/16"}],
        "vms": vms,
    })
}

/// Tenant `a` in the fixture's namespace, tenant `b` in a namespace of its own.
async fn two_tenants(keys: [(&str, &str); 2]) -> (Fixture, String) {
    let client = kube_client().await;
    let f = Fixture::with_simulator_keys(
        client,
        simulator_from_scenario(scenario(), 1.0).await,
        keys[0].0,
        keys[0].1,
    )
    .await;
    let b = f.tenant(keys[1].0, keys[1].1).await;
    for (m, vm, _, _) in machines("a") {
        f.machine(&m, Some(&vm), false, "fd1").await;
    }
    for (m, vm, _, _) in machines("b") {
        f.machine_in(&b, &m, Some(&vm), false, "fd1").await;
    }
    (f, b)
}

type Verdicts = BTreeMap<String, (Option<(String, String)>, bool)>;

/// Every Machine of both tenants, by `namespace/name`.
async fn verdicts(f: &Fixture, b: &str) -> Verdicts {
    let mut out = BTreeMap::new();
    for (ns, prefix) in [(f.ns.as_str(), "a"), (b, "b")] {
        for (m, _, _, _) in machines(prefix) {
            out.insert(format!("{ns}/{m}"), f.verdict_in(ns, &m).await);
        }
    }
    out
}

fn all_as_expected(f: &Fixture, b: &str, v: &Verdicts) -> bool {
    [(f.ns.as_str(), "a"), (b, "b")].iter().all(|(ns, prefix)| {
        machines(prefix).iter().all(|(m, _, status, reason)| {
            let got = &v[&format!("{ns}/{m}")];
            match *status {
                "True" => got.0.as_ref().is_some_and(|(s, _)| s == "True"),
                _ => is(got, status, reason),
            }
        })
    })
}

async fn cycle_until(
    c: &mut Controller,
    deadline: Duration,
    mut done: impl AsyncFnMut() -> bool,
) -> bool {
    let until = Instant::now() + deadline;
    loop {
        c.cycle(jiff::Timestamp::now()).await;
        if done().await {
            return true;
        }
        if Instant::now() > until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
}

/// A controller over both tenants' namespaces, cycled until every Machine of both has its
/// expected verdict (deadline); the controller and its `/status` then.
async fn judge_both(f: &Fixture, b: &str) -> (Controller, StatusReport) {
    let (mut c, report) = f.controller(&["--namespace", b]).await;
    let reached = cycle_until(&mut c, Duration::from_secs(60), async || {
        all_as_expected(f, b, &verdicts(f, b).await)
    })
    .await;
    let v = verdicts(f, b).await;
    assert!(reached, "every Machine of both tenants judged: {v:#?}");
    let r = report.read().await.clone();
    (c, r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn two_tenants_with_one_key_share_one_listing_and_both_get_their_verdicts() {
    let (f, b) = two_tenants([(SIM_KEY, SIM_SECRET), (SIM_KEY, SIM_SECRET)]).await;
    let (_, r) = judge_both(&f, &b).await;
    let used: Vec<_> = r.scopes.iter().filter(|s| s.machines > 0).collect();
    assert_eq!(
        used.len(),
        1,
        "one key, one zone: one scope: {:#?}",
        r.scopes
    );
    let mut want = vec![format!("{}/acs", f.ns), format!("{b}/acs")];
    want.sort();
    assert_eq!(
        used[0].secrets, want,
        "the scope names the Secrets that feed it"
    );
    assert!(!used[0].key.contains(SIM_KEY) && !used[0].key.contains(SIM_SECRET));
    f.cleanup().await;
}

/// Before 0c73938 `verify-ssl` was part of the credentials' identity: two Secrets with one key
/// made two scopes (the same VMs listed twice), each with a rate-limit budget of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn secrets_with_one_key_and_another_verify_ssl_are_one_scope() {
    let (f, b) = two_tenants([(SIM_KEY, SIM_SECRET), (SIM_KEY, SIM_SECRET)]).await;
    // The fixture's Secrets say "false"; the simulator speaks plain HTTP, so "true" changes
    // nothing but the Secret.
    merge_patch(
        &f.client,
        &b,
        &ar("", "v1", "Secret", "secrets"),
        "acs",
        json!({"stringData": {"verify-ssl": "true"}}),
    )
    .await;
    let (_, r) = judge_both(&f, &b).await;
    let used: Vec<_> = r.scopes.iter().filter(|s| s.machines > 0).collect();
    assert_eq!(
        used.len(),
        1,
        "one key, one zone: one scope: {:#?}",
        r.scopes
    );
    assert_eq!(used[0].secrets.len(), 2, "{:#?}", used[0]);
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn tenants_with_their_own_keys_are_judged_apart_and_one_broken_key_blinds_only_its_own() {
    let (f, b) = two_tenants([(TEAM_A_KEY, TEAM_A_SECRET), (TEAM_B_KEY, TEAM_B_SECRET)]).await;
    let (mut c, r) = judge_both(&f, &b).await;
    let used: Vec<_> = r.scopes.iter().filter(|s| s.machines > 0).collect();
    assert_eq!(used.len(), 2, "a scope per key: {:#?}", r.scopes);

    // Tenant b's key breaks (a wrong secret key): CloudStack refuses it (401).
    let a_before = standing(&f, &f.ns, "a").await;
    merge_patch(
        &f.client,
        &b,
        &ar("", "v1", "Secret", "secrets"),
        "acs",
        json!({"stringData": {"secret-key": "not-team-b-secret"}}),
    )
    .await;
    let b_unknown = cycle_until(&mut c, Duration::from_secs(60), async || {
        let v = verdicts(&f, &b).await;
        machines("b").iter().all(|(m, _, _, _)| {
            is(
                &v[&format!("{b}/{m}")],
                "Unknown",
                "CloudStackAPIUnavailable",
            )
        })
    })
    .await;
    assert!(
        b_unknown,
        "tenant b's Machines Unknown after the grace: {:#?}",
        verdicts(&f, &b).await
    );
    let a_after = standing(&f, &f.ns, "a").await;
    assert_eq!(
        a_before, a_after,
        "tenant a's verdicts did not move while b's key was broken"
    );
    let v = verdicts(&f, &b).await;
    for (m, _, status, reason) in machines("a") {
        let got = &v[&format!("{}/{m}", f.ns)];
        assert!(
            got.0
                .as_ref()
                .is_some_and(|(s, r)| s == status && (reason.is_empty() || r == reason)),
            "{m}: {got:?}"
        );
    }
    f.cleanup().await;
}

/// Per Machine of a tenant: the status, reason and `lastTransitionTime` of our condition
/// (its message may carry fresh figures each cycle; these three move only with the verdict).
async fn standing(f: &Fixture, ns: &str, prefix: &str) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    for (m, _, _, _) in machines(prefix) {
        let o = get(&f.client, ns, &f.resources.machine, &m).await;
        let c = kube_support::condition(&o, f.conditions_pointer()).cloned();
        out.insert(
            m,
            json!([
                c.as_ref().map(|c| &c["status"]),
                c.as_ref().map(|c| &c["reason"]),
                c.as_ref().map(|c| &c["lastTransitionTime"])
            ]),
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn fifty_tenants_with_one_key_cost_the_calls_of_one_scope() {
    const TENANTS: usize = 50;
    let client = kube_client().await;
    let f = Fixture::with_simulator_keys(
        client,
        simulator_from_scenario(scenario(), 1.0).await,
        SIM_KEY,
        SIM_SECRET,
    )
    .await;
    f.machine("a-ok", Some("a-vm-ok"), false, "fd1").await;
    let mut namespaces = vec![f.ns.clone()];
    for _ in 1..TENANTS {
        let ns = f.tenant(SIM_KEY, SIM_SECRET).await;
        // Every tenant's one Machine on the same healthy VM id: the scope tracks it once.
        f.machine_in(&ns, "m", Some("a-vm-ok"), false, "fd1").await;
        namespaces.push(ns);
    }
    // One tenant alone, then all fifty: the CloudStack calls per cycle must be the same.
    let (mut alone, alone_report) = f.controller(&[]).await;
    let alone_calls = calls_per_cycle(&mut alone, &alone_report, &f.sim, 1).await;
    let mut flags = Vec::new();
    for ns in &namespaces[1..] {
        flags.push("--namespace".to_string());
        flags.push(ns.clone());
    }
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let (mut c, report) = f.controller(&flags).await;
    let all_calls = calls_per_cycle(&mut c, &report, &f.sim, TENANTS).await;
    let r = report.read().await.clone();
    let in_use: Vec<_> = r.scopes.iter().filter(|s| s.machines > 0).collect();
    assert_eq!(in_use.len(), 1, "{:#?}", r.scopes);
    assert_eq!(in_use[0].secrets.len(), TENANTS);
    println!(
        "CloudStack calls per cycle: 1 tenant {alone_calls:?}, {TENANTS} tenants with one key {all_calls:?}"
    );
    // Counted: the listing is there in both (an empty map on both sides would be equal too).
    for calls in [&alone_calls, &all_calls] {
        let listings: f64 = calls
            .iter()
            .filter(|(k, _)| k.starts_with("listVirtualMachines/"))
            .map(|(_, n)| n)
            .sum();
        assert!(
            listings >= 1.0,
            "no listing counted by the simulator: {calls:?}"
        );
    }
    assert_eq!(
        alone_calls, all_calls,
        "{TENANTS} tenants with one key cost the calls of one"
    );
    f.cleanup().await;
}

/// Cycles until one scope judges `machines` Machines, then the CloudStack calls per cycle by
/// command and result, as the simulator counted them (not the shim's own counters), over five more cycles
/// a poll interval apart.
async fn calls_per_cycle(
    c: &mut Controller,
    report: &std::sync::Arc<capc_health_shim::status::board::StatusBoard>,
    sim: &cloudstack_sim::Simulator,
    machines: usize,
) -> BTreeMap<String, f64> {
    let judged = cycle_until(c, Duration::from_secs(90), async || {
        let r = report.read().await;
        r.scopes.iter().any(|s| s.machines == machines)
    })
    .await;
    assert!(
        judged,
        "{machines} Machines in one scope: {:#?}",
        report.read().await.scopes
    );
    let calls = || -> BTreeMap<String, u64> {
        let by_command: BTreeMap<String, BTreeMap<String, u64>> =
            serde_json::from_value(sim.calls()["by_command"].clone()).expect("calls by command");
        by_command
            .into_iter()
            .flat_map(|(command, results)| {
                results
                    .into_iter()
                    .map(move |(result, n)| (format!("{command}/{result}"), n))
            })
            .collect()
    };
    let before = calls();
    const CYCLES: u64 = 5;
    for _ in 0..CYCLES {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        c.cycle(jiff::Timestamp::now()).await;
    }
    let after = calls();
    after
        .iter()
        .map(|(k, n)| {
            let d = n - before.get(k).copied().unwrap_or(0);
            (k.clone(), d as f64 / CYCLES as f64)
        })
        .filter(|(_, n)| *n > 0.0)
        .collect()
}

/// With src/controller/poll.rs at 45755a3 this fails: scopes were polled one after another and
/// without a deadline, so the cycle — and every verdict in it — waited for the unreachable
/// endpoint's four attempts of `--request-timeout` (here 4 × 30 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn an_unresponsive_cloudstack_does_not_hold_up_another_tenants_verdicts() {
    let client = kube_client().await;
    let f = Fixture::with_simulator_keys(
        client,
        simulator_from_scenario(scenario(), 1.0).await,
        TEAM_A_KEY,
        TEAM_A_SECRET,
    )
    .await;
    // Tenant b's CloudStack answers nothing: every request hangs.
    let (slow, slow_server, _) = simulator_from_scenario(scenario(), 1.0).await;
    slow.set_api_faults(cloudstack_sim::ApiFaults {
        timeout_next: 1_000_000,
        ..Default::default()
    });
    let b = f
        .tenant_at(&slow_server.api_url(), TEAM_B_KEY, TEAM_B_SECRET)
        .await;
    for (m, vm, _, _) in machines("a") {
        f.machine(&m, Some(&vm), false, "fd1").await;
    }
    for (m, vm, _, _) in machines("b") {
        f.machine_in(&b, &m, Some(&vm), false, "fd1").await;
    }
    let (mut c, report) = f
        .controller(&[
            "--namespace",
            &b,
            "--request-timeout",
            "30s",
            "--poll-deadline",
            "10s",
        ])
        .await;
    let started = Instant::now();
    c.cycle(jiff::Timestamp::now()).await;
    let took = started.elapsed();
    let deadline = Duration::from_secs(10);
    println!("one cycle with an unresponsive endpoint: {took:?} (poll deadline {deadline:?})");
    assert!(
        took < deadline + Duration::from_secs(5),
        "the cycle waited {took:?} for the unresponsive endpoint"
    );
    // Tenant a was judged in that cycle (first verdicts; a new Machine's first condition may
    // wait for its traffic samples, so the verdict is read from /status), tenant b's scope
    // reports the deadline.
    let r = report.read().await.clone();
    for (m, _, _, _) in machines("a") {
        let judged = r
            .clusters
            .values()
            .filter_map(|c| c.machines.get(&m))
            // Decided: on the Machine, or queued/held for it (`pending`).
            .any(|report| report.verdict.is_some() || report.pending.is_some());
        assert!(judged, "{m} has no verdict after the cycle");
    }
    assert!(
        r.scopes.iter().any(|s| s
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("did not finish within"))),
        "{:#?}",
        r.scopes
    );
    slow_server.shutdown().await;
    f.cleanup().await;
}

/// Tenant a (two steady guests) and tenant b (one guest) share one host of one endpoint, each
/// in a project of its own (so that, with user keys and no usage history for project VMs, the
/// listing's counter is the evidence and the shim judges the endpoint's stats collection over
/// both tenants — user keys see no `hostid`). At `t0` b's guest loses its NICs — and, when
/// `revoke_a`, tenant a's key is regenerated in CloudStack at the same instant (the old one
/// answers 401). Returns the seconds from `t0` to b's Machine reading
/// `False`/`GuestNetworkSilent`, or `None` within `within`.
async fn silent_next_to_a_neighbour(revoke_a: bool, within: Duration) -> Option<f64> {
    let (project_a, project_b) = (
        uuid::Uuid::new_v4().to_string(),
        uuid::Uuid::new_v4().to_string(),
    );
    let vm = |name: &str, account: &str, project: &str| {
        json!({"name": name, "id": uuid::Uuid::new_v4().to_string(), "guest": "healthy",
            "state": "Starting", "account": account, "project": project, "host": "kvm-shared"})
    };
    let scenario = json!({
        "settings": {"stats_interval_seconds": 1, "boot_seconds": 1, "guest_speedup": 60,
                     "guest_boot_seconds": 1.5, "guest_join_seconds": 3},
        "accounts": [
            {"name": "admin", "type": "Admin", "api_key": SIM_KEY, "secret_key": SIM_SECRET},
            {"name": "team-a", "type": "User", "api_key": TEAM_A_KEY, "secret_key": TEAM_A_SECRET},
            {"name": "team-b", "type": "User", "api_key": TEAM_B_KEY, "secret_key": TEAM_B_SECRET},
        ],
        "zones": [{"name": "zone-a", "id": ZONE_ID}],
        "hosts": [{"name": "kvm-shared", "zone": "zone-a"}],
        "projects": [{"name": "proj-a", "id": project_a, "members": ["team-a"]},
                     {"name": "proj-b", "id": project_b, "members": ["team-b"]}],
        "networks": [{"name": "capi-shared", "zone": "zone-a", "cidr": "10.1.0.0/16"}],
        "vms": [vm("a-vm-1", "team-a", "proj-a"), vm("a-vm-2", "team-a", "proj-a"),
                vm("b-vm", "team-b", "proj-b")],
    });
    let client = kube_client().await;
    let f = Fixture::with_simulator_keys(
        client,
        simulator_from_scenario(scenario, 1.0).await,
        TEAM_A_KEY,
        TEAM_A_SECRET,
    )
    .await;
    let b = f.tenant(TEAM_B_KEY, TEAM_B_SECRET).await;
    f.machine("a-1", Some("a-vm-1"), false, "fd1").await;
    f.machine("a-2", Some("a-vm-2"), false, "fd1").await;
    f.machine_in(&b, "b-1", Some("b-vm"), false, "fd1").await;
    for (ns, project) in [(f.ns.as_str(), &project_a), (b.as_str(), &project_b)] {
        merge_patch(
            &f.client,
            ns,
            &f.resources.failure_domain,
            "fd1-hash",
            json!({"spec": {"project": project}}),
        )
        .await;
    }
    let (mut c, _) = f.controller(&["--namespace", &b]).await;
    let healthy = cycle_until(&mut c, Duration::from_secs(60), async || {
        is(&f.verdict("a-1").await, "True", "VMHealthy")
            && is(&f.verdict("a-2").await, "True", "VMHealthy")
            && is(&f.verdict_in(&b, "b-1").await, "True", "VMHealthy")
    })
    .await;
    assert!(healthy, "all three guests healthy first");
    // Long enough for a's guests to count as steady traffic (more than --silent-samples
    // rises, one per 1 s collection): they are what a paused collection is judged by.
    let settle = Instant::now() + Duration::from_secs(8);
    while Instant::now() < settle {
        c.cycle(jiff::Timestamp::now()).await;
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let t0 = Instant::now();
    f.sim.with_world(|w| {
        if revoke_a {
            let a = w.account_by_api_key(TEAM_A_KEY).expect("team-a");
            w.accounts[a].api_key = "team-a-key-regenerated".into();
        }
        let i = w.vm_index("b-vm").expect("b-vm");
        w.apply_fault_now(i, cloudstack_sim::Fault::NicDown);
    });
    let turned = cycle_until(&mut c, within, async || {
        is(
            &f.verdict_in(&b, "b-1").await,
            "False",
            "GuestNetworkSilent",
        )
    })
    .await;
    let took = t0.elapsed().as_secs_f64();
    if revoke_a {
        // The revocation did reach the shim: a's Machines stand on no listing any more.
        let a_unknown = cycle_until(&mut c, Duration::from_secs(60), async || {
            is(
                &f.verdict("a-1").await,
                "Unknown",
                "CloudStackAPIUnavailable",
            )
        })
        .await;
        assert!(a_unknown, "a-1: {:?}", f.verdict("a-1").await);
    }
    f.cleanup().await;
    turned.then_some(took)
}

/// Issue 41: a history whose last poll failed kept its last sighting and a frozen last rise,
/// and counted as a witness of its host's stats collection across every scope of the endpoint:
/// tenant a's revoked key made tenant b's silent guest read as "collection paused", and b's
/// Machine never turned False. Now only fresh sightings witness; b's guest turns False within
/// its usual time (the same run without the revocation), plus three poll intervals of slack
/// (poll, collection and cycle phases differ from run to run by up to ~1.5 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_tenants_revoked_key_does_not_hide_another_tenants_silent_guest() {
    let usual = silent_next_to_a_neighbour(false, Duration::from_secs(60))
        .await
        .expect("b's silent guest turns False next to a healthy neighbour");
    let revoked = silent_next_to_a_neighbour(true, Duration::from_secs(60)).await;
    println!(
        "b's silent guest False after: {usual:.1} s next to a healthy tenant, {} next to a revoked one",
        revoked.map_or("never (60 s)".to_string(), |s| format!("{s:.1} s"))
    );
    let revoked = revoked.expect("b's silent guest turns False next to a revoked tenant");
    assert!(
        revoked <= usual + 3.0,
        "next to a revoked tenant {revoked:.1} s, usually {usual:.1} s"
    );
}
