//! The writer task (issue 28 item 4): `run` hands every write to one task behind a bounded
//! queue, so a slow API server delays writes, never a poll. Against a real kube-apiserver
//! whose writes the shim's client slows down (a tower layer in front of its HTTP stack holds
//! every PATCH), and a `cloudstack-sim`:
//!
//! - cycles go on polling CloudStack while the first cycle's writes are still being sent, and
//!   a Machine whose write is queued is not queued again (no write is sent twice);
//! - a queue too small for the cycle drops the rest, says so, and later cycles write them.
//!
//! With the writes inline (the cycle waiting for them, as before), the first cycle returns with
//! every write done and nothing in flight: the first test fails (checked). Without a bound on
//! the queue nothing is dropped: the second fails.

mod kube_support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use capc_health_shim::controller::cycle::Controller;
use kube_support::{kube_client, Fixture};

const MACHINES: usize = 8;

/// The PATCH requests a client sent: path and body.
type Sent = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// A client of the same API server whose every PATCH (the condition and annotation writes)
/// waits `delay` before it is sent, and is recorded.
async fn slow_writing_client(delay: Duration) -> (kube::Client, Sent) {
    let path = test_support::apiserver::kubeconfig_path();
    let yaml = std::fs::read_to_string(&path).expect("the test API server's kubeconfig");
    let kubeconfig = kube::config::Kubeconfig::from_yaml(&yaml).expect("kubeconfig parses");
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("kubeconfig usable");
    let sent: Sent = Arc::default();
    let record = sent.clone();
    let hold =
        tower::filter::AsyncFilterLayer::new(move |req: http::Request<kube::client::Body>| {
            let record = record.clone();
            async move {
                if req.method() != http::Method::PATCH {
                    return Ok::<_, tower::BoxError>(req);
                }
                tokio::time::sleep(delay).await;
                let (parts, body) = req.into_parts();
                let bytes = body.collect_bytes().await?;
                record
                    .lock()
                    .unwrap()
                    .push((parts.uri.path().to_string(), bytes.to_vec()));
                Ok(http::Request::from_parts(
                    parts,
                    kube::client::Body::from(bytes),
                ))
            }
        });
    // The filter clones the service it wraps; the buffer in front of kube's stack makes it
    // cloneable.
    let stack = tower::ServiceBuilder::new().layer(hold).buffer(64);
    let client = kube::client::ClientBuilder::try_from(config)
        .expect("client builder")
        .with_layer(&stack)
        .build();
    (client, sent)
}

/// The condition writes sent (status PATCHes); fails if one was sent twice with the same body
/// (a write queued again while the first was in flight).
fn condition_writes_sent(sent: &Sent) -> usize {
    let sent = sent.lock().unwrap();
    let status: Vec<&(String, Vec<u8>)> = sent
        .iter()
        .filter(|(p, _)| p.ends_with("/status"))
        .collect();
    let distinct: BTreeSet<&(String, Vec<u8>)> = status.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        status.len(),
        "a condition write was sent twice: {:#?}",
        status
            .iter()
            .map(|(p, b)| format!("{p} {}", String::from_utf8_lossy(b)))
            .collect::<Vec<_>>()
    );
    status.len()
}

/// `MACHINES` Machines `m-<i>` on VMs in `Error`: a verdict from the first cycle (`Unknown` until a poll confirms it, then
/// what the mass-failure guard says), so Machines are written more than once, never twice the
/// same.
async fn fleet() -> (Fixture, Vec<String>) {
    let vms: Vec<String> = (0..MACHINES).map(|i| format!("vm-{i}")).collect();
    let specs: Vec<(&str, &str, &str)> = vms
        .iter()
        .map(|v| (v.as_str(), "healthy", "Error"))
        .collect();
    let f = Fixture::new(kube_client().await, &specs).await;
    let mut names = Vec::new();
    for (i, vm) in vms.iter().enumerate() {
        let name = format!("m-{i}");
        f.machine(&name, Some(vm), false, "fd1").await;
        names.push(name);
    }
    (f, names)
}

fn listings(f: &Fixture) -> u64 {
    f.sim.calls()["by_command"]["listVirtualMachines"]
        .as_object()
        .map(|m| m.values().filter_map(|v| v.as_u64()).sum())
        .unwrap_or(0)
}

/// `capc_health_kube_writes_total` for conditions written.
fn condition_writes_ok(c: &Controller) -> u64 {
    c.metrics()
        .encode()
        .lines()
        .find(|l| {
            l.starts_with("capc_health_kube_writes_total{")
                && l.contains(r#"kind="condition""#)
                && l.contains(r#"result="ok""#)
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

async fn every_machine_has_a_condition(f: &Fixture, names: &[String]) -> bool {
    for n in names {
        if f.verdict(n).await.0.is_none() {
            return false;
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_slow_api_server_holds_up_no_poll() {
    let (f, names) = fleet().await;
    // One write at a time, each held 1.5 s: the first cycle's writes take 12 s or more.
    let (slow, sent) = slow_writing_client(Duration::from_millis(1500)).await;
    let (c, _report) = f
        .controller_as(slow, &["--max-concurrent-writes", "1"])
        .await;
    let mut c = c.detached_writes();

    let first = c.cycle(jiff::Timestamp::now()).await;
    let in_flight = c.writes_in_flight();
    assert!(
        in_flight > 0 && first.condition_writes + in_flight == MACHINES,
        "the first cycle returned with {in_flight} write(s) in flight and {} done",
        first.condition_writes
    );
    // More cycles while those writes are being sent: each polls CloudStack again and queues
    // nothing twice.
    let listed = listings(&f);
    let mut written = first.condition_writes;
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        written += c.cycle(jiff::Timestamp::now()).await.condition_writes;
    }
    assert!(
        c.writes_in_flight() > 0,
        "the writes were still being sent during these cycles (else the test proves nothing)"
    );
    assert!(
        listings(&f) >= listed + 2,
        "two more cycles polled CloudStack while writes were in flight: {} → {}",
        listed,
        listings(&f)
    );
    assert!(
        c.writes_in_flight() <= MACHINES,
        "a queued write was queued again"
    );

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        written += c.cycle(jiff::Timestamp::now()).await.condition_writes;
        if c.writes_in_flight() == 0 && every_machine_has_a_condition(&f, &names).await {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "writes did not finish within 60 s"
        );
    }
    // The last outcomes are taken in by the next cycle.
    written += c.cycle(jiff::Timestamp::now()).await.condition_writes;
    let reached = condition_writes_sent(&sent);
    assert!(
        reached >= MACHINES,
        "{reached} condition writes for {MACHINES} Machines"
    );
    assert_eq!(
        (written, condition_writes_ok(&c)),
        (reached, reached as u64),
        "the cycles took in the outcome of every write sent, once"
    );
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_full_write_queue_drops_and_the_next_cycles_write_the_rest() {
    let (f, names) = fleet().await;
    let (slow, sent) = slow_writing_client(Duration::from_millis(300)).await;
    let (c, report) = f
        .controller_as(
            slow,
            &["--max-concurrent-writes", "1", "--write-queue", "3"],
        )
        .await;
    let mut c = c.detached_writes();

    let first = c.cycle(jiff::Timestamp::now()).await;
    // The writer may already hold one job while three wait: 3 or 4 taken, the rest dropped.
    assert!(
        (MACHINES - 4..=MACHINES - 3).contains(&first.dropped_writes),
        "dropped {} of {MACHINES} with room for 3 waiting",
        first.dropped_writes
    );
    assert!(
        report
            .read()
            .await
            .problems
            .iter()
            .any(|p| p.contains("--write-queue 3")),
        "/status says the queue was full: {:?}",
        report.read().await.problems
    );
    let dropped =
        c.metrics().encode().lines().any(|l| {
            l.starts_with("capc_health_writes_total{") && l.contains(r#"outcome="dropped""#)
        });
    assert!(
        dropped,
        "capc_health_writes_total counts the dropped writes"
    );

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        c.cycle(jiff::Timestamp::now()).await;
        if c.writes_in_flight() == 0 && every_machine_has_a_condition(&f, &names).await {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the dropped writes were not written by later cycles within 60 s"
        );
    }
    let reached = condition_writes_sent(&sent);
    assert_eq!(
        condition_writes_ok(&c),
        reached as u64,
        "every write sent counted once"
    );
    f.cleanup().await;
}
