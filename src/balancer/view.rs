//! Pick views: what a pick reads, built when a snapshot is published.
//!
//! The registry publishes plain data. For each published service the balancer keeps a
//! [`ServiceView`]: per subset (unversioned, each version, all UP) the [`Candidates`] with the
//! tables rules read, the rotations drawn on it, and the statistics handle of each position. A
//! pick does one `ArcSwap` load, one hash lookup, and reads.
//!
//! Views are built by a [`PublishHook`], on the registry task, before the registry acknowledges
//! the changes or makes them its current catalog, so a provider holding its ack, or a listing
//! or watch showing them, means every later pick sees them; only the services a publication
//! changed are rebuilt. A new view starts with the tables of the one it replaces, read through
//! member ids (see [`crate::rules::Built`]): a table built for an earlier view answers for the
//! members still there and skips those that left, through the same acceptance test `exclude`
//! uses. Subsets up to [`INLINE_BUILD`] members get their own tables at once, on the registry
//! task; larger ones from a build queued off the pick path (`balancer::builds`), one per
//! service at a time, on the service views' build pool.
//!
//! No pick waits for a build: the first pick of a rule on a large subset, which finds no table
//! at all, answers without one ([`crate::rules::table_free`]) and queues the build. Views hold
//! no build and no pick for longer than it runs, so a service has its current view, the one a
//! build is running for, and those picks are reading at that moment ([`ServiceView::live`]).
//! The load index is carried like the other tables (see [`crate::rules::LoadTable`]), unless
//! more than [`crate::rules::MAX_DEPARTED`] of its members left at once.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use arc_swap::{ArcSwap, Guard};

use super::builds::{BuildPool, queue_build};
use crate::hash::Map;
use crate::load::{ServiceEjections, Stats, StatsHandle};
use crate::registry::{Catalog, Instance, PublishHook, Registry, ServiceSnapshot, Subset};
use crate::rules::{Candidates, LoadIndex, LoadTable, Needs, Versions};
use crate::state::RotationCache;

/// Subsets up to this many members have their tables rebuilt on the registry task as part of
/// a publication (a few hundred microseconds at most); larger ones on a blocking thread.
pub const INLINE_BUILD: usize = 1000;

/// One subset as picks see it.
#[derive(Debug)]
pub struct SubsetView {
    pub candidates: Candidates,
    /// The rotations drawn on this subset, cached.
    pub rotations: RotationCache,
    /// Each position's statistics handle, filled on first pick.
    stats: Box<[OnceLock<StatsHandle>]>,
    /// Set when the subset this one replaced had a load index, which a carry-over build then
    /// builds for these members (whether or not this one could read the old one meanwhile).
    load_wanted: AtomicBool,
    /// Tables a pick found absent and asked a build for ([`Needs::bits`]); handed on to the
    /// views that replace this one until built.
    requested: AtomicU8,
}

impl SubsetView {
    fn new(subset: Subset) -> Self {
        let stats = (0..subset.len()).map(|_| OnceLock::new()).collect();
        Self {
            candidates: Candidates::new(subset),
            rotations: RotationCache::default(),
            stats,
            load_wanted: AtomicBool::new(false),
            requested: AtomicU8::new(0),
        }
    }

    /// What a carry-over build should build here: the tables taken over from another snapshot,
    /// and the load index the replaced subset had.
    pub(super) fn carry_needs(&self) -> Needs {
        let mut needs = self.candidates.borrowed();
        needs.load |= self.load_wanted.load(Ordering::Relaxed) && self.candidates.tables.load.load().is_none();
        needs.union(self.absent(Needs::from_bits(self.requested.load(Ordering::Relaxed))))
    }

    /// Asks the next build of the service for the tables in `needs`.
    pub(super) fn request(&self, needs: Needs) {
        self.requested.fetch_or(needs.bits(), Ordering::Relaxed);
    }

    pub fn label(&self) -> &Arc<str> {
        &self.candidates.subset.label
    }

    /// The statistics handle of the candidate at `position`.
    pub fn stats_handle(&self, position: usize, stats: &Stats) -> Option<&StatsHandle> {
        let instance = self.candidates.members().get(position)?;
        Some(self.stats.get(position)?.get_or_init(|| stats.handle(&instance.service, &instance.id)))
    }

    /// Builds the tables in `needs` (all of them, whatever is there).
    pub(super) fn build(&self, needs: Needs, stats: &Stats) {
        self.candidates.build(needs);
        if needs.load {
            let index = Arc::new(LoadIndex::new(self.candidates.subset.members.clone()));
            stats.attach(&index);
            self.candidates.tables.load.store(Some(Arc::new(LoadTable::own(index))));
        }
    }

    /// Which of `needs` is absent (a table inherited from an earlier snapshot counts as there).
    pub(super) fn absent(&self, needs: Needs) -> Needs {
        needs.absent_from(&self.candidates.tables)
    }
}

/// One service's pick view.
#[derive(Debug)]
pub struct ServiceView {
    pub snapshot: Arc<ServiceSnapshot>,
    pub unversioned: SubsetView,
    pub versions: Map<Arc<str>, SubsetView>,
    pub up: SubsetView,
    /// The service's ejected instances (shared by its successive views).
    pub ejections: Arc<ServiceEjections>,
    /// What the service's successive views share.
    pub(super) lineage: Arc<Lineage>,
    /// Set when a newer view replaced this one.
    superseded: AtomicBool,
}

/// What the successive views of one service share.
#[derive(Debug)]
pub(super) struct Lineage {
    /// Held while tables of the service are built: one build at a time.
    pub(super) building: tokio::sync::Mutex<()>,
    /// The service's current view; unset once the service is forgotten.
    newest: Mutex<Weak<ServiceView>>,
    /// Set while a build waits to run; publications and picks meanwhile queue no other.
    pub(super) build_queued: AtomicBool,
    /// The pool builds of every service run on.
    pub(super) pool: Arc<BuildPool>,
    /// Views of the service alive now (current, replaced ones still read).
    live: AtomicUsize,
}

impl Lineage {
    fn new(pool: Arc<BuildPool>) -> Self {
        Self {
            building: tokio::sync::Mutex::new(()),
            newest: Mutex::new(Weak::new()),
            build_queued: AtomicBool::new(false),
            pool,
            live: AtomicUsize::new(0),
        }
    }

    pub(super) fn newest(&self) -> Option<Arc<ServiceView>> {
        self.newest.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).upgrade()
    }

    fn set_newest(&self, view: Weak<ServiceView>) {
        *self.newest.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = view;
    }
}

impl Versions for ServiceView {
    type Subset = SubsetView;

    fn unversioned(&self) -> &SubsetView {
        &self.unversioned
    }

    fn version(&self, version: &str) -> Option<&SubsetView> {
        self.versions.get(version)
    }

    fn up(&self) -> &SubsetView {
        &self.up
    }

    fn is_empty(subset: &SubsetView) -> bool {
        subset.candidates.is_empty()
    }
}

impl ServiceView {
    fn new(
        snapshot: Arc<ServiceSnapshot>,
        previous: Option<&ServiceView>,
        stats: &Stats,
        pool: &Arc<BuildPool>,
    ) -> Self {
        let lineage = previous.map_or_else(|| Arc::new(Lineage::new(pool.clone())), |p| p.lineage.clone());
        lineage.live.fetch_add(1, Ordering::Relaxed);
        Self {
            ejections: previous.map_or_else(|| stats.ejections(&snapshot.name), |p| p.ejections.clone()),
            unversioned: SubsetView::new(snapshot.unversioned.clone()),
            versions: snapshot.versions.iter().map(|(v, s)| (v.clone(), SubsetView::new(s.clone()))).collect(),
            up: SubsetView::new(snapshot.up.clone()),
            snapshot,
            lineage,
            superseded: AtomicBool::new(false),
        }
    }

    /// How many views of this service are alive (this one included): the current one, and
    /// replaced ones a build or a pick still reads.
    pub fn live(&self) -> usize {
        self.lineage.live.load(Ordering::Relaxed)
    }

    /// Whether a newer view of the service replaced this one (or the service was forgotten).
    pub fn is_superseded(&self) -> bool {
        self.superseded.load(Ordering::Relaxed)
    }

    pub fn subsets(&self) -> impl Iterator<Item = &SubsetView> {
        std::iter::once(&self.unversioned).chain(self.versions.values()).chain(std::iter::once(&self.up))
    }

    pub(super) fn subset(&self, label: &str) -> Option<&SubsetView> {
        self.subsets().find(|subset| &**subset.label() == label)
    }
}

impl Drop for ServiceView {
    fn drop(&mut self) {
        self.lineage.live.fetch_sub(1, Ordering::Relaxed);
    }
}

type ViewMap =
    imbl::GenericHashMap<Arc<str>, Arc<ServiceView>, foldhash::fast::RandomState, imbl::shared_ptr::DefaultSharedPtr>;

/// Every service's pick view, following the registry's publications.
pub struct Views {
    map: ArcSwap<ViewMap>,
    stats: Arc<Stats>,
    /// Where large subsets' tables are built.
    pool: Arc<BuildPool>,
    /// Serialises updates of `map`.
    write: Mutex<()>,
    /// Encodes an instance as picks answer it, once set ([`Views::encode_answers_with`]).
    encode: std::sync::OnceLock<AnswerEncoder>,
}

/// How the edge that answers picks encodes an instance (the gRPC edge's `Instance` message).
pub type AnswerEncoder = fn(&Instance) -> bytes::Bytes;

impl Views {
    /// Views of `registry`'s services, kept up to date from now on.
    pub fn follow(registry: &Registry, stats: Arc<Stats>) -> Arc<Self> {
        let views = Arc::new(Self {
            map: ArcSwap::from_pointee(ViewMap::with_hasher(foldhash::fast::RandomState::default())),
            stats,
            pool: Arc::new(BuildPool::default()),
            write: Mutex::new(()),
            encode: std::sync::OnceLock::new(),
        });
        let hook: Weak<dyn PublishHook> = Arc::downgrade(&(views.clone() as Arc<dyn PublishHook>));
        registry.add_hook(hook, |catalog| {
            let names: Vec<Arc<str>> = catalog.snapshots().map(|s| s.name.clone()).collect();
            views.update(catalog, &names);
        });
        views
    }

    /// From now on every instance a pick can return is encoded with `encode` when its
    /// publication is taken (the instances of the current views at once), and kept with it
    /// ([`Instance::answer`]): a pick's answer copies those bytes. Set once; a second call is
    /// ignored.
    pub fn encode_answers_with(&self, encode: AnswerEncoder) {
        let _writing = self.write.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if self.encode.set(encode).is_ok() {
            for view in self.map.load().values() {
                encode_pickable(&view.snapshot, encode);
            }
        }
    }

    /// The current views: one atomic load.
    pub fn load(&self) -> Guard<Arc<ViewMap>> {
        self.map.load()
    }

    /// Rebuilds the views of `services` from `catalog`, which the registry publishes once the
    /// views have it.
    fn update(&self, catalog: &Catalog, services: &[Arc<str>]) {
        let _writing = self.write.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut map = (**self.map.load()).clone();
        for name in services {
            let Some(snapshot) = catalog.get(name) else {
                if let Some(gone) = map.remove(name) {
                    gone.superseded.store(true, Ordering::Relaxed);
                    gone.lineage.set_newest(Weak::new());
                }
                continue;
            };
            let previous = map.get(name).cloned();
            if previous.as_ref().is_some_and(|view| Arc::ptr_eq(&view.snapshot, snapshot)) {
                continue;
            }
            if let Some(encode) = self.encode.get() {
                encode_pickable(snapshot, *encode);
            }
            let view = Arc::new(ServiceView::new(snapshot.clone(), previous.as_deref(), &self.stats, &self.pool));
            view.lineage.set_newest(Arc::downgrade(&view));
            if let Some(previous) = previous {
                previous.superseded.store(true, Ordering::Relaxed);
                self.carry_over(&view, &previous);
            }
            map.insert(name.clone(), view);
        }
        self.map.store(Arc::new(map));
    }

    /// Gives `view` the tables `previous` had: rebuilt now for small subsets, else later off
    /// the registry task (one build queued per service) while picks read the previous ones.
    fn carry_over(&self, view: &Arc<ServiceView>, previous: &ServiceView) {
        let mut later = false;
        for subset in view.subsets() {
            let Some(old) = previous.subset(subset.label()) else { continue };
            let requested = old.requested.load(Ordering::Relaxed);
            subset.requested.store(requested, Ordering::Relaxed);
            later |= requested != 0;
            let wanted = subset.candidates.inherit(&old.candidates);
            if !wanted.any() {
                continue;
            }
            if subset.candidates.len() <= INLINE_BUILD || tokio::runtime::Handle::try_current().is_err() {
                subset.build(wanted, &self.stats);
            } else {
                subset.load_wanted.store(wanted.load, Ordering::Relaxed);
                later = true;
            }
        }
        if later {
            queue_build(&view.lineage, &self.stats);
        }
    }

    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// The pool large subsets' tables are built on.
    pub fn build_pool(&self) -> &Arc<BuildPool> {
        &self.pool
    }
}

/// Encodes each UP instance of `snapshot` not encoded yet (an instance unchanged since an
/// earlier publication keeps its bytes).
fn encode_pickable(snapshot: &ServiceSnapshot, encode: AnswerEncoder) {
    for instance in snapshot.instances.iter().filter(|i| i.is_up()) {
        instance.answer.get_or_init(|| encode(instance));
    }
}

impl PublishHook for Views {
    fn published(&self, catalog: &Catalog, services: &[Arc<str>]) {
        self.update(catalog, services);
    }
}

#[cfg(test)]
#[path = "view_tests.rs"]
mod tests;
