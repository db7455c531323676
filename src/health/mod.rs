//! Active health checks: rota asks every instance of a service whose policy sets a
//! `health_check` whether it answers, once for the whole fleet (not once per consumer or per
//! proxy), and an instance failing its checks gets no picks until it passes again.
//!
//! - One task holds a schedule of every checked instance (those announced UP), each checked
//!   every `interval`, the first time at a random point of the first interval so a fleet's
//!   checks spread out. At most [`MAX_IN_FLIGHT`] checks run at once; one due beyond that waits
//!   for a free slot.
//! - `unhealthy_after` failures in a row publish the instance DOWN (the registry lays the
//!   verdict over what was announced: `crate::registry::Health`); `healthy_after` passes in a
//!   row publish it UP again. The verdict shows in `rota ls`, Watch, `/api/services`, the
//!   metrics and the dashboard, beside the status the provider announced.
//! - The schedule follows the registry's publications and the policies: a new instance is
//!   checked, one that leaves (or is announced DRAINING or DOWN) is no longer, and a policy
//!   change applies to the next check.
//! - A check connects only to the address the instance announced, follows no redirect, and
//!   returns nothing it read to anyone ([`probe`]); never to rota's own listeners, and only in
//!   the networks `server.health_check_networks` allows ([`reach`]): an instance elsewhere
//!   fails at once, unchecked.
//! - A check whose kind changes (`http` to `grpc`, another path or gRPC service) starts over:
//!   the old check's verdict is dropped, and so is a verdict when the check is turned off.
//! - With Redis replicas the checks are shared out, not repeated: each instance is checked by
//!   one live replica, chosen by rendezvous hashing over the live replicas ([`Assignment`]), and
//!   its verdicts reach the others through Redis (`crate::replicas::health`). A replica cut off
//!   from Redis checks every instance itself.

pub mod probe;
pub mod reach;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::broadcast::error::RecvError;
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use crate::policy::{HealthCheck, Policies, PolicySet};
use crate::registry::{Health, Registry, Status};
use probe::{Probe, Verdict};

/// Checks running at once, fleet-wide.
pub const MAX_IN_FLIGHT: usize = 256;
/// How often the policies are looked at for a change.
const POLICY_LOOK: Duration = Duration::from_secs(1);

/// What the checks did, for the metrics.
#[derive(Debug, Default)]
pub struct HealthCounters {
    pub passed: AtomicU64,
    pub failed: AtomicU64,
    pub in_flight: AtomicUsize,
    /// Instances checked now.
    pub checked: AtomicUsize,
    /// Instances failing now (getting no picks).
    pub failing: AtomicUsize,
}

type Key = (Arc<str>, Arc<str>);

/// Which live replica checks which instance: the one whose hash of (replica, service, id) is
/// highest, so a replica joining or leaving moves only its share of the instances.
pub struct Assignment {
    me: Arc<str>,
    live: arc_swap::ArcSwap<Vec<Arc<str>>>,
    changed: tokio::sync::watch::Sender<u64>,
}

impl Assignment {
    /// Alone until told of others.
    pub fn new(me: Arc<str>) -> Arc<Self> {
        let live = arc_swap::ArcSwap::from_pointee(vec![me.clone()]);
        Arc::new(Self { me, live, changed: tokio::sync::watch::Sender::new(0) })
    }

    pub fn me(&self) -> &Arc<str> {
        &self.me
    }

    /// The live replicas now (this one is always among them).
    pub fn set_live(&self, mut live: Vec<Arc<str>>) {
        if !live.contains(&self.me) {
            live.push(self.me.clone());
        }
        live.sort();
        live.dedup();
        if **self.live.load() != live {
            self.live.store(Arc::new(live));
            self.changed.send_modify(|generation| *generation += 1);
        }
    }

    /// The replica that checks `id` of `service`.
    pub fn owner(&self, service: &str, id: &str) -> Arc<str> {
        let live = self.live.load();
        let score = |replica: &Arc<str>| {
            let mut hasher = xxhash_rust::xxh3::Xxh3::new();
            for part in [replica.as_bytes(), b"\0", service.as_bytes(), b"\0", id.as_bytes()] {
                hasher.update(part);
            }
            hasher.digest()
        };
        live.iter().max_by_key(|replica| score(replica)).cloned().unwrap_or_else(|| self.me.clone())
    }

    pub fn owns(&self, service: &str, id: &str) -> bool {
        self.owner(service, id) == self.me
    }
}

/// What a prober shares with the other replicas: whom it checks for, and where its verdicts go.
pub struct Sharing {
    pub assignment: Arc<Assignment>,
    /// Each verdict this replica reaches (`None`: the instance is no longer checked here).
    pub verdicts: tokio::sync::mpsc::UnboundedSender<(Arc<str>, Arc<str>, Option<Health>)>,
}

struct Target {
    host: String,
    port: u16,
    check: Arc<HealthCheck>,
    /// Tells this target's schedule entries and results from those of a target it replaced.
    generation: u64,
    fails: u32,
    passes: u32,
    /// `None` until the first result.
    failing: Option<bool>,
    running: bool,
}

struct Prober {
    registry: Registry,
    policies: Arc<Policies>,
    counters: Arc<HealthCounters>,
    targets: HashMap<Arc<str>, HashMap<Arc<str>, Target>>,
    schedule: BinaryHeap<Reverse<(Instant, u64, Key)>>,
    running: JoinSet<(Key, u64, Verdict)>,
    next_generation: u64,
    /// The policies last applied.
    seen: Arc<PolicySet>,
    sharing: Option<Sharing>,
    probe: Arc<dyn Probe>,
}

/// Starts checking (with replicas, the instances `sharing` assigns to this one); the task ends
/// when the registry stops. `probe` makes each check ([`probe::Network`], which connects only
/// where its [`reach::Reach`] allows).
pub fn spawn(
    registry: Registry,
    policies: Arc<Policies>,
    sharing: Option<Sharing>,
    probe: Arc<dyn Probe>,
) -> (Arc<HealthCounters>, JoinHandle<()>) {
    let counters = Arc::new(HealthCounters::default());
    let seen = policies.load_full();
    let prober = Prober {
        registry,
        policies,
        counters: counters.clone(),
        targets: HashMap::new(),
        schedule: BinaryHeap::new(),
        running: JoinSet::new(),
        next_generation: 0,
        seen,
        sharing,
        probe,
    };
    (counters, tokio::spawn(prober.start_when_needed()))
}

impl Prober {
    /// Waits (looking at the policies once a second) until some policy sets a health check,
    /// then runs: a server without checks has no prober following its registry.
    async fn start_when_needed(mut self) {
        let mut look = tokio::time::interval(POLICY_LOOK);
        loop {
            look.tick().await;
            let set = self.policies.load_full();
            if set.defaults.health_check.is_some() || set.services.values().any(|p| p.health_check.is_some()) {
                break;
            }
        }
        self.seen = self.policies.load_full();
        self.run().await
    }

    async fn run(mut self) {
        let mut published = self.registry.published();
        self.resync_all();
        let mut policy_look = tokio::time::interval(POLICY_LOOK);
        policy_look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut assigned = match &self.sharing {
            Some(sharing) => sharing.assignment.changed.subscribe(),
            None => tokio::sync::watch::Sender::new(0).subscribe(),
        };
        loop {
            let due = self.schedule.peek().map(|Reverse((at, _, _))| *at);
            let room = self.running.len() < MAX_IN_FLIGHT;
            tokio::select! {
                names = published.recv() => match names {
                    Ok(names) => {
                        for name in names.iter() {
                            self.resync(name);
                        }
                    }
                    Err(RecvError::Lagged(_)) => self.resync_all(),
                    Err(RecvError::Closed) => return,
                },
                _ = policy_look.tick() => {
                    let now = self.policies.load_full();
                    if !Arc::ptr_eq(&now, &self.seen) {
                        self.seen = now;
                        self.resync_all();
                    }
                }
                Ok(()) = assigned.changed() => self.resync_all(),
                () = sleep_until(due), if room => self.start_due(),
                Some(done) = self.running.join_next(), if !self.running.is_empty() => {
                    if let Ok((key, generation, verdict)) = done {
                        self.finished(key, generation, verdict);
                    }
                    self.counters.in_flight.store(self.running.len(), Ordering::Relaxed);
                }
            }
        }
    }

    fn resync_all(&mut self) {
        let mut names: Vec<Arc<str>> = self.targets.keys().cloned().collect();
        names.extend(self.registry.catalog().snapshots().map(|snapshot| snapshot.name.clone()));
        names.sort();
        names.dedup();
        for name in names {
            self.resync(&name);
        }
    }

    /// Makes the schedule of `service` match its instances and its policy.
    fn resync(&mut self, service: &Arc<str>) {
        let check = self.seen.for_service(service).health_check.clone();
        if check.is_none() && !self.targets.contains_key(service) {
            return;
        }
        let snapshot = self.registry.service(service);
        let wanted: HashMap<Arc<str>, (String, u16)> = match (&check, &snapshot) {
            (Some(_), Some(snapshot)) => snapshot
                .instances
                .iter()
                .filter(|i| i.conditions.as_ref().map_or(i.status, |c| c.announced_status) == Status::Up)
                .filter(|i| self.sharing.as_ref().is_none_or(|s| s.assignment.owns(service, &i.id)))
                .map(|i| (i.id.clone(), (i.host.clone(), i.port)))
                .collect(),
            _ => HashMap::new(),
        };
        let mut gone = Vec::new();
        if let Some(targets) = self.targets.get_mut(service) {
            targets.retain(|id, target| {
                let keep = wanted.get(id).is_some_and(|(host, port)| *host == target.host && *port == target.port);
                if !keep {
                    gone.push((id.clone(), target.failing.is_some()));
                }
                keep
            });
        }
        for (id, had_verdict) in gone {
            if had_verdict {
                self.registry.set_health(service, &id, None);
                self.tell(service, &id, None);
            }
        }
        let Some(check) = check else {
            self.targets.remove(service);
            self.count();
            return;
        };
        let check = Arc::new(check);
        let targets = self.targets.entry(service.clone()).or_default();
        let mut new = Vec::new();
        let mut dropped = Vec::new();
        for (id, (host, port)) in wanted {
            match targets.get_mut(&id) {
                Some(target) => {
                    if target.check.kind != check.kind {
                        // Another check: what the last one found is not its verdict. It starts
                        // over, as for a new instance; a result of the old one still running
                        // is not counted.
                        if target.failing.is_some() {
                            dropped.push(id.clone());
                        }
                        self.next_generation += 1;
                        target.generation = self.next_generation;
                        (target.fails, target.passes, target.failing, target.running) = (0, 0, None, false);
                        new.push((id, target.generation));
                    }
                    if *target.check != *check {
                        target.check = check.clone();
                    }
                }
                None => {
                    self.next_generation += 1;
                    let generation = self.next_generation;
                    targets.insert(
                        id.clone(),
                        Target {
                            host,
                            port,
                            check: check.clone(),
                            generation,
                            fails: 0,
                            passes: 0,
                            failing: None,
                            running: false,
                        },
                    );
                    new.push((id, generation));
                }
            }
        }
        if targets.is_empty() {
            self.targets.remove(service);
        }
        for id in dropped {
            self.registry.set_health(service, &id, None);
            self.tell(service, &id, None);
        }
        let now = Instant::now();
        for (id, generation) in new {
            let offset = check.interval.mul_f64(fastrand::f64());
            self.schedule.push(Reverse((now + offset, generation, (service.clone(), id))));
        }
        self.count();
    }

    /// Shares a verdict with the other replicas, when there are any.
    fn tell(&self, service: &Arc<str>, id: &Arc<str>, health: Option<Health>) {
        if let Some(sharing) = &self.sharing {
            let _ = sharing.verdicts.send((service.clone(), id.clone(), health));
        }
    }

    fn count(&self) {
        let checked = self.targets.values().map(HashMap::len).sum();
        let failing = self.targets.values().flat_map(HashMap::values).filter(|t| t.failing == Some(true)).count();
        self.counters.checked.store(checked, Ordering::Relaxed);
        self.counters.failing.store(failing, Ordering::Relaxed);
    }

    /// Starts the checks that are due, while there is room.
    fn start_due(&mut self) {
        let now = Instant::now();
        while self.running.len() < MAX_IN_FLIGHT {
            let Some(Reverse((at, _, _))) = self.schedule.peek() else { break };
            if *at > now {
                break;
            }
            let Some(Reverse((_, generation, key))) = self.schedule.pop() else { break };
            let Some(target) = self.targets.get_mut(&key.0).and_then(|t| t.get_mut(&key.1)) else { continue };
            if target.generation != generation || target.running {
                continue;
            }
            target.running = true;
            let checking = self.probe.check(&target.check, &target.host, target.port);
            self.running.spawn(async move { (key, generation, checking.await) });
        }
        self.counters.in_flight.store(self.running.len(), Ordering::Relaxed);
    }

    fn finished(&mut self, key: Key, generation: u64, verdict: Verdict) {
        let counter = if verdict == Verdict::Pass { &self.counters.passed } else { &self.counters.failed };
        counter.fetch_add(1, Ordering::Relaxed);
        let Some(target) = self.targets.get_mut(&key.0).and_then(|t| t.get_mut(&key.1)) else { return };
        if target.generation != generation {
            return;
        }
        target.running = false;
        let check = target.check.clone();
        let health = match verdict {
            Verdict::Pass => {
                target.passes += 1;
                target.fails = 0;
                match target.failing {
                    None => Some(Health::Passing),
                    Some(true) if target.passes >= check.healthy_after => Some(Health::Passing),
                    _ => None,
                }
            }
            // Not a failure that may pass: rota will not check this address. Failing at once.
            Verdict::Refused(why) => {
                target.fails += 1;
                target.passes = 0;
                if target.failing == Some(true) {
                    None
                } else {
                    tracing::warn!(service = %key.0, id = %key.1, %why, "health check refused: no picks while the instance is there");
                    Some(Health::Failing(why.into()))
                }
            }
            Verdict::Fail(why) => {
                target.fails += 1;
                target.passes = 0;
                let failing = target.failing == Some(true);
                if !failing && target.fails >= check.unhealthy_after {
                    tracing::warn!(service = %key.0, id = %key.1, %why, "health check failing: no picks until it passes");
                    Some(Health::Failing(why.into()))
                } else {
                    None
                }
            }
        };
        if let Some(health) = health {
            let failing = matches!(health, Health::Failing(_));
            if target.failing == Some(true) && !failing {
                tracing::info!(service = %key.0, id = %key.1, "health check passing again");
            }
            target.failing = Some(failing);
            self.tell(&key.0, &key.1, Some(health.clone()));
            self.registry.set_health(&key.0, &key.1, Some(health));
            self.count();
        }
        self.schedule.push(Reverse((Instant::now() + check.interval, generation, key)));
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
