//! In-process rule state: concurrent maps of atomic counters and sticky assignments.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::hash::ConcurrentMap;
use arc_swap::ArcSwap;
use tokio::time::Instant;

use super::{CounterKey, StickyKey};

/// Sticky assignments kept at most; past this, new keys are not remembered (stickiness is
/// best-effort affinity, never a promise) until expired entries are pruned.
pub const MAX_STICKY_ENTRIES: usize = 1_000_000;

/// Rotations remembered per snapshot subset (one per rule used on it).
const CACHED_ROTATIONS: usize = 16;

/// Counter handles cached on a snapshot subset, so repeated picks on one snapshot reach their
/// counter with one atomic load and a short scan: no hashing and no lock. The counters
/// themselves live in [`MemoryState`] and outlive the snapshot.
#[derive(Debug, Default)]
pub struct TicketCache {
    rotations: ArcSwap<Vec<(Arc<str>, Arc<AtomicU64>)>>,
}

impl TicketCache {
    fn next(&self, rule: &Arc<str>) -> Option<u64> {
        let rotations = self.rotations.load();
        let (_, counter) = rotations.iter().find(|(r, _)| Arc::ptr_eq(r, rule) || **r == **rule)?;
        Some(counter.fetch_add(1, Ordering::Relaxed))
    }

    fn remember(&self, rule: &Arc<str>, counter: &Arc<AtomicU64>) {
        self.rotations.rcu(|current| {
            let mut next = Vec::clone(current);
            if next.len() < CACHED_ROTATIONS && !next.iter().any(|(r, _)| **r == **rule) {
                next.push((rule.clone(), counter.clone()));
            }
            next
        });
    }
}

#[derive(Debug, Default)]
pub struct MemoryState {
    counters: ConcurrentMap<CounterKey, Arc<AtomicU64>>,
    sticky: ConcurrentMap<StickyKey, (Arc<str>, Instant)>,
}

impl MemoryState {
    pub fn next_ticket(&self, key: &CounterKey) -> u64 {
        self.counter(key).fetch_add(1, Ordering::Relaxed)
    }

    pub fn reserve_tickets(&self, key: &CounterKey, count: u32) -> u64 {
        self.counter(key).fetch_add(u64::from(count), Ordering::Relaxed)
    }

    /// Like [`next_ticket`](Self::next_ticket), through a subset's cache when it has the
    /// rotation (the common case: no lock at all).
    pub fn next_ticket_cached(&self, cache: &TicketCache, key: &CounterKey) -> u64 {
        if let Some(ticket) = cache.next(&key.rule) {
            return ticket;
        }
        let counter = self.counter(key);
        cache.remember(&key.rule, &counter);
        counter.fetch_add(1, Ordering::Relaxed)
    }

    fn counter(&self, key: &CounterKey) -> Arc<AtomicU64> {
        // A shard read lock in the common case; the write lock only the first time a rotation
        // is used.
        if let Some(counter) = self.counters.get(key) {
            return counter.clone();
        }
        self.counters.entry(key.clone()).or_default().clone()
    }

    pub fn sticky_get(&self, key: &StickyKey) -> Option<Arc<str>> {
        let entry = self.sticky.get(key)?;
        (entry.1 > Instant::now()).then(|| entry.0.clone())
    }

    pub fn sticky_set(&self, key: StickyKey, id: Arc<str>, ttl: Duration) {
        if self.sticky.len() >= MAX_STICKY_ENTRIES && !self.sticky.contains_key(&key) {
            self.prune_sticky();
            if self.sticky.len() >= MAX_STICKY_ENTRIES {
                return;
            }
        }
        self.sticky.insert(key, (id, Instant::now() + ttl));
    }

    pub fn prune_sticky(&self) {
        let now = Instant::now();
        self.sticky.retain(|_, (_, expires)| *expires > now);
    }

    pub fn sticky_len(&self) -> usize {
        self.sticky.len()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

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

    #[test]
    fn cached_and_uncached_draws_share_one_counter() {
        let state = MemoryState::default();
        let (old_snapshot, new_snapshot) = (TicketCache::default(), TicketCache::default());
        assert_eq!(state.next_ticket_cached(&old_snapshot, &key("rr")), 0);
        assert_eq!(state.next_ticket_cached(&old_snapshot, &key("rr")), 1);
        assert_eq!(state.next_ticket(&key("rr")), 2);
        // A new snapshot's subset starts with an empty cache but the same rotation.
        assert_eq!(state.next_ticket_cached(&new_snapshot, &key("rr")), 3);
        assert_eq!(state.next_ticket_cached(&old_snapshot, &key("other")), 0);
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
    }
}
