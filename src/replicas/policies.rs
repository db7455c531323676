//! Runtime policy overrides shared by the replicas.
//!
//! A `SetPolicy` or `ResetPolicy` on any replica writes the service's override to the hash
//! `rota:{~fleet}:policies` (service → `MS:TIE:` and the override as TOML, as `SetPolicy` sent
//! it, or `-` for a reset) and bumps `rota:{~fleet}:policies:version`. Every replica reads the
//! version each [`POLL`] and, when it moved, takes the whole hash as its runtime layer; each
//! replica resolves the overrides over its own policy file's defaults.
//!
//! Each change carries a stamp: the wall-clock millisecond it was made (at least one past the
//! newest stamp this replica knew for the service) and a random tie-break. A write lands only
//! over an older stamp (a Lua script compares them in Redis), so the newest change wins
//! whatever order replicas write in, and a reset is a tombstone, not an absence, so an older
//! override written later cannot bring it back. Changes made while Redis is unreachable are
//! written when it returns; after a reconnection (Redis may have lost its data) each replica
//! writes its whole runtime layer again with the stamps it had, which changes nothing a newer
//! change made elsewhere. Tombstones older than [`TOMBSTONE_KEPT`] are removed.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;

use super::table::POLL;
use crate::policy::file::{spec_from_toml, spec_to_toml};
use crate::policy::{Policies, PolicySpec, RuntimeChange};
use crate::state::redis::{Link, LinkScript};

use crate::state::redis::keys::{POLICIES, POLICIES_VERSION as VERSION};

/// How long a reset's tombstone stays in the shared hash.
pub const TOMBSTONE_KEPT: Duration = Duration::from_secs(24 * 3600);

/// Writes each `(service, stamp ms, stamp tie, value)` of ARGV over `KEYS[1]`'s field unless
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

/// A change to write: its stamp and the override (`None`: a reset).
type Change = (Stamp, Option<PolicySpec>);

pub struct PolicySharing {
    policies: Arc<Policies>,
    link: Arc<Link>,
    script: LinkScript,
    forget: LinkScript,
    /// Changes made here and not yet written, by service.
    pending: BTreeMap<String, Change>,
    /// The newest stamp known for each service with an override or a tombstone.
    stamps: HashMap<String, Stamp>,
    /// The version of the shared overrides this replica applied last.
    applied: Option<u64>,
    recoveries: u64,
}

impl PolicySharing {
    /// Shares `policies`' runtime layer through `link`; `None` when something shares it already.
    pub fn spawn(policies: Arc<Policies>, link: Arc<Link>) -> Option<tokio::task::JoinHandle<()>> {
        let changes = policies.follow_runtime_changes()?;
        let sharing = Self {
            policies,
            link,
            script: LinkScript::new(WRITE_NEWER),
            forget: LinkScript::new(FORGET),
            pending: BTreeMap::new(),
            stamps: HashMap::new(),
            applied: None,
            recoveries: 0,
        };
        Some(tokio::spawn(sharing.run(changes)))
    }

    /// A stamp for a change of `service` made now: newer than any this replica knows for it.
    fn stamp(&mut self, service: &str) -> Stamp {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let known = self.stamps.get(service).map_or(0, |s| s.0 + 1);
        let stamp = ((now.as_millis() as u64).max(known), fastrand::u64(..1 << 32));
        self.stamps.insert(service.to_owned(), stamp);
        stamp
    }

    fn note(&mut self, service: String, spec: Option<PolicySpec>) {
        let stamp = self.stamp(&service);
        self.pending.insert(service, (stamp, spec));
    }

    async fn run(mut self, mut changes: mpsc::UnboundedReceiver<RuntimeChange>) {
        let mut poll = tokio::time::interval(POLL);
        poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                change = changes.recv() => match change {
                    Some((service, spec)) => {
                        self.note(service, spec);
                        while let Ok((service, spec)) = changes.try_recv() {
                            self.note(service, spec);
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
                    // Redis may have lost the shared overrides: write ours again, with the
                    // stamps they had, so that none undoes a newer change made elsewhere.
                    for (service, spec) in self.policies.runtime_specs() {
                        let stamp = self.stamps.get(&service).copied().unwrap_or((0, 0));
                        self.pending.entry(service).or_insert((stamp, Some(spec)));
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
        let mut invocation = self.script.script().key(POLICIES);
        invocation.key(VERSION);
        for (service, ((ms, tie), spec)) in &self.pending {
            let value = match spec {
                Some(spec) => format!("{ms}:{tie}:{}", spec_to_toml(spec)),
                None => format!("{ms}:{tie}:-"),
            };
            invocation.arg(service).arg(ms).arg(tie).arg(value);
        }
        let written =
            self.link.run(|mut c| async move { invocation.invoke_async::<u64>(&mut c).await }).await.is_some();
        if written {
            self.pending.clear();
        }
        written
    }

    /// Takes the shared overrides as the runtime layer when their version moved.
    async fn read(&mut self) {
        let Some(version) = self
            .link
            .run(|mut c| async move { redis::cmd("GET").arg(VERSION).query_async::<Option<u64>>(&mut c).await })
            .await
        else {
            return;
        };
        if version.is_none() || version == self.applied {
            return;
        }
        let Some(shared) = self
            .link
            .run(|mut c| async move {
                redis::cmd("HGETALL").arg(POLICIES).query_async::<HashMap<String, String>>(&mut c).await
            })
            .await
        else {
            return;
        };
        let now_ms =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_millis() as u64;
        let mut specs = BTreeMap::new();
        let mut expired = Vec::new();
        for (service, text) in shared {
            let (stamp, body) = parse_stamped(&text);
            let known = self.stamps.entry(service.clone()).or_insert(stamp);
            *known = (*known).max(stamp);
            if body == "-" {
                if now_ms.saturating_sub(stamp.0) > TOMBSTONE_KEPT.as_millis() as u64 {
                    expired.push((service, text));
                }
                continue;
            }
            match spec_from_toml(body) {
                Ok(spec) => {
                    specs.insert(service, spec);
                }
                Err(error) => tracing::warn!(%service, %error, "shared policy override unreadable; left out"),
            }
        }
        // Changes made here since the read started are applied over what was read, unless
        // what was read is newer.
        for (service, (stamp, spec)) in &self.pending {
            if self.stamps.get(service).is_some_and(|known| known > stamp) {
                continue;
            }
            match spec {
                Some(spec) => specs.insert(service.clone(), spec.clone()),
                None => specs.remove(service),
            };
        }
        self.policies.replace_runtime(specs);
        self.applied = version;
        if expired.is_empty() || !self.forget.ensure_loaded(&self.link).await {
            return;
        }
        let mut invocation = self.forget.script().key(POLICIES);
        for (service, text) in &expired {
            invocation.arg(service).arg(text);
        }
        if self.link.run(|mut c| async move { invocation.invoke_async::<u64>(&mut c).await }).await.is_some() {
            for (service, _) in expired {
                if !self.pending.contains_key(&service) {
                    self.stamps.remove(&service);
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
