//! Immutable views of the registry that picks read without locks.
//!
//! The registry task builds one [`ServiceSnapshot`] per service whenever that service changes
//! and publishes all of them together as a [`Catalog`] behind an `ArcSwap`. Everything a pick
//! needs is precomputed here, once per change rather than once per pick: the instances sorted by
//! id (so every replica and every run agrees on positions) and the UP instances grouped by
//! version for version isolation.

use std::collections::HashMap;

use crate::hash::Map;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use super::instance::Instance;

/// Every service the registry knows, by name.
///
/// A persistent (structurally shared) map: publishing a change of one service copies a few
/// small nodes, not the whole map, so publication costs the same with 10 services or 100,000.
#[derive(Debug, Clone)]
pub struct Catalog {
    services: imbl::GenericHashMap<
        Arc<str>,
        Arc<ServiceSnapshot>,
        foldhash::fast::RandomState,
        imbl::shared_ptr::DefaultSharedPtr,
    >,
}

impl Default for Catalog {
    fn default() -> Self {
        Self { services: imbl::GenericHashMap::with_hasher(foldhash::fast::RandomState::default()) }
    }
}

impl Catalog {
    pub fn get(&self, service: &str) -> Option<&Arc<ServiceSnapshot>> {
        self.services.get(service)
    }

    /// Every service's snapshot, in no particular order.
    pub fn snapshots(&self) -> impl Iterator<Item = &Arc<ServiceSnapshot>> {
        self.services.values()
    }

    pub fn len(&self) -> usize {
        self.services.len()
    }

    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }

    pub(crate) fn insert(&mut self, snapshot: Arc<ServiceSnapshot>) {
        self.services.insert(snapshot.name.clone(), snapshot);
    }

    pub(crate) fn remove(&mut self, service: &str) {
        self.services.remove(service);
    }
}

/// An ordered list of eligible instances with a stable label. Rule state (rotation counters) is
/// keyed by the label, not by the members, so a rotation survives instances coming and going.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subset {
    pub label: Arc<str>,
    pub members: Arc<[Arc<Instance>]>,
}

impl Subset {
    pub fn new(label: impl Into<Arc<str>>, members: Vec<Arc<Instance>>) -> Self {
        Self { label: label.into(), members: members.into() }
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }
}

/// Label of the subset of UP instances that have no version.
pub const UNVERSIONED_LABEL: &str = "version=";
/// Label of the subset of all UP instances.
pub const ANY_LABEL: &str = "any";

/// One service's instances at one moment.
#[derive(Debug, Clone)]
pub struct ServiceSnapshot {
    pub name: Arc<str>,
    /// Increases with every published change of this service.
    pub epoch: u64,
    /// All registered instances, whatever their status, sorted by id.
    pub instances: Vec<Arc<Instance>>,
    /// UP instances with no version, sorted by id.
    pub unversioned: Subset,
    /// UP instances per non-empty version, each sorted by id.
    pub versions: Map<Arc<str>, Subset>,
    /// Every UP instance, whatever its version (for the "any instance" isolation fallback).
    pub up: Subset,
    /// [`ServiceSnapshot::arrivals_settled`], worked out on first demand (only the start-up
    /// warm-up asks), with the quiet period it was worked out for.
    settled: OnceLock<(Duration, Option<tokio::time::Instant>)>,
    /// [`ServiceSnapshot::listing_bytes`], measured on first demand.
    listing_bytes: OnceLock<usize>,
    /// The snapshot as the gRPC edge sends it to a new watch, encoded by the first watch of
    /// this epoch and shared by every other (the registry neither reads nor writes it).
    pub watch_answer: super::instance::Encoded,
}

impl ServiceSnapshot {
    /// Builds a snapshot; `instances` may come in any order.
    pub fn build(name: Arc<str>, epoch: u64, mut instances: Vec<Arc<Instance>>) -> Self {
        instances.sort_by(|a, b| a.id.cmp(&b.id));
        let up: Vec<Arc<Instance>> = instances.iter().filter(|i| i.is_up()).cloned().collect();
        let mut unversioned = Vec::new();
        let mut by_version: HashMap<Arc<str>, Vec<Arc<Instance>>> = HashMap::new();
        for instance in instances.iter().filter(|i| i.is_up()) {
            if instance.version.is_empty() {
                unversioned.push(instance.clone());
            } else {
                by_version.entry(instance.version.clone()).or_default().push(instance.clone());
            }
        }
        let versions = by_version
            .into_iter()
            .map(|(version, members)| {
                let label = format!("version={version}");
                (version, Subset::new(label, members))
            })
            .collect();
        Self {
            name,
            epoch,
            instances,
            unversioned: Subset::new(UNVERSIONED_LABEL, unversioned),
            versions,
            up: Subset::new(ANY_LABEL, up),
            settled: OnceLock::new(),
            listing_bytes: OnceLock::new(),
            watch_answer: Default::default(),
        }
    }

    /// The size of [`ServiceSnapshot::instances`] as a listing, measured by `measure` for the
    /// first caller and kept with the snapshot, so that a listing asked for by many clients is
    /// sized once per published change (the gRPC edge reserves room for answers by it).
    pub fn listing_bytes_with(&self, measure: impl FnOnce(&[Arc<Instance>]) -> usize) -> usize {
        *self.listing_bytes.get_or_init(|| measure(&self.instances))
    }

    /// When the instances that opened this service first paused coming up: the earliest moment
    /// at which `quiet` had passed since one instance became UP with no other becoming UP in
    /// between, counted over the instances UP now. `None` when none is UP. The start-up warm-up
    /// holds a service back until then, so that the first provider back after a restart does not
    /// take every pick while the others are still reconnecting.
    pub fn arrivals_settled(&self, quiet: Duration) -> Option<tokio::time::Instant> {
        let (for_quiet, settled) = *self.settled.get_or_init(|| (quiet, first_pause(&self.up.members, quiet)));
        if for_quiet == quiet { settled } else { first_pause(&self.up.members, quiet) }
    }

    /// Until when a warm-up ending at `ends` holds this service back for its arrivals to pause
    /// for `quiet` ([`ServiceSnapshot::arrivals_settled`]); `None` when it does not now.
    pub fn settling_until(&self, quiet: Duration, ends: tokio::time::Instant) -> Option<tokio::time::Instant> {
        if quiet.is_zero() {
            return None;
        }
        let until = self.arrivals_settled(quiet)?.min(ends);
        (tokio::time::Instant::now() < until).then_some(until)
    }

    pub fn up_count(&self) -> usize {
        self.up.len()
    }

    /// Every subset of the snapshot: unversioned, each version, and all UP instances.
    pub fn subsets(&self) -> impl Iterator<Item = &Subset> {
        std::iter::once(&self.unversioned).chain(self.versions.values()).chain(std::iter::once(&self.up))
    }

    /// The subset labelled `label`.
    pub fn subset(&self, label: &str) -> Option<&Subset> {
        self.subsets().find(|subset| &*subset.label == label)
    }

    /// The registered instance with this id (binary search: instances are sorted by id).
    pub fn instance(&self, id: &str) -> Option<&Arc<Instance>> {
        self.instances.binary_search_by(|i| (*i.id).cmp(id)).ok().map(|at| &self.instances[at])
    }
}

/// The end of the first gap of at least `quiet` after an `up_since` of `instances`, or after
/// the last of them.
fn first_pause(instances: &[Arc<Instance>], quiet: Duration) -> Option<tokio::time::Instant> {
    let mut arrivals: Vec<tokio::time::Instant> = instances.iter().filter_map(|i| i.up_since).collect();
    arrivals.sort_unstable();
    let gap = arrivals.windows(2).find(|pair| pair[1] >= pair[0] + quiet).map(|pair| pair[0]);
    gap.or(arrivals.last().copied()).map(|at| at + quiet)
}

/// One difference between two snapshots of a service, in the vocabulary of service discovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Added(Arc<Instance>),
    /// The same id with other fields: what it was, and what it is.
    Updated {
        old: Arc<Instance>,
        new: Arc<Instance>,
    },
    Removed(Arc<Instance>),
}

/// The changes that turn `old` into `new`, in id order. Both lists must be sorted by id, as
/// [`ServiceSnapshot::instances`] is.
pub fn diff(old: &[Arc<Instance>], new: &[Arc<Instance>]) -> Vec<Change> {
    let mut changes = Vec::new();
    let (mut o, mut n) = (old.iter().peekable(), new.iter().peekable());
    loop {
        match (o.peek(), n.peek()) {
            (None, None) => break,
            (Some(a), None) => {
                changes.push(Change::Removed((*a).clone()));
                o.next();
            }
            (None, Some(b)) => {
                changes.push(Change::Added((*b).clone()));
                n.next();
            }
            (Some(a), Some(b)) => match a.id.cmp(&b.id) {
                std::cmp::Ordering::Less => {
                    changes.push(Change::Removed((*a).clone()));
                    o.next();
                }
                std::cmp::Ordering::Greater => {
                    changes.push(Change::Added((*b).clone()));
                    n.next();
                }
                std::cmp::Ordering::Equal => {
                    if !Arc::ptr_eq(a, b) && a != b {
                        changes.push(Change::Updated { old: (*a).clone(), new: (*b).clone() });
                    }
                    o.next();
                    n.next();
                }
            },
        }
    }
    changes
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::registry::instance::{InstanceSpec, RequestedStatus, Status};

    pub(crate) fn instance(id: &str, version: &str, status: Status) -> Arc<Instance> {
        let spec = InstanceSpec {
            id: id.into(),
            service: "svc".into(),
            host: "127.0.0.1".into(),
            port: 1000,
            version: version.into(),
            status: RequestedStatus::Known(status),
            ..Default::default()
        };
        Arc::new(spec.validate("test").unwrap())
    }

    fn ids(subset: &Subset) -> Vec<&str> {
        subset.members.iter().map(|i| &*i.id).collect()
    }

    #[test]
    fn build_sorts_by_id_and_groups_up_instances_by_version() {
        let snapshot = ServiceSnapshot::build(
            "svc".into(),
            1,
            vec![
                instance("c", "", Status::Up),
                instance("a", "", Status::Up),
                instance("d", "zlt", Status::Up),
                instance("b", "", Status::Draining),
                instance("e", "zlt", Status::Down),
            ],
        );
        let all: Vec<&str> = snapshot.instances.iter().map(|i| &*i.id).collect();
        assert_eq!(all, ["a", "b", "c", "d", "e"]);
        assert_eq!(ids(&snapshot.unversioned), ["a", "c"]);
        assert_eq!(ids(&snapshot.versions["zlt"]), ["d"]);
        assert_eq!(&*snapshot.versions["zlt"].label, "version=zlt");
        assert_eq!(snapshot.up_count(), 3);
    }

    #[test]
    fn diff_reports_adds_updates_and_removes() {
        let old = vec![instance("a", "", Status::Up), instance("b", "", Status::Up), instance("c", "", Status::Up)];
        let new =
            vec![instance("b", "", Status::Draining), instance("c", "", Status::Up), instance("d", "", Status::Up)];
        let changes = diff(&old, &new);
        assert_eq!(
            changes,
            vec![
                Change::Removed(old[0].clone()),
                Change::Updated { old: old[1].clone(), new: new[0].clone() },
                Change::Added(new[2].clone()),
            ]
        );
        assert!(diff(&new, &new).is_empty());
    }
}
