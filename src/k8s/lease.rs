//! Whether this replica may still write as the leader. The Lease library renews in the
//! background and, while the API server is unreachable, only logs and retries: it never says
//! the lock is gone. A leader cut off for longer than the Lease duration must not come back and
//! write over its successor, so before every write the leader confirms the Lease itself
//! ([`may_write`] over what it last read; read again when that no longer covers the write).
//! (Holding it is what counts: taking a Lease changes its holder.)

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::LeaseSpec;

/// What the Lease says about this replica's leadership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// Ours and current until `expires` (renew time + duration): write until then.
    Ours { expires: Timestamp },
    /// Still ours, but not renewed in time (the API server was out of reach). Nobody else has
    /// taken it — taking it changes the holder — but someone may be about to: write nothing
    /// until it is renewed.
    Expired(String),
    /// Someone else holds it, or nobody: this replica is no longer the leader.
    Lost(String),
}

/// Reads the Lease's spec against this replica's identity at `now`.
pub fn hold(spec: Option<&LeaseSpec>, identity: &str, now: Timestamp) -> Hold {
    let Some(spec) = spec else {
        return Hold::Lost("the Lease has no spec".into());
    };
    let holder = spec.holder_identity.as_deref().unwrap_or("");
    if holder != identity {
        let who = if holder.is_empty() { "nobody" } else { holder };
        return Hold::Lost(format!("the Lease is held by {who}"));
    }
    let Some(renewed) = spec.renew_time.as_ref().or(spec.acquire_time.as_ref()) else {
        return Hold::Expired("the Lease names no renew time".into());
    };
    let duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(0)));
    let expires = crate::verdict::later(renewed.0, duration);
    if now > expires {
        return Hold::Expired(format!(
            "our hold on the Lease expired at {}",
            crate::verdict::at(expires)
        ));
    }
    Hold::Ours { expires }
}

/// Whether a write started at `now` that may take up to `write_timeout` ends, with `margin` to
/// spare for clock skew, before a hold confirmed until `expires` runs out. Another replica can
/// take the Lease only after it expires, so a write that ends before that cannot overlap a
/// successor's writes.
pub fn may_write(
    expires: Timestamp,
    now: Timestamp,
    write_timeout: SignedDuration,
    margin: SignedDuration,
) -> bool {
    crate::verdict::later(now, write_timeout + margin) < expires
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

    use super::*;

    fn t(secs: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + secs).unwrap()
    }

    fn spec(holder: &str, renewed: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(holder.into()),
            renew_time: Some(MicroTime(t(renewed))),
            lease_duration_seconds: Some(15),
            ..Default::default()
        }
    }

    #[test]
    fn a_fresh_lease_of_ours_lets_us_write() {
        assert_eq!(
            hold(Some(&spec("shim-a", 0)), "shim-a", t(10)),
            Hold::Ours { expires: t(15) }
        );
    }

    #[test]
    fn a_write_must_end_before_the_hold_runs_out() {
        let (timeout, margin) = (SignedDuration::from_secs(5), SignedDuration::from_secs(2));
        // Expires at 15: a 5 s write with 2 s to spare may start until just before 8.
        assert!(may_write(t(15), t(0), timeout, margin));
        assert!(may_write(t(15), t(7), timeout, margin));
        assert!(!may_write(t(15), t(8), timeout, margin));
        assert!(!may_write(t(15), t(20), timeout, margin));
    }

    #[test]
    fn a_renew_time_at_the_end_of_time_is_read_without_overflow() {
        // The API server can hold any MicroTime; adding the duration once panicked.
        let mut far = spec("shim-a", 0);
        far.renew_time = Some(MicroTime(Timestamp::MAX));
        let h = hold(Some(&far), "shim-a", t(0));
        assert_eq!(
            h,
            Hold::Ours {
                expires: Timestamp::MAX
            }
        );
        let (timeout, margin) = (SignedDuration::from_secs(5), SignedDuration::from_secs(2));
        assert!(!may_write(Timestamp::MAX, Timestamp::MAX, timeout, margin));
    }

    #[test]
    fn an_expired_hold_of_ours_waits_for_the_renewal() {
        let h = hold(Some(&spec("shim-a", 0)), "shim-a", t(16));
        assert!(
            matches!(&h, Hold::Expired(why) if why.contains("expired")),
            "{h:?}"
        );
    }

    #[test]
    fn another_holder_or_none_means_we_lost_it() {
        let h = hold(Some(&spec("shim-b", 0)), "shim-a", t(1));
        assert!(
            matches!(&h, Hold::Lost(why) if why.contains("held by shim-b")),
            "{h:?}"
        );
        let h = hold(Some(&spec("", 0)), "shim-a", t(1));
        assert!(
            matches!(&h, Hold::Lost(why) if why.contains("nobody")),
            "{h:?}"
        );
        assert!(matches!(hold(None, "shim-a", t(1)), Hold::Lost(_)));
    }
}
