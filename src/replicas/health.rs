//! Active health checks shared out between the replicas, not repeated.
//!
//! Each second this replica reads which replicas are alive (the set `rota:{~fleet}:replicas`,
//! each member's key still renewed) and hands them to the prober's [`Assignment`]: each instance
//! is checked by one of them, chosen by rendezvous hashing. The verdicts this replica reaches are
//! written to `rota:{SERVICE}:health` (id → `REPLICA|passing` or `REPLICA|failing|WHY`); the
//! verdicts of the other replicas' instances are read from there for every service with a
//! health check and laid over this replica's copy, when the one that wrote it is the instance's
//! checker now. An instance's verdict follows it within about a second and a check interval.
//! While Redis is unreachable this replica checks every instance itself.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use crate::health::Assignment;
use crate::policy::Policies;
use crate::registry::{Health, Registry};
use crate::state::redis::Link;
use crate::state::redis::keys::{self, REPLICAS};

/// Between two rounds of reading the live replicas and the verdicts.
pub const ROUND: Duration = Duration::from_secs(1);

type Verdict = (Arc<str>, Arc<str>, Option<Health>);

pub struct HealthSharing {
    registry: Registry,
    policies: Arc<Policies>,
    link: Arc<Link>,
    assignment: Arc<Assignment>,
    /// Verdicts reached here and not written yet, by service then id (`None`: remove).
    pending: BTreeMap<Arc<str>, BTreeMap<Arc<str>, Option<Health>>>,
}

fn encode(replica: &str, health: &Health) -> String {
    match health {
        Health::Passing => format!("{replica}|passing"),
        Health::Failing(why) => format!("{replica}|failing|{why}"),
    }
}

fn decode(text: &str) -> Option<(&str, Health)> {
    let (replica, rest) = text.split_once('|')?;
    let health = match rest.split_once('|') {
        None if rest == "passing" => Health::Passing,
        Some(("failing", why)) => Health::Failing(why.into()),
        _ => return None,
    };
    Some((replica, health))
}

impl HealthSharing {
    pub fn spawn(
        registry: Registry,
        policies: Arc<Policies>,
        link: Arc<Link>,
        assignment: Arc<Assignment>,
        verdicts: mpsc::UnboundedReceiver<Verdict>,
    ) -> tokio::task::JoinHandle<()> {
        let sharing = Self { registry, policies, link, assignment, pending: BTreeMap::new() };
        tokio::spawn(sharing.run(verdicts))
    }

    async fn run(mut self, mut verdicts: mpsc::UnboundedReceiver<Verdict>) {
        let mut round = tokio::time::interval(ROUND);
        round.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                verdict = verdicts.recv() => match verdict {
                    Some((service, id, health)) => {
                        self.pending.entry(service).or_default().insert(id, health);
                        continue;
                    }
                    None => return,
                },
                _ = round.tick() => {}
            }
            if !self.link.is_up() {
                self.assignment.set_live(Vec::new());
                continue;
            }
            if let Some(live) = self.live().await {
                self.assignment.set_live(live);
            }
            if !self.pending.is_empty() && self.write().await {
                self.pending.clear();
            }
            self.read().await;
        }
    }

    /// The replicas alive now (this one listed among them first, so the others count it too).
    async fn live(&self) -> Option<Vec<Arc<str>>> {
        let me = self.assignment.me().clone();
        let members: Vec<String> = self
            .link
            .run(|mut c| async move {
                redis::pipe()
                    .cmd("SADD")
                    .arg(REPLICAS)
                    .arg(&*me)
                    .ignore()
                    .cmd("SMEMBERS")
                    .arg(REPLICAS)
                    .query_async::<(Vec<String>,)>(&mut c)
                    .await
            })
            .await
            .map(|(members,)| members)?;
        if members.is_empty() {
            return Some(Vec::new());
        }
        let mut pipe = redis::pipe();
        for replica in &members {
            pipe.cmd("EXISTS").arg(keys::replica(replica));
        }
        let alive: Vec<bool> = self.link.run(|mut c| async move { pipe.query_async(&mut c).await }).await?;
        Some(members.into_iter().zip(alive).filter(|(_, alive)| *alive).map(|(r, _)| r.into()).collect())
    }

    /// Writes the verdicts reached here; false when Redis did not answer (they stay pending).
    async fn write(&self) -> bool {
        let me = self.assignment.me().clone();
        let groups = self
            .pending
            .iter()
            .map(|(service, ids)| {
                let mut pipe = redis::pipe();
                for (id, health) in ids {
                    match health {
                        Some(health) => pipe.cmd("HSET").arg(keys::health(service)).arg(&**id).arg(encode(&me, health)),
                        None => pipe.cmd("HDEL").arg(keys::health(service)).arg(&**id),
                    }
                    .ignore();
                }
                pipe
            })
            .collect();
        self.link.together::<()>(groups).await.is_some()
    }

    /// Lays the verdicts of instances other replicas check over this replica's copy.
    async fn read(&self) {
        let set = self.policies.load_full();
        let services: Vec<Arc<str>> = self
            .registry
            .catalog()
            .snapshots()
            .filter(|s| !s.instances.is_empty() && set.for_service(&s.name).health_check.is_some())
            .map(|s| s.name.clone())
            .collect();
        if services.is_empty() {
            return;
        }
        let groups = services
            .iter()
            .map(|service| {
                let mut pipe = redis::pipe();
                pipe.cmd("HGETALL").arg(keys::health(service));
                pipe
            })
            .collect();
        let Some(hashes): Option<Vec<HashMap<String, String>>> = self.link.together(groups).await else { return };
        for (service, hash) in services.iter().zip(hashes) {
            let Some(snapshot) = self.registry.service(service) else { continue };
            for (id, text) in hash {
                let Some(instance) = snapshot.instance(&id) else { continue };
                let Some((writer, health)) = decode(&text) else { continue };
                let checker = self.assignment.owner(service, &id);
                if *checker != *writer || checker == *self.assignment.me() {
                    continue;
                }
                let now = instance.conditions.as_ref().and_then(|c| c.health.as_ref());
                if now != Some(&health) {
                    self.registry.set_health(service, &instance.id, Some(health));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_round_trip_with_their_writer() {
        for health in [Health::Passing, Health::Failing("answered HTTP 503".into()), Health::Failing("a|b".into())] {
            let text = encode("r1", &health);
            assert_eq!(decode(&text), Some(("r1", health)));
        }
        assert_eq!(decode("r1|sick"), None);
        assert_eq!(decode("nothing"), None);
    }
}
