//! Ribbon's circuit breaker for one instance: tripped at `failure_threshold` successive
//! failures (this replica's and the other replicas' together), open for
//! `blackout_base × 2^(failures − threshold)` capped at `blackout_max` from the last failure,
//! closed by a success.

use std::time::Duration;

use tokio::time::Instant;

/// Ribbon's circuit-breaker parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BreakerConfig {
    pub failure_threshold: u32,
    pub blackout_base: Duration,
    pub blackout_max: Duration,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self { failure_threshold: 3, blackout_base: Duration::from_secs(10), blackout_max: Duration::from_secs(30) }
    }
}

impl BreakerConfig {
    /// How long an instance with `failures` successive failures stays tripped.
    pub fn blackout(&self, failures: u32) -> Duration {
        if failures < self.failure_threshold {
            return Duration::ZERO;
        }
        let doublings = (failures - self.failure_threshold).min(31);
        self.blackout_base.saturating_mul(1 << doublings).min(self.blackout_max)
    }
}

/// One instance's breaker as this replica keeps it.
#[derive(Debug, Default)]
pub struct Breaker {
    successive_failures: u32,
    tripped_until: Option<Instant>,
}

impl Breaker {
    /// Failures in a row reported to this replica.
    pub fn successive_failures(&self) -> u32 {
        self.successive_failures
    }

    /// The end of the blackout this replica started, if any (it may be over).
    pub fn tripped_until(&self) -> Option<Instant> {
        self.tripped_until
    }

    /// A success closes the breaker.
    pub fn success(&mut self) {
        self.successive_failures = 0;
        self.tripped_until = None;
    }

    /// One more failure at `now`; `others` are the other replicas' successive failures, which
    /// count towards the threshold too.
    pub fn failure(&mut self, now: Instant, config: &BreakerConfig, others: u32) {
        self.successive_failures = self.successive_failures.saturating_add(1);
        let blackout = config.blackout(self.successive_failures.saturating_add(others));
        if !blackout.is_zero() {
            self.tripped_until = Some(now + blackout);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fleets_failures_trip_it_and_a_success_closes_it() {
        let config = BreakerConfig::default();
        let now = Instant::now();
        let mut breaker = Breaker::default();
        breaker.failure(now, &config, 0);
        assert_eq!(breaker.tripped_until(), None, "one failure of three");
        breaker.failure(now, &config, 1);
        assert_eq!(breaker.tripped_until(), Some(now + config.blackout_base), "two here and one elsewhere");
        breaker.success();
        assert_eq!((breaker.successive_failures(), breaker.tripped_until()), (0, None));
    }
}
