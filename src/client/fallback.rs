//! Local fallback: picks made from the last instance list seen while rota cannot answer.
//!
//! A client that [follows](super::RotaClient::follow) a service keeps a copy of its instance
//! list, fed by a background `Watch` that reconnects with jittered exponential backoff. When a
//! pick of that service finds rota unreachable (or warming up after a restart), the client picks
//! round robin over the copy, with rota's version isolation and exclusion, and marks the pick as
//! local. The behaviour is the one every rota client shares: `clients/conformance/README.md`,
//! "Local fallback", pinned by `clients/conformance/scenarios/fallback*.json`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tonic::transport::Channel;
use tracing::{debug, info, warn};

use super::backoff::backoff;
use crate::pb::registry_client::RegistryClient;
use crate::pb::{self, watch_event::Event};

/// Unreachable picks in a row after which picks go straight to the local fallback ...
pub const SHORTCUT_AFTER: u32 = 3;
/// ... for this long, before rota is asked again.
pub const SHORTCUT_FOR: Duration = Duration::from_secs(1);
/// How long a Watch stream must have lived for its end to reset the reconnect backoff, so that
/// a server that accepts and at once ends streams (one draining) is not hammered.
const STABLE_STREAM: Duration = Duration::from_secs(5);

/// The `rota-error` reason of a pick refused because nothing is eligible (also of a local pick).
pub const NO_ELIGIBLE_INSTANCE: &str = "no_eligible_instance";

/// The lists of followed services, the local tickets, and the view of rota's availability,
/// shared by the clones of one client and its watch tasks.
#[derive(Debug, Default)]
pub(super) struct Shared {
    cache: Mutex<Cache>,
    outage: Mutex<Outage>,
    /// Bumped on every change of a kept list, so callers can wait for one.
    changes: watch::Sender<u64>,
}

/// What the clones of one client hold: the shared state and the watch tasks, which end when
/// the last clone is dropped.
#[derive(Debug, Default)]
pub(super) struct Fallback {
    pub(super) shared: Arc<Shared>,
    watchers: Mutex<HashMap<String, JoinHandle<()>>>,
}

impl Drop for Fallback {
    fn drop(&mut self) {
        for task in lock(&self.watchers).values() {
            task.abort();
        }
    }
}

impl Fallback {
    /// Starts following `service` unless it is followed already.
    pub(super) fn follow(
        &self,
        service: &str,
        registry: RegistryClient<Channel>,
        token: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    ) {
        let mut watchers = lock(&self.watchers);
        if watchers.contains_key(service) {
            return;
        }
        let task = tokio::spawn(watch_forever(self.shared.clone(), registry, token, service.to_owned()));
        watchers.insert(service.to_owned(), task);
    }
}

#[derive(Debug, Default)]
struct Cache {
    services: HashMap<String, ServiceList>,
    /// The next local ticket per (service, subset): the version served, `""` for the instances
    /// with no version.
    tickets: HashMap<(String, String), u64>,
}

#[derive(Debug, Default)]
struct ServiceList {
    /// Whether a snapshot has arrived; only then can the service fall back.
    synced: bool,
    /// Ordered by id.
    instances: Vec<pb::Instance>,
    epoch: u64,
}

impl Shared {
    /// Applies one Watch event of `service` to its kept list.
    pub(super) fn apply(&self, service: &str, event: pb::WatchEvent) {
        let mut cache = lock(&self.cache);
        let list = cache.services.entry(service.to_owned()).or_default();
        match event.event {
            Some(Event::Snapshot(snapshot)) => {
                // A rota that has not seen the service since it started (epoch 0) knows less
                // than this copy: its empty list never replaces a non-empty one.
                if !snapshot.instances.is_empty() || event.epoch > 0 || list.instances.is_empty() {
                    list.instances = snapshot.instances;
                    list.instances.sort_by(|a, b| a.id.cmp(&b.id));
                }
                list.synced = true;
            }
            Some(Event::Added(instance)) | Some(Event::Updated(instance)) => {
                match list.instances.binary_search_by(|i| i.id.cmp(&instance.id)) {
                    Ok(at) => list.instances[at] = instance,
                    Err(at) => list.instances.insert(at, instance),
                }
            }
            Some(Event::Removed(removed)) => list.instances.retain(|i| i.id != removed.id),
            None => return,
        }
        list.epoch = event.epoch;
        drop(cache);
        self.changes.send_modify(|n| *n += 1);
    }

    /// Whether `service` is followed and its first list has arrived.
    pub(super) fn synced(&self, service: &str) -> bool {
        lock(&self.cache).services.get(service).is_some_and(|list| list.synced)
    }

    /// The kept list of `service`, by id; `None` until its first list has arrived.
    pub(super) fn instances(&self, service: &str) -> Option<Vec<pb::Instance>> {
        let cache = lock(&self.cache);
        cache.services.get(service).filter(|list| list.synced).map(|list| list.instances.clone())
    }

    pub(super) fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Picks round robin from the kept list of `service`, with rota's version isolation:
    /// version `v` picks among the UP instances of version `v` or, when there are none, among
    /// the UP instances with no version (and says so in `fallback`); no version picks among
    /// the UP instances with no version. Ticket `t` takes position `t mod k` among the `k`
    /// instances of that subset that are not excluded, as rota's `round_robin` does. `None`
    /// when the service has no list; `Some(Err(why))` when the subset is empty or all excluded
    /// (never another subset).
    pub(super) fn pick(&self, service: &str, version: &str, exclude: &[String]) -> Option<Result<Local, String>> {
        let mut cache = lock(&self.cache);
        let Cache { services, tickets } = &mut *cache;
        let list = services.get(service).filter(|list| list.synced)?;
        let up = |wanted: &str| -> Vec<&pb::Instance> {
            list.instances.iter().filter(|i| eligible(i) && i.version == wanted).collect()
        };
        let (subset, label, fallback) = match up(version) {
            found if !found.is_empty() || version.is_empty() => (found, version, String::new()),
            _ => (up(""), "", format!("no instance with version {version:?}; picked from instances with no version")),
        };
        let accepted: Vec<&pb::Instance> = subset.into_iter().filter(|i| !exclude.contains(&i.id)).collect();
        if accepted.is_empty() {
            let wanted = if label.is_empty() { "no version".to_owned() } else { format!("version {label:?}") };
            let excluded = if exclude.is_empty() { "" } else { " that is not excluded" };
            return Some(Err(format!(
                "service {service:?} has no UP instance ({wanted}){excluded} in the last list seen"
            )));
        }
        let next = tickets.entry((service.to_owned(), label.to_owned())).or_insert(0);
        let ticket = *next;
        *next += 1;
        let instance = accepted[(ticket % accepted.len() as u64) as usize].clone();
        Some(Ok(Local { instance, ticket, fallback, epoch: list.epoch }))
    }

    /// Whether picks should skip rota for now and go local.
    pub(super) fn shortcut(&self) -> bool {
        lock(&self.outage).shortcut(Instant::now())
    }

    /// Records a pick that could not reach rota.
    pub(super) fn unreachable(&self) {
        lock(&self.outage).unreachable(Instant::now());
    }

    /// Records an answer of rota's (an instance, an error of its own, or a Watch snapshot).
    pub(super) fn answered(&self) {
        if lock(&self.outage).answered() {
            warn!("rota answers again; picks are rota's again");
        }
    }

    /// Records a local pick; warns on the first of an outage.
    pub(super) fn picked_locally(&self, service: &str, cause: &dyn std::fmt::Display) {
        if lock(&self.outage).picked_locally() {
            warn!(service, error = %cause, "rota unreachable; picking followed services locally from the last lists seen");
        }
    }
}

/// One pick made from a kept list.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Local {
    pub instance: pb::Instance,
    pub ticket: u64,
    pub fallback: String,
    pub epoch: u64,
}

fn eligible(instance: &pb::Instance) -> bool {
    matches!(
        pb::InstanceStatus::try_from(instance.status),
        Ok(pb::InstanceStatus::Up | pb::InstanceStatus::Unspecified)
    )
}

/// Consecutive unreachable picks, the short-cut they cause, and whether an outage is under way
/// (for its two warnings).
#[derive(Debug, Default)]
struct Outage {
    failures: u32,
    until: Option<Instant>,
    in_outage: bool,
}

impl Outage {
    fn shortcut(&self, now: Instant) -> bool {
        self.failures >= SHORTCUT_AFTER && self.until.is_some_and(|until| now < until)
    }

    fn unreachable(&mut self, now: Instant) {
        self.failures = self.failures.saturating_add(1);
        if self.failures >= SHORTCUT_AFTER {
            self.until = Some(now + SHORTCUT_FOR);
        }
    }

    /// Returns whether this ends an outage.
    fn answered(&mut self) -> bool {
        let recovered = self.in_outage;
        *self = Outage::default();
        recovered
    }

    /// Returns whether this is the first local pick of an outage.
    fn picked_locally(&mut self) -> bool {
        !std::mem::replace(&mut self.in_outage, true)
    }
}

/// Mirrors `service` into the cache for as long as the client lives, reconnecting with backoff;
/// the kept list stays while the stream is down.
async fn watch_forever(
    shared: Arc<Shared>,
    mut registry: RegistryClient<Channel>,
    token: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    service: String,
) {
    let mut rng = fastrand::Rng::new();
    let mut attempt = 0u32;
    loop {
        let opened = Instant::now();
        let (synced, error) = watch_once(&shared, &mut registry, token.clone(), &service).await;
        if opened.elapsed() >= STABLE_STREAM {
            attempt = 0;
        }
        if synced {
            info!(service, %error, "rota watch lost; keeping the last instance list");
        } else {
            debug!(service, attempt = attempt + 1, %error, "rota watch failed");
        }
        tokio::time::sleep(backoff(attempt, &mut rng)).await;
        attempt = attempt.saturating_add(1);
    }
}

/// Runs one Watch stream until it ends; returns whether it delivered a snapshot, and why it
/// ended.
async fn watch_once(
    shared: &Shared,
    registry: &mut RegistryClient<Channel>,
    token: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    service: &str,
) -> (bool, tonic::Status) {
    let mut request = tonic::Request::new(pb::WatchRequest { service: service.to_owned() });
    if let Some(token) = token {
        request.metadata_mut().insert("authorization", token);
    }
    let mut events = match registry.watch(request).await {
        Ok(response) => response.into_inner(),
        Err(status) => return (false, status),
    };
    let mut synced = false;
    loop {
        match events.message().await {
            Ok(Some(event)) => {
                if matches!(event.event, Some(Event::Snapshot(_))) {
                    synced = true;
                    shared.answered(); // rota is reachable again
                }
                shared.apply(service, event);
            }
            Ok(None) => return (synced, tonic::Status::unavailable("the watch ended")),
            Err(status) => return (synced, status),
        }
    }
}

/// The state behind these locks is plain data, valid after any panic.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests;
