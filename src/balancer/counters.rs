//! Pick counters for operators: every Pick, PickStream pick and Lease is counted by service, rule
//! and result, for the admin listener's `/metrics` and JSON API. (Successful picks per instance
//! are tallied with the instance's statistics, [`crate::load::Stats::instance_picks`].)
//!
//! A successful pick counts through the counter handle its rotation caches on the snapshot
//! subset ([`PickCounters::ok_counter`]): one `fetch_add`, no lookup. Other results are found by
//! one sharded-map lookup keyed by the snapshot's and the rule cache's `Arc<str>`s. Label
//! cardinality is bounded: callers pass registered services' names only (a pick of anything
//! else counts under [`UNKNOWN_SERVICE`]), the first [`MAX_COUNTED_SERVICES`] names seen get
//! their own label, and later ones share [`OTHER_SERVICE`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::hash::ConcurrentMap;

use super::PickError;

/// Most distinct service labels the pick counters track.
pub const MAX_COUNTED_SERVICES: usize = 1000;
/// The service label of picks for services beyond [`MAX_COUNTED_SERVICES`].
pub const OTHER_SERVICE: &str = "_other";
/// The service label of picks naming a service that is not registered (or not even a valid
/// name): only registered services' names become labels.
pub const UNKNOWN_SERVICE: &str = "_unknown";
/// Most distinct rule labels the pick counters track (consumers use a handful; a client sending
/// ever-new valid rule strings cannot grow the series without bound). Picks under further rules
/// count under [`OTHER_RULE`].
pub const MAX_COUNTED_RULES: usize = 256;
pub use crate::load::OTHER_RULE;
/// The rule label of picks refused before their rule was resolved (bad name, bad rule).
pub const UNRESOLVED_RULE: &str = "_unresolved";

/// How a pick ended, as the `result` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PickResult {
    Ok,
    InvalidArgument,
    NotFound,
    Unavailable,
}

impl PickResult {
    pub fn of<T>(result: &Result<T, PickError>) -> Self {
        result.as_ref().err().map_or(Self::Ok, Self::of_error)
    }

    pub fn of_error(error: &PickError) -> Self {
        match error {
            PickError::Invalid(_) | PickError::Rule(_) => Self::InvalidArgument,
            PickError::UnknownService(_) => Self::NotFound,
            PickError::Unavailable(_) => Self::Unavailable,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::InvalidArgument => "invalid_argument",
            Self::NotFound => "not_found",
            Self::Unavailable => "unavailable",
        }
    }
}

/// One `rota_picks_total` series.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PickCount {
    pub service: Arc<str>,
    pub rule: Arc<str>,
    pub result: PickResult,
    pub count: u64,
}

type PickKey = (Arc<str>, Arc<str>, PickResult);

/// A bounded set of label values: the first `limit` distinct values seen are their own label,
/// later ones share `other`.
struct Labels {
    known: ConcurrentMap<Arc<str>, ()>,
    /// Serialises admitting a new value, so the limit is exact.
    admit: Mutex<()>,
    limit: usize,
    other: Arc<str>,
}

impl Labels {
    fn new(limit: usize, other: &str) -> Self {
        Self { known: ConcurrentMap::default(), admit: Mutex::new(()), limit, other: other.into() }
    }

    /// The label `value` is counted under.
    fn label(&self, value: &str) -> Arc<str> {
        if let Some(known) = self.known.get(value) {
            return known.key().clone();
        }
        let _admitting = self.admit.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(known) = self.known.get(value) {
            return known.key().clone();
        }
        if self.known.len() >= self.limit {
            return self.other.clone();
        }
        let label: Arc<str> = value.into();
        self.known.insert(label.clone(), ());
        label
    }
}

pub struct PickCounters {
    services: Labels,
    rules: Labels,
    unresolved: Arc<str>,
    picks: ConcurrentMap<PickKey, Arc<AtomicU64>>,
    fallbacks: ConcurrentMap<Arc<str>, AtomicU64>,
}

impl Default for PickCounters {
    fn default() -> Self {
        Self {
            services: Labels::new(MAX_COUNTED_SERVICES, OTHER_SERVICE),
            rules: Labels::new(MAX_COUNTED_RULES, OTHER_RULE),
            unresolved: UNRESOLVED_RULE.into(),
            picks: ConcurrentMap::default(),
            fallbacks: ConcurrentMap::default(),
        }
    }
}

fn bump<K: Eq + std::hash::Hash>(map: &ConcurrentMap<K, AtomicU64>, key: K) {
    match map.get(&key) {
        Some(counter) => counter.fetch_add(1, Ordering::Relaxed),
        None => map.entry(key).or_default().fetch_add(1, Ordering::Relaxed),
    };
}

fn counter<K: Eq + std::hash::Hash>(map: &ConcurrentMap<K, Arc<AtomicU64>>, key: K) -> Arc<AtomicU64> {
    match map.get(&key) {
        Some(counter) => counter.clone(),
        None => map.entry(key).or_default().clone(),
    }
}

impl PickCounters {
    fn service_label(&self, service: &str) -> Arc<str> {
        self.services.label(service)
    }

    fn rule_label(&self, rule: Option<&Arc<str>>) -> Arc<str> {
        rule.map_or_else(|| self.unresolved.clone(), |rule| self.rules.label(rule))
    }

    /// Counts one pick (or lease) that ended with `result`. `rule` is the canonical rule when
    /// it was resolved; `fallback` marks a successful pick that took a fallback.
    pub fn record(&self, service: &str, rule: Option<&Arc<str>>, result: PickResult, fallback: bool) {
        self.record_many(service, rule, result, fallback, 1);
    }

    /// [`PickCounters::record`] for `count` picks at once (a lease's tickets).
    pub fn record_many(&self, service: &str, rule: Option<&Arc<str>>, result: PickResult, fallback: bool, count: u64) {
        let service = self.service_label(service);
        let rule = self.rule_label(rule);
        if fallback {
            bump(&self.fallbacks, service.clone());
        }
        counter(&self.picks, (service, rule, result)).fetch_add(count, Ordering::Relaxed);
    }

    /// The counter of successful picks of `service` under `rule`, for a rotation to cache.
    pub fn ok_counter(&self, service: &str, rule: &Arc<str>) -> Arc<AtomicU64> {
        counter(&self.picks, (self.service_label(service), self.rule_label(Some(rule)), PickResult::Ok))
    }

    /// Counts a successful pick's fallback (the pick itself is counted through its rotation).
    pub fn record_fallback(&self, service: &str) {
        bump(&self.fallbacks, self.service_label(service));
    }

    /// Every pick series, sorted by labels.
    pub fn picks(&self) -> Vec<PickCount> {
        let mut all: Vec<PickCount> = self
            .picks
            .iter()
            .map(|e| {
                let (service, rule, result) = e.key().clone();
                PickCount { service, rule, result, count: e.value().load(Ordering::Relaxed) }
            })
            .collect();
        all.sort_by(|a, b| (&a.service, &a.rule, a.result).cmp(&(&b.service, &b.rule, b.result)));
        all
    }

    /// Picks that took a fallback, per service, sorted by service.
    pub fn fallbacks(&self) -> Vec<(Arc<str>, u64)> {
        let mut all: Vec<_> =
            self.fallbacks.iter().map(|e| (e.key().clone(), e.value().load(Ordering::Relaxed))).collect();
        all.sort();
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn services_beyond_the_limit_share_one_label() {
        let counters = PickCounters::default();
        let rule: Arc<str> = "round_robin".into();
        for i in 0..MAX_COUNTED_SERVICES + 5 {
            counters.record(&format!("s{i}"), Some(&rule), PickResult::Ok, false);
        }
        counters.ok_counter("s0", &rule).fetch_add(1, Ordering::Relaxed);
        let picks = counters.picks();
        assert_eq!(picks.len(), MAX_COUNTED_SERVICES + 1);
        let other = picks.iter().find(|p| &*p.service == OTHER_SERVICE).unwrap();
        assert_eq!(other.count, 5);
        assert_eq!(picks.iter().find(|p| &*p.service == "s0").unwrap().count, 2);
        counters.ok_counter("s-new", &rule).fetch_add(1, Ordering::Relaxed);
        assert_eq!(counters.picks().iter().find(|p| &*p.service == OTHER_SERVICE).unwrap().count, 6);
    }

    #[test]
    fn results_rules_and_fallbacks_are_counted_apart() {
        let counters = PickCounters::default();
        let rr: Arc<str> = "round_robin".into();
        let ok = counters.ok_counter("svc", &rr);
        ok.fetch_add(1, Ordering::Relaxed);
        counters.record("svc", Some(&rr), PickResult::Ok, true);
        ok.fetch_add(1, Ordering::Relaxed);
        counters.record_fallback("svc");
        counters.record("svc", None, PickResult::InvalidArgument, false);
        let summary: Vec<_> = counters.picks().iter().map(|p| (p.rule.to_string(), p.result, p.count)).collect();
        assert_eq!(
            summary,
            [("_unresolved".to_owned(), PickResult::InvalidArgument, 1), ("round_robin".to_owned(), PickResult::Ok, 3)]
        );
        assert_eq!(counters.fallbacks(), [("svc".into(), 2)]);
    }

    #[test]
    fn rules_beyond_the_limit_share_one_label() {
        let counters = PickCounters::default();
        for n in 0..MAX_COUNTED_RULES + 3 {
            let rule: Arc<str> = format!("repeat(n={})", n + 1).into();
            counters.ok_counter("svc", &rule).fetch_add(1, Ordering::Relaxed);
        }
        counters.record("svc", Some(&"repeat(n=1)".into()), PickResult::Unavailable, false);
        let picks = counters.picks();
        assert_eq!(picks.len(), MAX_COUNTED_RULES + 2, "every admitted rule, _other, and one failure");
        let other = picks.iter().find(|p| &*p.rule == OTHER_RULE).unwrap();
        assert_eq!(other.count, 3);
    }
}
