//! Rule state that outlives snapshots and is shared by every consumer: rotation counters,
//! sticky assignments and per-instance call statistics.
//!
//! Counters are keyed by (service, rule, subset) — never by the snapshot — so a registration
//! change does not restart a rotation. The [`StateBackend`] enum holds either the in-process
//! [`MemoryState`] or a [`RedisState`] shared by several rota replicas drawing from one counter;
//! an enum rather than a trait object keeps the pick path free of boxed futures.

pub mod ejection;
mod memory;
pub mod redis;
mod stats;

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

pub use ejection::{EjectionConfig, ServiceEjections};
pub use memory::{DEFAULT_STICKY_MEMORY_BYTES, MAX_STICKY_ENTRIES, MemoryState, Rotation, RotationCache, StickyUsage};
pub use redis::{RedisConfig, RedisState};
pub use stats::{
    BreakerConfig, FAILED_CALL_LATENCY, InstancePicks, InstanceReport, Load, LocalLoad, MAX_TALLIED_RULES, OTHER_RULE,
    Origin, Outcome, Outliers, RemoteLoad, Stats, StatsConfig, StatsHandle,
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
    Redis(RedisState),
}

/// Which backend `rota serve` uses (`--state`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum StateConfig {
    #[default]
    Memory,
    Redis(RedisConfig),
}

impl StateConfig {
    /// Parses `--state`: `memory`, or a Redis address (see [`redis::Target`]).
    pub fn parse(text: &str, ticket_block: u32, timeout: Duration) -> Result<Self, String> {
        match text {
            "memory" => Ok(Self::Memory),
            _ => Ok(Self::Redis(RedisConfig { target: redis::Target::parse(text)?, ticket_block, timeout })),
        }
    }

    /// The address as `--state` takes it (with any password: this is for config files).
    pub fn to_url(&self) -> String {
        match self {
            Self::Memory => "memory".into(),
            Self::Redis(redis) => redis.target.to_url(),
        }
    }

    pub fn ticket_block(&self) -> u32 {
        match self {
            Self::Memory => 1,
            Self::Redis(redis) => redis.ticket_block,
        }
    }

    /// The longest wait for one command of a shared backend.
    pub fn timeout(&self) -> Duration {
        match self {
            Self::Memory => redis::COMMAND_TIMEOUT,
            Self::Redis(redis) => redis.timeout,
        }
    }
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
            StateBackend::Redis(redis) => Ok(redis.reserve_tickets(key, 1).await),
        }
    }

    /// Reserves `count` consecutive tickets and returns the first.
    pub async fn reserve_tickets(&self, key: &CounterKey, count: u32) -> Result<u64, StateError> {
        match self {
            StateBackend::Memory(memory) => Ok(memory.reserve_tickets(key, count)),
            StateBackend::Redis(redis) => Ok(redis.reserve_tickets(key, count).await),
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
            StateBackend::Redis(redis) => redis.rotation(cache, rule, key, picked),
        }
    }

    /// Draws the next ticket of `rotation`: 0, 1, 2, ... across all callers, each number once.
    pub async fn draw(&self, rotation: &Rotation) -> Result<u64, StateError> {
        match self {
            StateBackend::Memory(memory) => Ok(memory.draw(rotation)),
            StateBackend::Redis(redis) => Ok(redis.draw(rotation).await),
        }
    }

    /// The instance id remembered for `key`, if its assignment has not expired.
    pub async fn sticky_get(&self, key: &StickyKey) -> Result<Option<Arc<str>>, StateError> {
        match self {
            StateBackend::Memory(memory) => Ok(memory.sticky_get(key)),
            StateBackend::Redis(redis) => Ok(redis.sticky_get(key).await),
        }
    }

    /// Remembers `key → id` for `ttl` unless `key` already has a live assignment; returns the
    /// assignment that holds (the earlier one, or `id`).
    pub async fn sticky_claim(&self, key: StickyKey, id: Arc<str>, ttl: Duration) -> Result<Arc<str>, StateError> {
        match self {
            StateBackend::Memory(memory) => Ok(memory.sticky_claim(key, id, ttl)),
            StateBackend::Redis(redis) => Ok(redis.sticky_claim(key, id, ttl).await),
        }
    }

    /// Remembers (or refreshes) `key → id` for `ttl`.
    pub async fn sticky_set(&self, key: StickyKey, id: Arc<str>, ttl: Duration) -> Result<(), StateError> {
        match self {
            StateBackend::Memory(memory) => {
                memory.sticky_set(key, id, ttl);
                Ok(())
            }
            StateBackend::Redis(redis) => {
                redis.sticky_set(key, id, ttl).await;
                Ok(())
            }
        }
    }

    /// In-process state whose sticky assignments may use `sticky_budget` bytes.
    pub fn memory(sticky_budget: usize) -> Self {
        StateBackend::Memory(MemoryState::new(sticky_budget))
    }

    /// The backend `config` names; a Redis link is kept on the current runtime.
    pub fn open(config: &StateConfig, sticky_budget: usize) -> Self {
        match config {
            StateConfig::Memory => Self::memory(sticky_budget),
            StateConfig::Redis(redis) => StateBackend::Redis(RedisState::connect(redis.clone(), sticky_budget)),
        }
    }

    /// The link to Redis, for a shared backend.
    pub fn link(&self) -> Option<&Arc<redis::Link>> {
        match self {
            StateBackend::Memory(_) => None,
            StateBackend::Redis(redis) => Some(redis.link()),
        }
    }

    /// Whether the backend answers: always for the in-process one; for Redis, whether its link
    /// is up (while it is down, picks are answered from local state).
    pub fn is_up(&self) -> bool {
        match self {
            StateBackend::Memory(_) => true,
            StateBackend::Redis(redis) => redis.is_up(),
        }
    }

    /// Drops expired sticky entries and idle rotation counters.
    pub fn housekeeping(&self) {
        match self {
            StateBackend::Memory(memory) => {
                memory.prune_sticky();
                memory.prune_counters();
            }
            StateBackend::Redis(redis) => redis.housekeeping(),
        }
    }

    pub fn sticky_usage(&self) -> StickyUsage {
        match self {
            StateBackend::Memory(memory) => memory.sticky_usage(),
            StateBackend::Redis(redis) => redis.sticky_usage(),
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            StateBackend::Memory(_) => "memory",
            StateBackend::Redis(_) => "redis",
        }
    }
}
