//! Rule state that outlives snapshots and is shared by every consumer: rotation counters and
//! sticky assignments (what rota knows of instances' load is [`crate::load`]'s).
//!
//! Counters are keyed by (service, rule, subset) — never by the snapshot — so a registration
//! change does not restart a rotation. What a backend keeps is the contract of [`contract`]:
//! [`Tickets`] and [`Assignments`]. The [`StateBackend`] enum holds either the in-process
//! [`MemoryState`] or a [`RedisState`] shared by several rota replicas drawing from one counter;
//! an enum rather than a trait object keeps the pick path free of boxed futures. Adding a
//! backend is implementing the two traits and adding a variant (and its arm in `each_backend!`).

pub mod contract;
mod memory;
pub mod redis;
mod rotation;

use std::borrow::Cow;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

pub use contract::{Assignments, Tickets};
pub use memory::{DEFAULT_STICKY_MEMORY_BYTES, MAX_STICKY_ENTRIES, MemoryState, StickyUsage};
pub use redis::{RedisConfig, RedisState};
pub use rotation::{RemoteCounter, Rotation, RotationCache};

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
            _ => Ok(Self::Redis(RedisConfig {
                target: redis::Target::parse(text)?,
                ticket_block,
                timeout,
                lag_limit: crate::replicas::lag::DEFAULT_LAG_LIMIT,
            })),
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

    /// The longest propagation lag from another replica before a replica counts as degraded.
    pub fn lag_limit(&self) -> Duration {
        match self {
            Self::Memory => crate::replicas::lag::DEFAULT_LAG_LIMIT,
            Self::Redis(redis) => redis.lag_limit,
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

/// Runs `$call` on whichever backend `$state` is, bound to `$backend`.
macro_rules! each_backend {
    ($state:expr, $backend:ident => $call:expr) => {
        match $state {
            StateBackend::Memory($backend) => $call,
            StateBackend::Redis($backend) => $call,
        }
    };
}

impl StateBackend {
    /// Draws the next ticket of the rotation `key`: 0, 1, 2, ... across all callers, each once.
    pub async fn next_ticket(&self, key: &CounterKey) -> u64 {
        each_backend!(self, backend => backend.reserve(key, 1).await)
    }

    /// Reserves `count` consecutive tickets and returns the first.
    pub async fn reserve_tickets(&self, key: &CounterKey, count: u32) -> u64 {
        each_backend!(self, backend => backend.reserve(key, count).await)
    }

    /// See [`Tickets::rotation`].
    pub fn rotation<'c>(
        &self,
        cache: &'c RotationCache,
        rule: &str,
        key: impl FnOnce() -> CounterKey,
        picked: impl FnOnce() -> Arc<AtomicU64>,
    ) -> Cow<'c, Rotation> {
        each_backend!(self, backend => Tickets::rotation(backend, cache, rule, key, picked))
    }

    /// Draws the next ticket of `rotation`: 0, 1, 2, ... across all callers, each number once.
    pub async fn draw(&self, rotation: &Rotation) -> u64 {
        each_backend!(self, backend => Tickets::draw(backend, rotation).await)
    }

    /// See [`Assignments::assigned`].
    pub async fn sticky_get(&self, key: &StickyKey) -> Option<Arc<str>> {
        each_backend!(self, backend => backend.assigned(key).await)
    }

    /// See [`Assignments::claim`].
    pub async fn sticky_claim(&self, key: StickyKey, id: Arc<str>, ttl: Duration) -> Arc<str> {
        each_backend!(self, backend => backend.claim(key, id, ttl).await)
    }

    /// See [`Assignments::assign`].
    pub async fn sticky_set(&self, key: StickyKey, id: Arc<str>, ttl: Duration) {
        each_backend!(self, backend => backend.assign(key, id, ttl).await)
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
        each_backend!(self, backend => Assignments::housekeeping(backend))
    }

    pub fn sticky_usage(&self) -> StickyUsage {
        each_backend!(self, backend => backend.usage())
    }

    pub fn name(&self) -> &'static str {
        match self {
            StateBackend::Memory(_) => "memory",
            StateBackend::Redis(_) => "redis",
        }
    }
}
