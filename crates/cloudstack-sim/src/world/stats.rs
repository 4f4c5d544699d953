//! What the API reads from a VM's `vm_stats` rows: the listing's stats fields
//! (`StatsCollector.getVmStats@00114e8b`) and the date parameters of the usage history.

use super::rows::Row;
use super::{Ms, Vm};

/// The stats fields of `listVirtualMachines` for one VM, already truncated to whole numbers as
/// `UserVmJoinDaoImpl` does (`(long)` casts).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatsView {
    pub rx_kib: u64,
    pub tx_kib: u64,
    pub disk_read_kib: u64,
    pub disk_write_kib: u64,
    pub disk_io_read: u64,
    pub disk_io_write: u64,
    /// From the latest row, accumulated or not.
    pub cpu_centi: u16,
    pub latest_ms: Ms,
    /// Rows the server read to answer (it loads every retained row of the VM,
    /// `vmStatsDao.findByVmIdOrderByTimestampDesc`, even for the latest one).
    pub rows_read: usize,
}

/// Whole KiB of a value in 1/1024 KiB; disk IOs as 8-KiB operations.
fn kib(units: u64) -> u64 {
    units / 1024
}

impl Vm {
    /// The listing's stats: `None` while the VM has no retained row. With `accumulate`, the
    /// sum over all retained rows of every management server (`accumulateVmMetricsStats`),
    /// otherwise the latest row only; `cpuused` is the latest row's either way.
    pub fn stats_view(&self, accumulate: bool) -> Option<StatsView> {
        let latest = self.rows.latest()?;
        let (rx, tx, dr, dw) = if accumulate {
            let s = self.rows.sums();
            (s.rx, s.tx, s.disk_read, s.disk_write)
        } else {
            (
                u64::from(latest.rx),
                u64::from(latest.tx),
                u64::from(latest.disk_read),
                u64::from(latest.disk_write),
            )
        };
        Some(StatsView {
            rx_kib: kib(rx),
            tx_kib: kib(tx),
            disk_read_kib: kib(dr),
            disk_write_kib: kib(dw),
            disk_io_read: dr / 8192,
            disk_io_write: dw / 8192,
            cpu_centi: latest.cpu_centi,
            latest_ms: latest.at_ms,
            rows_read: self.rows.len(),
        })
    }

    /// Retained rows, oldest first.
    pub fn stats_rows(&self) -> impl DoubleEndedIterator<Item = &Row> + ExactSizeIterator {
        self.rows.iter()
    }
}

/// Parses `startdate`/`enddate` of `listVirtualMachinesUsageHistory`.
///
/// What `ParamProcessWorker@00a47984` (and `@60516455`) does for a `CommandType.DATE` parameter
/// of this command (only event, alert and usage-record commands get the date-time branch;
/// docs/cloudstack-stats.md §3): a non-lenient `yyyy-MM-dd`
/// `SimpleDateFormat` in the server JVM's default zone parses the leading date and ignores the
/// rest, so the time of day is dropped and the instant is midnight in the *server's* zone.
/// Returns `None` when no date can be read (the caller answers 431).
pub fn history_date(s: &str, tz: &jiff::tz::TimeZone) -> Option<Ms> {
    let s = s.trim_start();
    let mut parts = [0i32; 3];
    let mut rest = s;
    for (i, part) in parts.iter_mut().enumerate() {
        let n = rest.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 || n > 4 {
            return None;
        }
        *part = rest[..n].parse().ok()?;
        rest = &rest[n..];
        if i < 2 {
            rest = rest.strip_prefix('-')?;
        }
    }
    let d = jiff::civil::Date::new(
        i16::try_from(parts[0]).ok()?,
        i8::try_from(parts[1]).ok()?,
        i8::try_from(parts[2]).ok()?,
    )
    .ok()?;
    let z = d.to_zoned(tz.clone()).ok()?;
    Some(z.timestamp().as_millisecond())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shims_minus_twelve_instant_is_read_as_local_midnight_of_its_date() {
        // What capc-health-shim sends for 2026-12-02T00:10:00Z.
        let sent = "2026-12-01T12:10:00-12:00";
        for zone in [
            "UTC",
            "Pacific/Kiritimati",
            "Etc/GMT+12",
            "America/Los_Angeles",
        ] {
            let tz = jiff::tz::TimeZone::get(zone).unwrap();
            let start = history_date(sent, &tz).unwrap();
            let instant = jiff::Timestamp::from_second(1_796_170_200).unwrap();
            assert!(
                start <= instant.as_millisecond(),
                "{zone}: starts after the instant"
            );
            let midnight = jiff::civil::date(2026, 12, 1).to_zoned(tz).unwrap();
            assert_eq!(start, midnight.timestamp().as_millisecond(), "{zone}");
        }
    }

    #[test]
    fn dates_are_read_date_only_at_midnight_in_the_server_zone() {
        let utc = jiff::tz::TimeZone::UTC;
        let ny = jiff::tz::TimeZone::get("America/New_York").unwrap();
        let midnight_utc = 1_704_153_600_000; // 2024-01-02T00:00:00Z
        assert_eq!(history_date("2024-01-02", &utc), Some(midnight_utc));
        assert_eq!(
            history_date("2024-01-02 18:30:00", &utc),
            Some(midnight_utc),
            "the time part is dropped"
        );
        // Midnight in New York is 05:00 UTC (EST).
        assert_eq!(
            history_date("2024-01-02 18:30:00", &ny),
            Some(midnight_utc + 5 * 3_600_000)
        );
        assert_eq!(history_date("2024-13-02", &utc), None);
        assert_eq!(history_date("yesterday", &utc), None);
        assert_eq!(history_date("", &utc), None);
    }
}
