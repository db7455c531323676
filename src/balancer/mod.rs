//! The pick path: snapshot → filters → ticket → selector.
//!
//! A pick reads one immutable [`ServiceSnapshot`](crate::registry::ServiceSnapshot), narrows it
//! with version isolation and `exclude`, draws a ticket from the shared rotation of
//! (service, rule, subset), and lets the rule turn the ticket into an instance. No lock is shared
//! with the registry writer, and nothing is allocated unless the request excludes instances or
//! falls back.

mod error;
mod report;

use std::sync::Arc;

use crate::registry::{Instance, Registry, validate_service_name};
use crate::rules::{Draw, RuleCache, Select, isolate, without_excluded};
use crate::state::{CounterKey, StateBackend};

pub use error::PickError;
pub use report::{CallOutcome, CallResult, MAX_OUTCOMES_PER_REPORT, ReportCounters, ReportSummary};

/// Rule used when a request names none.
pub const DEFAULT_RULE: &str = "round_robin";

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
    rules: RuleCache,
    reports: ReportCounters,
}

impl Balancer {
    pub fn new(registry: Registry, state: StateBackend) -> Self {
        Self { registry, state, rules: RuleCache::new(), reports: ReportCounters::default() }
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn state(&self) -> &StateBackend {
        &self.state
    }

    pub fn reports(&self) -> &ReportCounters {
        &self.reports
    }

    /// Records call outcomes. The whole report is refused if any outcome is malformed.
    pub fn report(&self, outcomes: &[CallOutcome]) -> Result<ReportSummary, PickError> {
        report::validate(outcomes)?;
        let catalog = self.registry.catalog();
        let mut summary = ReportSummary::default();
        for outcome in outcomes {
            let known = catalog
                .get(&outcome.service)
                .is_some_and(|s| s.instances.iter().any(|i| *i.id == *outcome.instance_id));
            match (known, outcome.result) {
                (true, Some(result)) => {
                    self.reports.record(result);
                    summary.accepted += 1;
                }
                _ => {
                    self.reports.ignored.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    summary.ignored += 1;
                }
            }
        }
        Ok(summary)
    }

    pub async fn pick(&self, query: PickQuery<'_>) -> Result<Picked, PickError> {
        validate_service_name("service", query.service)?;
        check_request_limits(&query)?;
        let rule = self.rules.get(if query.rule.is_empty() { DEFAULT_RULE } else { query.rule })?;
        let catalog = self.registry.catalog();
        let snapshot = catalog.get(query.service).ok_or_else(|| PickError::UnknownService(query.service.into()))?;

        let isolated = isolate(snapshot, query.version);
        let candidates = without_excluded(&isolated.subset.members, query.exclude);
        if candidates.is_empty() {
            return Err(PickError::Unavailable(unavailable_reason(&query)));
        }
        let key = CounterKey {
            service: snapshot.name.clone(),
            rule: rule.canonical.clone(),
            subset: isolated.subset.label.clone(),
        };
        let ticket = self.state.next_ticket(&key).await?;
        let mut rng = fastrand::Rng::new();
        let draw = Draw { candidates: &candidates, ticket, key: query.key };
        let index =
            rule.rule.select(&draw, &mut rng).ok_or_else(|| PickError::Unavailable(unavailable_reason(&query)))?;
        let instance = candidates
            .get(index)
            .cloned()
            .ok_or_else(|| PickError::Unavailable("the rule chose no instance".into()))?;
        let fallback = isolated
            .fell_back
            .then(|| format!("no instance with version {:?}; picked from instances with no version", query.version));
        Ok(Picked { instance, ticket, rule: rule.canonical.clone(), fallback, epoch: snapshot.epoch })
    }
}

fn check_request_limits(query: &PickQuery<'_>) -> Result<(), PickError> {
    use crate::registry::{InvalidField, MAX_NAME_LEN};
    let too_long = |field: &str, len: usize, limit: usize| {
        PickError::Invalid(InvalidField::new(field, format!("is {len} bytes long; the limit is {limit}")))
    };
    if query.version.len() > MAX_NAME_LEN {
        return Err(too_long("version", query.version.len(), MAX_NAME_LEN));
    }
    if query.zone.len() > MAX_NAME_LEN {
        return Err(too_long("zone", query.zone.len(), MAX_NAME_LEN));
    }
    if query.key.len() > MAX_KEY_LEN {
        return Err(too_long("key", query.key.len(), MAX_KEY_LEN));
    }
    if query.exclude.len() > MAX_EXCLUDE {
        let problem = format!("has {} entries; the limit is {MAX_EXCLUDE}", query.exclude.len());
        return Err(PickError::Invalid(InvalidField::new("exclude", problem)));
    }
    Ok(())
}

fn unavailable_reason(query: &PickQuery<'_>) -> String {
    let mut reason = if query.version.is_empty() {
        format!("service {:?} has no UP instance without a version", query.service)
    } else {
        format!("service {:?} has no UP instance with version {:?} nor without a version", query.service, query.version)
    };
    if !query.exclude.is_empty() {
        reason.push_str(" that is not excluded");
    }
    reason
}

#[cfg(test)]
mod tests;
