//! Pick views: what a pick reads, built when a snapshot is published.
//!
//! The registry publishes plain data. For each published service the balancer keeps a
//! [`ServiceView`]: per subset (unversioned, each version, all UP) the [`Candidates`] with the
//! tables rules read, the rotations drawn on it, and the statistics handle of each position. A
//! pick does one `ArcSwap` load, one hash lookup, and reads.
//!
//! Views are built by a [`PublishHook`], on the registry task, before the registry acknowledges
//! the changes, so a provider holding its ack knows every later pick sees them; only the
//! services a publication changed are rebuilt. A subset's tables are built when a rule first
//! needs them (that pick waits for the build, which runs on a blocking thread) and from then on
//! at every publication: inline for subsets up to [`INLINE_BUILD`] members, on a blocking
//! thread beyond, while picks go on with the previous snapshot's tables read through member
//! ids (see [`crate::rules::Built`]). Acknowledgements and other services' publications never
//! wait for such a build. One build runs at a time per service; a build queued for a view that
//! a newer publication has replaced is dropped, so a service that changes faster than its
//! tables build costs one build at a time, not a growing queue.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use arc_swap::{ArcSwap, Guard};

use crate::hash::Map;
use crate::registry::{Catalog, PublishHook, Registry, ServiceSnapshot, Subset};
use crate::rules::{Candidates, LoadIndex, Needs, Versions};
use crate::state::{RotationCache, ServiceEjections, Stats, StatsHandle};

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
}

impl SubsetView {
    fn new(subset: Subset) -> Self {
        let stats = (0..subset.len()).map(|_| OnceLock::new()).collect();
        Self { candidates: Candidates::new(subset), rotations: RotationCache::default(), stats }
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
    fn build(&self, needs: Needs, stats: &Stats) {
        self.candidates.build(needs);
        if needs.load {
            let members = self.candidates.members();
            let index = Arc::new(LoadIndex::new(members));
            stats.attach(&index, members);
            self.candidates.tables.load.store(Some(index));
        }
    }

    /// Which of `needs` is absent (a table inherited from an earlier snapshot counts as there).
    fn absent(&self, needs: Needs) -> Needs {
        let tables = &self.candidates.tables;
        Needs {
            schedule: needs.schedule && tables.schedule.load().is_none(),
            maglev: needs.maglev && tables.maglev.load().is_none(),
            load: needs.load && tables.load.load().is_none(),
        }
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
    /// Held while tables of this service are built; shared by the service's successive views.
    building: Arc<tokio::sync::Mutex<()>>,
    /// Set when a newer view replaced this one.
    superseded: AtomicBool,
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
    fn new(snapshot: Arc<ServiceSnapshot>, previous: Option<&ServiceView>, stats: &Stats) -> Self {
        Self {
            ejections: previous.map_or_else(|| stats.ejections(&snapshot.name), |p| p.ejections.clone()),
            unversioned: SubsetView::new(snapshot.unversioned.clone()),
            versions: snapshot.versions.iter().map(|(v, s)| (v.clone(), SubsetView::new(s.clone()))).collect(),
            up: SubsetView::new(snapshot.up.clone()),
            snapshot,
            building: previous.map(|p| p.building.clone()).unwrap_or_default(),
            superseded: AtomicBool::new(false),
        }
    }

    /// Whether a newer view of the service replaced this one (or the service was forgotten).
    pub fn is_superseded(&self) -> bool {
        self.superseded.load(Ordering::Relaxed)
    }

    pub fn subsets(&self) -> impl Iterator<Item = &SubsetView> {
        std::iter::once(&self.unversioned).chain(self.versions.values()).chain(std::iter::once(&self.up))
    }

    fn subset(&self, label: &str) -> Option<&SubsetView> {
        self.subsets().find(|subset| &**subset.label() == label)
    }
}

type ViewMap =
    imbl::GenericHashMap<Arc<str>, Arc<ServiceView>, foldhash::fast::RandomState, imbl::shared_ptr::DefaultSharedPtr>;

/// Every service's pick view, following the registry's publications.
pub struct Views {
    map: ArcSwap<ViewMap>,
    registry: Registry,
    stats: Arc<Stats>,
    /// Serialises updates of `map`.
    write: Mutex<()>,
}

impl Views {
    /// Views of `registry`'s services, kept up to date from now on.
    pub fn follow(registry: &Registry, stats: Arc<Stats>) -> Arc<Self> {
        let views = Arc::new(Self {
            map: ArcSwap::from_pointee(ViewMap::with_hasher(foldhash::fast::RandomState::default())),
            registry: registry.clone(),
            stats,
            write: Mutex::new(()),
        });
        let hook: Weak<dyn PublishHook> = Arc::downgrade(&(views.clone() as Arc<dyn PublishHook>));
        let catalog = registry.add_hook(hook);
        let names: Vec<Arc<str>> = catalog.snapshots().map(|s| s.name.clone()).collect();
        views.update(&names);
        views
    }

    /// The current views: one atomic load.
    pub fn load(&self) -> Guard<Arc<ViewMap>> {
        self.map.load()
    }

    /// Rebuilds the views of `services` from the registry's current catalog.
    fn update(&self, services: &[Arc<str>]) {
        let _writing = self.write.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let catalog = self.registry.catalog();
        let mut map = (**self.map.load()).clone();
        for name in services {
            let Some(snapshot) = catalog.get(name) else {
                if let Some(gone) = map.remove(name) {
                    gone.superseded.store(true, Ordering::Relaxed);
                }
                continue;
            };
            let previous = map.get(name).cloned();
            if previous.as_ref().is_some_and(|view| Arc::ptr_eq(&view.snapshot, snapshot)) {
                continue;
            }
            let view = Arc::new(ServiceView::new(snapshot.clone(), previous.as_deref(), &self.stats));
            if let Some(previous) = previous {
                previous.superseded.store(true, Ordering::Relaxed);
                self.carry_over(&view, &previous);
            }
            map.insert(name.clone(), view);
        }
        self.map.store(Arc::new(map));
    }

    /// Gives `view` the tables `previous` had: rebuilt now for small subsets, else later on a
    /// blocking thread while picks read the previous ones.
    fn carry_over(&self, view: &Arc<ServiceView>, previous: &ServiceView) {
        for subset in view.subsets() {
            let Some(old) = previous.subset(subset.label()) else { continue };
            let wanted = subset.candidates.inherit(&old.candidates);
            if !wanted.any() {
                continue;
            }
            if subset.candidates.len() <= INLINE_BUILD || tokio::runtime::Handle::try_current().is_err() {
                subset.build(wanted, &self.stats);
            } else {
                let (view, label, stats) = (view.clone(), subset.label().clone(), self.stats.clone());
                tokio::spawn(async move { build(&view, &label, wanted, &stats).await });
            }
        }
    }

    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }
}

impl PublishHook for Views {
    fn published(&self, _catalog: &Catalog, services: &[Arc<str>]) {
        self.update(services);
    }
}

/// Makes sure the subset labelled `label` of `view` has the tables in `needs`: the first pick of
/// a rule on a subset waits here while a blocking thread builds them. A table inherited from an
/// earlier snapshot counts as there.
pub async fn ensure(view: &Arc<ServiceView>, subset: &SubsetView, needs: Needs, stats: &Arc<Stats>) {
    if subset.absent(needs).any() {
        build_absent(view, subset.label(), needs, stats).await;
    }
}

async fn build_absent(view: &Arc<ServiceView>, label: &Arc<str>, needs: Needs, stats: &Arc<Stats>) {
    let _building = view.building.lock().await;
    let Some(subset) = view.subset(label) else { return };
    let absent = subset.absent(needs);
    if absent.any() {
        run_build(view, label, absent, stats).await;
    }
}

/// Builds `needs` for the subset labelled `label` (replacing inherited tables), unless a newer
/// view replaced this one while the build waited its turn.
async fn build(view: &Arc<ServiceView>, label: &Arc<str>, needs: Needs, stats: &Arc<Stats>) {
    let _building = view.building.lock().await;
    if view.is_superseded() {
        return;
    }
    run_build(view, label, needs, stats).await;
}

async fn run_build(view: &Arc<ServiceView>, label: &Arc<str>, needs: Needs, stats: &Arc<Stats>) {
    let (view, label, stats) = (view.clone(), label.clone(), stats.clone());
    let work = move || {
        if let Some(subset) = view.subset(&label) {
            subset.build(needs, &stats);
        }
    };
    if let Err(error) = tokio::task::spawn_blocking(work).await {
        tracing::error!(%error, "building a subset's tables failed");
    }
}
