//! `random`: uniform over the eligible instances.
//!
//! The index is drawn over the eligible list itself, never (as Ribbon's `RandomRule` once did)
//! with the size of the full list, which could point past the eligible ones.

use super::{Choice, Draw, Params, RuleDef, RuleError, Select, Standard};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Random;

impl Select for Random {
    fn select(&self, draw: &Draw<'_>, rng: &mut fastrand::Rng) -> Option<Choice> {
        let accepted = draw.accepted();
        (accepted > 0).then(|| Choice::at(draw.excluded.nth_accepted(rng.usize(..accepted))))
    }
}

impl RuleDef for Random {
    const NAME: &'static str = "random";

    fn standard(&self) -> Standard {
        Standard::RoundRobin
    }

    fn parse(_: &mut Params<'_>) -> Result<Self, RuleError> {
        Ok(Random)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::rules::testing::{instances, subset};

    #[test]
    fn spreads_roughly_evenly() {
        let candidates = subset(instances(4));
        let mut rng = fastrand::Rng::with_seed(7);
        let mut counts = [0u32; 4];
        for ticket in 0..40_000 {
            counts[Random.select(&Draw::new(&candidates, ticket), &mut rng).unwrap().index] += 1;
        }
        // Expected 10,000 each; 5 standard deviations is about ±430.
        for count in counts {
            assert!((9_500..=10_500).contains(&count), "{counts:?}");
        }
    }

    proptest! {
        #[test]
        fn always_within_the_eligible_list(n in 1usize..100, seed in any::<u64>()) {
            let candidates = subset(instances(n));
            let mut rng = fastrand::Rng::with_seed(seed);
            prop_assert!(Random.select(&Draw::new(&candidates, 0), &mut rng).unwrap().index < n);
        }
    }
}
