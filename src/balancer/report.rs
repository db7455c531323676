//! Call outcomes reported by consumers.
//!
//! An outcome is checked against the current snapshot: one that names a service or instance
//! rota does not know (it left, or never was) is ignored and counted, since consumers report
//! after the fact and registrations move on meanwhile.
//!
//! An outcome marked `leased` comes from a call a gRPC channel routed by a leased ticket (or by
//! its local rotation): no unary pick counted it in flight, so it must not retire one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::{Balancer, PickError};
use crate::load::{Origin, Outcome, Outliers};
use crate::registry::{InvalidField, validate_service_name};

/// Most outcomes one report may carry.
pub const MAX_OUTCOMES_PER_REPORT: usize = 1000;
/// Longest latency a report may give: an hour, far past any call's deadline. A larger value is
/// a broken or hostile reporter, and would hold an instance's latency average up for good.
pub const MAX_REPORTED_LATENCY: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallResult {
    Ok,
    ConnectFailure,
    Error,
}

/// One call's outcome, as a consumer reported it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallOutcome {
    pub service: String,
    pub instance_id: String,
    pub ticket: u64,
    pub latency: Duration,
    /// `None` when the consumer sent a result rota does not know.
    pub result: Option<CallResult>,
    /// Routed by a leased ticket rather than a unary pick.
    pub leased: bool,
    /// The rule the call was routed by, as the consumer reported it (may be empty).
    pub rule: String,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReportSummary {
    pub accepted: u32,
    pub ignored: u32,
}

/// Running totals of reported outcomes.
#[derive(Debug, Default)]
pub struct ReportCounters {
    pub ok: AtomicU64,
    pub connect_failures: AtomicU64,
    pub errors: AtomicU64,
    pub ignored: AtomicU64,
}

impl ReportCounters {
    pub(super) fn record(&self, result: CallResult) {
        let counter = match result {
            CallResult::Ok => &self.ok,
            CallResult::ConnectFailure => &self.connect_failures,
            CallResult::Error => &self.errors,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

impl Balancer {
    /// Records call outcomes in the fleet-wide statistics. The whole report is refused if any
    /// outcome is malformed; outcomes for unknown services or instances are ignored and counted.
    pub fn report(&self, outcomes: &[CallOutcome]) -> Result<ReportSummary, PickError> {
        validate(outcomes)?;
        let catalog = self.registry.catalog();
        let policies = self.policies.load();
        let mut summary = ReportSummary::default();
        for outcome in outcomes {
            let snapshot = catalog.get(&outcome.service);
            let instance = snapshot.and_then(|s| s.instance(&outcome.instance_id));
            match (instance, outcome.result) {
                (Some(instance), Some(result)) => {
                    let policy = policies.for_service(&outcome.service);
                    let stats_outcome = match result {
                        CallResult::Ok => Outcome::Success,
                        CallResult::ConnectFailure | CallResult::Error => Outcome::Failure,
                    };
                    let origin = if outcome.leased { Origin::Lease } else { Origin::Pick };
                    self.stats.on_outcome(
                        &instance.service,
                        &instance.id,
                        stats_outcome,
                        origin,
                        outcome.latency,
                        Outliers { breaker: policy.breaker, ejection: policy.ejection },
                    );
                    // A leased call was never a pick rota saw: its report is where the instance's
                    // share of the rotation becomes visible (dashboard, API, metrics).
                    if outcome.leased {
                        let rule = if outcome.rule.is_empty() {
                            Some(policy.rule.canonical.clone())
                        } else {
                            self.rules.get(&outcome.rule).ok().map(|r| r.canonical.clone())
                        };
                        self.stats.on_leased_call(&instance.service, &instance.id, rule.as_ref());
                    }
                    self.reports.record(result);
                    summary.accepted += 1;
                }
                _ => {
                    self.reports.ignored.fetch_add(1, Ordering::Relaxed);
                    summary.ignored += 1;
                }
            }
        }
        Ok(summary)
    }
}

/// Checks a whole report before any of it is recorded, so a bad report changes nothing.
pub(super) fn validate(outcomes: &[CallOutcome]) -> Result<(), InvalidField> {
    if outcomes.len() > MAX_OUTCOMES_PER_REPORT {
        return Err(InvalidField::new(
            "outcomes",
            format!("has {} entries; the limit is {MAX_OUTCOMES_PER_REPORT}", outcomes.len()),
        ));
    }
    for (i, outcome) in outcomes.iter().enumerate() {
        validate_service_name(&format!("outcomes[{i}].service"), &outcome.service)?;
        if outcome.instance_id.is_empty() {
            return Err(InvalidField::new(format!("outcomes[{i}].instance_id"), "must not be empty"));
        }
        if outcome.latency > MAX_REPORTED_LATENCY {
            return Err(InvalidField::new(
                format!("outcomes[{i}].latency_us"),
                format!(
                    "is {} µs; the limit is {} µs (1 h)",
                    outcome.latency.as_micros(),
                    MAX_REPORTED_LATENCY.as_micros()
                ),
            ));
        }
        if outcome.result.is_none() {
            return Err(InvalidField::new(
                format!("outcomes[{i}].result"),
                "must be CALL_RESULT_OK, CALL_RESULT_CONNECT_FAILURE or CALL_RESULT_ERROR",
            ));
        }
    }
    Ok(())
}
