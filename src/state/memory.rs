//! In-process rule state: concurrent maps of atomic counters and sticky assignments.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use crate::hash::ConcurrentMap;
use tokio::time::Instant;

use super::rotation::{RemoteCounter, Rotation, RotationCache};
use super::{Assignments, CounterKey, StickyKey, Tickets};

/// Sticky assignments kept at most; past this, new keys are not remembered (stickiness is
/// best-effort affinity, never a promise) until expired entries are pruned.
pub const MAX_STICKY_ENTRIES: usize = 1_000_000;
/// Default memory budget of the sticky assignments (`server.sticky_memory_bytes`): keys may be
/// up to 1 KiB, so the entry cap alone would allow about a gigabyte.
pub const DEFAULT_STICKY_MEMORY_BYTES: usize = 128 << 20;
/// What one sticky entry costs besides its key's bytes: the map slot, the shared names, the
/// remembered id and its expiry (measured, rounded up).
const STICKY_ENTRY_OVERHEAD: usize = 128;
/// Housekeeping rounds a rotation counter may go unused (no ticket drawn, no snapshot caching
/// it) before it is dropped: 10 minutes at the default 30 s interval. A dropped rotation starts
/// again from ticket 0 when next used.
const IDLE_ROUNDS: u32 = 20;

/// A rotation's counter as the map holds it, with what housekeeping saw of it last.
#[derive(Debug, Default)]
struct CounterEntry {
    ticket: Arc<AtomicU64>,
    /// The ticket value at the last housekeeping round.
    seen: u64,
    /// Consecutive rounds without a draw and without a snapshot caching the counter.
    idle_rounds: u32,
}

/// How much of their budget the sticky assignments use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StickyUsage {
    pub entries: usize,
    pub bytes: usize,
    pub budget: usize,
    /// New assignments not remembered because the budget or the entry cap was reached.
    pub refused: u64,
}

#[derive(Debug)]
pub struct MemoryState {
    counters: ConcurrentMap<CounterKey, CounterEntry>,
    sticky: ConcurrentMap<StickyKey, (Arc<str>, Instant)>,
    sticky_bytes: AtomicUsize,
    sticky_budget: usize,
    sticky_refused: AtomicU64,
}

impl Default for MemoryState {
    fn default() -> Self {
        Self::new(DEFAULT_STICKY_MEMORY_BYTES)
    }
}

fn sticky_cost(key: &StickyKey) -> usize {
    key.key.len() + STICKY_ENTRY_OVERHEAD
}

impl MemoryState {
    /// In-process state whose sticky assignments may use `sticky_budget` bytes.
    pub fn new(sticky_budget: usize) -> Self {
        Self {
            counters: ConcurrentMap::default(),
            sticky: ConcurrentMap::default(),
            sticky_bytes: AtomicUsize::new(0),
            sticky_budget,
            sticky_refused: AtomicU64::new(0),
        }
    }

    pub fn next_ticket(&self, key: &CounterKey) -> u64 {
        self.counter(key).fetch_add(1, Ordering::Relaxed)
    }

    pub fn reserve_tickets(&self, key: &CounterKey, count: u32) -> u64 {
        self.counter(key).fetch_add(u64::from(count), Ordering::Relaxed)
    }

    /// The rotation of `rule` on a subset: from the subset's cache when it has it (the common
    /// case), else through the counter map, naming it with `key` and tallying on `picked()`.
    pub fn rotation<'c>(
        &self,
        cache: &'c RotationCache,
        rule: &str,
        key: impl FnOnce() -> CounterKey,
        picked: impl FnOnce() -> Arc<AtomicU64>,
    ) -> Cow<'c, Rotation> {
        self.rotation_with(cache, rule, key, picked, |_| None)
    }

    /// [`Self::rotation`], attaching `remote(key)` to a rotation not yet cached.
    pub(crate) fn rotation_with<'c>(
        &self,
        cache: &'c RotationCache,
        rule: &str,
        key: impl FnOnce() -> CounterKey,
        picked: impl FnOnce() -> Arc<AtomicU64>,
        remote: impl FnOnce(&CounterKey) -> Option<Arc<dyn RemoteCounter>>,
    ) -> Cow<'c, Rotation> {
        if let Some(rotation) = cache.find(rule) {
            return Cow::Borrowed(rotation);
        }
        let key = key();
        let remote = remote(&key);
        let rotation = Rotation::new(key.rule.clone(), self.counter(&key), picked(), remote);
        match cache.remember(&rotation) {
            Some(cached) => Cow::Borrowed(cached),
            None => Cow::Owned(rotation),
        }
    }

    /// Draws the next ticket of a rotation.
    pub fn draw(&self, rotation: &Rotation) -> u64 {
        rotation.ticket().fetch_add(1, Ordering::Relaxed)
    }

    /// The in-process counter of a rotation.
    pub(crate) fn local_counter(&self, key: &CounterKey) -> Arc<AtomicU64> {
        self.counter(key)
    }

    fn counter(&self, key: &CounterKey) -> Arc<AtomicU64> {
        // A shard read lock in the common case; the write lock only the first time a rotation
        // is used.
        if let Some(counter) = self.counters.get(key) {
            return counter.ticket.clone();
        }
        self.counters.entry(key.clone()).or_default().ticket.clone()
    }

    /// Drops rotation counters unused for `IDLE_ROUNDS` calls. A counter in use is one whose
    /// ticket moved since the last call, or that a snapshot subset caches (it holds a second
    /// reference), so nothing is added to the pick path to tell.
    pub fn prune_counters(&self) {
        self.counters.retain(|_, entry| {
            let ticket = entry.ticket.load(Ordering::Relaxed);
            if Arc::strong_count(&entry.ticket) > 1 || ticket != entry.seen {
                entry.seen = ticket;
                entry.idle_rounds = 0;
                return true;
            }
            entry.idle_rounds += 1;
            entry.idle_rounds < IDLE_ROUNDS
        });
    }

    /// Rotation counters held.
    pub fn counters_len(&self) -> usize {
        self.counters.len()
    }

    pub fn sticky_get(&self, key: &StickyKey) -> Option<Arc<str>> {
        let entry = self.sticky.get(key)?;
        (entry.1 > Instant::now()).then(|| entry.0.clone())
    }

    /// Remembers `key → id` for `ttl` unless the key has a live assignment; the one that holds.
    pub fn sticky_claim(&self, key: StickyKey, id: Arc<str>, ttl: Duration) -> Arc<str> {
        if let Some(current) = self.sticky_get(&key) {
            return current;
        }
        self.sticky_set(key, id.clone(), ttl);
        id
    }

    /// Remembers `key → id` for `ttl`, unless a new key would exceed the entry cap or the memory
    /// budget even after expired entries are pruned (then the pick is simply not sticky).
    pub fn sticky_set(&self, key: StickyKey, id: Arc<str>, ttl: Duration) {
        let expires = Instant::now() + ttl;
        if let Some(mut entry) = self.sticky.get_mut(&key) {
            *entry = (id, expires);
            return;
        }
        let cost = sticky_cost(&key);
        if !self.sticky_fits(cost) {
            self.prune_sticky();
            if !self.sticky_fits(cost) {
                self.sticky_refused.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        if self.sticky.insert(key, (id, expires)).is_none() {
            self.sticky_bytes.fetch_add(cost, Ordering::Relaxed);
        }
    }

    fn sticky_fits(&self, cost: usize) -> bool {
        self.sticky.len() < MAX_STICKY_ENTRIES && self.sticky_bytes.load(Ordering::Relaxed) + cost <= self.sticky_budget
    }

    pub fn prune_sticky(&self) {
        let now = Instant::now();
        self.sticky.retain(|key, (_, expires)| {
            let keep = *expires > now;
            if !keep {
                self.sticky_bytes.fetch_sub(sticky_cost(key), Ordering::Relaxed);
            }
            keep
        });
    }

    pub fn sticky_len(&self) -> usize {
        self.sticky.len()
    }

    pub fn sticky_usage(&self) -> StickyUsage {
        StickyUsage {
            entries: self.sticky.len(),
            bytes: self.sticky_bytes.load(Ordering::Relaxed),
            budget: self.sticky_budget,
            refused: self.sticky_refused.load(Ordering::Relaxed),
        }
    }
}

impl Tickets for MemoryState {
    fn rotation<'c>(
        &self,
        cache: &'c RotationCache,
        rule: &str,
        key: impl FnOnce() -> CounterKey,
        picked: impl FnOnce() -> Arc<AtomicU64>,
    ) -> Cow<'c, Rotation> {
        MemoryState::rotation(self, cache, rule, key, picked)
    }

    fn draw(&self, rotation: &Rotation) -> impl Future<Output = u64> + Send {
        std::future::ready(MemoryState::draw(self, rotation))
    }

    fn reserve(&self, key: &CounterKey, count: u32) -> impl Future<Output = u64> + Send {
        std::future::ready(self.reserve_tickets(key, count))
    }
}

impl Assignments for MemoryState {
    fn assigned(&self, key: &StickyKey) -> impl Future<Output = Option<Arc<str>>> + Send {
        std::future::ready(self.sticky_get(key))
    }

    fn claim(&self, key: StickyKey, id: Arc<str>, ttl: Duration) -> impl Future<Output = Arc<str>> + Send {
        std::future::ready(self.sticky_claim(key, id, ttl))
    }

    fn assign(&self, key: StickyKey, id: Arc<str>, ttl: Duration) -> impl Future<Output = ()> + Send {
        self.sticky_set(key, id, ttl);
        std::future::ready(())
    }

    fn usage(&self) -> StickyUsage {
        self.sticky_usage()
    }

    fn housekeeping(&self) {
        self.prune_sticky();
        self.prune_counters();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::state::rotation::CACHED_ROTATIONS;

    fn key(rule: &str) -> CounterKey {
        CounterKey { service: "svc".into(), rule: rule.into(), subset: "version=".into() }
    }

    #[test]
    fn each_rotation_counts_from_zero_independently() {
        let state = MemoryState::default();
        assert_eq!(state.next_ticket(&key("round_robin")), 0);
        assert_eq!(state.next_ticket(&key("round_robin")), 1);
        assert_eq!(state.next_ticket(&key("repeat(n=3)")), 0);
    }

    #[test]
    fn concurrent_callers_never_share_a_ticket() {
        let state = Arc::new(MemoryState::default());
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let state = state.clone();
                std::thread::spawn(move || (0..1000).map(|_| state.next_ticket(&key("rr"))).collect::<Vec<_>>())
            })
            .collect();
        let all: HashSet<u64> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
        assert_eq!(all, (0..4000).collect());
    }

    fn draw_on(state: &MemoryState, cache: &RotationCache, rule: &str, picked: &Arc<AtomicU64>) -> u64 {
        let rotation = state.rotation(cache, rule, || key(rule), || picked.clone());
        rotation.tally();
        state.draw(&rotation)
    }

    #[test]
    fn cached_and_uncached_draws_share_one_counter() {
        let state = MemoryState::default();
        let picked = Arc::new(AtomicU64::new(0));
        let (old_snapshot, new_snapshot) = (RotationCache::default(), RotationCache::default());
        assert_eq!(draw_on(&state, &old_snapshot, "rr", &picked), 0);
        assert_eq!(draw_on(&state, &old_snapshot, "rr", &picked), 1);
        assert_eq!(state.next_ticket(&key("rr")), 2);
        // A new snapshot's subset starts with an empty cache but the same rotation.
        assert_eq!(draw_on(&state, &new_snapshot, "rr", &picked), 3);
        assert_eq!(draw_on(&state, &old_snapshot, "other", &picked), 0);
        assert_eq!(picked.load(Ordering::Relaxed), 4, "every draw tallied once");
    }

    #[test]
    fn a_full_cache_still_draws_from_the_shared_counters() {
        let state = MemoryState::default();
        let cache = RotationCache::default();
        let picked = Arc::new(AtomicU64::new(0));
        let rules: Vec<String> = (0..CACHED_ROTATIONS + 3).map(|n| format!("repeat(n={n})")).collect();
        for round in 0..3 {
            for rule in &rules {
                assert_eq!(draw_on(&state, &cache, rule, &picked), round);
            }
        }
        let cached =
            |rule: &str| matches!(state.rotation(&cache, rule, || key(rule), || picked.clone()), Cow::Borrowed(_));
        assert!(cached(&rules[0]) && cached(&rules[CACHED_ROTATIONS - 1]));
        assert!(!cached(&rules[CACHED_ROTATIONS]), "past the slots, rotations are looked up");
    }

    #[test]
    fn idle_counters_are_dropped_and_busy_or_cached_ones_kept() {
        let state = MemoryState::default();
        let cache = RotationCache::default();
        let picked = Arc::new(AtomicU64::new(0));
        state.next_ticket(&key("idle"));
        state.next_ticket(&key("busy"));
        draw_on(&state, &cache, "cached", &picked);
        state.prune_counters();
        for _ in 0..IDLE_ROUNDS - 1 {
            state.next_ticket(&key("busy"));
            state.prune_counters();
        }
        assert_eq!(state.counters_len(), 3, "nothing dropped before its idle rounds are up");
        state.prune_counters();
        assert_eq!(state.counters_len(), 2, "the idle counter is dropped");
        assert_eq!(state.next_ticket(&key("idle")), 0, "and starts again from 0 when used");
        assert_eq!(draw_on(&state, &cache, "cached", &picked), 1, "a cached rotation keeps its counter");
        assert_eq!(state.next_ticket(&key("busy")), IDLE_ROUNDS as u64);
    }

    #[test]
    fn sticky_assignments_stay_within_their_memory_budget() {
        let state = MemoryState::new(10 * (STICKY_ENTRY_OVERHEAD + 100));
        let key =
            |n: usize| StickyKey { service: "svc".into(), subset: "version=".into(), key: format!("{n:0100}").into() };
        for n in 0..15 {
            state.sticky_set(key(n), "a".into(), Duration::from_secs(60));
        }
        let usage = state.sticky_usage();
        assert_eq!((usage.entries, usage.refused), (10, 5));
        assert!(usage.bytes <= usage.budget);
        assert_eq!(state.sticky_get(&key(3)).as_deref(), Some("a"));
        assert_eq!(state.sticky_get(&key(12)), None, "past the budget, keys are not remembered");
        state.sticky_set(key(3), "b".into(), Duration::from_secs(60));
        assert_eq!(state.sticky_get(&key(3)).as_deref(), Some("b"), "a known key is still refreshed");
    }

    #[tokio::test(start_paused = true)]
    async fn sticky_assignments_expire_after_their_ttl() {
        let state = MemoryState::default();
        let key = StickyKey { service: "svc".into(), subset: "version=".into(), key: "user-1".into() };
        state.sticky_set(key.clone(), "a".into(), Duration::from_secs(60));
        tokio::time::advance(Duration::from_secs(59)).await;
        assert_eq!(state.sticky_get(&key).as_deref(), Some("a"));
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(state.sticky_get(&key), None);
        state.prune_sticky();
        assert_eq!(state.sticky_len(), 0);
        assert_eq!(state.sticky_usage().bytes, 0, "pruned entries give their bytes back");
    }
}
