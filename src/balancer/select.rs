//! One selection: gray release and version isolation, exclusion and ejection, a ticket, the
//! rule (or, for `sticky`, the remembered assignment: [`super::sticky`]), and the fallback notes
//! the response carries. `retry` runs selections in a loop ([`super::retry`]).

use std::borrow::Cow;
use std::sync::Arc;

use tokio::time::Instant;

use super::builds::prepare;
use super::view::{ServiceView, SubsetView};
use super::{Balancer, PickError, PickQuery};
use crate::load::ejection::{self, Positions, Skip};
use crate::policy::{IsolationFallback, Policy};
use crate::registry::Instance;
use crate::rules::{Draw, Excluded, Fallback, ParsedRule, Rule, Select, isolate, table_free};
use crate::state::CounterKey;

/// The rotation gray-release tickets are drawn from.
pub(super) const GRAY_RULE: &str = "gray";

/// What one selection is asked to do: the pick's view, rule and policy, the rule that selects
/// (the pick's own, or `retry`'s inner rule), what to leave out, and whether an instance whose
/// breaker is open is taken or reported back (`retry` asks for the latter).
pub(super) struct Selection<'a> {
    pub view: &'a Arc<ServiceView>,
    pub rule: &'a ParsedRule,
    pub selector: &'a Rule,
    pub policy: &'a Policy,
    pub query: &'a PickQuery<'a>,
    /// Ids not to return: the request's `exclude`, and for `retry` the tripped ones skipped.
    pub exclude: &'a [String],
    pub avoid_tripped: bool,
}

/// A successful selection.
pub(super) struct Selected {
    pub instance: Arc<Instance>,
    pub ticket: u64,
    pub fallback: Option<String>,
}

/// What one selection came to.
pub(super) enum Attempt {
    /// Picked, counted and in flight.
    Picked(Selected),
    /// The rule chose an instance whose breaker is open, and the selection asked for none such
    /// (`retry`); nothing was counted.
    Tripped(Arc<str>),
}

impl Balancer {
    /// One selection. A successful one is counted (on its rotation and its instance) and put
    /// in flight here, unless `avoid_tripped` is set and the chosen instance's breaker is open.
    pub(super) async fn select_once(&self, selection: &Selection<'_>) -> Result<Attempt, PickError> {
        let Selection { view, rule, selector, policy, query, exclude, avoid_tripped } = *selection;
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
        // Never waits: tables still missing are queued, and the rule answers without them.
        prepare(view, subset, rule.rule.needs(), self.views.stats());
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
        let ticket = self.state.draw(&rotation).await;
        let draw = Draw { candidates, ticket, key: query.key, zone: query.zone, now, excluded };

        let (index, refresh) = match selector {
            Rule::Sticky(sticky) => self.stick(selection, subset, &draw, sticky.ttl, &mut fallback).await?,
            _ => (self.choose(selector, &draw, &mut fallback, rule)?, None),
        };
        let instance = candidates.members()[index].clone();
        let handle = subset.stats_handle(index, &self.stats).ok_or_else(|| no_choice(rule, candidates.len()))?;
        if avoid_tripped && self.stats.load_handle(handle, draw.now).tripped {
            return Ok(Attempt::Tripped(instance.id.clone()));
        }
        if let Some(refresh) = refresh {
            self.state.sticky_set(refresh.key, instance.id.clone(), refresh.ttl).await;
        }
        rotation.tally();
        self.stats.on_pick(handle, &rule.canonical);
        Ok(Attempt::Picked(Selected { instance, ticket, fallback }))
    }

    /// The rule's choice among the draw's candidates (a position), its fallback note added to
    /// `fallback`; randomness from this worker's generator (or the balancer's seeded one). A
    /// rule whose tables are not built yet chooses without them ([`table_free`]).
    pub(super) fn choose(
        &self,
        selector: &Rule,
        draw: &Draw<'_>,
        fallback: &mut Option<String>,
        rule: &ParsedRule,
    ) -> Result<usize, PickError> {
        let count = draw.candidates.len();
        let choice = self
            .randomness
            .with(|rng| selector.select(draw, rng).or_else(|| table_free::select(selector.needs(), draw, rng)));
        let choice = choice.filter(|c| c.index < count).ok_or_else(|| no_choice(rule, count))?;
        add_note(fallback, choice.fallback);
        Ok(choice.index)
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
                let ticket = self.state.next_ticket(&counter).await;
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
pub(super) fn excluded_positions(members: &[Arc<Instance>], exclude: &[String]) -> Positions {
    let mut positions: Positions =
        exclude.iter().filter_map(|id| members.binary_search_by(|i| (*i.id).cmp(id)).ok()).collect();
    positions.sort_unstable();
    positions.dedup();
    positions
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

pub(super) fn no_choice(rule: &ParsedRule, candidates: usize) -> PickError {
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
