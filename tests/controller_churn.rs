//! Memory over time: workload clusters created and deleted for a simulated week, against a
//! real kube-apiserver and `cloudstack-sim`. Every simulated hour a new cluster arrives with a
//! Secret of its own key (so a scope of its own, which CloudStack refuses: its polls fail and
//! back off) and the cluster created three hours earlier is deleted; a stable cluster lives
//! throughout. The controller's clock is moved an hour per step, so every retention, grace and
//! back-off runs out as it would over a week.
//!
//! The `/metrics` series count and the process's RSS after the first day must not grow by the
//! end of the week. Before label sets were removed, every scope ever seen kept its series (a
//! poll-duration histogram and a gauge): 432 series after a day, 2 736 after the week.

mod kube_support;

use std::time::Duration;

use jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DynamicObject};
use kube_support::{ar, create, kube_client, Fixture, ZONE_ID};
use serde_json::json;

/// `VmRSS` of this process, in KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

fn series(metrics: &str) -> usize {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .count()
}

/// One churned cluster: its Secret (a key CloudStack refuses), failure domain, Cluster,
/// Machine and CloudStackMachine, all named after `n`.
async fn create_cluster(f: &Fixture, n: usize) {
    let cluster = format!("churn-{n}");
    f.secret(
        &format!("acs-{n}"),
        &[
            ("api-url", &f.server.api_url()),
            ("api-key", &format!("churn-key-{n}")),
            ("secret-key", "churn-secret"),
            ("verify-ssl", "false"),
        ],
    )
    .await;
    let r = &f.resources;
    let fd = &r.failure_domain;
    create(&f.client, &f.ns, fd, json!({"apiVersion": fd.api_version, "kind": "CloudStackFailureDomain",
        "metadata": {"name": format!("fd-{n}-hash"), "namespace": f.ns, "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
        "spec": {"name": format!("fd-{n}"), "zone": {"name": "zone-a", "id": ZONE_ID, "network": {"name": "capi-shared"}},
                 "acsEndpoint": {"name": format!("acs-{n}"), "namespace": f.ns}}})).await;
    create(
        &f.client,
        &f.ns,
        &r.cluster,
        json!({"apiVersion": r.cluster.api_version, "kind": "Cluster",
        "metadata": {"name": cluster, "namespace": f.ns}, "spec": {}}),
    )
    .await;
    let csm = &r.cloudstack_machine;
    let infra_ref = if r.machine.version == "v1beta2" {
        json!({"apiGroup": csm.group, "kind": "CloudStackMachine", "name": format!("m-{n}-csm")})
    } else {
        json!({"apiVersion": csm.api_version, "kind": "CloudStackMachine", "name": format!("m-{n}-csm")})
    };
    create(&f.client, &f.ns, &r.machine, json!({"apiVersion": r.machine.api_version, "kind": "Machine",
        "metadata": {"name": format!("m-{n}"), "namespace": f.ns, "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
        "spec": {"clusterName": cluster, "bootstrap": {"dataSecretName": "bootstrap"}, "infrastructureRef": infra_ref}})).await;
    create(&f.client, &f.ns, csm, json!({"apiVersion": csm.api_version, "kind": "CloudStackMachine",
        "metadata": {"name": format!("m-{n}-csm"), "namespace": f.ns, "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
        "spec": {"offering": {"name": "small"}, "template": {"name": "ubuntu"}, "failureDomainName": format!("fd-{n}"),
                 "instanceID": uuid::Uuid::new_v4().to_string()}})).await;
}

async fn delete_cluster(f: &Fixture, n: usize) {
    let r = &f.resources;
    for (resource, name) in [
        (&r.machine, format!("m-{n}")),
        (&r.cloudstack_machine, format!("m-{n}-csm")),
        (&r.failure_domain, format!("fd-{n}-hash")),
        (&r.cluster, format!("churn-{n}")),
        (&ar("", "v1", "Secret", "secrets"), format!("acs-{n}")),
    ] {
        let api: Api<DynamicObject> = Api::namespaced_with(f.client.clone(), &f.ns, resource);
        api.delete(&name, &Default::default())
            .await
            .unwrap_or_else(|e| panic!("delete {name}: {e}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_week_of_cluster_churn_leaves_memory_and_series_flat() {
    const HOURS: usize = 168;
    const LIFETIME: usize = 3;
    let client = kube_client().await;
    let f = Fixture::new(
        client,
        &[
            ("vm-a", "healthy", "Running"),
            ("vm-b", "healthy", "Running"),
        ],
    )
    .await;
    f.machine("stable-a", Some("vm-a"), false, "fd1").await;
    f.machine("stable-b", Some("vm-b"), false, "fd1").await;
    let (mut c, report) = f.controller(&["--orphan-grace", "30m"]).await;
    let start = Timestamp::now();
    let mut day_one = None;
    let mut samples = Vec::new();
    for hour in 0..HOURS {
        create_cluster(&f, hour).await;
        if hour >= LIFETIME {
            delete_cluster(&f, hour - LIFETIME).await;
        }
        // Let the watches catch up with the changes, then this hour's cycle.
        tokio::time::sleep(Duration::from_millis(100)).await;
        c.cycle(start + SignedDuration::from_hours(hour as i64))
            .await;
        if hour % 24 == 23 {
            let text = c.metrics().encode();
            let r = report.read().await;
            let sample = (
                hour + 1,
                series(&text),
                rss_kib(),
                r.scopes.len(),
                r.clusters.len(),
            );
            println!(
                "after {:>3} h: {} series, RSS {} KiB, {} scopes in use, {} clusters with Machines",
                sample.0, sample.1, sample.2, sample.3, sample.4
            );
            samples.push(sample);
            if day_one.is_none() {
                day_one = Some(sample);
            }
        }
    }
    let (_, series_day1, rss_day1, _, _) = day_one.expect("a day");
    let (_, series_end, rss_end, scopes_end, clusters_end) = *samples.last().unwrap();
    // Flat, not empty: the live clusters' Machines are counted at the end of the week, as on
    // day one (a registry that recorded nothing would be "flat" too).
    let text = c.metrics().encode();
    let machine_series = text
        .lines()
        .filter(|l| l.starts_with("capc_health_machines{"))
        .count();
    assert!(
        machine_series >= 1 && series_day1 > 0,
        "no capc_health_machines series after a week ({series_day1} series on day one):\n{text}"
    );
    let r = report.read().await;
    assert!(
        r.clusters
            .values()
            .any(|c| c.machines.contains_key("stable-a")),
        "the stable cluster's Machines are not reported after a week"
    );
    drop(r);
    assert!(
        series_end <= series_day1,
        "/metrics series grew from {series_day1} after a day to {series_end} after a week"
    );
    assert!(
        rss_end <= rss_day1 + 16 * 1024,
        "RSS grew from {rss_day1} KiB after a day to {rss_end} KiB after a week"
    );
    // The live clusters (stable + LIFETIME churned), nothing else.
    assert!(
        clusters_end <= 1 + LIFETIME,
        "{clusters_end} clusters reported"
    );
    assert!(scopes_end <= 1 + LIFETIME, "{scopes_end} scopes reported");
    f.cleanup().await;
}
