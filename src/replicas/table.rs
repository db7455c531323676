//! The instance table shared by the replicas.
//!
//! Each replica writes the instances its own registration streams hold, per service, under
//! `rota:{SERVICE}:instances:REPLICA`, lists itself in `rota:{SERVICE}:holders`, and appends the
//! service's name to the stream `rota:changes`. It keeps `rota:replica:REPLICA` alive with an
//! expiry of [`REPLICA_LEASE`], renewed every [`POLL`]. Every replica reads `rota:changes` each
//! [`POLL`] and, for each changed service, copies the other live replicas' instances into its
//! own registry through one *mirror lease* per (replica, service); a full resync every
//! [`RESYNC`] repairs anything missed. So a registration on one replica is pickable on the
//! others within about one poll, and every replica builds its pick views from the merged table.
//!
//! A replica that dies stops renewing its key: within [`REPLICA_LEASE`] plus one poll, the
//! others drop its mirror leases, and with them its instances; nothing else is touched. While
//! Redis is unreachable each replica keeps what it has (its own streams' instances and its last
//! copy of the others'); when the link returns it writes its instances again and resyncs.
//!
//! The same id registered on two replicas: each replica's registry refuses a second owner
//! (`ALREADY_EXISTS`), so a provider's registration is refused on a replica that already copied
//! the id from another. Two registrations racing within one poll on different replicas are both
//! accepted locally; each replica then keeps its own and refuses the other's copy.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use redis::Value;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast::error::RecvError;
use tokio::time::{Instant, MissedTickBehavior};

use crate::registry::{Instance, InstanceRef, InstanceSpec, Lease, Registry, RequestedStatus, Status};
use crate::state::redis::Link;

/// How long a replica's instances outlive its last renewal.
pub const REPLICA_LEASE: Duration = Duration::from_secs(5);
/// Time between reads of the change stream (and renewals of the replica's key).
pub const POLL: Duration = Duration::from_millis(200);
/// Shortest time between two writes of local changes outside the polls.
const FLUSH: Duration = Duration::from_millis(50);
/// Time between full resyncs of every service.
pub const RESYNC: Duration = Duration::from_secs(10);
/// Entries the change stream keeps (approximately).
const CHANGES_KEPT: usize = 10_000;
/// Changes read per poll.
const CHANGES_PER_READ: usize = 1000;
/// Instances one mirror lease may hold: what another replica holds of one service.
const MIRROR_LIMIT: usize = 1_000_000;
const CHANGES: &str = "rota:changes";
const SERVICES: &str = "rota:services";

fn instances_key(service: &str, replica: &str) -> String {
    format!("rota:{{{service}}}:instances:{replica}")
}

fn holders_key(service: &str) -> String {
    format!("rota:{{{service}}}:holders")
}

pub(super) fn replica_key(replica: &str) -> String {
    format!("rota:replica:{replica}")
}

/// One instance as replicas share it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Shared {
    id: String,
    host: String,
    port: u16,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    version: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    zone: String,
    weight: u32,
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    metadata: std::collections::BTreeMap<String, String>,
    status: String,
}

impl Shared {
    fn of(instance: &Instance) -> Self {
        Self {
            id: instance.id.to_string(),
            host: instance.host.clone(),
            port: instance.port,
            version: instance.version.to_string(),
            zone: instance.zone.to_string(),
            weight: instance.weight,
            metadata: instance.metadata.clone(),
            status: instance.status.as_str().to_owned(),
        }
    }

    fn spec(self, service: &str) -> InstanceSpec {
        let status = match self.status.as_str() {
            "DRAINING" => Status::Draining,
            "DOWN" => Status::Down,
            _ => Status::Up,
        };
        InstanceSpec {
            id: self.id,
            service: service.to_owned(),
            host: self.host,
            port: u32::from(self.port),
            version: self.version,
            zone: self.zone,
            weight: Some(self.weight),
            metadata: self.metadata,
            status: RequestedStatus::Known(status),
        }
    }
}

/// Another replica's instances of one service, as this registry holds them.
struct Mirror {
    lease: Lease,
    ids: HashSet<String>,
}

/// Shares the instance table through Redis until the registry stops.
pub struct TableSharing {
    replica: Arc<str>,
    registry: Registry,
    link: Arc<Link>,
    mirrors: HashMap<(String, Arc<str>), Mirror>,
    /// What this replica last wrote for each service (to write only changes).
    written: HashMap<Arc<str>, Vec<Shared>>,
    dirty: HashSet<Arc<str>>,
    last_change: String,
    recoveries: u64,
}

impl TableSharing {
    /// Starts sharing `registry` as replica `replica` on the current runtime.
    pub fn spawn(registry: Registry, link: Arc<Link>, replica: Arc<str>) -> tokio::task::JoinHandle<()> {
        let sharing = Self {
            replica,
            registry,
            link,
            mirrors: HashMap::new(),
            written: HashMap::new(),
            dirty: HashSet::new(),
            last_change: "0-0".into(),
            recoveries: 0,
        };
        tokio::spawn(sharing.run())
    }

    async fn run(mut self) {
        let mut published = self.registry.published();
        let mut poll = tokio::time::interval(POLL);
        poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut next_resync = Instant::now() + RESYNC;
        let mut next_flush = Instant::now();
        loop {
            tokio::select! {
                changed = published.recv() => {
                    match changed {
                        Ok(services) => self.dirty.extend(services.iter().cloned()),
                        Err(RecvError::Lagged(_)) => self.all_dirty(),
                        Err(RecvError::Closed) => return,
                    }
                    // Written at once (at most every FLUSH), not at the next poll: the other
                    // replicas then see a registration within one of their polls.
                    if self.link.is_up() && Instant::now() >= next_flush {
                        next_flush = Instant::now() + FLUSH;
                        self.flush().await;
                    }
                }
                _ = poll.tick() => {
                    // Copies are kept (and their leases alive) while Redis is unreachable.
                    for mirror in self.mirrors.values() {
                        mirror.lease.touch();
                    }
                    if !self.link.is_up() {
                        continue;
                    }
                    let recoveries = self.link.recoveries();
                    let full = recoveries != self.recoveries || Instant::now() >= next_resync;
                    if recoveries != self.recoveries {
                        // Redis may have lost everything: write all again.
                        self.recoveries = recoveries;
                        self.written.clear();
                        self.all_dirty();
                    }
                    if full {
                        next_resync = Instant::now() + RESYNC;
                    }
                    self.round(full).await;
                }
            }
        }
    }

    fn all_dirty(&mut self) {
        let catalog = self.registry.catalog();
        self.dirty.extend(catalog.snapshots().map(|s| s.name.clone()));
        self.dirty.extend(self.written.keys().cloned());
    }

    /// One poll: renew, write local changes, read others' changes, drop dead replicas.
    async fn round(&mut self, full: bool) {
        let key = replica_key(&self.replica);
        let lease_ms = REPLICA_LEASE.as_millis() as u64;
        if self
            .link
            .run(|mut c| async move {
                redis::cmd("SET").arg(&key).arg(1).arg("PX").arg(lease_ms).query_async::<()>(&mut c).await
            })
            .await
            .is_none()
        {
            return;
        }
        if !self.flush().await {
            return;
        }
        let changed = if full { self.all_services().await } else { self.read_changes().await };
        let Some(changed) = changed else { return };
        for service in changed {
            if !self.apply(&service).await {
                return;
            }
        }
        self.drop_dead_replicas().await;
    }

    /// Writes every service changed here since the last flush; false when Redis did not answer.
    async fn flush(&mut self) -> bool {
        let dirty: Vec<Arc<str>> = self.dirty.drain().collect();
        for (n, service) in dirty.iter().enumerate() {
            if !self.write(service).await {
                self.dirty.extend(dirty[n..].iter().cloned());
                return false;
            }
        }
        true
    }

    /// Writes this replica's own instances of `service`; false when Redis did not answer.
    async fn write(&mut self, service: &Arc<str>) -> bool {
        let mirrored: HashSet<&str> = self
            .mirrors
            .iter()
            .filter(|((_, s), _)| s == service)
            .flat_map(|(_, m)| m.ids.iter().map(String::as_str))
            .collect();
        let own: Vec<Shared> = self
            .registry
            .service(service)
            .map(|snapshot| {
                snapshot.instances.iter().filter(|i| !mirrored.contains(&*i.id)).map(|i| Shared::of(i)).collect()
            })
            .unwrap_or_default();
        if self.written.get(service).is_some_and(|w| *w == own)
            || (own.is_empty() && !self.written.contains_key(service))
        {
            return true;
        }
        let (instances, holders) = (instances_key(service, &self.replica), holders_key(service));
        let mut pipe = redis::pipe();
        // The replica's key first: no reader may see these instances without it (it would take
        // the replica for dead and drop them).
        let lease_ms = REPLICA_LEASE.as_millis() as u64;
        pipe.cmd("SET").arg(replica_key(&self.replica)).arg(1).arg("PX").arg(lease_ms).ignore();
        if own.is_empty() {
            pipe.cmd("DEL").arg(&instances).ignore();
            pipe.cmd("SREM").arg(&holders).arg(&*self.replica).ignore();
        } else {
            let encoded = serde_json::to_string(&own).unwrap_or_default();
            pipe.cmd("SET").arg(&instances).arg(encoded).ignore();
            pipe.cmd("SADD").arg(&holders).arg(&*self.replica).ignore();
            pipe.cmd("SADD").arg(SERVICES).arg(&**service).ignore();
        }
        pipe.cmd("XADD")
            .arg(CHANGES)
            .arg("MAXLEN")
            .arg("~")
            .arg(CHANGES_KEPT)
            .arg("*")
            .arg("s")
            .arg(&**service)
            .arg("r")
            .arg(&*self.replica)
            .ignore();
        if self.link.run(|mut c| async move { pipe.query_async::<()>(&mut c).await }).await.is_none() {
            return false;
        }
        if own.is_empty() {
            self.written.remove(service);
        } else {
            self.written.insert(service.clone(), own);
        }
        true
    }

    /// Every service any replica wrote; also moves the change cursor to the stream's end.
    async fn all_services(&mut self) -> Option<Vec<String>> {
        let last: Value = self
            .link
            .run(|mut c| async move {
                redis::cmd("XREVRANGE").arg(CHANGES).arg("+").arg("-").arg("COUNT").arg(1).query_async(&mut c).await
            })
            .await?;
        if let Some((id, _)) = entries(&last).into_iter().next() {
            self.last_change = id;
        }
        let mut services: Vec<String> = self
            .link
            .run(|mut c| async move { redis::cmd("SMEMBERS").arg(SERVICES).query_async(&mut c).await })
            .await?;
        // Services this replica mirrors but nobody lists any more are dropped too.
        services.extend(self.mirrors.keys().map(|(_, s)| s.to_string()));
        services.sort_unstable();
        services.dedup();
        Some(services)
    }

    /// Services other replicas changed since the last read.
    async fn read_changes(&mut self) -> Option<Vec<String>> {
        let from = self.last_change.clone();
        let reply: Value = self
            .link
            .run(|mut c| async move {
                redis::cmd("XREAD")
                    .arg("COUNT")
                    .arg(CHANGES_PER_READ)
                    .arg("STREAMS")
                    .arg(CHANGES)
                    .arg(&from)
                    .query_async(&mut c)
                    .await
            })
            .await?;
        let mut services = Vec::new();
        // XREAD answers [[stream, [[id, [field, value, ...]], ...]]], or nil.
        if let Value::Array(streams) = &reply
            && let Some(Value::Array(stream)) = streams.first()
            && let Some(list) = stream.get(1)
        {
            for (id, fields) in entries(list) {
                self.last_change = id;
                let field = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
                if field("r").as_deref() != Some(&*self.replica)
                    && let Some(service) = field("s")
                {
                    services.push(service);
                }
            }
        }
        services.sort_unstable();
        services.dedup();
        Some(services)
    }

    /// Copies the other live replicas' instances of `service`; false when Redis did not answer.
    async fn apply(&mut self, service: &str) -> bool {
        let holders_key = holders_key(service);
        let Some(holders) =
            self.link
                .run(|mut c| async move {
                    redis::cmd("SMEMBERS").arg(&holders_key).query_async::<Vec<String>>(&mut c).await
                })
                .await
        else {
            return false;
        };
        let service: Arc<str> = service.into();
        let mut present = HashSet::new();
        let me = self.replica.clone();
        for holder in holders.into_iter().filter(|h| **h != *me) {
            let key = instances_key(&service, &holder);
            let Some(encoded) = self
                .link
                .run(|mut c| async move { redis::cmd("GET").arg(&key).query_async::<Option<String>>(&mut c).await })
                .await
            else {
                return false;
            };
            let desired: Vec<Shared> = encoded.and_then(|e| serde_json::from_str(&e).ok()).unwrap_or_default();
            if !desired.is_empty() {
                present.insert(holder.clone());
                self.mirror(holder, &service, desired).await;
            }
        }
        self.mirrors.retain(|(holder, s), _| *s != service || present.contains(holder));
        true
    }

    /// Makes this registry's copy of `holder`'s instances of `service` equal `desired`.
    async fn mirror(&mut self, holder: String, service: &Arc<str>, desired: Vec<Shared>) {
        let registry = &self.registry;
        let mirror = self
            .mirrors
            .entry((holder, service.clone()))
            .or_insert_with(|| Mirror { lease: registry.open_mirror_lease(MIRROR_LIMIT), ids: HashSet::new() });
        let wanted: HashSet<&str> = desired.iter().map(|s| s.id.as_str()).collect();
        let gone: Vec<InstanceRef> = mirror
            .ids
            .iter()
            .filter(|id| !wanted.contains(id.as_str()))
            .map(|id| InstanceRef { service: service.to_string(), id: id.clone() })
            .collect();
        if !gone.is_empty() {
            let _ = mirror.lease.withdraw(gone).await;
        }
        let specs: Vec<InstanceSpec> = desired.into_iter().map(|s| s.spec(service)).collect();
        if let Ok(outcome) = mirror.lease.announce(specs).await {
            mirror.ids = outcome.accepted.into_iter().map(|r| r.id).collect();
            for (instance, why) in outcome.refused {
                tracing::debug!(service = %instance.service, id = %instance.id, %why, "another replica's instance not copied");
            }
        }
    }

    /// Drops the copies of replicas whose key expired.
    async fn drop_dead_replicas(&mut self) {
        let holders: HashSet<String> = self.mirrors.keys().map(|(h, _)| h.clone()).collect();
        for holder in holders {
            let key = replica_key(&holder);
            let Some(alive) = self
                .link
                .run(|mut c| async move { redis::cmd("EXISTS").arg(&key).query_async::<bool>(&mut c).await })
                .await
            else {
                return;
            };
            if !alive {
                tracing::info!(replica = %holder, "replica gone: its instances are dropped");
                self.mirrors.retain(|(h, _), _| *h != holder);
            }
        }
    }
}

/// The `(id, [(field, value)])` entries of an XRANGE-style reply.
fn entries(reply: &Value) -> Vec<(String, Vec<(String, String)>)> {
    let text = |v: &Value| match v {
        Value::BulkString(bytes) => String::from_utf8(bytes.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let Value::Array(list) = reply else { return Vec::new() };
    list.iter()
        .filter_map(|entry| {
            let Value::Array(parts) = entry else { return None };
            let id = text(parts.first()?)?;
            let Value::Array(flat) = parts.get(1)? else { return None };
            let fields = flat.chunks(2).filter_map(|kv| Some((text(kv.first()?)?, text(kv.get(1)?)?))).collect();
            Some((id, fields))
        })
        .collect()
}
