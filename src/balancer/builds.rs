//! Table builds, off the pick path.
//!
//! A pick never waits for a table ([`prepare`]): it reads the newest complete one, even one
//! built for an earlier view (read through member ids, instances gone since skipped), builds
//! the missing tables itself only for a subset small enough that this costs what a
//! publication's inline build costs ([`INLINE_BUILD`] members), and otherwise answers without
//! them ([`crate::rules::table_free`]) while a build is queued.
//!
//! Builds converge under any churn. One build runs at a time per service, always for the
//! service's newest view when it starts, and at most one more waits behind it, however many
//! publications or picks come meanwhile; a waiting build holds no view, so replaced views are
//! freed at once. Builds of every service share one [`BuildPool`] of [`BUILD_THREADS`]
//! blocking thread, never a runtime worker, so under any churn they take at most one core from
//! picks and publications. A finished table (load index included) is handed forward to the view
//! that replaced the one it was built for.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::view::{INLINE_BUILD, Lineage, ServiceView, SubsetView};
use crate::load::Stats;
use crate::rules::Needs;

/// Threads that build tables at once, for every service together.
pub const BUILD_THREADS: usize = 1;

/// Where large subsets' tables are built: [`BUILD_THREADS`] blocking threads at a time.
#[derive(Debug)]
pub struct BuildPool {
    threads: tokio::sync::Semaphore,
}

impl Default for BuildPool {
    fn default() -> Self {
        Self { threads: tokio::sync::Semaphore::new(BUILD_THREADS) }
    }
}

impl BuildPool {
    /// Takes every thread of the pool until the guard is dropped: builds wait meanwhile.
    #[cfg(test)]
    pub(crate) async fn hold(&self) -> tokio::sync::SemaphorePermit<'_> {
        self.threads.acquire_many(BUILD_THREADS as u32).await.expect("the pool is never closed")
    }
}

/// Makes the tables in `needs` readable on `subset` of `view` without waiting for a build, and
/// returns those still absent: a table a newer view of the service has is taken from it; a
/// subset of at most [`INLINE_BUILD`] members builds what is missing now; a larger one asks the
/// service's next build for it (queued here), and the pick answers without it.
pub fn prepare(view: &Arc<ServiceView>, subset: &SubsetView, needs: Needs, stats: &Arc<Stats>) -> Needs {
    let absent = subset.absent(needs);
    if !absent.any() {
        return absent;
    }
    let newest = view.lineage.newest();
    let current = newest.as_ref().and_then(|newest| newest.subset(subset.label()));
    if let Some(current) = current.filter(|current| !std::ptr::eq(*current, subset)) {
        subset.candidates.adopt(&current.candidates, absent);
    }
    let absent = subset.absent(needs);
    if !absent.any() {
        return absent;
    }
    if subset.candidates.len() <= INLINE_BUILD {
        subset.build(absent, stats);
        return Needs::default();
    }
    if let Some(current) = current {
        current.request(current.absent(absent));
        queue_build(&view.lineage, stats);
    }
    absent
}

/// Makes sure `subset` of `view` has the tables in `needs`, waiting for their build if need be:
/// what a `Lease` does before mapping tickets (a pick never waits: [`prepare`]). A table
/// inherited from an earlier snapshot counts as there; one a newer view of the service has is
/// taken from it.
pub async fn ensure(view: &Arc<ServiceView>, subset: &SubsetView, needs: Needs, stats: &Arc<Stats>) {
    if subset.absent(needs).any() {
        build_absent(view, subset.label(), needs, stats).await;
    }
}

async fn build_absent(view: &Arc<ServiceView>, label: &Arc<str>, needs: Needs, stats: &Arc<Stats>) {
    let _building = view.lineage.building.lock().await;
    let Ok(_thread) = view.lineage.pool.threads.acquire().await else { return };
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

/// Queues a build of the tables the service's newest view took over from earlier snapshots or
/// a pick asked for, unless one is queued already: it builds for whatever view is newest when
/// it gets a thread of the pool, and holds no view while it waits.
pub(super) fn queue_build(lineage: &Arc<Lineage>, stats: &Arc<Stats>) {
    if lineage.build_queued.swap(true, Ordering::AcqRel) {
        return;
    }
    let (lineage, stats) = (lineage.clone(), stats.clone());
    tokio::spawn(async move {
        let _building = lineage.building.lock().await;
        let Ok(_thread) = lineage.pool.threads.acquire().await else { return };
        // From here a publication or a pick queues the next build: this one may start before it.
        lineage.build_queued.store(false, Ordering::Release);
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
        queue_build(&newest.lineage, stats);
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
