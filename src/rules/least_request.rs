//! `least_request(choices=k)`: the power of k choices (Mitzenmacher; Envoy's and gRPC's least
//! request). Draw k distinct instances at random and take the one with the fewest picks in
//! flight; a tripped breaker counts as the heaviest load. With k = 2 this gets close to
//! least-loaded without scanning every instance and without herding: O(k) per pick.

use super::{Choice, Draw, Needs, Params, Query, RuleDef, RuleError, Select, Standard};

pub const DEFAULT_CHOICES: u32 = 2;
pub const MAX_CHOICES: u32 = 100;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LeastRequest {
    pub choices: u32,
}

impl Default for LeastRequest {
    fn default() -> Self {
        Self { choices: DEFAULT_CHOICES }
    }
}

impl Select for LeastRequest {
    fn select(&self, draw: &Draw<'_>, rng: &mut fastrand::Rng) -> Option<Choice> {
        draw.loads_by_position(|loads| self.choose(draw, loads, rng))?
    }
}

impl RuleDef for LeastRequest {
    const NAME: &'static str = "least_request";
    const PARAMS: &'static [&'static str] = &["choices"];

    fn standard(&self) -> Standard {
        Standard::LeastRequest
    }

    fn parse(params: &mut Params<'_>) -> Result<Self, RuleError> {
        let choices = params.integer("choices", 1..=u64::from(MAX_CHOICES))?;
        Ok(LeastRequest { choices: choices.map_or(DEFAULT_CHOICES, |c| c as u32) })
    }

    fn canonical(&self) -> String {
        format!("least_request(choices={})", self.choices)
    }

    fn needs(&self) -> Needs {
        Needs { load: true, ..Needs::default() }
    }
}

impl LeastRequest {
    fn choose(&self, draw: &Draw<'_>, loads: &Query<'_>, rng: &mut fastrand::Rng) -> Option<Choice> {
        // Choices are drawn among the accepted candidates, by their rank among them.
        let n = draw.accepted();
        if n == 0 {
            return None;
        }
        let at = |rank: usize| draw.excluded.nth_accepted(rank);
        let weight = |rank: usize| {
            let load = loads.load(at(rank));
            (load.tripped, load.in_flight)
        };
        let k = (self.choices as usize).clamp(1, n);
        let mut best = rng.usize(..n);
        let mut best_load = weight(best);
        if k == n {
            // Every instance is a candidate: scan them all.
            for index in 0..n {
                if weight(index) < best_load {
                    best = index;
                    best_load = weight(index);
                }
            }
            return Some(Choice::at(at(best)));
        }
        // Draw k − 1 more distinct indices (k is small: retrying duplicates is cheap).
        let mut drawn = [usize::MAX; MAX_CHOICES as usize];
        drawn[0] = best;
        let mut count = 1;
        while count < k {
            let candidate = rng.usize(..n);
            if drawn[..count].contains(&candidate) {
                continue;
            }
            drawn[count] = candidate;
            count += 1;
            let load = weight(candidate);
            if load < best_load {
                best = candidate;
                best_load = load;
            }
        }
        Some(Choice::at(at(best)))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::rules::Load;
    use crate::rules::testing::{instances, set_load, subset, with_loads};

    proptest! {
        #[test]
        fn never_picks_the_busier_of_its_two(loads in proptest::collection::vec(0u64..5, 2..10), seed in any::<u64>()) {
            let candidates = subset(instances(loads.len()));
            for (i, load) in loads.iter().enumerate() {
                set_load(&candidates, &format!("i{i:02}"), Load { in_flight: *load, ..Default::default() });
            }
            let draw = Draw::new(&candidates, 0);
            // Replay the same random draws to learn which two were compared.
            let mut replay = fastrand::Rng::with_seed(seed);
            let first = replay.usize(..loads.len());
            let mut second = replay.usize(..loads.len());
            while second == first {
                second = replay.usize(..loads.len());
            }
            let picked = LeastRequest::default().select(&draw, &mut fastrand::Rng::with_seed(seed)).unwrap().index;
            prop_assert!(picked == first || picked == second);
            prop_assert_eq!(loads[picked], loads[first].min(loads[second]));
        }
    }

    #[test]
    fn tripped_instances_lose_every_comparison() {
        let candidates = with_loads(
            subset(instances(2)),
            &[
                ("i00", Load { tripped: true, ..Default::default() }),
                ("i01", Load { in_flight: 50, ..Default::default() }),
            ],
        );
        for seed in 0..20 {
            let draw = Draw::new(&candidates, 0);
            assert_eq!(LeastRequest::default().select(&draw, &mut fastrand::Rng::with_seed(seed)).unwrap().index, 1);
        }
    }
}
