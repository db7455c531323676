//! Rule state that outlives snapshots and is shared by every consumer: rotation counters.
//!
//! Counters are keyed by (service, rule, subset) — never by the snapshot — so a registration
//! change does not restart a rotation. The [`StateBackend`] enum is the seam where a shared
//! store (several rota replicas drawing from one counter) plugs in beside the in-process
//! [`MemoryState`]; an enum rather than a trait object keeps the pick path free of boxed futures.

mod memory;

use std::sync::Arc;

pub use memory::MemoryState;

/// Identifies one shared rotation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CounterKey {
    pub service: Arc<str>,
    /// The rule's canonical name, e.g. `repeat(n=3)`.
    pub rule: Arc<str>,
    /// The eligible subset's label, e.g. `version=zlt`.
    pub subset: Arc<str>,
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

    pub fn name(&self) -> &'static str {
        match self {
            StateBackend::Memory(_) => "memory",
        }
    }
}
