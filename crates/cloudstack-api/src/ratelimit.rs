//! A token bucket per CloudStack endpoint, so the shim stays well inside the account's
//! `api.throttling.max` per `api.throttling.interval` (cloudstack-api.md §5.3).
//!
//! The bucket works by reservation: each caller takes a token at once (the balance may go
//! negative) and waits until its token has been refilled. Waiters are thus served in order and
//! each learns exactly how long it has to wait; the refill arithmetic is pure and takes the
//! current time as an argument so it can be tested without clocks.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::error::CloudStackError;

/// Requests per second and burst size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RateLimit {
    pub per_second: f64,
    pub burst: u32,
}

impl RateLimit {
    pub fn new(per_second: f64, burst: u32) -> Result<Self, CloudStackError> {
        let r = Self { per_second, burst };
        r.validate()?;
        Ok(r)
    }

    pub fn validate(&self) -> Result<(), CloudStackError> {
        if !(self.per_second.is_finite() && self.per_second > 0.0) {
            return Err(CloudStackError::config(
                "rate limit must allow a positive, finite number of requests per second",
            ));
        }
        if self.burst == 0 {
            return Err(CloudStackError::config(
                "rate limit burst must be at least 1",
            ));
        }
        Ok(())
    }
}

#[derive(Debug)]
struct State {
    /// Available tokens; negative = tokens already promised to waiting callers.
    tokens: f64,
    last: Instant,
}

/// The token bucket.
#[derive(Debug)]
pub struct TokenBucket {
    limit: RateLimit,
    state: Mutex<State>,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(limit: RateLimit) -> Result<Self, CloudStackError> {
        Self::new_at(limit, Instant::now())
    }

    /// A full bucket whose clock starts at `now`.
    pub fn new_at(limit: RateLimit, now: Instant) -> Result<Self, CloudStackError> {
        limit.validate()?;
        Ok(Self {
            limit,
            state: Mutex::new(State {
                tokens: f64::from(limit.burst),
                last: now,
            }),
        })
    }

    pub fn limit(&self) -> RateLimit {
        self.limit
    }

    /// Takes one token at time `now` and returns how long the caller must wait before using
    /// it (zero when a token was available). Pure apart from the bucket's own state.
    pub fn reserve_at(&self, now: Instant) -> Duration {
        // A poisoned lock only means another thread panicked mid-update; the numbers are
        // still usable.
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        // time never runs backwards for the bucket
        if now > st.last {
            let elapsed = now.duration_since(st.last).as_secs_f64();
            st.tokens =
                (st.tokens + elapsed * self.limit.per_second).min(f64::from(self.limit.burst));
            st.last = now;
        }
        st.tokens -= 1.0;
        if st.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64((-st.tokens) / self.limit.per_second)
        }
    }

    /// Tokens available at `now` without taking one (negative = callers queued).
    pub fn available_at(&self, now: Instant) -> f64 {
        let st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let elapsed = now.saturating_duration_since(st.last).as_secs_f64();
        (st.tokens + elapsed * self.limit.per_second).min(f64::from(self.limit.burst))
    }

    /// Waits for a token; returns how long it waited (for metrics).
    pub async fn acquire(&self) -> Duration {
        let wait = self.reserve_at(Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn burst_then_spaced_by_the_rate() {
        let t0 = Instant::now();
        let b = TokenBucket::new_at(RateLimit::new(10.0, 3).unwrap(), t0).unwrap();
        // three immediate tokens
        for _ in 0..3 {
            assert_eq!(b.reserve_at(t0), Duration::ZERO);
        }
        // then each reservation waits one more 100 ms slot
        assert_eq!(b.reserve_at(t0), ms(100));
        assert_eq!(b.reserve_at(t0), ms(200));
        // 250 ms later: -2 + 2.5 = 0.5 tokens: the next caller waits for the missing half token
        let t1 = t0 + ms(250);
        let w = b.reserve_at(t1);
        assert!((w.as_secs_f64() - 0.05).abs() < 1e-9, "{w:?}");
        // 200 ms after that: -0.5 + 2 = 1.5 tokens: one free, the next waits 50 ms
        let t2 = t1 + ms(200);
        assert_eq!(b.reserve_at(t2), Duration::ZERO);
        let w = b.reserve_at(t2);
        assert!((w.as_secs_f64() - 0.05).abs() < 1e-9, "{w:?}");
    }

    #[test]
    fn refill_is_capped_at_burst() {
        let t0 = Instant::now();
        let b = TokenBucket::new_at(RateLimit::new(1.0, 2).unwrap(), t0).unwrap();
        let later = t0 + Duration::from_secs(3600);
        assert!((b.available_at(later) - 2.0).abs() < 1e-9);
        assert_eq!(b.reserve_at(later), Duration::ZERO);
        assert_eq!(b.reserve_at(later), Duration::ZERO);
        assert_eq!(b.reserve_at(later), Duration::from_secs(1));
    }

    #[test]
    fn earlier_timestamps_do_not_refill() {
        let t0 = Instant::now() + Duration::from_secs(10);
        let b = TokenBucket::new_at(RateLimit::new(1.0, 1).unwrap(), t0).unwrap();
        assert_eq!(b.reserve_at(t0), Duration::ZERO);
        // a caller whose clock reading is older than the last refill gets no free token
        assert_eq!(
            b.reserve_at(t0 - Duration::from_secs(5)),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn invalid_limits_are_rejected() {
        assert!(RateLimit::new(0.0, 1).is_err());
        assert!(RateLimit::new(f64::NAN, 1).is_err());
        assert!(RateLimit::new(5.0, 0).is_err());
    }
}
