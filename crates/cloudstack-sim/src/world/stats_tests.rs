//! The collection model end to end inside the world: rows per hypervisor and management
//! server, host selection, retention, clock jumps, scale.

use crate::traffic::Profile;
use crate::world::test_support::T0;
use crate::world::*;

const MIN: Ms = 60_000;

/// A world at 60 s / `ms` management servers with one host of hypervisor `hv`.
fn world_with(hv: Hypervisor, ms: u32) -> World {
    let mut w = World::default_world("k", "s", T0);
    w.settings.management_servers = ms;
    w.hosts[0].hypervisor = hv;
    w
}

fn running(w: &mut World, name: &str, profile: Option<Profile>) -> usize {
    let mut s = VmSpec::new(name);
    s.state = VmState::Running;
    s.profile = profile;
    w.add_vm(&s).unwrap()
}

fn rows(w: &World, i: usize) -> Vec<Row> {
    w.vm(i).unwrap().stats_rows().copied().collect()
}

#[test]
fn kvm_rows_of_three_management_servers_partition_the_traffic() {
    let mut w = world_with(Hypervisor::Kvm, 3);
    let a = running(&mut w, "a", None);
    w.advance_to(T0 + 3_600_000);
    let r = rows(&w, a);
    // One row per server per interval (the first interval may miss some servers).
    assert!((177..=180).contains(&r.len()), "{}", r.len());
    for k in 0..3u8 {
        assert!(r.iter().filter(|x| x.ms == k).count() >= 59);
    }
    assert!(
        r.windows(2).all(|p| p[0].at_ms <= p[1].at_ms),
        "oldest first"
    );
    assert_eq!(
        r[0].tx, 0,
        "the first reading after the start sets the baseline"
    );
    // Rows are per-collection deltas: their sum is the traffic between the first and the
    // last reading, exactly (units are bytes on KVM).
    let vm = w.vm(a).unwrap();
    let (first, last) = (r[0].at_ms, r[r.len() - 1].at_ms);
    let sum: u64 = r.iter().map(|x| u64::from(x.tx)).sum();
    assert_eq!(sum, vm.true_bytes(last).1 - vm.true_bytes(first).1);
    // …and as KiB the listing's sum is that over 1024, truncated.
    let v = vm.stats_view(true).unwrap();
    assert_eq!(v.tx_kib, sum / 1024);
    let true_kib = vm.true_bytes(T0 + 3_600_000).1 / 1024;
    assert!(true_kib - v.tx_kib < 300, "{true_kib} vs {}", v.tx_kib);
}

#[test]
fn kvm_first_row_after_a_start_is_zero_and_a_slow_interval_is_not() {
    let mut w = world_with(Hypervisor::Kvm, 1);
    let a = running(&mut w, "a", Some(Profile::WaitingForEndpoint));
    let b = running(&mut w, "b", Some(Profile::WaitingForEndpointArp));
    w.advance_to(T0 + 30 * MIN);
    for i in [a, b] {
        let r = rows(&w, i);
        assert_eq!(r[0].tx, 0);
        // 45.8 B/s (SYN) or 26.6 B/s (ARP) × 60 s: 1.5–2.7 KiB per row, never 0.
        for x in &r[1..] {
            let kib = Row::kib(x.tx);
            assert!((1.5..=2.8).contains(&kib), "{kib}");
        }
    }
}

#[test]
fn nic_down_rows_send_nothing_and_one_nic_down_only_the_second_nic() {
    let mut w = world_with(Hypervisor::Kvm, 1);
    let a = running(&mut w, "a", Some(Profile::NicDown));
    let b = running(&mut w, "b", Some(Profile::OneNicDown));
    let c = running(&mut w, "c", Some(Profile::Silent));
    w.advance_to(T0 + 60 * MIN);
    let ra = rows(&w, a);
    assert!(ra.iter().all(|r| r.tx == 0));
    assert!(ra[1].rx > 0, "the ring still fills");
    assert!(ra.last().unwrap().rx == 0, "then it is full");
    let rb = rows(&w, b);
    assert!(
        rb[1..].iter().all(|r| r.tx == 126),
        "ARP on the second NIC: 126 B/min"
    );
    assert!(rows(&w, c).iter().all(|r| r.tx == 0 && r.rx == 0));
}

#[test]
fn vmware_rows_are_duration_times_an_integer_rate() {
    let mut w = world_with(Hypervisor::VMware, 2);
    let idle = running(&mut w, "idle", Some(Profile::IdleJoined));
    let wait = running(&mut w, "wait", Some(Profile::WaitingForEndpoint));
    w.advance_to(T0 + 30 * MIN);
    // 1.5 KiB/s → floor 1 → 60 KiB per 60-s row, from either server (not a partition).
    let r = rows(&w, idle);
    assert!(r.iter().skip(2).all(|x| Row::kib(x.tx) == 60.0));
    // 0.045 KiB/s → 0: a guest under 1 KB/s reads 0 on VMware.
    assert!(rows(&w, wait).iter().all(|x| x.tx == 0));
}

#[test]
fn xenserver_rows_are_average_rates() {
    let mut w = world_with(Hypervisor::XenServer, 1);
    let idle = running(&mut w, "idle", Some(Profile::IdleJoined));
    w.settings.stats_interval_seconds = 300;
    w.advance_to(T0 + 60 * MIN);
    // 1 536 B/s = 1.5 KB/s whatever the interval: a rate, not a volume.
    assert!(rows(&w, idle).iter().skip(1).all(|x| Row::kib(x.tx) == 1.5));
}

#[test]
fn the_collector_skips_connecting_maintenance_and_failing_hosts() {
    use HostStatus as S;
    use ResourceState as R;
    let mut w = world_with(Hypervisor::Kvm, 1);
    let a = running(&mut w, "a", None);
    w.advance_to(T0 + 5 * MIN);
    let mut expect = rows(&w, a).len();
    let cases = [
        (
            S::Connecting,
            R::Enabled,
            false,
            false,
            HostControl::Enabled,
        ),
        (
            S::Up,
            R::PrepareForMaintenance,
            false,
            false,
            HostControl::Maintenance,
        ),
        (
            S::Up,
            R::Maintenance,
            false,
            false,
            HostControl::Maintenance,
        ),
        (
            S::Up,
            R::ErrorInMaintenance,
            false,
            false,
            HostControl::Maintenance,
        ),
        (
            S::Up,
            R::ErrorInPrepareForMaintenance,
            false,
            false,
            HostControl::Maintenance,
        ),
        (
            S::Disconnected,
            R::Enabled,
            false,
            false,
            HostControl::Offline,
        ),
        (S::Up, R::Enabled, true, false, HostControl::Enabled),
        (S::Up, R::Disabled, false, true, HostControl::Disabled),
        (S::Up, R::Enabled, false, true, HostControl::Enabled),
    ];
    for (i, (st, rs, fails, collected, control)) in cases.into_iter().enumerate() {
        let t = w.now_ms();
        w.hosts[0].stats_collection_paused = fails;
        w.set_host_state(0, st, rs).unwrap();
        assert_eq!(w.hosts[0].control_state(), control, "case {i}");
        w.advance_to(t + 5 * MIN);
        let n = rows(&w, a).len();
        if collected {
            assert_eq!(n, expect + 5, "case {i}");
        } else {
            assert_eq!(n, expect, "case {i}: no rows");
        }
        expect = n;
    }
}

#[test]
fn expiring_rows_take_the_accumulated_listing_down_and_frozen_sums_stay() {
    let mut w = world_with(Hypervisor::Kvm, 1);
    w.settings.stats_retention_seconds = 10 * 60;
    let a = running(&mut w, "a", None);
    w.advance_to(T0 + 8 * MIN);
    let during_join = w.vm(a).unwrap().stats_view(true).unwrap();
    assert!(rows(&w, a).len() <= 8);
    // Collection off: no new rows, the sum stays until rows expire.
    w.settings.stats_interval_seconds = 0;
    w.advance_to(T0 + 9 * MIN);
    assert_eq!(
        w.vm(a).unwrap().stats_view(true).unwrap().tx_kib,
        during_join.tx_kib
    );
    w.settings.stats_interval_seconds = 60;
    w.advance_to(T0 + 40 * MIN);
    let idle = w.vm(a).unwrap().stats_view(true).unwrap();
    assert!(rows(&w, a).len() <= 11);
    assert!(
        idle.tx_kib < during_join.tx_kib,
        "boot/join rows expired: {} < {}",
        idle.tx_kib,
        during_join.tx_kib
    );
    // A VM created while collection is off has no stats at all.
    w.settings.stats_interval_seconds = 0;
    let b = running(&mut w, "b", None);
    w.advance_to(T0 + 50 * MIN);
    assert!(w.vm(b).unwrap().stats_view(true).is_none());
    w.advance_to(T0 + 80 * MIN);
    assert!(w.vm(a).unwrap().stats_view(true).is_none(), "all expired");
}

#[test]
fn a_clock_jump_of_a_day_equals_small_steps() {
    let mk = || {
        let mut w = world_with(Hypervisor::Kvm, 3);
        w.settings.stats_retention_seconds = 120 * 60;
        w.add_host("x", None, None, HostControl::Enabled).unwrap();
        w.hosts[1].hypervisor = Hypervisor::VMware;
        for i in 0..4 {
            let mut s = VmSpec::new(format!("v{i}"));
            s.guest = [GuestKind::Healthy, GuestKind::SlowBoot, GuestKind::Waiting][i % 3];
            w.add_vm(&s).unwrap();
        }
        w.schedule_fault(T0 + 3_600_000, 0, Fault::NicDown).unwrap();
        w
    };
    let (mut big, mut small) = (mk(), mk());
    let day = T0 + 86_400_000;
    big.advance_to(day);
    let mut t = T0;
    while t < day {
        t = (t + 7_000).min(day);
        small.advance_to(t);
    }
    for i in 0..4 {
        assert_eq!(rows(&big, i), rows(&small, i), "vm {i}");
        assert_eq!(
            big.vm(i).unwrap().stats_view(true),
            small.vm(i).unwrap().stats_view(true)
        );
    }
    // 120 min of rows from 3 servers (±1 at the window's edges).
    assert!((359..=361).contains(&rows(&big, 0).len()));
}

/// 10 000 VMs, 3 servers, 60 min retention, a jump of a day: at most 60 × 3 rows of 32 bytes
/// per VM ≈ 57.6 MB of rows (measured: under a second in release, a few in debug).
#[test]
fn ten_thousand_vms_advance_in_bounded_memory_and_time() {
    let mut w = world_with(Hypervisor::Kvm, 3);
    w.settings.stats_retention_seconds = 60 * 60;
    w.add_vms(10_000, "n", &VmSpec::new("t")).unwrap();
    let t0 = std::time::Instant::now();
    w.advance_to(T0 + 86_400_000);
    w.advance_to(T0 + 86_400_000 + 10 * MIN);
    let took = t0.elapsed();
    let total: usize = (0..10_000)
        .map(|i| w.vm(i).unwrap().stats_rows().len())
        .sum();
    assert!(total <= 10_000 * 61 * 3, "{total}");
    assert!(total >= 10_000 * 59 * 3, "{total}");
    assert!(took.as_secs() < 60, "{took:?}");
}
