//! What a replica reads of the others' instances: the change stream, and whole tables.
//!
//! Both reads run beside the replica's writes, never in their way: [`follow`] reads the
//! entries after a cursor (with the renewal of the replica's key and the liveness of the
//! replicas it copies, in one round trip), and [`tables`] reads the tables of some services,
//! skipping each hash whose version is the one last copied. A table read may answer after
//! entries newer than it were applied: its caller compares versions before applying it.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use redis::Value;

use super::table::{CHANGES_PER_READ, VERSION_FIELD};
use crate::registry::InstanceRecord;
use crate::state::redis::Link;
use crate::state::redis::keys::{self, CHANGES, SERVICES};

/// One entry of the change stream: one replica's change of one service.
pub(super) struct Entry {
    pub service: String,
    pub holder: String,
    /// The writer's sequence number of the change (0 from a writer that numbers none).
    pub seq: u64,
    /// When the writer's registry published the change (its clock, ms since the epoch).
    pub published_ms: Option<u64>,
    pub body: Body,
}

pub(super) enum Body {
    /// The instances set and the ids removed, as the entry carries them.
    Inline { set: Vec<InstanceRecord>, removed: Vec<String> },
    /// Ids to read again from the writer's hash.
    Ids(BTreeSet<String>),
    /// The writer's hash is to be read whole.
    Whole,
}

/// The answer of one [`follow`].
pub(super) struct Followed {
    /// The renewal's answer, when one was asked.
    pub renewed: Option<Value>,
    /// The entries after the cursor, in order, with the id of the last one.
    pub entries: Vec<Entry>,
    pub last_id: Option<String>,
    /// Each replica asked about, and whether it is alive.
    pub holders: Vec<(String, bool)>,
}

/// Reads the change stream after `from`, renewing this replica's key with `renew` and asking
/// whether each of `holders` is alive, in one round trip (every key is `{~fleet}`'s).
pub(super) async fn follow(
    link: Arc<Link>,
    renew: Option<redis::Pipeline>,
    from: String,
    holders: Vec<String>,
) -> Option<Followed> {
    let renewing = renew.is_some();
    let mut pipe = renew.unwrap_or_else(redis::pipe);
    pipe.cmd("XREAD").arg("COUNT").arg(CHANGES_PER_READ).arg("STREAMS").arg(CHANGES).arg(&from);
    for holder in &holders {
        pipe.cmd("EXISTS").arg(keys::replica(holder));
    }
    let mut answers = link.run(|mut c| async move { pipe.query_async::<Vec<Value>>(&mut c).await }).await?.into_iter();
    let renewed = if renewing { Some(answers.next()?) } else { None };
    let reply = answers.next()?;
    let holders = holders.into_iter().zip(answers.map(|v| matches!(v, Value::Int(n) if n > 0))).collect();
    let mut entries = Vec::new();
    let mut last_id = None;
    // XREAD answers [[stream, [[id, [field, value, ...]], ...]]], or nil (RESP3: a map).
    let list = match &reply {
        Value::Array(streams) => match streams.first() {
            Some(Value::Array(stream)) => stream.get(1).cloned(),
            _ => None,
        },
        Value::Map(streams) => streams.first().map(|(_, list)| list.clone()),
        _ => None,
    };
    for (id, fields) in list.as_ref().map(raw_entries).unwrap_or_default() {
        last_id = Some(id);
        if let Some(entry) = parse(&fields) {
            entries.push(entry);
        }
    }
    Some(Followed { renewed, entries, last_id, holders })
}

fn parse(fields: &[(String, String)]) -> Option<Entry> {
    let field = |name: &str| fields.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    let body = match (field("set"), field("del"), field("ids")) {
        (Some(set), del, _) => match serde_json::from_str(set) {
            Ok(set) => Body::Inline {
                set,
                removed: del.unwrap_or("").split(' ').filter(|id| !id.is_empty()).map(str::to_owned).collect(),
            },
            Err(_) => Body::Whole,
        },
        (None, _, Some(ids)) => Body::Ids(ids.split(' ').filter(|id| !id.is_empty()).map(str::to_owned).collect()),
        (None, _, None) => Body::Whole,
    };
    Some(Entry {
        service: field("s")?.to_owned(),
        holder: field("r")?.to_owned(),
        seq: field("q").and_then(|q| q.parse().ok()).unwrap_or(0),
        published_ms: field("t").and_then(|t| t.parse().ok()),
        body,
    })
}

/// The last entry's id in the stream (`None` while it is empty); `None` outside when Redis
/// did not answer.
pub(super) async fn stream_end(link: &Link) -> Option<Option<String>> {
    let last: Value = link
        .run(|mut c| async move {
            redis::cmd("XREVRANGE").arg(CHANGES).arg("+").arg("-").arg("COUNT").arg(1).query_async(&mut c).await
        })
        .await?;
    Some(raw_entries(&last).into_iter().next().map(|(id, _)| id))
}

/// One replica's table of one service, as a table read found it.
pub(super) enum Table {
    /// Its version is the one last copied.
    Unchanged,
    /// Read whole: its version (0 when it carries none) and its instances.
    Read { seq: u64, records: HashMap<String, InstanceRecord> },
}

/// What a table read found of one service.
pub(super) struct ServiceTables {
    pub service: String,
    /// The replicas the service's holders set lists, other than this one.
    pub listed: Vec<String>,
    /// Whether each replica of `listed`, then of the unlisted ones this replica copies, is alive.
    pub alive: Vec<(String, bool)>,
    /// The tables of the live listed replicas.
    pub tables: HashMap<String, Table>,
}

/// Reads the tables of `services` (of every service any replica wrote, too, when `all`),
/// in a few round trips whatever their number. `copied` names, per service, the replicas whose
/// table this replica copies, with the version it copied when it is complete (the table is
/// then read whole only when its version moved).
pub(super) async fn tables(
    link: Arc<Link>,
    me: Arc<str>,
    all: bool,
    mut services: BTreeSet<String>,
    copied: HashMap<String, HashMap<String, Option<u64>>>,
) -> Option<Vec<ServiceTables>> {
    if all {
        let listed: Vec<String> =
            link.run(|mut c| async move { redis::cmd("SMEMBERS").arg(SERVICES).query_async(&mut c).await }).await?;
        services.extend(listed);
        services.extend(copied.keys().cloned());
    }
    let services: Vec<String> = services.into_iter().collect();
    if services.is_empty() {
        return Some(Vec::new());
    }
    let holders: Vec<Vec<String>> = link
        .together(
            services
                .iter()
                .map(|s| {
                    let mut pipe = redis::pipe();
                    pipe.cmd("SMEMBERS").arg(keys::holders(s));
                    pipe
                })
                .collect(),
        )
        .await?;
    let mut found: Vec<ServiceTables> = Vec::with_capacity(services.len());
    let mut asked = Vec::new();
    for (service, holders) in services.into_iter().zip(holders) {
        let listed: Vec<String> = holders.into_iter().filter(|h| *h != *me).collect();
        let mut replicas = listed.clone();
        let unlisted = copied.get(&service).into_iter().flat_map(|c| c.keys()).filter(|h| !listed.contains(h));
        replicas.extend(unlisted.cloned().collect::<BTreeSet<_>>());
        asked.extend(replicas.iter().cloned());
        let alive = replicas.into_iter().map(|r| (r, false)).collect();
        found.push(ServiceTables { service, listed, alive, tables: HashMap::new() });
    }
    if !asked.is_empty() {
        let mut pipe = redis::pipe();
        for replica in &asked {
            pipe.cmd("EXISTS").arg(keys::replica(replica));
        }
        let alive: Vec<bool> = link.run(|mut c| async move { pipe.query_async(&mut c).await }).await?;
        let mut alive = alive.into_iter();
        for entry in found.iter_mut().flat_map(|f| f.alive.iter_mut()) {
            entry.1 = alive.next().unwrap_or(false);
        }
    }
    // The versions of the tables copied complete, then the tables whose version moved.
    let mut version_groups = Vec::new();
    let mut versioned = Vec::new();
    for f in &found {
        for (holder, alive) in &f.alive {
            let known = copied.get(&f.service).and_then(|c| c.get(holder)).copied().flatten();
            if let (true, true, Some(known)) = (*alive, f.listed.contains(holder), known) {
                let mut pipe = redis::pipe();
                pipe.cmd("HGET").arg(keys::instances(&f.service, holder)).arg(VERSION_FIELD);
                version_groups.push(pipe);
                versioned.push((f.service.clone(), holder.clone(), known));
            }
        }
    }
    let versions: Vec<Option<String>> =
        if version_groups.is_empty() { Vec::new() } else { link.together(version_groups).await? };
    let unchanged: BTreeSet<(String, String)> = versioned
        .into_iter()
        .zip(versions)
        .filter(|((_, _, known), version)| version.as_deref().and_then(|v| v.parse::<u64>().ok()) == Some(*known))
        .map(|((service, holder, _), _)| (service, holder))
        .collect();
    let mut reads = Vec::new();
    let mut read_groups = Vec::new();
    for (n, f) in found.iter_mut().enumerate() {
        for (holder, alive) in &f.alive {
            if !*alive || !f.listed.contains(holder) {
                continue;
            }
            if unchanged.contains(&(f.service.clone(), holder.clone())) {
                f.tables.insert(holder.clone(), Table::Unchanged);
                continue;
            }
            let mut pipe = redis::pipe();
            pipe.cmd("HGETALL").arg(keys::instances(&f.service, holder));
            read_groups.push(pipe);
            reads.push((n, holder.clone()));
        }
    }
    let read: Vec<HashMap<String, String>> =
        if read_groups.is_empty() { Vec::new() } else { link.together(read_groups).await? };
    for ((n, holder), mut encoded) in reads.into_iter().zip(read) {
        let seq = encoded.remove(VERSION_FIELD).and_then(|v| v.parse().ok()).unwrap_or(0);
        let records = encoded.into_values().filter_map(|e| decode(&e)).map(|r| (r.id.clone(), r)).collect();
        found[n].tables.insert(holder, Table::Read { seq, records });
    }
    Some(found)
}

/// The current records of `ids` in `holder`'s table of `service` (`None` for an id it does
/// not hold); `None` outside when Redis did not answer.
pub(super) async fn records(
    link: &Link,
    service: &str,
    holder: &str,
    ids: &[String],
) -> Option<Vec<Option<InstanceRecord>>> {
    let key = keys::instances(service, holder);
    let encoded: Vec<Option<String>> =
        link.run(|mut c| async move { redis::cmd("HMGET").arg(&key).arg(ids).query_async(&mut c).await }).await?;
    Some(encoded.into_iter().map(|e| e.as_deref().and_then(decode)).collect())
}

pub(super) fn decode(encoded: &str) -> Option<InstanceRecord> {
    serde_json::from_str(encoded).ok()
}

/// The `(id, [(field, value)])` entries of an XRANGE-style reply.
fn raw_entries(reply: &Value) -> Vec<(String, Vec<(String, String)>)> {
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
