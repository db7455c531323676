//! The instance table shared by the replicas.
//!
//! Each replica writes the instances its own registration streams hold, per service, into the
//! hash `rota:{SERVICE}:instances:REPLICA` (one field per instance id, its JSON as the value,
//! and the field `~v` holding the replica's sequence number of its last write), lists itself
//! in `rota:{SERVICE}:holders`, and appends an entry to the stream `rota:{~fleet}:changes` per
//! change: the service, itself, the sequence number, when its registry published the change,
//! and the ids that changed (up to [`IDS_PER_CHANGE`]) with, for a change of up to
//! [`INLINE_RECORDS`] instances, the instances themselves; an entry without ids stands for the
//! whole service. Only what changed is written: one instance's change in a service of 100,000
//! costs one field, not the whole table. Each publication of the registry is one change, and
//! every change waiting is written in one round trip. The replica keeps
//! `rota:{~fleet}:replica:REPLICA` alive with an expiry of [`REPLICA_LEASE`], renewed every [`POLL`].
//!
//! Every replica reads the change stream every [`FOLLOW`] (never two reads at once: a read
//! waits for the previous one's answer, so a Redis slower than that is read back to back) and
//! applies its entries in order into one *mirror lease* per (replica, service): an entry that
//! carries its instances as it stands, one that names ids by reading those, one that names
//! none by reading the hash whole. Reads and writes run side by side: a write never waits for a
//! read, nor a read for a write. A full table read every [`RESYNC`] repairs anything missed: it
//! reads a hash whole only when its version moved since it was last copied, and is applied
//! only where no newer entry was applied since it started; it announces to the registry only
//! what differs from the copy. So a registration on one replica reaches the others within
//! about one round trip to Redis each way plus one read, and every replica builds its pick
//! views from the merged table; [`super::lag`] measures how long each change took.
//!
//! A replica that dies stops renewing its key: within [`REPLICA_LEASE`] plus one poll, the
//! others drop its mirror leases, and with them its instances, and clear its entries in Redis;
//! nothing else is touched. Right after Redis may have lost its data (this replica's link came
//! back, or the data set's generation changed), a missing key or holders entry is no proof of
//! death: every key is missing at once while every replica is alive and writing itself back
//! within a poll or two. For [`REPLICA_LEASE`] after such an event, a holder is dropped only once
//! it has been missing for [`REPLICA_LEASE`], so the others' copies do not blink out meanwhile.
//! A replica that finds its own key had expired (it was too slow to renew it) writes
//! everything it holds again. While Redis is unreachable each replica keeps what it has (its
//! own streams' instances and its last copy of the others'); when the link returns it writes
//! its instances again, whole, and reads every table again.
//!
//! The same id registered on two replicas: a registration stream's announce first claims its
//! ids in Redis ([`super::claims`]), so the first replica to hold an id keeps it and the other
//! refuses it with `ALREADY_EXISTS`, exactly as one server refuses a second stream.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::Value;
use tokio::sync::broadcast::error::RecvError;
use tokio::time::{Instant, MissedTickBehavior};

use super::table_read::{self, Body, Entry, Followed, ServiceTables, Table};
pub use super::table_write::INLINE_RECORDS;
use super::table_write::{self, ChangeSet};
use crate::registry::{InstanceRecord, InstanceRef, InstanceSpec, Lease, Registry};
use crate::state::redis::Link;
use crate::state::redis::keys;

/// How long a replica's instances outlive its last renewal.
pub const REPLICA_LEASE: Duration = Duration::from_secs(5);
/// Time between renewals of the replica's key (and checks of the others').
pub const POLL: Duration = Duration::from_millis(200);
/// Time between reads of the change stream (a read also waits for the previous one).
pub const FOLLOW: Duration = Duration::from_millis(50);
/// Time between full reads of every table.
pub const RESYNC: Duration = Duration::from_secs(10);
/// Entries the change stream keeps (approximately).
pub(super) const CHANGES_KEPT: usize = 10_000;
/// The field of an instances hash that holds the writer's sequence number of its last write
/// (`~` is not allowed in an instance id).
pub(super) const VERSION_FIELD: &str = "~v";
/// Ids one change entry names at most; a larger change stands for the whole service.
pub const IDS_PER_CHANGE: usize = 128;
/// Changes read per read of the stream.
pub(super) const CHANGES_PER_READ: usize = 1000;
/// Instances one mirror lease may hold: what another replica holds of one service.
const MIRROR_LIMIT: usize = 1_000_000;
/// Changes waiting to be written at most; past it, changes of a service are merged into one.
const MAX_WAITING: usize = 4096;

/// A call to Redis under way (its answer `None` when Redis did not answer).
type Call<T> = Pin<Box<dyn Future<Output = Option<T>> + Send>>;
type Pending<T> = Option<Call<T>>;
/// What a table read answers: the tables, and the stream's end when it placed the cursor.
type TablesRead = (Vec<ServiceTables>, Option<Option<String>>);
/// The sequence number of each mirror, by (holder, service), when a table read started.
type Started = HashMap<(String, Arc<str>), u64>;

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
    /// The writer's sequence number of the last change applied (entry or whole table).
    seq: u64,
    /// Whether every instance applied was accepted (a table whose version is `seq` is then
    /// not read whole again).
    complete: bool,
}

/// Shares the instance table through Redis until the registry stops.
pub struct TableSharing {
    liveness: Arc<Liveness>,
    registry: Registry,
    link: Arc<Link>,
    mirrors: HashMap<(String, Arc<str>), Mirror>,
    /// What this replica last wrote (or has waiting) for each service, by id.
    written: HashMap<Arc<str>, HashMap<Arc<str>, InstanceRecord>>,
    /// Services whose hash in Redis may hold stale entries: written again whole.
    rewrite: HashSet<Arc<str>>,
    /// Services changed while no change could be recorded (the link down, or too many waiting).
    dirty: HashSet<Arc<str>>,
    /// Changes waiting to be written, in order.
    waiting: Vec<ChangeSet>,
    /// This replica's last sequence number.
    seq: u64,
    /// The change stream's cursor; `None` until the first full read placed it at the end.
    last_change: Option<String>,
    recoveries: u64,
    /// Since when each holder of a mirror has been seen without its key or holders entry, while
    /// that may be Redis's data loss rather than death. At most one entry per holder of a mirror.
    absent_since: HashMap<String, Instant>,
    /// Until when a missing key may be Redis's data loss: [`REPLICA_LEASE`] after the link came
    /// back or the generation changed.
    unsure_until: Option<Instant>,
    /// The link's generation changes last seen.
    generations: u64,
    /// Services whose tables are to be read whole (entries that named no instances).
    to_read: BTreeSet<String>,
}

/// A table read in flight: the sequence number of each mirror when it started.
struct TableRead {
    started: Started,
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
            waiting: Vec::new(),
            seq: 0,
            last_change: None,
            recoveries: 0,
            absent_since: HashMap::new(),
            unsure_until: None,
            generations: 0,
            to_read: BTreeSet::new(),
        };
        tokio::spawn(sharing.run())
    }

    async fn run(mut self) {
        let mut published = self.registry.published();
        let mut tick = tokio::time::interval(FOLLOW);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut next_resync = Instant::now();
        let mut next_renewal = Instant::now();
        let mut writing: Pending<Vec<Value>> = None;
        let mut following: Pending<Followed> = None;
        let mut reading: Pending<TablesRead> = None;
        let mut read: Option<TableRead> = None;
        loop {
            tokio::select! {
                changed = published.recv() => {
                    match changed {
                        Ok(services) => self.dirty.extend(services.iter().cloned()),
                        Err(RecvError::Lagged(_)) => self.all_dirty(),
                        Err(RecvError::Closed) => return,
                    }
                    self.record();
                }
                Some(answers) = finish(&mut writing) => {
                    self.liveness.renewed(answers.first().unwrap_or(&Value::Nil));
                }
                Some(followed) = finish(&mut following) => self.followed(followed).await,
                Some((tables, end)) = finish(&mut reading) => {
                    if let Some(read) = read.take() {
                        self.read_tables(tables, &read.started).await;
                    }
                    if let Some(end) = end {
                        self.last_change.get_or_insert(end.unwrap_or_else(|| "0-0".into()));
                    }
                }
                _ = tick.tick() => {
                    if !self.link.is_up() {
                        // Copies are kept (and their leases alive) while Redis is unreachable.
                        for mirror in self.mirrors.values() {
                            mirror.lease.touch();
                        }
                        continue;
                    }
                    let now = Instant::now();
                    let recoveries = self.link.recoveries();
                    let mut full = now >= next_resync || self.last_change.is_none();
                    if recoveries != self.recoveries {
                        // Redis may have lost everything, or kept what was there before: the
                        // cursor moves to the stream's end and every table is read again.
                        self.recoveries = recoveries;
                        self.write_all_again();
                        self.unsure_until = Some(now + REPLICA_LEASE);
                        self.last_change = None;
                        full = true;
                    }
                    let generations = self.link.generation_changes();
                    if generations != self.generations {
                        self.generations = generations;
                        self.unsure_until = Some(now + REPLICA_LEASE);
                    }
                    if self.liveness.take_lapsed() && !self.written.is_empty() {
                        // This replica's key had lapsed: the others took it for dead and may
                        // have removed its entries. Everything it holds is written again.
                        tracing::info!(replica = %self.liveness.replica, "this replica's key had expired; writing its instances again");
                        self.write_all_again();
                    }
                    if reading.is_none() && (full || !self.to_read.is_empty()) {
                        if full {
                            next_resync = now + RESYNC;
                        }
                        let services = std::mem::take(&mut self.to_read);
                        let (future, started) = self.read_tables_start(full, services);
                        reading = Some(future);
                        read = Some(TableRead { started });
                    }
                    if following.is_none() && let Some(from) = self.last_change.clone() {
                        let renew = (now >= next_renewal).then(|| {
                            next_renewal = now + POLL;
                            for mirror in self.mirrors.values() {
                                mirror.lease.touch();
                            }
                            let mut pipe = redis::pipe();
                            self.liveness.renew(&mut pipe);
                            pipe
                        });
                        let holders: Vec<String> = if renew.is_some() { self.holders() } else { Vec::new() };
                        let link = self.link.clone();
                        following = Some(Box::pin(table_read::follow(link, renew, from, holders)));
                    }
                }
            }
            if writing.is_none() && !self.waiting.is_empty() && self.link.is_up() {
                let groups = table_write::groups(&self.liveness, &self.waiting);
                self.waiting.clear();
                let link = self.link.clone();
                writing = Some(Box::pin(async move { link.in_order(groups).await }));
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
        self.waiting.clear();
        self.all_dirty();
        self.record();
    }

    /// The holders of every mirror, once each.
    fn holders(&self) -> Vec<String> {
        self.mirrors.keys().map(|(h, _)| h.clone()).collect::<BTreeSet<_>>().into_iter().collect()
    }

    /// Turns every dirty service into the change of this replica's own instances it made, if
    /// any, waiting to be written; while the link is down, or too many wait, they stay dirty.
    fn record(&mut self) {
        if !self.link.is_up() || self.waiting.len() >= MAX_WAITING {
            return;
        }
        let published_ms = super::lag::now_ms();
        let dirty: Vec<Arc<str>> = self.dirty.drain().collect();
        for service in dirty {
            if let Some(set) = self.change_of(&service, published_ms) {
                self.waiting.push(set);
            }
        }
    }

    /// What changed in this replica's own instances of `service` since it was last recorded.
    fn change_of(&mut self, service: &Arc<str>, published_ms: u64) -> Option<ChangeSet> {
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
        let whole = self.rewrite.remove(service);
        let empty = HashMap::new();
        let before = if whole { &empty } else { self.written.get(service).unwrap_or(&empty) };
        let changed: Vec<(Arc<str>, InstanceRecord)> =
            own.iter().filter(|(id, s)| before.get(*id) != Some(*s)).map(|(id, s)| (id.clone(), s.clone())).collect();
        let removed: Vec<Arc<str>> = before.keys().filter(|id| !own.contains_key(*id)).cloned().collect();
        if !whole && changed.is_empty() && removed.is_empty() {
            return None;
        }
        self.seq += 1;
        let set = ChangeSet {
            service: service.clone(),
            changed,
            removed,
            whole,
            empty: own.is_empty(),
            seq: self.seq,
            published_ms,
        };
        if own.is_empty() {
            self.written.remove(service);
        } else {
            self.written.insert(service.clone(), own);
        }
        Some(set)
    }

    /// Applies what one read of the change stream found.
    async fn followed(&mut self, followed: Followed) {
        let Followed { renewed, entries, last_id, holders } = followed;
        if let Some(renewed) = renewed {
            self.liveness.renewed(&renewed);
            self.drop_dead_replicas(holders).await;
        }
        if self.last_change.is_none() {
            // A full read is placing the cursor again: these entries are in it.
            return;
        }
        if let Some(last) = last_id {
            self.last_change = Some(last);
        }
        self.link.propagation().read();
        for entry in entries {
            if *entry.holder != *self.liveness.replica {
                self.apply_entry(entry).await;
            }
        }
    }

    /// Applies one entry of another replica, unless a newer table of that replica was applied.
    async fn apply_entry(&mut self, entry: Entry) {
        let Entry { service, holder, seq, published_ms, body } = entry;
        let key = (holder.clone(), Arc::<str>::from(service.as_str()));
        if seq != 0 && self.mirrors.get(&key).is_some_and(|m| seq <= m.seq) {
            return;
        }
        let (changed, gone) = match body {
            Body::Whole => {
                self.to_read.insert(service);
                return;
            }
            Body::Inline { set, removed } => (set, removed),
            Body::Ids(ids) => {
                let ids: Vec<String> = ids.into_iter().collect();
                let Some(records) = table_read::records(&self.link, &service, &holder, &ids).await else {
                    // Redis did not answer: the next full read repairs it.
                    return;
                };
                let (mut changed, mut gone) = (Vec::new(), Vec::new());
                for (id, record) in ids.into_iter().zip(records) {
                    match record {
                        Some(record) => changed.push(record),
                        None => gone.push(id),
                    }
                }
                (changed, gone)
            }
        };
        let service = key.1.clone();
        let mirror = self.mirror(holder.clone(), &service);
        let changed: Vec<InstanceRecord> = changed.into_iter().filter(|s| mirror.held.get(&s.id) != Some(s)).collect();
        let gone: Vec<String> = gone.into_iter().filter(|id| mirror.held.contains_key(id)).collect();
        update(mirror, &service, changed, gone).await;
        mirror.seq = mirror.seq.max(seq);
        if let Some(published_ms) = published_ms {
            self.link.propagation().copied(&holder, published_ms);
        }
    }

    /// Starts a read of the tables of `services`, or of every table when `full`.
    fn read_tables_start(&self, full: bool, services: BTreeSet<String>) -> (Call<TablesRead>, Started) {
        let mut copied: HashMap<String, HashMap<String, Option<u64>>> = HashMap::new();
        for ((holder, service), mirror) in &self.mirrors {
            let known = mirror.complete.then_some(mirror.seq);
            copied.entry(service.to_string()).or_default().insert(holder.clone(), known);
        }
        let started = self.mirrors.iter().map(|(key, mirror)| (key.clone(), mirror.seq)).collect();
        let (link, me) = (self.link.clone(), self.liveness.replica.clone());
        let place_cursor = self.last_change.is_none();
        let future = async move {
            // The cursor is placed before the tables are read: what is written after is read
            // from the stream, what was written before is in the tables.
            let end = if place_cursor { Some(table_read::stream_end(&link).await?) } else { None };
            let tables = table_read::tables(link, me, full, services, copied).await?;
            Some((tables, end))
        };
        (Box::pin(future), started)
    }

    /// Applies what a table read found, where no newer entry was applied since it started.
    async fn read_tables(&mut self, found: Vec<ServiceTables>, started: &Started) {
        let now = Instant::now();
        for ServiceTables { service, listed, alive, mut tables } in found {
            let service: Arc<str> = service.into();
            let mut dead = Vec::new();
            for (holder, alive) in alive {
                let key = (holder.clone(), service.clone());
                if !self.presumed_alive(&holder, alive, now) {
                    dead.push(holder.clone());
                    self.mirrors.remove(&key);
                    continue;
                }
                // Unchanged since the read started: what it found is no older than the copy.
                let untouched = self.mirrors.get(&key).map(|m| m.seq) == started.get(&key).copied();
                match tables.remove(&holder) {
                    Some(Table::Unchanged) => {}
                    Some(Table::Read { seq, records }) => {
                        let newer = self.mirrors.get(&key).is_some_and(|m| m.seq > seq && seq != 0);
                        if newer || (seq == 0 && !untouched) {
                            continue;
                        }
                        self.copy_whole(holder, &service, seq, records).await;
                    }
                    // Alive but unlisted: it holds nothing of the service now.
                    None if alive && !listed.contains(&holder) && untouched => {
                        self.mirrors.remove(&key);
                    }
                    // Missing for now: kept as it was until it writes itself back or the grace ends.
                    None => {}
                }
            }
            if !dead.is_empty() {
                for holder in &dead {
                    self.link.propagation().forget(holder);
                }
                self.clear(&dead, std::slice::from_ref(&service)).await;
            }
        }
    }

    /// Makes the copy of `holder`'s `service` hold `records`, read whole at version `seq`.
    async fn copy_whole(
        &mut self,
        holder: String,
        service: &Arc<str>,
        seq: u64,
        records: HashMap<String, InstanceRecord>,
    ) {
        if records.is_empty() {
            self.mirrors.remove(&(holder, service.clone()));
            return;
        }
        let wanted = records.len();
        let mirror = self.mirror(holder, service);
        let gone: Vec<String> = mirror.held.keys().filter(|id| !records.contains_key(*id)).cloned().collect();
        let changed: Vec<InstanceRecord> =
            records.into_values().filter(|s| mirror.held.get(&s.id) != Some(s)).collect();
        update(mirror, service, changed, gone).await;
        mirror.seq = seq;
        // Instances this registry refused (an id held here too) are tried again at the next
        // full read: the table is only skipped once all of it was taken.
        mirror.complete = mirror.held.len() == wanted;
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

    /// This registry's copy of `holder`'s instances of `service`, opened when missing.
    fn mirror(&mut self, holder: String, service: &Arc<str>) -> &mut Mirror {
        let registry = &self.registry;
        self.mirrors.entry((holder, service.clone())).or_insert_with(|| Mirror {
            lease: registry.open_mirror_lease(MIRROR_LIMIT),
            held: HashMap::new(),
            seq: 0,
            complete: true,
        })
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

    /// Drops the copies of replicas whose key has been gone for [`REPLICA_LEASE`] (`holders`
    /// with whether each key was alive), and their entries in Redis.
    async fn drop_dead_replicas(&mut self, holders: Vec<(String, bool)>) {
        let now = Instant::now();
        self.absent_since.retain(|h, _| holders.iter().any(|(held, _)| held == h));
        for (holder, alive) in holders {
            if !self.mirrors.keys().any(|(h, _)| *h == holder) {
                continue;
            }
            if self.presumed_alive(&holder, alive, now) {
                continue;
            }
            self.absent_since.remove(&holder);
            tracing::info!(replica = %holder, "replica gone: its instances are dropped");
            self.link.propagation().forget(&holder);
            let services: Vec<Arc<str>> =
                self.mirrors.keys().filter(|(h, _)| *h == holder).map(|(_, s)| s.clone()).collect();
            self.mirrors.retain(|(h, _), _| *h != holder);
            if !self.clear(std::slice::from_ref(&holder), &services).await {
                return;
            }
        }
    }
}

/// Waits for `pending`'s answer (forever when there is none) and empties it.
async fn finish<T>(pending: &mut Pending<T>) -> Option<T> {
    let answer = match pending.as_mut() {
        Some(future) => future.await,
        None => std::future::pending().await,
    };
    *pending = None;
    // A call that failed answers nothing: the link is down, and the keeper brings it back.
    answer
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
                mirror.complete = false;
            }
        }
        for (instance, why) in outcome.refused {
            tracing::debug!(service = %instance.service, id = %instance.id, %why, "another replica's instance not copied");
        }
    }
}
