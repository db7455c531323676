//! How views carry tables across publications, and how builds converge for the newest view.

use std::time::Duration;

use super::*;
use crate::balancer::builds::{ensure, prepare};
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
    let registry = Registry::spawn(RegistryConfig { max_instances_per_stream: 10_000, ..RegistryConfig::default() });
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
    assert!(lineage.build_queued.load(Ordering::Acquire), "one carry-over queued");

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
    assert!(!lineage.build_queued.load(Ordering::Acquire));
}

/// A pick that finds no table on a large subset gets none at once (it answers without it) and
/// queues a build; publications while the build waits move it to the newest view, which gets
/// the table once the pool has a thread.
#[tokio::test]
async fn a_pick_finding_no_table_queues_a_build_for_the_newest_view() {
    let (views, stats, lease, _registry) = big_service().await;
    let first = view(&views);
    let held = views.build_pool().hold().await;
    assert_eq!(prepare(&first, &first.up, MAGLEV, &stats), MAGLEV, "absent, not built on the pick");
    assert!(maglev(&first.up).is_none());
    assert!(first.lineage.build_queued.load(Ordering::Acquire), "a build queued");
    for n in 0..5 {
        change(&lease, n).await;
    }
    let newest = view(&views);
    drop(first);
    drop(held);
    tokio::time::timeout(Duration::from_secs(30), async {
        while !maglev(&newest.up).is_some_and(|table| table.is_for(&newest.up.candidates.subset)) {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the queued build gave the newest view its table");
    assert_eq!(prepare(&newest, &newest.up, MAGLEV, &stats), Needs::default());
}
