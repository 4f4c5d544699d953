//! A fixed-size quantile sketch for boot times: log-spaced buckets of seconds, so a key's
//! memory does not grow with its Machines and two sketches merge by adding counts.
//!
//! Bound and error (tested below):
//! - at most [`BUCKETS`] counters (347) per sketch, whatever the number of samples;
//! - a quantile's rank is exact (nearest-rank over the counts), its value is within
//!   [`RELATIVE_ERROR`] (2 %) of the true sample of that rank for samples from 1 s to
//!   [`CEILING_SECS`] (10⁶ s, 11.6 days); below 1 s within 0.5 s; above the ceiling the
//!   last bucket reads the exact maximum. `count` and `max` are exact.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Relative error α of a quantile's value: a bucket spans (γ^(i-1), γ^i] with
/// γ = (1 + α) / (1 - α), and reads 2γ^i / (γ + 1), within α of anything in it.
pub const RELATIVE_ERROR: f64 = 0.02;
/// Samples above this share the last bucket.
pub const CEILING_SECS: f64 = 1e6;
/// Bucket 0 holds samples up to 1 s; buckets 1..BUCKETS the log-spaced rest.
pub const BUCKETS: usize = 347;

fn gamma() -> f64 {
    (1.0 + RELATIVE_ERROR) / (1.0 - RELATIVE_ERROR)
}

fn bucket(secs: f64) -> u16 {
    if secs.is_nan() || secs <= 1.0 {
        return 0;
    }
    let i = (secs.min(CEILING_SECS).ln() / gamma().ln()).ceil();
    // `as` saturates; the clamp keeps a rounding at the ceiling inside the range.
    (i as u16).clamp(1, (BUCKETS - 1) as u16)
}

fn reading(bucket: u16) -> f64 {
    if bucket == 0 {
        return 0.5;
    }
    let g = gamma();
    2.0 * g.powi(i32::from(bucket)) / (g + 1.0)
}

/// Boot times in seconds, summarised with bounded memory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Sketch {
    /// Samples per bucket; only buckets that hold some (at most [`BUCKETS`]).
    counts: BTreeMap<u16, u64>,
    count: u64,
    min: Option<f64>,
    max: Option<f64>,
}

impl Sketch {
    pub fn add(&mut self, secs: f64) {
        let secs = if secs.is_finite() { secs.max(0.0) } else { 0.0 };
        *self.counts.entry(bucket(secs)).or_default() += 1;
        self.count += 1;
        self.min = Some(self.min.map_or(secs, |m| m.min(secs)));
        self.max = Some(self.max.map_or(secs, |m| m.max(secs)));
    }

    pub fn merge(&mut self, other: &Sketch) {
        for (b, n) in &other.counts {
            *self.counts.entry(*b).or_default() += n;
        }
        self.count += other.count;
        for (mine, theirs, pick) in [
            (&mut self.min, other.min, f64::min as fn(f64, f64) -> f64),
            (&mut self.max, other.max, f64::max),
        ] {
            if let Some(t) = theirs {
                *mine = Some(mine.map_or(t, |m| pick(m, t)));
            }
        }
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn max(&self) -> Option<f64> {
        self.max
    }

    /// Buckets in use; never more than [`BUCKETS`].
    pub fn buckets_used(&self) -> usize {
        self.counts.len()
    }

    /// The `q`-quantile (0 ≤ q ≤ 1) by nearest rank: the value of the ⌈q·n⌉-th smallest
    /// sample (the smallest for q = 0), within the error above; `None` when empty. Clamped
    /// to the exact min and max, which only makes it closer.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        let b = self.counts.iter().find_map(|(b, n)| {
            seen += n;
            (seen >= rank).then_some(*b)
        })?;
        let (min, max) = (self.min?, self.max?);
        if usize::from(b) == BUCKETS - 1 && max >= CEILING_SECS {
            return Some(max);
        }
        Some(reading(b).clamp(min, max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The exact nearest-rank quantile of `samples`.
    fn exact(samples: &[f64], q: f64) -> f64 {
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let rank = ((q * s.len() as f64).ceil() as usize).max(1);
        s[rank - 1]
    }

    #[test]
    fn bucket_count_covers_the_ceiling() {
        assert_eq!(usize::from(bucket(CEILING_SECS)), BUCKETS - 1);
        assert!(
            usize::from(bucket(CEILING_SECS / gamma())) < BUCKETS - 1,
            "BUCKETS is not larger than it needs to be"
        );
        assert_eq!(bucket(0.0), 0);
        assert_eq!(bucket(1.0), 0);
        assert_eq!(bucket(1.01), 1);
    }

    #[test]
    fn memory_is_bounded_by_the_bucket_count() {
        // 0 s to 2·10⁶ s in steps of 0.1 % (finer than a bucket, so every bucket fills),
        // 200 times over: 3 million samples.
        let sweep: Vec<f64> = std::iter::successors(Some(0.5), |x| Some(x * 1.001))
            .take_while(|x| *x < 2e6)
            .chain([0.0, 2e6])
            .collect();
        let mut s = Sketch::default();
        for _ in 0..200 {
            for x in &sweep {
                s.add(*x);
            }
        }
        assert_eq!(s.count(), 200 * sweep.len() as u64);
        assert!(s.count() > 3_000_000);
        assert_eq!(s.buckets_used(), BUCKETS);
        assert_eq!(s.max(), Some(2e6));
        assert_eq!(s.quantile(1.0), Some(2e6), "above the ceiling reads max");
        assert_eq!(s.quantile(0.0), Some(0.5), "0 s read within half a second");
    }

    #[test]
    fn empty_and_single() {
        let mut s = Sketch::default();
        assert_eq!(s.quantile(0.5), None);
        s.add(90.0);
        assert_eq!(s.quantile(0.0), Some(90.0));
        assert_eq!(
            s.quantile(0.95),
            Some(90.0),
            "clamped to the exact min and max"
        );
    }

    #[test]
    fn nonsense_samples_count_as_zero() {
        let mut s = Sketch::default();
        s.add(-5.0);
        s.add(f64::NAN);
        assert_eq!(s.count(), 2);
        assert_eq!(s.max(), Some(0.0));
    }

    #[test]
    fn merged_equals_added_together() {
        let (mut a, mut b, mut both) = (Sketch::default(), Sketch::default(), Sketch::default());
        for secs in 1..=100 {
            let x = f64::from(secs) * 3.0;
            if secs % 3 == 0 { &mut a } else { &mut b }.add(x);
            both.add(x);
        }
        a.merge(&b);
        assert_eq!(a, both);
    }

    proptest! {
        #[test]
        fn quantiles_are_within_the_documented_error(
            samples in prop::collection::vec(1.0f64..CEILING_SECS, 1..400),
            q in 0.0f64..=1.0,
        ) {
            let mut s = Sketch::default();
            for x in &samples {
                s.add(*x);
            }
            let got = s.quantile(q).unwrap();
            let want = exact(&samples, q);
            prop_assert!(
                (got - want).abs() <= RELATIVE_ERROR * want + 1e-9,
                "q={q} got {got} want {want}"
            );
        }

        #[test]
        fn below_one_second_within_half_a_second(
            samples in prop::collection::vec(0.0f64..=1.0, 1..50),
            q in 0.0f64..=1.0,
        ) {
            let mut s = Sketch::default();
            for x in &samples {
                s.add(*x);
            }
            let got = s.quantile(q).unwrap();
            prop_assert!((got - exact(&samples, q)).abs() <= 0.5 + 1e-9);
        }
    }
}
