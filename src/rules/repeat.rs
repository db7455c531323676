//! `repeat(n=N)`: each instance N times in a row, then the next.
//!
//! The Ribbon-era rule "call each instance 3 times, then switch" kept its count per consumer,
//! so with several consumers no instance ever got its N in a row. From the shared ticket,
//! `t → (t / N) mod n_instances` makes the sequence exact for all consumers together.

use super::{Choice, Draw, Params, RuleDef, RuleError, Select, Standard};

/// Default run length.
pub const DEFAULT_N: u32 = 3;
/// Largest accepted run length.
pub const MAX_N: u32 = 1_000_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Repeat {
    /// Picks per instance before moving on; 1..=`MAX_N`.
    pub n: u32,
}

impl Default for Repeat {
    fn default() -> Self {
        Self { n: DEFAULT_N }
    }
}

impl Select for Repeat {
    fn select(&self, draw: &Draw<'_>, _rng: &mut fastrand::Rng) -> Option<Choice> {
        draw.rotate(draw.ticket / u64::from(self.n.max(1))).map(Choice::at)
    }
}

impl RuleDef for Repeat {
    const NAME: &'static str = "repeat";
    const PARAMS: &'static [&'static str] = &["n"];
    const LEASABLE: bool = true;

    fn standard(&self) -> Standard {
        Standard::RoundRobin
    }

    fn parse(params: &mut Params<'_>) -> Result<Self, RuleError> {
        let n = params.integer("n", 1..=u64::from(MAX_N))?;
        Ok(Repeat { n: n.map_or(DEFAULT_N, |n| n as u32) })
    }

    fn canonical(&self) -> String {
        format!("repeat(n={})", self.n)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::rules::testing::{instances, subset};

    fn sequence(rule: Repeat, len: usize, picks: u64) -> String {
        let candidates = subset(instances(len));
        let mut rng = fastrand::Rng::with_seed(1);
        (0..picks)
            .map(|ticket| {
                char::from(b'A' + rule.select(&Draw::new(&candidates, ticket), &mut rng).unwrap().index as u8)
            })
            .collect()
    }

    #[test]
    fn three_in_a_row_then_switch() {
        assert_eq!(sequence(Repeat::default(), 3, 12), "AAABBBCCCAAA");
        assert_eq!(sequence(Repeat { n: 5 }, 2, 12), "AAAAABBBBBAA");
        assert_eq!(sequence(Repeat { n: 1 }, 3, 4), "ABCA");
    }

    proptest! {
        #[test]
        fn runs_are_exactly_n_long(n in 1u32..10, len in 1usize..8) {
            let seq = sequence(Repeat { n }, len, u64::from(n) * len as u64 * 2);
            for (i, chunk) in seq.as_bytes().chunks(n as usize).enumerate() {
                prop_assert!(chunk.iter().all(|&c| c == chunk[0]));
                prop_assert_eq!(chunk[0], b'A' + (i % len) as u8);
            }
        }
    }
}
