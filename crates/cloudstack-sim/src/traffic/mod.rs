//! Guest network traffic as bytes over continuous simulated time.
//!
//! What a hypervisor counts on a VM's tap devices is the guest's own traffic: libvirt's
//! `interfaceStats` reports the tap counters from the domain's point of view, summed over all
//! of the domain's interfaces (`LibvirtComputingResource.getVmStat@00114e8b`), so `tx` here is
//! what the guest sent (guest→host, `networkkbswrite`) and `rx` what it received
//! (host→guest, `networkkbsread`). There are no per-NIC counters: a VM with two NICs shows
//! the sum.
//!
//! A guest's traffic is a [`Plan`]: a few [`Profile`] phases with piecewise-constant rates, so
//! the true cumulative bytes at any instant are a closed-form function of the time since the
//! plan's anchor — O(number of phases) per evaluation, whatever the clock jumped. How the
//! management server turns these bytes into `vm_stats` rows is in `world::collector`.
//!
//! # The profiles and their numbers (bytes per second unless noted)
//!
//! Every NIC that is up also receives the L2 network's background: about one broadcast frame
//! per second (ARP requests of other hosts, IPv6 router advertisements), 60–110 bytes, taken
//! as **80 B/s** host→guest ([`BACKGROUND_RX`]).
//!
//! | profile | guest→host (tx) | host→guest (rx) |
//! |---|---|---|
//! | `boot` 0–5 s (DHCP, ARP probes, router solicitation) | 200 | 160 |
//! | `boot` 5–30 s (cloud-init: meta-data, user-data, vendor-data from the virtual router) | 480 | 1 600 |
//! | `boot` 30 s–end (small image pulls; the guest sends TCP ACKs: one 66-byte ACK per two 1448-byte segments ≈ 2.3 %) | 4 700 | 204 800 |
//! | `kubeadm-join` (TLS bootstrap, CSR, config fetches, kubelet start, first watches) | 6 144 | 16 384 |
//! | `idle-joined` (kubelet status every 10 s, lease renewals, watch events) | 1 536 | 1 280 |
//! | `waiting-for-endpoint` (SYN variant) | 45.8 | 81.4 |
//! | `waiting-for-endpoint-arp` | 26.6 | 81.4 |
//! | `quiet` (services failed: NTP, gateway ARP, MLD only) | 4.3 | 81.4 |
//! | `nic-down` | 0 | 80 until the RX ring is full (20 480 bytes), then 0 |
//! | `one-nic-down` (second NIC up, default NIC down) | 2.1 | 80 + the default NIC's ring filling (≤ 20 480 bytes) |
//! | `silent` (no NIC attached) | 0 | 0 |
//!
//! The boot sub-phase boundaries (5 s, 30 s of a 90 s boot) scale with the boot duration
//! setting so that compressed scenarios keep the same shape.
//!
//! ## Estimate: a guest waiting for an API endpoint that is not up yet
//!
//! kubeadm's discovery (join) or `kubeadm init`'s wait retries its request to the control-plane
//! endpoint about every **5 s**. Each attempt is one of:
//!
//! * **ARP variant** — the endpoint is an unclaimed VIP on the guest's own L2 network: Linux
//!   resolves the neighbour with `mcast_solicit = 3` broadcast ARP requests (1 s apart) and the
//!   SYN never leaves. An ARP request is a 42-byte frame (14 Ethernet + 28 ARP); it is padded to
//!   the 60-byte minimum only by a physical NIC on the wire — the tap counts what virtio-net
//!   passed, 42 bytes. Per attempt 3 × 42 = 126 B → 126 / 5 s = **25.2 B/s**.
//! * **SYN variant** — the endpoint is a VIP behind the virtual router (the usual CAPC
//!   load-balancer rule): the gateway's MAC is cached, the guest sends a SYN (74-byte frame: 14 +
//!   20 IP + 40 TCP with options) and retransmits it after 1 s and 3 s (RTO doubling) within the
//!   5 s attempt: 3 × 74 = 222 B → **44.4 B/s**. Nothing answers (no listener behind the rule,
//!   the router drops), so nothing comes back.
//! * **NTP** in both: chrony / systemd-timesyncd poll every 64 s at start; one 90-byte packet
//!   (14 + 20 + 8 UDP + 48 NTP) each way per poll → **1.4 B/s** each way.
//!
//! So guest→host is 25.2 + 1.4 = **26.6 B/s ≈ 1.56 KiB/min** (ARP) or 44.4 + 1.4 = **45.8 B/s ≈
//! 2.68 KiB/min** (SYN); host→guest is the 80 B/s background + 1.4 B/s of NTP replies. Per
//! 60-s KVM row that is 1.56 / 2.68 KiB written — small but never 0; on VMware (integer KB/s
//! averages) it reads 0.
//!
//! `quiet` (services failed after boot) keeps only NTP (1.4 B/s), a gateway ARP refresh (42 B
//! every 30 s, 1.4 B/s) and an MLDv2 report (90 B a minute, 1.5 B/s): 4.3 B/s ≈ 258 B/min.

mod host;

pub use host::{cpu_centi, disk_bytes, format_cpu, mix};

use super::world::Ms;

/// Host→guest background of an L2 network: ~1 broadcast frame of ~80 bytes per second.
pub const BACKGROUND_RX: u64 = 80;
/// Bytes a guest's virtio RX ring holds when the guest stops consuming it: 256 descriptors ×
/// ~80-byte broadcast frames.
pub const RX_RING_BYTES: u64 = 256 * 80;

/// What a guest does with its network, seen from the hypervisor's tap devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Profile {
    Boot,
    KubeadmJoin,
    /// kubeadm retrying an endpoint behind the virtual router (SYN + retransmits, NTP).
    WaitingForEndpoint,
    /// kubeadm retrying an unclaimed VIP on the same L2 (3 ARP requests per attempt, NTP).
    WaitingForEndpointArp,
    IdleJoined,
    /// Services failed after boot: NTP/ARP/MLD-level traffic only.
    Quiet,
    NicDown,
    OneNicDown,
    Silent,
}

impl Profile {
    pub const ALL: [Profile; 9] = [
        Profile::Boot,
        Profile::KubeadmJoin,
        Profile::WaitingForEndpoint,
        Profile::WaitingForEndpointArp,
        Profile::IdleJoined,
        Profile::Quiet,
        Profile::NicDown,
        Profile::OneNicDown,
        Profile::Silent,
    ];

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Boot => "boot",
            Self::KubeadmJoin => "kubeadm-join",
            Self::WaitingForEndpoint => "waiting-for-endpoint",
            Self::WaitingForEndpointArp => "waiting-for-endpoint-arp",
            Self::IdleJoined => "idle-joined",
            Self::Quiet => "quiet",
            Self::NicDown => "nic-down",
            Self::OneNicDown => "one-nic-down",
            Self::Silent => "silent",
        }
    }

    pub fn names() -> String {
        Self::ALL.map(Profile::as_str).join(", ")
    }
}

/// Rates in milli-bytes per second (integers keep the closed form exact).
#[derive(Debug, Clone, Copy)]
struct Rate {
    tx: u64,
    rx: u64,
}

const DHCP: Rate = Rate {
    tx: 200_000,
    rx: 160_000,
};
const METADATA: Rate = Rate {
    tx: 480_000,
    rx: 1_600_000,
};
const PULLS: Rate = Rate {
    tx: 4_700_000,
    rx: 204_800_000,
};
const JOIN: Rate = Rate {
    tx: 6_144_000,
    rx: 16_384_000,
};
const IDLE: Rate = Rate {
    tx: 1_536_000,
    rx: 1_280_000,
};
/// NTP: one 90-byte packet each way per 64-s poll.
const NTP: u64 = 90_000 * 1000 / 64_000;
const WAIT_SYN: Rate = Rate {
    tx: 3 * 74 * 1000 / 5 + NTP,
    rx: BACKGROUND_RX * 1000 + NTP,
};
const WAIT_ARP: Rate = Rate {
    tx: 3 * 42 * 1000 / 5 + NTP,
    rx: BACKGROUND_RX * 1000 + NTP,
};
/// NTP + gateway ARP refresh (42 B / 30 s) + MLDv2 report (90 B / 60 s).
const QUIET: Rate = Rate {
    tx: NTP + 42 * 1000 / 30 + 90 * 1000 / 60,
    rx: BACKGROUND_RX * 1000 + NTP,
};
/// The second NIC of `one-nic-down`: ARP on its network, 42 B every 20 s.
const SECOND_NIC_TX: u64 = 42 * 1000 / 20;

/// `rate` (mB/s) over `ms` milliseconds, in bytes.
fn over(rate: u64, ms: Ms) -> u64 {
    let ms = ms.max(0) as u128;
    (u128::from(rate) * ms / 1_000_000).min(u128::from(u64::MAX)) as u64
}

/// Timing the profiles depend on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Duration of the boot phase (DHCP, cloud-init, pulls).
    pub boot_ms: Ms,
    /// Duration of the kubeadm-join phase.
    pub join_ms: Ms,
    /// How many times faster than simulated time a guest lives, in thousandths (1000 = real
    /// time). A compressed scenario, where 6 s stand for a minute, sets 10 000: the guest then
    /// sends a real minute's bytes in 6 s, so per-interval volumes match a real cloud's.
    pub speed_permille: u64,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            boot_ms: 90_000,
            join_ms: 180_000,
            speed_permille: 1000,
        }
    }
}

impl Timing {
    /// End of the DHCP sub-phase of boot (5 s of a 90 s boot).
    pub fn dhcp_ms(&self) -> Ms {
        self.boot_ms / 18
    }
    fn metadata_end_ms(&self) -> Ms {
        self.boot_ms / 3
    }
}

/// Cumulative (rx, tx) bytes of `p` after `dt` ms in the phase.
pub fn profile_bytes(p: Profile, dt: Ms, t: Timing) -> (u64, u64) {
    // In guest time: the phase's elapsed time and its sub-phase boundaries, sped up alike.
    let speed = |ms: Ms| ms.saturating_mul(t.speed_permille as Ms) / 1000;
    let (dt, t) = (
        speed(dt),
        Timing {
            boot_ms: speed(t.boot_ms),
            join_ms: speed(t.join_ms),
            speed_permille: 1000,
        },
    );
    let lin = |r: Rate| (over(r.rx, dt), over(r.tx, dt));
    match p {
        Profile::Boot => {
            let (d, m) = (t.dhcp_ms(), t.metadata_end_ms());
            let seg = |r: Rate, a: Ms, b: Ms| {
                let span = dt.min(b) - a;
                if span > 0 {
                    (over(r.rx, span), over(r.tx, span))
                } else {
                    (0, 0)
                }
            };
            let parts = [seg(DHCP, 0, d), seg(METADATA, d, m), seg(PULLS, m, Ms::MAX)];
            parts.iter().fold((0, 0), |(a, b), (x, y)| (a + x, b + y))
        }
        Profile::KubeadmJoin => lin(JOIN),
        Profile::IdleJoined => lin(IDLE),
        Profile::WaitingForEndpoint => lin(WAIT_SYN),
        Profile::WaitingForEndpointArp => lin(WAIT_ARP),
        Profile::Quiet => lin(QUIET),
        Profile::NicDown => (
            (BACKGROUND_RX * dt.max(0) as u64 / 1000).min(RX_RING_BYTES),
            0,
        ),
        Profile::OneNicDown => {
            let ring = (BACKGROUND_RX * dt.max(0) as u64 / 1000).min(RX_RING_BYTES);
            (
                over(BACKGROUND_RX * 1000, dt) + ring,
                over(SECOND_NIC_TX, dt),
            )
        }
        Profile::Silent => (0, 0),
    }
}

/// Phases of a plan: a profile and how long it lasts (the last one lasts forever).
pub const MAX_PHASES: usize = 4;

/// A guest's traffic from its anchor time on: up to [`MAX_PHASES`] profiles in sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    phases: [(Profile, Ms); MAX_PHASES],
    len: u8,
    pub timing: Timing,
}

impl Plan {
    /// A plan from `(profile, duration_ms)` phases; the last phase's duration is ignored.
    /// Zero-length phases are dropped; at most [`MAX_PHASES`] are kept.
    pub fn new(phases: &[(Profile, Ms)], timing: Timing) -> Self {
        let mut out = [(Profile::Silent, 0); MAX_PHASES];
        let mut len = 0usize;
        let last = phases.len().saturating_sub(1);
        for (i, (p, d)) in phases.iter().enumerate() {
            if len == MAX_PHASES || (i != last && *d <= 0) {
                continue;
            }
            out[len] = (*p, if i == last { Ms::MAX } else { *d });
            len += 1;
        }
        if len == 0 {
            len = 1;
        }
        out[len - 1].1 = Ms::MAX;
        Self {
            phases: out,
            len: len as u8,
            timing,
        }
    }

    /// One profile forever.
    pub fn constant(p: Profile, timing: Timing) -> Self {
        Self::new(&[(p, Ms::MAX)], timing)
    }

    pub fn phases(&self) -> &[(Profile, Ms)] {
        &self.phases[..usize::from(self.len)]
    }

    /// Cumulative (rx, tx) bytes `dt` ms after the anchor (0 before it).
    pub fn bytes(&self, dt: Ms) -> (u64, u64) {
        let mut start: Ms = 0;
        let (mut rx, mut tx) = (0u64, 0u64);
        for (p, d) in self.phases() {
            if dt <= start {
                break;
            }
            let span = (dt - start).min(*d);
            let (r, t) = profile_bytes(*p, span, self.timing);
            rx = rx.saturating_add(r);
            tx = tx.saturating_add(t);
            start = start.saturating_add(*d);
        }
        (rx, tx)
    }

    /// The profile in force `dt` ms after the anchor.
    pub fn profile_at(&self, dt: Ms) -> Profile {
        let mut start: Ms = 0;
        for (p, d) in self.phases() {
            if dt < start.saturating_add(*d) {
                return *p;
            }
            start = start.saturating_add(*d);
        }
        self.phases()[usize::from(self.len) - 1].0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: Timing = Timing {
        boot_ms: 90_000,
        join_ms: 180_000,
        speed_permille: 1000,
    };

    #[test]
    fn a_sped_up_guest_sends_a_real_minute_of_bytes_in_a_compressed_minute() {
        let fast = Timing {
            boot_ms: 9_000,
            join_ms: 18_000,
            speed_permille: 10_000,
        };
        for p in [
            Profile::Boot,
            Profile::WaitingForEndpointArp,
            Profile::NicDown,
        ] {
            assert_eq!(
                profile_bytes(p, 6_000, fast),
                profile_bytes(p, 60_000, T),
                "{p:?}"
            );
        }
    }

    #[test]
    fn waiting_for_endpoint_sends_the_estimated_bytes_per_minute() {
        // ARP: 126 B / 5 s + NTP 90 B / 64 s = 26.6 B/s; SYN: 222 B / 5 s + NTP = 45.8 B/s.
        let (_, arp) = profile_bytes(Profile::WaitingForEndpointArp, 60_000, T);
        let (rx, syn) = profile_bytes(Profile::WaitingForEndpoint, 60_000, T);
        assert_eq!(arp, 1596, "≈ 1.56 KiB/min");
        assert_eq!(syn, 2748, "≈ 2.68 KiB/min");
        assert!((1536..=3072).contains(&arp) && (1536..=3072).contains(&syn));
        assert!(rx > 0 && rx < 6 * 1024, "a little host→guest: {rx}");
    }

    #[test]
    fn nic_down_sends_nothing_and_receives_until_the_ring_is_full() {
        assert_eq!(profile_bytes(Profile::NicDown, 3_600_000, T).1, 0);
        let (a, _) = profile_bytes(Profile::NicDown, 100_000, T);
        let (b, _) = profile_bytes(Profile::NicDown, 200_000, T);
        let (c, _) = profile_bytes(Profile::NicDown, 3_600_000, T);
        assert!(a < b && b < c);
        assert_eq!(c, RX_RING_BYTES);
        assert_eq!(
            profile_bytes(Profile::NicDown, 7_200_000, T).0,
            c,
            "flat once full"
        );
    }

    #[test]
    fn one_nic_down_shows_only_the_second_nics_small_traffic() {
        let (rx, tx) = profile_bytes(Profile::OneNicDown, 60_000, T);
        assert_eq!(tx, 126, "ARP on the second NIC only");
        assert!(rx >= 60 * BACKGROUND_RX, "the second NIC still receives");
        let (rx2, _) = profile_bytes(Profile::OneNicDown, 7_200_000, T);
        assert_eq!(
            rx2,
            7_200 * BACKGROUND_RX + RX_RING_BYTES,
            "sum over both NICs"
        );
    }

    #[test]
    fn plans_are_piecewise_and_monotone() {
        let p = Plan::new(
            &[
                (Profile::Boot, T.boot_ms),
                (Profile::KubeadmJoin, T.join_ms),
                (Profile::IdleJoined, 0),
            ],
            T,
        );
        assert_eq!(p.profile_at(0), Profile::Boot);
        assert_eq!(p.profile_at(100_000), Profile::KubeadmJoin);
        assert_eq!(p.profile_at(86_400_000), Profile::IdleJoined);
        let mut last = (0, 0);
        for s in (0..4_000).map(|i| i * 250) {
            let b = p.bytes(s);
            assert!(b.0 >= last.0 && b.1 >= last.1);
            last = b;
        }
        // Boot ends, join adds exactly its rate × duration.
        let boot = p.bytes(T.boot_ms);
        let join = p.bytes(T.boot_ms + T.join_ms);
        assert_eq!(join.1 - boot.1, 6_144 * 180);
        assert_eq!(Plan::new(&[], T).bytes(1_000), (0, 0));
    }

    #[test]
    fn profile_names_round_trip() {
        for p in Profile::ALL {
            assert_eq!(Profile::parse(p.as_str()), Some(p));
        }
        assert_eq!(Profile::parse("zombie"), None);
    }
}
