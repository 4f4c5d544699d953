//! `make bench`: the CloudStack side's hot paths as Criterion benchmarks (groups `signing`,
//! `parse`, `verdict`, `orphans`), kept as regression guards: Criterion compares every run with the
//! previous one under `target/criterion` and says when a path got slower. Their medians, and
//! the simulator's page latency, go to `target/bench/cloudstack.json` as flat `{"name": value}`
//! pairs with units in the names — numbers for comparison on one machine, not thresholds.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion};

use capc_health_shim::cloudstack::model::VirtualMachine;
use capc_health_shim::cloudstack::parse::{parse_list_page, Reply};
use capc_health_shim::cloudstack::signing;
use capc_health_shim::k8s::watched::CloudStackMachineRecord;
use capc_health_shim::orphans::{ClusterSighting, OrphanFinder, ScopeListing, SightingRef};
use capc_health_shim::scope::ListedVm;
use capc_health_shim::verdict::{
    evaluate, mark_paused_collections, Graces, MachineFacts, PollOutcome, VmHistory,
};
use cloudstack_sim as sim;
use jiff::{SignedDuration, Timestamp};

fn vm_json(i: usize) -> serde_json::Value {
    serde_json::json!({
        "id": format!("{:08x}-0000-4000-8000-{:012x}", i, i),
        "name": format!("cluster-md-0-{i}"),
        "displayname": format!("cluster-md-0-{i}"),
        "state": if i.is_multiple_of(50) { "Stopped" } else { "Running" },
        "zoneid": "d4a81f75-5d92-415e-ab59-e85cc2ce56d9",
        "zonename": "zone-1",
        "account": "capi",
        "domainid": "e4874e10-5fdf-11ea-9a56-1e006800018c",
        "hostid": "8e8e68e7-19ea-4a78-bbdb-6e79d27729c9",
        "hostname": "kvm-host-3",
        "hostcontrolstate": "Enabled",
        "haenable": false,
        "created": "2026-11-30T04:00:00+0000",
        "lastupdated": "2026-11-30T04:01:00+0000",
        "cpuused": "12.5%",
        "networkkbsread": 1_000_000 + i,
        "networkkbswrite": 500_000 + i,
        "diskkbsread": 4096, "diskkbswrite": 8192, "memorykbs": 4_194_304,
        "tags": [{"key": "cluster.x-k8s.io/cluster-name", "value": "cluster"}],
        "details": {"rootDiskController": "virtio"},
        "nic": [{
            "id": format!("{:08x}-1111-4000-8000-{:012x}", i, i),
            "networkid": "87503ba2-d59d-4a5e-8f7f-b3f486cedbd8",
            "networkname": "shared-net",
            "ipaddress": format!("10.1.{}.{}", i / 250, i % 250 + 2),
            "netmask": "255.255.0.0", "gateway": "10.1.0.1",
            "isdefault": true, "macaddress": "02:00:34:fb:00:01",
            "traffictype": "Guest", "type": "Shared", "broadcasturi": "vlan://1994"
        }]
    })
}

const SECRET: &str =
    "VDaACYb0LV9eNjTetIOElcVQkvJck_J_QljX_FcHRj87ZKiy0z0ty0ZsYBkoXkY9b7eq1EhwJaw7FF3akA3KBQ";

/// The query of one batch poll (the shim's listing request).
const BATCH_POLL: [(&str, &str); 10] = [
    (
        "apiKey",
        "plgWJfZK4gyS3mOMTVmjUVg-X-jlWlnfaUJ9GAbBbf9EdM-kAYMmAiLqzzq1ElZLYq_u38zCm0bewzGUdP66mg",
    ),
    ("command", "listVirtualMachines"),
    ("response", "json"),
    ("details", "nics,stats"),
    ("listall", "true"),
    ("projectid", "0d1e6f3a-8a43-4b4e-9b1c-2f0c7d5e9a11"),
    ("page", "1"),
    ("pagesize", "500"),
    ("signatureversion", "3"),
    ("expires", "2030-01-01T00:00:00+0000"),
];

fn signing(c: &mut Criterion) {
    let mut g = c.benchmark_group("signing");
    g.bench_function("signed_query", |b| {
        b.iter(|| signing::signed_query(SECRET, black_box(BATCH_POLL)))
    });
    g.finish();
}

fn parse(c: &mut Criterion) {
    let page = serde_json::json!({"listvirtualmachinesresponse": {
        "count": 20_000, "virtualmachine": (0..500).map(vm_json).collect::<Vec<_>>()}});
    let body = serde_json::to_vec(&page).expect("serialisable");
    let mut g = c.benchmark_group("parse");
    g.bench_function("500_vm_page", |b| {
        b.iter(|| {
            let parsed = parse_list_page::<VirtualMachine>(
                "listVirtualMachines",
                "virtualmachine",
                Reply::new(200, Some("application/json"), black_box(&body)),
            )
            .expect("page parses");
            assert_eq!(parsed.items.len(), 500);
        })
    });
    g.finish();
}

/// 10 000 VMs with ten polls of history each, some counters rising.
fn histories(graces: &Graces, t0: Timestamp) -> (Vec<VirtualMachine>, Vec<VmHistory>) {
    let vms: Vec<VirtualMachine> = (0..10_000)
        .map(|i| serde_json::from_value(vm_json(i)).expect("vm"))
        .collect();
    let mut histories: Vec<VmHistory> =
        vms.iter().map(|vm| VmHistory::new(vm.id.clone())).collect();
    for poll in 0..10i64 {
        let now = t0 + SignedDuration::from_secs(30 * poll);
        for (h, vm) in histories.iter_mut().zip(&vms) {
            let mut vm = vm.clone();
            vm.networkkbswrite = vm
                .networkkbswrite
                .map(|v| v + poll as u64 * (h.vm_id.len() as u64 % 3));
            h.record(PollOutcome::Seen(&vm), now, graces);
        }
    }
    (vms, histories)
}

fn verdict(c: &mut Criterion) {
    let graces = Graces::default();
    let t0: Timestamp = "2026-11-30T00:00:00Z".parse().expect("timestamp");
    let (vms, histories) = histories(&graces, t0);
    let facts = MachineFacts::default();
    let now = t0 + SignedDuration::from_secs(300);
    let mut g = c.benchmark_group("verdict");
    g.bench_function("evaluate_10000_vm_histories", |b| {
        b.iter(|| {
            for h in &histories {
                black_box(evaluate(h, &facts, &graces, now));
            }
        })
    });
    g.bench_function("record_poll_10000_vms", |b| {
        b.iter_batched_ref(
            || histories.clone(),
            |hs| {
                for (h, vm) in hs.iter_mut().zip(&vms) {
                    h.record(PollOutcome::Seen(vm), now, &graces);
                }
            },
            BatchSize::LargeInput,
        )
    });
    g.bench_function("mark_paused_collections_10000_vms", |b| {
        b.iter_batched_ref(
            || histories.clone(),
            |hs| black_box(mark_paused_collections(hs.iter_mut(), &graces, now)),
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

/// The orphan report's per-cycle step at 10 000 Machines in steady state (every VM owned, plus
/// 100 VMs of someone else in the same listing): what it adds to a cycle, next to
/// `record_poll_10000_vms` (the listing folded into the histories).
fn orphans(c: &mut Criterion) {
    const SCOPE: &str = "https://cloud.example/client/api project=- zone=z1";
    let t0: Timestamp = "2026-11-30T00:00:00Z".parse().expect("timestamp");
    let machines: Vec<std::sync::Arc<CloudStackMachineRecord>> = (0..10_000)
        .map(|i| {
            std::sync::Arc::new(CloudStackMachineRecord {
                namespace: "bench".into(),
                name: format!("m-{i:05}-csm"),
                instance_id: Some(format!("00000000-0000-4000-8000-{i:012}")),
                failure_domain_name: Some("fd1".into()),
                instance_state: Some("Running".into()),
                instance_state_since: None,
                cluster_name: Some(format!("c{}", i % 10)),
                deleting: false,
                moving: false,
            })
        })
        .collect();
    let clusters: Vec<ClusterSighting> = (0..10)
        .map(|i| ClusterSighting {
            namespace: "bench".into(),
            name: format!("c{i}"),
            paused: false,
            deleting: false,
        })
        .collect();
    let listed: Vec<ListedVm> = (0..10_100)
        .map(|i| ListedVm {
            id: format!("00000000-0000-4000-8000-{i:012}"),
            name: if i < 10_000 {
                format!("m-{i:05}-csm")
            } else {
                format!("other-{i}")
            },
            state: capc_health_shim::cloudstack::model::VmState::Running,
        })
        .collect();
    let listings = [ScopeListing {
        scope: SCOPE,
        vms: Some(&listed),
    }];
    let machines: Vec<SightingRef<'_>> = machines
        .iter()
        .map(|machine| SightingRef {
            machine,
            scope: Some(SCOPE),
        })
        .collect();
    let mut warm = OrphanFinder::new(SignedDuration::from_mins(15));
    warm.observe(&machines, &clusters, &listings, t0);
    let now = t0 + SignedDuration::from_secs(30);
    let mut g = c.benchmark_group("orphans");
    g.bench_function("observe_10000_machines", |b| {
        b.iter_batched_ref(
            || warm.clone(),
            |f| black_box(f.observe(&machines, &clusters, &listings, now)),
            BatchSize::LargeInput,
        )
    });
    g.finish();
}

/// The median (ns) Criterion estimated for `group/id` in this run.
fn criterion_median_ns(group: &str, id: &str) -> Option<f64> {
    let target = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let path = Path::new(&target)
        .join("criterion")
        .join(group)
        .join(id)
        .join("new/estimates.json");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    v.pointer("/median/point_estimate")?.as_f64()
}

fn main() {
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
        .configure_from_args();
    signing(&mut c);
    parse(&mut c);
    verdict(&mut c);
    orphans(&mut c);
    c.final_summary();

    let mut report: BTreeMap<String, f64> = BTreeMap::new();
    let mut put = |name: &str, value: Option<f64>| match value {
        Some(v) => {
            report.insert(name.to_string(), v);
        }
        None => eprintln!("{name}: no Criterion estimate found (benchmark filtered out?)"),
    };
    let signing_ns = criterion_median_ns("signing", "signed_query");
    put(
        "signing_signed_query_microseconds",
        signing_ns.map(|ns| ns / 1e3),
    );
    put(
        "signing_signed_query_per_second",
        signing_ns.map(|ns| 1e9 / ns),
    );
    put(
        "parse_500_vm_page_milliseconds",
        criterion_median_ns("parse", "500_vm_page").map(|ns| ns / 1e6),
    );
    put(
        "evaluate_10000_vm_histories_milliseconds",
        criterion_median_ns("verdict", "evaluate_10000_vm_histories").map(|ns| ns / 1e6),
    );
    put(
        "record_poll_10000_vms_milliseconds",
        criterion_median_ns("verdict", "record_poll_10000_vms").map(|ns| ns / 1e6),
    );
    put(
        "mark_paused_collections_10000_vms_milliseconds",
        criterion_median_ns("verdict", "mark_paused_collections_10000_vms").map(|ns| ns / 1e6),
    );
    put(
        "orphans_observe_10000_machines_milliseconds",
        criterion_median_ns("orphans", "observe_10000_machines").map(|ns| ns / 1e6),
    );
    put(
        "orphans_observe_10000_machines_milliseconds",
        criterion_median_ns("orphans", "observe_10000_machines").map(|ns| ns / 1e6),
    );
    let page = serde_json::json!({"listvirtualmachinesresponse": {
        "count": 20_000, "virtualmachine": (0..500).map(vm_json).collect::<Vec<_>>()}});
    put(
        "parse_500_vm_page_megabytes",
        serde_json::to_vec(&page).ok().map(|b| b.len() as f64 / 1e6),
    );

    // The simulator's latency for a 500-VM page with 20 000 VMs loaded (a measurement of the
    // test double, not a hot path of the shim).
    match sim_page_latency(20_000) {
        Ok((p50, p99)) => {
            report.insert(
                "sim_500_vm_page_p50_milliseconds_20000_vms".into(),
                p50 * 1e3,
            );
            report.insert(
                "sim_500_vm_page_p99_milliseconds_20000_vms".into(),
                p99 * 1e3,
            );
        }
        Err(e) => eprintln!("simulator benchmark skipped: {e}"),
    }

    std::fs::create_dir_all("target/bench").expect("target/bench");
    let json = serde_json::to_string_pretty(&report).expect("json");
    std::fs::write("target/bench/cloudstack.json", &json).expect("write report");
    println!("{json}");
    println!("written to target/bench/cloudstack.json");
}

fn sim_page_latency(vms: usize) -> Result<(f64, f64), String> {
    let rt = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (key, secret) = ("bench-api-key".to_string(), "bench-secret-key".to_string());
        let world = sim::World::default_world(&key, &secret, sim::real_now_ms());
        let simulator = sim::Simulator::new(world);
        simulator
            .add_vms(vms, "bench", &sim::VmSpec::new("unused"))
            .map_err(|e| format!("{e:?}"))?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let server = sim::serve(listener, simulator.clone())
            .await
            .map_err(|e| e.to_string())?;
        let base = server.base_url();
        let http = reqwest::Client::new();
        let mut samples = Vec::new();
        for i in 0..60 {
            let page = (i % 40 + 1).to_string();
            let params = [
                ("apiKey", key.as_str()),
                ("command", "listVirtualMachines"),
                ("response", "json"),
                ("listall", "true"),
                ("details", "nics,stats"),
                ("page", page.as_str()),
                ("pagesize", "500"),
            ];
            let url = format!(
                "{base}/client/api?{}",
                signing::signed_query(&secret, params)
            );
            let start = Instant::now();
            let resp = http
                .get(&url)
                .send()
                .await
                .map_err(|e| e.without_url().to_string())?;
            let status = resp.status();
            let body = resp
                .bytes()
                .await
                .map_err(|e| e.without_url().to_string())?;
            let elapsed = start.elapsed();
            if !status.is_success() {
                return Err(format!("simulator answered {status}"));
            }
            black_box(body);
            if i >= 5 {
                samples.push(elapsed);
            }
        }
        server.shutdown().await;
        samples.sort();
        let pick = |q: f64| samples[((samples.len() - 1) as f64 * q) as usize].as_secs_f64();
        Ok::<_, String>((pick(0.5), pick(0.99)))
    })
}
