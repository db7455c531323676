//! Ticket leases: a block of consecutive tickets of one rotation, with the eligible list, so a
//! consumer can map tickets to instances itself.
//!
//! Only rules whose choice is a pure function of (ticket, eligible list) can be leased —
//! `round_robin`, `repeat`, `weighted` — and only without gray release (whose version choice is
//! per pick). Leased tickets come from the same counter as unary picks, so leased and unary
//! consumers share one exact rotation. Leased picks are not counted in flight: rota never
//! sees them.

use std::sync::Arc;

use super::{Balancer, PickError, PickQuery, PickResult, check_request_limits, known_service};
use crate::registry::{Instance, InvalidField};
use crate::rules::{Fallback, isolate, leasable_rules};
use crate::state::CounterKey;

/// Most tickets one lease may reserve.
pub const MAX_LEASE: u32 = 65_536;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leased {
    pub first_ticket: u64,
    pub count: u32,
    pub instances: Arc<[Arc<Instance>]>,
    pub epoch: u64,
    pub rule: Arc<str>,
    pub fallback: Option<String>,
}

impl Balancer {
    /// Reserves `count` tickets; counted as one pick of the service (not per ticket).
    pub async fn lease(&self, query: PickQuery<'_>, count: u32) -> Result<Leased, PickError> {
        let mut rule = None;
        let result = self.lease_uncounted(query, count, &mut rule).await;
        let fallback = result.as_ref().is_ok_and(|leased| leased.fallback.is_some());
        self.counters.record(self.service_label(query.service), rule.as_ref(), PickResult::of(&result), fallback);
        result
    }

    async fn lease_uncounted(
        &self,
        query: PickQuery<'_>,
        count: u32,
        resolved_rule: &mut Option<Arc<str>>,
    ) -> Result<Leased, PickError> {
        check_request_limits(&query)?;
        if count > MAX_LEASE {
            let problem = format!("is {count}; the limit is {MAX_LEASE}");
            return Err(InvalidField::new("count", problem).into());
        }
        let policies = self.policies.load();
        let policy = policies.for_service(query.service);
        let rule = if query.rule.is_empty() { policy.rule.clone() } else { self.rules.get(query.rule)? };
        *resolved_rule = Some(rule.canonical.clone());
        if !rule.rule.leasable() {
            let problem =
                format!("is {:?}, which cannot be leased; leasable rules: {}", &*rule.canonical, leasable_rules());
            return Err(InvalidField::new("rule", problem).into());
        }
        if query.version.is_empty() && policy.gray.is_some() {
            return Err(PickError::Invalid(InvalidField::new(
                "version",
                format!("must be set: service {:?} uses gray release, which assigns versions per pick", query.service),
            )));
        }
        let catalog = self.registry.catalog();
        let snapshot = known_service(catalog.get(query.service), query.service)?;
        let isolated =
            isolate(&**snapshot, query.version, policy.isolation_fallback == crate::policy::IsolationFallback::Any);
        if isolated.subset.is_empty() {
            return Err(PickError::Unavailable(format!(
                "service {:?} has no eligible instance for a lease",
                query.service
            )));
        }
        let fallback = isolated.fallback.map(|kind| match kind {
            Fallback::Unversioned => {
                format!("no instance with version {:?}; leased instances with no version", query.version)
            }
            Fallback::Any => "no instance in the version nor unversioned; leased any instance".to_owned(),
        });
        let counter = CounterKey {
            service: snapshot.name.clone(),
            rule: rule.canonical.clone(),
            subset: isolated.subset.label.clone(),
        };
        let first_ticket = if count == 0 { 0 } else { self.state.reserve_tickets(&counter, count).await? };
        Ok(Leased {
            first_ticket,
            count,
            instances: isolated.subset.members.clone(),
            epoch: snapshot.epoch,
            rule: rule.canonical.clone(),
            fallback,
        })
    }
}
