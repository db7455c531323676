//! `retry(rule=R, max_ms=M)`: re-pick with the inner rule R while it chooses a tripped
//! instance; when none is available, wait — for a breaker to close or the instances to change,
//! never spinning — until M milliseconds have passed. The balancer drives the loop; this file
//! declares the rule and its inner selection.

use std::time::Duration;

use super::{Choice, Draw, Needs, Params, RoundRobin, Rule, RuleDef, RuleError, Select, Standard};

/// Default time budget.
pub const DEFAULT_BUDGET: Duration = Duration::from_millis(500);
/// Longest accepted budget, in milliseconds.
pub const MAX_BUDGET_MS: u64 = 60_000;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Retry {
    pub inner: Box<Rule>,
    pub budget: Duration,
}

impl Select for Retry {
    fn select(&self, draw: &Draw<'_>, rng: &mut fastrand::Rng) -> Option<Choice> {
        self.inner.select(draw, rng)
    }
}

impl RuleDef for Retry {
    const NAME: &'static str = "retry";
    const PARAMS: &'static [&'static str] = &["rule", "max_ms"];

    fn parse(params: &mut Params<'_>) -> Result<Self, RuleError> {
        if params.nested() {
            return Err(params.malformed("retry cannot wrap retry"));
        }
        let inner = match params.take("rule") {
            None => Rule::RoundRobin(RoundRobin),
            Some(value) => {
                let inner = super::spec::parse_rule(&value, true)?;
                if matches!(inner, Rule::Sticky(_)) {
                    return Err(params.bad("rule", "must be a selector (not sticky or retry)", &value));
                }
                inner
            }
        };
        let budget = params.integer("max_ms", 1..=MAX_BUDGET_MS)?;
        Ok(Retry { inner: Box::new(inner), budget: budget.map_or(DEFAULT_BUDGET, Duration::from_millis) })
    }

    fn canonical(&self) -> String {
        format!("retry(rule={}, max_ms={})", self.inner.canonical(), self.budget.as_millis())
    }

    /// The inner rule's tables, and the load index: retries skip tripped instances.
    fn needs(&self) -> Needs {
        self.inner.needs().union(Needs { load: true, ..Needs::default() })
    }

    /// The inner rule's: the standard policies have no retry of their own.
    fn standard(&self) -> Standard {
        self.inner.standard()
    }

    fn needs_key(&self) -> bool {
        self.inner.needs_key()
    }
}
