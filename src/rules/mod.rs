//! Load-balancing rules: filters that narrow the eligible instances, then one selector.
//!
//! Selectors are pure functions over `(candidates, ticket, key, rng)`. The ticket is the next
//! number of a counter held by the state backend and shared by every consumer, which is what
//! makes a rotation exact across a whole fleet of consumers rather than per process (the flaw of
//! per-client `IRule` counters). Being pure, each selector is tested exactly, with seeded
//! randomness, and runs unchanged whichever backend holds the counters.
//!
//! A rule name, with its parameters (`repeat(n=5)`), is parsed once into the closed [`Rule`]
//! enum and cached ([`RuleCache`]); picks never parse.

mod cache;
mod exclude;
mod random;
mod repeat;
mod round_robin;
mod spec;
mod version_isolation;

use std::sync::Arc;

use crate::registry::Instance;

pub use cache::RuleCache;
pub use exclude::without_excluded;
pub use random::Random;
pub use repeat::Repeat;
pub use round_robin::RoundRobin;
pub use spec::{KNOWN_RULES, MAX_RULE_LEN, ParsedRule, RuleError, parse};
pub use version_isolation::{Isolated, isolate};

/// What a selector sees for one pick.
#[derive(Debug, Clone, Copy)]
pub struct Draw<'a> {
    /// Eligible instances, sorted by id; never empty when a selector is called.
    pub candidates: &'a [Arc<Instance>],
    /// This pick's number in the shared rotation of (service, rule, subset).
    pub ticket: u64,
    /// The request's affinity key.
    pub key: &'a str,
}

/// A selection algorithm: which of `draw.candidates` to return.
pub trait Select {
    /// An index into `draw.candidates`, or `None` when there are no candidates.
    fn select(&self, draw: &Draw<'_>, rng: &mut fastrand::Rng) -> Option<usize>;
}

/// Every selector rota knows, with its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    RoundRobin(RoundRobin),
    Random(Random),
    Repeat(Repeat),
}

impl Select for Rule {
    fn select(&self, draw: &Draw<'_>, rng: &mut fastrand::Rng) -> Option<usize> {
        match self {
            Rule::RoundRobin(rule) => rule.select(draw, rng),
            Rule::Random(rule) => rule.select(draw, rng),
            Rule::Repeat(rule) => rule.select(draw, rng),
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use std::sync::Arc;

    use crate::registry::{Instance, InstanceSpec};

    /// `n` UP instances with ids `i0`, `i1`, ... (sorted for n ≤ 10).
    pub fn instances(n: usize) -> Vec<Arc<Instance>> {
        (0..n)
            .map(|i| {
                let spec = InstanceSpec {
                    id: format!("i{i}"),
                    service: "svc".into(),
                    host: "127.0.0.1".into(),
                    port: 1000 + i as u32,
                    ..Default::default()
                };
                Arc::new(spec.validate("test").expect("valid test instance"))
            })
            .collect()
    }
}
