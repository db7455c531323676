//! `round_robin`: ticket `t` picks position `t mod n`.
//!
//! Ribbon's `RoundRobinRule` kept a CAS counter per client process, so N consumers produced N
//! interleaved rotations. Here the ticket comes from one counter shared by all consumers, so the
//! fleet as a whole visits each instance once per cycle of n picks.

use super::{Choice, Draw, Params, RuleDef, RuleError, Select, Standard};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct RoundRobin;

impl Select for RoundRobin {
    fn select(&self, draw: &Draw<'_>, _rng: &mut fastrand::Rng) -> Option<Choice> {
        draw.rotate(draw.ticket).map(Choice::at)
    }
}

impl RuleDef for RoundRobin {
    const NAME: &'static str = "round_robin";
    const LEASABLE: bool = true;

    fn standard(&self) -> Standard {
        Standard::RoundRobin
    }

    fn parse(_: &mut Params<'_>) -> Result<Self, RuleError> {
        Ok(RoundRobin)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::rules::testing::{instances, subset};

    fn pick(n: usize, ticket: u64) -> Option<usize> {
        let candidates = subset(instances(n));
        RoundRobin.select(&Draw::new(&candidates, ticket), &mut fastrand::Rng::with_seed(1)).map(|c| c.index)
    }

    #[test]
    fn consecutive_tickets_visit_each_instance_once_per_cycle() {
        let picks: Vec<usize> = (0..7).map(|ticket| pick(3, ticket).unwrap()).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2, 0]);
        assert_eq!(pick(0, 5), None);
    }

    #[test]
    fn an_excluded_instance_is_skipped_within_the_same_rotation() {
        let candidates = subset(instances(4));
        let excluded = [1usize];
        let picks: Vec<usize> = (0..6)
            .map(|ticket| {
                let draw = Draw { excluded: crate::rules::Excluded::new(&excluded), ..Draw::new(&candidates, ticket) };
                RoundRobin.select(&draw, &mut fastrand::Rng::with_seed(1)).unwrap().index
            })
            .collect();
        assert_eq!(picks, [0, 2, 3, 0, 2, 3]);
        let all = [0usize, 1, 2, 3];
        let none = Draw { excluded: crate::rules::Excluded::new(&all), ..Draw::new(&candidates, 0) };
        assert_eq!(RoundRobin.select(&none, &mut fastrand::Rng::with_seed(1)), None);
    }

    proptest! {
        #[test]
        fn any_window_of_n_tickets_covers_every_instance(n in 1usize..50, start in 0u64..u64::MAX / 2) {
            let mut seen = vec![0u32; n];
            for offset in 0..n as u64 {
                seen[pick(n, start + offset).unwrap()] += 1;
            }
            prop_assert!(seen.iter().all(|&c| c == 1));
        }
    }
}
