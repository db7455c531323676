//! The live instance table.
//!
//! Providers hold a [`Lease`] for as long as their registration stream is open; the instances
//! they announce belong to that lease and disappear with it. One task (`index`) owns the
//! mutable index and publishes an immutable [`Catalog`] of per-service [`ServiceSnapshot`]s
//! behind an `ArcSwap`, so a pick is one atomic load and a hash lookup, with no lock shared with
//! writers (the reader/writer split of linkerd's destination controller).

mod command;
mod error;
mod index;
mod instance;
mod layers;
mod lease;
mod snapshot;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use arc_swap::{ArcSwap, Guard};
use tokio::sync::{broadcast, mpsc, oneshot, watch};

pub use command::{InstanceRef, InstanceUpdate, Outcome};
pub use error::{InvalidField, Refused, RegistryClosed};
pub use instance::{
    DEFAULT_WEIGHT, Encoded, Instance, InstanceRecord, InstanceSpec, MAX_METADATA_ENTRIES, MAX_METADATA_KEY_LEN,
    MAX_METADATA_VALUE_LEN, MAX_NAME_LEN, RequestedStatus, Status, default_id, truncate, validate_optional_name,
    validate_service_name,
};
pub use layers::{
    Conditions, Health, MAX_OVERRIDES, OperatorStatus, Override, OverrideChange, OverrideList, OverrideRefused,
};
pub use lease::{Claim, Claims, Lease};

use lease::{Holder, ReservedPrefixes};
pub use snapshot::{ANY_LABEL, Catalog, Change, ServiceSnapshot, Subset, UNVERSIONED_LABEL, diff};

use command::Command;
use index::Index;

/// Default time a registration stream may stay silent before its instances are dropped.
pub const DEFAULT_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(15);
/// Default limit on the instances one registration stream may hold.
pub const DEFAULT_MAX_INSTANCES_PER_STREAM: usize = 1000;
/// Default time a service with no instance (and no watcher) is remembered.
pub const DEFAULT_SERVICE_IDLE_TIMEOUT: Duration = Duration::from_secs(600);
/// Default limit on services known at once.
pub const DEFAULT_MAX_SERVICES: usize = 100_000;
/// Default limit on services one token's registration streams hold instances in.
pub const DEFAULT_MAX_SERVICES_PER_TOKEN: usize = 1000;
/// Default time the server gathers changes into one publication (`publish_window`); a
/// [`RegistryConfig::default`] publishes every batch at once.
pub const DEFAULT_PUBLISH_WINDOW: Duration = Duration::from_millis(5);
/// Longest accepted publish window.
pub const MAX_PUBLISH_WINDOW: Duration = Duration::from_secs(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegistryConfig {
    pub heartbeat_timeout: Duration,
    pub max_instances_per_stream: usize,
    /// A service left with no instance and no watcher is forgotten after this long: picks then
    /// answer `NOT_FOUND` for it, and it costs nothing any more.
    pub service_idle_timeout: Duration,
    /// Services known at once (with instances, or empty and not yet forgotten); an announce
    /// that would add one more is refused.
    pub max_services: usize,
    /// Services in which the streams of one token hold instances at once.
    pub max_services_per_token: usize,
    /// Changes arriving within this long of the first one not yet published make one
    /// publication (and their acknowledgements go out together, once picks see them); a
    /// publication that took longer than this widens the next window to its own length, so
    /// publications never take more than half of one core. Zero publishes every batch at once.
    pub publish_window: Duration,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            heartbeat_timeout: DEFAULT_HEARTBEAT_TIMEOUT,
            max_instances_per_stream: DEFAULT_MAX_INSTANCES_PER_STREAM,
            service_idle_timeout: DEFAULT_SERVICE_IDLE_TIMEOUT,
            max_services: DEFAULT_MAX_SERVICES,
            max_services_per_token: DEFAULT_MAX_SERVICES_PER_TOKEN,
            publish_window: Duration::ZERO,
        }
    }
}

/// A cheap, cloneable handle on the registry: read snapshots, open leases, subscribe to changes.
#[derive(Clone)]
pub struct Registry {
    shared: Arc<Shared>,
}

struct Shared {
    tx: mpsc::UnboundedSender<Command>,
    catalog: Arc<ArcSwap<Catalog>>,
    next_lease: AtomicU64,
    config: RegistryConfig,
    generation: watch::Receiver<u64>,
    /// Leases not yet dropped: one per open registration stream.
    open_leases: Arc<AtomicUsize>,
    published: broadcast::Sender<Arc<[Arc<str>]>>,
    hooks: Hooks,
    claims: lease::ClaimsSlot,
    reserved: ReservedPrefixes,
    override_feed: OverrideFeed,
}

/// Where the registry tells of the operator overrides changed on this replica, once the
/// replicas share them: (service, id, the override now; empty when cleared).
pub(crate) type OverrideFeed = Arc<OnceLock<mpsc::UnboundedSender<OverrideChanged>>>;

/// One operator override changed on this replica: (service, id, the override now; empty when
/// cleared).
pub type OverrideChanged = (Arc<str>, Arc<str>, Override);

/// Work that must see a publication before the registry acknowledges the changes in it, such
/// as the balancer's pick views: a provider holding its ack relies on every later pick seeing
/// the change.
pub trait PublishHook: Send + Sync {
    /// `catalog` was just published; `services` changed in it (a name absent from the catalog
    /// was forgotten). Runs on the registry task: keep it short, move heavy work elsewhere.
    fn published(&self, catalog: &Catalog, services: &[Arc<str>]);
}

/// The hooks told of each publication; a hook is held weakly and forgotten once dropped.
#[derive(Clone, Default)]
pub(crate) struct Hooks(Arc<Mutex<Vec<Weak<dyn PublishHook>>>>);

impl Hooks {
    fn list(&self) -> std::sync::MutexGuard<'_, Vec<Weak<dyn PublishHook>>> {
        self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Tells every hook of `catalog`, then makes it the registry's current catalog, all under
    /// the list's lock: a hook added meanwhile ([`Registry::add_hook`]) starts either from a
    /// catalog this publication is in, or before it and is told of it.
    fn publish(&self, catalog: &Arc<Catalog>, services: &[Arc<str>], current: &ArcSwap<Catalog>) {
        let mut hooks = self.list();
        hooks.retain(|hook| hook.strong_count() > 0);
        for hook in hooks.iter().filter_map(Weak::upgrade) {
            hook.published(catalog, services);
        }
        current.store(catalog.clone());
    }
}

/// Publications a slow follower of [`Registry::published`] may fall behind by before it
/// misses some (it is told).
const PUBLISHED_BACKLOG: usize = 1024;

impl Registry {
    /// Starts the registry task on the current tokio runtime.
    pub fn spawn(config: RegistryConfig) -> Self {
        let catalog = Arc::new(ArcSwap::from_pointee(Catalog::default()));
        let (tx, rx) = mpsc::unbounded_channel();
        let (generation_tx, generation) = watch::channel(0);
        let (published, _) = broadcast::channel(PUBLISHED_BACKLOG);
        let hooks = Hooks::default();
        let override_feed = OverrideFeed::default();
        let index =
            Index::new(config, catalog.clone(), generation_tx, published.clone(), hooks.clone(), override_feed.clone());
        tokio::spawn(index.run(rx));
        let open_leases = Arc::default();
        Self {
            shared: Arc::new(Shared {
                tx,
                catalog,
                next_lease: AtomicU64::new(1),
                config,
                generation,
                open_leases,
                published,
                hooks,
                claims: Arc::default(),
                reserved: Arc::default(),
                override_feed,
            }),
        }
    }

    /// The current catalog: lock-free, and consistent across services.
    pub fn catalog(&self) -> Guard<Arc<Catalog>> {
        self.shared.catalog.load()
    }

    /// The current snapshot of one service, if it has ever been registered.
    pub fn service(&self, name: &str) -> Option<Arc<ServiceSnapshot>> {
        self.catalog().get(name).cloned()
    }

    /// Tells `hook` of every later publication (until it is dropped), after `start` has run
    /// with the catalog published before: the hook's owner starts from it. Nothing is published
    /// between the two, so the hook misses no publication and is told none that `start` saw.
    pub fn add_hook(&self, hook: Weak<dyn PublishHook>, start: impl FnOnce(&Catalog)) {
        let mut hooks = self.shared.hooks.list();
        start(&self.shared.catalog.load());
        hooks.push(hook);
    }

    /// The names of the services each publication changed.
    pub fn published(&self) -> broadcast::Receiver<Arc<[Arc<str>]>> {
        self.shared.published.subscribe()
    }

    /// Changes whenever a new catalog is published.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.shared.generation.clone()
    }

    pub fn config(&self) -> RegistryConfig {
        self.shared.config
    }

    /// Leases currently open, i.e. registration streams.
    pub fn open_leases(&self) -> usize {
        self.shared.open_leases.load(Ordering::Relaxed)
    }

    /// Opens a lease for one registration stream.
    pub fn open_lease(&self) -> Lease {
        self.open_lease_for(None)
    }

    /// Opens a lease for one registration stream authenticated as `token` (its name), whose
    /// services count against that token's limit.
    pub fn open_lease_for(&self, token: Option<Arc<str>>) -> Lease {
        let holder = Holder::Stream { claims: self.shared.claims.clone(), reserved: self.shared.reserved.clone() };
        self.open(holder, token, self.shared.config.max_instances_per_stream)
    }

    /// From now on, registration streams claim their ids through `claims` before announcing
    /// them (rota replicas sharing one table). Set once; a second call is ignored.
    pub fn claim_ids_through(&self, claims: Arc<dyn Claims>) {
        let _ = self.shared.claims.set(claims);
    }

    /// Opens a lease that may hold up to `max_instances` instances: the registry's own copy of
    /// instances another rota replica holds, which are not limited like one provider's stream.
    pub fn open_mirror_lease(&self, max_instances: usize) -> Lease {
        self.open(Holder::Mirror, None, max_instances)
    }

    /// Opens the lease of a source rota follows (`[[source]]` named `source`), holding up to
    /// `max_instances`: it never expires (it lives as long as the source's task), its instances
    /// are marked with the source's name, and from now on no registration stream may announce
    /// an id starting with `source:`, the source's namespace.
    pub fn open_source_lease(&self, source: &str, max_instances: usize) -> Lease {
        let prefix: Arc<str> = format!("{source}:").into();
        let mut reserved = self.shared.reserved.write().unwrap_or_else(|poisoned| poisoned.into_inner());
        if !reserved.contains(&prefix) {
            reserved.push(prefix);
        }
        drop(reserved);
        self.open(Holder::Source(source.into()), None, max_instances)
    }

    fn open(&self, holder: Holder, token: Option<Arc<str>>, max_instances: usize) -> Lease {
        let id = self.shared.next_lease.fetch_add(1, Ordering::Relaxed);
        Lease::open(
            id,
            holder,
            token,
            self.shared.tx.clone(),
            self.shared.config.heartbeat_timeout,
            max_instances,
            self.shared.open_leases.clone(),
        )
    }

    /// Records the active health check's verdict on a registered instance (`None` clears it):
    /// a failing UP instance is published DOWN until it passes again. Ignored for an instance
    /// not registered (any more).
    pub fn set_health(&self, service: &Arc<str>, id: &Arc<str>, health: Option<Health>) {
        let _ = self.shared.tx.send(Command::SetHealth { service: service.clone(), id: id.clone(), health });
    }

    /// Changes an operator's override of one instance (registered or not: it applies whenever
    /// the instance is), published before this returns. Answers the override now and whether
    /// the instance is registered.
    pub async fn change_override(
        &self,
        service: &str,
        id: &str,
        change: OverrideChange,
    ) -> Result<Result<(Override, bool), OverrideRefused>, RegistryClosed> {
        let (reply, answer) = oneshot::channel();
        let command = Command::ChangeOverride { service: service.into(), id: id.into(), change, reply };
        self.shared.tx.send(command).map_err(|_| RegistryClosed)?;
        answer.await.map_err(|_| RegistryClosed)
    }

    /// From now on, tells the returned receiver of every operator override changed here (the
    /// replicas share them). `None` when something follows them already.
    pub fn follow_override_changes(&self) -> Option<mpsc::UnboundedReceiver<OverrideChanged>> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.shared.override_feed.set(tx).ok()?;
        Some(rx)
    }

    /// Replaces every operator override with `all` (what the replicas share), at most
    /// [`MAX_OVERRIDES`]; not told to the follower of changes.
    pub fn replace_overrides(&self, all: OverrideList) {
        let _ = self.shared.tx.send(Command::ReplaceOverrides { all });
    }

    /// Every operator override, by service then id.
    pub async fn overrides(&self) -> Result<OverrideList, RegistryClosed> {
        let (reply, answer) = oneshot::channel();
        self.shared.tx.send(Command::ListOverrides { reply }).map_err(|_| RegistryClosed)?;
        answer.await.map_err(|_| RegistryClosed)
    }

    /// Follows one service's snapshots. The receiver starts at the current snapshot (an empty
    /// one at epoch 0 if the service has never been registered) and sees every later one.
    pub async fn subscribe(&self, service: &str) -> Result<watch::Receiver<Arc<ServiceSnapshot>>, RegistryClosed> {
        let (reply, answer) = oneshot::channel();
        self.shared.tx.send(Command::Subscribe { service: service.into(), reply }).map_err(|_| RegistryClosed)?;
        answer.await.map_err(|_| RegistryClosed)
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
pub(crate) use snapshot::tests as snapshot_tests;
