//! What else the hypervisor reports per VM: disk bytes, CPU use, and CloudStack's formatting
//! of `cpuused`.

use super::{Profile, Timing};
use crate::world::Ms;

/// Cumulative disk (read, write) bytes `dt` ms after the VM started running: the boot reads
/// the image (2 MiB/s read, 256 KiB/s written), then a node reads 4 KiB/s and writes 24 KiB/s
/// (logs, etcd/containerd state). Independent of the network.
pub fn disk_bytes(dt: Ms, t: Timing) -> (u64, u64) {
    let dt = dt.max(0) as u64;
    let boot = t.boot_ms.max(0) as u64;
    let b = dt.min(boot);
    let after = dt - b;
    (
        (2 * 1024 * 1024 * b + 4 * 1024 * after) / 1000,
        (256 * 1024 * b + 24 * 1024 * after) / 1000,
    )
}

/// A cheap deterministic mix of two numbers (for jitter that is a pure function).
pub fn mix(a: u64, b: u64) -> u64 {
    let mut x = a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b.wrapping_add(0xD1B5_4A32_D192_ED03);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    x
}

/// CPU use in hundredths of a percent of a VM (`seq`) at collection time `at_ms`, while the
/// guest is in profile `p`.
pub fn cpu_centi(p: Profile, seq: u64, at_ms: Ms) -> u16 {
    let jitter = (mix(seq, at_ms.max(0) as u64 / 1000) % 600) as u16;
    match p {
        Profile::Boot => 4_000 + jitter * 3,
        Profile::KubeadmJoin => 2_500 + jitter,
        Profile::IdleJoined => 800 + jitter,
        Profile::WaitingForEndpoint | Profile::WaitingForEndpointArp => 300 + jitter / 2,
        Profile::Quiet | Profile::NicDown | Profile::OneNicDown | Profile::Silent => {
            150 + jitter / 4
        }
    }
}

/// CloudStack prints `cpuused` with `DecimalFormat("#.##")` plus `%`: "10%", "0.2%", "55.56%"
/// (`UserVmJoinDaoImpl`, `MetricsServiceImpl.createStatsResponse@44d54b35`).
pub fn format_cpu(centi: u16) -> String {
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

    #[test]
    fn cpu_is_formatted_like_decimal_format() {
        assert_eq!(format_cpu(1000), "10%");
        assert_eq!(format_cpu(20), "0.2%");
        assert_eq!(format_cpu(5556), "55.56%");
        assert_eq!(format_cpu(5), "0.05%");
    }

    #[test]
    fn disk_reads_the_image_at_boot_then_slows_down() {
        let t = Timing::default();
        let (r1, _) = disk_bytes(t.boot_ms, t);
        let (r2, w2) = disk_bytes(t.boot_ms + 60_000, t);
        assert_eq!(r1, 2 * 1024 * 1024 * 90);
        assert_eq!(r2 - r1, 4 * 1024 * 60);
        assert!(w2 > 0);
    }
}
