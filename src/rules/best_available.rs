//! `best_available`: the instance with the fewest picks in flight, fleet-wide, skipping tripped
//! breakers (Ribbon's `BestAvailableRule`, fed by every consumer instead of one).
//!
//! Ties are broken by the shared rotation — the (t mod k)-th of the k least-loaded instances —
//! rather than by list position, so consumers reading the same counts do not all herd onto the
//! first instance. If every instance is tripped, it falls back to round robin and says so.

use super::availability::ALL_UNAVAILABLE;
use super::{Choice, Draw, Select, nth_kept};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct BestAvailable;

impl Select for BestAvailable {
    fn select(&self, draw: &Draw<'_>, _rng: &mut fastrand::Rng) -> Option<Choice> {
        let members = draw.members();
        // Read each instance's load once: the stats lookups dominate this rule's cost.
        let loads: Vec<crate::state::Load> = members.iter().map(|i| draw.stats.load(i)).collect();
        let usable = |index: usize, load: &crate::state::Load| !load.tripped && draw.accepts(index);
        let least = loads.iter().enumerate().filter(|(i, load)| usable(*i, load)).map(|(_, load)| load.in_flight).min();
        let Some(least) = least else {
            return draw.rotate(draw.ticket).map(|index| Choice { index, fallback: Some(ALL_UNAVAILABLE) });
        };
        nth_kept(&loads, draw.ticket, |index, load| usable(index, load) && load.in_flight == least).map(Choice::at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::testing::{FakeStats, instances, subset};
    use crate::state::Load;

    fn busy(n: u64) -> Load {
        Load { in_flight: n, ..Default::default() }
    }

    #[test]
    fn picks_the_least_loaded_and_rotates_ties() {
        let stats = FakeStats::default()
            .with("i00", busy(3))
            .with("i01", busy(1))
            .with("i02", Load { tripped: true, ..Default::default() })
            .with("i03", busy(1));
        let candidates = subset(instances(4));
        let mut rng = fastrand::Rng::with_seed(1);
        let picks: Vec<usize> = (0..4)
            .map(|ticket| {
                BestAvailable.select(&Draw { stats: &stats, ..Draw::new(&candidates, ticket) }, &mut rng).unwrap().index
            })
            .collect();
        assert_eq!(picks, [1, 3, 1, 3], "i02 is idle but tripped");
    }
}
