//! The alerts of deploy/components/monitoring read series that the running controller sets
//! from what it finds — not a recorder called by hand (tests/monitoring_metrics.rs checks the
//! names that way). `capc-health-shim run` runs as a process, as deployed, against the test
//! API server and `cloudstack-sim`; its real `/metrics` is scraped while its `/status` shows the
//! finding.

mod kube_support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kube::api::{Api, DynamicObject};
use kube_support::{http_get, kube_client, merge_patch, Fixture};
use serde_json::{json, Value};

macro_rules! wait_for {
    ($within:expr, $what:expr, $probe:expr) => {{
        let within: Duration = $within;
        let until = Instant::now() + within;
        loop {
            if let Some(v) = async { $probe }.await {
                break v;
            }
            assert!(Instant::now() < until, "not within {:?}: {}", within, $what);
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }};
}

/// `capc-health-shim run` as a process with plain HTTP, leading through a Lease in the test
/// namespace; its output to target/alerts-kube/<name>.log. Killed when dropped.
struct Shim {
    child: Child,
    addr: String,
    log: PathBuf,
}

impl Shim {
    fn start(f: &Fixture, name: &str, args: &[&str]) -> Self {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("alerts-kube");
        std::fs::create_dir_all(&dir).expect("log dir");
        let log = dir.join(format!("{name}-{}.log", f.ns));
        let file = std::fs::File::create(&log).expect("log file");
        let addr = format!("127.0.0.1:{}", kube_support::free_port());
        let lease = format!("shim-{}", f.ns);
        let mut all = vec![
            "--log",
            "info,capc_health_shim=debug",
            "run",
            "--namespace",
            &f.ns,
            "--status-addr",
            &addr,
            "--insecure-serving",
            "--lease-namespace",
            &f.ns,
            "--lease-name",
            &lease,
            "--poll-interval",
            "1s",
            "--stats-interval",
            "1s",
        ];
        all.extend_from_slice(args);
        let child = Command::new(env!("CARGO_BIN_EXE_capc-health-shim"))
            .args(&all)
            .env("KUBECONFIG", test_support::apiserver::kubeconfig_path())
            .env("HOSTNAME", "shim-alerts")
            .env_remove("RUST_LOG")
            .stdout(Stdio::from(file.try_clone().expect("log fd")))
            .stderr(Stdio::from(file))
            .spawn()
            .expect("start capc-health-shim run");
        Self { child, addr, log }
    }

    fn assert_running(&mut self) {
        if let Ok(Some(s)) = self.child.try_wait() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            panic!("the shim exited with {s}:\n{}", tail.join("\n"));
        }
    }

    async fn status(&mut self) -> Option<Value> {
        self.assert_running();
        match http_get(&format!("http://{}/status", self.addr)).await {
            Some((200, body)) => serde_json::from_str(&body).ok(),
            _ => None,
        }
    }

    async fn metrics(&mut self) -> Option<String> {
        self.assert_running();
        match http_get(&format!("http://{}/metrics", self.addr)).await {
            Some((200, body)) => Some(body),
            _ => None,
        }
    }

    /// The first report generated after `after` (the shim's cycles, as `/status` dates them).
    async fn report_after(&mut self, after: jiff::Timestamp, within: Duration) -> Value {
        wait_for!(within, format!("a report generated after {after}"), {
            self.status().await.filter(|st| {
                st["generated_at"]
                    .as_str()
                    .and_then(|t| t.parse::<jiff::Timestamp>().ok())
                    .is_some_and(|t| t > after)
            })
        })
    }
}

impl Drop for Shim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of the sample of `name` whose labels include every `(label, value)` given;
/// `None` when no such series is exported.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let rest = series.strip_prefix(name)?;
        let set = match rest.strip_prefix('{') {
            Some(inner) => inner.strip_suffix('}')?,
            None if rest.is_empty() => "",
            None => return None,
        };
        labels
            .iter()
            .all(|(k, v)| set.contains(&format!("{k}=\"{v}\"")))
            .then(|| value.parse().ok())
            .flatten()
    })
}

async fn delete(f: &Fixture, r: &kube::core::ApiResource, name: &str) {
    let api: Api<DynamicObject> = Api::namespaced_with(f.client.clone(), &f.ns, r);
    api.delete(name, &Default::default())
        .await
        .unwrap_or_else(|e| panic!("delete {} {name}: {e}", r.kind));
}

/// The seed's own case (issue 41): a workload Cluster deleted, CAPC gone before destroying its
/// VMs (finalizers removed by hand). The Cluster goes through its deletionTimestamp, as a real
/// deletion does, then vanishes with its Machines, CloudStackMachines and failure domain; its
/// two VMs run on. `capc_health_orphan_vms` — what `CAPCHealthOrphanVMs` sums — reads 2 for
/// the deleted Cluster on the running shim's `/metrics` as soon as `/status` lists the two,
/// stays so for as long as it lists them, and goes once they are destroyed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_cluster_deleted_with_its_vms_left_raises_the_orphan_metric_while_status_lists_them() {
    let client = kube_client().await;
    let f = Fixture::new(
        client.clone(),
        &[
            ("vm-a", "healthy", "Starting"),
            ("vm-b", "healthy", "Starting"),
        ],
    )
    .await;
    // Held by a finalizer, as CAPI's own holds a Cluster while it deletes what it owns.
    merge_patch(
        &f.client,
        &f.ns,
        &f.resources.cluster,
        "c1",
        json!({"metadata": {"finalizers": ["test.capc-health-shim/hold"]}}),
    )
    .await;
    f.machine("m-a", Some("vm-a"), false, "fd1").await;
    f.machine("m-b", Some("vm-b"), true, "fd1").await;
    let mut shim = Shim::start(&f, "cluster-deleted", &["--orphan-grace", "2s"]);
    let cluster = format!("{}/c1", f.ns);
    wait_for!(Duration::from_secs(90), "both Machines judged healthy", {
        shim.status().await.filter(|st| {
            ["m-a", "m-b"].iter().all(|m| {
                let m = &st["clusters"][&cluster]["machines"][*m];
                m["verdict"] == "True" && m["reason"] == "VMHealthy"
            })
        })
    });

    delete(&f, &f.resources.cluster, "c1").await;
    // Two of the shim's cycles see the Cluster deleting (else its vanishing would read as a
    // `clusterctl move`, whose VMs are not orphans).
    let first = shim
        .report_after(jiff::Timestamp::now(), Duration::from_secs(30))
        .await;
    let first_at: jiff::Timestamp = first["generated_at"].as_str().unwrap().parse().unwrap();
    shim.report_after(first_at, Duration::from_secs(30)).await;
    for m in ["m-a", "m-b"] {
        delete(&f, &f.resources.cloudstack_machine, &format!("{m}-csm")).await;
        delete(&f, &f.resources.machine, m).await;
    }
    delete(&f, &f.resources.failure_domain, "fd1-hash").await;
    merge_patch(
        &f.client,
        &f.ns,
        &f.resources.cluster,
        "c1",
        json!({"metadata": {"finalizers": null}}),
    )
    .await;
    let clusters: Api<DynamicObject> =
        Api::namespaced_with(f.client.clone(), &f.ns, &f.resources.cluster);
    wait_for!(Duration::from_secs(30), "the Cluster is gone", {
        matches!(clusters.get_opt("c1").await, Ok(None)).then_some(())
    });
    let gone_at = jiff::Timestamp::now();

    let vm_ids: Vec<String> = ["vm-a", "vm-b"]
        .iter()
        .map(|v| f.vm_ids[*v].to_ascii_lowercase())
        .collect();
    let listed = |st: &Value| -> usize {
        st["orphans"].as_array().map_or(0, |o| {
            o.iter()
                .filter(|o| {
                    o["cluster"] == cluster.as_str()
                        && o["vm_id"]
                            .as_str()
                            .is_some_and(|id| vm_ids.iter().any(|v| v == id))
                })
                .count()
        })
    };
    let reported = wait_for!(Duration::from_secs(60), "/status lists both VMs", {
        shim.status().await.filter(|st| listed(st) == 2)
    });
    let scope = reported["orphans"][0]["scope"]
        .as_str()
        .expect("scope")
        .to_string();
    let labels = [("cluster", cluster.as_str()), ("scope", scope.as_str())];
    // The report is swapped in after the gauge is set (same cycle): one scrape after the
    // listing shows it already, later ones must keep it.
    let listed_at: jiff::Timestamp = reported["generated_at"].as_str().unwrap().parse().unwrap();
    let metrics = shim.metrics().await.expect("GET /metrics");
    let value = sample(&metrics, "capc_health_orphan_vms", &labels);
    assert_eq!(
        value,
        Some(2.0),
        "capc_health_orphan_vms{{cluster={cluster:?}}} while /status lists 2 orphans of the deleted Cluster ({} s after it went); the shim's log: {}\n{}",
        listed_at.duration_since(gone_at).as_secs_f64(),
        shim.log.display(),
        metrics
            .lines()
            .filter(|l| l.contains("orphan"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // Five more cycles: each scrape while /status lists them still reads 2.
    let mut at = listed_at;
    for _ in 0..5 {
        let st = shim.report_after(at, Duration::from_secs(30)).await;
        at = st["generated_at"].as_str().unwrap().parse().unwrap();
        let metrics = shim.metrics().await.expect("GET /metrics");
        assert_eq!(listed(&st), 2, "{}", st["orphans"]);
        assert_eq!(
            sample(&metrics, "capc_health_orphan_vms", &labels),
            Some(2.0),
            "cycle of {at}"
        );
    }
    eprintln!(
        "orphans of the deleted Cluster: listed {:.1} s after it went, capc_health_orphan_vms 2 at 6 scrapes over {:.1} s",
        listed_at.duration_since(gone_at).as_secs_f64(),
        at.duration_since(listed_at).as_secs_f64()
    );
    // The alert's expression: sum by (cluster, scope) > 0.
    let total: f64 = metrics
        .lines()
        .filter(|l| l.starts_with("capc_health_orphan_vms{") && l.contains(&cluster))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    assert!(total > 0.0);

    // Destroyed by an operator: out of /status, and the series of the deleted Cluster goes.
    f.sim.with_world(|w| {
        for v in ["vm-a", "vm-b"] {
            let idx = w.vm_index_by_id(&f.vm_ids[v]).expect("vm");
            w.destroy_vm_now(idx, true);
        }
    });
    let cleared = wait_for!(Duration::from_secs(60), "/status lists none", {
        shim.status().await.filter(|st| listed(st) == 0)
    });
    let cleared_at: jiff::Timestamp = cleared["generated_at"].as_str().unwrap().parse().unwrap();
    shim.report_after(cleared_at, Duration::from_secs(30)).await;
    let metrics = shim.metrics().await.expect("GET /metrics");
    assert_eq!(
        sample(&metrics, "capc_health_orphan_vms", &labels),
        None,
        "{metrics}"
    );
    drop(shim);
    f.cleanup().await;
}

#[test]
fn samples_are_found_by_name_and_labels() {
    let text = "# TYPE a gauge\na{x=\"1\",y=\"p q\"} 2\na{x=\"3\"} 4\nab 5\nb 6\n";
    assert_eq!(sample(text, "a", &[("y", "p q")]), Some(2.0));
    assert_eq!(sample(text, "a", &[("x", "3")]), Some(4.0));
    assert_eq!(sample(text, "a", &[("x", "9")]), None);
    assert_eq!(sample(text, "b", &[]), Some(6.0));
    assert_eq!(sample(text, "ab", &[]), Some(5.0));
    assert_eq!(sample(text, "c", &[]), None);
}
