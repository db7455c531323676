//! `retry`: selections with the inner rule, skipping each instance whose breaker is open; when
//! none is available, a wait — for the earliest breaker to close or the service's instances to
//! change, never spinning — until the budget runs out.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::select::{Attempt, Selected, Selection};
use super::view::ServiceView;
use super::{Balancer, PickError, PickQuery};
use crate::policy::Policy;
use crate::rules::{ParsedRule, Rule};

impl Balancer {
    pub(super) async fn pick_with_retry(
        &self,
        first: &Arc<ServiceView>,
        rule: &ParsedRule,
        (inner, budget): (&Rule, Duration),
        policy: &Policy,
        query: &PickQuery<'_>,
    ) -> Result<Selected, PickError> {
        let deadline = Instant::now() + budget;
        let mut changes = self.registry.changes();
        let mut view = first.clone();
        loop {
            changes.borrow_and_update();
            let mut skipped: Vec<String> = query.exclude.to_vec();
            let last_error = loop {
                let selection = Selection {
                    view: &view,
                    rule,
                    selector: inner,
                    policy,
                    query,
                    exclude: &skipped,
                    avoid_tripped: true,
                };
                match self.select_once(&selection).await {
                    Ok(Attempt::Picked(selected)) => return Ok(selected),
                    // Each skip removes one more instance, so this ends.
                    Ok(Attempt::Tripped(id)) => skipped.push(id.to_string()),
                    Err(PickError::Unavailable(reason)) => break reason,
                    Err(other) => return Err(other),
                }
            };
            if Instant::now() >= deadline {
                return Err(PickError::Unavailable(format!(
                    "retry gave up after {} ms: {last_error}",
                    budget.as_millis()
                )));
            }
            let wake = self.stats.next_breaker_reset(query.service).map_or(deadline, |reset| reset.min(deadline));
            tokio::select! {
                () = tokio::time::sleep_until(wake) => {}
                _ = changes.changed() => {}
            }
            if let Some(latest) = self.views.load().get(query.service) {
                view = latest.clone();
            }
        }
    }
}
