//! The verdict table, row by row, including the rows that must NOT turn False.

use jiff::{SignedDuration, Timestamp};
use proptest::prelude::*;

use super::engine::MachineFacts;
use super::history::{PollOutcome, StatsServer, VmHistory};
use super::{condition, evaluate, reason, Graces, Status, Verdict};
use cloudstack_api::model::{CsTime, HostControlState, Nic, UsageSample, VirtualMachine, VmState};

fn t0() -> Timestamp {
    "2026-03-01T10:00:00Z".parse().unwrap()
}

fn at(secs: i64) -> Timestamp {
    t0() + SignedDuration::from_secs(secs)
}

fn nic(ip: Option<&str>) -> Nic {
    Nic {
        id: Some("nic-1".into()),
        networkid: Some("net-1".into()),
        networkname: Some("shared".into()),
        ipaddress: ip.map(str::to_string),
        ip6address: None,
        isdefault: true,
        traffictype: Some("Guest".into()),
        network_type: Some("Shared".into()),
        macaddress: Some("02:00:00:00:00:01".into()),
    }
}

pub(crate) fn vm(state: VmState) -> VirtualMachine {
    VirtualMachine {
        id: "vm-1".into(),
        name: "demo-md-0-a".into(),
        displayname: None,
        state,
        zoneid: None,
        zonename: None,
        account: None,
        domainid: None,
        projectid: None,
        hostid: Some("host-1".into()),
        hostname: None,
        hostcontrolstate: Some(HostControlState::Enabled),
        haenable: None,
        created: Some(CsTime(at(-60))),
        lastupdated: None,
        nics: vec![nic(Some("10.1.1.10"))],
        networkkbswrite: Some(100),
        networkkbsread: Some(100),
        cpuused: None,
        jobid: None,
        jobstatus: None,
        hypervisor: Some("KVM".into()),
        templatename: None,
        serviceofferingname: None,
    }
}

fn running(tx: u64) -> VirtualMachine {
    let mut v = vm(VmState::Running);
    v.networkkbswrite = Some(tx);
    v
}

struct Run {
    h: VmHistory,
    g: Graces,
    m: MachineFacts,
    server: Option<StatsServer>,
    counter_cadence: Option<SignedDuration>,
}

/// CloudStack 4.18+ at its defaults: the counter is a sum, rows are kept 720 minutes.
fn server_418() -> StatsServer {
    StatsServer::from_capabilities(Some("4.18.1.0"), Some(720))
}

impl Run {
    fn new() -> Self {
        Self {
            h: VmHistory::new("vm-1"),
            g: Graces::default(),
            m: MachineFacts::default(),
            server: Some(server_418()),
            counter_cadence: Some(SignedDuration::from_secs(60)),
        }
    }

    fn seen(&mut self, secs: i64, v: &VirtualMachine) -> Verdict {
        self.h.record(PollOutcome::Seen(v), at(secs), &self.g);
        self.h.traffic.server = self.server;
        // As the scope's other, busy VMs show it: rows every 60 s.
        self.h.traffic.counter_cadence = self.counter_cadence;
        self.verdict(secs)
    }

    fn absent(&mut self, secs: i64) -> Verdict {
        self.h.record(PollOutcome::Absent, at(secs), &self.g);
        self.verdict(secs)
    }

    fn failed(&mut self, secs: i64) -> Verdict {
        self.h
            .record(PollOutcome::Failed("429 throttled"), at(secs), &self.g);
        self.verdict(secs)
    }

    fn verdict(&self, secs: i64) -> Verdict {
        evaluate(&self.h, &self.m, &self.g, at(secs))
    }

    /// Polls every 30 s from `from` to `to` (inclusive) with the VM `make(t)` returns.
    fn poll_range(&mut self, from: i64, to: i64, make: impl Fn(i64) -> VirtualMachine) -> Verdict {
        let mut last = None;
        let mut t = from;
        while t <= to {
            last = Some(self.seen(t, &make(t)));
            t += 30;
        }
        last.expect("at least one poll")
    }
}

fn assert_verdict(v: &Verdict, status: Status, reason: &str) {
    assert_eq!((v.status, v.reason), (status, reason), "verdict was {v:?}");
}

#[test]
fn running_with_addresses_and_rising_traffic_is_healthy() {
    let mut r = Run::new();
    let v = r.poll_range(0, 300, |t| running(100 + (t as u64 / 60) * 50));
    assert_verdict(&v, Status::True, reason::VM_HEALTHY);
    assert!(v.message.contains("10.1.1.10"), "{}", v.message);
}

#[test]
fn error_turns_false_only_after_a_confirming_poll() {
    let mut r = Run::new();
    let v = r.seen(0, &vm(VmState::Error));
    assert_verdict(&v, Status::Unknown, reason::VM_ERROR);
    assert!(v.next_change.is_some());
    let v = r.seen(30, &vm(VmState::Error));
    assert_verdict(&v, Status::False, reason::VM_ERROR);
}

#[test]
fn a_failed_poll_between_error_sightings_restarts_confirmation() {
    let mut r = Run::new();
    r.seen(0, &vm(VmState::Error));
    assert_verdict(
        &r.failed(30),
        Status::Unknown,
        reason::CLOUDSTACK_API_UNAVAILABLE,
    );
    assert_verdict(
        &r.seen(60, &vm(VmState::Error)),
        Status::Unknown,
        reason::VM_ERROR,
    );
    assert_verdict(
        &r.seen(90, &vm(VmState::Error)),
        Status::False,
        reason::VM_ERROR,
    );
}

#[test]
fn stopped_turns_false_after_its_grace() {
    let mut r = Run::new();
    assert_verdict(
        &r.seen(0, &vm(VmState::Stopped)),
        Status::Unknown,
        reason::VM_STOPPED,
    );
    assert_verdict(
        &r.seen(30, &vm(VmState::Stopped)),
        Status::Unknown,
        reason::VM_STOPPED,
    );
    assert_verdict(
        &r.seen(60, &vm(VmState::Stopped)),
        Status::False,
        reason::VM_STOPPED,
    );
    assert_verdict(
        &r.seen(90, &vm(VmState::Shutdown)),
        Status::Unknown,
        reason::VM_STOPPED,
    );
}

#[test]
fn a_deleting_machine_is_never_false() {
    let mut r = Run::new();
    r.m.deleting = true;
    for t in (0..600).step_by(30) {
        assert_ne!(r.seen(t, &vm(VmState::Stopped)).status, Status::False);
    }
    for t in (600..900).step_by(30) {
        let v = r.absent(t);
        assert_verdict(&v, Status::Unknown, reason::MACHINE_DELETING);
    }
}

#[test]
fn a_vm_missing_from_two_complete_listings_is_not_found() {
    let mut r = Run::new();
    r.seen(0, &running(100));
    assert_verdict(&r.absent(30), Status::Unknown, reason::VM_NOT_FOUND);
    let v = r.absent(60);
    assert_verdict(&v, Status::False, reason::VM_NOT_FOUND);
    assert!(v.message.contains("demo-md-0-a"), "{}", v.message);
}

#[test]
fn absences_separated_by_a_failed_poll_do_not_add_up() {
    let mut r = Run::new();
    r.absent(0);
    r.failed(30);
    assert_verdict(&r.absent(60), Status::Unknown, reason::VM_NOT_FOUND);
}

#[test]
fn destroyed_and_expunging_turn_false_after_two_polls() {
    for state in [VmState::Destroyed, VmState::Expunging] {
        let mut r = Run::new();
        assert_verdict(
            &r.seen(0, &vm(state.clone())),
            Status::Unknown,
            reason::VM_DESTROYED,
        );
        assert_verdict(&r.seen(30, &vm(state)), Status::False, reason::VM_DESTROYED);
    }
}

#[test]
fn transitions_turn_false_only_after_fifteen_minutes() {
    for state in [VmState::Starting, VmState::Stopping, VmState::Restoring] {
        let mut r = Run::new();
        let v = r.poll_range(0, 14 * 60 + 30, |_| vm(state.clone()));
        assert_verdict(&v, Status::Unknown, reason::VM_IN_TRANSITION);
        assert_eq!(v.next_change, Some(at(15 * 60)));
        let v = r.seen(15 * 60, &vm(state));
        assert_verdict(&v, Status::False, reason::VM_STUCK_IN_TRANSITION);
    }
}

#[test]
fn a_transition_of_a_machine_with_a_node_is_never_false() {
    let mut r = Run::new();
    r.m.has_node = true;
    let v = r.poll_range(0, 3600, |_| vm(VmState::Stopping));
    assert_verdict(&v, Status::Unknown, reason::VM_IN_TRANSITION);
}

#[test]
fn migrating_and_unrecognized_states_are_never_false() {
    let mut r = Run::new();
    let v = r.poll_range(0, 7200, |_| vm(VmState::Migrating));
    assert_verdict(&v, Status::Unknown, reason::VM_MIGRATING);
    for state in [VmState::Unknown, VmState::Other("Hibernating".into())] {
        let mut r = Run::new();
        let v = r.poll_range(0, 7200, |_| vm(state.clone()));
        assert_verdict(&v, Status::Unknown, reason::VM_STATE_UNRECOGNIZED);
    }
}

fn on_offline_host(tx: u64) -> VirtualMachine {
    let mut v = running(tx);
    v.hostcontrolstate = Some(HostControlState::Offline);
    v
}

#[test]
fn host_offline_alone_is_never_false() {
    let mut r = Run::new();
    let v = r.poll_range(0, 9 * 60 + 30, |_| on_offline_host(100));
    assert_verdict(&v, Status::Unknown, reason::HOST_UNREACHABLE);
    let v = r.poll_range(10 * 60, 3 * 3600, |_| on_offline_host(100));
    assert_verdict(&v, Status::Unknown, reason::HOST_UNREACHABLE);
    assert!(
        v.message.contains("not declared the host down"),
        "{}",
        v.message
    );
}

#[test]
fn host_offline_with_a_node_is_never_false() {
    let mut r = Run::new();
    r.m.has_node = true;
    let v = r.poll_range(0, 3600, |_| on_offline_host(100));
    assert_verdict(&v, Status::Unknown, reason::HOST_UNREACHABLE);
}

#[test]
fn a_host_coming_back_does_not_make_flat_traffic_look_silent() {
    let mut r = Run::new();
    r.poll_range(0, 120, |t| running(100 + t as u64));
    // Offline for 8 minutes: the counter cannot move while stats are not collected.
    r.poll_range(150, 630, |_| on_offline_host(220));
    let v = r.seen(660, &running(220));
    assert_eq!(v.status, Status::True, "{v:?}");
    // It rises again at the next stats sample.
    let v = r.poll_range(690, 900, |t| running(220 + t as u64));
    assert_verdict(&v, Status::True, reason::VM_HEALTHY);
}

#[test]
fn no_nic_turns_false_after_a_minute() {
    let mut r = Run::new();
    let detached = || {
        let mut v = running(100);
        v.nics.clear();
        v
    };
    let v = r.poll_range(0, 30, |_| detached());
    assert_verdict(&v, Status::Unknown, reason::NIC_DETACHED);
    assert_verdict(
        &r.seen(60, &detached()),
        Status::False,
        reason::NIC_DETACHED,
    );
}

#[test]
fn nic_changes_while_a_job_runs_are_waited_for() {
    let mut r = Run::new();
    let v = r.poll_range(0, 600, |_| {
        let mut v = running(100);
        v.nics.clear();
        v.jobid = Some("job-1".into());
        v.jobstatus = Some(0);
        v
    });
    assert_verdict(&v, Status::Unknown, reason::VM_RUNNING);
}

#[test]
fn a_stopped_vm_is_waited_for_while_a_job_or_ha_may_bring_it_back() {
    let mut r = Run::new();
    let v = r.poll_range(0, 1800, |_| {
        let mut v = vm(VmState::Stopped);
        v.jobid = Some("job-1".into());
        v
    });
    assert_verdict(&v, Status::Unknown, reason::VM_STOPPED);

    let mut r = Run::new();
    let ha = || {
        let mut v = vm(VmState::Stopped);
        v.haenable = Some(true);
        v
    };
    let v = r.poll_range(0, 570, |_| ha());
    assert_verdict(&v, Status::Unknown, reason::VM_STOPPED);
    assert_verdict(&r.seen(600, &ha()), Status::False, reason::VM_STOPPED);
}

#[test]
fn no_default_nic_among_several_is_detached() {
    let mut r = Run::new();
    let mut v = running(100);
    let mut second = nic(Some("10.2.2.2"));
    second.isdefault = false;
    v.nics[0].isdefault = false;
    v.nics.push(second);
    r.poll_range(0, 90, |_| v.clone());
    assert_verdict(&r.seen(120, &v), Status::False, reason::NIC_DETACHED);
}

#[test]
fn a_nic_without_address_turns_false_after_a_minute_but_l2_is_fine() {
    let mut r = Run::new();
    let mut v = running(100);
    v.nics[0].ipaddress = None;
    let verdict = r.poll_range(0, 30, |_| v.clone());
    assert_verdict(&verdict, Status::Unknown, reason::NIC_NO_ADDRESS);
    assert_verdict(&r.seen(60, &v), Status::False, reason::NIC_NO_ADDRESS);

    let mut r = Run::new();
    let mut l2 = running(100);
    l2.nics[0].ipaddress = None;
    l2.nics[0].network_type = Some("L2".into());
    let verdict = r.poll_range(0, 900, |t| {
        let mut v = l2.clone();
        v.networkkbswrite = Some(100 + t as u64);
        v
    });
    assert_verdict(&verdict, Status::True, reason::VM_HEALTHY);
}

#[test]
fn flat_guest_traffic_without_a_node_turns_false_after_the_sample_window() {
    let mut r = Run::new();
    // Window without usage history: (3 samples + 1) × 60 s = 240 s of flat counter.
    let v = r.poll_range(0, 210, |_| running(512));
    assert_verdict(&v, Status::True, reason::VM_RUNNING);
    assert_eq!(v.next_change, Some(at(240)));
    let v = r.seen(240, &running(512));
    assert_verdict(&v, Status::False, reason::GUEST_NETWORK_SILENT);
}

/// A new Machine's first condition waits for the samples that decide (one write, not a
/// provisional True and then the answer) — for a bounded time, and never where more samples
/// would not change the answer.
#[test]
fn a_verdict_waiting_for_traffic_samples_is_provisional_for_a_bounded_time() {
    // Rising traffic: provisional until the first rise shows, then VMHealthy for good.
    let mut r = Run::new();
    let first = r.seen(0, &running(100));
    assert_verdict(&first, Status::True, reason::VM_RUNNING);
    assert!(first.provisional, "{first:?}");
    let healthy = r.poll_range(30, 300, |t| running(100 + t as u64));
    assert_verdict(&healthy, Status::True, reason::VM_HEALTHY);
    assert!(!healthy.provisional);

    // Flat traffic: provisional while the window fills (it names when it ends), then False,
    // which is never provisional.
    let mut r = Run::new();
    let v = r.poll_range(0, 210, |_| running(512));
    assert!(v.provisional && v.next_change == Some(at(240)), "{v:?}");
    let v = r.seen(240, &running(512));
    assert_verdict(&v, Status::False, reason::GUEST_NETWORK_SILENT);
    assert!(!v.provisional);

    // No stats at all: provisional only while first samples may still come (two collection
    // intervals and a poll: 150 s at the defaults), then published as it is.
    let mut r = Run::new();
    let no_stats = |_| {
        let mut v = running(0);
        v.networkkbswrite = None;
        v
    };
    assert!(r.poll_range(0, 120, no_stats).provisional);
    let v = r.poll_range(150, 600, no_stats);
    assert_verdict(&v, Status::True, reason::VM_RUNNING);
    assert!(!v.provisional, "{v:?}");

    // Lasting reasons are never provisional: a hypervisor whose counters are not judged, a
    // Machine with a Node.
    let mut r = Run::new();
    let mut vmware = running(512);
    vmware.hypervisor = Some("VMware".into());
    let v = r.seen(0, &vmware);
    assert_verdict(&v, Status::True, reason::VM_RUNNING);
    assert!(!v.provisional, "{v:?}");
    let mut r = Run::new();
    r.m.has_node = true;
    assert!(!r.seen(0, &running(512)).provisional);
}

#[test]
fn flat_traffic_of_a_machine_with_a_node_is_not_judged() {
    let mut r = Run::new();
    r.m.has_node = true;
    let v = r.poll_range(0, 3600, |_| running(512));
    assert_verdict(&v, Status::True, reason::VM_RUNNING);
}

#[test]
fn slow_boot_with_slowly_rising_traffic_is_never_false() {
    let mut r = Run::new();
    // 20 minutes of a trickle: +1 KiB per 60 s stats sample.
    let v = r.poll_range(0, 20 * 60, |t| running(10 + (t as u64) / 60));
    assert_verdict(&v, Status::True, reason::VM_HEALTHY);
    for t in (0..=20 * 60).step_by(30) {
        assert_ne!(r.verdict(t).status, Status::False);
    }
}

#[test]
fn absent_stats_give_no_traffic_verdict() {
    let mut r = Run::new();
    let v = r.poll_range(0, 3600, |_| {
        let mut v = running(0);
        v.networkkbswrite = None;
        v
    });
    assert_verdict(&v, Status::True, reason::VM_RUNNING);
    assert!(v.message.contains("no traffic stats"), "{}", v.message);
}

fn sample(ts_secs: i64, tx: u64) -> UsageSample {
    UsageSample {
        timestamp: Some(CsTime(at(ts_secs))),
        networkkbswrite: Some(tx),
        networkkbsread: None,
    }
}

/// Rows every 60 s from `from` to `to` (inclusive), `tx(ts)` KiB each.
fn rows(from: i64, to: i64, tx: impl Fn(i64) -> u64) -> Vec<UsageSample> {
    (from..=to)
        .step_by(60)
        .map(|ts| sample(ts, tx(ts)))
        .collect()
}

impl Run {
    /// Polls every 30 s with the listing counter `counter(t)`; each poll also takes the usage
    /// history `history(t)` (as the shim does for VMs whose counter did not rise).
    fn poll_with_history(
        &mut self,
        from: i64,
        to: i64,
        counter: impl Fn(i64) -> u64,
        history: impl Fn(i64) -> Option<Vec<UsageSample>>,
    ) -> Verdict {
        let mut last = None;
        let mut t = from;
        while t <= to {
            self.seen(t, &running(counter(t)));
            let answer = history(t);
            self.h.record_usage(answer.as_deref(), at(t));
            last = Some(self.verdict(t));
            t += 30;
        }
        last.expect("at least one poll")
    }
}

/// A booting guest first shown healthy by a usage-history row and then by its rising counter
/// keeps one condition message: the source changing is no reason to rewrite the Machine.
#[test]
fn healthy_from_a_row_and_then_from_the_counter_reads_the_same() {
    let mut r = Run::new();
    let from_row = r.poll_with_history(0, 0, |_| 100, |t| Some(rows(-60, t, |_| 4)));
    assert_verdict(&from_row, Status::True, reason::VM_HEALTHY);
    assert!(
        r.h.traffic.last_rise.is_none(),
        "only the row can have said it"
    );
    let from_counter = r.poll_range(30, 120, |t| running(100 + t as u64));
    assert_verdict(&from_counter, Status::True, reason::VM_HEALTHY);
    assert_eq!(from_row.message, from_counter.message);
}

#[test]
fn zero_rows_and_a_flat_counter_over_three_collections_are_silent() {
    let mut r = Run::new();
    // NIC down at 0: the rows since hold 0 KiB, the accumulated counter stays at 512.
    let history = |t: i64| Some(rows(-300, t - t % 60, |ts| if ts <= 0 { 4 } else { 0 }));
    let v = r.poll_with_history(0, 150, |_| 512, history);
    assert_verdict(&v, Status::True, reason::VM_RUNNING);
    let v = r.poll_with_history(180, 210, |_| 512, history);
    assert_verdict(&v, Status::False, reason::GUEST_NETWORK_SILENT);
    assert!(
        v.message.contains("0 KiB in every stats sample"),
        "{}",
        v.message
    );
}

#[test]
fn steady_rows_of_three_kib_with_a_flat_latest_row_counter_are_healthy() {
    // The reported case: vm.stats.increment.metrics=false and a server that shows the latest
    // row (3 KiB) in the listing; usage-history rows each hold one interval's 3 KiB.
    let mut r = Run::new();
    let v = r.poll_with_history(0, 1800, |_| 3, |t| Some(rows(-300, t - t % 60, |_| 3)));
    assert_verdict(&v, Status::True, reason::VM_HEALTHY);
    for t in (0..=1800).step_by(30) {
        assert_ne!(r.verdict(t).status, Status::False, "at {t}");
    }
}

#[test]
fn zero_rows_of_a_quiet_guest_split_over_three_servers_are_outweighed_by_a_rising_counter() {
    // 2 KiB per minute read by three management servers: every row truncates to 0, the
    // accumulated counter (a sum of the untruncated rows) still rises by 2 KiB a minute.
    let mut r = Run::new();
    let history = |t: i64| {
        Some(
            (-300..=t - t % 20)
                .step_by(20)
                .map(|ts| sample(ts, 0))
                .collect::<Vec<_>>(),
        )
    };
    let v = r.poll_with_history(0, 1800, |t| 100 + 2 * (t as u64) / 60, history);
    for t in (0..=1800).step_by(30) {
        assert_ne!(r.verdict(t).status, Status::False, "at {t}");
    }
    assert_verdict(&v, Status::True, reason::VM_HEALTHY);
}

#[test]
fn zero_rows_prove_nothing_where_the_counter_cannot_confirm_them() {
    let zero = |t: i64| Some(rows(-300, t - t % 60, |_| 0));
    // A VM older than the stats retention: rows leave the sum as they arrive.
    let mut r = Run::new();
    r.server = Some(StatsServer::from_capabilities(Some("4.17.2.0"), Some(1)));
    let v = r.poll_with_history(0, 1800, |_| 40, zero);
    assert_verdict(&v, Status::True, reason::VM_RUNNING);
    assert!(
        v.message.contains("older than the stats retention"),
        "{}",
        v.message
    );
    // A server before 4.17 (no accumulate), and one whose capabilities were never read.
    for server in [
        Some(StatsServer::from_capabilities(Some("4.16.1.0"), Some(720))),
        None,
    ] {
        let mut r = Run::new();
        r.server = server;
        let v = r.poll_with_history(0, 1800, |_| 40, zero);
        assert_verdict(&v, Status::True, reason::VM_RUNNING);
    }
}

#[test]
fn a_guest_trickling_a_kilobyte_every_few_minutes_is_never_silent_and_never_flaps() {
    // Services failed after boot: NTP and ARP only, ~4 B/s. Every row truncates to 0 KiB,
    // the summed counter gains a KiB every 4 minutes. Usage history shows it, or not (project).
    for with_rows in [true, false] {
        let mut r = Run::new();
        let history = |t: i64| with_rows.then(|| rows(-300, t - t % 60, |_| 0));
        let v = r.poll_with_history(0, 3600, |t| 140 + (t / 240) as u64, history);
        for t in (0..=3600).step_by(30) {
            assert_ne!(
                r.verdict(t).status,
                Status::False,
                "rows {with_rows}, at {t}"
            );
        }
        assert_eq!(v.status, Status::True, "{v:?}");
    }
}

#[test]
fn a_counter_first_read_after_the_rows_went_to_zero_needs_twice_the_window() {
    // A restarted shim meets a VM whose rows have been 0 for ten minutes already.
    let mut r = Run::new();
    let history = |t: i64| Some(rows(-600, t - t % 60, |_| 0));
    let v = r.poll_with_history(0, 330, |_| 77, history);
    assert_verdict(&v, Status::True, reason::VM_RUNNING);
    assert!(v.message.contains("watched only since"), "{}", v.message);
    let v = r.poll_with_history(360, 360, |_| 77, history);
    assert_verdict(&v, Status::False, reason::GUEST_NETWORK_SILENT);
}

#[test]
fn a_counter_below_its_rows_is_no_sum_and_proves_nothing() {
    // A server that ignores accumulate shows the latest row (0) while the rows of the window
    // held the boot traffic: the flat 0 is not a flat sum.
    let mut r = Run::new();
    let history = |t: i64| Some(rows(-300, t - t % 60, |ts| if ts <= 0 { 40 } else { 0 }));
    let v = r.poll_with_history(0, 1800, |_| 0, history);
    assert_verdict(&v, Status::True, reason::VM_RUNNING);
    assert!(v.message.contains("does not sum"), "{}", v.message);
}

#[test]
fn rows_that_stopped_arriving_are_stale_not_silent() {
    let mut r = Run::new();
    // The host's collection stopped at 0 (a Connecting host, a failing stats call).
    let v = r.poll_with_history(0, 900, |_| 300, |_| Some(rows(-300, 0, |_| 0)));
    assert_verdict(&v, Status::True, reason::VM_RUNNING);
    assert!(v.message.contains("stale"), "{}", v.message);
}

#[test]
fn a_gap_in_the_rows_restarts_the_silent_window() {
    let mut r = Run::new();
    // Zero rows, then nothing from 120 to 480 (host skipped), then zero rows again.
    let history = |t: i64| {
        let mut v = rows(-300, 120.min(t - t % 60), |_| 0);
        if t >= 480 {
            v.extend(rows(480, t - t % 60, |_| 0));
        }
        Some(v)
    };
    let v = r.poll_with_history(0, 570, |_| 300, history);
    assert_ne!(v.status, Status::False, "{v:?}");
    let v = r.poll_with_history(600, 630, |_| 300, history);
    assert_verdict(&v, Status::False, reason::GUEST_NETWORK_SILENT);
}

#[test]
fn a_five_minute_cadence_stretches_the_window_to_fifteen_minutes() {
    let mut r = Run::new();
    let history = |t: i64| {
        Some(
            (-1800..=t - t.rem_euclid(300))
                .step_by(300)
                .map(|ts| sample(ts, if ts <= 0 { 5 } else { 0 }))
                .collect::<Vec<_>>(),
        )
    };
    let v = r.poll_with_history(0, 870, |_| 900, history);
    assert_ne!(v.status, Status::False, "{v:?}");
    let v = r.poll_with_history(900, 930, |_| 900, history);
    assert_verdict(&v, Status::False, reason::GUEST_NETWORK_SILENT);
    assert!(v.message.contains("stats every 5m"), "{}", v.message);
}

#[test]
fn a_vm_the_usage_history_does_not_show_is_judged_from_its_counter_alone() {
    // A VM of a project: the answer has no item for it.
    let mut r = Run::new();
    let v = r.poll_with_history(0, 210, |_| 512, |_| None);
    assert_verdict(&v, Status::True, reason::VM_RUNNING);
    let v = r.poll_with_history(240, 240, |_| 512, |_| None);
    assert_verdict(&v, Status::False, reason::GUEST_NETWORK_SILENT);
}

#[test]
fn the_counter_alone_waits_for_the_interval_its_scope_shows() {
    // A project VM (no usage history) whose counter is flat: while no VM of the scope has
    // shown how often rows arrive, nothing is judged; with rows every 5 minutes the window is
    // (3 + 1) × 5 min, not (3 + 1) × --stats-interval.
    let mut r = Run::new();
    r.counter_cadence = None;
    let v = r.poll_with_history(0, 1800, |_| 512, |_| None);
    assert_verdict(&v, Status::True, reason::VM_RUNNING);
    assert!(v.message.contains("not known yet"), "{}", v.message);
    let mut r = Run::new();
    r.counter_cadence = Some(SignedDuration::from_mins(5));
    let v = r.poll_with_history(0, 1170, |_| 512, |_| None);
    assert_verdict(&v, Status::True, reason::VM_RUNNING);
    let v = r.poll_with_history(1200, 1200, |_| 512, |_| None);
    assert_verdict(&v, Status::False, reason::GUEST_NETWORK_SILENT);
}

#[test]
fn the_counter_cadence_is_the_longest_gap_between_rises_of_busy_guests() {
    // Polls every 30 s, rows every 300 s: busy guests rise every 300 s (270 or 330 with the
    // phase), a guest that rose only once tells nothing.
    let mut busy = VmHistory::new("busy");
    let mut once = VmHistory::new("once");
    let g = Graces::default();
    for (i, t) in (0..=1500).step_by(30).enumerate() {
        let tx = 100 + (t / 300) as u64 * 7;
        busy.record(PollOutcome::Seen(&running(tx)), at(t), &g);
        once.record(
            PollOutcome::Seen(&running(if i > 20 { 9 } else { 8 })),
            at(t),
            &g,
        );
    }
    let cadence = super::traffic::counter_cadence([&busy.traffic, &once.traffic]);
    assert_eq!(cadence, Some(SignedDuration::from_secs(300)));
    assert_eq!(super::traffic::counter_cadence([&once.traffic]), None);
}

#[test]
fn traffic_on_vmware_and_xenserver_is_not_judged_unless_opted_in() {
    for hv in ["VMware", "XenServer", "Simulator"] {
        let mut r = Run::new();
        let zero = |t: i64| Some(rows(-300, t - t % 60, |_| 0));
        let v = r.poll_with_history_on(hv, 0, 1800, zero);
        assert_verdict(&v, Status::True, reason::VM_RUNNING);
        assert!(v.message.contains("not judged"), "{}", v.message);
        let mut r = Run::new();
        r.g.silence_hypervisors = vec!["kvm".into(), hv.to_ascii_lowercase()];
        let v = r.poll_with_history_on(hv, 0, 1800, zero);
        assert_verdict(&v, Status::False, reason::GUEST_NETWORK_SILENT);
    }
}

impl Run {
    fn poll_with_history_on(
        &mut self,
        hypervisor: &str,
        from: i64,
        to: i64,
        history: impl Fn(i64) -> Option<Vec<UsageSample>>,
    ) -> Verdict {
        let mut last = None;
        let mut t = from;
        while t <= to {
            let mut v = running(77);
            v.hypervisor = Some(hypervisor.into());
            self.seen(t, &v);
            self.h.record_usage(history(t).as_deref(), at(t));
            last = Some(self.verdict(t));
            t += 30;
        }
        last.expect("at least one poll")
    }
}

#[test]
fn a_host_in_maintenance_gives_no_traffic_evidence() {
    for state in [
        HostControlState::Maintenance,
        HostControlState::parse("PrepareForMaintenance"),
    ] {
        let mut r = Run::new();
        let v = r.poll_range(0, 1800, |_| {
            let mut v = running(512);
            v.hostcontrolstate = Some(state.clone());
            v
        });
        assert_verdict(&v, Status::True, reason::VM_RUNNING);
        assert!(v.message.contains("maintenance"), "{}", v.message);
    }
}

#[test]
fn stale_rows_do_not_hide_a_rising_counter() {
    let mut r = Run::new();
    let v = r.poll_with_history(0, 600, |t| 300 + t as u64, |_| Some(rows(-300, 0, |_| 0)));
    assert_verdict(&v, Status::True, reason::VM_HEALTHY);
}

#[test]
fn api_errors_and_stale_polls_are_unknown() {
    let mut r = Run::new();
    r.seen(0, &vm(VmState::Error));
    r.seen(30, &vm(VmState::Error));
    let v = r.failed(60);
    assert_verdict(&v, Status::Unknown, reason::CLOUDSTACK_API_UNAVAILABLE);
    assert!(v.message.contains("429"), "{}", v.message);
    let mut r = Run::new();
    r.seen(0, &vm(VmState::Error));
    r.seen(30, &vm(VmState::Error));
    // No poll at all for more than 3 intervals.
    assert_verdict(
        &r.verdict(30 + 91),
        Status::Unknown,
        reason::CLOUDSTACK_API_UNAVAILABLE,
    );
}

#[test]
fn a_matching_node_without_node_ref_blocks_false() {
    let mut r = Run::new();
    r.m.unlinked_node = Some("demo-md-0-a".into());
    r.seen(0, &vm(VmState::Error));
    let v = r.seen(30, &vm(VmState::Error));
    assert_verdict(&v, Status::Unknown, reason::NODE_NOT_LINKED);
    assert!(v.message.contains("VMError"), "{}", v.message);
}

#[test]
fn first_sighting_is_anchored_to_lastupdated_clamped_to_now() {
    let mut r = Run::new();
    let mut stopped = vm(VmState::Stopped);
    stopped.lastupdated = Some(CsTime(at(-600)));
    assert_verdict(&r.seen(0, &stopped), Status::False, reason::VM_STOPPED);
    // A CloudStack clock ahead of ours never makes a state older than our observation.
    let mut r = Run::new();
    stopped.lastupdated = Some(CsTime(at(3600)));
    assert_verdict(&r.seen(0, &stopped), Status::Unknown, reason::VM_STOPPED);
    assert_eq!(r.h.state_since, Some(at(0)));
}

#[test]
fn a_moved_lastupdated_restarts_the_state_clock() {
    let mut r = Run::new();
    r.g.anchor_to_lastupdated = false;
    let mut stopped = vm(VmState::Stopped);
    stopped.lastupdated = Some(CsTime(at(-10)));
    r.seen(0, &stopped);
    // Started and stopped again between polls: same state, new lastupdated.
    stopped.lastupdated = Some(CsTime(at(50)));
    assert_verdict(&r.seen(60, &stopped), Status::Unknown, reason::VM_STOPPED);
    assert_verdict(&r.seen(120, &stopped), Status::False, reason::VM_STOPPED);
}

#[test]
fn messages_do_not_change_while_the_situation_does_not() {
    let mut r = Run::new();
    let a = r.poll_range(0, 300, |_| vm(VmState::Stopped));
    let b = r.seen(330, &vm(VmState::Stopped));
    assert_eq!(a, b);
}

// ---- properties -------------------------------------------------------------------------

#[derive(Debug, Clone)]
enum Event {
    Seen {
        state: u8,
        nics: u8,
        host_offline: bool,
        tx: Option<u16>,
    },
    Absent,
    Failed,
}

fn state_of(i: u8) -> VmState {
    match i % 12 {
        0 => VmState::Starting,
        1 => VmState::Running,
        2 => VmState::Stopping,
        3 => VmState::Stopped,
        4 => VmState::Destroyed,
        5 => VmState::Expunging,
        6 => VmState::Migrating,
        7 => VmState::Error,
        8 => VmState::Unknown,
        9 => VmState::Shutdown,
        10 => VmState::Restoring,
        _ => VmState::Other("Future".into()),
    }
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        6 => (any::<u8>(), 0u8..4, any::<bool>(), proptest::option::of(any::<u16>()))
            .prop_map(|(state, nics, host_offline, tx)| Event::Seen { state, nics, host_offline, tx }),
        2 => Just(Event::Absent),
        2 => Just(Event::Failed),
    ]
}

fn replay(events: &[(Event, u16)], m: &MachineFacts, g: &Graces) -> (VmHistory, Timestamp) {
    let mut h = VmHistory::new("vm-1");
    let mut now = t0();
    for (e, gap) in events {
        now += SignedDuration::from_secs(i64::from(*gap));
        match e {
            Event::Seen {
                state,
                nics,
                host_offline,
                tx,
            } => {
                let mut v = vm(state_of(*state));
                v.nics = match nics {
                    0 => vec![],
                    1 => vec![nic(None)],
                    _ => vec![nic(Some("10.1.1.10"))],
                };
                if *host_offline {
                    v.hostcontrolstate = Some(HostControlState::Offline);
                }
                v.networkkbswrite = tx.map(u64::from);
                h.record(PollOutcome::Seen(&v), now, g);
            }
            Event::Absent => h.record(PollOutcome::Absent, now, g),
            Event::Failed => h.record(PollOutcome::Failed("timeout"), now, g),
        }
        let _ = evaluate(&h, m, g, now);
    }
    (h, now)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Whatever happened before, a failed latest poll never yields False.
    #[test]
    fn api_trouble_never_yields_false(
        events in proptest::collection::vec((event(), 1u16..900), 0..40),
        has_node in any::<bool>(),
        later in 0u16..3600,
    ) {
        let g = Graces::default();
        let m = MachineFacts { has_node, ..Default::default() };
        let (mut h, now) = replay(&events, &m, &g);
        let now = now + SignedDuration::from_secs(30);
        h.record(PollOutcome::Failed("HTTP 503 from a proxy"), now, &g);
        let v = evaluate(&h, &m, &g, now + SignedDuration::from_secs(i64::from(later)));
        prop_assert_eq!(v.status, Status::Unknown);
        prop_assert_eq!(v.reason, reason::CLOUDSTACK_API_UNAVAILABLE);
    }

    /// Without a poll for longer than the staleness bound, nothing is False either.
    #[test]
    fn stale_observations_never_yield_false(
        events in proptest::collection::vec((event(), 1u16..900), 1..40),
        extra in 1i64..100_000,
    ) {
        let g = Graces::default();
        let m = MachineFacts::default();
        let (h, _) = replay(&events, &m, &g);
        let last = h.last_success.unwrap_or(t0());
        let v = evaluate(&h, &m, &g, last + g.stale_after() + SignedDuration::from_secs(extra));
        prop_assert_ne!(v.status, Status::False);
    }

    /// `lastTransitionTime` moves exactly when the status changes.
    #[test]
    fn transition_time_only_moves_with_the_status(
        steps in proptest::collection::vec((0u8..3, 0usize..4, 1u16..600), 1..60),
    ) {
        let reasons = [reason::VM_HEALTHY, reason::VM_RUNNING, reason::VM_ERROR, reason::HOST_UNREACHABLE];
        let mut now = t0();
        let mut prev: Option<condition::ConditionState> = None;
        for (s, r, gap) in steps {
            now += SignedDuration::from_secs(i64::from(gap));
            let status = [Status::True, Status::False, Status::Unknown][usize::from(s)];
            let v = Verdict::new(status, reasons[r], format!("m{r}"));
            let next = condition::next_condition(prev.as_ref(), "CloudStackVMHealthy", &v, now);
            match &prev {
                Some(p) if p.status == next.status => {
                    prop_assert_eq!(p.last_transition_time, next.last_transition_time)
                }
                _ => prop_assert_eq!(next.last_transition_time, condition::whole_seconds(now)),
            }
            prev = Some(next);
        }
    }
}

/// Several VMs on one host, polled together, with the paused-collection check of every poll.
struct Host {
    vms: Vec<VmHistory>,
    g: Graces,
}

impl Host {
    fn new(n: usize) -> Self {
        Self {
            vms: (0..n).map(|i| VmHistory::new(format!("vm-{i}"))).collect(),
            g: Graces::default(),
        }
    }

    /// One poll at `secs` with each VM's counter; returns each VM's verdict.
    fn poll(&mut self, secs: i64, counters: &[u64]) -> Vec<Verdict> {
        for (h, tx) in self.vms.iter_mut().zip(counters) {
            h.record(PollOutcome::Seen(&running(*tx)), at(secs), &self.g);
            h.traffic.server = Some(server_418());
        }
        let cadence = super::traffic::counter_cadence(self.vms.iter().map(|h| &h.traffic));
        for h in &mut self.vms {
            h.traffic.counter_cadence = cadence;
        }
        super::mark_paused_collections(self.vms.iter_mut(), &self.g, at(secs));
        self.vms
            .iter()
            .map(|h| evaluate(h, &MachineFacts::default(), &self.g, at(secs)))
            .collect()
    }
}

/// A steady guest's counter as the stats collector reports it: +10 KiB per 60 s sample, frozen
/// while the collector does not read the host (the counter is cumulative, so it catches up).
fn collected(secs: i64, paused: std::ops::Range<i64>) -> u64 {
    let read_at = if paused.contains(&secs) {
        paused.start
    } else {
        secs
    };
    100 + 10 * (read_at / 60) as u64
}

#[test]
fn a_host_whose_stats_collection_pauses_is_not_a_host_of_silent_guests() {
    let mut host = Host::new(3);
    let pause = 600..1080; // 8 minutes without a collection for this host
    let mut paused_messages = 0;
    for t in (0..=1800).step_by(30) {
        let c = collected(t, pause.clone());
        for v in host.poll(t, &[c, c + 5, c + 7]) {
            assert_ne!(v.status, Status::False, "at {t}s: {v:?}");
            paused_messages += usize::from(v.message.contains("looks paused"));
        }
    }
    assert!(paused_messages > 0, "the pause was never recognised");
}

#[test]
fn a_silent_guest_next_to_steady_ones_still_turns_false() {
    let mut host = Host::new(3);
    let mut first_false = None;
    for t in (0..=900).step_by(30) {
        let c = collected(t, 0..0);
        // vm-2 sends until 300 s, then nothing.
        let quiet = collected(t.min(300), 0..0);
        let v = host.poll(t, &[c, c, quiet]);
        assert_ne!(v[0].status, Status::False);
        assert_ne!(v[1].status, Status::False);
        if v[2].status == Status::False && first_false.is_none() {
            first_false = Some(t);
            assert_eq!(v[2].reason, reason::GUEST_NETWORK_SILENT);
        }
    }
    let t = first_false.expect("the silent guest was never judged");
    assert!((540..=600).contains(&t), "False at {t}s");
}

#[test]
fn flat_time_seen_before_a_pause_is_still_evidence() {
    // vm-2 never sent anything after boot; its silence was seen while the collector still read
    // the host, so the later pause does not take its verdict back.
    let mut host = Host::new(3);
    let pause = 600..1080;
    for t in (0..=1200).step_by(30) {
        let c = collected(t, pause.clone());
        let v = host.poll(t, &[c, c, 50]);
        if t >= 300 {
            assert_eq!(v[2].status, Status::False, "at {t}s: {v:?}");
        }
    }
}

#[test]
fn a_guest_that_died_during_a_pause_is_judged_once_collection_resumes() {
    let mut host = Host::new(3);
    let pause = 600..1080;
    let mut first_false = None;
    for t in (0..=1500).step_by(30) {
        let c = collected(t, pause.clone());
        // vm-2 stops sending when the pause begins; its counter stays at the last collection.
        let died = collected(t.min(pause.start), 0..0);
        let v = host.poll(t, &[c, c, died]);
        if v[2].status == Status::False && first_false.is_none() {
            first_false = Some(t);
        }
    }
    let t = first_false.expect("never judged");
    // Not during the pause; as soon as a rise shows the collector reads the host again.
    assert!((1080..=1140).contains(&t), "False at {t}s");
}

#[test]
fn slow_polls_do_not_make_a_rising_counter_look_idle() {
    // A big fleet behind the rate limit: polls every 90 s instead of 30 s, stats every 60 s.
    let mut r = Run::new();
    for (i, t) in (0..=900).step_by(90).enumerate() {
        r.seen(t, &running(100 + i as u64 * 10));
    }
    // 150 s after the last rise: older than 2 stats intervals + the nominal 30 s poll, but
    // within 2 stats intervals + the 90 s the polls actually take.
    let now = at(900 + 150);
    assert!(super::traffic::rose_recently(&r.h.traffic, &r.g, now));
    assert!(!super::traffic::rose_recently(
        &r.h.traffic,
        &r.g,
        at(900 + 211)
    ));
    // The cap: a poll gap beyond the stale-poll age does not stretch the window further.
    let mut r = Run::new();
    r.seen(0, &running(100));
    r.seen(30, &running(110));
    r.seen(600, &running(120));
    assert!(!super::traffic::rose_recently(
        &r.h.traffic,
        &r.g,
        at(600 + 211)
    ));
}

#[test]
fn a_rise_seen_across_a_gap_is_activity_but_a_flat_counter_starts_over() {
    // Polls 120 s apart (beyond the 90 s stale-poll age, e.g. a huge fleet behind a rate limit).
    let mut r = Run::new();
    let mut v = r.seen(0, &running(100));
    for (i, t) in (120..=600).step_by(120).enumerate() {
        v = r.seen(t, &running(200 + i as u64 * 10));
        assert!(
            super::traffic::rose_recently(&r.h.traffic, &r.g, at(t)),
            "at {t}s"
        );
    }
    assert_verdict(&v, Status::True, reason::VM_HEALTHY);
    // The same counter flat across such a gap gives no silence verdict right away.
    let v = r.seen(720, &running(240));
    assert_ne!(v.status, Status::False);
    assert_eq!(r.h.traffic.flat_since, Some(at(720)));
}

/// A base instant anywhere jiff can represent, weighted to its two ends (where an addition
/// overflows) and to today, plus offsets: the times of one case lie near each other, as a
/// VM's rows, dates and the clock do — also when they are all absurd.
fn base_time() -> impl Strategy<Value = i64> {
    let (min, max) = (Timestamp::MIN.as_second(), Timestamp::MAX.as_second());
    prop_oneof![
        min..=max,
        (max - 5_000)..=max,
        min..=(min + 5_000),
        1_796_000_000i64..1_796_100_000,
    ]
}

fn near(base: i64, offset: i64) -> Timestamp {
    let (min, max) = (Timestamp::MIN.as_second(), Timestamp::MAX.as_second());
    Timestamp::from_second(base.saturating_add(offset).clamp(min, max)).expect("clamped")
}

fn any_state() -> impl Strategy<Value = VmState> {
    prop::sample::select(vec![
        VmState::Running,
        VmState::Stopped,
        VmState::Error,
        VmState::Starting,
        VmState::Destroyed,
        VmState::Migrating,
    ])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The whole decision pipeline — recording polls and usage rows, the paused-collection
    /// check, the record standing, the mass-failure guard and the next condition — never
    /// panics, whatever times the VM rows, CloudStack's dates, the published condition and the
    /// clock carry (a far-future date once overflowed an addition and crashed the controller).
    #[test]
    fn no_time_from_anywhere_panics_the_pipeline(
        base in base_time(),
        polls in proptest::collection::vec(
            (-5_000i64..5_000, any_state(), proptest::option::of(any::<u64>()),
             proptest::option::of(-5_000i64..5_000), proptest::option::of(-5_000i64..5_000)),
            1..6),
        rows in proptest::collection::vec((-5_000i64..5_000, any::<u64>()), 0..12),
        published in proptest::option::of((-5_000i64..5_000, 0usize..3, 0usize..20)),
        has_node in any::<bool>(),
        now in -5_000i64..5_000,
    ) {
        let now = near(base, now);
        let polls: Vec<_> = polls
            .into_iter()
            .map(|(t, st, tx, c, u)| (near(base, t), st, tx, c.map(|c| near(base, c)), u.map(|u| near(base, u))))
            .collect();
        let rows: Vec<_> = rows.into_iter().map(|(t, k)| (near(base, t), k)).collect();
        let published = published.map(|(t, st, r)| (near(base, t), st, r));
        let mut g = Graces::default();
        g.probe = Some(crate::probe::ProbeGraces::from_stats_interval(g.stats_interval));
        let mut h = VmHistory::new("vm-1");
        for (at_, state, tx, created, updated) in &polls {
            let mut v = vm(state.clone());
            v.networkkbswrite = *tx;
            v.created = created.map(CsTime);
            v.lastupdated = updated.map(CsTime);
            h.record(PollOutcome::Seen(&v), *at_, &g);
            let samples: Vec<UsageSample> = rows
                .iter()
                .map(|(t, kib)| UsageSample {
                    timestamp: Some(CsTime(*t)),
                    networkkbswrite: Some(*kib),
                    networkkbsread: None,
                })
                .collect();
            h.record_usage(Some(&samples), *at_);
        }
        let mut fleet = vec![&mut h];
        crate::mark_paused_collections(fleet.drain(..), &g, now);
        let condition = published.map(|(ltt, status, reason)| condition::ConditionState {
            type_: "CloudStackVMHealthy".into(),
            status: [Status::True, Status::False, Status::Unknown][status],
            reason: reason::ALL[reason % reason::ALL.len()].into(),
            message: "m".into(),
            last_transition_time: ltt,
        });
        let subjects = [crate::Subject {
            scope: Some("s"),
            evidence: crate::Evidence::Observed(&h),
            facts: MachineFacts { has_node, ..Default::default() },
            published: condition.as_ref(),
        }];
        let d = crate::decide(&subjects, &g, &crate::MassFailureGuard::default(), now);
        let c = d.conditions(&subjects, "CloudStackVMHealthy", now);
        prop_assert_eq!(c.len(), 1);
        // A held first write is held for a bounded time: a provisional verdict is True and
        // either names when it changes or is within its first samples' due time.
        if let Some(v) = &d.verdicts[0] {
            if v.provisional {
                prop_assert_eq!(v.status, Status::True);
                let first = h.first_observed.expect("observed");
                prop_assert!(
                    v.next_change.is_some()
                        || now.duration_since(first)
                            < crate::traffic::rise_fresh_within(&h.traffic, &g),
                    "{:?}", v
                );
            }
        }
    }
}

#[test]
fn a_clock_at_the_end_of_time_does_not_overflow_a_grace() {
    // Each of these added a grace to a time near the end of jiff's range and panicked.
    let g = Graces::default();
    let end = Timestamp::MAX - SignedDuration::from_secs(10);
    for state in [
        VmState::Error,
        VmState::Stopped,
        VmState::Starting,
        VmState::Destroyed,
    ] {
        let mut h = VmHistory::new("vm-1");
        h.record(PollOutcome::Seen(&vm(state)), end, &g);
        let v = evaluate(&h, &MachineFacts::default(), &g, end);
        assert_ne!(v.status, Status::False, "{v:?}");
    }
}

/// The old hand-written format, kept verbatim by the library printer: these strings are in
/// condition messages, and a different rendering would rewrite every Machine's condition.
#[test]
fn durations_read_as_before() {
    for (secs, text) in [
        (-5, "0s"),
        (0, "0s"),
        (1, "1s"),
        (59, "59s"),
        (60, "1m"),
        (75, "1m15s"),
        (200, "3m20s"),
        (3599, "59m59s"),
        (3600, "1h"),
        (3659, "1h"),
        (3720, "1h2m"),
        (86_400 + 61, "24h1m"),
        (172_800, "48h"),
    ] {
        assert_eq!(
            super::human_duration(SignedDuration::from_secs(secs)),
            text,
            "{secs} s"
        );
    }
}
