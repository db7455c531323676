//! A layer of entries every replica may change, shared through one Redis hash: the runtime
//! policy overrides ([`super::policies`]) and the operators' instance overrides
//! ([`super::overrides`]).
//!
//! A change on any replica writes its entry to the layer's hash (field → `MS:TIE:BODY`, or
//! `MS:TIE:-` for a removal) and bumps the layer's version key. Every replica reads the version
//! each [`POLL`] and, when it moved, takes the whole hash as its layer.
//!
//! Each change carries a stamp: the wall-clock millisecond it was made (at least one past the
//! newest stamp this replica knew for the field) and a random tie-break. A write lands only
//! over an older stamp (a Lua script compares them in Redis), so the newest change wins
//! whatever order replicas write in, and a removal is a tombstone, not an absence, so an older
//! entry written later cannot bring it back. Changes made while Redis is unreachable are
//! written when it returns; after a reconnection (Redis may have lost its data) each replica
//! writes its whole layer again with the stamps it had, which changes nothing a newer change
//! made elsewhere. Tombstones older than [`TOMBSTONE_KEPT`] are removed.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;

use super::table::POLL;
use crate::state::redis::{Link, LinkScript};

/// How long a removal's tombstone stays in the shared hash.
pub const TOMBSTONE_KEPT: Duration = Duration::from_secs(24 * 3600);

/// Writes each `(field, stamp ms, stamp tie, value)` of ARGV over `KEYS[1]`'s field unless
/// that holds a newer stamp (a value without one is older than any), then bumps `KEYS[2]` if
/// anything was written.
const WRITE_NEWER: &str = r"
local written = 0
for i = 1, #ARGV, 4 do
  local ms, tie = tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2])
  local current = redis.call('HGET', KEYS[1], ARGV[i])
  local newer = true
  if current then
    local cms, ctie = string.match(current, '^(%d+):(%d+):')
    if cms then
      cms, ctie = tonumber(cms), tonumber(ctie)
      newer = ms > cms or (ms == cms and tie > ctie)
    end
  end
  if newer then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 3])
    written = 1
  end
end
if written == 1 then redis.call('INCR', KEYS[2]) end
return written
";

/// Removes each field `ARGV[i]` of `KEYS[1]` that still holds `ARGV[i + 1]` (an old tombstone
/// no newer change has replaced).
const FORGET: &str = r"
local removed = 0
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    removed = removed + redis.call('HDEL', KEYS[1], ARGV[i])
  end
end
return removed
";

/// When a change was made: wall-clock milliseconds, then a random tie-break below 2^32 (Lua
/// compares them as doubles).
type Stamp = (u64, u64);

/// One change made on this replica: a field's new body, or `None` when it was removed.
pub type LayerChange = (String, Option<String>);

/// What one shared layer is to this replica.
pub trait SharedLayer: Send + Sync + 'static {
    /// The hash the layer is kept in, and the key bumped on every write.
    fn keys(&self) -> (&'static str, &'static str);
    /// Every entry this replica holds, as it is written (field → body).
    fn local(&self) -> impl std::future::Future<Output = BTreeMap<String, String>> + Send;
    /// Takes the shared entries (field → body) as the layer.
    fn replace(&self, entries: BTreeMap<String, String>) -> impl std::future::Future<Output = ()> + Send;
}

/// Shares one layer through a link until its changes stop.
pub struct LayerSharing<L: SharedLayer> {
    layer: Arc<L>,
    link: Arc<Link>,
    script: LinkScript,
    forget: LinkScript,
    /// Changes made here and not yet written, by field.
    pending: BTreeMap<String, (Stamp, Option<String>)>,
    /// The newest stamp known for each field with an entry or a tombstone.
    stamps: HashMap<String, Stamp>,
    /// The version of the shared layer this replica applied last.
    applied: Option<u64>,
    recoveries: u64,
}

impl<L: SharedLayer> LayerSharing<L> {
    pub fn spawn(
        layer: Arc<L>,
        link: Arc<Link>,
        changes: mpsc::UnboundedReceiver<LayerChange>,
    ) -> tokio::task::JoinHandle<()> {
        let sharing = Self {
            layer,
            link,
            script: LinkScript::new(WRITE_NEWER),
            forget: LinkScript::new(FORGET),
            pending: BTreeMap::new(),
            stamps: HashMap::new(),
            applied: None,
            recoveries: 0,
        };
        tokio::spawn(sharing.run(changes))
    }

    /// A stamp for a change of `field` made now: newer than any this replica knows for it.
    fn stamp(&mut self, field: &str) -> Stamp {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let known = self.stamps.get(field).map_or(0, |s| s.0 + 1);
        let stamp = ((now.as_millis() as u64).max(known), fastrand::u64(..1 << 32));
        self.stamps.insert(field.to_owned(), stamp);
        stamp
    }

    fn note(&mut self, (field, body): LayerChange) {
        let stamp = self.stamp(&field);
        self.pending.insert(field, (stamp, body));
    }

    async fn run(mut self, mut changes: mpsc::UnboundedReceiver<LayerChange>) {
        let mut poll = tokio::time::interval(POLL);
        poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                change = changes.recv() => match change {
                    Some(change) => {
                        self.note(change);
                        while let Ok(change) = changes.try_recv() {
                            self.note(change);
                        }
                    }
                    None => return,
                },
                _ = poll.tick() => {}
            }
            if !self.link.is_up() {
                continue;
            }
            let recoveries = self.link.recoveries();
            if recoveries != self.recoveries {
                if self.recoveries != 0 {
                    // Redis may have lost the shared layer: write ours again, with the stamps
                    // it had, so that none undoes a newer change made elsewhere.
                    for (field, body) in self.layer.local().await {
                        let stamp = self.stamps.get(&field).copied().unwrap_or((0, 0));
                        self.pending.entry(field).or_insert((stamp, Some(body)));
                    }
                }
                self.recoveries = recoveries;
            }
            if !self.pending.is_empty() && !self.write().await {
                continue;
            }
            self.read().await;
        }
    }

    /// Writes the pending changes, each unless Redis holds a newer one; false when Redis did
    /// not answer (they stay pending).
    async fn write(&mut self) -> bool {
        if !self.script.ensure_loaded(&self.link).await {
            return false;
        }
        let (hash, version) = self.layer.keys();
        let mut invocation = self.script.script().key(hash);
        invocation.key(version);
        for (field, ((ms, tie), body)) in &self.pending {
            let value = format!("{ms}:{tie}:{}", body.as_deref().unwrap_or("-"));
            invocation.arg(field).arg(ms).arg(tie).arg(value);
        }
        let written =
            self.link.run(|mut c| async move { invocation.invoke_async::<u64>(&mut c).await }).await.is_some();
        if written {
            self.pending.clear();
        }
        written
    }

    /// Takes the shared layer as this replica's when its version moved.
    async fn read(&mut self) {
        let (hash, version_key) = self.layer.keys();
        let Some(version) = self
            .link
            .run(|mut c| async move { redis::cmd("GET").arg(version_key).query_async::<Option<u64>>(&mut c).await })
            .await
        else {
            return;
        };
        if version.is_none() || version == self.applied {
            return;
        }
        let Some(shared) =
            self.link
                .run(|mut c| async move {
                    redis::cmd("HGETALL").arg(hash).query_async::<HashMap<String, String>>(&mut c).await
                })
                .await
        else {
            return;
        };
        let now_ms =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis() as u64;
        let mut entries = BTreeMap::new();
        let mut expired = Vec::new();
        for (field, text) in shared {
            let (stamp, body) = parse_stamped(&text);
            let known = self.stamps.entry(field.clone()).or_insert(stamp);
            *known = (*known).max(stamp);
            if body == "-" {
                if now_ms.saturating_sub(stamp.0) > TOMBSTONE_KEPT.as_millis() as u64 {
                    expired.push((field, text));
                }
                continue;
            }
            entries.insert(field, body.to_owned());
        }
        // Changes made here since the read started are applied over what was read, unless
        // what was read is newer.
        for (field, (stamp, body)) in &self.pending {
            if self.stamps.get(field).is_some_and(|known| known > stamp) {
                continue;
            }
            match body {
                Some(body) => entries.insert(field.clone(), body.clone()),
                None => entries.remove(field),
            };
        }
        self.layer.replace(entries).await;
        self.applied = version;
        if expired.is_empty() || !self.forget.ensure_loaded(&self.link).await {
            return;
        }
        let mut invocation = self.forget.script().key(hash);
        for (field, text) in &expired {
            invocation.arg(field).arg(text);
        }
        if self.link.run(|mut c| async move { invocation.invoke_async::<u64>(&mut c).await }).await.is_some() {
            for (field, _) in expired {
                if !self.pending.contains_key(&field) {
                    self.stamps.remove(&field);
                }
            }
        }
    }
}

/// The stamp and body of a shared value; a value written without a stamp is older than any.
fn parse_stamped(text: &str) -> (Stamp, &str) {
    let mut parts = text.splitn(3, ':');
    match (parts.next().map(str::parse), parts.next().map(str::parse), parts.next()) {
        (Some(Ok(ms)), Some(Ok(tie)), Some(body)) => ((ms, tie), body),
        _ => ((0, 0), text),
    }
}
