//! The VM stats collector (`StatsCollector.VmStatsCollector@00114e8b`): every management
//! server runs it every `vm.stats.interval` at its own phase; for every collectable host it
//! asks the agent for the stats of the host's Running VMs and stores one `vm_stats` row per VM
//! with that server's values — there is no ownership check, so N servers store N rows per
//! interval. What a row holds depends on the hypervisor:
//!
//! * KVM (`LibvirtComputingResource.getVmStat@00114e8b`): the agent keeps one previous reading
//!   per VM, shared by the calls of every server, and returns the bytes since it (the first
//!   call after a start or a migration returns 0 and sets the baseline). With N servers the
//!   rows partition the traffic.
//! * VMware: the sample duration (the interval, s) × an *integer* average KB/s over the last
//!   interval — a guest under 1 KB/s reads 0; each server's row covers the same interval.
//! * XenServer: the RRD average *rate* (KB/s, fractional) over the last interval.
//!
//! Rows older than `vm.stats.max.retention.time` are deleted by the `VmStatsCleaner`, which
//! runs every 60 s (`scheduleWithFixedDelay(new VmStatsCleaner(), …, 60000L, …)`); modelled as
//! runs on whole minutes.

use super::rows::Row;
use super::{Ctx, Hypervisor, Ms, Vm, VmState};
use crate::traffic::{cpu_centi, Profile};

/// How often the cleaner deletes expired rows.
const CLEANER_PERIOD_MS: Ms = 60_000;
/// How far back rows are generated at all when the cleanup is disabled.
const NO_CLEANUP_WINDOW_MS: Ms = 7 * 86_400_000;

/// Where rows older than this are gone at time `t`.
pub(super) fn expiry_cutoff(t: Ms, retention_ms: Ms) -> Ms {
    if retention_ms <= 0 {
        return t.saturating_sub(NO_CLEANUP_WINDOW_MS);
    }
    t.div_euclid(CLEANER_PERIOD_MS) * CLEANER_PERIOD_MS - retention_ms
}

/// The collection instants of one world advance, shared by all VMs.
#[derive(Debug, Clone, Default)]
pub(super) struct Collections {
    interval_ms: Ms,
    offsets: Vec<Ms>,
    /// Instants at or before this are not turned into rows (they would be expired by the end
    /// of the advance); only the KVM baseline they would set is kept.
    lo: Ms,
    /// (time, management server) in `(lo, to]`, in time order.
    instants: Vec<(Ms, u8)>,
    pub cutoff: Ms,
}

impl Collections {
    /// Collections between `from` (exclusive) and `to` (inclusive).
    pub(super) fn new(from: Ms, to: Ms, c: &Ctx) -> Self {
        let cutoff = expiry_cutoff(to, c.retention_ms);
        let mut out = Self {
            interval_ms: c.interval_ms,
            offsets: c.offsets.clone(),
            lo: from.max(cutoff - 1),
            instants: Vec::new(),
            cutoff,
        };
        let i = c.interval_ms;
        if i <= 0 || to <= out.lo {
            return out;
        }
        for (k, o) in out.offsets.iter().enumerate() {
            let mut n = (out.lo - o).div_euclid(i) + 1;
            while n * i + o <= to {
                out.instants.push((n * i + o, k as u8));
                n += 1;
            }
        }
        out.instants.sort_unstable();
        out
    }

    /// The last instant at or before `x` of any server (`Ms::MIN` when collection is off).
    fn last_at_or_before(&self, x: Ms) -> Ms {
        let i = self.interval_ms;
        if i <= 0 {
            return Ms::MIN;
        }
        self.offsets
            .iter()
            .map(|o| (x - o).div_euclid(i) * i + o)
            .max()
            .unwrap_or(Ms::MIN)
    }
}

fn sub(a: u64, b: u64) -> u32 {
    a.saturating_sub(b).min(u64::from(u32::MAX)) as u32
}

impl Vm {
    /// Stores the rows of the collections in `(from, to]` while the VM is Running on a host
    /// of hypervisor `hv` that is `collectable`.
    pub(super) fn collect(
        &mut self,
        from: Ms,
        to: Ms,
        host: Option<(bool, Hypervisor)>,
        col: &Collections,
        c: &Ctx,
    ) {
        let Some((true, hv)) = host else { return };
        if self.state != VmState::Running || to <= from || col.interval_ms <= 0 {
            return;
        }
        if from < col.lo {
            // Readings the clock jumped over still moved the KVM agent's baseline.
            let p = col.last_at_or_before(col.lo.min(to));
            if p > from {
                self.kvm_prev = Some(self.reading(p, c));
            }
        }
        let start = from.max(col.lo);
        let a = col.instants.partition_point(|(t, _)| *t <= start);
        let z = col.instants.partition_point(|(t, _)| *t <= to);
        for &(at, k) in &col.instants[a..z] {
            let row = self.row_at(at, k, hv, c);
            self.rows.push(row);
        }
    }

    fn row_at(&mut self, at: Ms, ms: u8, hv: Hypervisor, c: &Ctx) -> Row {
        let cur = self.reading(at, c);
        let i_s = (c.interval_ms / 1000).max(1) as u64;
        let (rx, tx, dr, dw) = match hv {
            Hypervisor::Kvm => {
                let d = match self.kvm_prev {
                    None => (0, 0, 0, 0),
                    Some(p) => (
                        sub(cur.rx, p.rx),
                        sub(cur.tx, p.tx),
                        sub(cur.disk_read, p.disk_read),
                        sub(cur.disk_write, p.disk_write),
                    ),
                };
                self.kvm_prev = Some(cur);
                d
            }
            Hypervisor::VMware => {
                let p = self.reading(at - c.interval_ms, c);
                // duration × floor(average KB/s), in 1/1024 KiB.
                let v = |a: u64, b: u64| {
                    let kbps = a.saturating_sub(b) / 1024 / i_s;
                    (kbps * i_s * 1024).min(u64::from(u32::MAX)) as u32
                };
                (
                    v(cur.rx, p.rx),
                    v(cur.tx, p.tx),
                    v(cur.disk_read, p.disk_read),
                    v(cur.disk_write, p.disk_write),
                )
            }
            Hypervisor::XenServer => {
                let p = self.reading(at - c.interval_ms, c);
                // Average B/s = (KB/s) × 1024, rounded to whole bytes per second.
                let v = |a: u64, b: u64| {
                    let bps = (a.saturating_sub(b) + i_s / 2) / i_s;
                    bps.min(u64::from(u32::MAX)) as u32
                };
                (
                    v(cur.rx, p.rx),
                    v(cur.tx, p.tx),
                    v(cur.disk_read, p.disk_read),
                    v(cur.disk_write, p.disk_write),
                )
            }
        };
        let profile = self.profile_at(at).unwrap_or(Profile::Silent);
        Row {
            at_ms: at,
            rx,
            tx,
            disk_read: dr,
            disk_write: dw,
            cpu_centi: cpu_centi(profile, self.seq, at),
            ms,
        }
    }
}
