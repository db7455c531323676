//! One owner per instance id across the replicas.
//!
//! A registration stream's announce claims its ids before the registry applies them
//! ([`crate::registry::Claims`]). One script call per service checks, for each id, whether a
//! live replica other than this one holds it in its instances hash
//! (`rota:{SERVICE}:instances:REPLICA`); if none does, the id is written into this replica's
//! hash at once, so a registration racing on another replica finds it there. The first
//! replica to claim an id keeps it; the other refuses the announce with `ALREADY_EXISTS`, as
//! one server refuses a second stream. A replica whose key expired is not live: its entries
//! never block a claim.
//!
//! While Redis is unreachable nothing is claimed and each replica decides alone (as it keeps
//! answering picks alone); two registrations of one id made on two replicas during an outage
//! both stand until one of them ends.

use std::sync::Arc;

use std::future::Future;
use std::pin::Pin;

use crate::registry::{Claim, Claims, Instance};
use crate::state::redis::Link;

use super::table::{REPLICA_LEASE, Shared, holders_key, instances_key, replica_key};

/// KEYS: the service's holders set, this replica's instances hash. ARGV: this replica, the
/// prefix of a replica's instances hash, the prefix of a replica's key, the replica lease in
/// milliseconds, then (id, JSON) pairs. Answers per id: `+` newly held here, `=` already held
/// here, or the replica holding it. This replica's key is renewed first: a claim made before
/// its first renewal must still count as live.
const CLAIM_SCRIPT: &str = r"
local me, hashes, replicas = ARGV[1], ARGV[2], ARGV[3]
redis.call('SET', replicas .. me, 1, 'PX', ARGV[4])
local others = {}
for _, holder in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if holder ~= me and redis.call('EXISTS', replicas .. holder) == 1 then
    others[#others + 1] = holder
  end
end
local answers, claimed = {}, false
for i = 5, #ARGV, 2 do
  local id, owner = ARGV[i], nil
  for _, holder in ipairs(others) do
    if redis.call('HEXISTS', hashes .. holder, id) == 1 then
      owner = holder
      break
    end
  end
  if owner then
    answers[#answers + 1] = owner
  elseif redis.call('HSETNX', KEYS[2], id, ARGV[i + 1]) == 1 then
    answers[#answers + 1] = '+'
    claimed = true
  else
    answers[#answers + 1] = '='
  end
end
if claimed then
  redis.call('SADD', KEYS[1], me)
end
return answers
";

/// Claims ids for one replica through Redis.
pub struct IdClaims {
    link: Arc<Link>,
    replica: Arc<str>,
    script: redis::Script,
}

impl IdClaims {
    pub fn new(link: Arc<Link>, replica: Arc<str>) -> Self {
        Self { link, replica, script: redis::Script::new(CLAIM_SCRIPT) }
    }
}

impl Claims for IdClaims {
    fn claim<'a>(
        &'a self,
        service: &'a str,
        instances: &'a [&'a Instance],
    ) -> Pin<Box<dyn Future<Output = Vec<Claim>> + Send + 'a>> {
        Box::pin(async move {
            let unchecked = vec![Claim::Unchecked; instances.len()];
            if !self.link.is_up() {
                return unchecked;
            }
            let mut invocation = self.script.prepare_invoke();
            invocation.key(holders_key(service)).key(instances_key(service, &self.replica));
            invocation.arg(&*self.replica).arg(instances_key(service, "")).arg(replica_key(""));
            invocation.arg(REPLICA_LEASE.as_millis() as u64);
            for instance in instances {
                let encoded = serde_json::to_string(&Shared::of(instance)).unwrap_or_default();
                invocation.arg(&*instance.id).arg(encoded);
            }
            let answers =
                self.link.run(|mut conn| async move { invocation.invoke_async::<Vec<String>>(&mut conn).await }).await;
            match answers {
                Some(answers) if answers.len() == instances.len() => answers
                    .into_iter()
                    .map(|answer| match answer.as_str() {
                        "+" => Claim::New,
                        "=" => Claim::Held,
                        _ => Claim::Elsewhere(answer),
                    })
                    .collect(),
                _ => unchecked,
            }
        })
    }

    fn release(&self, service: &str, ids: Vec<Arc<str>>) {
        let (link, key) = (self.link.clone(), instances_key(service, &self.replica));
        tokio::spawn(async move {
            let ids: Vec<&str> = ids.iter().map(|id| &**id).collect();
            link.run(
                |mut conn| async move { redis::cmd("HDEL").arg(&key).arg(&ids).query_async::<()>(&mut conn).await },
            )
            .await;
        });
    }
}
