//! Hypervisor-style cumulative counters as a pure, closed-form function of the number of
//! stats intervals a VM has been running.
//!
//! A running VM's counters are sums of per-interval rates. Interval `j = 0` is the boot
//! interval (DHCP, image reads); later intervals depend on the guest's [`Behaviour`]. Rates
//! are piecewise constant, so the sum over any interval range is computed in O(1) — a clock
//! jump of a day costs the same as one interval. A behaviour change (a fault) "folds" the
//! counters: the value at the change becomes the new base and summing continues with the
//! new behaviour (see `Traffic`).

/// What the guest does with its network, as seen from the hypervisor's tap device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Boot traffic, then steady two-way traffic.
    Healthy,
    /// Boot traffic (DHCP) in the first interval, then guest→host (`networkkbswrite`) stays
    /// flat while host→guest (`networkkbsread`) still rises slightly (broadcasts, ARP).
    NicDown,
    /// Small but rising traffic until the slow-boot window ends, then healthy.
    SlowBoot,
    /// No NIC: no network traffic at all.
    Silent,
}

/// Parameters the rates depend on.
#[derive(Debug, Clone, Copy)]
pub struct RateParams {
    /// Stats interval in seconds (> 0).
    pub interval_s: u64,
    /// Number of intervals (counted from boot) a slow-boot guest stays slow.
    pub slow_intervals: u64,
}

/// KiB sent during the boot interval (host→guest, guest→host).
const BOOT_RX: u64 = 480;
const BOOT_TX: u64 = 96;
/// Steady-state rates in KiB per second.
const STEADY_RX_PER_S: u64 = 24;
const STEADY_TX_PER_S: u64 = 12;

/// Per-interval rate (rx, tx) in KiB for interval `j` counted from boot.
pub fn rate(b: Behaviour, j: u64, p: RateParams) -> (u64, u64) {
    let i = p.interval_s.max(1);
    let steady = (STEADY_RX_PER_S * i, STEADY_TX_PER_S * i);
    match b {
        Behaviour::Silent => (0, 0),
        _ if j == 0 => (BOOT_RX, BOOT_TX),
        Behaviour::Healthy => steady,
        Behaviour::NicDown => ((i / 10).max(1), 0),
        Behaviour::SlowBoot if j < p.slow_intervals => ((i / 2).max(1), (i / 4).max(1)),
        Behaviour::SlowBoot => steady,
    }
}

/// Sum of `rate(b, j)` for `j` in `[a, z)`, in O(1).
pub fn sum(b: Behaviour, a: u64, z: u64, p: RateParams) -> (u64, u64) {
    if z <= a {
        return (0, 0);
    }
    // Breakpoints where the rate may change: 1 (end of boot) and slow_intervals.
    let mut cuts = [0u64, 1, p.slow_intervals.max(1), u64::MAX];
    cuts.sort_unstable();
    let mut rx = 0u64;
    let mut tx = 0u64;
    for w in cuts.windows(2) {
        let lo = a.max(w[0]);
        let hi = z.min(w[1]);
        if hi > lo {
            let (r, t) = rate(b, lo, p);
            rx = rx.saturating_add(r.saturating_mul(hi - lo));
            tx = tx.saturating_add(t.saturating_mul(hi - lo));
        }
    }
    (rx, tx)
}

/// Cumulative disk KiB (read, write) after `n` intervals; independent of the NIC.
pub fn disk(n: u64, p: RateParams) -> (u64, u64) {
    if n == 0 {
        return (0, 0);
    }
    let i = p.interval_s.max(1);
    (20_480 + (n - 1) * 4 * i, 2_048 + (n - 1) * 16 * i)
}

/// A cheap deterministic mix of two numbers (for jitter that is a pure function).
pub fn mix(a: u64, b: u64) -> u64 {
    let mut x = a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b.wrapping_add(0xD1B5_4A32_D192_ED03);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    x
}

/// CPU use in hundredths of a percent for interval `n` (1-based) of a VM.
pub fn cpu_centi(b: Behaviour, seq: u64, n: u64, p: RateParams) -> u32 {
    let jitter = (mix(seq, n) % 600) as u32;
    if n <= 1 {
        return 4_000 + jitter * 3;
    }
    match b {
        Behaviour::Healthy => 800 + jitter,
        Behaviour::SlowBoot if n <= p.slow_intervals => 2_500 + jitter,
        Behaviour::SlowBoot => 800 + jitter,
        Behaviour::NicDown | Behaviour::Silent => 150 + jitter / 4,
    }
}

/// CloudStack prints `cpuused` with `DecimalFormat("#.##")` plus `%`: "10%", "0.2%", "55.56%".
pub fn format_cpu(centi: u32) -> String {
    let whole = centi / 100;
    let frac = centi % 100;
    if frac == 0 {
        format!("{whole}%")
    } else if frac.is_multiple_of(10) {
        format!("{whole}.{}%", frac / 10)
    } else {
        format!("{whole}.{frac:02}%")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const P: RateParams = RateParams {
        interval_s: 60,
        slow_intervals: 20,
    };

    fn naive(b: Behaviour, a: u64, z: u64) -> (u64, u64) {
        (a..z).fold((0, 0), |(r, t), j| {
            let (x, y) = rate(b, j, P);
            (r + x, t + y)
        })
    }

    #[test]
    fn closed_form_sum_matches_the_naive_sum() {
        for b in [
            Behaviour::Healthy,
            Behaviour::NicDown,
            Behaviour::SlowBoot,
            Behaviour::Silent,
        ] {
            for a in 0..30 {
                for z in a..45 {
                    assert_eq!(sum(b, a, z, P), naive(b, a, z), "{b:?} {a}..{z}");
                }
            }
        }
    }

    #[test]
    fn nic_down_stops_guest_to_host_after_boot() {
        assert!(rate(Behaviour::NicDown, 0, P).1 > 0);
        for j in 1..100 {
            assert_eq!(rate(Behaviour::NicDown, j, P).1, 0);
            assert!(rate(Behaviour::NicDown, j, P).0 > 0);
        }
    }

    #[test]
    fn cpu_is_formatted_like_decimal_format() {
        assert_eq!(format_cpu(1000), "10%");
        assert_eq!(format_cpu(20), "0.2%");
        assert_eq!(format_cpu(5556), "55.56%");
        assert_eq!(format_cpu(5), "0.05%");
    }
}
