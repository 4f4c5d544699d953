//! Every row of the verdict table that the CloudStack side can produce, end to end: the
//! simulator's fault → the controller → the condition on a real Machine (scaled graces).

mod kube_support;

use std::time::Duration;

use cloudstack_sim::Fault;
use kube_support::{is, kube_client, Fixture};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn each_fault_reaches_its_row() {
    let client = kube_client().await;
    let f = Fixture::new(
        client.clone(),
        &[
            ("vm-ok", "healthy", "Starting"),
            ("vm-stop", "healthy", "Starting"),
            ("vm-vanish", "healthy", "Starting"),
            ("vm-detach", "detach-nic", "Starting"),
            ("vm-noaddr", "no-address", "Starting"),
            ("vm-stall", "stall-starting", "Starting"),
            ("vm-destroyed", "healthy", "Starting"),
        ],
    )
    .await;
    for (m, vm) in [
        ("m-ok", "vm-ok"),
        ("m-stop", "vm-stop"),
        ("m-vanish", "vm-vanish"),
        ("m-detach", "vm-detach"),
        ("m-noaddr", "vm-noaddr"),
        ("m-stall", "vm-stall"),
    ] {
        f.machine(m, Some(vm), false, "fd1").await;
    }
    let (mut c, _) = f
        .controller(&[
            "--stopped-grace",
            "2s",
            "--nic-detached-grace",
            "2s",
            "--nic-no-address-grace",
            "3s",
            "--transition-grace",
            "4s",
        ])
        .await;
    let names = [
        "m-ok", "m-stop", "m-vanish", "m-detach", "m-noaddr", "m-stall",
    ];
    // Boot first, then stop one VM and make another vanish.
    f.cycle_until(&mut c, &names, Duration::from_secs(30), |s| {
        is(&s["m-stop"], "True", "VMHealthy")
    })
    .await;
    f.sim.inject_fault("vm-stop", Fault::Stop).expect("stop");
    f.sim
        .inject_fault("vm-vanish", Fault::Vanish)
        .expect("vanish");
    let s = f
        .cycle_until(&mut c, &names, Duration::from_secs(60), |s| {
            is(&s["m-ok"], "True", "VMHealthy")
                && is(&s["m-stop"], "False", "VMStopped")
                && is(&s["m-vanish"], "False", "VMNotFound")
                && is(&s["m-detach"], "False", "NICDetached")
                && is(&s["m-noaddr"], "False", "NICNoAddress")
                && is(&s["m-stall"], "False", "VMStuckInTransition")
        })
        .await;
    assert!(!s["m-ok"].1, "a healthy Machine is never annotated");
    f.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a kube-apiserver: `make test` runs it (hack/with-apiserver.sh)"]
async fn a_host_going_offline_stays_unknown_past_its_grace() {
    let client = kube_client().await;
    let (a, b) = (
        uuid::Uuid::new_v4().to_string(),
        uuid::Uuid::new_v4().to_string(),
    );
    let scenario = serde_json::json!({
        "settings": {"stats_interval_seconds": 1, "boot_seconds": 1, "guest_speedup": 60, "guest_boot_seconds": 1.5, "guest_join_seconds": 3},
        "zones": [{"name": "zone-a", "id": kube_support::ZONE_ID}],
        "networks": [{"name": "capi-shared", "zone": "zone-a", "cidr": "10.1.0.0/16"}],
        "hosts": [{"name": "host-1", "zone": "zone-a"}, {"name": "host-2", "zone": "zone-a"}],
        "vms": [{"name": "vm-lost", "id": a, "host": "host-1"}, {"name": "vm-fine", "id": b, "host": "host-2"}],
    });
    let f =
        Fixture::with_simulator(client, kube_support::simulator_from(scenario, 1.0).await).await;
    f.machine("m-lost", Some("vm-lost"), false, "fd1").await;
    f.machine("m-fine", Some("vm-fine"), false, "fd1").await;
    let (mut c, _) = f.controller(&["--host-unreachable-grace", "4s"]).await;
    let names = ["m-lost", "m-fine"];
    f.cycle_until(&mut c, &names, Duration::from_secs(30), |s| {
        is(&s["m-lost"], "True", "VMHealthy")
    })
    .await;
    f.sim
        .inject_fault("vm-lost", Fault::HostOffline)
        .expect("host offline");
    f.cycle_until(&mut c, &names, Duration::from_secs(10), |s| {
        is(&s["m-lost"], "Unknown", "HostUnreachable")
    })
    .await;
    // Past the grace it is still Unknown: an agent that lost its connection is no proof the
    // guest is gone, and CloudStack's HA changes the VM's state itself once it decides the
    // host is down. Every cycle over twice the grace shows it; the other host's VM is healthy.
    let until = std::time::Instant::now() + Duration::from_secs(8);
    while std::time::Instant::now() < until {
        let s = f
            .cycle_until(&mut c, &names, Duration::from_secs(5), |s| {
                is(&s["m-fine"], "True", "VMHealthy")
            })
            .await;
        assert!(is(&s["m-lost"], "Unknown", "HostUnreachable"), "{s:?}");
        assert!(
            !s["m-lost"].1 && !s["m-fine"].1,
            "nothing is annotated: {s:?}"
        );
        // Pace the cycles like the controller's poll interval would.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    f.cleanup().await;
}
