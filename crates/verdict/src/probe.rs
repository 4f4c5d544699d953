//! The opt-in guest probe's decisions, pure: when a VM's address is worth an `arping` from its
//! network's virtual router, and what the answers say (docs/guest-probe.md).
//!
//! An ARP reply proves the guest's NIC link is up and its kernel answers, on any hypervisor,
//! so a VM that answers is never `False` from traffic. Repeated silence, together with
//! traffic that stayed flat, is `False` sooner than counters alone allow. Anything else — no
//! router, a failed job, an unreadable answer, a reply from another MAC — is no evidence.

use std::collections::VecDeque;
use std::net::Ipv4Addr;

use jiff::{SignedDuration, Timestamp};
use serde::Serialize;

use super::history::{Sighting, Traffic, VmHistory};
use super::traffic::cadence_in_force;
use super::{at, later, Graces, MachineFacts};
use cloudstack_api::model::VmState;

/// How the probe is paced; `Graces::probe` is `None` when the probe is off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeGraces {
    /// Unanswered attempts in a row (each at least `spacing` after the previous one) before
    /// "no reply" counts.
    pub attempts: u32,
    /// Between attempts while the guest does not answer.
    pub spacing: SignedDuration,
    /// After a reply (or an attempt without evidence), the next attempt no sooner than this.
    pub recheck: SignedDuration,
    /// How long after it went Running a guest never seen alive (no reply, no rise of its
    /// counter) may take to answer ARP: its kernel may still be booting. Its silence counts
    /// only after this.
    pub boot_grace: SignedDuration,
}

impl ProbeGraces {
    /// Derived from the stats interval, so that a faster-clocked test or demo scales with it:
    /// three attempts a quarter interval apart (all within one collection), a reply rechecked
    /// after half an interval, a whole interval for a fresh guest's boot (a cloud image's
    /// kernel answers ARP once DHCP configured it, seconds after the hypervisor starts it).
    pub fn from_stats_interval(stats_interval: SignedDuration) -> Self {
        let floor = SignedDuration::from_secs(1);
        Self {
            attempts: 3,
            spacing: (stats_interval / 4).max(floor),
            recheck: (stats_interval / 2).max(floor),
            boot_grace: stats_interval.max(floor),
        }
    }
}

/// What one attempt found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "answer", content = "why", rename_all = "snake_case")]
pub enum ProbeAnswer {
    /// The guest's NIC (its MAC, where CloudStack shows it) answered ARP.
    Reply,
    /// No answer to any request of the attempt.
    NoReply,
    /// Nothing learnt, and why (no router, job failed, unreadable output, another MAC…).
    NoEvidence(String),
}

/// One attempt: when it was started, from which router, and its answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProbeAttempt {
    pub at: Timestamp,
    /// The router's name (`r-12-VM`); empty when no router was found.
    pub router: String,
    pub answer: ProbeAnswer,
}

/// Attempts kept per VM: enough for a run of unanswered ones and the reply before it.
pub const ATTEMPTS_KEPT: usize = 8;

/// The probe's memory of one VM.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ProbeHistory {
    /// Newest last.
    pub attempts: VecDeque<ProbeAttempt>,
    /// An attempt was started at this time and has not finished.
    pub in_flight_since: Option<Timestamp>,
    /// Some attempt was answered since the VM last became Running.
    pub ever_answered: bool,
}

impl ProbeHistory {
    pub fn started(&mut self, now: Timestamp) {
        self.in_flight_since = Some(now);
    }

    pub fn record(&mut self, attempt: ProbeAttempt) {
        self.in_flight_since = None;
        self.ever_answered |= attempt.answer == ProbeAnswer::Reply;
        self.attempts.push_back(attempt);
        while self.attempts.len() > ATTEMPTS_KEPT {
            self.attempts.pop_front();
        }
    }

    /// Forget: the VM left Running, or its address changed.
    pub fn clear(&mut self) {
        self.attempts.clear();
        self.ever_answered = false;
        // An answer still on its way is about the guest as it was: the prober drops it.
        self.in_flight_since = None;
    }

    fn last(&self) -> Option<&ProbeAttempt> {
        self.attempts.back()
    }

    fn last_conclusive(&self) -> Option<&ProbeAttempt> {
        self.attempts
            .iter()
            .rev()
            .find(|a| !matches!(a.answer, ProbeAnswer::NoEvidence(_)))
    }

    /// The newest run of unanswered attempts (no reply between them), oldest first; attempts
    /// without evidence neither count nor break the run.
    fn unanswered_run(&self) -> Vec<&ProbeAttempt> {
        let mut run: Vec<&ProbeAttempt> = self
            .attempts
            .iter()
            .rev()
            .filter(|a| !matches!(a.answer, ProbeAnswer::NoEvidence(_)))
            .take_while(|a| a.answer == ProbeAnswer::NoReply)
            .collect();
        run.reverse();
        run
    }
}

/// The address a probe asks about: the VM's default NIC's IPv4 address on its network.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProbeNic {
    pub network_id: String,
    pub address: Ipv4Addr,
    /// Upper- or lower-case; compared without regard to case.
    pub mac: Option<String>,
}

/// A probe the caller should start now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeTarget {
    pub vm_id: String,
    pub nic: ProbeNic,
}

/// Whether `h`'s VM should be probed at `now`: probe on, a Running VM of a Machine without a
/// Node that is not being deleted, seen at the latest poll with an IPv4 address and nothing
/// else wrong that the table judges first, nothing in flight, spacing respected — and traffic
/// that looks silent: the counter did not rise at the latest poll (the first flat sample),
/// or its hypervisor's counters cannot tell low traffic from none.
pub fn probe_due(
    h: &VmHistory,
    machine: &MachineFacts,
    g: &Graces,
    now: Timestamp,
) -> Option<ProbeTarget> {
    let pg = g.probe.as_ref()?;
    if !probe_wanted(machine) || h.last_error.is_some() || h.absent_polls > 0 {
        return None;
    }
    let seen = h.sighting.as_ref()?;
    if seen.state != VmState::Running
        || h.host_unreachable_since.is_some()
        || h.nic_detached_since.is_some()
        || h.nic_no_address_since.is_some()
        || h.probe.in_flight_since.is_some()
    {
        return None;
    }
    let nic = seen.probe_nic.clone()?;
    // A run of unanswered attempts that does not count yet goes on quickly, whatever the
    // counter does (a rise after the fault can be a row of traffic from before it). A reply,
    // an attempt that could not tell (no router, a failed job), or silence that already counts
    // is asked again only after the recheck time.
    let run_going = following_up(h, pg);
    if let Some(last) = h.probe.last() {
        let wait = if run_going { pg.spacing } else { pg.recheck };
        if now.duration_since(last.at) < wait {
            return None;
        }
    }
    // A rising counter proves traffic on every hypervisor (VMware's and XenServer's only
    // cannot tell low traffic from none): ask only when it did not rise at the latest poll.
    if !run_going && !looks_flat(&h.traffic, h.last_success) {
        return None;
    }
    Some(ProbeTarget {
        vm_id: h.vm_id.clone(),
        nic,
    })
}

/// Whether the probe has anything to learn about a Machine's VM: only while the Machine has
/// no Node and is not being deleted. Once the Node is there its health is MHC's, and the
/// verdict no longer reads the probe; a deleting Machine's VM is expected to go. An answer
/// about any other VM — a job started before the Node appeared included — is a call for
/// nothing.
pub fn probe_wanted(machine: &MachineFacts) -> bool {
    !machine.has_node && !machine.deleting
}

/// The latest attempt went unanswered and the run does not count yet: the next attempt is a
/// follow-up, due after the spacing and before other VMs' attempts.
pub fn following_up(h: &VmHistory, pg: &ProbeGraces) -> bool {
    h.probe
        .last()
        .is_some_and(|a| a.answer == ProbeAnswer::NoReply)
        && counted_unanswered(h, pg).len() < pg.attempts.max(1) as usize
}

/// The counter did not rise at the latest successful poll (or is not reported at all).
fn looks_flat(t: &Traffic, last_poll: Option<Timestamp>) -> bool {
    match (t.last_value, t.last_rise) {
        (None, _) | (Some(_), None) => true,
        (Some(_), Some(rise)) => last_poll.is_none_or(|p| rise < p),
    }
}

/// What the probe says about a Running VM without a Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeEvidence {
    /// The latest conclusive attempt was answered, recently enough.
    Answers { router: String },
    /// Enough unanswered attempts in a row, and traffic stayed flat across them.
    Unanswered {
        router: String,
        attempts: u32,
        since: Timestamp,
    },
    /// Nothing the verdict may use.
    None,
}

/// Reads `h`'s probe history at `now`.
pub fn assess_probe(h: &VmHistory, seen: &Sighting, g: &Graces, now: Timestamp) -> ProbeEvidence {
    let Some(pg) = g.probe.as_ref() else {
        return ProbeEvidence::None;
    };
    let Some(latest) = h.probe.last_conclusive() else {
        return ProbeEvidence::None;
    };
    if latest.answer == ProbeAnswer::Reply {
        // A reply stands until a newer conclusive attempt, for as long as probing could have
        // renewed it: the recheck and a follow-up. When probing falls behind (a busy router,
        // the budget, a refused key) the counters judge again, as without the probe.
        let fresh = pg.recheck + pg.spacing * 2;
        return if now.duration_since(latest.at) <= fresh {
            ProbeEvidence::Answers {
                router: latest.router.clone(),
            }
        } else {
            ProbeEvidence::None
        };
    }
    let run = counted_unanswered(h, pg);
    let Some(first) = run.first() else {
        return ProbeEvidence::None;
    };
    if run.len() < pg.attempts.max(1) as usize {
        return ProbeEvidence::None;
    }
    if !flat_across(&h.traffic, seen, first.at, g) {
        return ProbeEvidence::None;
    }
    ProbeEvidence::Unanswered {
        router: latest.router.clone(),
        attempts: pg.attempts.max(1),
        since: first.at,
    }
}

/// The unanswered attempts of the newest run that count, oldest first: spaced apart (a burst
/// is one observation) and, for a guest never seen alive (no reply, no rise of its counter) —
/// it may still be booting — only those after its boot grace.
fn counted_unanswered<'h>(h: &'h VmHistory, pg: &ProbeGraces) -> Vec<&'h ProbeAttempt> {
    let alive_before = h.probe.ever_answered || h.traffic.rises > 0;
    let counts_from = match (alive_before, h.state_since) {
        (true, _) => None,
        (false, Some(running_since)) => Some(later(running_since, pg.boot_grace)),
        (false, None) => return Vec::new(),
    };
    let mut counted: Vec<&ProbeAttempt> = Vec::new();
    for a in h.probe.unanswered_run() {
        let after_grace = counts_from.is_none_or(|from| a.at >= from);
        let spaced = counted
            .last()
            .is_none_or(|prev| a.at.duration_since(prev.at) >= pg.spacing);
        if after_grace && spaced {
            counted.push(a);
        }
    }
    counted
}

/// Traffic stats are reported and show nothing sent after `since`: a rise of the counter
/// proves traffic in the collection interval of the row that caused it, which may predate
/// `since` by up to an interval plus the spacing of the polls that saw it; usage-history rows
/// date their own intervals.
pub fn flat_across(t: &Traffic, seen: &Sighting, since: Timestamp, g: &Graces) -> bool {
    if t.last_value.is_none() || seen.tx_kbs.is_none() {
        return false;
    }
    let cadence = cadence_in_force(t, g);
    let spacing = t
        .poll_spacing
        .unwrap_or(g.poll_interval)
        .max(g.poll_interval);
    let slack = SignedDuration::from_secs(5);
    if t.last_rise
        .is_some_and(|r| r >= later(since, cadence + spacing + slack))
    {
        return false;
    }
    let rows_after = t.rows.as_deref().is_some_and(|rows| {
        rows.iter()
            .any(|(ts, kib)| *kib > 0 && ts.0 >= later(since, cadence + slack))
    });
    !rows_after
}

/// The sentence the verdict's message uses for unanswered probes.
pub fn unanswered_message(
    router: &str,
    nic: Option<&ProbeNic>,
    attempts: u32,
    since: Timestamp,
) -> String {
    let to = nic.map_or(String::new(), |n| format!(" for {}", n.address));
    format!(
        "no ARP reply{to} from its virtual router {router} to {attempts} attempts since {}",
        at(since)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::PollOutcome;
    use crate::{evaluate, reason, Status};
    use cloudstack_api::model::{CsTime, VirtualMachine};

    fn at_s(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    /// The verdict table's test VM (tests.rs), Running on `hypervisor` with counter `tx`.
    fn vm(tx: u64, hypervisor: &str) -> VirtualMachine {
        let mut v = crate::tests::vm(VmState::Running);
        v.networkkbswrite = Some(tx);
        v.hypervisor = Some(hypervisor.into());
        v.created = Some(CsTime(at_s(-60)));
        v
    }

    fn graces() -> Graces {
        let g = Graces::default();
        Graces {
            probe: Some(ProbeGraces::from_stats_interval(g.stats_interval)),
            ..g
        }
    }

    /// Polls every 30 s from `from` to `to` with the counter `tx(t)`.
    fn polled(g: &Graces, hv: &str, from: i64, to: i64, tx: impl Fn(i64) -> u64) -> VmHistory {
        let mut h = VmHistory::new("vm-1");
        let mut t = from;
        while t <= to {
            h.record(PollOutcome::Seen(&vm(tx(t), hv)), at_s(t), g);
            t += 30;
        }
        h
    }

    fn attempt(h: &mut VmHistory, secs: i64, answer: ProbeAnswer) {
        h.probe.started(at_s(secs));
        h.probe.record(ProbeAttempt {
            at: at_s(secs),
            router: "r-4-VM".into(),
            answer,
        });
    }

    fn no_node() -> MachineFacts {
        MachineFacts::default()
    }

    #[test]
    fn only_a_machine_without_a_node_that_is_not_deleting_wants_the_probe() {
        assert!(probe_wanted(&no_node()));
        let node = MachineFacts {
            has_node: true,
            ..no_node()
        };
        assert!(!probe_wanted(&node));
        let deleting = MachineFacts {
            deleting: true,
            ..no_node()
        };
        assert!(!probe_wanted(&deleting));
        // An unlinked Node (no nodeRef yet) still leaves the Machine's VM to the probe.
        let unlinked = MachineFacts {
            unlinked_node: Some("w-1".into()),
            ..no_node()
        };
        assert!(probe_wanted(&unlinked));
    }

    /// A guest that sent a little while booting (its counter rose once, at 30 s: seen alive)
    /// and nothing since.
    fn went_quiet(t: i64) -> u64 {
        if t < 30 {
            5
        } else {
            6
        }
    }

    /// A busy guest: its counter rises once a minute (at polls 0, 60, 120, …).
    fn busy(t: i64) -> u64 {
        100 + (t / 60) as u64 * 10
    }

    #[test]
    fn off_without_probe_graces() {
        let g = Graces::default();
        let h = polled(&g, "KVM", 0, 90, |_| 5);
        assert_eq!(probe_due(&h, &no_node(), &g, at_s(90)), None);
    }

    #[test]
    fn a_flat_poll_makes_a_probe_due_a_rising_one_does_not() {
        let g = graces();
        let rising = polled(&g, "KVM", 0, 120, busy);
        assert_eq!(probe_due(&rising, &no_node(), &g, at_s(120)), None);
        let flat = polled(&g, "KVM", 0, 150, busy);
        let due = probe_due(&flat, &no_node(), &g, at_s(150)).expect("due");
        assert_eq!(due.nic.address, Ipv4Addr::new(10, 1, 1, 10));
        assert_eq!(due.nic.network_id, "net-1");
    }

    #[test]
    fn never_for_machines_with_a_node_or_being_deleted() {
        let g = graces();
        let h = polled(&g, "KVM", 0, 150, |_| 5);
        let node = MachineFacts {
            has_node: true,
            ..MachineFacts::default()
        };
        let deleting = MachineFacts {
            deleting: true,
            ..MachineFacts::default()
        };
        assert_eq!(probe_due(&h, &node, &g, at_s(150)), None);
        assert_eq!(probe_due(&h, &deleting, &g, at_s(150)), None);
        assert!(probe_due(&h, &no_node(), &g, at_s(150)).is_some());
    }

    #[test]
    fn a_rising_counter_spares_the_probe_on_every_hypervisor() {
        let g = graces();
        for hv in ["VMware", "XenServer"] {
            assert_eq!(
                probe_due(&polled(&g, hv, 0, 120, busy), &no_node(), &g, at_s(120)),
                None
            );
            assert!(probe_due(&polled(&g, hv, 0, 150, busy), &no_node(), &g, at_s(150)).is_some());
        }
    }

    #[test]
    fn spacing_after_silence_recheck_after_a_reply_and_one_in_flight() {
        let g = graces();
        let pg = g.probe.clone().unwrap();
        let mut h = polled(&g, "VMware", 0, 150, |_| 5);
        h.probe.started(at_s(150));
        assert_eq!(probe_due(&h, &no_node(), &g, at_s(155)), None, "in flight");
        h.probe.record(ProbeAttempt {
            at: at_s(150),
            router: "r-4-VM".into(),
            answer: ProbeAnswer::NoReply,
        });
        let next = 150 + pg.spacing.as_secs();
        assert_eq!(probe_due(&h, &no_node(), &g, at_s(next - 1)), None);
        assert!(probe_due(&h, &no_node(), &g, at_s(next)).is_some());
        attempt(&mut h, next, ProbeAnswer::Reply);
        let recheck = next + pg.recheck.as_secs();
        assert!(pg.recheck > pg.spacing);
        assert_eq!(probe_due(&h, &no_node(), &g, at_s(recheck - 1)), None);
        assert!(probe_due(&h, &no_node(), &g, at_s(recheck)).is_some());
    }

    #[test]
    fn silence_that_already_counts_is_rechecked_not_followed_up() {
        let g = graces();
        let pg = g.probe.clone().unwrap();
        let mut h = polled(&g, "VMware", 0, 120, went_quiet);
        for s in [60, 75, 90] {
            attempt(&mut h, s, ProbeAnswer::NoReply);
        }
        assert!(
            !following_up(&h, &pg),
            "three spaced unanswered attempts count already"
        );
        let recheck = 90 + pg.recheck.as_secs();
        assert_eq!(
            probe_due(&h, &no_node(), &g, at_s(90 + pg.spacing.as_secs())),
            None
        );
        assert!(probe_due(&h, &no_node(), &g, at_s(recheck)).is_some());
        // Two do not: the third is a follow-up after the spacing.
        let mut two = polled(&g, "VMware", 0, 120, went_quiet);
        attempt(&mut two, 60, ProbeAnswer::NoReply);
        attempt(&mut two, 75, ProbeAnswer::NoReply);
        assert!(following_up(&two, &pg));
        assert!(probe_due(&two, &no_node(), &g, at_s(90)).is_some());
    }

    #[test]
    fn a_run_of_unanswered_attempts_goes_on_while_a_late_row_lands() {
        let g = graces();
        let mut h = polled(&g, "KVM", 0, 150, busy);
        attempt(&mut h, 150, ProbeAnswer::NoReply);
        // The counter rises at 180 (a row from before the fault).
        h.record(PollOutcome::Seen(&vm(busy(180), "KVM")), at_s(180), &g);
        assert!(probe_due(&h, &no_node(), &g, at_s(180)).is_some());
    }

    #[test]
    fn a_reply_keeps_a_silent_counter_from_false() {
        let g = graces();
        // Flat for 10 minutes: counters alone say GuestNetworkSilent.
        let mut h = polled(&g, "KVM", 0, 600, |_| 5);
        h.traffic.server = Some(crate::StatsServer::from_capabilities(
            Some("4.19.0.0"),
            Some(720),
        ));
        h.traffic.counter_cadence = Some(SignedDuration::from_secs(60));
        let before = evaluate(&h, &no_node(), &g, at_s(600));
        assert_eq!(before.status, Status::False, "{before:?}");
        attempt(&mut h, 590, ProbeAnswer::Reply);
        let v = evaluate(&h, &no_node(), &g, at_s(600));
        assert_eq!(
            (v.status, v.reason),
            (Status::True, reason::VM_HEALTHY),
            "{v:?}"
        );
        assert!(v
            .message
            .contains("answers ARP from its virtual router r-4-VM"));
        // A reply nobody renewed for long stops counting: counters judge again.
        for t in (630..=900).step_by(30) {
            h.record(PollOutcome::Seen(&vm(5, "KVM")), at_s(t), &g);
        }
        let later = evaluate(&h, &no_node(), &g, at_s(900));
        assert_eq!(later.status, Status::False, "{later:?}");
    }

    #[test]
    fn three_spaced_unanswered_attempts_with_flat_traffic_are_false_on_any_hypervisor() {
        let g = graces();
        for hv in ["KVM", "VMware", "XenServer"] {
            let mut h = polled(&g, hv, 0, 120, went_quiet);
            for s in [60, 75, 90] {
                attempt(&mut h, s, ProbeAnswer::NoReply);
            }
            let v = evaluate(&h, &no_node(), &g, at_s(120));
            assert_eq!(
                (v.status, v.reason),
                (Status::False, reason::GUEST_NETWORK_SILENT),
                "{hv}: {v:?}"
            );
            assert!(
                v.message
                    .contains("no ARP reply for 10.1.1.10 from its virtual router r-4-VM"),
                "{}",
                v.message
            );
        }
    }

    #[test]
    fn fewer_or_bunched_attempts_are_not_enough() {
        let g = graces();
        let mut two = polled(&g, "VMware", 0, 120, went_quiet);
        attempt(&mut two, 60, ProbeAnswer::NoReply);
        attempt(&mut two, 75, ProbeAnswer::NoReply);
        assert_ne!(
            evaluate(&two, &no_node(), &g, at_s(120)).status,
            Status::False
        );
        let mut bunched = polled(&g, "VMware", 0, 120, went_quiet);
        for s in [60, 61, 62, 63] {
            attempt(&mut bunched, s, ProbeAnswer::NoReply);
        }
        assert_ne!(
            evaluate(&bunched, &no_node(), &g, at_s(120)).status,
            Status::False
        );
    }

    #[test]
    fn no_evidence_never_counts_and_a_reply_breaks_the_run() {
        let g = graces();
        let mut h = polled(&g, "VMware", 0, 150, went_quiet);
        attempt(&mut h, 60, ProbeAnswer::NoReply);
        attempt(&mut h, 75, ProbeAnswer::NoEvidence("router Stopped".into()));
        attempt(&mut h, 90, ProbeAnswer::NoEvidence("job failed".into()));
        attempt(&mut h, 105, ProbeAnswer::NoReply);
        assert_ne!(
            evaluate(&h, &no_node(), &g, at_s(110)).status,
            Status::False
        );
        attempt(&mut h, 120, ProbeAnswer::Reply);
        attempt(&mut h, 135, ProbeAnswer::NoReply);
        attempt(&mut h, 150, ProbeAnswer::NoReply);
        assert_ne!(
            evaluate(&h, &no_node(), &g, at_s(150)).status,
            Status::False
        );
        // Only NoEvidence: the verdict is what counters alone say (VMware: not judged).
        let mut blind = polled(&g, "VMware", 0, 150, |_| 5);
        for s in [60, 75, 90, 105] {
            attempt(&mut blind, s, ProbeAnswer::NoEvidence("no router".into()));
        }
        let v = evaluate(&blind, &no_node(), &g, at_s(150));
        assert_eq!(
            (v.status, v.reason),
            (Status::True, reason::VM_RUNNING),
            "{v:?}"
        );
    }

    #[test]
    fn traffic_after_the_first_unanswered_attempt_overrules_it() {
        let g = graces();
        // Rises at every poll until 240: traffic long after the attempts at 60..90.
        let mut h = polled(&g, "VMware", 0, 240, |t| 5 + t as u64);
        for s in [60, 75, 90] {
            attempt(&mut h, s, ProbeAnswer::NoReply);
        }
        assert_ne!(
            evaluate(&h, &no_node(), &g, at_s(240)).status,
            Status::False
        );
        // A row from before the attempts, seen right after them, does not.
        let mut late = polled(&g, "VMware", 0, 120, |t| {
            if t <= 90 {
                5 + t as u64
            } else {
                200
            }
        });
        for s in [60, 75, 90] {
            attempt(&mut late, s, ProbeAnswer::NoReply);
        }
        let v = evaluate(&late, &no_node(), &g, at_s(120));
        assert_eq!(v.status, Status::False, "{v:?}");
    }

    #[test]
    fn a_guest_never_seen_alive_gets_its_boot_grace() {
        let g = graces();
        let grace = g.probe.as_ref().unwrap().boot_grace.as_secs();
        assert_eq!(grace, 60);
        // Running since 0, never sent a byte, never answered: maybe still booting.
        let mut h = polled(&g, "VMware", 0, 120, |_| 5);
        for s in [20, 35, 50] {
            attempt(&mut h, s, ProbeAnswer::NoReply);
        }
        assert_ne!(evaluate(&h, &no_node(), &g, at_s(60)).status, Status::False);
        // Past the grace, three unanswered attempts count (the early ones do not).
        attempt(&mut h, 65, ProbeAnswer::NoReply);
        attempt(&mut h, 80, ProbeAnswer::NoReply);
        assert_ne!(evaluate(&h, &no_node(), &g, at_s(90)).status, Status::False);
        attempt(&mut h, 95, ProbeAnswer::NoReply);
        let v = evaluate(&h, &no_node(), &g, at_s(120));
        assert_eq!(v.status, Status::False, "{v:?}");
        assert!(
            v.message.contains("since 2027-01-15T08:01:05Z"),
            "{}",
            v.message
        );
        // One reply ever makes it a guest seen alive: its silence counts at once.
        let mut answered = polled(&g, "VMware", 0, 60, |_| 5);
        attempt(&mut answered, 10, ProbeAnswer::Reply);
        for s in [20, 35, 50] {
            attempt(&mut answered, s, ProbeAnswer::NoReply);
        }
        assert_eq!(
            evaluate(&answered, &no_node(), &g, at_s(60)).status,
            Status::False
        );
    }

    #[test]
    fn no_stats_at_all_is_not_flat_traffic() {
        let g = graces();
        let mut h = VmHistory::new("vm-1");
        let mut quiet = vm(0, "VMware");
        quiet.networkkbswrite = None;
        for t in (0..=120).step_by(30) {
            h.record(PollOutcome::Seen(&quiet), at_s(t), &g);
        }
        for s in [60, 75, 90] {
            attempt(&mut h, s, ProbeAnswer::NoReply);
        }
        assert_ne!(
            evaluate(&h, &no_node(), &g, at_s(120)).status,
            Status::False
        );
    }

    #[test]
    fn leaving_running_or_a_new_address_forgets_the_answers() {
        let g = graces();
        let mut h = polled(&g, "VMware", 0, 120, |_| 5);
        attempt(&mut h, 100, ProbeAnswer::Reply);
        let mut moved = vm(5, "VMware");
        moved.nics[0].ipaddress = Some("10.1.1.99".into());
        h.probe.started(at_s(140));
        h.record(PollOutcome::Seen(&moved), at_s(150), &g);
        assert!(h.probe.attempts.is_empty());
        assert_eq!(
            h.probe.in_flight_since, None,
            "the answer on its way is dropped"
        );
    }
}
