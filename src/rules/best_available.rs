//! `best_available`: the instance with the fewest picks in flight, fleet-wide, skipping tripped
//! breakers (Ribbon's `BestAvailableRule`, fed by every consumer instead of one).
//!
//! Ties are broken by the shared rotation — the (t mod k)-th of the k least-loaded instances —
//! rather than by list position, so consumers reading the same counts do not all herd onto the
//! first instance. If every instance is tripped, it falls back to round robin and says so.
//!
//! Cost: O(log n) per pick on the subset's [`LoadIndex`](super::LoadIndex) (least in-flight
//! count and the k-th of its ties, from a segment tree), O(e log n) with e excluded.

use super::availability::ALL_UNAVAILABLE;
use super::{Choice, Draw, Needs, Params, RuleDef, RuleError, Select, Standard};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct BestAvailable;

impl Select for BestAvailable {
    fn select(&self, draw: &Draw<'_>, _rng: &mut fastrand::Rng) -> Option<Choice> {
        match draw.loads(|loads| loads.least_loaded(draw.ticket))? {
            Some(index) => Some(Choice::at(index)),
            None => draw.rotate(draw.ticket).map(|index| Choice { index, fallback: Some(ALL_UNAVAILABLE) }),
        }
    }
}

impl RuleDef for BestAvailable {
    const NAME: &'static str = "best_available";

    fn standard(&self) -> Standard {
        Standard::LeastRequest
    }

    fn parse(_: &mut Params<'_>) -> Result<Self, RuleError> {
        Ok(BestAvailable)
    }

    fn needs(&self) -> Needs {
        Needs { load: true, ..Needs::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::Load;
    use crate::rules::testing::{instances, subset, with_loads};

    fn busy(n: u64) -> Load {
        Load { in_flight: n, ..Default::default() }
    }

    #[test]
    fn picks_the_least_loaded_and_rotates_ties() {
        let tripped = Load { tripped: true, ..Default::default() };
        let candidates =
            with_loads(subset(instances(4)), &[("i00", busy(3)), ("i01", busy(1)), ("i02", tripped), ("i03", busy(1))]);
        let mut rng = fastrand::Rng::with_seed(1);
        let picks: Vec<usize> = (0..4)
            .map(|ticket| BestAvailable.select(&Draw::new(&candidates, ticket), &mut rng).unwrap().index)
            .collect();
        assert_eq!(picks, [1, 3, 1, 3], "i02 is idle but tripped");
    }

    #[test]
    fn every_instance_tripped_falls_back_to_the_rotation() {
        let tripped = Load { tripped: true, ..Default::default() };
        let candidates = with_loads(subset(instances(2)), &[("i00", tripped), ("i01", tripped)]);
        let choice = BestAvailable.select(&Draw::new(&candidates, 3), &mut fastrand::Rng::with_seed(1)).unwrap();
        assert_eq!(choice, Choice { index: 1, fallback: Some(ALL_UNAVAILABLE) });
    }
}
