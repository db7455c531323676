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
mod random;
mod repeat;
mod response_time;
mod round_robin;
mod spec;
mod version_isolation;
mod weighted;
mod zone_avoidance;

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::registry::{Instance, Subset};
use crate::state::Load;

pub use availability::{AvailabilityFiltering, is_available};
pub use best_available::BestAvailable;
pub use cache::RuleCache;
pub use consistent_hash::{ConsistentHash, Maglev, hash_key};
pub use least_request::LeastRequest;
pub use random::Random;
pub use repeat::Repeat;
pub use response_time::ResponseTime;
pub use round_robin::RoundRobin;
pub use spec::{KNOWN_RULES, MAX_RULE_LEN, ParsedRule, RuleError, parse};
pub use version_isolation::{Fallback, Isolated, isolate};
pub use weighted::{WeightSchedule, Weighted};
pub use zone_avoidance::ZoneAvoidance;

/// Read-only load of instances, as load-aware selectors see it.
pub trait StatsView: Sync {
    fn load(&self, instance: &Instance) -> Load;
}

/// No statistics: every instance idle, no latency known, no breaker tripped.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoStats;

impl StatsView for NoStats {
    fn load(&self, _instance: &Instance) -> Load {
        Load::default()
    }
}

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
    /// Eligible instances, sorted by id.
    pub candidates: &'a Subset,
    /// This pick's number in the shared rotation of (service, rule, subset).
    pub ticket: u64,
    /// The request's affinity key.
    pub key: &'a str,
    /// The consumer's zone.
    pub zone: &'a str,
    pub stats: &'a dyn StatsView,
    /// Candidates this pick must skip.
    pub excluded: Excluded<'a>,
}

impl<'a> Draw<'a> {
    pub fn new(candidates: &'a Subset, ticket: u64) -> Self {
        Self { candidates, ticket, key: "", zone: "", stats: &NoStats, excluded: Excluded::default() }
    }

    pub fn members(&self) -> &'a [Arc<Instance>] {
        &self.candidates.members
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

/// Tables derived from a subset's members, built on first use and shared by later picks.
#[derive(Debug, Default)]
pub struct SubsetTables {
    pub(crate) schedule: OnceLock<WeightSchedule>,
    pub(crate) maglev: OnceLock<Maglev>,
    /// The same subset of the previous snapshot had its Maglev table built: picks use it, so
    /// the balancer builds this one as soon as the snapshot is published, off the pick path.
    pub(crate) maglev_wanted: std::sync::atomic::AtomicBool,
    /// The rotations drawn on this subset.
    pub rotations: crate::state::RotationCache,
}

impl SubsetTables {
    /// Marks the tables wanted again where `previous` (the same subset, one snapshot earlier)
    /// had them built.
    pub fn inherit_wants(&self, previous: &SubsetTables) {
        use std::sync::atomic::Ordering;
        if previous.maglev.get().is_some() || previous.maglev_wanted.load(Ordering::Relaxed) {
            self.maglev_wanted.store(true, Ordering::Relaxed);
        }
    }

    /// Builds the tables marked wanted that are not built yet (the work picks would otherwise
    /// do on first use); returns whether anything was built.
    pub fn build_wanted(&self, subset: &crate::registry::Subset) -> bool {
        use std::sync::atomic::Ordering;
        if self.maglev_wanted.load(Ordering::Relaxed) && self.maglev.get().is_none() {
            Maglev::of(subset);
            return true;
        }
        false
    }
}

/// Position `ticket mod count` among the items for which `keep(index, item)` holds, without
/// allocating.
pub(crate) fn nth_kept<T>(items: &[T], ticket: u64, mut keep: impl FnMut(usize, &T) -> bool) -> Option<usize> {
    let count = items.iter().enumerate().filter(|(index, item)| keep(*index, item)).count() as u64;
    if count == 0 {
        return None;
    }
    let mut target = ticket % count;
    for (index, item) in items.iter().enumerate() {
        if keep(index, item) {
            if target == 0 {
                return Some(index);
            }
            target -= 1;
        }
    }
    None
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
    use std::collections::HashMap;
    use std::sync::Arc;

    use super::StatsView;
    use crate::registry::{Instance, InstanceSpec, Subset};
    use crate::state::Load;

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

    pub fn subset(members: Vec<Arc<Instance>>) -> Subset {
        Subset::new("test", members)
    }

    /// Fixed loads by instance id.
    #[derive(Default)]
    pub struct FakeStats(pub HashMap<String, Load>);

    impl FakeStats {
        pub fn with(mut self, id: &str, load: Load) -> Self {
            self.0.insert(id.into(), load);
            self
        }
    }

    impl StatsView for FakeStats {
        fn load(&self, instance: &Instance) -> Load {
            self.0.get(&*instance.id).copied().unwrap_or_default()
        }
    }
}
