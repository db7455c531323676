//! `availability_filtering(limit=N)`: skip instances whose circuit breaker is tripped or whose
//! in-flight count reached `limit`, then round robin over the rest (Ribbon's
//! `AvailabilityFilteringRule`, whose state here is fleet-wide).
//!
//! The rotation runs over the instances whose breaker is closed: ticket t takes the
//! (t mod k)-th of those k. An instance at its in-flight limit passes its turn to the next one
//! in position order that is under the limit (wrapping around). Both steps are O(log n) on the
//! subset's [`LoadIndex`](super::LoadIndex), so a pick never reads every instance.
//!
//! When every instance is filtered out, the pick goes round robin over all of them, as Ribbon's
//! rule fell back to its parent, and the response says so.

use super::{Choice, Draw, Needs, Params, RuleDef, RuleError, Select, Standard};

/// Most accepted in-flight limit.
pub const MAX_LIMIT: u64 = 1_000_000_000;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct AvailabilityFiltering {
    /// Skip instances with at least this many picks in flight; `None` = no limit.
    pub limit: Option<u64>,
}

pub const ALL_UNAVAILABLE: &str =
    "every eligible instance is tripped or at its in-flight limit; picked ignoring availability";

impl Select for AvailabilityFiltering {
    fn select(&self, draw: &Draw<'_>, _rng: &mut fastrand::Rng) -> Option<Choice> {
        let available = draw.loads(|loads| {
            let turn = loads.nth_available(draw.ticket)?;
            match self.limit {
                Some(limit) if loads.load(turn).in_flight >= limit => loads.next_under(turn, limit),
                _ => Some(turn),
            }
        })?;
        match available {
            Some(index) => Some(Choice::at(index)),
            None => draw.rotate(draw.ticket).map(|index| Choice { index, fallback: Some(ALL_UNAVAILABLE) }),
        }
    }
}

impl RuleDef for AvailabilityFiltering {
    const NAME: &'static str = "availability_filtering";
    const PARAMS: &'static [&'static str] = &["limit"];

    fn standard(&self) -> Standard {
        Standard::LeastRequest
    }

    fn parse(params: &mut Params<'_>) -> Result<Self, RuleError> {
        Ok(AvailabilityFiltering { limit: params.integer("limit", 1..=MAX_LIMIT)? })
    }

    fn canonical(&self) -> String {
        match self.limit {
            None => Self::NAME.to_owned(),
            Some(limit) => format!("availability_filtering(limit={limit})"),
        }
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

    fn picks(rule: AvailabilityFiltering, loads: &[(&str, Load)], count: u64) -> Vec<usize> {
        let candidates = with_loads(subset(instances(4)), loads);
        let mut rng = fastrand::Rng::with_seed(1);
        (0..count).map(|ticket| rule.select(&Draw::new(&candidates, ticket), &mut rng).unwrap().index).collect()
    }

    #[test]
    fn skips_tripped_and_busy_instances_and_rotates_over_the_rest() {
        let loads = [
            ("i01", Load { tripped: true, ..Default::default() }),
            ("i02", Load { in_flight: 5, ..Default::default() }),
        ];
        // Closed breakers: i00, i02, i03. i02 is at the limit: its turn goes to i03.
        assert_eq!(picks(AvailabilityFiltering { limit: Some(5) }, &loads, 6), [0, 3, 3, 0, 3, 3]);
        assert_eq!(picks(AvailabilityFiltering { limit: None }, &loads, 3), [0, 2, 3]);
    }

    #[test]
    fn a_turn_passes_over_the_end_to_the_first_instance_under_the_limit() {
        let loads = [("i03", Load { in_flight: 2, ..Default::default() })];
        assert_eq!(picks(AvailabilityFiltering { limit: Some(2) }, &loads, 4), [0, 1, 2, 0]);
    }

    #[test]
    fn all_filtered_falls_back_to_round_robin_and_says_so() {
        let tripped = Load { tripped: true, ..Default::default() };
        let candidates =
            with_loads(subset(instances(4)), &[("i00", tripped), ("i01", tripped), ("i02", tripped), ("i03", tripped)]);
        let draw = Draw::new(&candidates, 6);
        let choice = AvailabilityFiltering::default().select(&draw, &mut fastrand::Rng::with_seed(1)).unwrap();
        assert_eq!(choice, Choice { index: 2, fallback: Some(ALL_UNAVAILABLE) });
    }

    #[test]
    fn all_at_the_limit_falls_back_too() {
        let busy = Load { in_flight: 1, ..Default::default() };
        let candidates = with_loads(subset(instances(2)), &[("i00", busy), ("i01", busy)]);
        let choice = AvailabilityFiltering { limit: Some(1) }
            .select(&Draw::new(&candidates, 1), &mut fastrand::Rng::with_seed(1))
            .unwrap();
        assert_eq!(choice, Choice { index: 1, fallback: Some(ALL_UNAVAILABLE) });
    }
}
