//! What a source answered, and what mirroring it changes in rota's table.
//!
//! [`plan`] is the whole decision, kept free of I/O: given what rota holds of a source and the
//! source's new listing, which instances to announce (new or changed), which to withdraw, and
//! which removals to hold back because they would empty too much of a service at once.

use std::collections::{BTreeMap, HashMap};

use tokio::time::Instant;

use super::SourceSpec;
use crate::registry::InstanceRecord;

/// A source's answer, whole.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Listing {
    /// By service, the instances listed; each id as the source names it.
    pub services: BTreeMap<String, Vec<InstanceRecord>>,
    /// The entries that could not be read at all (a missing port, a status that is not a
    /// string), described for the log. The rest of the listing stands.
    pub malformed: Vec<String>,
    /// Instances the source itself left out for want of room (past `max_instances`, or past
    /// what the source may hold of them), counted like the ones [`plan`] leaves out.
    pub over_limit: usize,
}

/// Per service, per rota id (`NAME:ID`), the instances rota holds of one source.
pub type Held = BTreeMap<String, BTreeMap<String, InstanceRecord>>;

/// What to change in rota's table for one listing.
#[derive(Debug, Default, PartialEq)]
pub struct Plan {
    /// Instances to announce (new, or changed since they were held), ids namespaced.
    pub announce: Vec<(String, InstanceRecord)>,
    /// Instances to withdraw: (service, rota id).
    pub withdraw: Vec<(String, String)>,
    /// Services whose removals are held back: (service, instances it would remove, of how many).
    pub held_back: Vec<(String, usize, usize)>,
    /// Services whose held-back removals are now applied, their time being up.
    pub released: Vec<String>,
    /// Instances left out because the source listed more than `max_instances`.
    pub over_limit: usize,
    /// Instances the listing has, in the services the source covers (after the limit).
    pub listed: usize,
}

/// One service's removals, held back.
#[derive(Debug, Clone, PartialEq)]
pub struct Hold {
    /// Since when: the removal is applied at `since + protect_for`, whether or not the source
    /// says anything more by then.
    pub since: Instant,
    /// The instances (rota ids) the source's latest listing removes.
    pub gone: Vec<String>,
}

/// By service, the removals held back.
pub type Holding = HashMap<String, Hold>;

/// Decides what `listing` changes, given what is `held`; `refused` are the records rota
/// refused before (announced again only once they change); `holding` is updated.
pub fn plan(
    spec: &SourceSpec,
    held: &Held,
    refused: &HashMap<(String, String), InstanceRecord>,
    listing: Listing,
    holding: &mut Holding,
    now: Instant,
) -> Plan {
    let mut plan = Plan::default();
    let mut wanted: BTreeMap<String, BTreeMap<String, InstanceRecord>> = BTreeMap::new();
    let mut room = spec.max_instances;
    for (service, instances) in listing.services {
        if !spec.covers(&service) {
            continue;
        }
        let entry = wanted.entry(service).or_default();
        for mut instance in instances {
            instance.id = format!("{}:{}", spec.name, instance.id);
            if entry.contains_key(&instance.id) {
                continue;
            }
            if room == 0 {
                plan.over_limit += 1;
                continue;
            }
            room -= 1;
            entry.insert(instance.id.clone(), instance);
        }
    }
    plan.listed = spec.max_instances - room;
    let empty = BTreeMap::new();
    let services: std::collections::BTreeSet<&String> = wanted.keys().chain(held.keys()).collect();
    for service in services {
        let now_held = held.get(service).unwrap_or(&empty);
        let desired = wanted.get(service).unwrap_or(&empty);
        for (id, instance) in desired {
            let unchanged = now_held.get(id) == Some(instance);
            let refused_before = refused.get(&(service.clone(), id.clone())) == Some(instance);
            if !unchanged && !refused_before {
                plan.announce.push((service.clone(), instance.clone()));
            }
        }
        let gone: Vec<&String> = now_held.keys().filter(|id| !desired.contains_key(*id)).collect();
        let too_many = !gone.is_empty() && gone.len() as f64 > spec.protect_threshold * now_held.len() as f64;
        if too_many {
            let hold = holding.entry(service.clone()).or_insert_with(|| Hold { since: now, gone: Vec::new() });
            if now.duration_since(hold.since) < spec.protect_for {
                hold.gone = gone.iter().map(|id| (*id).clone()).collect();
                plan.held_back.push((service.clone(), gone.len(), now_held.len()));
                continue;
            }
            plan.released.push(service.clone());
        }
        holding.remove(service);
        plan.withdraw.extend(gone.into_iter().map(|id| (service.clone(), id.clone())));
    }
    plan
}

/// When the earliest held-back removal is due, if any is held back.
pub fn next_release(spec: &SourceSpec, holding: &Holding) -> Option<Instant> {
    holding.values().map(|hold| hold.since + spec.protect_for).min()
}

/// Applies the held-back removals whose `protect_for` is up at `now`, as the source's latest
/// listing asked for them (the instances it still lists were updated when it came): the same
/// as [`plan`] would decide for that listing again, without the source having to say it.
pub fn release(spec: &SourceSpec, held: &Held, holding: &mut Holding, now: Instant) -> Plan {
    let mut plan = Plan::default();
    let mut due: Vec<String> = holding
        .iter()
        .filter(|(_, hold)| now.duration_since(hold.since) >= spec.protect_for)
        .map(|(service, _)| service.clone())
        .collect();
    due.sort();
    for service in due {
        let Some(hold) = holding.remove(&service) else { continue };
        let now_held = held.get(&service);
        plan.withdraw.extend(
            hold.gone
                .into_iter()
                .filter(|id| now_held.is_some_and(|instances| instances.contains_key(id)))
                .map(|id| (service.clone(), id)),
        );
        plan.released.push(service);
    }
    let mut still: Vec<(String, usize, usize)> = holding
        .iter()
        .map(|(service, hold)| (service.clone(), hold.gone.len(), held.get(service).map_or(0, BTreeMap::len)))
        .collect();
    still.sort();
    plan.held_back = still;
    plan
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::sources::spec::SourceTable;

    fn spec() -> SourceSpec {
        SourceTable { url: "eureka+http://127.0.0.1:1/eureka".into(), ..Default::default() }.check().unwrap()
    }

    fn record(id: &str) -> InstanceRecord {
        InstanceRecord {
            id: id.into(),
            host: "127.0.0.1".into(),
            port: 8080,
            weight: 100,
            status: "UP".into(),
            ..Default::default()
        }
    }

    fn listing(service: &str, ids: &[&str]) -> Listing {
        Listing {
            services: [(service.to_owned(), ids.iter().map(|id| record(id)).collect())].into(),
            ..Default::default()
        }
    }

    /// What rota holds after applying `plan` to `held` (everything announced accepted).
    fn applied(mut held: Held, plan: &Plan) -> Held {
        for (service, id) in &plan.withdraw {
            held.get_mut(service).unwrap().remove(id);
        }
        for (service, instance) in &plan.announce {
            held.entry(service.clone()).or_default().insert(instance.id.clone(), instance.clone());
        }
        held.retain(|_, instances| !instances.is_empty());
        held
    }

    #[test]
    fn ids_are_namespaced_and_only_changes_are_announced() {
        let (spec, now) = (spec(), Instant::now());
        let mut holding = Holding::new();
        let first = plan(&spec, &Held::new(), &HashMap::new(), listing("orders", &["a", "b"]), &mut holding, now);
        let ids: Vec<&str> = first.announce.iter().map(|(_, i)| i.id.as_str()).collect();
        assert_eq!(ids, ["eureka:a", "eureka:b"]);
        let held = applied(Held::new(), &first);
        let mut changed = listing("orders", &["a", "b"]);
        changed.services.get_mut("orders").unwrap()[1].status = "DOWN".into();
        let second = plan(&spec, &held, &HashMap::new(), changed, &mut holding, now);
        assert_eq!(second.announce.len(), 1);
        assert_eq!((second.announce[0].1.id.as_str(), second.announce[0].1.status.as_str()), ("eureka:b", "DOWN"));
        assert!(second.withdraw.is_empty());
    }

    #[test]
    fn a_removal_of_more_than_the_threshold_waits_protect_for_then_applies() {
        let (spec, t0) = (spec(), Instant::now());
        let mut holding = Holding::new();
        let held = applied(
            Held::new(),
            &plan(&spec, &Held::new(), &HashMap::new(), listing("orders", &["a", "b", "c", "d"]), &mut holding, t0),
        );
        // Two of four is not more than half: applied at once.
        let half = plan(&spec, &held, &HashMap::new(), listing("orders", &["a", "b"]), &mut holding, t0);
        assert_eq!(half.withdraw.len(), 2);
        assert!(half.held_back.is_empty());
        // Three of four is: held back, the instances stay.
        let most = plan(&spec, &held, &HashMap::new(), listing("orders", &["a"]), &mut holding, t0);
        assert!(most.withdraw.is_empty());
        assert_eq!(most.held_back, [("orders".to_owned(), 3, 4)]);
        // An empty answer (a registry restarted empty) is held back the same way.
        let later = t0 + spec.protect_for - Duration::from_millis(1);
        let empty = plan(&spec, &held, &HashMap::new(), Listing::default(), &mut holding, later);
        assert_eq!((empty.withdraw.len(), empty.held_back.len()), (0, 1));
        // Once protect_for has passed with the removal still asked for, it is applied.
        let due = plan(&spec, &held, &HashMap::new(), Listing::default(), &mut holding, t0 + spec.protect_for);
        assert_eq!(due.withdraw.len(), 4);
        assert_eq!(due.released, ["orders"]);
        assert!(holding.is_empty());
    }

    #[test]
    fn a_held_back_removal_is_released_at_protect_for_without_another_listing() {
        let (spec, t0) = (spec(), Instant::now());
        let mut holding = Holding::new();
        let mut source = listing("orders", &["a", "b", "c"]);
        source.services.insert("users".into(), vec![record("u1"), record("u2")]);
        let held = applied(Held::new(), &plan(&spec, &Held::new(), &HashMap::new(), source, &mut holding, t0));
        assert_eq!(next_release(&spec, &holding), None);
        // orders loses two of three at t0, users both of two a second later: both held back.
        let mut orders_gone = listing("orders", &["a"]);
        orders_gone.services.insert("users".into(), vec![record("u1"), record("u2")]);
        let first = plan(&spec, &held, &HashMap::new(), orders_gone, &mut holding, t0);
        assert_eq!(first.held_back, [("orders".to_owned(), 2, 3)]);
        let later = t0 + Duration::from_secs(1);
        let mut orders_only = listing("orders", &["a"]);
        orders_only.services.insert("users".into(), vec![]);
        plan(&spec, &held, &HashMap::new(), orders_only, &mut holding, later);
        assert_eq!(next_release(&spec, &holding), Some(t0 + spec.protect_for));
        // Not yet due: nothing is released.
        let early = release(&spec, &held, &mut holding, t0 + spec.protect_for - Duration::from_millis(1));
        assert!(early.withdraw.is_empty() && early.released.is_empty());
        assert_eq!(early.held_back.len(), 2);
        // Due: orders' removal, as the latest listing asked; users still waits its own time.
        let due = release(&spec, &held, &mut holding, t0 + spec.protect_for);
        assert_eq!(
            due.withdraw,
            [("orders".to_owned(), "eureka:b".to_owned()), ("orders".to_owned(), "eureka:c".to_owned())]
        );
        assert_eq!(due.released, ["orders"]);
        assert_eq!(due.held_back, [("users".to_owned(), 2, 2)]);
        let held = applied(held, &due);
        assert_eq!(next_release(&spec, &holding), Some(later + spec.protect_for));
        let users = release(&spec, &held, &mut holding, later + spec.protect_for);
        assert_eq!((users.withdraw.len(), users.released.as_slice()), (2, ["users".to_owned()].as_slice()));
        assert!(holding.is_empty() && users.held_back.is_empty());
        assert_eq!(next_release(&spec, &holding), None);
    }

    #[test]
    fn a_listing_back_under_the_threshold_ends_the_hold() {
        let (spec, t0) = (spec(), Instant::now());
        let mut holding = Holding::new();
        let held = applied(
            Held::new(),
            &plan(&spec, &Held::new(), &HashMap::new(), listing("orders", &["a", "b", "c"]), &mut holding, t0),
        );
        plan(&spec, &held, &HashMap::new(), Listing::default(), &mut holding, t0);
        assert!(holding.contains_key("orders"));
        let back = plan(&spec, &held, &HashMap::new(), listing("orders", &["a", "b", "c"]), &mut holding, t0);
        assert!(back.held_back.is_empty() && back.withdraw.is_empty() && back.announce.is_empty());
        assert!(holding.is_empty(), "the next large removal waits its full time again");
    }

    #[test]
    fn the_instance_limit_and_the_services_filter_apply_before_anything_else() {
        let mut spec = spec();
        spec.max_instances = 3;
        spec.services = Some(["orders".to_owned(), "users".to_owned()].into());
        let mut source = listing("orders", &["a", "b"]);
        source.services.insert("users".into(), vec![record("c"), record("d")]);
        source.services.insert("other".into(), vec![record("e")]);
        let plan = plan(&spec, &Held::new(), &HashMap::new(), source, &mut Holding::new(), Instant::now());
        let ids: Vec<&str> = plan.announce.iter().map(|(_, i)| i.id.as_str()).collect();
        assert_eq!(ids, ["eureka:a", "eureka:b", "eureka:c"]);
        assert_eq!((plan.over_limit, plan.listed), (1, 3));
    }

    #[test]
    fn a_refused_record_is_announced_again_only_once_it_changes() {
        let (spec, now) = (spec(), Instant::now());
        let bad = InstanceRecord { port: 0, ..record("eureka:a") };
        let refused = [(("orders".to_owned(), "eureka:a".to_owned()), bad.clone())].into();
        let same = Listing {
            services: [("orders".to_owned(), vec![InstanceRecord { port: 0, ..record("a") }])].into(),
            ..Default::default()
        };
        assert!(plan(&spec, &Held::new(), &refused, same, &mut Holding::new(), now).announce.is_empty());
        let fixed = plan(&spec, &Held::new(), &refused, listing("orders", &["a"]), &mut Holding::new(), now);
        assert_eq!(fixed.announce.len(), 1);
    }
}
