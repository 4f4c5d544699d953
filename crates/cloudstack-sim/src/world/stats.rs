//! Stats collection: the hypervisor counters per guest behaviour (closed-form, see
//! [`crate::traffic`]) and the samples the stats collector keeps.

use crate::traffic::{self, RateParams};

use super::{Ctx, Ms, Vm, VmState};

/// One collected stats sample (cumulative counters at a stats-interval boundary).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub at_ms: Ms,
    /// Intervals since the VM started running.
    pub n: u64,
    pub rx_kib: u64,
    pub tx_kib: u64,
    pub disk_read_kib: u64,
    pub disk_write_kib: u64,
    pub cpu_centi: u32,
}

impl Vm {
    /// Stats intervals completed between the VM starting to run and `t`.
    fn n_at(&self, t: Ms, interval_ms: Ms) -> u64 {
        match self.running_since {
            Some(rs) if interval_ms > 0 && t >= rs => {
                (t.div_euclid(interval_ms) - rs.div_euclid(interval_ms)).max(0) as u64
            }
            _ => 0,
        }
    }

    /// The hypervisor's cumulative network counters after `n` intervals.
    fn net_at(&self, n: u64, rates: RateParams) -> (u64, u64) {
        let (rx, tx) = traffic::sum(self.beh, self.seg_n, n.max(self.seg_n), rates);
        (self.base_rx + rx, self.base_tx + tx)
    }

    /// Freezes the counters at `t` so that a behaviour change applies from `t` on.
    fn fold(&mut self, t: Ms, c: &Ctx) {
        if self.state == VmState::Running && c.interval_ms > 0 {
            let n = self.n_at(t, c.interval_ms);
            let (rx, tx) = self.net_at(n, c.rates);
            self.base_rx = rx;
            self.base_tx = tx;
            self.seg_n = n.max(self.seg_n);
        }
    }

    pub(super) fn change_flags(&mut self, t: Ms, c: &Ctx, f: impl FnOnce(&mut Self)) {
        self.fold(t, c);
        f(self);
        self.beh = self.behaviour();
    }

    fn sample(&self, at_ms: Ms, n: u64, c: &Ctx) -> Sample {
        let (rx, tx) = self.net_at(n, c.rates);
        let (dr, dw) = traffic::disk(n, c.rates);
        Sample {
            at_ms,
            n,
            rx_kib: rx,
            tx_kib: tx,
            disk_read_kib: dr,
            disk_write_kib: dw,
            cpu_centi: traffic::cpu_centi(self.beh, self.seq, n, c.rates),
        }
    }

    /// Collects the samples at stats boundaries in `(from, to]`.
    pub(super) fn collect(&mut self, from: Ms, to: Ms, online: bool, c: &Ctx) {
        let i = c.interval_ms;
        if i <= 0 || self.state != VmState::Running || !online || to <= from {
            return;
        }
        let Some(rs) = self.running_since else {
            return;
        };
        let first = from.div_euclid(i) + 1;
        let last = to.div_euclid(i);
        if last < first {
            return;
        }
        let start = first.max(last - c.cap as i64 + 1);
        let rs_b = rs.div_euclid(i);
        for b in start..=last {
            let n = (b - rs_b).max(0) as u64;
            let s = self.sample(b * i, n, c);
            self.history.push_back(s);
            if self.history.len() > c.cap {
                self.history.pop_front();
            }
            self.last_sample = Some(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::world::test_support::{world, T0};
    use crate::world::*;

    #[test]
    fn boot_then_healthy_counters_rise_and_nic_down_stays_flat() {
        let mut w = world();
        let a = w.add_vm(&VmSpec::new("a")).unwrap();
        let mut spec = VmSpec::new("b");
        spec.guest = GuestKind::NicDown;
        let b = w.add_vm(&spec).unwrap();
        assert_eq!(w.vm(a).unwrap().state, VmState::Starting);
        w.advance_to(T0 + 5_000);
        assert_eq!(w.vm(a).unwrap().state, VmState::Running);
        w.advance_to(T0 + 60_000);
        let s1 = w.vm(a).unwrap().last_sample.unwrap();
        let n1 = w.vm(b).unwrap().last_sample.unwrap();
        w.advance_to(T0 + 600_000);
        let s2 = w.vm(a).unwrap().last_sample.unwrap();
        let n2 = w.vm(b).unwrap().last_sample.unwrap();
        assert!(s2.tx_kib > s1.tx_kib && s2.rx_kib > s1.rx_kib);
        assert!(n1.tx_kib > 0, "boot traffic");
        assert_eq!(n2.tx_kib, n1.tx_kib);
        assert!(n2.rx_kib > n1.rx_kib);
    }

    #[test]
    fn big_clock_jump_is_bounded_and_equals_small_steps() {
        let mut w1 = world();
        let mut w2 = world();
        for w in [&mut w1, &mut w2] {
            w.add_vm(&VmSpec::new("a")).unwrap();
        }
        w1.advance_to(T0 + 86_400_000);
        let mut t = T0;
        while t < T0 + 86_400_000 {
            t += 7_000;
            w2.advance_to(t.min(T0 + 86_400_000));
        }
        let a = w1.vm(0).unwrap();
        let b = w2.vm(0).unwrap();
        assert_eq!(a.last_sample, b.last_sample);
        assert_eq!(a.history, b.history);
        assert_eq!(a.history.len(), 360);
    }

    #[test]
    fn a_stats_gap_keeps_the_host_connected_and_the_counters_flat() {
        let mut w = world();
        let a = w.add_vm(&VmSpec::new("a")).unwrap();
        w.advance_to(T0 + 120_000);
        w.hosts[0].stats_collection_paused = true;
        let before = w.vm(a).unwrap().last_sample;
        let kept = w.vm(a).unwrap().history.len();
        w.advance_to(T0 + 400_000);
        assert_eq!(w.vm(a).unwrap().last_sample, before);
        assert_eq!(w.vm(a).unwrap().history.len(), kept);
        assert_eq!(w.hosts[0].control, HostControl::Enabled);
        w.hosts[0].stats_collection_paused = false;
        w.advance_to(T0 + 460_000);
        assert!(w.vm(a).unwrap().last_sample.unwrap().tx_kib > before.unwrap().tx_kib);
    }
}
