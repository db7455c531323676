//! What a state backend keeps for the pick path: shared rotations ([`Tickets`]) and sticky
//! assignments ([`Assignments`]). A backend implements both; [`super::StateBackend`] names each
//! backend once and passes every call on.
//!
//! Neither may fail a pick: a backend that cannot reach its store answers from local state
//! (the Redis backend's counters and assignments fall back to the in-process ones while its
//! link is down, see `redis`), so every answer is a value, not a `Result`.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use super::rotation::{Rotation, RotationCache};
use super::{CounterKey, StickyKey, StickyUsage};

/// Rotation counters: each (service, rule, subset) counts 0, 1, 2, … across every consumer,
/// each number handed out once.
pub trait Tickets {
    /// The rotation of `rule` for picks on a subset, from the subset's `cache` when it holds
    /// it; otherwise `key()` names the rotation and `picked()` gives the counter its successful
    /// picks are tallied on.
    fn rotation<'c>(
        &self,
        cache: &'c RotationCache,
        rule: &str,
        key: impl FnOnce() -> CounterKey,
        picked: impl FnOnce() -> Arc<AtomicU64>,
    ) -> Cow<'c, Rotation>;

    /// Draws the next ticket of `rotation`.
    fn draw(&self, rotation: &Rotation) -> impl Future<Output = u64> + Send;

    /// Reserves `count` consecutive tickets of the rotation `key` and returns the first.
    fn reserve(&self, key: &CounterKey, count: u32) -> impl Future<Output = u64> + Send;
}

/// Sticky assignments: request key → instance id, each for a time.
pub trait Assignments {
    /// The id remembered for `key`, if its assignment has not expired.
    fn assigned(&self, key: &StickyKey) -> impl Future<Output = Option<Arc<str>>> + Send;

    /// Remembers `key → id` for `ttl` unless `key` already has a live assignment; returns the
    /// assignment that holds (the earlier one, or `id`).
    fn claim(&self, key: StickyKey, id: Arc<str>, ttl: Duration) -> impl Future<Output = Arc<str>> + Send;

    /// Remembers (or refreshes) `key → id` for `ttl`.
    fn assign(&self, key: StickyKey, id: Arc<str>, ttl: Duration) -> impl Future<Output = ()> + Send;

    /// How much of their budget the assignments held here use.
    fn usage(&self) -> StickyUsage;

    /// Drops expired assignments and idle counters held here.
    fn housekeeping(&self);
}
