//! What guest→host traffic statistics say about a guest, read with CloudStack's real
//! semantics (cloudstack-api.md §3.1b, docs/cloudstack-stats.md):
//!
//! - the listing's counter, asked with `accumulate=true`, is the sum over every retained
//!   `vm_stats` row, truncated to whole KiB once: it rises when a row with traffic arrives and
//!   falls when rows expire;
//! - a usage-history row is one management server's reading of one interval, truncated to
//!   whole KiB on its own; with several management servers the rows of one interval split
//!   the traffic, so a quiet guest can read 0 in every row.
//!
//! So a rise of the counter proves activity, zero rows alone do not prove silence, and a
//! flat counter alone does not either (a collection gap looks the same). Silence is zero rows
//! over the window *and* a flat counter over it, on a server whose counter is a sum and for a
//! VM younger than the retention (no row has left the sum). VMs the usage history does not
//! show (projects) are judged from the counter alone, with the paused-collection check of
//! [`crate::collector`] standing in for the rows' timestamps.

use jiff::{SignedDuration, Timestamp};

use super::history::{Sighting, Traffic};
use super::{at, human_duration, later, Graces};
use cloudstack_api::model::CsTime;

/// What the traffic statistics say about the guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrafficEvidence {
    Rising(String),
    Silent(String),
    /// No verdict from traffic: stats absent, stale, not trustworthy here, or not enough yet.
    Inconclusive {
        why: String,
        silent_at: Option<Timestamp>,
        /// Only more samples are missing (none yet, or fewer than the window): the next ones
        /// decide, where a lasting reason (a hypervisor not judged, stale or untrusted stats)
        /// would give the same answer again.
        gathering: bool,
    },
}

/// Inconclusive for a reason more samples do not change.
fn inconclusive(why: impl Into<String>) -> TrafficEvidence {
    TrafficEvidence::Inconclusive {
        why: why.into(),
        silent_at: None,
        gathering: false,
    }
}

/// Inconclusive until more samples arrive; `silent_at` when flat samples would decide.
fn gathering(why: impl Into<String>, silent_at: Option<Timestamp>) -> TrafficEvidence {
    TrafficEvidence::Inconclusive {
        why: why.into(),
        silent_at,
        gathering: true,
    }
}

/// Timestamps have whole seconds: rows this close together can be one collection read by
/// two management servers, so a gap tolerance never goes below it.
const SAME_INSTANT_SECS: i64 = 1;
/// Allowance on row ages for whole-second timestamps and a little clock skew between
/// CloudStack and the shim (a server clock far behind makes rows look stale: no verdict).
const TIMESTAMP_SLACK: SignedDuration = SignedDuration::from_secs(5);
/// Rows considered when inferring the cadence (the newest ones).
const CADENCE_ROWS: usize = 64;

/// The collection interval in force (`vm.stats.interval` of one management server), inferred
/// from row timestamps: the shortest spacing `d` such that at least 80 % of the rows that
/// could have a successor `d` later have one (within 10 %, at least a second). Several
/// management servers interleave their rows at arbitrary phases; only the true interval
/// repeats for every row. `None` with fewer than three distinct instants.
pub fn infer_cadence(times: impl IntoIterator<Item = CsTime>) -> Option<SignedDuration> {
    let mut secs: Vec<i64> = times.into_iter().map(|t| t.0.as_second()).collect();
    secs.sort_unstable();
    secs.dedup();
    let cut = secs.len().saturating_sub(CADENCE_ROWS);
    let secs = &secs[cut..];
    if secs.len() < 3 {
        return None;
    }
    let last = *secs.last()?;
    let mut candidates: Vec<i64> = secs
        .iter()
        .enumerate()
        .flat_map(|(i, a)| secs[i + 1..].iter().map(move |b| b - a))
        .collect();
    candidates.sort_unstable();
    candidates.dedup();
    candidates.into_iter().find_map(|d| {
        let tolerance = (d / 10).max(1);
        let eligible = secs.iter().filter(|t| *t + d <= last + tolerance).count();
        if eligible < 2 {
            return None;
        }
        // The spacing actually seen for each row that has a successor near `d`.
        let mut seen: Vec<i64> = secs
            .iter()
            .filter_map(|t| {
                let want = t + d;
                let i = secs.partition_point(|s| *s < (want - tolerance).max(t + 1));
                secs.get(i)
                    .filter(|s| **s <= want + tolerance)
                    .map(|s| s - t)
            })
            .collect();
        if seen.len() * 5 < eligible * 4 {
            return None;
        }
        seen.sort_unstable();
        Some(SignedDuration::from_secs(seen[seen.len() / 2]))
    })
}

/// The interval the windows are scaled with: the inferred one, never shorter than
/// `--stats-interval` (a flag set to the real interval stays the floor; a server collecting
/// more slowly than the flag says stretches every window).
pub fn cadence_in_force(t: &Traffic, g: &Graces) -> SignedDuration {
    inferred_cadence(t).map_or(g.stats_interval, |c| c.max(g.stats_interval))
}

/// The cadence the VM's usage-history rows show, if they show one.
pub fn inferred_cadence(t: &Traffic) -> Option<SignedDuration> {
    infer_cadence(t.rows.as_deref()?.iter().map(|r| r.0))
}

/// How far apart rows with traffic reach a busy guest's accumulated counter on this endpoint:
/// the median, over VMs whose counter rose at least three times in a row of polls, of the
/// median of their recent gaps between rises (medians, so that one collection gap or one
/// quiet spell does not stretch it). Rows arrive once per interval per management server, so
/// this is the interval in force (or its share between servers), whatever `vm.stats.interval`
/// the operator set; the counter-alone window is scaled with it. `None` until a VM shows it.
pub fn counter_cadence<'a>(
    traffic: impl IntoIterator<Item = &'a Traffic>,
) -> Option<SignedDuration> {
    let per_vm: Vec<SignedDuration> = traffic
        .into_iter()
        .filter(|t| t.rise_gaps.len() >= 2)
        .filter_map(|t| median(&t.rise_gaps))
        .collect();
    median(&per_vm)
}

/// The middle value (the upper one of an even count), `None` for none.
fn median(values: &[SignedDuration]) -> Option<SignedDuration> {
    let mut sorted = values.to_vec();
    sorted.sort();
    sorted.get(sorted.len() / 2).copied()
}

/// The oldest row of the newest unbroken run of rows with 0 KiB guest→host, or `None` when the
/// newest row shows traffic. A gap longer than 1.5 cadences (a host the collector skipped,
/// collection switched off) ends the run: nothing was read across it.
pub fn zero_run_start(rows: &[(CsTime, u64)], cadence: SignedDuration) -> Option<CsTime> {
    let max_gap = cadence * 3 / 2 + SignedDuration::from_secs(SAME_INSTANT_SECS);
    let mut start = None;
    for (i, row) in rows.iter().enumerate().rev() {
        if row.1 != 0 {
            break;
        }
        if let Some(next) = rows.get(i + 1) {
            if next.0 .0.duration_since(row.0 .0) > max_gap {
                break;
            }
        }
        start = Some(row.0);
    }
    start
}

/// The listing's counter rose within the freshness window.
pub fn rose_recently(t: &Traffic, g: &Graces, now: Timestamp) -> bool {
    t.last_rise
        .is_some_and(|r| now.duration_since(r) <= rise_fresh_within(t, g))
}

/// How long a rise of the listing's counter stays proof of activity: two collection
/// intervals plus the spacing of the polls that look for it — polls slower than
/// `--poll-interval` (a big fleet behind a rate limit) must not make every VM look idle.
/// Capped at the stale-poll age, beyond which observation restarts anyway.
pub fn rise_fresh_within(t: &Traffic, g: &Graces) -> SignedDuration {
    let spacing = t
        .poll_spacing
        .unwrap_or(g.poll_interval)
        .clamp(g.poll_interval, g.stale_after().max(g.poll_interval));
    cadence_in_force(t, g) * 2 + spacing
}

/// Why the accumulated counter cannot back a silence verdict for this VM, if it cannot.
fn counter_untrusted(t: &Traffic, seen: &Sighting, now: Timestamp) -> Option<String> {
    let Some(server) = t.server else {
        return Some("the endpoint's stats semantics are not known yet (listCapabilities)".into());
    };
    if !server.accumulates {
        return Some(
            "this CloudStack does not sum stats rows (before 4.17, or it ignored \
             accumulate=true), so a flat counter proves nothing"
                .into(),
        );
    }
    let Some(retention) = server.retention else {
        return Some("the stats retention (instancesstatsretentiontime) is not known".into());
    };
    match seen.created {
        Some(created) if now.duration_since(created.0) < retention => None,
        Some(_) => Some(format!(
            "the VM is older than the stats retention ({}), so rows leave its counter while new \
             ones arrive",
            human_duration(retention)
        )),
        None => Some("the VM's creation time is not shown".into()),
    }
}

/// What `Rising` says, whichever source (the listing's counter, a usage-history row) showed it.
const RISING: &str = "guest→host traffic rising";

/// Judges guest→host traffic at `now` for a Running VM without a Node.
pub fn assess_traffic(t: &Traffic, seen: &Sighting, g: &Graces, now: Timestamp) -> TrafficEvidence {
    if rose_recently(t, g, now) {
        return TrafficEvidence::Rising(RISING.to_string());
    }
    if !g.judges_silence_on(seen.hypervisor.as_deref()) {
        let hv = seen
            .hypervisor
            .as_deref()
            .unwrap_or("an unnamed hypervisor");
        return inconclusive(format!(
            "traffic on {hv} is not judged (its counters cannot tell low traffic from none; \
             --silence-hypervisors is {})",
            g.silence_hypervisors.join(",")
        ));
    }
    if seen.host_in_maintenance() {
        return inconclusive("its host is in maintenance, where CloudStack collects no stats");
    }
    let (Some(value), Some(flat_since)) = (t.last_value, t.flat_since) else {
        return gathering("no traffic stats reported", None);
    };
    match t.rows.as_deref() {
        Some(rows) => assess_rows(
            t,
            rows,
            seen,
            (value, t.unchanged_since.unwrap_or(flat_since)),
            g,
            now,
        ),
        None => assess_counter_alone(t, seen, (value, flat_since), g, now),
    }
}

fn assess_rows(
    t: &Traffic,
    rows: &[(CsTime, u64)],
    seen: &Sighting,
    (value, flat_since): (u64, Timestamp),
    g: &Graces,
    now: Timestamp,
) -> TrafficEvidence {
    let Some(newest) = rows.last().map(|r| r.0) else {
        return gathering(
            "no stats samples for this VM (collection off, or its host not collected)",
            None,
        );
    };
    let cadence = cadence_in_force(t, g);
    if now.duration_since(newest.0) > cadence * 2 + g.poll_interval + TIMESTAMP_SLACK {
        return inconclusive(format!(
            "stats are stale (newest sample taken at {})",
            at(newest.0)
        ));
    }
    let Some(start) = zero_run_start(rows, cadence) else {
        // The same words as a rising counter: a row with traffic is what raises it, and a
        // Machine's condition must not be rewritten when the other source speaks first.
        return TrafficEvidence::Rising(RISING.to_string());
    };
    let window = cadence * i32::try_from(g.silent_samples.max(1)).unwrap_or(i32::MAX);
    // A row covers the interval before it.
    let covered = newest.0.duration_since(start.0) + cadence;
    if covered < window {
        return gathering(
            format!(
                "guest→host traffic 0 KiB in the stats samples since {}",
                at(start.0)
            ),
            Some(later(newest.0, window - covered)),
        );
    }
    let rows_total: u64 = rows.iter().map(|r| r.1).sum();
    if rows_total > value {
        // Rows only add to an accumulated counter: this one shows the latest row only.
        return inconclusive(
            "its listing counter is below the sum of its usage-history samples, so this \
             server does not sum stats rows (accumulate ignored)",
        );
    }
    if let Some(why) = counter_untrusted(t, seen, now) {
        // No start time here: a run longer than the rows asked moves with every answer, and a
        // condition message must not change while the situation does not.
        return inconclusive(format!(
            "guest→host traffic 0 KiB in its recent stats samples, but {why}"
        ));
    }
    // The counter must not have risen since the rows went to zero: a rise means rows too
    // small to show a whole KiB each (several management servers splitting an interval, or a
    // guest trickling a few bytes a second) still added up to a kilobyte. A guest like that
    // is never silent, however long its rows read 0 — judging it by a window would flap.
    // The counter is read a poll after a row lands, hence the margin.
    let margin = cadence + g.poll_interval + TIMESTAMP_SLACK;
    let run_began = start.0 - cadence;
    if t.last_rise.is_some_and(|r| r > later(run_began, margin)) {
        return inconclusive(
            "guest→host traffic reads 0 KiB per stats sample, but its counter still rises: a \
             trickle under 1 KiB per sample",
        );
    }
    // A counter first read after the run began (a restarted shim, a Machine that just lost
    // its Node) must be seen flat for twice the window before it stands for the rows.
    let flat_needed = if flat_since <= later(run_began, margin) {
        SignedDuration::ZERO
    } else {
        window * 2
    };
    if now.duration_since(flat_since) < flat_needed {
        return gathering(
            format!(
                "guest→host traffic 0 KiB in the stats samples since {}; its counter has been \
                 watched only since {}",
                at(start.0),
                at(flat_since)
            ),
            Some(later(flat_since, flat_needed)),
        );
    }
    TrafficEvidence::Silent(format!(
        "guest→host traffic is 0 KiB in every stats sample of the last {} (stats every {}) and \
         its accumulated counter is flat at {value} KiB since {}",
        human_duration(window),
        human_duration(cadence),
        at(flat_since)
    ))
}

fn assess_counter_alone(
    t: &Traffic,
    seen: &Sighting,
    (value, flat_since): (u64, Timestamp),
    g: &Graces,
    now: Timestamp,
) -> TrafficEvidence {
    if let Some(why) = counter_untrusted(t, seen, now) {
        return inconclusive(format!(
            "guest→host traffic flat at {value} KiB since {}, but {why}",
            at(flat_since)
        ));
    }
    let Some(cadence) = t.counter_cadence else {
        return gathering(
            format!(
                "guest→host traffic flat at {value} KiB since {}, but how often rows arrive is \
                 not known yet (no VM of its scope has shown steady traffic)",
                at(flat_since)
            ),
            None,
        );
    };
    // (silent samples + 1) intervals, at the spacing rows really arrive at, never shorter
    // than `--stats-interval` says — and at least twice the usual pause this VM's counter
    // has shown between rises (the median, so one collection gap does not stretch it): a
    // guest trickling a kilobyte every few minutes is not silent in between.
    let own_usual_pause = median(&t.rise_gaps).unwrap_or_default();
    let window = (cadence.max(g.stats_interval)
        * (i32::try_from(g.silent_samples)
            .unwrap_or(i32::MAX)
            .saturating_add(1)))
    .max(own_usual_pause * 2);
    if let Some(paused) = t.collection_paused_since {
        // Only the flat time before the host's stats collection paused is evidence.
        if paused.duration_since(flat_since) < window {
            return inconclusive(format!(
                "stats collection for its host looks paused since {} (every VM there went flat \
                 at once); guest→host traffic flat at {value} KiB since {}",
                at(paused),
                at(flat_since)
            ));
        }
    }
    if now.duration_since(flat_since) < window {
        return gathering(
            format!(
                "guest→host traffic flat at {value} KiB since {}",
                at(flat_since)
            ),
            Some(later(flat_since, window)),
        );
    }
    TrafficEvidence::Silent(format!(
        "guest→host traffic flat at {value} KiB since {} (its usage history is not visible \
         to this key)",
        at(flat_since)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(secs: i64) -> CsTime {
        CsTime(Timestamp::from_second(1_800_000_000 + secs).unwrap())
    }

    #[test]
    fn one_server_every_minute_gives_a_minute() {
        let rows: Vec<CsTime> = (0..6).map(|i| ts(i * 60)).collect();
        assert_eq!(infer_cadence(rows), Some(SignedDuration::from_secs(60)));
    }

    #[test]
    fn three_servers_at_irregular_phases_still_give_their_interval() {
        let rows: Vec<CsTime> = (0..6)
            .flat_map(|i| [ts(i * 60), ts(i * 60 + 22), ts(i * 60 + 44 + i % 2)])
            .collect();
        assert_eq!(infer_cadence(rows), Some(SignedDuration::from_secs(60)));
    }

    #[test]
    fn a_five_minute_interval_with_one_gap_is_five_minutes() {
        let rows: Vec<CsTime> = [0, 300, 600, 1500, 1800, 2100].map(ts).to_vec();
        assert_eq!(infer_cadence(rows), Some(SignedDuration::from_secs(300)));
    }

    #[test]
    fn a_one_second_interval_is_one_second() {
        let rows: Vec<CsTime> = (0..10).map(ts).collect();
        assert_eq!(infer_cadence(rows), Some(SignedDuration::from_secs(1)));
    }

    #[test]
    fn two_instants_are_not_enough_to_tell() {
        assert_eq!(infer_cadence([ts(0), ts(60), ts(60)]), None);
    }

    #[test]
    fn the_zero_run_ends_at_traffic_and_at_gaps() {
        let c = SignedDuration::from_secs(60);
        let rows = [(ts(0), 5), (ts(60), 0), (ts(120), 0), (ts(180), 0)];
        assert_eq!(zero_run_start(&rows, c), Some(ts(60)));
        let gap = [(ts(0), 0), (ts(60), 0), (ts(400), 0), (ts(460), 0)];
        assert_eq!(zero_run_start(&gap, c), Some(ts(400)));
        let busy = [(ts(0), 0), (ts(60), 2)];
        assert_eq!(zero_run_start(&busy, c), None);
    }
}
