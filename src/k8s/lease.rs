//! Whether this replica may still write as the leader. The Lease library renews in the
//! background and, while the API server is unreachable, only logs and retries: it never says
//! the lock is gone. A leader cut off for longer than the Lease duration must not come back and
//! write over its successor, so before every cycle the leader reads the Lease itself.
//! (Holding it is what counts: taking a Lease changes its holder.)

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::LeaseSpec;

/// What the Lease says about this replica's leadership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// Ours and current: write.
    Ours,
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
    let expires = renewed.0 + duration;
    if now > expires {
        return Hold::Expired(format!(
            "our hold on the Lease expired at {}",
            crate::verdict::at(expires)
        ));
    }
    Hold::Ours
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
        assert_eq!(hold(Some(&spec("shim-a", 0)), "shim-a", t(10)), Hold::Ours);
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
