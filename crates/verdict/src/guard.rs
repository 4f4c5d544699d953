//! The mass-failure guard: an infrastructure-wide incident must not recycle a fleet.
//!
//! When, within one window, at least `min_count` Machines of a scope (or failure domain), or
//! at least `min_percent` of them, would newly turn `False`, the new `False` verdicts are
//! published as `Unknown`/`RemediationHeld` instead. A single failure is never a mass failure.

use jiff::{SignedDuration, Timestamp};

use super::{reason, Status, Verdict};

#[derive(Debug, Clone, PartialEq)]
pub struct MassFailureGuard {
    pub min_count: usize,
    pub min_percent: u32,
    pub window: SignedDuration,
}

impl Default for MassFailureGuard {
    fn default() -> Self {
        Self {
            min_count: 5,
            min_percent: 50,
            window: SignedDuration::from_mins(10),
        }
    }
}

/// One Machine of the scope: the engine's candidate verdict and, when the published
/// condition is already `False`, since when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScopeMember {
    pub candidate: Verdict,
    pub false_since: Option<Timestamp>,
}

/// What the guard decided for a scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuardOutcome {
    pub held: bool,
    /// Machines that turned or would turn `False` within the window.
    pub failing: usize,
    pub total: usize,
}

impl MassFailureGuard {
    /// Whether `failing` of `total` Machines is a mass failure.
    pub fn trips(&self, failing: usize, total: usize) -> bool {
        if failing < 2 || total == 0 {
            return false;
        }
        failing >= self.min_count
            || failing * 100 >= usize::try_from(self.min_percent).unwrap_or(100) * total
    }

    /// Applies the guard to one scope's candidate verdicts in place.
    pub fn apply(&self, members: &mut [ScopeMember], now: Timestamp) -> GuardOutcome {
        let recent = |m: &ScopeMember| {
            m.false_since
                .is_none_or(|t| now.duration_since(t) <= self.window)
        };
        let failing = members
            .iter()
            .filter(|m| m.candidate.status == Status::False && recent(m))
            .count();
        let total = members.len();
        let held = self.trips(failing, total);
        if held {
            for m in members.iter_mut() {
                // Already-published False verdicts stay; only new ones are held back.
                if m.candidate.status == Status::False && m.false_since.is_none() {
                    m.candidate = Verdict::new(
                        Status::Unknown,
                        reason::REMEDIATION_HELD,
                        format!(
                            "held by the mass-failure guard: {failing} of {total} Machines in this scope \
                             would turn False within {}s; was {}: {}",
                            self.window.as_secs(),
                            m.candidate.reason,
                            m.candidate.message
                        ),
                    );
                }
            }
        }
        GuardOutcome {
            held,
            failing,
            total,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(status: Status, false_since: Option<Timestamp>) -> ScopeMember {
        ScopeMember {
            candidate: Verdict::new(status, reason::VM_ERROR, "x"),
            false_since,
        }
    }

    fn now() -> Timestamp {
        "2026-01-01T00:00:00Z".parse().unwrap()
    }

    #[test]
    fn a_single_failure_is_never_held() {
        let g = MassFailureGuard::default();
        let mut m = vec![member(Status::False, None)];
        let out = g.apply(&mut m, now());
        assert!(!out.held);
        assert_eq!(m[0].candidate.status, Status::False);
    }

    #[test]
    fn two_of_five_pass_but_three_of_five_are_held() {
        let g = MassFailureGuard::default();
        let mut m: Vec<_> = (0..5)
            .map(|i| member(if i < 2 { Status::False } else { Status::True }, None))
            .collect();
        assert!(!g.apply(&mut m, now()).held);
        let mut m: Vec<_> = (0..5)
            .map(|i| member(if i < 3 { Status::False } else { Status::True }, None))
            .collect();
        let out = g.apply(&mut m, now());
        assert!(out.held);
        assert_eq!(out.failing, 3);
        assert!(m[..3]
            .iter()
            .all(|m| m.candidate.reason == reason::REMEDIATION_HELD
                && m.candidate.status == Status::Unknown));
        assert!(m[3..].iter().all(|m| m.candidate.status == Status::True));
    }

    #[test]
    fn five_failures_in_a_large_scope_are_held_by_count() {
        let g = MassFailureGuard::default();
        let mut m: Vec<_> = (0..100)
            .map(|i| member(if i < 5 { Status::False } else { Status::True }, None))
            .collect();
        assert!(g.apply(&mut m, now()).held);
        let mut m: Vec<_> = (0..100)
            .map(|i| member(if i < 4 { Status::False } else { Status::True }, None))
            .collect();
        assert!(!g.apply(&mut m, now()).held);
    }

    #[test]
    fn already_published_false_stays_and_old_failures_do_not_count() {
        let g = MassFailureGuard::default();
        let long_ago = now() - SignedDuration::from_mins(60);
        let recently = now() - SignedDuration::from_mins(1);
        // Four old failures (outside the window) and one new: not a mass failure.
        let mut m: Vec<_> = (0..4)
            .map(|_| member(Status::False, Some(long_ago)))
            .collect();
        m.extend((0..6).map(|_| member(Status::True, None)));
        m.push(member(Status::False, None));
        assert!(!g.apply(&mut m, now()).held);
        // Recent published failures count, stay False, and the new ones are held.
        let mut m: Vec<_> = (0..3)
            .map(|_| member(Status::False, Some(recently)))
            .collect();
        m.extend((0..10).map(|_| member(Status::True, None)));
        m.extend((0..2).map(|_| member(Status::False, None)));
        let out = g.apply(&mut m, now());
        assert!(out.held);
        assert!(m[..3].iter().all(|m| m.candidate.status == Status::False));
        assert!(m[13..]
            .iter()
            .all(|m| m.candidate.reason == reason::REMEDIATION_HELD));
    }
}
