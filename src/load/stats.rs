//! Per-instance call statistics, shared by every consumer: the store of [`super`]'s figures.
//!
//! Consumers report the outcome of each call ([`Stats::on_outcome`]); every pick counts as in
//! flight for its instance until a report for that instance arrives or the in-flight timeout
//! passes ([`Stats::on_pick`]). A call routed by a leased ticket never counted as in flight
//! (a lease reserves tickets, not calls), so its report ([`Origin::Lease`]) feeds latency,
//! counts and breaker but retires nothing. From these rota keeps, per instance:
//!
//! - the in-flight count ([`InFlight`], buckets an eighth of the in-flight timeout wide, at
//!   least a second);
//! - a latency average that decays in time ([`Ewma`]), forgotten after [`LATENCY_MEMORY`] time
//!   constants without a sample, so that an instance `response_time` starved counts as average
//!   again until its next report measures it;
//! - success and failure counts over a sliding window ([`OutcomeWindow`]);
//! - Ribbon's circuit breaker ([`Breaker`]);
//! - the calls reported to this replica, its picks per rule, and what the other replicas say of
//!   the instance ([`RemoteLoad`]).
//!
//! One consumer's failures therefore protect every consumer.
//!
//! Every change of an instance's in-flight count, latency or breaker is pushed into the
//! [`LoadIndex`]es of the published subsets it belongs to ([`Stats::attach`]), which is what
//! load-aware rules read; unreported picks that time out are expired by [`Stats::expire`],
//! which the server runs every second.

use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::breaker::{Breaker, BreakerConfig};
use super::ejection::{EjectionConfig, ServiceEjections};
use super::in_flight::{BUCKETS_PER_TIMEOUT, InFlight};
use super::index::{Load, LoadIndex, LoadSample};
use super::latency::Ewma;
pub use super::outcomes::Outcome;
use super::outcomes::{COUNT_BUCKETS, OutcomeWindow};
use crate::hash::ConcurrentMap;

/// What a failure does to an instance: its service's breaker and ejection settings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outliers {
    pub breaker: BreakerConfig,
    pub ejection: EjectionConfig,
}

impl Outliers {
    /// `breaker` with the default ejection settings.
    pub fn breaker(breaker: BreakerConfig) -> Self {
        Self { breaker, ejection: EjectionConfig::default() }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StatsConfig {
    /// A pick not reported within this time stops counting as in flight.
    pub in_flight_timeout: Duration,
    /// Time constant of the latency EWMA.
    pub latency_decay: Duration,
    /// Span of the success/failure counts.
    pub count_window: Duration,
}

impl Default for StatsConfig {
    fn default() -> Self {
        Self {
            in_flight_timeout: Duration::from_secs(30),
            latency_decay: Duration::from_secs(10),
            count_window: Duration::from_secs(60),
        }
    }
}

/// Everything known about one instance, for operators.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct InstanceReport {
    pub load: Load,
    pub successes: u64,
    pub failures: u64,
    pub successive_failures: u32,
    /// Time left until the breaker closes again.
    pub tripped_for: Option<Duration>,
    /// Calls reported to this replica since the instance was first seen, and how many failed.
    pub calls: u64,
    pub errors: u64,
}

/// How the reported call found its instance, which decides whether its report retires an
/// in-flight pick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A unary pick, counted in flight by [`Stats::on_pick`] until reported.
    Pick,
    /// A leased ticket (or a channel's local rotation): never counted in flight.
    Lease,
}

/// Time constants without a sample after which an instance's latency average is forgotten
/// (the weight a fresh sample would have had by then is 1 − e⁻³ ≈ 95 %).
pub const LATENCY_MEMORY: u32 = 3;
/// The least latency a failed call is sampled at.
pub const FAILED_CALL_LATENCY: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
struct Inner {
    in_flight: InFlight,
    latency: Ewma,
    outcomes: OutcomeWindow,
    breaker: Breaker,
    /// Calls reported to this replica, and how many of them failed.
    calls: u64,
    errors: u64,
    /// End of a failure-rate ejection (see [`super::ejection`]).
    ejected_until: Option<Instant>,
    /// The ejection end last told to the service's [`ServiceEjections`].
    announced: Option<Instant>,
    /// Successful picks of the instance, per canonical rule name (a handful of rules at most).
    picks: Vec<(Arc<str>, u64)>,
    /// The load indexes (and positions in them) this instance's changes are pushed to.
    watchers: Vec<(Weak<LoadIndex>, u32)>,
    /// What the other rota replicas sharing this state last said of the instance.
    remote: RemoteLoad,
}

/// One instance's load as the other replicas see it, merged: their picks in flight, their
/// successive failures, the latest end of a breaker one of them tripped, and the mean of
/// their latency averages.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct RemoteLoad {
    pub in_flight: u64,
    pub successive_failures: u32,
    pub tripped_until: Option<Instant>,
    pub latency_ms: Option<f64>,
}

/// One instance's load as this replica alone sees it, to share with the others.
#[derive(Debug, Clone, PartialEq)]
pub struct LocalLoad {
    pub service: Arc<str>,
    pub id: Arc<str>,
    pub in_flight: u64,
    pub successive_failures: u32,
    pub tripped_for: Option<Duration>,
    pub latency_ms: Option<f64>,
}

impl Inner {
    fn sample(&self) -> LoadSample {
        LoadSample {
            in_flight: self.in_flight.total() + self.remote.in_flight,
            latency_ms: self.latency_ms(),
            tripped_until: self.breaker.tripped_until().max(self.remote.tripped_until).max(self.ejected_until),
        }
    }

    /// This replica's latency average, merged with the others' (the mean of the two).
    fn latency_ms(&self) -> Option<f64> {
        match (self.latency.ms(), self.remote.latency_ms) {
            (Some(local), Some(remote)) => Some((local + remote) / 2.0),
            (local, remote) => local.or(remote),
        }
    }

    /// Pushes the current load to every live index; forgets dead ones. An instance no index
    /// watches (no load-aware rule read its subsets) reads nothing: the sample spans the
    /// whole entry, which a rotation over many instances finds cold.
    fn publish(&mut self, now: Instant) {
        if self.watchers.is_empty() {
            return;
        }
        let sample = self.sample();
        self.watchers.retain(|(index, position)| match index.upgrade() {
            Some(index) => {
                index.set(*position as usize, sample, now);
                true
            }
            None => false,
        });
    }
}

#[derive(Debug, Default)]
struct InstanceStats {
    inner: Mutex<Inner>,
}

/// One instance's statistics, reached without a map lookup. The store keeps an entry as long
/// as any handle to it exists.
#[derive(Debug, Clone)]
pub struct StatsHandle {
    stats: Arc<InstanceStats>,
}

/// Successful picks of one instance under one rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InstancePicks {
    pub instance: Arc<str>,
    pub rule: Arc<str>,
    pub count: u64,
}

/// Distinct rules an instance's pick tally names at most; picks under further rules are tallied
/// under [`OTHER_RULE`].
pub const MAX_TALLIED_RULES: usize = 32;
/// The rule name picks beyond the tallied rules count under.
pub const OTHER_RULE: &str = "_other";

impl InstanceStats {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the counters inconsistent in a way that
        // matters more than losing them; keep serving.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

type ServiceStats = ConcurrentMap<Arc<str>, Arc<InstanceStats>>;

#[derive(Debug)]
pub struct Stats {
    other_rule: Arc<str>,
    origin: Instant,
    config: StatsConfig,
    services: ConcurrentMap<Arc<str>, ServiceStats>,
    /// Each service's ejected instances, as picks read them.
    ejections: ConcurrentMap<Arc<str>, Arc<ServiceEjections>>,
    /// Bumped whenever an ejection starts, moves or ends early (one that runs out needs no
    /// bump: its end is in the list), so a reader of every service's ejections looks again
    /// only when something moved.
    ejection_changes: std::sync::atomic::AtomicU64,
}

impl Default for Stats {
    fn default() -> Self {
        Self::new(StatsConfig::default())
    }
}

impl Stats {
    pub fn new(config: StatsConfig) -> Self {
        Self {
            other_rule: OTHER_RULE.into(),
            origin: Instant::now(),
            config,
            services: ConcurrentMap::default(),
            ejections: ConcurrentMap::default(),
            ejection_changes: std::sync::atomic::AtomicU64::new(0),
        }
    }

    pub fn config(&self) -> StatsConfig {
        self.config
    }

    fn entry(&self, service: &Arc<str>, id: &Arc<str>) -> Arc<InstanceStats> {
        if let Some(instances) = self.services.get(&**service)
            && let Some(stats) = instances.get(&**id)
        {
            return stats.clone();
        }
        self.services.entry(service.clone()).or_default().entry(id.clone()).or_default().clone()
    }

    /// The ejected instances of `service` (an entry is made if there is none; services are
    /// bounded by the registry's limits).
    pub fn ejections(&self, service: &Arc<str>) -> Arc<ServiceEjections> {
        if let Some(found) = self.ejections.get(&**service) {
            return found.clone();
        }
        self.ejections.entry(service.clone()).or_default().clone()
    }

    /// Tells the service's ejection list when the instance's ejection started, moved or ended.
    fn announce(&self, service: &Arc<str>, id: &Arc<str>, inner: &mut Inner, now: Instant) {
        let until = inner.sample().tripped_until.filter(|until| *until > now);
        if until != inner.announced {
            inner.announced = until;
            self.ejections(service).set(id, until);
            self.ejection_changes.fetch_add(1, std::sync::atomic::Ordering::Release);
        }
    }

    /// How many times an ejection started, moved or ended early, so far.
    pub fn ejection_changes(&self) -> u64 {
        self.ejection_changes.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The handle of one instance's statistics (an entry is made if there is none).
    pub fn handle(&self, service: &Arc<str>, id: &Arc<str>) -> StatsHandle {
        StatsHandle { stats: self.entry(service, id) }
    }

    /// Feeds `index` from now on with the loads of its members, starting with what is known
    /// now. O(members).
    pub fn attach(&self, index: &Arc<LoadIndex>) {
        let now = Instant::now();
        let second = self.second(now);
        for (position, instance) in index.members().iter().enumerate() {
            let stats = self.entry(&instance.service, &instance.id);
            let mut inner = stats.lock();
            self.expire_in_flight(&mut inner, second);
            inner.watchers.retain(|(index, _)| index.strong_count() > 0);
            inner.watchers.push((Arc::downgrade(index), position as u32));
            index.set(position, inner.sample(), now);
        }
    }

    /// Stops counting picks nobody reported within the in-flight timeout, forgets latency
    /// averages `LATENCY_MEMORY` time constants old, and tells the load indexes. Linear in
    /// the instances with statistics; the server runs it off the runtime.
    pub fn expire(&self) {
        let now = Instant::now();
        let second = self.second(now);
        for service in self.services.iter() {
            for instance in service.value().iter() {
                let mut inner = instance.value().lock();
                let expired = self.expire_in_flight(&mut inner, second);
                if self.forget_stale_latency(&mut inner, now) || expired {
                    inner.publish(now);
                }
            }
        }
    }

    /// Forgets a latency average that had no sample for `LATENCY_MEMORY` time constants;
    /// whether it did.
    fn forget_stale_latency(&self, inner: &mut Inner, now: Instant) -> bool {
        inner.latency.forget_if_stale(now, self.config.latency_decay * LATENCY_MEMORY)
    }

    fn find(&self, service: &str, id: &str) -> Option<Arc<InstanceStats>> {
        self.services.get(service)?.get(id).map(|s| s.clone())
    }

    /// Width of an in-flight bucket, in seconds.
    fn bucket_width(&self) -> u64 {
        self.config.in_flight_timeout.as_secs().max(1).div_ceil(BUCKETS_PER_TIMEOUT).max(1)
    }

    fn second(&self, now: Instant) -> u64 {
        now.duration_since(self.origin).as_secs()
    }

    /// Counts a successful pick under `rule`, in flight on its instance until reported.
    pub fn on_pick(&self, handle: &StatsHandle, rule: &Arc<str>) {
        let now = Instant::now();
        let second = self.second(now);
        let bucket = second / self.bucket_width();
        let mut inner = handle.stats.lock();
        self.expire_in_flight(&mut inner, second);
        inner.in_flight.add(bucket);
        inner.publish(now);
        self.tally(&mut inner, rule);
    }

    /// Tallies a reported call that a leased ticket routed as a pick of its instance under
    /// `rule` (the reported rule when rota knows it), since rota never saw it picked.
    pub fn on_leased_call(&self, service: &Arc<str>, id: &Arc<str>, rule: Option<&Arc<str>>) {
        let stats = self.entry(service, id);
        let mut inner = stats.lock();
        self.tally(&mut inner, rule.unwrap_or(&self.other_rule));
    }

    /// Counts one pick of the instance under `rule`; past [`MAX_TALLIED_RULES`] distinct rules,
    /// under [`OTHER_RULE`].
    fn tally(&self, inner: &mut Inner, rule: &Arc<str>) {
        let name = if inner.picks.len() < MAX_TALLIED_RULES || inner.picks.iter().any(|(r, _)| **r == **rule) {
            rule
        } else {
            &self.other_rule
        };
        match inner.picks.iter_mut().find(|(r, _)| Arc::ptr_eq(r, name) || **r == **name) {
            Some((_, count)) => *count += 1,
            None => inner.picks.push((name.clone(), 1)),
        }
    }

    /// Successful picks of each instance of `service` under each rule, sorted by instance and
    /// rule.
    pub fn instance_picks(&self, service: &str) -> Vec<InstancePicks> {
        let Some(instances) = self.services.get(service) else { return Vec::new() };
        let mut all: Vec<InstancePicks> = instances
            .iter()
            .flat_map(|entry| {
                let instance = entry.key().clone();
                let picks = entry.value().lock().picks.clone();
                picks.into_iter().map(move |(rule, count)| InstancePicks { instance: instance.clone(), rule, count })
            })
            .collect();
        all.sort_by(|a, b| (&a.instance, &a.rule).cmp(&(&b.instance, &b.rule)));
        all
    }

    /// Records one reported call (an instance never picked gets an entry now).
    pub fn on_outcome(
        &self,
        service: &Arc<str>,
        id: &Arc<str>,
        outcome: Outcome,
        origin: Origin,
        latency: Duration,
        outliers: Outliers,
    ) {
        let Outliers { breaker, ejection } = outliers;
        let now = Instant::now();
        let second = self.second(now);
        let stats = self.entry(service, id);
        let mut inner = stats.lock();
        self.expire_in_flight(&mut inner, second);
        if origin == Origin::Pick {
            inner.in_flight.retire_oldest();
        }
        // A failed call is not a fast one: rules that prefer fast instances must not prefer one
        // that fails at once.
        let latency = if outcome == Outcome::Failure { latency.max(FAILED_CALL_LATENCY) } else { latency };
        inner.latency.sample(now, latency, self.config.latency_decay);
        inner.outcomes.count(self.bucket(now), outcome);
        inner.calls += 1;
        inner.errors += u64::from(outcome == Outcome::Failure);
        match outcome {
            Outcome::Success => inner.breaker.success(),
            Outcome::Failure => {
                // Other replicas' successive failures count too: the breaker trips on the fleet's.
                let others = inner.remote.successive_failures;
                inner.breaker.failure(now, &breaker, others);
                let (successes, failures) = self.window(&inner, now);
                if ejection.rate_ejects(successes + failures, failures) {
                    inner.ejected_until = inner.ejected_until.max(Some(now + breaker.blackout_base));
                }
            }
        }
        inner.publish(now);
        self.announce(service, id, &mut inner, now);
    }

    /// Successes and failures over the count window.
    fn window(&self, inner: &Inner, now: Instant) -> (u64, u64) {
        inner.outcomes.totals(self.bucket(now))
    }

    /// The load of one instance now, found by name.
    pub fn load(&self, service: &str, id: &str) -> Load {
        match self.find(service, id) {
            Some(stats) => self.load_of(&stats, Instant::now()),
            None => Load::default(),
        }
    }

    /// The load behind a handle at `now`; rules reading many instances take the clock once.
    pub fn load_handle(&self, handle: &StatsHandle, now: Instant) -> Load {
        self.load_of(&handle.stats, now)
    }

    fn load_of(&self, stats: &InstanceStats, now: Instant) -> Load {
        let mut inner = stats.lock();
        if self.expire_in_flight(&mut inner, self.second(now)) {
            inner.publish(now);
        }
        let sample = inner.sample();
        let tripped = sample.tripped_until.is_some_and(|until| until > now);
        Load { in_flight: sample.in_flight, latency_ms: sample.latency_ms, tripped }
    }

    pub fn report(&self, service: &str, id: &str) -> InstanceReport {
        let Some(stats) = self.find(service, id) else { return InstanceReport::default() };
        let now = Instant::now();
        let mut inner = stats.lock();
        if self.expire_in_flight(&mut inner, self.second(now)) {
            inner.publish(now);
        }
        let sample = inner.sample();
        let tripped_for = sample.tripped_until.filter(|until| *until > now).map(|until| until - now);
        let (successes, failures) = self.window(&inner, now);
        InstanceReport {
            load: Load { in_flight: sample.in_flight, latency_ms: sample.latency_ms, tripped: tripped_for.is_some() },
            successes,
            failures,
            successive_failures: inner.breaker.successive_failures().saturating_add(inner.remote.successive_failures),
            tripped_for,
            calls: inner.calls,
            errors: inner.errors,
        }
    }

    /// The instances whose load this replica has something to say about (picks in flight,
    /// failures, a tripped breaker), as it alone sees them. Linear in the instances with
    /// statistics; replicas sharing state through Redis send this to each other.
    pub fn local_loads(&self) -> Vec<LocalLoad> {
        let now = Instant::now();
        let second = self.second(now);
        let mut loads = Vec::new();
        for service in self.services.iter() {
            for instance in service.value().iter() {
                let mut inner = instance.value().lock();
                if self.expire_in_flight(&mut inner, second) {
                    inner.publish(now);
                }
                let tripped_for = (inner.breaker.tripped_until().max(inner.ejected_until))
                    .filter(|until| *until > now)
                    .map(|until| until - now);
                let (in_flight, failures) = (inner.in_flight.total(), inner.breaker.successive_failures());
                if in_flight > 0 || failures > 0 || tripped_for.is_some() {
                    loads.push(LocalLoad {
                        service: service.key().clone(),
                        id: instance.key().clone(),
                        in_flight,
                        successive_failures: failures,
                        tripped_for,
                        latency_ms: inner.latency.ms(),
                    });
                }
            }
        }
        loads
    }

    /// Sets what the other replicas say of one instance (an entry is made if there is none) and
    /// tells the load indexes when it changes the instance's load.
    pub fn set_remote(&self, service: &Arc<str>, id: &Arc<str>, remote: RemoteLoad) {
        let stats = self.entry(service, id);
        let mut inner = stats.lock();
        if inner.remote != remote {
            inner.remote = remote;
            let now = Instant::now();
            inner.publish(now);
            self.announce(service, id, &mut inner, now);
        }
    }

    /// The earliest moment a currently tripped instance of `service` closes its breaker.
    pub fn next_breaker_reset(&self, service: &str) -> Option<Instant> {
        let now = Instant::now();
        let instances = self.services.get(service)?;
        instances.iter().filter_map(|s| s.lock().sample().tripped_until.filter(|until| *until > now)).min()
    }

    /// Forgets instances for which `keep` returns false (they left the registry) once no
    /// handle to their statistics remains.
    /// Drops the statistics of instances that `registered(service, id)` no longer knows,
    /// unless a handle to them is still held (instances cache theirs, so the common case needs
    /// no lookup). Each map is locked only while its own entries are looked at — never the
    /// whole store at once.
    pub fn retain(&self, registered: impl Fn(&str, &str) -> bool) {
        let services: Vec<Arc<str>> = self.services.iter().map(|entry| entry.key().clone()).collect();
        for service in services {
            if let Some(instances) = self.services.get(&service) {
                instances.retain(|id, stats| Arc::strong_count(stats) > 1 || registered(&service, id));
            }
            self.services.remove_if(&service, |_, instances| instances.is_empty());
        }
        for ejections in self.ejections.iter() {
            ejections.value().prune();
        }
    }

    /// Drops the in-flight picks older than the timeout; whether any were.
    fn expire_in_flight(&self, inner: &mut Inner, second: u64) -> bool {
        inner.in_flight.expire(second, self.config.in_flight_timeout.as_secs().max(1), self.bucket_width())
    }

    fn bucket(&self, now: Instant) -> u64 {
        let width = (self.config.count_window.as_millis() as u64 / COUNT_BUCKETS).max(1);
        now.duration_since(self.origin).as_millis() as u64 / width
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> (Arc<str>, Arc<str>) {
        ("svc".into(), id.into())
    }

    #[test]
    fn ribbon_blackout_doubles_from_the_threshold_and_caps() {
        let breaker = BreakerConfig::default();
        let secs: Vec<u64> = (0..7).map(|f| breaker.blackout(f).as_secs()).collect();
        assert_eq!(secs, [0, 0, 0, 10, 20, 30, 30]);
        assert_eq!(breaker.blackout(u32::MAX), Duration::from_secs(30));
    }

    #[tokio::test(start_paused = true)]
    async fn breaker_trips_after_three_failures_and_recovers() {
        let stats = Stats::default();
        let breaker = BreakerConfig::default();
        let (service, id) = key("a");
        for _ in 0..2 {
            stats.on_outcome(
                &service,
                &id,
                Outcome::Failure,
                Origin::Pick,
                Duration::from_millis(5),
                Outliers::breaker(breaker),
            );
        }
        assert!(!stats.load("svc", "a").tripped);
        stats.on_outcome(
            &service,
            &id,
            Outcome::Failure,
            Origin::Pick,
            Duration::from_millis(5),
            Outliers::breaker(breaker),
        );
        assert!(stats.load("svc", "a").tripped);
        assert_eq!(stats.report("svc", "a").tripped_for, Some(Duration::from_secs(10)));
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(stats.load("svc", "a").tripped);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(!stats.load("svc", "a").tripped, "blackout over after 10 s");

        // A fourth failure in a row: 20 s. A success clears everything.
        stats.on_outcome(
            &service,
            &id,
            Outcome::Failure,
            Origin::Pick,
            Duration::from_millis(5),
            Outliers::breaker(breaker),
        );
        assert_eq!(stats.report("svc", "a").tripped_for, Some(Duration::from_secs(20)));
        stats.on_outcome(
            &service,
            &id,
            Outcome::Success,
            Origin::Pick,
            Duration::from_millis(5),
            Outliers::breaker(breaker),
        );
        let report = stats.report("svc", "a");
        assert_eq!((report.load.tripped, report.successive_failures), (false, 0));
        assert_eq!((report.successes, report.failures), (1, 4));
    }

    #[tokio::test(start_paused = true)]
    async fn in_flight_counts_picks_until_reported_or_timed_out() {
        let stats = Stats::default();
        let (service, id) = key("a");
        let (handle, rule): (_, Arc<str>) = (stats.handle(&service, &id), "round_robin".into());
        for _ in 0..3 {
            stats.on_pick(&handle, &rule);
        }
        assert_eq!(stats.load("svc", "a").in_flight, 3);
        stats.on_outcome(&service, &id, Outcome::Success, Origin::Pick, Duration::from_millis(1), Outliers::default());
        assert_eq!(stats.load("svc", "a").in_flight, 2);
        tokio::time::advance(Duration::from_secs(20)).await;
        stats.on_pick(&handle, &rule);
        assert_eq!(stats.load("svc", "a").in_flight, 3);
        tokio::time::advance(Duration::from_secs(9)).await;
        assert_eq!(stats.load("svc", "a").in_flight, 3, "29 s: nothing times out early");
        // The timeout is 30 s; buckets are 4 s wide, so the first picks expire by 34 s.
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(stats.load("svc", "a").in_flight, 1, "the first picks timed out");
        tokio::time::advance(Duration::from_secs(20)).await;
        assert_eq!(stats.load("svc", "a").in_flight, 0);
        // A late report never drives the count below zero.
        stats.on_outcome(&service, &id, Outcome::Success, Origin::Pick, Duration::from_millis(1), Outliers::default());
        assert_eq!(stats.load("svc", "a").in_flight, 0);
    }

    #[test]
    fn leased_reports_feed_latency_and_breaker_but_retire_no_pick() {
        let stats = Stats::default();
        let (service, id) = key("a");
        let (handle, rule): (_, Arc<str>) = (stats.handle(&service, &id), "least_request".into());
        let breaker = BreakerConfig::default();
        stats.on_pick(&handle, &rule);
        for _ in 0..3 {
            stats.on_outcome(
                &service,
                &id,
                Outcome::Failure,
                Origin::Lease,
                Duration::from_millis(8),
                Outliers::breaker(breaker),
            );
        }
        let report = stats.report("svc", "a");
        assert_eq!(report.load.in_flight, 1, "the unary pick is still in flight");
        assert_eq!((report.failures, report.successive_failures, report.load.tripped), (3, 3, true));
        assert_eq!(report.load.latency_ms, Some(FAILED_CALL_LATENCY.as_secs_f64() * 1000.0), "failures count as slow");
        stats.on_outcome(
            &service,
            &id,
            Outcome::Success,
            Origin::Pick,
            Duration::from_millis(8),
            Outliers::breaker(breaker),
        );
        assert_eq!(stats.load("svc", "a").in_flight, 0, "the pick's own report retires it");
    }

    #[tokio::test(start_paused = true)]
    async fn latency_follows_the_recent_window() {
        let stats = Stats::default();
        let (service, id) = key("a");
        let breaker = BreakerConfig::default();
        for _ in 0..10 {
            stats.on_outcome(
                &service,
                &id,
                Outcome::Success,
                Origin::Pick,
                Duration::from_millis(100),
                Outliers::breaker(breaker),
            );
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        assert!((stats.load("svc", "a").latency_ms.unwrap() - 100.0).abs() < 1e-9);
        // The instance gets fast: within a few time constants the EWMA is near the new value.
        for _ in 0..40 {
            stats.on_outcome(
                &service,
                &id,
                Outcome::Success,
                Origin::Pick,
                Duration::from_millis(10),
                Outliers::breaker(breaker),
            );
            tokio::time::advance(Duration::from_secs(1)).await;
        }
        let latency = stats.load("svc", "a").latency_ms.unwrap();
        assert!((10.0..12.0).contains(&latency), "{latency}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_latency_without_new_samples_is_forgotten_after_three_time_constants() {
        let stats = Stats::default();
        let (service, id) = key("a");
        let spec = crate::registry::InstanceSpec {
            id: "a".into(),
            service: "svc".into(),
            host: "127.0.0.1".into(),
            port: 1000,
            ..Default::default()
        };
        let members: Arc<[_]> = Arc::new([Arc::new(spec.validate("test").unwrap())]);
        let index = Arc::new(LoadIndex::new(members));
        stats.attach(&index);
        let hour = Duration::from_secs(3600);
        stats.on_outcome(
            &service,
            &id,
            Outcome::Success,
            Origin::Pick,
            hour,
            Outliers::breaker(BreakerConfig::default()),
        );
        assert_eq!(stats.load("svc", "a").latency_ms, Some(3_600_000.0));
        // Just short of 30 s (3 × the 10 s time constant) it is still held.
        tokio::time::advance(Duration::from_secs(29)).await;
        stats.expire();
        assert_eq!(stats.load("svc", "a").latency_ms, Some(3_600_000.0));
        assert_eq!(index.load(0, Instant::now()).latency_ms, Some(3_600_000.0));
        tokio::time::advance(Duration::from_secs(1)).await;
        stats.expire();
        assert_eq!(stats.load("svc", "a").latency_ms, None, "forgotten");
        assert_eq!(index.load(0, Instant::now()).latency_ms, None, "and the load index told");
        // The next sample measures it afresh, not averaged with the forgotten hour.
        let fast = Duration::from_millis(5);
        stats.on_outcome(
            &service,
            &id,
            Outcome::Success,
            Origin::Pick,
            fast,
            Outliers::breaker(BreakerConfig::default()),
        );
        assert_eq!(stats.load("svc", "a").latency_ms, Some(5.0));
    }

    #[tokio::test(start_paused = true)]
    async fn failure_counts_slide_out_of_the_window() {
        let stats = Stats::default();
        let (service, id) = key("a");
        let breaker = BreakerConfig { failure_threshold: 100, ..Default::default() };
        stats.on_outcome(&service, &id, Outcome::Failure, Origin::Pick, Duration::ZERO, Outliers::breaker(breaker));
        tokio::time::advance(Duration::from_secs(30)).await;
        stats.on_outcome(&service, &id, Outcome::Success, Origin::Pick, Duration::ZERO, Outliers::breaker(breaker));
        assert_eq!(stats.report("svc", "a").failures, 1);
        tokio::time::advance(Duration::from_secs(31)).await;
        let report = stats.report("svc", "a");
        assert_eq!((report.successes, report.failures), (1, 0));
    }

    #[test]
    fn picks_are_tallied_per_instance_and_rule() {
        let stats = Stats::default();
        let (service, a) = key("a");
        let b: Arc<str> = "b".into();
        let (rr, repeat): (Arc<str>, Arc<str>) = ("round_robin".into(), "repeat(n=3)".into());
        let (ha, hb) = (stats.handle(&service, &a), stats.handle(&service, &b));
        stats.on_pick(&ha, &rr);
        stats.on_pick(&ha, &rr);
        // An equal rule name from another allocation counts under the same rule.
        stats.on_pick(&ha, &Arc::from("round_robin"));
        stats.on_pick(&ha, &repeat);
        stats.on_pick(&hb, &rr);
        let tally: Vec<_> =
            stats.instance_picks("svc").iter().map(|p| (p.instance.to_string(), p.rule.to_string(), p.count)).collect();
        assert_eq!(
            tally,
            [
                ("a".to_owned(), "repeat(n=3)".to_owned(), 1),
                ("a".to_owned(), "round_robin".to_owned(), 3),
                ("b".to_owned(), "round_robin".to_owned(), 1)
            ]
        );
        assert!(stats.instance_picks("other").is_empty());
    }

    #[test]
    fn entries_live_while_handles_do() {
        let stats = Stats::default();
        let (service, id) = key("a");
        let handle = stats.handle(&service, &id);
        stats.on_pick(&handle, &"round_robin".into());
        // The instance left, but a handle remains: the entry stays.
        stats.retain(|_, _| false);
        assert_eq!(stats.load("svc", "a").in_flight, 1);
        drop(handle);
        stats.retain(|_, _| false);
        assert_eq!(stats.load("svc", "a"), Load::default(), "forgotten once no handle remains");
    }

    #[tokio::test(start_paused = true)]
    async fn attached_indexes_follow_picks_reports_and_expiry() {
        use crate::registry::InstanceSpec;
        let stats = Stats::new(StatsConfig { in_flight_timeout: Duration::from_secs(5), ..StatsConfig::default() });
        let members: Vec<Arc<crate::registry::Instance>> = ["a", "b"]
            .iter()
            .map(|id| {
                let spec = InstanceSpec {
                    id: (*id).into(),
                    service: "svc".into(),
                    host: "127.0.0.1".into(),
                    port: 1000,
                    ..Default::default()
                };
                Arc::new(spec.validate("test").unwrap())
            })
            .collect();
        let (service, b) = key("b");
        let handle = stats.handle(&service, &b);
        stats.on_pick(&handle, &"best_available".into());
        let index = Arc::new(LoadIndex::new(members.into()));
        stats.attach(&index);
        let now = || Instant::now();
        assert_eq!(index.load(1, now()).in_flight, 1, "attached with what is known");
        stats.on_pick(&handle, &"best_available".into());
        assert_eq!(index.load(1, now()).in_flight, 2);
        let breaker = BreakerConfig { failure_threshold: 1, ..BreakerConfig::default() };
        stats.on_outcome(
            &service,
            &b,
            Outcome::Failure,
            Origin::Pick,
            Duration::from_millis(3),
            Outliers::breaker(breaker),
        );
        let load = index.load(1, now());
        assert_eq!((load.in_flight, load.tripped, load.latency_ms), (1, true, Some(1000.0)));
        tokio::time::advance(Duration::from_secs(6)).await;
        stats.expire();
        assert_eq!(index.load(1, now()).in_flight, 0, "the unreported pick expired");
        // A dropped index is forgotten by the next push.
        drop(index);
        stats.on_pick(&handle, &"best_available".into());
        assert_eq!(stats.find("svc", "b").unwrap().lock().watchers.len(), 0);
    }

    #[test]
    fn an_instance_tallies_a_bounded_number_of_rules() {
        let stats = Stats::default();
        let (service, id) = key("a");
        let handle = stats.handle(&service, &id);
        for n in 0..MAX_TALLIED_RULES + 5 {
            stats.on_pick(&handle, &format!("repeat(n={})", n + 1).into());
        }
        stats.on_pick(&handle, &"repeat(n=1)".into());
        let tally = stats.instance_picks("svc");
        assert_eq!(tally.len(), MAX_TALLIED_RULES + 1);
        let count = |rule: &str| tally.iter().find(|p| &*p.rule == rule).map(|p| p.count);
        assert_eq!((count(OTHER_RULE), count("repeat(n=1)")), (Some(5), Some(2)));
    }
}
