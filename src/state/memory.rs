//! In-process rule state: concurrent maps of atomic counters and sticky assignments.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use tokio::time::Instant;

use super::{CounterKey, StickyKey};

/// Sticky assignments kept at most; past this, new keys are not remembered (stickiness is
/// best-effort affinity, never a promise) until expired entries are pruned.
pub const MAX_STICKY_ENTRIES: usize = 1_000_000;

#[derive(Debug, Default)]
pub struct MemoryState {
    counters: DashMap<CounterKey, AtomicU64>,
    sticky: DashMap<StickyKey, (Arc<str>, Instant)>,
}

impl MemoryState {
    pub fn next_ticket(&self, key: &CounterKey) -> u64 {
        // The common case takes a shard read lock and one atomic increment; the write lock is
        // only taken the first time a rotation is used.
        if let Some(counter) = self.counters.get(key) {
            return counter.fetch_add(1, Ordering::Relaxed);
        }
        self.counters.entry(key.clone()).or_default().fetch_add(1, Ordering::Relaxed)
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
