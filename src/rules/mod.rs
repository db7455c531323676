//! Load-balancing rules: filters that narrow the eligible instances, then one selector.
//!
//! Selectors are pure functions of a [`Draw`]: the eligible [`Subset`], a ticket, the request's
//! key and zone, a read-only view of instance load, and an injected random source. The ticket is
//! the next number of a counter held by the state backend and shared by every consumer, which is
//! what makes a rotation exact across a whole fleet of consumers rather than per process (the
//! flaw of per-client `IRule` counters). Being pure, each selector is tested exactly, with seeded
//! randomness and fake load, and runs unchanged whichever backend holds the counters.
//!
//! A rule name with its parameters (`repeat(n=5)`) is parsed once into the closed [`Rule`] enum
//! and cached ([`RuleCache`]); picks never parse. Rules that need more than one selection —
//! `retry` (waits and re-picks) and `sticky` (remembers assignments) — are driven by the
//! balancer around a pure inner selector.

mod availability;
mod best_available;
mod cache;
mod consistent_hash;
mod least_request;
mod load;
mod random;
mod repeat;
mod response_time;
mod round_robin;
mod spec;
mod tables;
mod version_isolation;
mod weighted;
mod zone_avoidance;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::registry::Instance;

pub use availability::AvailabilityFiltering;
pub use best_available::BestAvailable;
pub use cache::RuleCache;
pub use consistent_hash::{ConsistentHash, Maglev, hash_key};
pub use least_request::LeastRequest;
pub use load::{Load, LoadIndex, LoadSample, Query, ZoneLoad};
pub use random::Random;
pub use repeat::Repeat;
pub use response_time::ResponseTime;
pub use round_robin::RoundRobin;
pub use spec::{KNOWN_RULES, MAX_RULE_LEN, ParsedRule, RuleError, parse};
pub use tables::{Built, Candidates, Needs, Tables};
pub use version_isolation::{Fallback, Isolated, Versions, isolate};
pub use weighted::{WeightSchedule, Weighted};
pub use zone_avoidance::ZoneAvoidance;

/// Positions among the candidates that a pick must not return: the instances a call already
/// tried (`exclude`). Sorted, without duplicates, and empty for almost every pick.
///
/// Exclusion is a skip over the subset's own tables, never a smaller subset with tables of its
/// own: a retry costs what a first pick costs, and every other key keeps its instance (a
/// consistent-hash key moves only if its instance is the excluded one).
#[derive(Debug, Clone, Copy, Default)]
pub struct Excluded<'a>(&'a [usize]);

impl<'a> Excluded<'a> {
    /// `positions` must be sorted and without duplicates.
    pub fn new(positions: &'a [usize]) -> Self {
        debug_assert!(positions.windows(2).all(|w| w[0] < w[1]), "sorted and unique");
        Self(positions)
    }

    pub fn contains(&self, index: usize) -> bool {
        !self.0.is_empty() && self.0.binary_search(&index).is_ok()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The excluded positions, ascending.
    pub fn positions(&self) -> &'a [usize] {
        self.0
    }

    /// The `k`-th (from 0) position that is not excluded: O(excluded).
    pub fn nth_accepted(&self, k: usize) -> usize {
        let mut position = k;
        for &excluded in self.0 {
            if excluded > position {
                break;
            }
            position += 1;
        }
        position
    }
}

/// What a selector sees for one pick.
#[derive(Clone, Copy)]
pub struct Draw<'a> {
    /// Eligible instances, sorted by id, with their tables.
    pub candidates: &'a Candidates,
    /// This pick's number in the shared rotation of (service, rule, subset).
    pub ticket: u64,
    /// The request's affinity key.
    pub key: &'a str,
    /// The consumer's zone.
    pub zone: &'a str,
    /// The moment the pick reads loads at.
    pub now: Instant,
    /// Candidates this pick must skip.
    pub excluded: Excluded<'a>,
}

impl<'a> Draw<'a> {
    pub fn new(candidates: &'a Candidates, ticket: u64) -> Self {
        Self { candidates, ticket, key: "", zone: "", now: Instant::now(), excluded: Excluded::default() }
    }

    pub fn members(&self) -> &'a [Arc<Instance>] {
        self.candidates.members()
    }

    /// Runs `query` on the candidates' load index with this draw's exclusions masked; `None`
    /// when the subset has no load index (the balancer builds one before a load-aware rule
    /// selects).
    pub fn loads<T>(&self, query: impl FnOnce(&Query<'_>) -> T) -> Option<T> {
        let index = self.candidates.tables.load.load();
        index.as_ref().map(|index| index.query(self.now, self.excluded, query))
    }

    /// Whether the candidate at `index` may be returned.
    pub fn accepts(&self, index: usize) -> bool {
        !self.excluded.contains(index)
    }

    /// How many candidates may be returned.
    pub fn accepted(&self) -> usize {
        self.candidates.len().saturating_sub(self.excluded.len())
    }

    /// Position `turn mod accepted` among the accepted candidates: a rotation over them.
    pub fn rotate(&self, turn: u64) -> Option<usize> {
        let accepted = self.accepted() as u64;
        (accepted > 0).then(|| self.excluded.nth_accepted((turn % accepted) as usize))
    }
}

/// The selector's answer: an index into the candidates, and why it deviated from its own rule
/// when it had to (e.g. every instance was tripped).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Choice {
    pub index: usize,
    pub fallback: Option<&'static str>,
}

impl Choice {
    pub fn at(index: usize) -> Self {
        Self { index, fallback: None }
    }
}

/// A selection algorithm: which of `draw.candidates` to return; `None` when none may be.
pub trait Select {
    fn select(&self, draw: &Draw<'_>, rng: &mut fastrand::Rng) -> Option<Choice>;
}

/// Every rule rota knows, with its parameters.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Rule {
    RoundRobin(RoundRobin),
    Random(Random),
    Repeat(Repeat),
    Weighted(Weighted),
    ResponseTime(ResponseTime),
    BestAvailable(BestAvailable),
    LeastRequest(LeastRequest),
    AvailabilityFiltering(AvailabilityFiltering),
    ZoneAvoidance(ZoneAvoidance),
    ConsistentHash(ConsistentHash),
    /// Key → instance remembered centrally for `ttl` (refreshed on use).
    Sticky {
        ttl: Duration,
    },
    /// Re-picks with `inner`, skipping unavailable instances, for up to `budget`.
    Retry {
        inner: Box<Rule>,
        budget: Duration,
    },
}

impl Rule {
    /// Whether the rule reads `key` (and so requires one).
    pub fn needs_key(&self) -> bool {
        match self {
            Rule::ConsistentHash(_) | Rule::Sticky { .. } => true,
            Rule::Retry { inner, .. } => inner.needs_key(),
            _ => false,
        }
    }
}

impl Rule {
    /// The tables the rule reads.
    pub fn needs(&self) -> Needs {
        let load = Needs { load: true, ..Needs::default() };
        match self {
            Rule::RoundRobin(_) | Rule::Random(_) | Rule::Repeat(_) => Needs::default(),
            Rule::Weighted(_) => Needs { schedule: true, ..Needs::default() },
            Rule::ConsistentHash(rule) => {
                Needs { maglev: true, load: rule.balance_milli.is_some(), ..Needs::default() }
            }
            Rule::ResponseTime(_)
            | Rule::BestAvailable(_)
            | Rule::LeastRequest(_)
            | Rule::AvailabilityFiltering(_)
            | Rule::ZoneAvoidance(_)
            | Rule::Sticky { .. } => load,
            // `retry` reads breakers to skip tripped choices.
            Rule::Retry { inner, .. } => inner.needs().union(load),
        }
    }
}

impl Select for Rule {
    fn select(&self, draw: &Draw<'_>, rng: &mut fastrand::Rng) -> Option<Choice> {
        match self {
            Rule::RoundRobin(rule) => rule.select(draw, rng),
            Rule::Random(rule) => rule.select(draw, rng),
            Rule::Repeat(rule) => rule.select(draw, rng),
            Rule::Weighted(rule) => rule.select(draw, rng),
            Rule::ResponseTime(rule) => rule.select(draw, rng),
            Rule::BestAvailable(rule) => rule.select(draw, rng),
            Rule::LeastRequest(rule) => rule.select(draw, rng),
            Rule::AvailabilityFiltering(rule) => rule.select(draw, rng),
            Rule::ZoneAvoidance(rule) => rule.select(draw, rng),
            Rule::ConsistentHash(rule) => rule.select(draw, rng),
            // New sticky assignments rotate, skipping unavailable instances.
            Rule::Sticky { .. } => AvailabilityFiltering::default().select(draw, rng),
            Rule::Retry { inner, .. } => inner.select(draw, rng),
        }
    }
}

#[cfg(test)]
mod excluded_tests {
    use proptest::prelude::*;

    use super::Excluded;

    proptest! {
        #[test]
        fn nth_accepted_counts_only_accepted_positions(
            n in 1usize..60,
            excluded in proptest::collection::btree_set(0usize..60, 0..10),
        ) {
            let excluded: Vec<usize> = excluded.into_iter().filter(|&e| e < n).collect();
            let accepted: Vec<usize> = (0..n).filter(|i| !excluded.contains(i)).collect();
            let set = Excluded::new(&excluded);
            for (k, position) in accepted.iter().enumerate() {
                prop_assert_eq!(set.nth_accepted(k), *position);
                prop_assert!(!set.contains(*position));
            }
            for e in &excluded {
                prop_assert!(set.contains(*e));
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::time::Instant;

    use super::{Candidates, Load, LoadIndex, LoadSample, Needs};
    use crate::registry::{Instance, InstanceSpec, Subset};

    /// `n` UP instances with ids `i00`, `i01`, ... (sorted).
    pub fn instances(n: usize) -> Vec<Arc<Instance>> {
        (0..n).map(|i| instance(&format!("i{i:02}"), "", 100)).collect()
    }

    pub fn instance(id: &str, zone: &str, weight: u32) -> Arc<Instance> {
        let spec = InstanceSpec {
            id: id.into(),
            service: "svc".into(),
            host: "127.0.0.1".into(),
            port: 1000,
            zone: zone.into(),
            weight: Some(weight),
            ..Default::default()
        };
        Arc::new(spec.validate("test").expect("valid test instance"))
    }

    /// Candidates with every table built and every instance idle.
    pub fn subset(members: Vec<Arc<Instance>>) -> Candidates {
        let candidates = Candidates::new(Subset::new("test", members));
        candidates.build(Needs { schedule: true, maglev: true, load: false });
        candidates.tables.load.store(Some(Arc::new(LoadIndex::new(candidates.members()))));
        candidates
    }

    /// Sets the load of the candidate with id `id` (a tripped one stays tripped for an hour).
    pub fn set_load(candidates: &Candidates, id: &str, load: Load) {
        let position = candidates.members().iter().position(|i| &*i.id == id).expect("a candidate");
        let now = Instant::now();
        let sample = LoadSample {
            in_flight: load.in_flight,
            latency_ms: load.latency_ms,
            tripped_until: load.tripped.then(|| now + Duration::from_secs(3600)),
        };
        candidates.tables.load.load().as_ref().expect("built").set(position, sample, now);
    }

    /// Sets several loads by id.
    pub fn with_loads(candidates: Candidates, loads: &[(&str, Load)]) -> Candidates {
        for (id, load) in loads {
            set_load(&candidates, id, *load);
        }
        candidates
    }
}
