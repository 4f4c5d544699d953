//! Failure storms (issue 45): one thing breaks and every VM that depends on it fails with it —
//! a host, an Isolated network's virtual router, a network's uplink, a template.

use crate::traffic::Profile;
use crate::world::test_support::{world, T0};
use crate::world::*;

fn vm_on(w: &mut World, name: &str, host: Option<&str>, network: Option<&str>) -> usize {
    let mut s = VmSpec::new(name);
    s.host = host.map(str::to_string);
    s.network = network.map(str::to_string);
    w.add_vm(&s).unwrap()
}

/// The profile of VM `i` one minute after `t` (past boot and join, the guest idles).
fn profile(w: &World, i: usize, t: Ms) -> Option<Profile> {
    w.vm(i).unwrap().profile_at(t + 60_000)
}

#[test]
fn a_host_going_down_takes_every_vm_on_it_offline() {
    let mut w = world();
    w.add_host("h2", None, None, HostControl::Enabled).unwrap();
    let h1 = w.hosts[0].name.clone();
    let on_h1: Vec<usize> = (0..3)
        .map(|i| vm_on(&mut w, &format!("a{i}"), Some(&h1), None))
        .collect();
    let other = vm_on(&mut w, "b", Some("h2"), None);
    w.advance_to(T0 + 600_000);
    for status in [HostStatus::Disconnected, HostStatus::Down] {
        w.set_host_state(0, status, ResourceState::Enabled).unwrap();
        for &i in &on_h1 {
            let vm = w.vm(i).unwrap();
            assert_eq!(w.hosts[vm.host].control_state(), HostControl::Offline);
            assert_eq!(vm.state, VmState::Running, "the guests run on, unseen");
        }
        let b = w.vm(other).unwrap();
        assert_eq!(w.hosts[b.host].control_state(), HostControl::Enabled);
    }
}

#[test]
fn a_stopped_router_of_an_isolated_network_takes_its_guests_gateway() {
    let mut w = world();
    let iso = w
        .add_network(
            "iso",
            None,
            None,
            "10.1.1.0/24",
            None,
            NetworkType::Isolated,
        )
        .unwrap();
    let behind: Vec<usize> = (0..3)
        .map(|i| vm_on(&mut w, &format!("i{i}"), None, Some("iso")))
        .collect();
    let shared = vm_on(&mut w, "s", None, None);
    let t1 = T0 + 3_600_000;
    w.advance_to(t1);
    for &i in behind.iter().chain([&shared]) {
        assert_eq!(profile(&w, i, t1), Some(Profile::IdleJoined));
    }
    let r = w.routers_of(iso)[0];
    w.set_router_state_now(r, RouterState::Stopped).unwrap();
    assert_eq!(w.gateway_lost_since(iso), Some(t1));
    for &i in &behind {
        assert_eq!(profile(&w, i, t1), Some(Profile::WaitingForEndpointArp));
    }
    assert_eq!(profile(&w, shared, t1), Some(Profile::IdleJoined));
    // The Shared network's router stopping changes nothing for its running guests.
    let shared_net = w.vm(shared).unwrap().nic.as_ref().unwrap().network;
    let shared_router = w.routers_of(shared_net)[0];
    w.set_router_state_now(shared_router, RouterState::Stopped)
        .unwrap();
    assert_eq!(profile(&w, shared, t1), Some(Profile::IdleJoined));
    // Started again: the guests idle as before, from then on.
    let t2 = t1 + 600_000;
    w.advance_to(t2);
    w.set_router_state_now(r, RouterState::Running).unwrap();
    assert_eq!(w.gateway_lost_since(iso), None);
    for &i in &behind {
        assert_eq!(profile(&w, i, t2), Some(Profile::IdleJoined));
    }
}

#[test]
fn a_network_losing_its_uplink_silences_its_guests_only() {
    let mut w = world();
    let iso = w
        .add_network(
            "iso",
            None,
            None,
            "10.1.1.0/24",
            None,
            NetworkType::Isolated,
        )
        .unwrap();
    let on_iso = vm_on(&mut w, "i", None, Some("iso"));
    let elsewhere = vm_on(&mut w, "s", None, None);
    let t1 = T0 + 3_600_000;
    w.advance_to(t1);
    w.set_network_uplink_now(iso, false).unwrap();
    let r = w.routers_of(iso)[0];
    assert_eq!(
        w.routers[r].state,
        RouterState::Running,
        "CloudStack sees nothing"
    );
    assert_eq!(
        profile(&w, on_iso, t1),
        Some(Profile::WaitingForEndpointArp)
    );
    assert_eq!(profile(&w, elsewhere, t1), Some(Profile::IdleJoined));
    // A VM deployed on it meanwhile has no gateway either.
    let late = vm_on(&mut w, "late", None, Some("iso"));
    w.advance_to(t1 + 120_000);
    assert_eq!(
        profile(&w, late, t1 + 120_000),
        Some(Profile::WaitingForEndpointArp)
    );
    w.set_network_uplink_now(iso, true).unwrap();
    let t2 = t1 + 120_000;
    assert_eq!(
        profile(&w, on_iso, t2 + 3_600_000),
        Some(Profile::IdleJoined)
    );
    // The bytes moved before the change stay counted: the counter never falls.
    let vm = w.vm(on_iso).unwrap();
    assert!(vm.true_bytes(t2 + 60_000).1 >= vm.true_bytes(t2).1);
}

#[test]
fn a_broken_template_boots_every_new_vm_silent() {
    let mut w = world();
    let tpl = w.add_template("broken-image", None, &[]).unwrap();
    w.set_template_guest(tpl, Some(GuestKind::NicDown)).unwrap();
    let mut spec = VmSpec::new("from-broken");
    spec.template = Some("broken-image".into());
    let broken = w.add_vm(&spec).unwrap();
    let fine = w.add_vm(&VmSpec::new("from-default")).unwrap();
    // An explicit guest kind in the spec wins over the template's.
    let mut explicit = VmSpec::new("explicit");
    explicit.template = Some("broken-image".into());
    explicit.guest = GuestKind::Waiting;
    let explicit = w.add_vm(&explicit).unwrap();
    w.advance_to(T0 + 3_600_000);
    assert_eq!(w.vm(broken).unwrap().guest, GuestKind::NicDown);
    assert_eq!(profile(&w, broken, T0 + 3_600_000), Some(Profile::NicDown));
    assert_eq!(profile(&w, fine, T0 + 3_600_000), Some(Profile::IdleJoined));
    assert_eq!(w.vm(explicit).unwrap().guest, GuestKind::Waiting);
    // Fixed: new VMs boot healthy, the broken ones stay broken.
    w.set_template_guest(tpl, None).unwrap();
    let mut spec = VmSpec::new("from-fixed");
    spec.template = Some("broken-image".into());
    let fixed = w.add_vm(&spec).unwrap();
    assert_eq!(w.vm(fixed).unwrap().guest, GuestKind::Healthy);
    assert_eq!(w.vm(broken).unwrap().guest, GuestKind::NicDown);
    assert!(w.set_template_guest(99, None).is_err());
}
