//! Instance statistics shared by the replicas.
//!
//! Every [`INTERVAL`], each replica writes what it alone knows of each instance with something
//! to say — picks in flight, successive failures, the rest of a breaker's blackout, its latency
//! average — as one hash per service, `rota:{SERVICE}:loads:REPLICA`, that expires after
//! [`LOADS_TTL`] unless written again (a dead replica's loads vanish on their own). It marks the
//! service in `rota:{~fleet}:loads:active`, reads the other replicas' hashes of every active service, and
//! hands the merged view to the statistics store ([`Stats::set_remote`]): in-flight counts and
//! successive failures add up, the latest breaker end holds, latencies average. So load-aware
//! rules weigh every replica's picks, a breaker tripped through one replica is honoured by all,
//! and a breaker trips on the failures reported through all of them.
//!
//! The picks themselves never wait for this: they read the merged view as it last arrived.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::Value;
use tokio::time::{Instant, MissedTickBehavior};

use crate::load::{LocalLoad, RemoteLoad, Stats};
use crate::state::redis::Link;
use crate::state::redis::keys::{self, ACTIVE_LOADS as ACTIVE, REPLICAS};

/// Time between exchanges of loads.
pub const INTERVAL: Duration = Duration::from_millis(250);
/// How long a replica's written loads hold without being written again.
pub const LOADS_TTL: Duration = Duration::from_secs(2);
/// A service whose loads nobody wrote for this long is no longer read.
const ACTIVE_WINDOW: Duration = Duration::from_secs(10);

fn encode(load: &LocalLoad) -> String {
    format!(
        "{} {} {} {}",
        load.in_flight,
        load.successive_failures,
        load.tripped_for.map_or(0, |d| d.as_millis() as u64),
        load.latency_ms.map_or(-1.0, |l| l)
    )
}

/// (in flight, successive failures, blackout left, latency) from [`encode`]'s text.
fn decode(text: &str) -> Option<(u64, u32, Duration, Option<f64>)> {
    let mut parts = text.split(' ');
    let in_flight = parts.next()?.parse().ok()?;
    let successive = parts.next()?.parse().ok()?;
    let tripped = Duration::from_millis(parts.next()?.parse().ok()?);
    let latency: f64 = parts.next()?.parse().ok()?;
    Some((in_flight, successive, tripped, (latency >= 0.0).then_some(latency)))
}

/// One instance of one service.
type InstanceKey = (Arc<str>, Arc<str>);

fn wall_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

pub struct LoadSharing {
    replica: Arc<str>,
    stats: Arc<Stats>,
    link: Arc<Link>,
    /// Services this replica wrote loads for last time.
    written: HashSet<Arc<str>>,
    /// Instances the other replicas said something of last time.
    remote: HashSet<InstanceKey>,
}

impl LoadSharing {
    pub fn spawn(stats: Arc<Stats>, link: Arc<Link>, replica: Arc<str>) -> tokio::task::JoinHandle<()> {
        let sharing = Self { replica, stats, link, written: HashSet::new(), remote: HashSet::new() };
        tokio::spawn(sharing.run())
    }

    async fn run(mut self) {
        let mut tick = tokio::time::interval(INTERVAL);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if self.link.is_up() {
                self.exchange().await;
            }
        }
    }

    async fn exchange(&mut self) {
        let stats = self.stats.clone();
        let Ok(local) = tokio::task::spawn_blocking(move || stats.local_loads()).await else { return };
        if !self.write(local).await {
            return;
        }
        let Some(merged) = self.read().await else { return };
        let seen: HashSet<InstanceKey> = merged.keys().cloned().collect();
        for ((service, id), remote) in merged {
            self.stats.set_remote(&service, &id, remote);
        }
        for (service, id) in self.remote.difference(&seen) {
            self.stats.set_remote(service, id, RemoteLoad::default());
        }
        self.remote = seen;
    }

    /// Writes this replica's loads; false when Redis did not answer.
    async fn write(&mut self, local: Vec<LocalLoad>) -> bool {
        let mut by_service: HashMap<Arc<str>, Vec<&LocalLoad>> = HashMap::new();
        for load in &local {
            by_service.entry(load.service.clone()).or_default().push(load);
        }
        let now = wall_ms();
        let ttl = LOADS_TTL.as_millis() as u64;
        // One group per hash slot: the fleet-wide keys, then each service's.
        let mut fleet = redis::pipe();
        fleet.cmd("SADD").arg(REPLICAS).arg(&*self.replica).ignore();
        let mut groups = Vec::new();
        for service in self.written.iter().filter(|s| !by_service.contains_key(*s)) {
            let mut pipe = redis::pipe();
            pipe.cmd("DEL").arg(keys::loads(service, &self.replica)).ignore();
            groups.push(pipe);
        }
        for (service, loads) in &by_service {
            let key = keys::loads(service, &self.replica);
            let mut pipe = redis::pipe();
            pipe.cmd("DEL").arg(&key).ignore();
            let mut hset = redis::cmd("HSET");
            hset.arg(&key);
            for load in loads {
                hset.arg(&*load.id).arg(encode(load));
            }
            pipe.add_command(hset).ignore();
            pipe.cmd("PEXPIRE").arg(&key).arg(ttl).ignore();
            groups.push(pipe);
            fleet.cmd("ZADD").arg(ACTIVE).arg(now).arg(&**service).ignore();
        }
        groups.push(fleet);
        if self.link.together::<Value>(groups).await.is_none() {
            return false;
        }
        self.written = by_service.into_keys().collect();
        true
    }

    /// The other replicas' loads of every active service, merged per instance.
    async fn read(&mut self) -> Option<HashMap<InstanceKey, RemoteLoad>> {
        let since = wall_ms().saturating_sub(ACTIVE_WINDOW.as_millis() as u64);
        let (services, replicas): (Vec<String>, Vec<String>) = self
            .link
            .run(|mut c| async move {
                redis::pipe()
                    .cmd("ZREMRANGEBYSCORE")
                    .arg(ACTIVE)
                    .arg("-inf")
                    .arg(format!("({since}"))
                    .ignore()
                    .cmd("ZRANGE")
                    .arg(ACTIVE)
                    .arg(0)
                    .arg(-1)
                    .cmd("SMEMBERS")
                    .arg(REPLICAS)
                    .query_async(&mut c)
                    .await
            })
            .await?;
        let others: Vec<String> = replicas.into_iter().filter(|r| **r != *self.replica).collect();
        self.forget_dead(&others).await;
        let pairs: Vec<(String, &String)> =
            services.iter().flat_map(|s| others.iter().map(move |r| (s.clone(), r))).collect();
        if pairs.is_empty() {
            return Some(HashMap::new());
        }
        // One pipeline per service (its keys share a slot), in the order of `pairs`.
        let groups = services
            .iter()
            .map(|service| {
                let mut pipe = redis::pipe();
                for replica in &others {
                    pipe.cmd("HGETALL").arg(keys::loads(service, replica));
                }
                pipe
            })
            .collect();
        let hashes: Vec<HashMap<String, String>> = self.link.together(groups).await?;
        let now = Instant::now();
        // Per instance: the merged load, and the sum and count of the latencies given.
        let mut merged: HashMap<InstanceKey, (RemoteLoad, f64, u32)> = HashMap::new();
        for ((service, _), hash) in pairs.iter().zip(hashes) {
            let service: Arc<str> = service.as_str().into();
            for (id, text) in hash {
                let Some((in_flight, successive, tripped, latency)) = decode(&text) else { continue };
                let (load, latency_sum, latency_count) = merged.entry((service.clone(), id.into())).or_default();
                load.in_flight += in_flight;
                load.successive_failures = load.successive_failures.saturating_add(successive);
                if !tripped.is_zero() {
                    load.tripped_until = load.tripped_until.max(Some(now + tripped));
                }
                if let Some(latency) = latency {
                    *latency_sum += latency;
                    *latency_count += 1;
                }
            }
        }
        Some(
            merged
                .into_iter()
                .map(|(key, (mut load, sum, count))| {
                    load.latency_ms = (count > 0).then(|| sum / f64::from(count));
                    (key, load)
                })
                .collect(),
        )
    }

    /// Drops replicas whose key expired from the set of replicas.
    async fn forget_dead(&self, others: &[String]) {
        if others.is_empty() {
            return;
        }
        let mut pipe = redis::pipe();
        for replica in others {
            pipe.cmd("EXISTS").arg(keys::replica(replica));
        }
        let Some(alive): Option<Vec<bool>> = self.link.run(|mut c| async move { pipe.query_async(&mut c).await }).await
        else {
            return;
        };
        let dead: Vec<&String> = others.iter().zip(alive).filter(|(_, alive)| !alive).map(|(r, _)| r).collect();
        if !dead.is_empty() {
            let _ = self
                .link
                .run(|mut c| async move { redis::cmd("SREM").arg(REPLICAS).arg(dead).query_async::<()>(&mut c).await })
                .await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_travel_as_text_and_back() {
        let load = LocalLoad {
            service: "svc".into(),
            id: "a".into(),
            in_flight: 7,
            successive_failures: 2,
            tripped_for: Some(Duration::from_millis(1500)),
            latency_ms: Some(12.5),
        };
        assert_eq!(decode(&encode(&load)), Some((7, 2, Duration::from_millis(1500), Some(12.5))));
        let idle = LocalLoad { tripped_for: None, latency_ms: None, ..load };
        assert_eq!(decode(&encode(&idle)), Some((7, 2, Duration::ZERO, None)));
        assert_eq!(decode("1 2"), None);
    }
}
