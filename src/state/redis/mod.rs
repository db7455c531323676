//! Rule state shared by several rota replicas through Redis.
//!
//! Rotation counters (`tickets`) and sticky assignments live in Redis, so a consumer gets the
//! same answer from any replica. Every key of a service carries the service's name as its hash
//! tag (`rota:{orders}:…`), so on Redis Cluster a service's counters and sticky keys live on one
//! shard and a fleet scales out by service.
//!
//! The replica keeps in-process state beside it ([`MemoryState`]): rotation caches, the local
//! counters and sticky assignments it answers from while Redis is unreachable (see `link`).
//! A pick that finds the link down never waits for Redis.

pub mod keys;
mod link;
mod target;
pub(crate) mod tickets;

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use crate::hash::ConcurrentMap;

pub use link::{CHECK_INTERVAL, COMMAND_TIMEOUT, Link, LinkScript, time_floor};
pub use target::Target;
pub use tickets::{COUNTER_TTL, MAX_BATCH, SharedCounter};

use super::memory::{MemoryState, StickyUsage};
use super::rotation::{RemoteCounter, Rotation, RotationCache};
use super::{Assignments, CounterKey, StickyKey, Tickets};

/// Largest `ticket_block`.
pub const MAX_TICKET_BLOCK: u32 = 65_536;

/// How a replica reaches Redis and shares its counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    pub target: Target,
    /// Spare tickets a replica reserves per Redis call; 1 keeps the rotation exact per pick.
    pub ticket_block: u32,
    /// Longest wait for one Redis command before the replica counts Redis as unreachable.
    pub timeout: Duration,
    /// Longest propagation lag from another replica before this one counts as degraded.
    pub lag_limit: Duration,
}

#[derive(Debug)]
pub struct RedisState {
    local: MemoryState,
    link: Arc<Link>,
    counters: ConcurrentMap<CounterKey, Arc<SharedCounter>>,
    ticket_block: u32,
}

impl RedisState {
    /// State in Redis at `config.target`, reached by a link kept on the current runtime; local
    /// sticky assignments (used while Redis is unreachable) may use `sticky_budget` bytes.
    pub fn connect(config: RedisConfig, sticky_budget: usize) -> Self {
        Self {
            local: MemoryState::new(sticky_budget),
            link: Link::spawn(config.target, config.timeout, config.lag_limit),
            counters: ConcurrentMap::default(),
            ticket_block: config.ticket_block.clamp(1, MAX_TICKET_BLOCK),
        }
    }

    pub fn link(&self) -> &Arc<Link> {
        &self.link
    }

    fn counter(&self, key: &CounterKey) -> Arc<SharedCounter> {
        if let Some(counter) = self.counters.get(key) {
            return counter.clone();
        }
        self.counters
            .entry(key.clone())
            .or_insert_with(|| {
                SharedCounter::spawn(
                    keys::counter(key),
                    self.local.local_counter(key),
                    self.link.clone(),
                    self.ticket_block,
                )
            })
            .clone()
    }

    pub fn is_up(&self) -> bool {
        self.link.is_up()
    }
}

impl Tickets for RedisState {
    fn rotation<'c>(
        &self,
        cache: &'c RotationCache,
        rule: &str,
        key: impl FnOnce() -> CounterKey,
        picked: impl FnOnce() -> Arc<AtomicU64>,
    ) -> Cow<'c, Rotation> {
        let remote = |key: &CounterKey| Some(self.counter(key) as Arc<dyn RemoteCounter>);
        self.local.rotation_with(cache, rule, key, picked, remote)
    }

    async fn draw(&self, rotation: &Rotation) -> u64 {
        match rotation.remote() {
            Some(counter) => counter.draw(1).await,
            None => self.local.draw(rotation),
        }
    }

    fn reserve(&self, key: &CounterKey, count: u32) -> impl Future<Output = u64> + Send {
        let counter = self.counter(key);
        async move { counter.draw(count).await }
    }
}

impl Assignments for RedisState {
    async fn assigned(&self, key: &StickyKey) -> Option<Arc<str>> {
        let redis_key = keys::sticky(key);
        let remote =
            self.link
                .run(|mut conn| async move {
                    redis::cmd("GET").arg(&redis_key).query_async::<Option<String>>(&mut conn).await
                })
                .await;
        match remote {
            Some(found) => found.map(Arc::from),
            None => self.local.sticky_get(key),
        }
    }

    /// `SET … NX GET`: the first replica to assign a key wins; later claims read its choice.
    async fn claim(&self, key: StickyKey, id: Arc<str>, ttl: Duration) -> Arc<str> {
        let redis_key = keys::sticky(&key);
        let millis = ttl.as_millis().max(1) as u64;
        let value = id.clone();
        let earlier = self
            .link
            .run(|mut conn| async move {
                redis::cmd("SET")
                    .arg(&redis_key)
                    .arg(&*value)
                    .arg("NX")
                    .arg("GET")
                    .arg("PX")
                    .arg(millis)
                    .query_async::<Option<String>>(&mut conn)
                    .await
            })
            .await;
        match earlier {
            Some(Some(earlier)) => {
                let earlier: Arc<str> = earlier.into();
                self.local.sticky_set(key, earlier.clone(), ttl);
                earlier
            }
            Some(None) => {
                self.local.sticky_set(key, id.clone(), ttl);
                id
            }
            None => self.local.sticky_claim(key, id, ttl),
        }
    }

    async fn assign(&self, key: StickyKey, id: Arc<str>, ttl: Duration) {
        let redis_key = keys::sticky(&key);
        let millis = ttl.as_millis().max(1) as u64;
        let value = id.clone();
        self.link
            .run(|mut conn| async move {
                redis::cmd("SET").arg(&redis_key).arg(&*value).arg("PX").arg(millis).query_async::<()>(&mut conn).await
            })
            .await;
        // Also kept locally, to answer from while Redis is unreachable.
        self.local.sticky_set(key, id, ttl);
    }

    fn usage(&self) -> StickyUsage {
        self.local.sticky_usage()
    }

    /// Drops local sticky entries that expired, and drawers of rotations nobody used since the
    /// last round (their Redis counters expire on their own).
    fn housekeeping(&self) {
        self.counters.retain(|_, counter| Arc::strong_count(counter) > 1 || counter.take_used());
        Assignments::housekeeping(&self.local);
    }
}
