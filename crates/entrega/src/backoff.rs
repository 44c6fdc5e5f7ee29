//! Capped exponential backoff with jitter, for relay lanes and consumer retries.

use std::time::Duration;

use rand::Rng;

/// Delays that double with each attempt up to a cap, shortened by a random fraction so that
/// many instances failing together do not retry in lockstep.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Backoff {
    /// Delay after the first failure.
    pub base: Duration,
    /// Largest delay.
    pub max: Duration,
    /// Largest fraction (0.0..=1.0) taken off a delay at random; 0 makes delays exact.
    pub jitter: f64,
}

impl Default for Backoff {
    /// 1 s, 2 s, 4 s ... up to 60 s, each up to 20 % shorter (the seed's 1, 2, 4 s schedule).
    fn default() -> Self {
        Self::new(Duration::from_secs(1), Duration::from_secs(60))
    }
}

impl Backoff {
    /// Doubling from `base` up to `max`, with 20 % jitter.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            jitter: 0.2,
        }
    }

    /// The same schedule with another jitter fraction (clamped to 0.0..=1.0).
    pub fn with_jitter(mut self, jitter: f64) -> Self {
        self.jitter = if jitter.is_finite() {
            jitter.clamp(0.0, 1.0)
        } else {
            0.0
        };
        self
    }

    /// The delay before retrying after failed attempt number `attempt` (1-based), without
    /// jitter: `base * 2^(attempt - 1)`, at most `max`.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let doublings = attempt.saturating_sub(1).min(32);
        let factor = 1u64 << doublings;
        let base_ms = u64::try_from(self.base.as_millis()).unwrap_or(u64::MAX);
        let ms = base_ms.saturating_mul(factor);
        Duration::from_millis(ms).min(self.max)
    }

    /// The delay before retrying after failed attempt number `attempt` (1-based), with jitter.
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self.ceiling(attempt);
        if self.jitter <= 0.0 {
            return ceiling;
        }
        let cut = rand::thread_rng().gen_range(0.0..=self.jitter.min(1.0));
        ceiling.mul_f64(1.0 - cut)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1)).with_jitter(0.0);
        let delays: Vec<u128> = (1..=6).map(|a| b.delay(a).as_millis()).collect();
        assert_eq!(delays, vec![100, 200, 400, 800, 1000, 1000]);
        assert_eq!(
            b.delay(0),
            Duration::from_millis(100),
            "attempt 0 counts as the first"
        );
        assert_eq!(
            b.delay(u32::MAX),
            Duration::from_secs(1),
            "huge attempts do not overflow"
        );
    }

    #[test]
    fn jitter_stays_within_its_fraction() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(60)).with_jitter(0.5);
        for attempt in 1..8 {
            for _ in 0..50 {
                let d = b.delay(attempt);
                let ceiling = b.ceiling(attempt);
                assert!(
                    d <= ceiling && d >= ceiling.mul_f64(0.5),
                    "{d:?} vs {ceiling:?}"
                );
            }
        }
    }

    #[test]
    fn jitter_is_clamped() {
        assert_eq!(Backoff::default().with_jitter(7.0).jitter, 1.0);
        assert_eq!(Backoff::default().with_jitter(f64::NAN).jitter, 0.0);
    }
}
