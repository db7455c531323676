//! What a replica writes of its own instances.
//!
//! Each publication of the registry that changes this replica's own instances of a service
//! becomes one [`ChangeSet`] at once, numbered by a sequence this replica raises on every set,
//! so no change is lost to the next one however fast they come. Every set waiting is then
//! written in one go ([`groups`]): the renewal of the replica's key, each service's hash and
//! holders entry, and one entry per set in the change stream, each carrying the set's
//! instances when there are at most [`INLINE_RECORDS`] of them. The others apply such an entry
//! as it stands, in order, without reading the hash.

use std::sync::Arc;

use redis::Pipeline;

use super::table::{CHANGES_KEPT, IDS_PER_CHANGE, Liveness, VERSION_FIELD};
use crate::registry::InstanceRecord;
use crate::state::redis::keys::{self, CHANGES, SERVICES};

/// Instances a change entry carries at most; a larger change names its ids alone.
pub const INLINE_RECORDS: usize = 16;

/// One change of this replica's own instances of one service.
pub(super) struct ChangeSet {
    pub service: Arc<str>,
    /// Instances added or changed.
    pub changed: Vec<(Arc<str>, InstanceRecord)>,
    /// Ids no longer held.
    pub removed: Vec<Arc<str>>,
    /// The hash is replaced whole (its entry names no ids: readers read it whole).
    pub whole: bool,
    /// This replica holds nothing of the service any more.
    pub empty: bool,
    /// This replica's sequence number of the set, stored as the hash's version.
    pub seq: u64,
    /// When the registry published the change, by this machine's clock (ms since the epoch).
    pub published_ms: u64,
}

/// The groups that write `sets`, to run in order: the replica's key first (no reader may see
/// these instances without it: it would take the replica for dead and drop them), then each
/// service's keys (one group per service, its sets in order), then the entries that tell the
/// others. The first answer is the renewal's.
pub(super) fn groups(liveness: &Liveness, sets: &[ChangeSet]) -> Vec<Pipeline> {
    let mut renew = redis::pipe();
    liveness.renew(&mut renew);
    let replica = &*liveness.replica;
    let mut services: Vec<(Arc<str>, Pipeline)> = Vec::new();
    let mut announce = redis::pipe();
    for set in sets {
        let pipe = match services.iter().position(|(s, _)| *s == set.service) {
            Some(n) => &mut services[n].1,
            None => {
                services.push((set.service.clone(), redis::pipe()));
                &mut services.last_mut().expect("just pushed").1
            }
        };
        let (instances, holders) = (keys::instances(&set.service, replica), keys::holders(&set.service));
        if set.empty {
            pipe.cmd("DEL").arg(&instances);
            pipe.cmd("SREM").arg(&holders).arg(replica);
        } else {
            if set.whole {
                // Replaced in one step, so a reader never sees the hash half written.
                let next = format!("{instances}:next");
                pipe.cmd("DEL").arg(&next);
                pipe.cmd("HSET").arg(&next).arg(encode(&set.changed));
                pipe.cmd("HSET").arg(&next).arg(VERSION_FIELD).arg(set.seq);
                pipe.cmd("RENAME").arg(&next).arg(&instances);
            } else {
                if !set.changed.is_empty() {
                    pipe.cmd("HSET").arg(&instances).arg(encode(&set.changed));
                }
                if !set.removed.is_empty() {
                    pipe.cmd("HDEL").arg(&instances).arg(set.removed.iter().map(|id| &**id).collect::<Vec<_>>());
                }
                pipe.cmd("HSET").arg(&instances).arg(VERSION_FIELD).arg(set.seq);
            }
            pipe.cmd("SADD").arg(&holders).arg(replica);
            announce.cmd("SADD").arg(SERVICES).arg(&*set.service);
        }
        let entry = announce.cmd("XADD");
        entry.arg(CHANGES).arg("MAXLEN").arg("~").arg(CHANGES_KEPT).arg("*");
        entry.arg("s").arg(&*set.service).arg("r").arg(replica);
        entry.arg("q").arg(set.seq).arg("t").arg(set.published_ms);
        let count = set.changed.len() + set.removed.len();
        if !set.whole && count <= IDS_PER_CHANGE {
            let ids: Vec<&str> =
                set.changed.iter().map(|(id, _)| &**id).chain(set.removed.iter().map(|id| &**id)).collect();
            entry.arg("ids").arg(ids.join(" "));
            if count <= INLINE_RECORDS {
                let records: Vec<&InstanceRecord> = set.changed.iter().map(|(_, r)| r).collect();
                entry.arg("set").arg(serde_json::to_string(&records).unwrap_or_default());
                let removed: Vec<&str> = set.removed.iter().map(|id| &**id).collect();
                entry.arg("del").arg(removed.join(" "));
            }
        }
    }
    let mut groups = vec![renew];
    groups.extend(services.into_iter().map(|(_, pipe)| pipe));
    groups.push(announce);
    groups
}

/// `id, json, id, json, …` for an HSET.
fn encode(instances: &[(Arc<str>, InstanceRecord)]) -> Vec<String> {
    instances
        .iter()
        .flat_map(|(id, shared)| [id.to_string(), serde_json::to_string(shared).unwrap_or_default()])
        .collect()
}
