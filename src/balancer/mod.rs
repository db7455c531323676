//! The pick path: policy → view → filters → ticket → selector.
//!
//! A pick loads the policy set and one immutable [`ServiceView`] (built when the registry
//! published the service's snapshot, see [`view`]), narrows the instances with version
//! isolation (and gray release) and `exclude`, draws a ticket from the shared rotation of
//! (service, rule, subset), and lets the rule turn the ticket into an instance. No lock is
//! shared with the registry writer. `retry` (`retry.rs`) and `sticky` (`sticky.rs`) wrap that
//! single selection (`select.rs`). Every successful pick counts as in flight for its instance until a consumer
//! reports the call's outcome ([`Balancer::report`]). Every pick and lease is counted for
//! operators ([`counters`]).

mod builds;
pub mod counters;
mod error;
mod lease;
mod overview;
mod pick_latency;
mod randomness;
mod report;
mod retry;
mod select;
mod sticky;
pub mod view;

use std::sync::Arc;

use crate::load::{InstanceReport, Stats, StatsConfig};
use crate::policy::{Policies, Policy};
use crate::registry::{Instance, InvalidField, Registry, validate_optional_name, validate_service_name};
use crate::rules::{ParsedRule, Retry, Rule, RuleCache, RuleError};
use crate::state::StateBackend;
use randomness::Randomness;

pub use crate::load::InstancePicks;
pub use builds::{BUILD_THREADS, BuildPool};
pub use counters::{PickCounters, PickResult, UNKNOWN_SERVICE};
pub use error::PickError;
pub use lease::{Leased, LeasedPick, MAX_LEASE};
pub use overview::Overview;
pub use pick_latency::{PICK_BUCKETS, PickLatency, PickLatencySnapshot};
pub use report::{CallOutcome, CallResult, MAX_OUTCOMES_PER_REPORT, ReportCounters, ReportSummary};
pub use view::{ServiceView, SubsetView, Views};

/// Longest accepted `key`, in bytes.
pub const MAX_KEY_LEN: usize = 1024;
/// Most `exclude` entries one request may carry.
pub const MAX_EXCLUDE: usize = 1000;

/// One pick request, borrowed from the caller's message.
#[derive(Debug, Clone, Copy, Default)]
pub struct PickQuery<'a> {
    pub service: &'a str,
    pub rule: &'a str,
    pub version: &'a str,
    pub key: &'a str,
    pub zone: &'a str,
    pub exclude: &'a [String],
}

/// The outcome of a successful pick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Picked {
    pub instance: Arc<Instance>,
    pub ticket: u64,
    /// Canonical name of the rule that ran.
    pub rule: Arc<str>,
    /// Why a fallback was taken, when one was.
    pub fallback: Option<String>,
    /// Epoch of the snapshot the pick was made from.
    pub epoch: u64,
}

pub struct Balancer {
    registry: Registry,
    state: StateBackend,
    stats: Arc<Stats>,
    views: Arc<Views>,
    policies: Arc<Policies>,
    rules: RuleCache,
    reports: ReportCounters,
    counters: PickCounters,
    pick_latency: PickLatency,
    randomness: Randomness,
}

impl Balancer {
    pub fn new(registry: Registry, state: StateBackend, policies: Arc<Policies>, stats: StatsConfig) -> Self {
        let stats = Arc::new(Stats::new(stats));
        Self {
            views: Views::follow(&registry, stats.clone()),
            registry,
            state,
            stats,
            policies,
            rules: RuleCache::new(),
            reports: ReportCounters::default(),
            counters: PickCounters::default(),
            pick_latency: PickLatency::default(),
            randomness: Randomness::PerWorker,
        }
    }

    /// This balancer with every random choice drawn from one generator seeded with `seed`, so
    /// that a test's picks of randomised rules repeat exactly.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.randomness = Randomness::seeded(seed);
        self
    }

    /// A balancer with default policies and statistics settings.
    pub fn with_defaults(registry: Registry) -> Self {
        Self::new(registry, StateBackend::default(), Arc::default(), StatsConfig::default())
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn state(&self) -> &StateBackend {
        &self.state
    }

    /// The pick views of every service.
    /// The per-instance call statistics.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    pub fn views(&self) -> &Arc<Views> {
        &self.views
    }

    pub fn policies(&self) -> &Arc<Policies> {
        &self.policies
    }

    pub fn reports(&self) -> &ReportCounters {
        &self.reports
    }

    /// Picks and leases so far, by service, rule and result.
    pub fn counters(&self) -> &PickCounters {
        &self.counters
    }

    /// How long picks took.
    pub fn pick_latency(&self) -> &PickLatency {
        &self.pick_latency
    }

    /// What rota knows about one instance's calls.
    pub fn instance_stats(&self, service: &str, id: &str) -> InstanceReport {
        self.stats.report(service, id)
    }

    /// Successful picks of each instance of `service`, by rule.
    pub fn instance_picks(&self, service: &str) -> Vec<InstancePicks> {
        self.stats.instance_picks(service)
    }

    /// One pick: counted by result in [`PickCounters`] and timed in [`PickLatency`].
    pub async fn pick(&self, query: PickQuery<'_>) -> Result<Picked, PickError> {
        let started = std::time::Instant::now();
        let result = self.pick_counted(query).await;
        self.pick_latency.record(started.elapsed());
        result
    }

    async fn pick_counted(&self, query: PickQuery<'_>) -> Result<Picked, PickError> {
        let policies = self.policies.load();
        let policy = policies.for_service(query.service);
        let resolved = check_request_limits(&query).and_then(|()| self.resolve_rule(&query, policy));
        let rule = match resolved {
            Ok(rule) => rule,
            Err(error) => {
                self.counters.record(self.service_label(query.service), None, PickResult::of_error(&error), false);
                return Err(error);
            }
        };
        let result = self.pick_with(&rule, policy, query).await;
        match &result {
            // The pick itself was counted on its rotation.
            Ok(picked) if picked.fallback.is_some() => self.counters.record_fallback(&picked.instance.service),
            Ok(_) => {}
            Err(error) => {
                let service = self.service_label(query.service);
                self.counters.record(service, Some(&rule.canonical), PickResult::of_error(error), false)
            }
        }
        result
    }

    /// The label a pick of `service` is counted under: its name when it is registered,
    /// [`UNKNOWN_SERVICE`] otherwise. A name a client made up never becomes a label, so it can
    /// neither grow the metrics nor use up the labels real services need.
    fn service_label<'a>(&self, service: &'a str) -> &'a str {
        if self.registry.catalog().get(service).is_some() { service } else { UNKNOWN_SERVICE }
    }

    /// The errors a lease of `count` tickets of `query` would be refused with for its input
    /// alone, before anything is drawn: for callers that may refuse it for another reason but
    /// must not hide bad input behind that reason.
    pub fn check_lease(&self, query: &PickQuery<'_>, count: u32) -> Result<(), PickError> {
        check_lease_fields(query, count)?;
        self.resolve_rule(query, self.policies.load().for_service(query.service)).map(drop)
    }

    /// The request's rule, or the service's policy rule when the request names none.
    fn resolve_rule(&self, query: &PickQuery<'_>, policy: &Policy) -> Result<Arc<ParsedRule>, PickError> {
        if query.rule.is_empty() { Ok(policy.rule.clone()) } else { Ok(self.rules.get(query.rule)?) }
    }

    /// The pick under a resolved rule, counted when it succeeds.
    async fn pick_with(&self, rule: &ParsedRule, policy: &Policy, query: PickQuery<'_>) -> Result<Picked, PickError> {
        if rule.rule.needs_key() && query.key.is_empty() {
            return Err(RuleError::MissingKey { rule: rule.canonical.clone() }.into());
        }
        let views = self.views.load();
        let view = known_service(views.get(query.service), query.service)?;
        let selection = match &rule.rule {
            Rule::Retry(Retry { inner, budget }) => {
                Box::pin(self.pick_with_retry(view, rule, (inner.as_ref(), *budget), policy, &query)).await?
            }
            selector => {
                let selection = select::Selection {
                    view,
                    rule,
                    selector,
                    policy,
                    query: &query,
                    exclude: query.exclude,
                    avoid_tripped: false,
                };
                match self.select_once(&selection).await? {
                    select::Attempt::Picked(selected) => selected,
                    // Only asked for by `retry`; a plain pick takes what the rule chose.
                    select::Attempt::Tripped(id) => {
                        return Err(PickError::Unavailable(format!("instance {id:?} has its breaker open")));
                    }
                }
            }
        };
        Ok(Picked {
            instance: selection.instance,
            ticket: selection.ticket,
            rule: rule.canonical.clone(),
            fallback: selection.fallback,
            epoch: view.snapshot.epoch,
        })
    }

    /// Periodic upkeep: forget statistics of instances that left, drop expired assignments and
    /// idle rotation counters. Linear in the number of entries (one binary search in the
    /// service's snapshot each); the server runs it off the async runtime.
    pub fn housekeeping(&self) {
        let catalog = self.registry.catalog();
        self.stats.retain(|service, id| catalog.get(service).is_some_and(|s| s.instance(id).is_some()));
        self.state.housekeeping();
    }

    /// Stops counting picks nobody reported within the in-flight timeout (the load indexes
    /// learn of it here). Linear in the instances with statistics; the server runs it every
    /// second, off the async runtime.
    pub fn expire_in_flight(&self) {
        self.stats.expire();
    }
}

/// What was found for the service (its view or snapshot). Registered names were validated on
/// the way in, so a name is only checked (to tell `INVALID_ARGUMENT` from `NOT_FOUND`) when the
/// lookup misses.
fn known_service<'v, T>(found: Option<&'v T>, service: &str) -> Result<&'v T, PickError> {
    match found {
        Some(found) => Ok(found),
        None => {
            validate_service_name("service", service)?;
            Err(PickError::UnknownService(service.into()))
        }
    }
}

/// A lease's fields within their limits: the pick request's, and `count`.
fn check_lease_fields(query: &PickQuery<'_>, count: u32) -> Result<(), PickError> {
    check_request_limits(query)?;
    if count > MAX_LEASE {
        return Err(InvalidField::new("count", format!("is {count}; the limit is {MAX_LEASE}")).into());
    }
    Ok(())
}

fn check_request_limits(query: &PickQuery<'_>) -> Result<(), PickError> {
    let too_long = |field: &str, len: usize, limit: usize| {
        PickError::Invalid(InvalidField::new(field, format!("is {len} bytes long; the limit is {limit}")))
    };
    // Malformed, not merely unknown: a version that could never be registered is refused
    // rather than quietly falling back to unversioned instances.
    validate_optional_name("version", query.version)?;
    validate_optional_name("zone", query.zone)?;
    if query.key.len() > MAX_KEY_LEN {
        return Err(too_long("key", query.key.len(), MAX_KEY_LEN));
    }
    if query.exclude.len() > MAX_EXCLUDE {
        let problem = format!("has {} entries; the limit is {MAX_EXCLUDE}", query.exclude.len());
        return Err(PickError::Invalid(InvalidField::new("exclude", problem)));
    }
    Ok(())
}

#[cfg(test)]
mod churn_tests;
#[cfg(test)]
mod tests;
