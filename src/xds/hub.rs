//! The resources every xDS stream reads, built once per change of a service, whatever the
//! number of streams.
//!
//! The hub keeps, for each service some stream subscribed to, how many streams did (its
//! *interest*) and the service's encoded resources with the fingerprint they were built from:
//! the service's snapshot epoch, the policy in force, and the instances ejected now. One task
//! rebuilds what changed — the services a publication names, at once; and every [`POLL`], all
//! of them if something changed without a publication (a new policy set, an ejection started,
//! moved or ended), which costs a few loads to tell when nothing did — and bumps a generation
//! every stream waits on. A stream then takes the
//! resources it subscribed to from the hub: a push costs one build per change, not one per
//! stream.
//!
//! Interest is keyed by names clients send, so it is bounded: a subscription past
//! [`XdsLimits::max_subscriptions`] across every stream, or past a quarter of it from one
//! client address, is refused. What each stream holds for its client (its names, what it sent)
//! is charged to [`Hub::memory`] before it grows: [`XdsLimits::max_bytes`] in all, a quarter of
//! it per client address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::resources::{self, ServiceResources};
use crate::balancer::Overview;
use crate::budget::Budget;
use crate::policy::Policy;

/// How often the hub looks for changes no publication announces.
pub const POLL: Duration = Duration::from_millis(100);

/// Bounds of what xDS clients may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XdsLimits {
    /// Resource names one stream may subscribe to, per resource type.
    pub max_names_per_stream: usize,
    /// Services subscribed to, summed over every stream.
    pub max_subscriptions: usize,
    /// Bytes the streams' subscriptions and responses hold, summed over every stream.
    pub max_bytes: usize,
}

/// One client address may hold this part of [`XdsLimits::max_subscriptions`] and
/// [`XdsLimits::max_bytes`]: a quarter, so no one peer can refuse the others.
pub const PEER_SHARE: usize = 4;

pub const DEFAULT_MAX_NAMES_PER_STREAM: usize = 1_000;
pub const DEFAULT_MAX_SUBSCRIPTIONS: usize = 100_000;
pub const DEFAULT_MAX_BYTES: usize = 256 << 20;
/// Longest resource name accepted.
pub const MAX_NAME_BYTES: usize = 512;
/// The bytes of every name one stream subscribes to, over all types: what a stream may make
/// rota hold for it, whatever its names.
pub const MAX_NAME_BYTES_PER_STREAM: usize = 256 << 10;

impl Default for XdsLimits {
    fn default() -> Self {
        Self {
            max_names_per_stream: DEFAULT_MAX_NAMES_PER_STREAM,
            max_subscriptions: DEFAULT_MAX_SUBSCRIPTIONS,
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

/// What the admin listener shows of xDS.
#[derive(Debug, Default)]
pub struct XdsCounters {
    pub streams: AtomicUsize,
    pub subscriptions: AtomicUsize,
    pub responses: AtomicU64,
    pub acks: AtomicU64,
    pub nacks: AtomicU64,
    /// Requests for a resource type rota does not serve.
    pub unknown_types: AtomicU64,
    /// Streams ended because a bound was reached.
    pub refused: AtomicU64,
    pub builds: AtomicU64,
}

/// What a service's resources were built from.
#[derive(Debug, Clone, PartialEq)]
struct Fingerprint {
    epoch: u64,
    policy: Arc<Policy>,
    ejected: Vec<Arc<str>>,
    /// When the first of those ejections ends.
    ejection_ends: Option<Instant>,
}

/// What the last full look saw of the changes no publication announces.
#[derive(Debug, Default)]
struct Watched {
    policies: Option<Arc<crate::policy::PolicySet>>,
    ejection_changes: u64,
    /// The earliest end of an ejection some build read.
    next_end: Option<Instant>,
}

/// What the streams subscribed to.
#[derive(Debug, Default)]
struct Entries {
    services: HashMap<Arc<str>, Entry>,
    /// Subscriptions per client address, for addresses with some.
    peers: HashMap<IpAddr, usize>,
}

#[derive(Debug, Default)]
struct Entry {
    interest: usize,
    built: Option<(Fingerprint, Arc<Built>)>,
}

/// One service's resources as streams send them.
#[derive(Debug)]
pub struct Built {
    pub resources: ServiceResources,
}

pub struct Hub {
    overview: Overview,
    limits: XdsLimits,
    /// Until then, a service this server has not seen yet is withheld, not reported absent:
    /// a restarted rota must not make clients drop resources their providers are bringing back.
    warmup_ends: Instant,
    /// During the warm-up, a service seen but whose instances are still arriving is withheld
    /// until they have paused this long (as the gRPC API holds it back).
    settle: Duration,
    entries: Mutex<Entries>,
    /// What streams hold for their clients.
    memory: Arc<Budget>,
    warmup_over: AtomicBool,
    watched: Mutex<Watched>,
    generation: watch::Sender<u64>,
    pub counters: XdsCounters,
}

impl std::fmt::Debug for Hub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hub").field("limits", &self.limits).field("counters", &self.counters).finish_non_exhaustive()
    }
}

/// The subscription was refused: past the bound across every stream, or past one address's
/// share of it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TooManySubscriptions {
    #[error(
        "rota already holds {limit} xDS subscriptions across every stream (server.max_xds_subscriptions); subscribe to fewer resources"
    )]
    Total { limit: usize },
    #[error(
        "{peer} already holds {share} xDS subscriptions, one client address's share (a quarter of server.max_xds_subscriptions); subscribe to fewer resources"
    )]
    Peer { peer: IpAddr, share: usize },
}

/// A resource as a stream looks it up.
#[derive(Debug)]
pub enum Lookup {
    Found(Arc<Built>),
    /// The service does not exist (after the warm-up, or never could).
    Absent,
    /// Not known yet during the warm-up: answer nothing for it.
    Pending,
}

impl Hub {
    pub fn new(overview: Overview, limits: XdsLimits, warmup: Duration, settle: Duration) -> Arc<Self> {
        Arc::new(Self {
            overview,
            limits,
            warmup_ends: Instant::now() + warmup,
            settle,
            entries: Mutex::new(Entries::default()),
            memory: Budget::new("xds", "server.max_xds_bytes", limits.max_bytes, limits.max_bytes / PEER_SHARE),
            warmup_over: AtomicBool::new(false),
            watched: Mutex::new(Watched::default()),
            generation: watch::Sender::new(0),
            counters: XdsCounters::default(),
        })
    }

    /// The balancer behind the overview, for tests that pick, report or set policies.
    #[cfg(test)]
    pub fn balancer(&self) -> &Arc<crate::balancer::Balancer> {
        self.overview.balancer()
    }

    pub fn limits(&self) -> XdsLimits {
        self.limits
    }

    /// Changes when any subscribed service's resources do.
    pub fn generations(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// What the streams hold for their clients.
    pub fn memory(&self) -> &Arc<Budget> {
        &self.memory
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Entries> {
        self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Adds one stream's interest in each of `added` and drops it from each of `removed`;
    /// refused, changing nothing, when the total would pass the bound or `peer`'s would pass
    /// its share.
    pub fn interest(
        &self,
        peer: Option<IpAddr>,
        added: &[Arc<str>],
        removed: &[Arc<str>],
    ) -> Result<(), TooManySubscriptions> {
        let mut guard = self.lock();
        let Entries { services: entries, peers } = &mut *guard;
        let total = self.counters.subscriptions.load(Ordering::Relaxed);
        if total + added.len() > self.limits.max_subscriptions + removed.len() {
            return Err(TooManySubscriptions::Total { limit: self.limits.max_subscriptions });
        }
        if let Some(peer) = peer {
            let share = (self.limits.max_subscriptions / PEER_SHARE).max(1);
            let mine = peers.get(&peer).copied().unwrap_or(0);
            if added.len() > removed.len() && mine + added.len() - removed.len() > share {
                return Err(TooManySubscriptions::Peer { peer, share });
            }
            let now = mine + added.len() - removed.len();
            if now == 0 {
                peers.remove(&peer);
            } else {
                peers.insert(peer, now);
            }
        }
        for service in removed {
            if let Some(entry) = entries.get_mut(service) {
                entry.interest -= 1;
                if entry.interest == 0 {
                    entries.remove(service);
                }
            }
        }
        for service in added {
            entries.entry(service.clone()).or_default().interest += 1;
        }
        let now = total + added.len() - removed.len();
        self.counters.subscriptions.store(now, Ordering::Relaxed);
        Ok(())
    }

    /// The resources of `service`, built now if they were not yet.
    pub fn lookup(&self, service: &str) -> Lookup {
        if let Some(entry) = self.lock().services.get(service)
            && let Some((_, built)) = &entry.built
        {
            return Lookup::Found(built.clone());
        }
        match self.fingerprint(service) {
            Some((snapshot, _)) if self.withheld(&snapshot) => Lookup::Pending,
            Some((snapshot, fingerprint)) => {
                let built = self.build(&snapshot, &fingerprint);
                if let Some(entry) = self.lock().services.get_mut(service)
                    && entry.built.is_none()
                {
                    entry.built = Some((fingerprint, built.clone()));
                }
                Lookup::Found(built)
            }
            None if Instant::now() < self.warmup_ends => Lookup::Pending,
            None => Lookup::Absent,
        }
    }

    /// What `service`'s resources would be built from now; `None` while it was never seen.
    fn fingerprint(&self, service: &str) -> Option<(Arc<crate::registry::ServiceSnapshot>, Fingerprint)> {
        let snapshot = self.overview.service(service).filter(|s| s.epoch > 0)?;
        let policy = self.overview.policies().for_service(service).clone();
        let now = Instant::now();
        let mut ejected = Vec::new();
        let mut ejection_ends = None;
        if policy.ejection.enabled {
            let ejections = self.overview.ejections(&snapshot.name);
            if !ejections.is_empty() {
                ejection_ends = ejections.next_end(now);
                ejected = snapshot
                    .instances
                    .iter()
                    .filter(|i| ejections.contains(&i.id, now))
                    .map(|i| i.id.clone())
                    .collect();
            }
        }
        Some((snapshot.clone(), Fingerprint { epoch: snapshot.epoch, policy, ejected, ejection_ends }))
    }

    fn build(&self, snapshot: &crate::registry::ServiceSnapshot, fingerprint: &Fingerprint) -> Arc<Built> {
        self.counters.builds.fetch_add(1, Ordering::Relaxed);
        self.note_end(fingerprint.ejection_ends);
        let ejected = |instance: &crate::registry::Instance| fingerprint.ejected.contains(&instance.id);
        let resources = resources::build(snapshot, &fingerprint.policy, &ejected);
        Arc::new(Built { resources })
    }

    /// Rebuilds every subscribed service whose fingerprint moved; bumps the generation when one
    /// did (or when a built service is gone).
    pub fn refresh(&self) {
        let services: Vec<Arc<str>> = self.lock().services.keys().cloned().collect();
        let mut watched = self.lock_watched();
        watched.policies = Some(self.overview.policies_full());
        watched.ejection_changes = self.overview.ejection_changes();
        watched.next_end = None;
        drop(watched);
        let changed = self.refresh_services(&services);
        if !changed && Instant::now() >= self.warmup_ends && self.pending_warmup_end() {
            self.generation.send_modify(|g| *g += 1);
        }
    }

    /// Rebuilds those of `services` that are subscribed and whose fingerprint moved; bumps the
    /// generation when one did. Whether anything changed.
    pub fn refresh_services(&self, services: &[Arc<str>]) -> bool {
        let mut changed = false;
        for service in services {
            let Some(old) = self.lock().services.get(service).map(|entry| entry.built.as_ref().map(|(f, _)| f.clone()))
            else {
                continue;
            };
            match (self.fingerprint(service), old) {
                (Some((_, new)), Some(old)) if new == old => {}
                (Some((snapshot, _)), None) if self.withheld(&snapshot) => {}
                (Some((snapshot, new)), _) => {
                    let built = self.build(&snapshot, &new);
                    if let Some(entry) = self.lock().services.get_mut(service) {
                        entry.built = Some((new, built));
                        changed = true;
                    }
                }
                (None, Some(_)) => {
                    if let Some(entry) = self.lock().services.get_mut(service) {
                        entry.built = None;
                        changed = true;
                    }
                }
                (None, None) => {}
            }
        }
        if changed {
            self.generation.send_modify(|g| *g += 1);
        }
        changed
    }

    /// Looks for what changes without a publication: a new policy set, an ejection that
    /// started, moved or ended (early, or at its end). Costs a few loads when nothing did;
    /// only then does every subscribed service get looked at.
    pub fn tick(&self) {
        let now = Instant::now();
        let due = {
            let watched = self.lock_watched();
            let policies = self.overview.policies();
            !watched.policies.as_ref().is_some_and(|seen| Arc::ptr_eq(seen, &policies))
                || watched.ejection_changes != self.overview.ejection_changes()
                || watched.next_end.is_some_and(|end| end <= now)
                || now >= self.warmup_ends && !self.warmup_over.load(Ordering::Relaxed)
        };
        if due {
            self.refresh();
        }
    }

    fn lock_watched(&self) -> std::sync::MutexGuard<'_, Watched> {
        self.watched.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Notes when an ejection a build read ends, so the tick after it rebuilds.
    fn note_end(&self, end: Option<Instant>) {
        if let Some(end) = end {
            let mut watched = self.lock_watched();
            watched.next_end = Some(watched.next_end.map_or(end, |known| known.min(end)));
        }
    }

    /// Whether a service not answered yet is withheld because its instances are still
    /// arriving during the warm-up; notes when that ends, so the tick after it builds.
    fn withheld(&self, snapshot: &crate::registry::ServiceSnapshot) -> bool {
        let until = snapshot.settling_until(self.settle, self.warmup_ends);
        self.note_end(until);
        until.is_some()
    }

    /// True once, at the first refresh after the warm-up: withheld answers are due.
    fn pending_warmup_end(&self) -> bool {
        !self.warmup_over.swap(true, Ordering::Relaxed)
    }

    /// The task that keeps the hub current, for as long as the hub lives: the services each
    /// publication changed at once, the rest at every [`POLL`].
    pub fn spawn(self: &Arc<Self>) -> tokio::task::JoinHandle<()> {
        let hub = Arc::downgrade(self);
        let mut published = self.overview.published();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(POLL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let changed = tokio::select! {
                    changed = published.recv() => match changed {
                        Ok(services) => Some(Some(services)),
                        // Publications were missed: look at everything.
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => Some(None),
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    },
                    _ = tick.tick() => None,
                };
                let Some(hub) = hub.upgrade() else { return };
                match changed {
                    Some(Some(services)) => {
                        hub.refresh_services(&services);
                    }
                    Some(None) => hub.refresh(),
                    None => hub.tick(),
                }
            }
        })
    }
}
