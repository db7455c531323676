//! `sticky(ttl=T)`: request key → instance, remembered centrally for `ttl` (refreshed on use).
//!
//! The balancer keeps the assignments (in the state backend) and keeps one while its instance
//! is eligible, not excluded and not tripped. A new or reassigned key takes the next available
//! instance in the rotation — this selection, which is `availability_filtering` without a limit:
//! O(log n) on the subset's load index.

use std::time::Duration;

use super::{AvailabilityFiltering, Choice, Draw, Needs, Params, RuleDef, RuleError, Select, Standard};

/// Default time an unused assignment is remembered.
pub const DEFAULT_TTL: Duration = Duration::from_secs(600);
/// Accepted `ttl` values.
pub const TTL_RANGE: std::ops::RangeInclusive<Duration> = Duration::from_secs(1)..=Duration::from_secs(7 * 86_400);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sticky {
    pub ttl: Duration,
}

impl Default for Sticky {
    fn default() -> Self {
        Self { ttl: DEFAULT_TTL }
    }
}

impl Select for Sticky {
    fn select(&self, draw: &Draw<'_>, rng: &mut fastrand::Rng) -> Option<Choice> {
        AvailabilityFiltering::default().select(draw, rng)
    }
}

impl RuleDef for Sticky {
    const NAME: &'static str = "sticky";
    const PARAMS: &'static [&'static str] = &["ttl"];

    fn standard(&self) -> Standard {
        Standard::RingHash
    }

    fn parse(params: &mut Params<'_>) -> Result<Self, RuleError> {
        Ok(Sticky { ttl: params.duration("ttl", TTL_RANGE)?.unwrap_or(DEFAULT_TTL) })
    }

    fn canonical(&self) -> String {
        format!("sticky(ttl={})", crate::duration::format(self.ttl))
    }

    fn needs(&self) -> Needs {
        Needs { load: true, ..Needs::default() }
    }

    fn needs_key(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::short_duration;

    #[test]
    fn the_ttl_range_reads_as_the_error_says() {
        assert_eq!((short_duration(*TTL_RANGE.start()), short_duration(*TTL_RANGE.end())), ("1s".into(), "7d".into()));
    }
}
