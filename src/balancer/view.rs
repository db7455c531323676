//! Pick views: what a pick reads, built when a snapshot is published.
//!
//! The registry publishes plain data. For each published service the balancer keeps a
//! [`ServiceView`]: per subset (unversioned, each version, all UP) the [`Candidates`] with the
//! tables rules read, the rotations drawn on it, and the statistics handle of each position. A
//! pick does one `ArcSwap` load, one hash lookup, and reads.
//!
//! Views are built by a [`PublishHook`], on the registry task, before the registry acknowledges
//! the changes or makes them its current catalog, so a provider holding its ack, or a listing
//! or watch showing them, means every later pick sees them; only the
//! services a publication changed are rebuilt. A subset's tables are built when a rule first
//! needs them (that pick waits for the build, which runs on a blocking thread) and from then on
//! at every publication: inline for subsets up to [`INLINE_BUILD`] members, on a blocking
//! thread beyond, while picks go on with the previous snapshot's tables read through member
//! ids (see [`crate::rules::Built`]). Acknowledgements and other services' publications never
//! wait for such a build.
//!
//! Builds converge under any churn. One build runs at a time per service, always for the
//! service's newest view when it starts, and at most one more waits behind it, however many
//! publications come meanwhile; it holds no view, so replaced views are freed at once. A
//! finished table (load index included) is handed forward to the view that replaced the one it
//! was built for, so a pick never waits for a table a later publication would throw away; and
//! a pick that finds a table missing on a view already replaced takes the newest view's
//! (building that one if need be), never building for its own. The load index is carried like
//! the other tables (read through member ids, see [`crate::rules::LoadTable`]), unless more
//! than [`crate::rules::MAX_DEPARTED`] of its members left at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
#[cfg(test)]
use std::time::Duration;

use arc_swap::{ArcSwap, Guard};

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
}

impl SubsetView {
    fn new(subset: Subset) -> Self {
        let stats = (0..subset.len()).map(|_| OnceLock::new()).collect();
        Self {
            candidates: Candidates::new(subset),
            rotations: RotationCache::default(),
            stats,
            load_wanted: AtomicBool::new(false),
        }
    }

    /// What a carry-over build should build here: the tables taken over from another snapshot,
    /// and the load index the replaced subset had.
    fn carry_needs(&self) -> Needs {
        let mut needs = self.candidates.borrowed();
        needs.load |= self.load_wanted.load(Ordering::Relaxed) && self.candidates.tables.load.load().is_none();
        needs
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
            let index = Arc::new(LoadIndex::new(self.candidates.subset.members.clone()));
            stats.attach(&index);
            self.candidates.tables.load.store(Some(Arc::new(LoadTable::own(index))));
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
    /// What the service's successive views share.
    lineage: Arc<Lineage>,
    /// Set when a newer view replaced this one.
    superseded: AtomicBool,
}

/// What the successive views of one service share.
#[derive(Debug, Default)]
struct Lineage {
    /// Held while tables of the service are built: one build at a time.
    building: tokio::sync::Mutex<()>,
    /// The service's current view; unset once the service is forgotten.
    newest: Mutex<Weak<ServiceView>>,
    /// Set while a carry-over build waits to run; publications meanwhile queue no other.
    carry_queued: AtomicBool,
}

impl Lineage {
    fn newest(&self) -> Option<Arc<ServiceView>> {
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
    fn new(snapshot: Arc<ServiceSnapshot>, previous: Option<&ServiceView>, stats: &Stats) -> Self {
        Self {
            ejections: previous.map_or_else(|| stats.ejections(&snapshot.name), |p| p.ejections.clone()),
            unversioned: SubsetView::new(snapshot.unversioned.clone()),
            versions: snapshot.versions.iter().map(|(v, s)| (v.clone(), SubsetView::new(s.clone()))).collect(),
            up: SubsetView::new(snapshot.up.clone()),
            snapshot,
            lineage: previous.map(|p| p.lineage.clone()).unwrap_or_default(),
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
    stats: Arc<Stats>,
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
            let view = Arc::new(ServiceView::new(snapshot.clone(), previous.as_deref(), &self.stats));
            view.lineage.set_newest(Arc::downgrade(&view));
            if let Some(previous) = previous {
                previous.superseded.store(true, Ordering::Relaxed);
                self.carry_over(&view, &previous);
            }
            map.insert(name.clone(), view);
        }
        self.map.store(Arc::new(map));
    }

    /// Gives `view` the tables `previous` had: rebuilt now for small subsets, else later on a
    /// blocking thread (one carry-over build queued per service) while picks read the
    /// previous ones.
    fn carry_over(&self, view: &Arc<ServiceView>, previous: &ServiceView) {
        let mut later = false;
        for subset in view.subsets() {
            let Some(old) = previous.subset(subset.label()) else { continue };
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
            queue_carry_over(&view.lineage, &self.stats);
        }
    }

    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
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

/// Makes sure the subset labelled `label` of `view` has the tables in `needs`: the first pick of
/// a rule on a subset waits here while a blocking thread builds them. A table inherited from an
/// earlier snapshot counts as there; one a newer view of the service has is taken from it.
pub async fn ensure(view: &Arc<ServiceView>, subset: &SubsetView, needs: Needs, stats: &Arc<Stats>) {
    if subset.absent(needs).any() {
        build_absent(view, subset.label(), needs, stats).await;
    }
}

async fn build_absent(view: &Arc<ServiceView>, label: &Arc<str>, needs: Needs, stats: &Arc<Stats>) {
    let _building = view.lineage.building.lock().await;
    let Some(subset) = view.subset(label) else { return };
    if !subset.absent(needs).any() {
        return;
    }
    // A view already replaced builds nothing of its own: it takes the newest view's tables,
    // built first if that one lacks them too (and handed forward).
    let newest = view.lineage.newest().filter(|newest| !Arc::ptr_eq(newest, view));
    if let Some(newest) = &newest
        && let Some(current) = newest.subset(label)
    {
        subset.candidates.adopt(&current.candidates, subset.absent(needs));
        let missing = subset.absent(needs);
        if missing.any() && current.absent(missing).any() {
            run_build(newest, label, current.absent(missing), stats).await;
            hand_forward(newest, stats);
        }
        subset.candidates.adopt(&current.candidates, missing);
    }
    // What is still missing (a load index too many of whose members this view lacks) is its own.
    let absent = subset.absent(needs);
    if absent.any() {
        run_build(view, label, absent, stats).await;
        if newest.is_none() {
            hand_forward(view, stats);
        }
    }
}

/// Queues a build of the tables the service's newest view took over from earlier snapshots,
/// unless one is queued already (it will build for whatever view is newest when it runs).
fn queue_carry_over(lineage: &Arc<Lineage>, stats: &Arc<Stats>) {
    if lineage.carry_queued.swap(true, Ordering::AcqRel) {
        return;
    }
    let (lineage, stats) = (lineage.clone(), stats.clone());
    tokio::spawn(async move {
        let _building = lineage.building.lock().await;
        // From here a publication queues the next build: this one may start before it.
        lineage.carry_queued.store(false, Ordering::Release);
        let Some(view) = lineage.newest() else { return };
        for subset in view.subsets() {
            let needs = subset.carry_needs();
            if needs.any() {
                run_build(&view, subset.label(), needs, &stats).await;
            }
        }
        hand_forward(&view, &stats);
    });
}

/// After a build for `built`: the view that replaced it meanwhile (if any) takes its fresher
/// tables in place of older ones, and gets a carry-over build of its own queued.
fn hand_forward(built: &Arc<ServiceView>, stats: &Arc<Stats>) {
    let Some(newest) = built.lineage.newest() else { return };
    if Arc::ptr_eq(&newest, built) {
        return;
    }
    let all = Needs { schedule: true, maglev: true, load: true };
    for subset in newest.subsets() {
        if let Some(fresh) = built.subset(subset.label()) {
            subset.candidates.refresh_from(&fresh.candidates, all);
        }
    }
    if newest.subsets().any(|subset| subset.carry_needs().any()) {
        queue_carry_over(&newest.lineage, stats);
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::StatsConfig;
    use crate::registry::{InstanceSpec, Lease, RegistryConfig};

    const MAGLEV: Needs = Needs { schedule: false, maglev: true, load: false };
    const LOAD: Needs = Needs { schedule: false, maglev: false, load: true };

    fn spec(n: usize) -> InstanceSpec {
        InstanceSpec {
            id: format!("i{n:05}"),
            service: "big".into(),
            host: "127.0.0.1".into(),
            port: 80,
            ..Default::default()
        }
    }

    /// Views of a service larger than [`INLINE_BUILD`], so its tables build off the registry task.
    async fn big_service() -> (Arc<Views>, Arc<Stats>, Lease, Registry) {
        let registry =
            Registry::spawn(RegistryConfig { max_instances_per_stream: 10_000, ..RegistryConfig::default() });
        let lease = registry.open_lease();
        let outcome = lease.announce((0..INLINE_BUILD + 500).map(spec).collect()).await.expect("registry open");
        assert!(outcome.refused.is_empty(), "{:?}", outcome.refused.first());
        let stats = Arc::new(Stats::new(StatsConfig::default()));
        (Views::follow(&registry, stats.clone()), stats, lease, registry)
    }

    fn view(views: &Views) -> Arc<ServiceView> {
        views.load().get("big").cloned().expect("the service has a view")
    }

    /// Publishes one more instance of the service: a new view.
    async fn change(lease: &Lease, n: usize) {
        lease.announce(vec![spec(INLINE_BUILD + 500 + n)]).await.expect("registry open");
    }

    fn load_table(subset: &SubsetView) -> Option<Arc<LoadTable>> {
        subset.candidates.tables.load.load_full()
    }

    /// A publication while a build of the service runs leaves the new view reading the load
    /// index of the one it replaced (no pick waits): the instance that left is never offered,
    /// positions are the new view's; the carry-over build then gives it its own.
    #[tokio::test]
    async fn a_new_view_reads_the_replaced_views_load_index_until_its_own_is_built() {
        use futures_util::FutureExt;
        let (views, stats, lease, _registry) = big_service().await;
        let first = view(&views);
        ensure(&first, &first.up, LOAD, &stats).await;
        let index = load_table(&first.up).expect("built").index().clone();
        // Everyone busy but the instance about to leave: a least-loaded pick would take it.
        let now = tokio::time::Instant::now();
        let busy = crate::rules::LoadSample { in_flight: 1, ..Default::default() };
        (1..index.len()).for_each(|position| index.set(position, busy, now));
        let leaving = first.up.candidates.members()[0].id.clone();

        let held = first.lineage.building.lock().await;
        let gone = crate::registry::InstanceRef { service: "big".into(), id: leaving.to_string() };
        lease.withdraw(vec![gone]).await.expect("registry open");
        change(&lease, 0).await;
        let newest = view(&views);
        assert!(
            ensure(&newest, &newest.up, LOAD, &stats).now_or_never().is_some(),
            "a pick on the new view waited for a build"
        );
        let table = load_table(&newest.up).expect("a load index to read");
        assert!(Arc::ptr_eq(table.index(), &index), "the replaced view's index");
        let members = newest.up.candidates.members();
        for ticket in 0..64 {
            let draw = crate::rules::Draw::new(&newest.up.candidates, ticket);
            let chosen = draw.loads(|q| q.least_loaded(ticket)).flatten().expect("an instance");
            assert_ne!(members[chosen].id, leaving, "the instance that left was offered");
            assert_eq!(draw.loads(|q| q.load(chosen).in_flight), Some(1), "position read through its id");
        }

        drop(held);
        tokio::time::timeout(Duration::from_secs(30), async {
            while !load_table(&newest.up).is_some_and(|table| table.is_for(&newest.up.candidates.subset)) {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the carry-over build gave the view its own index");
    }

    fn maglev(subset: &SubsetView) -> Option<Arc<crate::rules::Built<crate::rules::Maglev>>> {
        subset.candidates.tables.maglev.load_full()
    }

    /// A pick whose view was replaced before its table existed builds for the newest view, not
    /// its own; an intermediate view then takes that table without a build.
    #[tokio::test]
    async fn a_pick_on_a_replaced_view_builds_the_newest_views_table_and_shares_it() {
        let (views, stats, lease, _registry) = big_service().await;
        let first = view(&views);
        change(&lease, 0).await;
        let middle = view(&views);
        change(&lease, 1).await;
        let newest = view(&views);
        assert!(first.is_superseded() && middle.is_superseded() && !newest.is_superseded());

        ensure(&first, &first.up, MAGLEV, &stats).await;
        let built = maglev(&newest.up).expect("the newest view got the table");
        assert!(built.is_for(&newest.up.candidates.subset), "built for the newest view's members");
        let taken = maglev(&first.up).expect("the replaced view has a table to pick with");
        assert!(Arc::ptr_eq(&taken, &built), "the replaced view uses the newest view's table");

        ensure(&middle, &middle.up, MAGLEV, &stats).await;
        assert!(Arc::ptr_eq(&maglev(&middle.up).unwrap(), &built), "taken, not built again");
    }

    /// While a build holds the service, publications queue one carry-over build, which holds no
    /// view: replaced views are freed at once; when it runs, it builds for the newest view.
    #[tokio::test]
    async fn publications_during_a_build_queue_one_carry_over_and_free_the_views_they_replace() {
        let (views, stats, lease, _registry) = big_service().await;
        let first = view(&views);
        ensure(&first, &first.up, MAGLEV, &stats).await;
        assert!(maglev(&first.up).unwrap().is_for(&first.up.candidates.subset));

        let lineage = first.lineage.clone();
        let held = lineage.building.lock().await;
        let mut replaced = Vec::new();
        for n in 0..20 {
            change(&lease, n).await;
            replaced.push(Arc::downgrade(&view(&views)));
        }
        replaced.pop();
        drop(first);
        let alive = replaced.iter().filter(|v| v.upgrade().is_some()).count();
        assert_eq!(alive, 0, "replaced views kept alive by queued builds");
        let newest = view(&views);
        let borrowed = maglev(&newest.up).expect("the table carried over");
        assert!(!borrowed.is_for(&newest.up.candidates.subset), "still the first view's table");
        assert!(lineage.carry_queued.load(Ordering::Acquire), "one carry-over queued");

        drop(held);
        let own = tokio::time::timeout(Duration::from_secs(30), async {
            loop {
                if let Some(table) = maglev(&newest.up)
                    && table.is_for(&newest.up.candidates.subset)
                {
                    return table;
                }
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the carry-over build ran");
        assert!(own.is_for(&newest.up.candidates.subset));
        assert!(!lineage.carry_queued.load(Ordering::Acquire));
    }
}
