//! `slow_start(window=W, aggression=A, min_weight_percent=P)`: `weighted`, with an instance that
//! has just become UP taking a share that ramps up to its full weight over `window`.
//!
//! Envoy's slow start (`slow_start_config` of its round-robin and least-request balancers):
//! an instance UP for t seconds has the effective weight
//! `weight × max(P / 100, (max(t, 1) / W)^(1 / A))` until t reaches W. `aggression` 1 ramps
//! linearly; above 1 traffic grows faster at first, below 1 slower. The time is the registry's
//! (when the instance was registered, or updated from DRAINING or DOWN to UP), the same for
//! every consumer.
//!
//! Selection: the ticket's slot of the subset's weight schedule, as `weighted` takes it; an
//! instance still in its window keeps the slot with probability equal to its ramp factor,
//! otherwise further slots are drawn at random from the schedule and kept the same way, so each
//! instance's share is proportional to its effective weight. With every instance warm this is
//! `weighted` exactly. Expected slots read per pick: at most `100 / P` (one when nothing is
//! warming up); at most [`MAX_DRAWS`] before the ticket's own slot is taken regardless.

use std::ops::RangeInclusive;
use std::time::Duration;

use tokio::time::Instant;

use super::{Choice, Draw, Needs, Params, RuleDef, RuleError, Select, Standard, Weighted, short_duration};

/// Default ramp length (Envoy requires one; 30 s is a common choice).
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(30);
pub const WINDOW_RANGE: RangeInclusive<Duration> = Duration::from_secs(1)..=Duration::from_secs(3600);
/// Default aggression (Envoy's default, a linear ramp), in thousandths.
pub const DEFAULT_AGGRESSION_MILLI: u32 = 1000;
pub const AGGRESSION_RANGE_MILLI: RangeInclusive<u32> = 100..=10_000;
/// Default floor of the ramp, in percent of the weight (Envoy's default).
pub const DEFAULT_MIN_WEIGHT_PERCENT: u32 = 10;
pub const MIN_WEIGHT_PERCENT_RANGE: RangeInclusive<u64> = 1..=100;
/// Slots drawn at most per pick.
pub const MAX_DRAWS: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlowStart {
    pub window: Duration,
    pub aggression_milli: u32,
    pub min_weight_percent: u32,
}

impl Default for SlowStart {
    fn default() -> Self {
        Self {
            window: DEFAULT_WINDOW,
            aggression_milli: DEFAULT_AGGRESSION_MILLI,
            min_weight_percent: DEFAULT_MIN_WEIGHT_PERCENT,
        }
    }
}

impl SlowStart {
    /// The share of its weight an instance UP since `up_since` takes at `now` (1 when warm).
    pub fn factor(&self, up_since: Option<Instant>, now: Instant) -> f64 {
        let Some(since) = up_since else { return 1.0 };
        let up = now.saturating_duration_since(since);
        if up >= self.window {
            return 1.0;
        }
        let time_factor = up.as_secs_f64().max(1.0) / self.window.as_secs_f64();
        let ramp = time_factor.powf(1000.0 / f64::from(self.aggression_milli));
        ramp.max(f64::from(self.min_weight_percent) / 100.0).min(1.0)
    }
}

impl Select for SlowStart {
    fn select(&self, draw: &Draw<'_>, rng: &mut fastrand::Rng) -> Option<Choice> {
        let built = draw.candidates.tables.schedule.load();
        let built = built.as_ref()?;
        let slots = &built.table.slots;
        if slots.is_empty() {
            return None;
        }
        let members = draw.members();
        let at = |slot: usize| built.position(slots[slot] as usize, &draw.candidates.subset);
        // The ticket's own slot, or the next accepted one: `weighted`'s choice.
        let first = Weighted.select(draw, rng)?.index;
        let mut candidate = first;
        for _ in 0..MAX_DRAWS {
            let factor = self.factor(members[candidate].up_since, draw.now);
            if factor >= 1.0 || rng.f64() < factor {
                return Some(Choice::at(candidate));
            }
            match at(rng.usize(..slots.len())).filter(|&i| draw.accepts(i)) {
                Some(next) => candidate = next,
                None => continue,
            }
        }
        Some(Choice::at(first))
    }
}

impl RuleDef for SlowStart {
    const NAME: &'static str = "slow_start";
    const PARAMS: &'static [&'static str] = &["window", "aggression", "min_weight_percent"];

    fn standard(&self) -> Standard {
        Standard::RoundRobin
    }

    fn parse(params: &mut Params<'_>) -> Result<Self, RuleError> {
        let window = params.duration("window", WINDOW_RANGE)?.unwrap_or(DEFAULT_WINDOW);
        let aggression_milli = params.milli("aggression", AGGRESSION_RANGE_MILLI)?.unwrap_or(DEFAULT_AGGRESSION_MILLI);
        let min_weight_percent =
            params.integer("min_weight_percent", MIN_WEIGHT_PERCENT_RANGE)?.map_or(DEFAULT_MIN_WEIGHT_PERCENT, |p| p as u32);
        Ok(SlowStart { window, aggression_milli, min_weight_percent })
    }

    fn canonical(&self) -> String {
        format!(
            "slow_start(window={}, aggression={}, min_weight_percent={})",
            short_duration(self.window),
            f64::from(self.aggression_milli) / 1000.0,
            self.min_weight_percent
        )
    }

    fn needs(&self) -> Needs {
        Needs { schedule: true, ..Needs::default() }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::registry::Instance;
    use crate::rules::parse;
    use crate::rules::testing::{instance, subset};

    fn up_at(id: &str, since: Option<Instant>) -> Arc<Instance> {
        let mut instance = Instance::clone(&instance(id, "", 100));
        instance.up_since = since;
        Arc::new(instance)
    }

    #[test]
    fn the_ramp_follows_envoy() {
        let now = Instant::now();
        let ago = |secs: u64| Some(now - Duration::from_secs(secs));
        let linear = SlowStart::default();
        assert_eq!(linear.factor(None, now), 1.0, "not registered through rota: warm");
        assert!((linear.factor(ago(15), now) - 0.5).abs() < 1e-9);
        assert_eq!(linear.factor(ago(0), now), 0.1, "floored at min_weight_percent");
        assert_eq!(linear.factor(ago(30), now), 1.0);
        let eager = SlowStart { aggression_milli: 2000, ..SlowStart::default() };
        assert!((eager.factor(ago(15), now) - 0.5f64.sqrt()).abs() < 1e-9, "aggression 2: square root");
    }

    #[test]
    fn a_warming_instance_takes_its_effective_share() {
        let now = Instant::now();
        // b came up 6 s ago in a 30 s window: factor 0.2, effective weight 20 against 100.
        let candidates = subset(vec![up_at("a", Some(now - Duration::from_secs(3600))), up_at("b", Some(now - Duration::from_secs(6)))]);
        let rule = SlowStart::default();
        let mut rng = fastrand::Rng::with_seed(5);
        let picks = 20_000;
        let b = (0..picks)
            .filter(|&ticket| rule.select(&Draw { now, ..Draw::new(&candidates, ticket) }, &mut rng).unwrap().index == 1)
            .count();
        let share = b as f64 / picks as f64;
        assert!((share - 20.0 / 120.0).abs() < 0.01, "b's share {share}");
    }

    #[test]
    fn warm_instances_follow_the_weighted_schedule() {
        let candidates = subset(vec![up_at("a", None), up_at("b", None), up_at("c", None)]);
        let mut rng = fastrand::Rng::with_seed(1);
        let picks: Vec<usize> = (0..6)
            .map(|ticket| SlowStart::default().select(&Draw::new(&candidates, ticket), &mut rng).unwrap().index)
            .collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn parameters_have_defaults_ranges_and_a_canonical_form() {
        assert_eq!(&*parse("slow_start").unwrap().canonical, "slow_start(window=30s, aggression=1, min_weight_percent=10)");
        let custom = parse("slow_start(window=2m, aggression=1.5, min_weight_percent=25)").unwrap();
        assert_eq!(&*custom.canonical, "slow_start(window=2m, aggression=1.5, min_weight_percent=25)");
        let errors = [
            ("slow_start(window=0s)", "parameter \"window\" must be a duration from 1s to 1h, like 30s or 10m, got \"0s\""),
            ("slow_start(aggression=0)", "parameter \"aggression\" must be a number from 0.1 to 10.0, got \"0\""),
            ("slow_start(min_weight_percent=0)", "parameter \"min_weight_percent\" must be an integer from 1 to 100, got \"0\""),
        ];
        for (text, message) in errors {
            let error = parse(text).unwrap_err().to_string();
            assert!(error.ends_with(message), "{text}: {error}");
        }
    }
}
