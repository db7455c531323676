//! One owner per instance id across the replicas.
//!
//! A registration stream's announce claims its ids before the registry applies them
//! ([`crate::registry::Claims`]). Per service, rota reads which replicas hold instances of the
//! service and which of them are dead (their key expired), renewing its own key on the way;
//! then one script call checks, for each id, whether a replica other than this one and not
//! known dead holds it in its instances hash (`rota:{SERVICE}:instances:REPLICA`), and if none
//! does, writes the id into this replica's hash at once, so that a registration racing on
//! another replica finds it there. A replica that became a holder after the first read counts
//! as alive. The first replica to claim an id keeps it; the other refuses the announce with
//! `ALREADY_EXISTS`, as one server refuses a second stream. Each step touches one hash slot, so
//! claims work on a Redis Cluster too.
//!
//! While Redis is unreachable nothing is claimed and each replica decides alone (as it keeps
//! answering picks alone); two registrations of one id made on two replicas during an outage
//! both stand until one of them ends.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use crate::registry::{Claim, Claims, Instance};
use crate::state::redis::{Link, LinkScript, keys};

use redis::Value;

use super::table::Liveness;
use crate::registry::InstanceRecord;

/// KEYS: the service's holders set, this replica's instances hash. ARGV: this replica, the
/// prefix of a replica's instances hash (same slot), the number of dead replicas, their names,
/// then (id, JSON) pairs. Answers per id: `+` newly held here, `=` already held here, or the
/// replica holding it.
const CLAIM_SCRIPT: &str = r"
local me, hashes, dead_count = ARGV[1], ARGV[2], tonumber(ARGV[3])
local dead = {}
for i = 4, 3 + dead_count do
  dead[ARGV[i]] = true
end
local others = {}
for _, holder in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if holder ~= me and not dead[holder] then
    others[#others + 1] = holder
  end
end
local answers, claimed = {}, false
for i = 4 + dead_count, #ARGV, 2 do
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
    liveness: Arc<Liveness>,
    script: LinkScript,
}

impl IdClaims {
    pub fn new(link: Arc<Link>, liveness: Arc<Liveness>) -> Self {
        Self { link, liveness, script: LinkScript::new(CLAIM_SCRIPT) }
    }
}

impl IdClaims {
    /// The holders of `service` other than this replica whose key has expired; renews this
    /// replica's key first, so that its claims count as alive from its first one on.
    async fn dead_holders(&self, service: &str) -> Option<Vec<String>> {
        let holders_key = keys::holders(service);
        let holders: Vec<String> = self
            .link
            .run(|mut conn| async move { redis::cmd("SMEMBERS").arg(&holders_key).query_async(&mut conn).await })
            .await?;
        let others: Vec<String> = holders.into_iter().filter(|h| **h != *self.liveness.replica).collect();
        let mut pipe = redis::pipe();
        self.liveness.renew(&mut pipe);
        for holder in &others {
            pipe.cmd("EXISTS").arg(keys::replica(holder));
        }
        let answers: Vec<Value> = self.link.run(|mut conn| async move { pipe.query_async(&mut conn).await }).await?;
        let (renewed, alive) = answers.split_first()?;
        self.liveness.renewed(renewed);
        let dead = others.into_iter().zip(alive).filter(|(_, alive)| matches!(alive, Value::Int(0)));
        Some(dead.map(|(holder, _)| holder).collect())
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
            let Some(dead) = self.dead_holders(service).await else { return unchecked };
            if !self.script.ensure_loaded(&self.link).await {
                return unchecked;
            }
            let mut invocation = self.script.script().prepare_invoke();
            invocation.key(keys::holders(service)).key(keys::instances(service, &self.liveness.replica));
            invocation.arg(&*self.liveness.replica).arg(keys::instances(service, "")).arg(dead.len()).arg(&dead);
            for instance in instances {
                let encoded = serde_json::to_string(&InstanceRecord::of(instance)).unwrap_or_default();
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
        let (link, key) = (self.link.clone(), keys::instances(service, &self.liveness.replica));
        tokio::spawn(async move {
            let ids: Vec<&str> = ids.iter().map(|id| &**id).collect();
            link.run(
                |mut conn| async move { redis::cmd("HDEL").arg(&key).arg(&ids).query_async::<()>(&mut conn).await },
            )
            .await;
        });
    }
}
