//! Ticket leases: a block of consecutive tickets of one rotation, with the eligible list and the
//! position in it of each ticket's instance, so a consumer routes its calls by indexing.
//!
//! Only rules whose choice is a pure function of (ticket, eligible list) can be leased —
//! `round_robin`, `repeat`, `weighted`. Leased tickets come from the same counter as unary
//! picks, so leased and unary consumers share one exact rotation. Leased picks are not counted
//! in flight: rota never sees them. Instances the fleet has ejected (see
//! [`crate::load::ejection`]) and those the caller names in `exclude` (it cannot reach them)
//! are left out of the eligible list, and the tickets are mapped over the others, which keep
//! the rule's shares among themselves.
//!
//! A lease without a version of a service under gray release cannot be a ticket range: each
//! pick's version comes from the gray schedule. rota then maps the picks itself ([`LeasedPick`]):
//! it draws `count` gray tickets at once, and for each version they name, that many tickets of
//! the version's own rotation, and returns which instance each pick goes to, in gray-ticket
//! order. The split and every rotation stay exact, as for unary picks.

use std::sync::Arc;

use tokio::time::Instant;

use super::builds::ensure;
use super::select::{GRAY_RULE, add_owned_note, excluded_positions, skip_ejected};
use super::view::ServiceView;
use super::{Balancer, PickError, PickQuery, PickResult, check_lease_fields, known_service};
use crate::load::ejection::{self, Positions, Skip};
use crate::policy::{GrayRelease, IsolationFallback, Policy};
use crate::registry::{Instance, InvalidField, Subset};
use crate::rules::{Candidates, Draw, Excluded, Fallback, ParsedRule, isolate, leasable_rules};
use crate::state::CounterKey;

/// One version's picks of a gray lease: (ticket, instance), in ticket order.
type Mapped = Vec<(u64, Arc<Instance>)>;

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
    /// For a ticket range: the index in `instances` of each ticket's instance, ticket
    /// `first_ticket + i` at `positions[i]`.
    pub positions: Vec<u32>,
    /// Set when rota mapped the picks itself (gray release without a version): the i-th pick
    /// goes to `instances[picks[i].position]`; `first_ticket` is then 0.
    pub picks: Vec<LeasedPick>,
}

/// One pick of a lease rota mapped itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeasedPick {
    /// The ticket of the pick's own rotation.
    pub ticket: u64,
    /// Index into [`Leased::instances`].
    pub position: u32,
}

impl Balancer {
    /// Reserves `count` tickets, counted as `count` picks of the service (a refused lease as
    /// one refused pick): the metrics count the calls a lease routes, not the leases.
    pub async fn lease(&self, query: PickQuery<'_>, count: u32) -> Result<Leased, PickError> {
        let mut rule = None;
        let result = self.lease_uncounted(query, count, &mut rule).await;
        let fallback = result.as_ref().is_ok_and(|leased| leased.fallback.is_some());
        let picks = result.as_ref().map_or(1, |leased| u64::from(leased.count));
        let service = self.service_label(query.service);
        self.counters.record_many(service, rule.as_ref(), PickResult::of(&result), fallback, picks);
        result
    }

    async fn lease_uncounted(
        &self,
        query: PickQuery<'_>,
        count: u32,
        resolved_rule: &mut Option<Arc<str>>,
    ) -> Result<Leased, PickError> {
        check_lease_fields(&query, count)?;
        let policies = self.policies.load();
        let policy = policies.for_service(query.service);
        let rule = if query.rule.is_empty() { policy.rule.clone() } else { self.rules.get(query.rule)? };
        *resolved_rule = Some(rule.canonical.clone());
        if !rule.rule.leasable() {
            let problem =
                format!("is {:?}, which cannot be leased; leasable rules: {}", &*rule.canonical, leasable_rules());
            return Err(InvalidField::new("rule", problem).into());
        }
        let views = self.views.load();
        let view = known_service(views.get(query.service), query.service)?;
        if let (Some(gray), true) = (&policy.gray, query.version.is_empty()) {
            return self.lease_gray(view, policy, gray, &rule, count, query.exclude).await;
        }
        let isolated = isolate(&**view, query.version, policy.isolation_fallback == IsolationFallback::Any);
        let members = isolated.subset.candidates.members();
        if members.is_empty() {
            return Err(PickError::Unavailable(format!(
                "service {:?} has no eligible instance for a lease",
                query.service
            )));
        }
        let mut fallback = isolated.fallback.map(|kind| match kind {
            Fallback::Unversioned => {
                format!("no instance with version {:?}; leased instances with no version", query.version)
            }
            Fallback::Any => "no instance in the version nor unversioned; leased any instance".to_owned(),
        });
        // Instances the caller cannot reach (`exclude`) and those the fleet ejected are left
        // out of the list; the tickets are mapped over the rest, so they keep the rule's shares.
        let excluded = excluded_positions(members, query.exclude);
        if excluded.len() == members.len() {
            return Err(PickError::Unavailable(format!(
                "service {:?} has no eligible instance for a lease that is not excluded",
                query.service
            )));
        }
        let dropped = match skip_ejected(view, policy, members, &excluded, Instant::now()) {
            Skip::Ejected(ejected) => ejection::merge(&excluded, &ejected),
            panic => {
                add_owned_note(&mut fallback, panic.note(policy.ejection.max_ejected_percent));
                excluded
            }
        };
        let subset = isolated.subset;
        let counter = CounterKey {
            service: view.snapshot.name.clone(),
            rule: rule.canonical.clone(),
            subset: subset.label().clone(),
        };
        let first_ticket = if count == 0 { 0 } else { self.state.reserve_tickets(&counter, count).await };
        let needs = rule.rule.needs();
        let (instances, positions) = if dropped.is_empty() {
            ensure(view, subset, needs, self.views.stats()).await;
            let candidates = &subset.candidates;
            (candidates.subset.members.clone(), self.positions(candidates, &rule, first_ticket, count)?)
        } else {
            let kept: Vec<Arc<Instance>> = members
                .iter()
                .enumerate()
                .filter(|(position, _)| dropped.binary_search(position).is_err())
                .map(|(_, instance)| instance.clone())
                .collect();
            let candidates = Candidates::new(Subset::new(subset.label().clone(), kept));
            // A weighted schedule over a large list is built off the runtime's threads.
            let candidates = match tokio::task::spawn_blocking(move || {
                candidates.build(needs);
                candidates
            })
            .await
            {
                Ok(candidates) => candidates,
                Err(join) => std::panic::resume_unwind(join.into_panic()),
            };
            let positions = self.positions(&candidates, &rule, first_ticket, count)?;
            (candidates.subset.members.clone(), positions)
        };
        Ok(Leased {
            first_ticket,
            count,
            instances,
            epoch: view.snapshot.epoch,
            rule: rule.canonical.clone(),
            fallback,
            positions,
            picks: Vec::new(),
        })
    }

    /// The position among `candidates` of each ticket `first .. first + count`, as the rule
    /// maps it.
    fn positions(
        &self,
        candidates: &Candidates,
        rule: &ParsedRule,
        first: u64,
        count: u32,
    ) -> Result<Vec<u32>, PickError> {
        let now = Instant::now();
        let mut unused = None;
        (first..first + u64::from(count))
            .map(|ticket| {
                let draw = Draw { candidates, ticket, key: "", zone: "", now, excluded: Excluded::default() };
                Ok(self.choose(&rule.rule, &draw, &mut unused, rule)? as u32)
            })
            .collect()
    }

    /// A version-less lease under gray release: `count` picks mapped here (see the module docs).
    async fn lease_gray(
        &self,
        view: &Arc<ServiceView>,
        policy: &Policy,
        gray: &GrayRelease,
        rule: &ParsedRule,
        count: u32,
        exclude: &[String],
    ) -> Result<Leased, PickError> {
        let name = &view.snapshot.name;
        let gray_counter = CounterKey { service: name.clone(), rule: GRAY_RULE.into(), subset: "".into() };
        let first_gray = if count == 0 { 0 } else { self.state.reserve_tickets(&gray_counter, count).await };
        // The versions in the order the gray tickets name them, with how many picks each gets.
        let mut groups: Vec<(Option<&str>, u32)> = Vec::new();
        let versions: Vec<Option<&str>> = (0..u64::from(count)).map(|i| gray.version_for(first_gray + i)).collect();
        for version in &versions {
            match groups.iter_mut().find(|(v, _)| v == version) {
                Some((_, n)) => *n += 1,
                None => groups.push((*version, 1)),
            }
        }
        let any = policy.isolation_fallback == IsolationFallback::Any;
        let now = Instant::now();
        let mut fallback = None;
        // Per version: the instances its picks go to, in ticket order.
        let mut chosen: Vec<(Option<&str>, Mapped)> = Vec::new();
        for (version, picks) in groups {
            let version_name = version.unwrap_or_default();
            let isolated = isolate(&**view, version_name, any);
            let subset = isolated.subset;
            let candidates = &subset.candidates;
            if candidates.is_empty() {
                return Err(PickError::Unavailable(format!(
                    "service {name:?} has no eligible instance for a lease of version {version_name:?} \
                     (gray release)"
                )));
            }
            if let Some(kind) = isolated.fallback {
                let note = match kind {
                    Fallback::Unversioned => format!(
                        "no instance with version {version_name:?}; its gray share leased instances with no version"
                    ),
                    Fallback::Any => "no instance in a gray version nor unversioned; leased any instance".to_owned(),
                };
                add_owned_note(&mut fallback, Some(note));
            }
            // A version whose every instance the caller excludes keeps its share of the split:
            // its picks name its instances, and the caller passes over them.
            let mut excluded = excluded_positions(candidates.members(), exclude);
            if excluded.len() == candidates.len() {
                excluded.clear();
            }
            let skipped: Positions = match skip_ejected(view, policy, candidates.members(), &excluded, now) {
                Skip::Ejected(ejected) => ejection::merge(&excluded, &ejected),
                panic => {
                    add_owned_note(&mut fallback, panic.note(policy.ejection.max_ejected_percent));
                    excluded
                }
            };
            ensure(view, subset, rule.rule.needs(), self.views.stats()).await;
            let counter =
                CounterKey { service: name.clone(), rule: rule.canonical.clone(), subset: subset.label().clone() };
            let first = self.state.reserve_tickets(&counter, picks).await;
            let mut mapped = Vec::with_capacity(picks as usize);
            for ticket in first..first + u64::from(picks) {
                let draw = Draw { candidates, ticket, key: "", zone: "", now, excluded: Excluded::new(&skipped) };
                let mut note = None;
                let index = self.choose(&rule.rule, &draw, &mut note, rule)?;
                mapped.push((ticket, candidates.members()[index].clone()));
            }
            chosen.push((version, mapped));
        }
        let mut instances: Vec<Arc<Instance>> =
            chosen.iter().flat_map(|(_, mapped)| mapped.iter().map(|(_, i)| i.clone())).collect();
        instances.sort_by(|a, b| a.id.cmp(&b.id));
        instances.dedup_by(|a, b| a.id == b.id);
        let mut next: Vec<_> = chosen.into_iter().map(|(v, mapped)| (v, mapped.into_iter())).collect();
        let mut picks = Vec::with_capacity(count as usize);
        for version in &versions {
            let Some((_, mapped)) = next.iter_mut().find(|(v, _)| v == version) else { continue };
            let Some((ticket, instance)) = mapped.next() else { continue };
            let position = instances.binary_search_by(|i| i.id.cmp(&instance.id)).unwrap_or_default() as u32;
            picks.push(LeasedPick { ticket, position });
        }
        Ok(Leased {
            first_ticket: 0,
            count: picks.len() as u32,
            instances: instances.into(),
            epoch: view.snapshot.epoch,
            rule: rule.canonical.clone(),
            fallback,
            positions: Vec::new(),
            picks,
        })
    }
}
