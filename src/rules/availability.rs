//! `availability_filtering(limit=N)`: skip instances whose circuit breaker is tripped or whose
//! in-flight count reached `limit`, then round robin over the rest (Ribbon's
//! `AvailabilityFilteringRule`, whose state here is fleet-wide).
//!
//! When every instance is filtered out, the pick goes round robin over all of them, as Ribbon's
//! rule fell back to its parent, and the response says so.

use super::{Choice, Draw, Select, StatsView, nth_kept};
use crate::registry::Instance;

/// Most accepted in-flight limit.
pub const MAX_LIMIT: u64 = 1_000_000_000;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct AvailabilityFiltering {
    /// Skip instances with at least this many picks in flight; `None` = no limit.
    pub limit: Option<u64>,
}

pub const ALL_UNAVAILABLE: &str =
    "every eligible instance is tripped or at its in-flight limit; picked ignoring availability";

/// Ribbon's `AvailabilityPredicate`.
pub fn is_available(stats: &dyn StatsView, instance: &Instance, limit: Option<u64>) -> bool {
    let load = stats.load(instance);
    !load.tripped && limit.is_none_or(|limit| load.in_flight < limit)
}

impl Select for AvailabilityFiltering {
    fn select(&self, draw: &Draw<'_>, _rng: &mut fastrand::Rng) -> Option<Choice> {
        let members = draw.members();
        // Read each instance's load once: the stats lookups dominate this rule's cost.
        let available: Vec<bool> = members.iter().map(|i| is_available(draw.stats, i, self.limit)).collect();
        if let Some(index) = nth_kept(&available, draw.ticket, |index, ok| *ok && draw.accepts(index)) {
            return Some(Choice::at(index));
        }
        draw.rotate(draw.ticket).map(|index| Choice { index, fallback: Some(ALL_UNAVAILABLE) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::testing::{FakeStats, instances, subset};
    use crate::state::Load;

    fn picks(rule: AvailabilityFiltering, stats: &FakeStats, count: u64) -> Vec<usize> {
        let candidates = subset(instances(4));
        let mut rng = fastrand::Rng::with_seed(1);
        (0..count)
            .map(|ticket| {
                let draw = Draw { stats, ..Draw::new(&candidates, ticket) };
                rule.select(&draw, &mut rng).unwrap().index
            })
            .collect()
    }

    #[test]
    fn skips_tripped_and_busy_instances_and_rotates_over_the_rest() {
        let stats = FakeStats::default()
            .with("i01", Load { tripped: true, ..Default::default() })
            .with("i02", Load { in_flight: 5, ..Default::default() });
        assert_eq!(picks(AvailabilityFiltering { limit: Some(5) }, &stats, 4), [0, 3, 0, 3]);
        assert_eq!(picks(AvailabilityFiltering { limit: None }, &stats, 3), [0, 2, 3]);
    }

    #[test]
    fn all_filtered_falls_back_to_round_robin_and_says_so() {
        let tripped = Load { tripped: true, ..Default::default() };
        let stats = ["i00", "i01", "i02", "i03"].iter().fold(FakeStats::default(), |s, id| s.with(id, tripped));
        let candidates = subset(instances(4));
        let draw = Draw { stats: &stats, ..Draw::new(&candidates, 6) };
        let choice = AvailabilityFiltering::default().select(&draw, &mut fastrand::Rng::with_seed(1)).unwrap();
        assert_eq!(choice, Choice { index: 2, fallback: Some(ALL_UNAVAILABLE) });
    }
}
