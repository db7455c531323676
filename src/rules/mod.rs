//! Load-balancing rules: filters that narrow the eligible instances, then one selector.
//!
//! Selectors are pure functions of a [`Draw`]: the eligible [`Candidates`], a ticket, the request's
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
//!
//! **One rule, one file.** Each rule's file declares, through [`RuleDef`], its name, its
//! parameters with their ranges and defaults (the error text is written from the ranges), its
//! canonical form, whether it can be leased, which tables it reads, and its selection. The
//! `rules!` list below is the one place that names every rule; the enum, the parser's
//! dispatch and [`KNOWN_RULES`] are made from it.

mod cache;
mod spec;
pub mod table_free;
mod tables;
mod version_isolation;

use std::sync::Arc;

use tokio::time::Instant;

use crate::registry::Instance;

pub use crate::load::{Load, LoadIndex, LoadSample, LoadTable, MAX_DEPARTED, Query, ZoneLoad, Zones};
pub use cache::RuleCache;
pub use consistent_hash::{Maglev, hash_key};
pub use spec::{MAX_RULE_LEN, Params, ParsedRule, RuleError, parse, short_duration};
pub use tables::{Built, Candidates, Needs, Tables};
pub use version_isolation::{Fallback, Isolated, Versions, isolate};
pub use weighted::WeightSchedule;

/// What a rule's own file declares about it.
pub trait RuleDef: Select + Sized {
    /// The name requests use, e.g. `repeat`.
    const NAME: &'static str;
    /// The parameters it accepts, in canonical order.
    const PARAMS: &'static [&'static str] = &[];
    /// Whether `Lease` may hand out its tickets (the rule maps a ticket to an instance from the
    /// instance list alone, so a client can map leased tickets exactly as rota would).
    const LEASABLE: bool = false;

    /// Reads the rule's parameters (defaults for those not given).
    fn parse(params: &mut Params<'_>) -> Result<Self, RuleError>;

    /// The canonical spelling: every parameter that has a default written out.
    fn canonical(&self) -> String {
        Self::NAME.to_owned()
    }

    /// The tables it reads.
    fn needs(&self) -> Needs {
        Needs::default()
    }

    /// Whether it reads the request's `key` (and so requires one).
    fn needs_key(&self) -> bool {
        false
    }

    /// The standard client-side policy closest to it, which rota's xDS clusters name for clients
    /// that cannot run rota's own. Every rule says: none falls back to a default unnoticed.
    fn standard(&self) -> Standard;
}

/// The standard load-balancing policies every gRPC xDS client implements (gRFC A27, A42, A48).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standard {
    /// Each call to the next endpoint.
    RoundRobin,
    /// The less loaded of two random endpoints.
    LeastRequest,
    /// A hash of the request's key (`x-rota-key`) on a ring: a key keeps its endpoint.
    RingHash,
}

/// The list of rules: `Variant(file::Type)`. Adding a rule is adding its file and a line here.
macro_rules! rules {
    ($($variant:ident($file:ident::$ty:ident)),* $(,)?) => {
        $(mod $file;)*
        $(pub use $file::$ty;)*

        /// Every rule rota knows, with its parameters.
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub enum Rule {
            $($variant($ty),)*
        }

        /// Rule names accepted in `PickRequest.rule`.
        pub const KNOWN_RULES: &[&str] = &[$(<$ty as RuleDef>::NAME,)*];

        /// Names of the rules `Lease` hands tickets out for.
        pub const LEASABLE: &[(&str, bool)] = &[$((<$ty as RuleDef>::NAME, <$ty as RuleDef>::LEASABLE),)*];

        impl Rule {
            /// The rule named `name`, its parameters read from `params`; `None` for an unknown name.
            fn parse_named(name: &str, params: &mut Params<'_>) -> Option<Result<Rule, RuleError>> {
                $(
                    if name == <$ty as RuleDef>::NAME {
                        let parsed = <$ty as RuleDef>::parse(params.of(<$ty as RuleDef>::NAME));
                        return Some(parsed.and_then(|rule| {
                            params.finish(<$ty as RuleDef>::PARAMS)?;
                            Ok(Rule::$variant(rule))
                        }));
                    }
                )*
                None
            }

            pub fn canonical(&self) -> String {
                match self { $(Rule::$variant(rule) => rule.canonical(),)* }
            }

            /// The tables the rule reads.
            pub fn needs(&self) -> Needs {
                match self { $(Rule::$variant(rule) => rule.needs(),)* }
            }

            /// Whether the rule reads `key` (and so requires one).
            pub fn needs_key(&self) -> bool {
                match self { $(Rule::$variant(rule) => rule.needs_key(),)* }
            }

            /// The standard client-side policy closest to the rule.
            pub fn standard(&self) -> Standard {
                match self { $(Rule::$variant(rule) => rule.standard(),)* }
            }

            /// Whether `Lease` may hand out this rule's tickets.
            pub fn leasable(&self) -> bool {
                match self { $(Rule::$variant(_) => <$ty as RuleDef>::LEASABLE,)* }
            }
        }

        impl Select for Rule {
            fn select(&self, draw: &Draw<'_>, rng: &mut fastrand::Rng) -> Option<Choice> {
                match self { $(Rule::$variant(rule) => rule.select(draw, rng),)* }
            }
        }
    };
}

rules! {
    RoundRobin(round_robin::RoundRobin),
    Random(random::Random),
    Repeat(repeat::Repeat),
    Weighted(weighted::Weighted),
    SlowStart(slow_start::SlowStart),
    ResponseTime(response_time::ResponseTime),
    BestAvailable(best_available::BestAvailable),
    LeastRequest(least_request::LeastRequest),
    AvailabilityFiltering(availability::AvailabilityFiltering),
    ZoneAvoidance(zone_avoidance::ZoneAvoidance),
    ConsistentHash(consistent_hash::ConsistentHash),
    Sticky(sticky::Sticky),
    Retry(retry::Retry),
}

/// The leasable rules' names, for error messages.
pub fn leasable_rules() -> String {
    LEASABLE.iter().filter(|(_, leasable)| *leasable).map(|(name, _)| *name).collect::<Vec<_>>().join(", ")
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
        let table = self.candidates.tables.load.load();
        table.as_ref().map(|table| table.query(&self.candidates.subset, self.now, self.excluded.positions(), query))
    }

    /// [`Draw::loads`] without masking the exclusions, for rules that only read loads by
    /// position (and skip excluded positions themselves).
    pub fn loads_by_position<T>(&self, query: impl FnOnce(&Query<'_>) -> T) -> Option<T> {
        let table = self.candidates.tables.load.load();
        table.as_ref().map(|table| table.query(&self.candidates.subset, self.now, &[], query))
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

    use super::{Candidates, Load, LoadIndex, LoadSample, LoadTable, Needs};
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

    /// Candidates with a weight schedule and a load index (every instance idle).
    pub fn subset(members: Vec<Arc<Instance>>) -> Candidates {
        let candidates = Candidates::new(Subset::new("test", members));
        candidates.build(Needs { schedule: true, ..Needs::default() });
        let index = LoadIndex::new(candidates.subset.members.clone());
        candidates.tables.load.store(Some(Arc::new(LoadTable::own(Arc::new(index)))));
        candidates
    }

    /// [`subset`] with a Maglev table too.
    pub fn hashed(members: Vec<Arc<Instance>>) -> Candidates {
        let candidates = subset(members);
        candidates.build(Needs { maglev: true, ..Needs::default() });
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
        candidates.tables.load.load().as_ref().expect("built").index().set(position, sample, now);
    }

    /// Sets several loads by id.
    pub fn with_loads(candidates: Candidates, loads: &[(&str, Load)]) -> Candidates {
        for (id, load) in loads {
            set_load(&candidates, id, *load);
        }
        candidates
    }
}
