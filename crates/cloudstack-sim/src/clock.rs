//! The simulated clock: `start + real elapsed × time_scale + manual advances`.

use std::time::Instant;

use super::world::Ms;

#[derive(Debug, Clone)]
pub struct SimClock {
    start_sim_ms: Ms,
    start_real: Instant,
    scale: f64,
    advanced_ms: Ms,
}

impl SimClock {
    /// A clock starting at `start_sim_ms` (ms since the Unix epoch) now, running `scale`
    /// times faster than real time (0 freezes it: only manual advances move it).
    pub fn new(start_sim_ms: Ms, scale: f64) -> Self {
        let scale = if scale.is_finite() && scale >= 0.0 {
            scale
        } else {
            1.0
        };
        Self {
            start_sim_ms,
            start_real: Instant::now(),
            scale,
            advanced_ms: 0,
        }
    }

    /// A clock starting at the current wall-clock time.
    pub fn starting_now(scale: f64) -> Self {
        Self::new(real_now_ms(), scale)
    }

    pub fn now_ms(&self) -> Ms {
        let real = self.start_real.elapsed().as_secs_f64() * 1000.0 * self.scale;
        self.start_sim_ms + (real.min(1e15) as Ms) + self.advanced_ms
    }

    /// Moves simulated time forward (negative or non-finite values are ignored).
    pub fn advance_ms(&mut self, ms: Ms) {
        if ms > 0 {
            self.advanced_ms = self.advanced_ms.saturating_add(ms);
        }
    }

    pub fn scale(&self) -> f64 {
        self.scale
    }

    pub fn advanced_ms(&self) -> Ms {
        self.advanced_ms
    }

    pub fn start_ms(&self) -> Ms {
        self.start_sim_ms
    }
}

/// Wall-clock time in ms since the epoch (used for `expires`, which CloudStack checks
/// against its real clock).
pub fn real_now_ms() -> Ms {
    jiff::Timestamp::now().as_millisecond()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frozen_clock_moves_only_by_advances() {
        let mut c = SimClock::new(1_000, 0.0);
        assert_eq!(c.now_ms(), 1_000);
        c.advance_ms(5_000);
        c.advance_ms(-7);
        assert_eq!(c.now_ms(), 6_000);
    }
}
