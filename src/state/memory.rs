//! In-process rule state: concurrent maps of atomic counters and sticky assignments.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use crate::hash::ConcurrentMap;
use tokio::time::Instant;

use super::{CounterKey, StickyKey};

/// Sticky assignments kept at most; past this, new keys are not remembered (stickiness is
/// best-effort affinity, never a promise) until expired entries are pruned.
pub const MAX_STICKY_ENTRIES: usize = 1_000_000;

/// Rotations remembered per snapshot subset (one per rule used on it); past this, picks of
/// further rules on the subset look their counter up.
const CACHED_ROTATIONS: usize = 8;

/// One rotation as picks reach it: its shared ticket counter and the counter its successful
/// picks are tallied on (operators' count of picks per service and rule).
#[derive(Debug, Clone)]
pub struct Rotation {
    rule: Arc<str>,
    ticket: Arc<AtomicU64>,
    picked: Arc<AtomicU64>,
}

impl Rotation {
    /// Counts one successful pick from this rotation.
    pub fn tally(&self) {
        self.picked.fetch_add(1, Ordering::Relaxed);
    }
}

/// Rotations cached on a snapshot subset, so repeated picks reach their counters with a short
/// scan of set-once slots: no hashing, no lock, no reference count touched. The counters
/// themselves live in [`MemoryState`] and outlive the snapshot.
#[derive(Debug, Default)]
pub struct RotationCache {
    slots: [OnceLock<Rotation>; CACHED_ROTATIONS],
}

impl RotationCache {
    fn find(&self, rule: &str) -> Option<&Rotation> {
        for slot in &self.slots {
            match slot.get() {
                Some(rotation) if *rotation.rule == *rule => return Some(rotation),
                Some(_) => {}
                None => return None,
            }
        }
        None
    }

    /// Puts `rotation` in the first free slot (or finds it there, set by a concurrent pick);
    /// `None` when every slot holds another rule.
    fn remember(&self, rotation: &Rotation) -> Option<&Rotation> {
        self.slots.iter().map(|slot| slot.get_or_init(|| rotation.clone())).find(|r| *r.rule == *rotation.rule)
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

    /// The rotation of `rule` on a subset: from the subset's cache when it has it (the common
    /// case), else through the counter map, naming it with `key` and tallying on `picked()`.
    pub fn rotation<'c>(
        &self,
        cache: &'c RotationCache,
        rule: &str,
        key: impl FnOnce() -> CounterKey,
        picked: impl FnOnce() -> Arc<AtomicU64>,
    ) -> Cow<'c, Rotation> {
        if let Some(rotation) = cache.find(rule) {
            return Cow::Borrowed(rotation);
        }
        let key = key();
        let rotation = Rotation { ticket: self.counter(&key), rule: key.rule, picked: picked() };
        match cache.remember(&rotation) {
            Some(cached) => Cow::Borrowed(cached),
            None => Cow::Owned(rotation),
        }
    }

    /// Draws the next ticket of a rotation.
    pub fn draw(&self, rotation: &Rotation) -> u64 {
        rotation.ticket.fetch_add(1, Ordering::Relaxed)
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
