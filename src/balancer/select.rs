//! One selection: gray release and version isolation, exclusion, a ticket, the rule (or a
//! sticky lookup), and the fallback notes the response carries.

use std::borrow::Cow;
use std::sync::Arc;

use tokio::time::Instant;

use super::view::{ServiceView, SubsetView, ensure};
use super::{Balancer, PickError, PickQuery};
use crate::policy::{IsolationFallback, Policy};
use crate::registry::Instance;
use crate::rules::{Draw, Excluded, Fallback, ParsedRule, Rule, Select, Sticky, isolate};
use crate::state::ejection::{self, Positions, Skip};
use crate::state::{CounterKey, StickyKey};

/// The rotation gray-release tickets are drawn from.
pub(super) const GRAY_RULE: &str = "gray";

pub(super) struct Selection {
    pub instance: Arc<Instance>,
    pub ticket: u64,
    pub fallback: Option<String>,
}

/// What one selection came to.
pub(super) enum Attempt {
    /// Picked, counted and in flight.
    Picked(Selection),
    /// The rule chose an instance whose breaker is open, and the caller asked for none such
    /// (`retry`); nothing was counted.
    Tripped(Arc<str>),
}

impl Balancer {
    /// One selection. A successful one is counted (on its rotation and its instance) and put
    /// in flight here, unless `avoid_tripped` is set and the chosen instance's breaker is open.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn select_once(
        &self,
        view: &Arc<ServiceView>,
        rule: &ParsedRule,
        selector: &Rule,
        policy: &Policy,
        query: &PickQuery<'_>,
        exclude: &[String],
        avoid_tripped: bool,
    ) -> Result<Attempt, PickError> {
        let snapshot = &view.snapshot;
        let version = self.requested_version(snapshot, policy, query).await?;
        let isolated = isolate(&**view, &version, policy.isolation_fallback == IsolationFallback::Any);
        let mut fallback = isolated.fallback.map(|kind| isolation_note(kind, &version));
        let subset: &SubsetView = isolated.subset;
        let candidates = &subset.candidates;
        let excluded = excluded_positions(candidates.members(), exclude);
        if candidates.len() == excluded.len() {
            return Err(PickError::Unavailable(unavailable_reason(query.service, &version, !exclude.is_empty())));
        }
        let now = Instant::now();
        let excluded = match skip_ejected(view, policy, candidates.members(), &excluded, now) {
            Skip::Ejected(ejected) if ejected.is_empty() => excluded,
            Skip::Ejected(ejected) => ejection::merge(&excluded, &ejected),
            panic => {
                add_owned_note(&mut fallback, panic.note(policy.ejection.max_ejected_percent));
                excluded
            }
        };
        ensure(view, subset, rule.rule.needs(), self.views.stats()).await;
        let excluded = Excluded::new(&excluded);
        let rotation = self.state.rotation(
            &subset.rotations,
            &rule.canonical,
            || CounterKey {
                service: snapshot.name.clone(),
                rule: rule.canonical.clone(),
                subset: subset.label().clone(),
            },
            || self.counters.ok_counter(&snapshot.name, &rule.canonical),
        );
        let ticket = self.state.draw(&rotation).await?;
        let draw = Draw { candidates, ticket, key: query.key, zone: query.zone, now, excluded };
        let mut rng = fastrand::Rng::new();

        let (index, sticky) = match selector {
            Rule::Sticky(Sticky { ttl }) => {
                let key =
                    StickyKey { service: snapshot.name.clone(), subset: subset.label().clone(), key: query.key.into() };
                let tripped = |index: usize| draw.loads(|loads| loads.load(index).tripped).unwrap_or(false);
                // Members are sorted by id; an excluded or tripped instance is not kept.
                let eligible = |id: &str| {
                    candidates
                        .members()
                        .binary_search_by(|i| (*i.id).cmp(id))
                        .ok()
                        .filter(|&index| draw.accepts(index) && !tripped(index))
                };
                match self.state.sticky_get(&key).await? {
                    Some(id) => match eligible(&id) {
                        // Still UP, not drained, not tripped: keep the assignment (refreshed below).
                        Some(index) => (index, Some((key, *ttl))),
                        // Gone, excluded or tripped: reassign.
                        None => (choose(selector, &draw, &mut rng, &mut fallback, rule)?, Some((key, *ttl))),
                    },
                    // No assignment yet: claim one. A consumer that claimed the key first (on
                    // another replica, say) wins when its choice is eligible here; then the
                    // claim set or read the assignment and there is nothing to refresh.
                    None => {
                        let chosen = choose(selector, &draw, &mut rng, &mut fallback, rule)?;
                        let id = candidates.members()[chosen].id.clone();
                        let winner = self.state.sticky_claim(key.clone(), id, *ttl).await?;
                        match eligible(&winner) {
                            Some(index) => (index, None),
                            None => (chosen, Some((key, *ttl))),
                        }
                    }
                }
            }
            _ => (choose(selector, &draw, &mut rng, &mut fallback, rule)?, None),
        };
        let instance = candidates.members()[index].clone();
        let handle = subset.stats_handle(index, &self.stats).ok_or_else(|| no_choice(rule, candidates.len()))?;
        if avoid_tripped && self.stats.load_handle(handle, draw.now).tripped {
            return Ok(Attempt::Tripped(instance.id.clone()));
        }
        if let Some((key, ttl)) = sticky {
            self.state.sticky_set(key, instance.id.clone(), ttl).await?;
        }
        rotation.tally();
        self.stats.on_pick(handle, &rule.canonical);
        Ok(Attempt::Picked(Selection { instance, ticket, fallback }))
    }

    /// The request's version, or for a request without one under gray release, the version
    /// the gray schedule assigns to the next gray ticket.
    async fn requested_version<'q>(
        &self,
        snapshot: &crate::registry::ServiceSnapshot,
        policy: &Policy,
        query: &PickQuery<'q>,
    ) -> Result<Cow<'q, str>, PickError> {
        match (&policy.gray, query.version.is_empty()) {
            (Some(gray), true) => {
                let counter = CounterKey { service: snapshot.name.clone(), rule: GRAY_RULE.into(), subset: "".into() };
                let ticket = self.state.next_ticket(&counter).await?;
                Ok(Cow::Owned(gray.version_for(ticket).unwrap_or_default().to_owned()))
            }
            _ => Ok(Cow::Borrowed(query.version)),
        }
    }
}

/// What outlier ejection skips among `members` (the subset's candidates) beside `excluded`.
pub(super) fn skip_ejected(
    view: &ServiceView,
    policy: &Policy,
    members: &[Arc<Instance>],
    excluded: &[usize],
    now: Instant,
) -> Skip {
    if !policy.ejection.enabled || view.ejections.is_empty() {
        return Skip::Ejected(Positions::new());
    }
    policy.ejection.skip(members.len(), excluded, view.ejections.positions(members, now))
}

/// The positions among `members` (sorted by id) of the ids in `exclude`, sorted, without
/// duplicates; ids that are not candidates are ignored. One binary search per id.
fn excluded_positions(members: &[Arc<Instance>], exclude: &[String]) -> Positions {
    let mut positions: Positions =
        exclude.iter().filter_map(|id| members.binary_search_by(|i| (*i.id).cmp(id)).ok()).collect();
    positions.sort_unstable();
    positions.dedup();
    positions
}

/// The rule's choice among the draw's candidates (a position), its fallback note added to
/// `fallback`.
pub(super) fn choose(
    selector: &Rule,
    draw: &Draw<'_>,
    rng: &mut fastrand::Rng,
    fallback: &mut Option<String>,
    rule: &ParsedRule,
) -> Result<usize, PickError> {
    let count = draw.candidates.len();
    let choice = selector.select(draw, rng).filter(|c| c.index < count).ok_or_else(|| no_choice(rule, count))?;
    add_note(fallback, choice.fallback);
    Ok(choice.index)
}

fn isolation_note(kind: Fallback, version: &str) -> String {
    match (kind, version.is_empty()) {
        (Fallback::Unversioned, _) => {
            format!("no instance with version {version:?}; picked from instances with no version")
        }
        (Fallback::Any, true) => "no instance without a version; picked from any instance".to_owned(),
        (Fallback::Any, false) => {
            format!("no instance with version {version:?} nor without a version; picked from any instance")
        }
    }
}

pub(super) fn add_owned_note(fallback: &mut Option<String>, note: Option<String>) {
    if let Some(note) = note {
        match fallback {
            Some(existing) => {
                existing.push_str("; ");
                existing.push_str(&note);
            }
            None => *fallback = Some(note),
        }
    }
}

fn add_note(fallback: &mut Option<String>, note: Option<&'static str>) {
    add_owned_note(fallback, note.map(str::to_owned));
}

fn no_choice(rule: &ParsedRule, candidates: usize) -> PickError {
    let why = match rule.rule {
        Rule::Weighted(_) => "every eligible instance has weight 0",
        _ => "the rule chose none of them",
    };
    PickError::Unavailable(format!("{candidates} eligible instances but {}: {why}", rule.canonical))
}

fn unavailable_reason(service: &str, version: &str, excluded: bool) -> String {
    let mut reason = if version.is_empty() {
        format!("service {service:?} has no UP instance without a version")
    } else {
        format!("service {service:?} has no UP instance with version {version:?} nor without a version")
    };
    if excluded {
        reason.push_str(" that is not excluded");
    }
    reason
}
