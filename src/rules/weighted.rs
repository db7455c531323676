//! `weighted`: static weights from registration, interleaved, exact over every cycle.
//!
//! The subset's weights (reduced by their greatest common divisor) define a cycle of
//! `W = Σ weights` slots. The slots are ordered by earliest-deadline-first: instance i's k-th
//! slot is due at `(2k + 1) / 2wᵢ`, so instances are interleaved as evenly as their weights allow
//! (ties go to the lower position), and each instance appears
//! exactly wᵢ times per cycle. Ticket t takes slot `t mod W`, so the whole fleet of consumers
//! walks one schedule. Weight 0 is never picked.
//!
//! The schedule is built once per snapshot subset, when it is published, in O(W log n). If W exceeds
//! [`MAX_CYCLE`], weights are scaled down proportionally (never below 1 for a non-zero weight)
//! to bound memory; shares are then exact for the scaled weights.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::{Choice, Draw, Needs, Params, RuleDef, RuleError, Select, Standard};

/// Longest schedule kept per subset (4 MiB of slots).
pub const MAX_CYCLE: u64 = 1 << 20;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Weighted;

impl Select for Weighted {
    fn select(&self, draw: &Draw<'_>, _rng: &mut fastrand::Rng) -> Option<Choice> {
        let built = draw.candidates.tables.schedule.load();
        let built = built.as_ref()?;
        let slots = &built.table.slots;
        if slots.is_empty() {
            return None;
        }
        // An excluded instance's slots are skipped: the next slot of the same schedule answers.
        // A schedule built for an earlier snapshot's members is read through their ids.
        let start = (draw.ticket % slots.len() as u64) as usize;
        (0..slots.len())
            .filter_map(|step| built.position(slots[(start + step) % slots.len()] as usize, &draw.candidates.subset))
            .find(|&index| draw.accepts(index))
            .map(Choice::at)
    }
}

impl RuleDef for Weighted {
    const NAME: &'static str = "weighted";
    const LEASABLE: bool = true;

    fn standard(&self) -> Standard {
        Standard::RoundRobin
    }

    fn parse(_: &mut Params<'_>) -> Result<Self, RuleError> {
        Ok(Weighted)
    }

    fn needs(&self) -> Needs {
        Needs { schedule: true, ..Needs::default() }
    }
}

/// One cycle of instance positions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WeightSchedule {
    pub slots: Vec<u32>,
}

impl WeightSchedule {
    /// The earliest-deadline-first cycle for `weights`.
    pub fn build(weights: &[u64]) -> Self {
        let weights = normalize(weights);
        let total: u64 = weights.iter().sum();
        let mut heap: BinaryHeap<Slot> = weights
            .iter()
            .enumerate()
            .filter(|(_, w)| **w > 0)
            .map(|(index, &weight)| Slot { numerator: 1, weight, index: index as u32 })
            .collect();
        let mut slots = Vec::with_capacity(total as usize);
        while let Some(mut slot) = heap.pop() {
            slots.push(slot.index);
            // Next deadline (2k + 1) / 2w, with k counted in the numerator.
            slot.numerator += 2;
            if slot.numerator < 2 * slot.weight {
                heap.push(slot);
            }
        }
        Self { slots }
    }
}

/// Divides by the gcd, then scales down if the cycle would be too long.
fn normalize(weights: &[u64]) -> Vec<u64> {
    let divisor = weights.iter().copied().filter(|w| *w > 0).fold(0, gcd).max(1);
    let mut reduced: Vec<u64> = weights.iter().map(|w| w / divisor).collect();
    let total: u64 = reduced.iter().sum();
    if total > MAX_CYCLE {
        let nonzero = reduced.iter().filter(|w| **w > 0).count() as u64;
        let budget = MAX_CYCLE.saturating_sub(nonzero).max(1);
        for w in &mut reduced {
            if *w > 0 {
                *w = 1 + (*w as u128 * budget as u128 / total as u128) as u64;
            }
        }
    }
    reduced
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// A pending slot with deadline `numerator / (2 · weight)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    numerator: u64,
    weight: u64,
    index: u32,
}

impl Ord for Slot {
    /// Max-heap order reversed: the earliest deadline first, then the lowest position.
    fn cmp(&self, other: &Self) -> Ordering {
        let lhs = u128::from(self.numerator) * u128::from(other.weight);
        let rhs = u128::from(other.numerator) * u128::from(self.weight);
        rhs.cmp(&lhs).then_with(|| other.index.cmp(&self.index))
    }
}

impl PartialOrd for Slot {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

#[cfg(test)]
mod exclusion_tests {
    use super::*;
    use crate::rules::Excluded;
    use crate::rules::testing::{instance, subset};

    #[test]
    fn excluded_slots_are_skipped_and_the_rest_of_the_schedule_stays() {
        let candidates = subset(vec![instance("a", "", 3), instance("b", "", 1), instance("c", "", 1)]);
        let slots = candidates.tables.schedule.load().as_ref().unwrap().table.slots.clone();
        let excluded = [0usize];
        for ticket in 0..slots.len() as u64 * 2 {
            let plain = Draw::new(&candidates, ticket);
            let retry = Draw { excluded: Excluded::new(&excluded), ..plain };
            let before = Weighted.select(&plain, &mut fastrand::Rng::with_seed(1)).unwrap().index;
            let after = Weighted.select(&retry, &mut fastrand::Rng::with_seed(1)).unwrap().index;
            assert_ne!(after, 0);
            if before != 0 {
                assert_eq!(before, after, "ticket {ticket}: slots of other instances do not move");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn letters(weights: &[u64]) -> String {
        WeightSchedule::build(weights).slots.iter().map(|&i| char::from(b'A' + i as u8)).collect()
    }

    #[test]
    fn interleaves_rather_than_bunching() {
        assert_eq!(letters(&[5, 1, 1]), "AAABCAA");
        assert_eq!(letters(&[2, 1]), "ABA");
        assert_eq!(letters(&[100, 100, 100]), "ABC", "reduced by the gcd");
        assert_eq!(letters(&[3, 0, 1]), "AACA", "weight 0 never appears");
        assert_eq!(letters(&[0, 0]), "");
    }

    proptest! {
        #[test]
        fn every_cycle_gives_exact_shares(weights in proptest::collection::vec(0u64..50, 1..12)) {
            let schedule = WeightSchedule::build(&weights);
            let divisor = weights.iter().copied().filter(|w| *w > 0).fold(0, gcd).max(1);
            let mut counts = vec![0u64; weights.len()];
            for &slot in &schedule.slots {
                counts[slot as usize] += 1;
            }
            let expected: Vec<u64> = weights.iter().map(|w| w / divisor).collect();
            prop_assert_eq!(counts, expected);
        }

        #[test]
        fn no_instance_waits_much_longer_than_its_share(weights in proptest::collection::vec(1u64..20, 2..8)) {
            // Smoothness: between two appearances of instance i there are at most about W/wᵢ
            // slots (EDF keeps every instance within one slot of its ideal spacing).
            let schedule = WeightSchedule::build(&weights);
            let divisor = weights.iter().copied().fold(0, gcd);
            let total: u64 = weights.iter().map(|w| w / divisor).sum();
            let n = weights.len() as u64;
            for (i, w) in weights.iter().enumerate() {
                let w = w / divisor;
                let positions: Vec<u64> = schedule.slots.iter().enumerate()
                    .filter(|(_, s)| **s as usize == i).map(|(p, _)| p as u64).collect();
                for pair in positions.windows(2) {
                    prop_assert!(pair[1] - pair[0] <= total / w + n, "{:?} {:?}", weights, schedule.slots);
                }
            }
        }
    }

    #[test]
    fn huge_cycles_are_scaled_but_keep_proportions() {
        let schedule = WeightSchedule::build(&[3_000_000, 1_000_001]);
        assert!(schedule.slots.len() as u64 <= MAX_CYCLE);
        let a = schedule.slots.iter().filter(|s| **s == 0).count() as f64;
        let b = schedule.slots.iter().filter(|s| **s == 1).count() as f64;
        assert!((a / b - 3.0).abs() < 0.01, "{a} {b}");
    }
}
