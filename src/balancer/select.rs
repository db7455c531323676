//! One selection: gray release and version isolation, exclusion, a ticket, the rule (or a
//! sticky lookup), and the fallback notes the response carries.

use std::borrow::Cow;
use std::sync::Arc;

use tokio::time::Instant;

use super::{Balancer, PickError, PickQuery};
use crate::policy::{IsolationFallback, Policy};
use crate::registry::{Instance, ServiceSnapshot};
use crate::rules::{Draw, Excluded, Fallback, ParsedRule, Rule, Select, StatsView, isolate};
use crate::state::{CounterKey, Load, Stats, StickyKey};

/// The rotation gray-release tickets are drawn from.
const GRAY_RULE: &str = "gray";

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

/// Instance loads, as rules read them, at one moment.
pub struct ServiceLoad<'a> {
    stats: &'a Stats,
    now: Instant,
}

impl<'a> ServiceLoad<'a> {
    pub fn new(stats: &'a Stats) -> Self {
        Self { stats, now: Instant::now() }
    }
}

impl StatsView for ServiceLoad<'_> {
    fn load(&self, instance: &Instance) -> Load {
        let handle = self.stats.cached(&instance.stats, &instance.service, &instance.id);
        self.stats.load_handle(&handle, self.now)
    }
}

impl Balancer {
    /// One selection. A successful one is counted (on its rotation and its instance) and put
    /// in flight here, unless `avoid_tripped` is set and the chosen instance's breaker is open.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn select_once(
        &self,
        snapshot: &ServiceSnapshot,
        rule: &ParsedRule,
        selector: &Rule,
        policy: &Policy,
        query: &PickQuery<'_>,
        exclude: &[String],
        avoid_tripped: bool,
    ) -> Result<Attempt, PickError> {
        let version = self.requested_version(snapshot, policy, query).await?;
        let isolated = isolate(snapshot, &version, policy.isolation_fallback == IsolationFallback::Any);
        let mut fallback = isolated.fallback.map(|kind| isolation_note(kind, &version));
        let candidates = isolated.subset;
        let excluded = excluded_positions(candidates, exclude);
        if candidates.len() == excluded.len() {
            return Err(PickError::Unavailable(unavailable_reason(query.service, &version, !exclude.is_empty())));
        }
        let excluded = Excluded::new(&excluded);
        let rotation = self.state.rotation(
            &candidates.tables.rotations,
            &rule.canonical,
            || CounterKey {
                service: snapshot.name.clone(),
                rule: rule.canonical.clone(),
                subset: candidates.label.clone(),
            },
            || self.counters.ok_counter(&snapshot.name, &rule.canonical),
        );
        let ticket = self.state.draw(&rotation).await?;
        let stats = ServiceLoad::new(&self.stats);
        let draw = Draw { candidates, ticket, key: query.key, zone: query.zone, stats: &stats, excluded };
        let mut rng = fastrand::Rng::new();

        let (instance, sticky) = match selector {
            Rule::Sticky { ttl } => {
                let key = StickyKey {
                    service: snapshot.name.clone(),
                    subset: candidates.label.clone(),
                    key: query.key.into(),
                };
                let remembered = match self.state.sticky_get(&key).await? {
                    // Members are sorted by id; an excluded instance is not kept for this pick.
                    Some(id) => candidates
                        .members
                        .binary_search_by(|i| (*i.id).cmp(&*id))
                        .ok()
                        .filter(|&index| draw.accepts(index))
                        .and_then(|index| candidates.members.get(index)),
                    None => None,
                };
                match remembered.filter(|i| !stats.load(i).tripped) {
                    // Still UP, not drained, not tripped: keep the assignment (refreshed below).
                    Some(instance) => (instance.clone(), Some((key, *ttl))),
                    None => (choose(selector, &draw, &mut rng, &mut fallback, rule)?, Some((key, *ttl))),
                }
            }
            _ => (choose(selector, &draw, &mut rng, &mut fallback, rule)?, None),
        };
        let handle = self.stats.cached(&instance.stats, &instance.service, &instance.id);
        if avoid_tripped && self.stats.load_handle(&handle, stats.now).tripped {
            return Ok(Attempt::Tripped(instance.id.clone()));
        }
        if let Some((key, ttl)) = sticky {
            self.state.sticky_set(key, instance.id.clone(), ttl).await?;
        }
        rotation.tally();
        self.stats.on_pick(&handle, &rule.canonical);
        Ok(Attempt::Picked(Selection { instance, ticket, fallback }))
    }

    /// The request's version, or for a request without one under gray release, the version
    /// the gray schedule assigns to the next gray ticket.
    async fn requested_version<'q>(
        &self,
        snapshot: &ServiceSnapshot,
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

/// Exclusions are kept on the stack for up to 8 excluded candidates: no allocation per retry.
type Positions = smallvec::SmallVec<[usize; 8]>;

/// The positions among `candidates` (sorted by id) of the ids in `exclude`, sorted, without
/// duplicates; ids that are not candidates are ignored. One binary search per id.
fn excluded_positions(candidates: &crate::registry::Subset, exclude: &[String]) -> Positions {
    let mut positions: Positions =
        exclude.iter().filter_map(|id| candidates.members.binary_search_by(|i| (*i.id).cmp(id)).ok()).collect();
    positions.sort_unstable();
    positions.dedup();
    positions
}

/// The rule's choice among the draw's candidates, its fallback note added to `fallback`.
fn choose(
    selector: &Rule,
    draw: &Draw<'_>,
    rng: &mut fastrand::Rng,
    fallback: &mut Option<String>,
    rule: &ParsedRule,
) -> Result<Arc<Instance>, PickError> {
    let choice = selector.select(draw, rng).ok_or_else(|| no_choice(rule, draw.candidates))?;
    let instance =
        draw.candidates.members.get(choice.index).cloned().ok_or_else(|| no_choice(rule, draw.candidates))?;
    add_note(fallback, choice.fallback);
    Ok(instance)
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

fn add_note(fallback: &mut Option<String>, note: Option<&'static str>) {
    if let Some(note) = note {
        match fallback {
            Some(existing) => {
                existing.push_str("; ");
                existing.push_str(note);
            }
            None => *fallback = Some(note.to_owned()),
        }
    }
}

fn no_choice(rule: &ParsedRule, candidates: &crate::registry::Subset) -> PickError {
    let why = match rule.rule {
        Rule::Weighted(_) => "every eligible instance has weight 0",
        _ => "the rule chose none of them",
    };
    PickError::Unavailable(format!("{} eligible instances but {}: {why}", candidates.len(), rule.canonical))
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
