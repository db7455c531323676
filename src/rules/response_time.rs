//! `response_time`: Ribbon's `WeightedResponseTimeRule` weights over a recent window.
//!
//! Each instance's weight is `Σ avg − avgᵢ`: the slower an instance, the less traffic it gets.
//! Ribbon computed `avg` as the lifetime mean response time of the consumer's own calls; here it
//! is the fleet-wide EWMA (see `state::stats`), so a slow spell shows up in seconds and heals as
//! quickly. Until any instance has a reported latency the rule is plain round robin; an instance
//! without samples yet counts as average. Weights are sampled with the injected random source.
//!
//! One pick in [`EXPLORE_ONE_IN`] goes round robin whatever the weights, so every instance keeps
//! a small share of the calls and with it fresh latency samples: an instance is never starved
//! for good by an average it can no longer correct (a slow spell that is over, or one client
//! reporting it as slow when the rest of the fleet finds it fast).
//!
//! Cost: O(log n). The subset's load index keeps, per node of its segment tree, how many
//! candidates take part, how many have a latency and the sum of those latencies; the weights'
//! total and any prefix of them follow from those, so the sampled point is found by one descent.

use super::{Choice, Draw, Needs, Params, RoundRobin, RuleDef, RuleError, Select, Standard};

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ResponseTime;

/// One pick in this many is round robin (each instance keeps at least this share ÷ n).
pub const EXPLORE_ONE_IN: u32 = 16;

impl Select for ResponseTime {
    fn select(&self, draw: &Draw<'_>, rng: &mut fastrand::Rng) -> Option<Choice> {
        if rng.u32(..EXPLORE_ONE_IN) == 0 {
            return RoundRobin.select(draw, rng);
        }
        let point = rng.f64();
        // Excluded candidates take no part: masked out of the index, no latency, no weight.
        match draw.loads(|loads| loads.by_latency_weight(point))? {
            Some(index) => Some(Choice::at(index)),
            // No latency known yet, or nothing to prefer (one instance, or all weights zero).
            None => RoundRobin.select(draw, rng),
        }
    }
}

impl RuleDef for ResponseTime {
    const NAME: &'static str = "response_time";

    fn standard(&self) -> Standard {
        Standard::LeastRequest
    }

    fn parse(_: &mut Params<'_>) -> Result<Self, RuleError> {
        Ok(ResponseTime)
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

    fn latency(ms: f64) -> Load {
        Load { latency_ms: Some(ms), ..Default::default() }
    }

    #[test]
    fn round_robin_until_stats_exist() {
        let candidates = subset(instances(3));
        let mut rng = fastrand::Rng::with_seed(3);
        let picks: Vec<usize> =
            (0..6).map(|t| ResponseTime.select(&Draw::new(&candidates, t), &mut rng).unwrap().index).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn shares_follow_ribbon_weights() {
        // Latencies 10, 20, 70 ms: Σ = 100, weights 90, 80, 30 (of 200).
        let candidates =
            with_loads(subset(instances(3)), &[("i00", latency(10.0)), ("i01", latency(20.0)), ("i02", latency(70.0))]);
        let mut rng = fastrand::Rng::with_seed(11);
        let mut counts = [0u32; 3];
        for ticket in 0..20_000 {
            counts[ResponseTime.select(&Draw::new(&candidates, ticket), &mut rng).unwrap().index] += 1;
        }
        let share = |c: u32| f64::from(c) / 20_000.0;
        // 15/16 by weight, 1/16 round robin.
        let expected = |weight: f64| weight * 15.0 / 16.0 + 1.0 / 48.0;
        assert!((share(counts[0]) - expected(0.45)).abs() < 0.01, "{counts:?}");
        assert!((share(counts[1]) - expected(0.40)).abs() < 0.01, "{counts:?}");
        assert!((share(counts[2]) - expected(0.15)).abs() < 0.01, "{counts:?}");
    }

    #[test]
    fn an_instance_far_slower_than_the_rest_keeps_its_exploring_share() {
        // 5, 5 and an hour: by weight alone the third gets 10 of 7,200,000 parts.
        let candidates = with_loads(
            subset(instances(3)),
            &[("i00", latency(5.0)), ("i01", latency(5.0)), ("i02", latency(3_600_000.0))],
        );
        let mut rng = fastrand::Rng::with_seed(5);
        let slow = (0..48_000)
            .filter(|&ticket| ResponseTime.select(&Draw::new(&candidates, ticket), &mut rng).unwrap().index == 2)
            .count();
        // 1/16 of the picks go round robin, a third of those to it: 1,000 expected.
        assert!((800..1200).contains(&slow), "{slow}");
    }
}
