//! `round_robin`: ticket `t` picks position `t mod n`.
//!
//! Ribbon's `RoundRobinRule` kept a CAS counter per client process, so N consumers produced N
//! interleaved rotations. Here the ticket comes from one counter shared by all consumers, so the
//! fleet as a whole visits each instance once per cycle of n picks.

use super::{Draw, Select};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct RoundRobin;

impl Select for RoundRobin {
    fn select(&self, draw: &Draw<'_>, _rng: &mut fastrand::Rng) -> Option<usize> {
        let n = draw.candidates.len() as u64;
        (n > 0).then(|| (draw.ticket % n) as usize)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::rules::testing::instances;

    #[test]
    fn consecutive_tickets_visit_each_instance_once_per_cycle() {
        let candidates = instances(3);
        let mut rng = fastrand::Rng::with_seed(1);
        let picks: Vec<usize> = (0..7)
            .map(|ticket| RoundRobin.select(&Draw { candidates: &candidates, ticket, key: "" }, &mut rng).unwrap())
            .collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2, 0]);
    }

    #[test]
    fn no_candidates_no_pick() {
        let mut rng = fastrand::Rng::with_seed(1);
        assert_eq!(RoundRobin.select(&Draw { candidates: &[], ticket: 5, key: "" }, &mut rng), None);
    }

    proptest! {
        #[test]
        fn any_window_of_n_tickets_covers_every_instance(n in 1usize..50, start in any::<u64>()) {
            let candidates = instances(n);
            let mut rng = fastrand::Rng::with_seed(1);
            let mut seen = vec![0u32; n];
            for offset in 0..n as u64 {
                let ticket = start.wrapping_add(offset);
                let draw = Draw { candidates: &candidates, ticket, key: "" };
                seen[RoundRobin.select(&draw, &mut rng).unwrap()] += 1;
            }
            // A window that wraps past u64::MAX restarts at 0 and may repeat one position.
            if start.checked_add(n as u64).is_some() {
                prop_assert!(seen.iter().all(|&c| c == 1));
            }
        }
    }
}
