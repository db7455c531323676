//! In-process rule state: a concurrent map of atomic counters.

use std::sync::atomic::{AtomicU64, Ordering};

use dashmap::DashMap;

use super::CounterKey;

#[derive(Debug, Default)]
pub struct MemoryState {
    counters: DashMap<CounterKey, AtomicU64>,
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
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::Arc;

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
}
