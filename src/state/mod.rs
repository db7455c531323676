//! Rule state that outlives snapshots and is shared by every consumer: rotation counters,
//! sticky assignments and per-instance call statistics.
//!
//! Counters are keyed by (service, rule, subset) — never by the snapshot — so a registration
//! change does not restart a rotation. The [`StateBackend`] enum is the seam where a shared
//! store (several rota replicas drawing from one counter) plugs in beside the in-process
//! [`MemoryState`]; an enum rather than a trait object keeps the pick path free of boxed futures.

mod memory;
mod stats;

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

pub use memory::{DEFAULT_STICKY_MEMORY_BYTES, MAX_STICKY_ENTRIES, MemoryState, Rotation, RotationCache, StickyUsage};
pub use stats::{
    BreakerConfig, InstancePicks, InstanceReport, Load, MAX_TALLIED_RULES, OTHER_RULE, Origin, Outcome, Stats,
    StatsConfig, StatsHandle,
};

/// Identifies one shared rotation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CounterKey {
    pub service: Arc<str>,
    /// The rule's canonical name, e.g. `repeat(n=3)`.
    pub rule: Arc<str>,
    /// The eligible subset's label, e.g. `version=zlt`.
    pub subset: Arc<str>,
}

/// Identifies one sticky assignment.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct StickyKey {
    pub service: Arc<str>,
    pub subset: Arc<str>,
    pub key: Box<str>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    #[error("state backend unavailable: {0}")]
    Unavailable(String),
}

/// Where rule state lives.
#[derive(Debug)]
pub enum StateBackend {
    Memory(MemoryState),
}

impl Default for StateBackend {
    fn default() -> Self {
        StateBackend::Memory(MemoryState::default())
    }
}

impl StateBackend {
    /// Draws the next ticket of a rotation: 0, 1, 2, ... across all callers, each number once.
    pub async fn next_ticket(&self, key: &CounterKey) -> Result<u64, StateError> {
        match self {
            StateBackend::Memory(memory) => Ok(memory.next_ticket(key)),
        }
    }

    /// Reserves `count` consecutive tickets and returns the first.
    pub async fn reserve_tickets(&self, key: &CounterKey, count: u32) -> Result<u64, StateError> {
        match self {
            StateBackend::Memory(memory) => Ok(memory.reserve_tickets(key, count)),
        }
    }

    /// The rotation of `rule` for picks on a snapshot subset, from the subset's `cache` when
    /// it holds it; otherwise `key()` names the rotation and `picked()` gives the counter its
    /// successful picks are tallied on.
    pub fn rotation<'c>(
        &self,
        cache: &'c RotationCache,
        rule: &str,
        key: impl FnOnce() -> CounterKey,
        picked: impl FnOnce() -> Arc<AtomicU64>,
    ) -> Cow<'c, Rotation> {
        match self {
            StateBackend::Memory(memory) => memory.rotation(cache, rule, key, picked),
        }
    }

    /// Draws the next ticket of `rotation`: 0, 1, 2, ... across all callers, each number once.
    pub async fn draw(&self, rotation: &Rotation) -> Result<u64, StateError> {
        match self {
            StateBackend::Memory(memory) => Ok(memory.draw(rotation)),
        }
    }

    /// The instance id remembered for `key`, if its assignment has not expired.
    pub async fn sticky_get(&self, key: &StickyKey) -> Result<Option<Arc<str>>, StateError> {
        match self {
            StateBackend::Memory(memory) => Ok(memory.sticky_get(key)),
        }
    }

    /// Remembers (or refreshes) `key → id` for `ttl`.
    pub async fn sticky_set(&self, key: StickyKey, id: Arc<str>, ttl: Duration) -> Result<(), StateError> {
        match self {
            StateBackend::Memory(memory) => {
                memory.sticky_set(key, id, ttl);
                Ok(())
            }
        }
    }

    /// In-process state whose sticky assignments may use `sticky_budget` bytes.
    pub fn memory(sticky_budget: usize) -> Self {
        StateBackend::Memory(MemoryState::new(sticky_budget))
    }

    /// Drops expired sticky entries and idle rotation counters.
    pub fn housekeeping(&self) {
        match self {
            StateBackend::Memory(memory) => {
                memory.prune_sticky();
                memory.prune_counters();
            }
        }
    }

    pub fn sticky_usage(&self) -> StickyUsage {
        match self {
            StateBackend::Memory(memory) => memory.sticky_usage(),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            StateBackend::Memory(_) => "memory",
        }
    }
}
