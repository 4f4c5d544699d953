//! `make bench`: the CloudStack side's hot paths, written to `target/bench/cloudstack.json`
//! as flat `{"name": value}` pairs with units in the names.
//!
//! Each figure is the median of several timed rounds after a warm-up; these are numbers for
//! comparison on one machine in one run, not pass/fail thresholds.

use std::collections::BTreeMap;
use std::hint::black_box;
use std::time::Instant;

use capc_health_shim::cloudstack::model::VirtualMachine;
use capc_health_shim::cloudstack::parse::{parse_list_page, Reply};
use capc_health_shim::cloudstack::signing;
use capc_health_shim::sim;
use capc_health_shim::verdict::{evaluate, Graces, MachineFacts, PollOutcome, VmHistory};
use jiff::{SignedDuration, Timestamp};

/// Median seconds per call of `f` over `rounds` rounds of `iters` calls.
fn median_secs_per_call(rounds: usize, iters: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..iters.min(1000) {
        f();
    }
    let mut per_call: Vec<f64> = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..iters {
                f();
            }
            start.elapsed().as_secs_f64() / iters as f64
        })
        .collect();
    per_call.sort_by(|a, b| a.total_cmp(b));
    per_call[per_call.len() / 2]
}

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

fn main() {
    let mut report: BTreeMap<String, f64> = BTreeMap::new();

    // 1. Signing + encoding of a batch-poll request.
    let secret =
        "VDaACYb0LV9eNjTetIOElcVQkvJck_J_QljX_FcHRj87ZKiy0z0ty0ZsYBkoXkY9b7eq1EhwJaw7FF3akA3KBQ";
    let params = [
        ("apiKey", "plgWJfZK4gyS3mOMTVmjUVg-X-jlWlnfaUJ9GAbBbf9EdM-kAYMmAiLqzzq1ElZLYq_u38zCm0bewzGUdP66mg"),
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
    let s = median_secs_per_call(7, 20_000, || {
        black_box(signing::signed_query(secret, black_box(params)));
    });
    report.insert("signing_signed_query_per_second".into(), 1.0 / s);
    report.insert("signing_signed_query_microseconds".into(), s * 1e6);

    // 2. Parsing a 500-VM page.
    let page = serde_json::json!({"listvirtualmachinesresponse": {
        "count": 20_000, "virtualmachine": (0..500).map(vm_json).collect::<Vec<_>>()}});
    let body = serde_json::to_vec(&page).expect("serialisable");
    let s = median_secs_per_call(7, 20, || {
        let parsed = parse_list_page::<VirtualMachine>(
            "listVirtualMachines",
            "virtualmachine",
            Reply::new(200, Some("application/json"), black_box(&body)),
        )
        .expect("page parses");
        assert_eq!(parsed.items.len(), 500);
    });
    report.insert("parse_500_vm_page_milliseconds".into(), s * 1e3);
    report.insert(
        "parse_500_vm_page_megabytes".into(),
        body.len() as f64 / 1e6,
    );

    // 3. Evaluating 10 000 VMs' histories (each with ten polls of history).
    let graces = Graces::default();
    let t0: Timestamp = "2026-11-30T00:00:00Z".parse().expect("timestamp");
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
            h.record(PollOutcome::Seen(&vm), now, &graces);
        }
    }
    let facts = MachineFacts::default();
    let now = t0 + SignedDuration::from_secs(300);
    let s = median_secs_per_call(7, 3, || {
        for h in &histories {
            black_box(evaluate(h, &facts, &graces, now));
        }
    });
    report.insert("evaluate_10000_vm_histories_milliseconds".into(), s * 1e3);
    let s = median_secs_per_call(5, 2, || {
        for (h, vm) in histories.clone().iter_mut().zip(&vms) {
            h.record(PollOutcome::Seen(vm), now, &graces);
        }
    });
    report.insert(
        "record_poll_10000_vms_including_history_clone_milliseconds".into(),
        s * 1e3,
    );

    // 4. The simulator's latency for a 500-VM page with 20 000 VMs loaded.
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
