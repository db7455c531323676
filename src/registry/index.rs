//! The registry task: the one owner of the mutable instance index.
//!
//! Registration streams never touch the index; they send [`Command`]s over a channel. The task
//! applies every queued command, then publishes a fresh [`ServiceSnapshot`] for each service
//! those commands changed, all at once in one new [`Catalog`]. One writer means no
//! read-modify-swap races between streams, and draining the queue before publishing batches a
//! burst of registrations into one snapshot per service.
//!
//! Changes are gathered for a short window ([`super::RegistryConfig::publish_window`], from the
//! first change not yet published) before they are published together, so a churn of single
//! changes costs a bounded number of publications a second, not one per change; a publication
//! that took longer than the window widens the next one to its own length.
//!
//! Acknowledgements are sent only after the snapshot carrying their change is published: once a
//! provider holds its ack, every pick sees the change.
//!
//! The task also expires leases: every message on a stream pushes its lease's deadline forward
//! by the heartbeat timeout, and a lease whose deadline passes loses its instances.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use arc_swap::ArcSwap;
use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::time::Instant;
use tracing::{debug, info};

use super::RegistryConfig;
use super::command::{Command, InstanceRef, LeaseId, Outcome, ValidUpdate};
use super::error::Refused;
use super::instance::Instance;
use super::snapshot::{Catalog, ServiceSnapshot};

/// Most commands applied before a snapshot is published, so a flood of registrations cannot
/// hold back publication indefinitely.
const MAX_BATCH: usize = 1024;

struct Owned {
    lease: LeaseId,
    instance: Arc<Instance>,
}

#[derive(Default)]
struct ServiceEntry {
    instances: BTreeMap<Arc<str>, Owned>,
    epoch: u64,
    /// Since when the service has had no instance.
    empty_since: Option<Instant>,
}

struct LeaseEntry {
    /// The token the stream authenticated with, if any.
    token: Option<Arc<str>>,
    /// Instances the lease may hold at once.
    limit: usize,
    /// `None` for a lease that never expires (a source's, which lives as long as its task).
    deadline: Option<Instant>,
    /// Ordered, so a withdraw-all acknowledges instances in a stable order.
    owned: BTreeSet<(Arc<str>, Arc<str>)>,
    expired: Option<oneshot::Sender<()>>,
}

pub(crate) struct Index {
    config: RegistryConfig,
    services: HashMap<Arc<str>, ServiceEntry>,
    leases: HashMap<LeaseId, LeaseEntry>,
    deadlines: BTreeSet<(Instant, LeaseId)>,
    watchers: HashMap<Arc<str>, watch::Sender<Arc<ServiceSnapshot>>>,
    dirty: HashSet<Arc<str>>,
    /// Services that became empty, oldest first, with the moment they did; each is checked
    /// (still empty since then, nobody watching) when its idle timeout is up.
    emptied: VecDeque<(Instant, Arc<str>)>,
    /// Services forgotten since the last publication.
    forgotten: Vec<Arc<str>>,
    /// Per token, the services its streams hold instances in, with how many.
    token_services: HashMap<Arc<str>, HashMap<Arc<str>, usize>>,
    catalog: Arc<ArcSwap<Catalog>>,
    published: Catalog,
    /// Acknowledgements held back until the changes they report are published, so a provider
    /// that has its ack can rely on every later pick seeing the change.
    replies: Vec<(oneshot::Sender<Outcome>, Outcome)>,
    /// Expiry notices of leases whose removal waits for a publication: a stream told its lease
    /// expired may tell its provider, who may look, so the removal is published first.
    expiries: Vec<oneshot::Sender<()>>,
    /// Bumped after every publication, for waiters that re-pick when instances change.
    generation: watch::Sender<u64>,
    /// The services each publication changed, for work that follows a publication (building
    /// the tables picks will want) without holding up the registry.
    published_names: broadcast::Sender<Arc<[Arc<str>]>>,
    /// Told of each publication before its acknowledgements go out.
    hooks: super::Hooks,
    /// What rota lays over announced instances (operator overrides, health verdicts).
    layers: super::layers::Layers,
    /// Told of each operator override changed here (the replicas share them).
    override_feed: super::OverrideFeed,
}

impl Index {
    pub(crate) fn new(
        config: RegistryConfig,
        catalog: Arc<ArcSwap<Catalog>>,
        generation: watch::Sender<u64>,
        published_names: broadcast::Sender<Arc<[Arc<str>]>>,
        hooks: super::Hooks,
        override_feed: super::OverrideFeed,
    ) -> Self {
        Self {
            config,
            services: HashMap::new(),
            leases: HashMap::new(),
            deadlines: BTreeSet::new(),
            watchers: HashMap::new(),
            dirty: HashSet::new(),
            emptied: VecDeque::new(),
            forgotten: Vec::new(),
            token_services: HashMap::new(),
            catalog,
            published: Catalog::default(),
            replies: Vec::new(),
            expiries: Vec::new(),
            generation,
            published_names,
            hooks,
            layers: Default::default(),
            override_feed,
        }
    }

    /// Runs until every sender (the registry handle and all leases) is gone.
    pub(crate) async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Command>) {
        // The publication the changes applied so far wait for, if any, and the window the
        // next one gathers changes for.
        let mut publish_at: Option<Instant> = None;
        let mut window = self.config.publish_window;
        loop {
            let next_deadline = self.deadlines.first().map(|(deadline, _)| *deadline);
            let next_forget = self.emptied.front().map(|(since, _)| *since + self.config.service_idle_timeout);
            tokio::select! {
                command = rx.recv() => {
                    let Some(command) = command else { break };
                    self.apply(command);
                    self.apply_queued(&mut rx);
                }
                () = sleep_until(next_deadline) => self.on_deadline(&mut rx, Instant::now()),
                () = sleep_until(next_forget) => self.forget_idle_services(Instant::now()),
                () = sleep_until(publish_at) => {}
            }
            if !self.has_unpublished() {
                publish_at = None;
                continue;
            }
            let now = Instant::now();
            let due = *publish_at.get_or_insert(now + window);
            if now >= due {
                self.publish();
                publish_at = None;
                if !window.is_zero() {
                    window = self.config.publish_window.max(now.elapsed());
                }
            }
        }
        self.publish();
        debug!("registry task stopped");
    }

    /// Whether changes or acknowledgements wait for a publication.
    fn has_unpublished(&self) -> bool {
        !self.dirty.is_empty() || !self.forgotten.is_empty() || !self.replies.is_empty() || !self.expiries.is_empty()
    }

    /// A lease deadline passed. A heartbeat already waiting in the queue was sent before the
    /// deadline was noticed: it wins, so the queue is applied before anything expires.
    fn on_deadline(&mut self, rx: &mut mpsc::UnboundedReceiver<Command>, now: Instant) {
        self.apply_queued(rx);
        self.expire_due(now);
    }

    /// Applies what is already queued, up to [`MAX_BATCH`] commands.
    fn apply_queued(&mut self, rx: &mut mpsc::UnboundedReceiver<Command>) {
        for _ in 1..MAX_BATCH {
            match rx.try_recv() {
                Ok(command) => self.apply(command),
                Err(_) => break,
            }
        }
    }

    fn apply(&mut self, command: Command) {
        match command {
            Command::Open { lease, token, limit, expires, expired } => {
                let deadline = expires.then(|| Instant::now() + self.config.heartbeat_timeout);
                if let Some(deadline) = deadline {
                    self.deadlines.insert((deadline, lease));
                }
                let entry = LeaseEntry { token, limit, deadline, owned: BTreeSet::new(), expired: Some(expired) };
                self.leases.insert(lease, entry);
            }
            Command::Announce { lease, instances, reply } => {
                self.touch(lease);
                let outcome = self.announce(lease, instances);
                self.replies.push((reply, outcome));
            }
            Command::Update { lease, update, reply } => {
                self.touch(lease);
                let outcome = self.update(lease, update);
                self.replies.push((reply, outcome));
            }
            Command::Withdraw { lease, refs, reply } => {
                self.touch(lease);
                let outcome = self.withdraw(lease, refs);
                self.replies.push((reply, outcome));
            }
            Command::Touch { lease } => self.touch(lease),
            Command::Close { lease } => self.close(lease, "stream closed"),
            Command::Subscribe { service, reply } => {
                // Publish first so the subscriber starts from a state that includes every
                // command sent before it subscribed.
                self.publish();
                let _ = reply.send(self.subscribe(service));
            }
            Command::ChangeOverride { service, id, change, reply } => {
                let answer = self.change_override(&service, &id, change);
                // Published before the answer, so that every pick after it sees the change.
                self.publish();
                let _ = reply.send(answer);
            }
            Command::ReplaceOverrides { all } => {
                for service in self.layers.replace_overrides(all) {
                    if self.services.contains_key(&service) {
                        self.dirty.insert(service);
                    }
                }
            }
            Command::ListOverrides { reply } => {
                let _ = reply.send(self.layers.overrides());
            }
            Command::SetHealth { service, id, health } => {
                // Only a registered instance has a verdict, so the verdicts stay bounded.
                let registered = self.services.get(&service).is_some_and(|s| s.instances.contains_key(&id));
                if registered && self.layers.set_health(&service, &id, health) {
                    self.dirty.insert(service);
                }
            }
        }
    }

    fn change_override(
        &mut self,
        service: &Arc<str>,
        id: &Arc<str>,
        change: super::layers::OverrideChange,
    ) -> Result<(super::layers::Override, bool), super::layers::OverrideRefused> {
        use super::layers::{OverrideChange, OverrideRefused};
        let before = self.layers.operator(service, id);
        let nothing = match change {
            OverrideChange::Enable if before.status.is_none() => Some("status"),
            OverrideChange::Clear if before.is_empty() => Some("operator"),
            _ => None,
        };
        if let Some(what) = nothing {
            return Err(OverrideRefused::NothingToClear { service: service.to_string(), id: id.to_string(), what });
        }
        let after = before.changed(change);
        self.layers.set_override(service, id, after).ok_or(OverrideRefused::TooMany)?;
        let registered = self.services.get(service).is_some_and(|s| s.instances.contains_key(id));
        if after != before
            && let Some(feed) = self.override_feed.get()
        {
            let _ = feed.send((service.clone(), id.clone(), after));
        }
        if registered && after != before {
            info!(%service, %id, operator = %after.describe(), "operator override");
            self.dirty.insert(service.clone());
        }
        Ok((after, registered))
    }

    fn touch(&mut self, lease: LeaseId) {
        let Some(entry) = self.leases.get_mut(&lease) else { return };
        let Some(deadline) = entry.deadline else { return };
        self.deadlines.remove(&(deadline, lease));
        let deadline = Instant::now() + self.config.heartbeat_timeout;
        entry.deadline = Some(deadline);
        self.deadlines.insert((deadline, lease));
    }

    fn announce(&mut self, lease: LeaseId, instances: Vec<Instance>) -> Outcome {
        let mut outcome = Outcome::default();
        let Some(entry) = self.leases.get(&lease) else {
            outcome.refuse_all(instances.iter().map(InstanceRef::of), Refused::ShuttingDown);
            return outcome;
        };
        // The stream limit counts distinct instances after this message, so re-announcing
        // owned instances never trips it.
        let new_keys: HashSet<(Arc<str>, Arc<str>)> = instances
            .iter()
            .map(|i| (i.service.clone(), i.id.clone()))
            .filter(|key| !entry.owned.contains(key))
            .collect();
        let count = entry.owned.len() + new_keys.len();
        if count > entry.limit {
            let limit = entry.limit;
            outcome.refuse_all(instances.iter().map(InstanceRef::of), Refused::TooManyInstances { count, limit });
            return outcome;
        }
        let token = entry.token.clone();
        for instance in instances {
            let key = (instance.service.clone(), instance.id.clone());
            if let Some(refusal) = self.over_service_limit(&key.0, token.as_ref()) {
                outcome.refuse(InstanceRef::of(&instance), refusal);
                continue;
            }
            let service = self.services.entry(instance.service.clone()).or_default();
            let previous = service.instances.get(&instance.id);
            if let Some(owner) = previous
                && owner.lease != lease
            {
                outcome.refuse(InstanceRef::of(&instance), Refused::OwnedElsewhere { service: key.0, id: key.1 });
                continue;
            }
            let is_new = previous.is_none();
            let instance = instance.registered_after(previous.map(|owned| &*owned.instance), Instant::now());
            info!(service = %instance.service, id = %instance.id, lease, "registered");
            outcome.accepted.push(InstanceRef::of(&instance));
            self.dirty.insert(key.0.clone());
            service.empty_since = None;
            service.instances.insert(key.1.clone(), Owned { lease, instance: Arc::new(instance) });
            if let Some(entry) = self.leases.get_mut(&lease) {
                entry.owned.insert(key.clone());
            }
            if is_new && let Some(token) = &token {
                *self.token_services.entry(token.clone()).or_default().entry(key.0).or_default() += 1;
            }
        }
        outcome
    }

    /// Why a new instance of `service` would break a service limit, if it would: a service not
    /// known yet beyond the registry's limit, or one the token holds nothing in yet beyond the
    /// token's limit.
    fn over_service_limit(&self, service: &Arc<str>, token: Option<&Arc<str>>) -> Option<Refused> {
        if !self.services.contains_key(service) && self.services.len() >= self.config.max_services {
            let limit = self.config.max_services;
            return Some(Refused::TooManyServices {
                service: service.clone(),
                holder: "the registry".into(),
                limit,
                key: "max_services",
            });
        }
        let token = token?;
        let held = self.token_services.get(token);
        let limit = self.config.max_services_per_token;
        if held.is_some_and(|held| !held.contains_key(service) && held.len() >= limit) {
            return Some(Refused::TooManyServices {
                service: service.clone(),
                holder: format!("token {token:?}"),
                limit,
                key: "max_services_per_token",
            });
        }
        None
    }

    fn update(&mut self, lease: LeaseId, update: ValidUpdate) -> Outcome {
        let mut outcome = Outcome::default();
        let target = InstanceRef { service: update.service.clone(), id: update.id.clone() };
        let owned = self
            .services
            .get_mut(update.service.as_str())
            .and_then(|service| service.instances.get_mut(update.id.as_str()))
            .filter(|owned| owned.lease == lease);
        let Some(owned) = owned else {
            let refusal = Refused::NotOwned { service: update.service.into(), id: update.id.into() };
            outcome.refuse(target, refusal);
            return outcome;
        };
        let mut instance = Instance::clone(&owned.instance);
        if let Some(weight) = update.weight {
            instance.weight = weight;
        }
        if let Some(status) = update.status {
            instance.status = status;
        }
        let mut instance = instance.registered_after(Some(&owned.instance), Instant::now());
        if let Some(metadata) = update.metadata {
            instance.metadata = metadata;
        }
        if instance != *owned.instance {
            info!(service = %instance.service, id = %instance.id, status = instance.status.as_str(), "updated");
            self.dirty.insert(instance.service.clone());
            owned.instance = Arc::new(instance);
        }
        outcome.accepted.push(target);
        outcome
    }

    fn withdraw(&mut self, lease: LeaseId, refs: Vec<InstanceRef>) -> Outcome {
        let mut outcome = Outcome::default();
        let Some(entry) = self.leases.get_mut(&lease) else { return outcome };
        let targets: Vec<(Arc<str>, Arc<str>)> = if refs.is_empty() {
            entry.owned.iter().cloned().collect()
        } else {
            let mut targets = Vec::new();
            for r in refs {
                match entry.owned.iter().find(|(s, i)| **s == *r.service && **i == *r.id) {
                    Some(key) => targets.push(key.clone()),
                    None => {
                        let refusal =
                            Refused::NotOwned { service: r.service.as_str().into(), id: r.id.as_str().into() };
                        outcome.refuse(r, refusal);
                    }
                }
            }
            targets
        };
        for key in targets {
            self.remove(lease, &key, "withdrawn");
            outcome.accepted.push(InstanceRef { service: key.0.to_string(), id: key.1.to_string() });
        }
        outcome
    }

    fn remove(&mut self, lease: LeaseId, key: &(Arc<str>, Arc<str>), why: &'static str) {
        if let Some(entry) = self.leases.get_mut(&lease) {
            entry.owned.remove(key);
        }
        self.remove_from_service(lease, key, why);
    }

    /// Removes the instance from its service if `lease` still owns it.
    fn remove_from_service(&mut self, lease: LeaseId, key: &(Arc<str>, Arc<str>), why: &'static str) {
        let Some(service) = self.services.get_mut(&key.0) else { return };
        if service.instances.get(&key.1).is_some_and(|owned| owned.lease == lease) {
            service.instances.remove(&key.1);
            self.layers.forget(&key.0, &key.1);
            self.dirty.insert(key.0.clone());
            info!(service = %key.0, id = %key.1, lease, why, "deregistered");
            if service.instances.is_empty() {
                let now = Instant::now();
                service.empty_since = Some(now);
                self.emptied.push_back((now, key.0.clone()));
            }
            let token = self.leases.get(&lease).and_then(|entry| entry.token.clone());
            if let Some(token) = token {
                self.release_token_service(&token, &key.0);
            }
        }
    }

    fn release_token_service(&mut self, token: &Arc<str>, service: &Arc<str>) {
        let Some(held) = self.token_services.get_mut(token) else { return };
        if let Some(count) = held.get_mut(service) {
            *count -= 1;
            if *count == 0 {
                held.remove(service);
            }
        }
        if held.is_empty() {
            self.token_services.remove(token);
        }
    }

    /// Forgets services that have been empty for the idle timeout and that nobody watches.
    fn forget_idle_services(&mut self, now: Instant) {
        while let Some((since, _)) = self.emptied.front() {
            if *since + self.config.service_idle_timeout > now {
                break;
            }
            let (since, name) = self.emptied.pop_front().expect("the front was just seen");
            let watched = self.watchers.get(&name).is_some_and(|w| w.receiver_count() > 0);
            let Some(entry) = self.services.get(&name) else { continue };
            if entry.empty_since != Some(since) {
                continue;
            }
            if watched {
                // Checked again after another idle period.
                self.emptied.push_back((now, name.clone()));
                if let Some(entry) = self.services.get_mut(&name) {
                    entry.empty_since = Some(now);
                }
                continue;
            }
            self.services.remove(&name);
            self.dirty.remove(&name);
            self.published.remove(&name);
            self.forgotten.push(name.clone());
            debug!(service = %name, "forgotten: no instance for the service idle timeout");
        }
    }

    fn close(&mut self, lease: LeaseId, why: &'static str) {
        let Some(entry) = self.leases.get(&lease) else { return };
        if let Some(deadline) = entry.deadline {
            self.deadlines.remove(&(deadline, lease));
        }
        // Removed while the lease is still known, so its token's services are released.
        let owned: Vec<_> = entry.owned.iter().cloned().collect();
        for key in &owned {
            self.remove_from_service(lease, key, why);
        }
        let Some(entry) = self.leases.remove(&lease) else { return };
        if why == EXPIRED
            && let Some(expired) = entry.expired
        {
            self.expiries.push(expired);
        }
    }

    fn expire_due(&mut self, now: Instant) {
        while let Some(&(deadline, lease)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            info!(lease, "lease expired: no message within the heartbeat timeout");
            self.close(lease, EXPIRED);
        }
    }

    fn subscribe(&mut self, service: Arc<str>) -> watch::Receiver<Arc<ServiceSnapshot>> {
        if let Some(sender) = self.watchers.get(&service) {
            return sender.subscribe();
        }
        let current = self
            .published
            .get(&service)
            .cloned()
            .unwrap_or_else(|| Arc::new(ServiceSnapshot::build(service.clone(), 0, Vec::new())));
        let (sender, receiver) = watch::channel(current);
        self.watchers.insert(service, sender);
        receiver
    }

    fn publish(&mut self) {
        self.publish_snapshots();
        for (reply, outcome) in self.replies.drain(..) {
            let _ = reply.send(outcome);
        }
        for expired in self.expiries.drain(..) {
            let _ = expired.send(());
        }
    }

    fn publish_snapshots(&mut self) {
        let forgotten = std::mem::take(&mut self.forgotten);
        if self.dirty.is_empty() && forgotten.is_empty() {
            return;
        }
        let mut changed = Vec::with_capacity(self.dirty.len());
        for name in std::mem::take(&mut self.dirty) {
            let Some(entry) = self.services.get_mut(&name) else { continue };
            entry.epoch += 1;
            let instances = if self.layers.touches(&name) {
                entry.instances.values().map(|owned| self.layers.apply(&owned.instance)).collect()
            } else {
                entry.instances.values().map(|owned| owned.instance.clone()).collect()
            };
            let snapshot = Arc::new(ServiceSnapshot::build(name.clone(), entry.epoch, instances));
            changed.push(name.clone());
            self.published.insert(snapshot);
        }
        let catalog = Arc::new(self.published.clone());
        let mut touched = changed.clone();
        touched.extend(forgotten);
        // The pick views first, then the catalog, then the watches: nothing shows a change
        // (a listing reads the catalog) before every pick sees it.
        self.hooks.publish(&catalog, &touched, &self.catalog);
        for name in &changed {
            if let (Some(watcher), Some(snapshot)) = (self.watchers.get(name), catalog.get(name)) {
                watcher.send_replace(snapshot.clone());
            }
        }
        self.generation.send_modify(|generation| *generation += 1);
        if !changed.is_empty() && self.published_names.receiver_count() > 0 {
            let _ = self.published_names.send(changed.into());
        }
        // Forget watchers nobody listens to any more.
        self.watchers.retain(|_, sender| sender.receiver_count() > 0);
    }
}

const EXPIRED: &str = "heartbeat timeout";

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

impl Outcome {
    fn refuse(&mut self, instance: InstanceRef, why: Refused) {
        self.refused.push((instance, why));
    }

    fn refuse_all(&mut self, instances: impl Iterator<Item = InstanceRef>, why: Refused) {
        for instance in instances {
            self.refuse(instance, why.clone());
        }
    }
}

impl InstanceRef {
    fn of(instance: &Instance) -> Self {
        Self { service: instance.service.to_string(), id: instance.id.to_string() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_heartbeat_queued_when_the_deadline_is_noticed_wins() {
        let (generation, _) = watch::channel(0);
        let mut index = Index::new(
            RegistryConfig::default(),
            Arc::default(),
            generation,
            broadcast::channel(1).0,
            Default::default(),
            Default::default(),
        );
        let (tx, mut rx) = mpsc::unbounded_channel();
        let (expired, mut expiry) = oneshot::channel();
        index.apply(Command::Open { lease: 1, token: None, limit: 1000, expires: true, expired });
        tokio::time::advance(RegistryConfig::default().heartbeat_timeout * 2).await;
        tx.send(Command::Touch { lease: 1 }).unwrap();
        index.on_deadline(&mut rx, Instant::now());
        assert!(index.leases.contains_key(&1), "the queued heartbeat kept the lease");
        assert!(expiry.try_recv().is_err());
        // Without a heartbeat, the next deadline expires it.
        tokio::time::advance(RegistryConfig::default().heartbeat_timeout).await;
        index.on_deadline(&mut rx, Instant::now());
        assert!(!index.leases.contains_key(&1));
        // The stream hears of the expiry only once the removal is published.
        assert!(expiry.try_recv().is_err(), "told before the removal was published");
        assert!(index.has_unpublished());
        index.publish();
        assert!(expiry.try_recv().is_ok());
    }
}
