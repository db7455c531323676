//! The instance table shared by the replicas.
//!
//! Each replica writes the instances its own registration streams hold, per service, into the
//! hash `rota:{SERVICE}:instances:REPLICA` (one field per instance id, its JSON as the value),
//! lists itself in `rota:{SERVICE}:holders`, and appends an entry to the stream `rota:{~fleet}:changes`
//! naming the service, itself, and the ids that changed (up to [`IDS_PER_CHANGE`]; an entry
//! without ids stands for the whole service). Only what changed is written: one instance's
//! change in a service of 100,000 costs one field, not the whole table. It keeps
//! `rota:{~fleet}:replica:REPLICA` alive with an expiry of [`REPLICA_LEASE`], renewed every [`POLL`].
//!
//! Every replica reads the change stream each [`POLL`] and copies the other live replicas'
//! instances into its own registry through one *mirror lease* per (replica, service): the
//! named ids alone when the entry names them, the whole hash otherwise. A full resync every
//! [`RESYNC`] repairs anything missed: it reads a hash whole only when the token every write
//! stores in it (field `~v`) moved since it last did, and announces to the registry only what
//! differs from its copy. So a registration on one replica is pickable on the others within about one
//! poll, and every replica builds its pick views from the merged table.
//!
//! A replica that dies stops renewing its key: within [`REPLICA_LEASE`] plus one poll, the
//! others drop its mirror leases, and with them its instances, and clear its entries in Redis;
//! nothing else is touched. Right after Redis may have lost its data (this replica's link came
//! back, or the data set's generation changed), a missing key or holders entry is no proof of
//! death: every key is missing at once while every replica is alive and writing itself back
//! within a poll or two. For [`REPLICA_LEASE`] after such an event, a holder is dropped only once
//! it has been missing for [`REPLICA_LEASE`], so the others' copies do not blink out meanwhile. A replica that finds its own key had expired (it was too slow to
//! renew it) writes everything it holds again. While Redis is unreachable each replica keeps
//! what it has (its own streams' instances and its last copy of the others'); when the link
//! returns it writes its instances again, whole, and resyncs.
//!
//! The same id registered on two replicas: a registration stream's announce first claims its
//! ids in Redis ([`super::claims`]), so the first replica to hold an id keeps it and the other
//! refuses it with `ALREADY_EXISTS`, exactly as one server refuses a second stream.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::Value;
use tokio::sync::broadcast::error::RecvError;
use tokio::time::{Instant, MissedTickBehavior};

use crate::registry::{InstanceRecord, InstanceRef, InstanceSpec, Lease, Registry};
use crate::state::redis::Link;
use crate::state::redis::keys::{self, CHANGES, SERVICES};

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
/// The field of an instances hash that holds a fresh token on every write (`~` is not allowed
/// in an instance id): a resync reads a hash whole only when its token moved since it last did.
const VERSION_FIELD: &str = "~v";
/// Ids one change entry names at most; a larger change stands for the whole service.
pub const IDS_PER_CHANGE: usize = 128;
/// Changes read per poll.
const CHANGES_PER_READ: usize = 1000;
/// Instances one mirror lease may hold: what another replica holds of one service.
const MIRROR_LIMIT: usize = 1_000_000;

/// This replica's key, `rota:{~fleet}:replica:REPLICA`: renewed by the table's polls and
/// writes and by id claims, each of which reads its previous value on the way. Whoever finds
/// it had expired (the replica was too slow to renew it, and the others may have cleared its
/// entries) says so here, and the table writes everything it holds again.
pub struct Liveness {
    pub replica: Arc<str>,
    lapsed: AtomicBool,
}

impl Liveness {
    pub fn new(replica: Arc<str>) -> Arc<Self> {
        Arc::new(Self { replica, lapsed: AtomicBool::new(false) })
    }

    /// Adds the renewal to `pipe`; hand its answer to [`Liveness::renewed`].
    pub fn renew(&self, pipe: &mut redis::Pipeline) {
        let lease_ms = REPLICA_LEASE.as_millis() as u64;
        pipe.cmd("SET").arg(keys::replica(&self.replica)).arg(1).arg("PX").arg(lease_ms).arg("GET");
    }

    /// The answer of a renewal: the key's previous value, nil if it had expired.
    pub fn renewed(&self, previous: &Value) {
        if matches!(previous, Value::Nil) {
            self.lapsed.store(true, Ordering::Release);
        }
    }

    fn take_lapsed(&self) -> bool {
        self.lapsed.swap(false, Ordering::AcqRel)
    }
}

/// Another replica's instances of one service, as this registry holds them.
struct Mirror {
    lease: Lease,
    /// What this registry accepted of them, by id.
    held: HashMap<String, InstanceRecord>,
    /// The token of the hash when it was last read whole; `None` once ids were read alone
    /// since (the next resync reads it whole).
    version: Option<String>,
}

/// What the change stream said since the last read.
#[derive(Default)]
struct Changes {
    /// Services to read whole, from every replica holding them.
    whole: BTreeSet<String>,
    /// Ids to read again, per (service, replica).
    ids: BTreeMap<(String, String), BTreeSet<String>>,
}

/// Shares the instance table through Redis until the registry stops.
pub struct TableSharing {
    liveness: Arc<Liveness>,
    registry: Registry,
    link: Arc<Link>,
    mirrors: HashMap<(String, Arc<str>), Mirror>,
    /// What this replica last wrote for each service, by id (to write only changes).
    written: HashMap<Arc<str>, HashMap<Arc<str>, InstanceRecord>>,
    /// Services whose hash in Redis may hold stale entries: written again whole.
    rewrite: HashSet<Arc<str>>,
    dirty: HashSet<Arc<str>>,
    last_change: String,
    recoveries: u64,
    /// Since when each holder of a mirror has been seen without its key or holders entry, while
    /// that may be Redis's data loss rather than death. At most one entry per holder of a mirror.
    absent_since: HashMap<String, Instant>,
    /// Until when a missing key may be Redis's data loss: [`REPLICA_LEASE`] after the link came
    /// back or the generation changed.
    unsure_until: Option<Instant>,
    /// The link's generation changes last seen.
    generations: u64,
}

impl TableSharing {
    /// Starts sharing `registry` as replica `replica` on the current runtime.
    pub fn spawn(registry: Registry, link: Arc<Link>, liveness: Arc<Liveness>) -> tokio::task::JoinHandle<()> {
        let sharing = Self {
            liveness,
            registry,
            link,
            mirrors: HashMap::new(),
            written: HashMap::new(),
            rewrite: HashSet::new(),
            dirty: HashSet::new(),
            last_change: "0-0".into(),
            recoveries: 0,
            absent_since: HashMap::new(),
            unsure_until: None,
            generations: 0,
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
                        // Redis may have lost everything, or kept what was there before.
                        self.recoveries = recoveries;
                        self.write_all_again();
                        self.unsure_until = Some(Instant::now() + REPLICA_LEASE);
                    }
                    let generations = self.link.generation_changes();
                    if generations != self.generations {
                        self.generations = generations;
                        self.unsure_until = Some(Instant::now() + REPLICA_LEASE);
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

    /// Every service is written again whole, replacing whatever Redis holds for this replica.
    fn write_all_again(&mut self) {
        self.rewrite.extend(self.written.keys().cloned());
        self.written.clear();
        self.all_dirty();
    }

    /// One poll: renew, write local changes, read others' changes, drop dead replicas.
    async fn round(&mut self, full: bool) {
        let mut renew = redis::pipe();
        self.liveness.renew(&mut renew);
        let Some(previous) = self.link.run(|mut c| async move { renew.query_async::<Vec<Value>>(&mut c).await }).await
        else {
            return;
        };
        self.liveness.renewed(previous.first().unwrap_or(&Value::Nil));
        if self.liveness.take_lapsed() && !self.written.is_empty() {
            // This replica's key had lapsed: the others took it for dead and may have removed
            // its entries. Everything it holds is written again.
            tracing::info!(replica = %self.liveness.replica, "this replica's key had expired; writing its instances again");
            self.write_all_again();
        }
        if !self.flush().await {
            return;
        }
        let changes = if full { self.all_services().await } else { self.read_changes().await };
        let Some(changes) = changes else { return };
        for service in &changes.whole {
            if !self.apply(service).await {
                return;
            }
        }
        for ((service, holder), ids) in changes.ids {
            if !changes.whole.contains(&service) && !self.apply_ids(&service, holder, ids).await {
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

    /// Writes what changed in this replica's own instances of `service`; false when Redis did
    /// not answer.
    async fn write(&mut self, service: &Arc<str>) -> bool {
        let mirrored: HashSet<&str> = self
            .mirrors
            .iter()
            .filter(|((_, s), _)| s == service)
            .flat_map(|(_, m)| m.held.keys().map(String::as_str))
            .collect();
        let own: HashMap<Arc<str>, InstanceRecord> = self
            .registry
            .service(service)
            .map(|snapshot| {
                snapshot
                    .instances
                    .iter()
                    // A source's instances are followed by every replica itself.
                    .filter(|i| i.source.is_none() && !mirrored.contains(&*i.id))
                    // What the provider announced: each replica lays its own checks over it.
                    .map(|i| (i.id.clone(), InstanceRecord::of(&i.announced())))
                    .collect()
            })
            .unwrap_or_default();
        let whole = self.rewrite.contains(service);
        let empty = HashMap::new();
        let before = if whole { &empty } else { self.written.get(service).unwrap_or(&empty) };
        let changed: Vec<(&Arc<str>, &InstanceRecord)> =
            own.iter().filter(|(id, s)| before.get(*id) != Some(*s)).collect();
        let removed: Vec<&Arc<str>> = before.keys().filter(|id| !own.contains_key(*id)).collect();
        if !whole && changed.is_empty() && removed.is_empty() {
            return true;
        }
        let (instances, holders) = (keys::instances(service, &self.liveness.replica), keys::holders(service));
        // Three steps, each in one hash slot. The replica's key first: no reader may see these
        // instances without it (it would take the replica for dead and drop them). Then the
        // service's keys, then the change entry that tells the others to read them.
        let mut renew = redis::pipe();
        self.liveness.renew(&mut renew);
        let (mut pipe, mut announce) = (redis::pipe(), redis::pipe());
        let mut ids: Option<Vec<&str>> = None;
        let token = format!("{:016x}", fastrand::u64(..));
        if own.is_empty() {
            pipe.cmd("DEL").arg(&instances).ignore();
            pipe.cmd("SREM").arg(&holders).arg(&*self.liveness.replica).ignore();
        } else {
            if whole {
                // Replaced in one step, so a reader never sees the hash half written.
                let next = format!("{instances}:next");
                pipe.cmd("DEL").arg(&next).ignore();
                pipe.cmd("HSET").arg(&next).arg(encode(changed.iter().copied())).ignore();
                pipe.cmd("HSET").arg(&next).arg(VERSION_FIELD).arg(&token).ignore();
                pipe.cmd("RENAME").arg(&next).arg(&instances).ignore();
            } else {
                if !changed.is_empty() {
                    pipe.cmd("HSET").arg(&instances).arg(encode(changed.iter().copied())).ignore();
                }
                if !removed.is_empty() {
                    pipe.cmd("HDEL").arg(&instances).arg(removed.iter().map(|id| &***id).collect::<Vec<_>>()).ignore();
                }
                pipe.cmd("HSET").arg(&instances).arg(VERSION_FIELD).arg(&token).ignore();
                if changed.len() + removed.len() <= IDS_PER_CHANGE {
                    ids = Some(changed.iter().map(|(id, _)| &***id).chain(removed.iter().map(|id| &***id)).collect());
                }
            }
            pipe.cmd("SADD").arg(&holders).arg(&*self.liveness.replica).ignore();
            announce.cmd("SADD").arg(SERVICES).arg(&**service).ignore();
        }
        let entry = announce.cmd("XADD");
        entry.arg(CHANGES).arg("MAXLEN").arg("~").arg(CHANGES_KEPT).arg("*");
        entry.arg("s").arg(&**service).arg("r").arg(&*self.liveness.replica);
        if let Some(ids) = ids {
            entry.arg("ids").arg(ids.join(" "));
        }
        entry.ignore();
        // One round trip per step, each within the command timeout of its own: a slow Redis
        // costs time, not the link. A step that fails leaves the service to be written again.
        let Some(previous) = self.link.run(|mut c| async move { renew.query_async::<Vec<Value>>(&mut c).await }).await
        else {
            return false;
        };
        self.liveness.renewed(previous.first().unwrap_or(&Value::Nil));
        if !self.link.sequence(vec![pipe, announce]).await {
            return false;
        }
        self.rewrite.remove(service);
        if own.is_empty() {
            self.written.remove(service);
        } else {
            self.written.insert(service.clone(), own);
        }
        true
    }

    /// Every service any replica wrote; also moves the change cursor to the stream's end.
    async fn all_services(&mut self) -> Option<Changes> {
        let last: Value = self
            .link
            .run(|mut c| async move {
                redis::cmd("XREVRANGE").arg(CHANGES).arg("+").arg("-").arg("COUNT").arg(1).query_async(&mut c).await
            })
            .await?;
        if let Some((id, _)) = entries(&last).into_iter().next() {
            self.last_change = id;
        }
        let services: Vec<String> = self
            .link
            .run(|mut c| async move { redis::cmd("SMEMBERS").arg(SERVICES).query_async(&mut c).await })
            .await?;
        let mut changes = Changes::default();
        changes.whole.extend(services);
        // Services this replica mirrors but nobody lists any more are dropped too.
        changes.whole.extend(self.mirrors.keys().map(|(_, s)| s.to_string()));
        Some(changes)
    }

    /// What other replicas changed since the last read.
    async fn read_changes(&mut self) -> Option<Changes> {
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
        let mut changes = Changes::default();
        // XREAD answers [[stream, [[id, [field, value, ...]], ...]]], or nil.
        if let Value::Array(streams) = &reply
            && let Some(Value::Array(stream)) = streams.first()
            && let Some(list) = stream.get(1)
        {
            for (id, fields) in entries(list) {
                self.last_change = id;
                let field = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
                let (Some(service), Some(holder)) = (field("s"), field("r")) else { continue };
                if holder == *self.liveness.replica {
                    continue;
                }
                match field("ids") {
                    Some(ids) => {
                        changes.ids.entry((service, holder)).or_default().extend(ids.split(' ').map(str::to_owned))
                    }
                    None => {
                        changes.whole.insert(service);
                    }
                }
            }
        }
        Some(changes)
    }

    /// Copies the other live replicas' instances of `service`; false when Redis did not answer.
    async fn apply(&mut self, service: &str) -> bool {
        let holders_key = keys::holders(service);
        let Some(holders) =
            self.link
                .run(|mut c| async move {
                    redis::cmd("SMEMBERS").arg(&holders_key).query_async::<Vec<String>>(&mut c).await
                })
                .await
        else {
            return false;
        };
        let mut holders: Vec<String> = holders.into_iter().filter(|h| **h != *self.liveness.replica).collect();
        let service: Arc<str> = service.into();
        // Holders this replica mirrors that the set no longer lists: gone for good if their key
        // is alive (they hold nothing of the service now), or after the grace if not.
        let listed = holders.len();
        let unlisted: BTreeSet<String> = self
            .mirrors
            .keys()
            .filter(|(h, s)| *s == service && !holders.contains(h))
            .map(|(h, _)| h.clone())
            .collect();
        holders.extend(unlisted);
        let Some(alive) = self.alive(&holders).await else { return false };
        let now = Instant::now();
        let mut present = HashSet::new();
        let mut dead = Vec::new();
        for (n, (holder, alive)) in holders.into_iter().zip(alive).enumerate() {
            if !self.presumed_alive(&holder, alive, now) {
                dead.push(holder);
                continue;
            }
            if !alive || n >= listed {
                // Missing for now: kept as it was until it writes itself back or the grace ends.
                if !alive {
                    present.insert(holder);
                }
                continue;
            }
            let key = keys::instances(&service, &holder);
            // A hash whose token has not moved since it was last read whole is skipped.
            let known = self.mirrors.get(&(holder.clone(), service.clone())).and_then(|m| m.version.clone());
            if let Some(known) = known {
                let asked = key.clone();
                let Some(token) = self
                    .link
                    .run(|mut c| async move {
                        redis::cmd("HGET").arg(&asked).arg(VERSION_FIELD).query_async::<Option<String>>(&mut c).await
                    })
                    .await
                else {
                    return false;
                };
                if token.as_deref() == Some(known.as_str()) {
                    present.insert(holder);
                    continue;
                }
            }
            let Some(mut encoded) = self
                .link
                .run(|mut c| async move {
                    redis::cmd("HGETALL").arg(&key).query_async::<HashMap<String, String>>(&mut c).await
                })
                .await
            else {
                return false;
            };
            let version = encoded.remove(VERSION_FIELD);
            let desired: HashMap<String, InstanceRecord> =
                encoded.into_values().filter_map(|e| decode(&e)).map(|s| (s.id.clone(), s)).collect();
            if !desired.is_empty() {
                present.insert(holder.clone());
                let wanted = desired.len();
                let mirror = self.mirror(holder, &service);
                let gone: Vec<String> = mirror.held.keys().filter(|id| !desired.contains_key(*id)).cloned().collect();
                let changed: Vec<InstanceRecord> =
                    desired.into_values().filter(|s| mirror.held.get(&s.id) != Some(s)).collect();
                update(mirror, &service, changed, gone).await;
                // Instances this registry refused (an id held here too) are tried again at the
                // next resync: the hash is only skipped once all of it was taken.
                mirror.version = if mirror.held.len() == wanted { version } else { None };
            }
        }
        self.mirrors.retain(|(holder, s), _| *s != service || present.contains(holder));
        self.clear(&dead, std::slice::from_ref(&service)).await
    }

    /// Removes the entries of dead `replicas` for `services` from Redis; false when Redis did
    /// not answer. Any replica may clear a dead one's entries: one that was only slow writes
    /// them again when it finds its key had expired.
    async fn clear(&self, replicas: &[String], services: &[Arc<str>]) -> bool {
        if replicas.is_empty() || services.is_empty() {
            return true;
        }
        let groups = services
            .iter()
            .map(|service| {
                let mut pipe = redis::pipe();
                for replica in replicas {
                    pipe.cmd("DEL").arg(keys::instances(service, replica)).ignore();
                    pipe.cmd("SREM").arg(keys::holders(service)).arg(replica).ignore();
                }
                pipe
            })
            .collect();
        self.link.sequence(groups).await
    }

    /// Copies the named instances of `holder`'s `service` again; false when Redis did not answer.
    async fn apply_ids(&mut self, service: &str, holder: String, ids: BTreeSet<String>) -> bool {
        let key = keys::instances(service, &holder);
        let ids: Vec<String> = ids.into_iter().collect();
        let asked = ids.clone();
        let Some(encoded) = self
            .link
            .run(|mut c| async move {
                redis::cmd("HMGET").arg(&key).arg(&asked).query_async::<Vec<Option<String>>>(&mut c).await
            })
            .await
        else {
            return false;
        };
        let service: Arc<str> = service.into();
        let mirror = self.mirror(holder.clone(), &service);
        let (mut changed, mut gone) = (Vec::new(), Vec::new());
        for (id, encoded) in ids.into_iter().zip(encoded) {
            match encoded.as_deref().and_then(decode) {
                Some(shared) if mirror.held.get(&id) != Some(&shared) => changed.push(shared),
                Some(_) => {}
                None if mirror.held.contains_key(&id) => gone.push(id),
                None => {}
            }
        }
        update(mirror, &service, changed, gone).await;
        mirror.version = None;
        if mirror.held.is_empty() {
            self.mirrors.remove(&(holder, service));
        }
        true
    }

    /// This registry's copy of `holder`'s instances of `service`, opened when missing.
    fn mirror(&mut self, holder: String, service: &Arc<str>) -> &mut Mirror {
        let registry = &self.registry;
        self.mirrors.entry((holder, service.clone())).or_insert_with(|| Mirror {
            lease: registry.open_mirror_lease(MIRROR_LIMIT),
            held: HashMap::new(),
            version: None,
        })
    }

    /// Whether each replica's key is alive; `None` when Redis did not answer.
    async fn alive(&self, replicas: &[String]) -> Option<Vec<bool>> {
        if replicas.is_empty() {
            return Some(Vec::new());
        }
        let mut pipe = redis::pipe();
        for replica in replicas {
            pipe.cmd("EXISTS").arg(keys::replica(replica));
        }
        self.link.run(|mut c| async move { pipe.query_async::<Vec<bool>>(&mut c).await }).await
    }

    /// Whether `holder` counts as alive: its key is; or, while a missing key may be Redis's
    /// data loss, it has been missing for less than [`REPLICA_LEASE`].
    fn presumed_alive(&mut self, holder: &str, alive: bool, now: Instant) -> bool {
        if alive {
            self.absent_since.remove(holder);
            return true;
        }
        let unsure = self.unsure_until.is_some_and(|until| now < until);
        if !unsure && !self.absent_since.contains_key(holder) {
            return false;
        }
        let since = *self.absent_since.entry(holder.to_owned()).or_insert(now);
        now.duration_since(since) < REPLICA_LEASE
    }

    /// Drops the copies of replicas whose key has been gone for [`REPLICA_LEASE`], and their
    /// entries in Redis.
    async fn drop_dead_replicas(&mut self) {
        let holders: Vec<String> =
            self.mirrors.keys().map(|(h, _)| h.clone()).collect::<BTreeSet<_>>().into_iter().collect();
        let Some(alive) = self.alive(&holders).await else { return };
        let now = Instant::now();
        self.absent_since.retain(|h, _| holders.contains(h));
        for (holder, alive) in holders.into_iter().zip(alive) {
            if self.presumed_alive(&holder, alive, now) {
                continue;
            }
            self.absent_since.remove(&holder);
            tracing::info!(replica = %holder, "replica gone: its instances are dropped");
            let services: Vec<Arc<str>> =
                self.mirrors.keys().filter(|(h, _)| *h == holder).map(|(_, s)| s.clone()).collect();
            self.mirrors.retain(|(h, _), _| *h != holder);
            if !self.clear(std::slice::from_ref(&holder), &services).await {
                return;
            }
        }
    }
}

/// Makes `mirror` hold `changed` (added or replaced) and no longer hold `gone`.
async fn update(mirror: &mut Mirror, service: &Arc<str>, changed: Vec<InstanceRecord>, gone: Vec<String>) {
    if !gone.is_empty() {
        let refs = gone.iter().map(|id| InstanceRef { service: service.to_string(), id: id.clone() }).collect();
        let _ = mirror.lease.withdraw(refs).await;
        for id in &gone {
            mirror.held.remove(id);
        }
    }
    if changed.is_empty() {
        return;
    }
    let specs: Vec<InstanceSpec> = changed.iter().cloned().map(|s| s.spec(service)).collect();
    if let Ok(outcome) = mirror.lease.announce(specs).await {
        let accepted: HashSet<String> = outcome.accepted.into_iter().map(|r| r.id).collect();
        for shared in changed {
            if accepted.contains(&shared.id) {
                mirror.held.insert(shared.id.clone(), shared);
            } else {
                mirror.held.remove(&shared.id);
            }
        }
        for (instance, why) in outcome.refused {
            tracing::debug!(service = %instance.service, id = %instance.id, %why, "another replica's instance not copied");
        }
    }
}

/// `id, json, id, json, …` for an HSET.
fn encode<'a>(instances: impl Iterator<Item = (&'a Arc<str>, &'a InstanceRecord)>) -> Vec<String> {
    instances.flat_map(|(id, shared)| [id.to_string(), serde_json::to_string(shared).unwrap_or_default()]).collect()
}

fn decode(encoded: &str) -> Option<InstanceRecord> {
    serde_json::from_str(encoded).ok()
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
