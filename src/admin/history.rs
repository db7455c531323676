//! The recent history the dashboard's plots are drawn from, kept by the server.
//!
//! The dashboard plots picks per second per instance, the latency rota holds per instance,
//! picks per second per version, and breaker trips and registrations as markers on the same
//! time axis. Those plots are drawn from a small ring of samples kept here ([`History`]) rather
//! than from what a page collects out of the 500 ms view:
//!
//! - A rate is a counter delta divided by the time between the two readings, and here both
//!   readings are taken by one task on one monotonic clock, once per [`SAMPLE_INTERVAL`]. A page
//!   would divide by the arrival times of events instead, which a throttled background tab, a
//!   slow link or a push on a registry change (between two ticks) all distort.
//! - A reload, a second operator, or a page opened after the traffic sees the last
//!   [`HISTORY_SAMPLES`] samples (five minutes) at once, instead of an empty plot.
//! - Registrations, departures and status changes are read from every catalog publication, so
//!   an instance that came and went between two pushes still leaves its mark.
//!
//! Latency: rota keeps one exponentially weighted moving average of reported call latencies per
//! instance (see `crate::load::Stats`), not a distribution, so the history samples that EWMA and
//! the page labels it as such; it shows no percentiles it does not have.
//!
//! # Memory
//!
//! Everything is bounded, whatever the uptime and the traffic:
//!
//! - at most [`MAX_SAMPLED_SERVICES`] services have a ring. Services get one as they are
//!   registered while there is room; once the rings are full, a service opened on a dashboard
//!   takes the ring of the service least recently looked at that no open stream is watching.
//!   Rings of services the registry forgot are dropped;
//! - a ring holds at most [`HISTORY_SAMPLES`] samples and [`MAX_MARKERS`] markers, the oldest
//!   dropped first;
//! - a sample holds at most [`MAX_INSTANCE_SERIES`] instances (the first by id; the rest are
//!   summed as `others`) and [`MAX_VERSION_SERIES`] versions (the rest summed as `_other`); a
//!   marker names at most [`MARKER_IDS`] instances and counts the rest.
//!
//! That is under 1 KB a sample and about 5 MB in the worst case, a few kilobytes for a typical
//! service. Between two samples a ring also remembers each registered instance's pick total and
//! breaker state and the snapshot it last compared against: proportional to the instances
//! registered now, like the registry itself, never to time.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Serialize, Serializer};
use tokio::sync::{broadcast, watch};
use tokio::time::{Instant, MissedTickBehavior};

use super::AdminState;
use crate::balancer::Overview;
use crate::registry::{Change, Instance, ServiceSnapshot, diff};

/// Time between two history samples of a service.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);
/// Samples a ring keeps: five minutes at one a second.
pub const HISTORY_SAMPLES: usize = 300;
/// Services sampled at once.
pub const MAX_SAMPLED_SERVICES: usize = 16;
/// Instances a sample describes one by one (the first by id); the rest are summed.
pub const MAX_INSTANCE_SERIES: usize = 16;
/// Versions a sample counts one by one; the rest are summed under [`OTHER_VERSIONS`].
pub const MAX_VERSION_SERIES: usize = 8;
/// Label of the versions beyond [`MAX_VERSION_SERIES`].
pub const OTHER_VERSIONS: &str = "_other";
/// Markers (registrations, departures, status changes, breaker trips) a ring keeps.
pub const MAX_MARKERS: usize = 100;
/// Instance ids one marker names; a marker for more counts them.
pub const MARKER_IDS: usize = 3;

fn arc_str<S: Serializer>(value: &Arc<str>, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(value)
}

/// One instance in one sample.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    #[serde(serialize_with = "arc_str")]
    pub id: Arc<str>,
    /// Successful picks of the instance since the previous sample.
    pub picks: u32,
    /// The instance's latency EWMA when sampled; `null` before its first reported call.
    pub latency_ms: Option<f32>,
    /// Picks not reported yet (and not timed out) when sampled.
    pub in_flight: u32,
    pub breaker_open: bool,
}

/// The instances of a sample beyond the [`MAX_INSTANCE_SERIES`] described one by one.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Others {
    pub instances: u32,
    pub picks: u32,
}

/// Registered instances of one version in one sample, and their picks since the previous one.
#[derive(Debug, Clone, Serialize)]
pub struct VersionPicks {
    /// Empty for instances without a version.
    #[serde(serialize_with = "arc_str")]
    pub version: Arc<str>,
    pub instances: u32,
    pub picks: u32,
}

/// One reading of a service.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Milliseconds on the history clock ([`Clock`]).
    pub t: u64,
    /// Milliseconds since the previous reading: `picks / (ms / 1000)` is picks per second.
    pub ms: u32,
    pub instances: Box<[Point]>,
    pub others: Option<Others>,
    pub versions: Box<[VersionPicks]>,
}

/// Something that happened to a service's instances, at a moment on the history clock.
#[derive(Debug, Clone, Serialize)]
pub struct Marker {
    pub t: u64,
    /// `registered`, `left`, `status` (see `detail`), `breaker_open` or `breaker_closed`.
    pub kind: &'static str,
    /// The first instances concerned, at most [`MARKER_IDS`].
    pub ids: Vec<String>,
    /// How many instances are concerned.
    pub count: u32,
    /// For `status`: the new status.
    pub detail: Option<&'static str>,
}

/// The history clock against the wall clock: a sample taken at `t` was taken at
/// `unix_ms - (now - t)`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Clock {
    pub now: u64,
    pub unix_ms: u64,
}

/// What an event adds to the history a page holds.
#[derive(Debug, Clone, Serialize)]
pub struct HistoryUpdate {
    /// `false` when no ring is kept for the service (not registered, or every ring is taken by
    /// a service someone is watching).
    pub kept: bool,
    /// `true` when the page must drop what it holds first (the first event of a stream, or the
    /// ring was started again).
    pub reset: bool,
    pub interval_ms: u64,
    /// Samples a ring keeps at most.
    pub window: usize,
    pub clock: Clock,
    pub samples: Vec<Sample>,
    pub markers: Vec<Marker>,
}

struct Ring {
    /// Distinguishes this ring from an earlier one of the same service.
    generation: u64,
    samples: VecDeque<Sample>,
    /// Sequence number of `samples[0]`.
    first_sample: u64,
    markers: VecDeque<Marker>,
    /// Sequence number of `markers[0]`.
    first_marker: u64,
    /// When the pick totals below were read.
    read_at: Instant,
    /// Pick total of each registered instance at `read_at` (or at its registration).
    totals: HashMap<Arc<str>, u64>,
    /// Instances whose breaker was open at the last reading.
    tripped: HashSet<Arc<str>>,
    /// The snapshot registrations were last compared against; `None` before the first.
    seen: Option<Arc<ServiceSnapshot>>,
    /// Event streams following the service now.
    watchers: usize,
    /// When the last of them closed.
    last_watched: Option<Instant>,
}

impl Ring {
    fn push_sample(&mut self, sample: Sample) {
        if self.samples.len() == HISTORY_SAMPLES {
            self.samples.pop_front();
            self.first_sample += 1;
        }
        self.samples.push_back(sample);
    }

    fn push_marker(&mut self, marker: Marker) {
        if self.markers.len() == MAX_MARKERS {
            self.markers.pop_front();
            self.first_marker += 1;
        }
        self.markers.push_back(marker);
    }

    fn marker(&mut self, t: u64, kind: &'static str, detail: Option<&'static str>, ids: &[Arc<str>]) {
        if ids.is_empty() {
            return;
        }
        let named = ids.iter().take(MARKER_IDS).map(|id| id.to_string()).collect();
        let count = u32::try_from(ids.len()).unwrap_or(u32::MAX);
        self.push_marker(Marker { t, kind, ids: named, count, detail });
    }
}

/// Where a stream is in a ring: what it has sent.
#[derive(Debug, Clone, Copy, Default)]
pub struct Cursor {
    generation: u64,
    samples: u64,
    markers: u64,
}

/// The recent history of up to [`MAX_SAMPLED_SERVICES`] services (see the module docs).
pub struct History {
    overview: Overview,
    origin: Instant,
    next_generation: AtomicU64,
    rings: Mutex<HashMap<Arc<str>, Ring>>,
}

/// A stream following a service: its ring is not given to another service meanwhile.
pub struct Watching {
    history: Arc<History>,
    service: Arc<str>,
    generation: u64,
}

impl Drop for Watching {
    fn drop(&mut self) {
        if let Some(ring) = self.history.lock().get_mut(&self.service)
            && ring.generation == self.generation
        {
            ring.watchers = ring.watchers.saturating_sub(1);
            ring.last_watched = Some(Instant::now());
        }
    }
}

/// What the sampler does next.
enum Work {
    Sample,
    Published(Vec<Arc<str>>),
    Rescan,
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

fn clamp_u32(n: u64) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl History {
    pub fn new(overview: Overview) -> Self {
        Self { overview, origin: Instant::now(), next_generation: AtomicU64::new(1), rings: Mutex::default() }
    }

    /// A history for the admin listener, sampled by a task on the current runtime (if any)
    /// until the listener stops or the history is dropped.
    pub fn start(state: &AdminState) -> Arc<Self> {
        let history = Arc::new(Self::new(state.overview.clone()));
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let published = state.overview.published();
            runtime.spawn(sampler(Arc::downgrade(&history), published, state.stopping.clone()));
        }
        history
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Arc<str>, Ring>> {
        // The rings are a picture for operators: after a panic elsewhere, keep drawing.
        self.rings.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn now(&self) -> (Instant, u64) {
        let now = Instant::now();
        (now, millis(now.duration_since(self.origin)))
    }

    fn clock(&self) -> Clock {
        let unix_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, millis);
        Clock { now: self.now().1, unix_ms }
    }

    fn ring(&self, now: Instant, seen: Option<Arc<ServiceSnapshot>>) -> Ring {
        let totals = match &seen {
            Some(snapshot) => self.totals(&snapshot.name).into_iter().collect(),
            None => HashMap::new(),
        };
        Ring {
            generation: self.next_generation.fetch_add(1, Ordering::Relaxed),
            samples: VecDeque::new(),
            first_sample: 0,
            markers: VecDeque::new(),
            first_marker: 0,
            read_at: now,
            totals,
            tripped: HashSet::new(),
            seen,
            watchers: 0,
            last_watched: None,
        }
    }

    /// Successful picks of each instance of `service` so far, sorted by id.
    fn totals(&self, service: &str) -> Vec<(Arc<str>, u64)> {
        let mut totals: Vec<(Arc<str>, u64)> = Vec::new();
        // Tallies come sorted by instance, then rule.
        for tally in self.overview.instance_picks(service) {
            match totals.last_mut() {
                Some((id, total)) if *id == tally.instance => *total += tally.count,
                _ => totals.push((tally.instance, tally.count)),
            }
        }
        totals
    }

    /// Follows `service`: gives it a ring if it has none (taking the one least recently
    /// watched when all are in use). `None` when it is not registered or every ring is watched.
    pub fn watch(self: &Arc<Self>, service: &str) -> Option<Watching> {
        let snapshot = self.overview.service(service)?;
        let mut rings = self.lock();
        if !rings.contains_key(service) {
            if rings.len() >= MAX_SAMPLED_SERVICES {
                let idle = rings
                    .iter()
                    .filter(|(_, ring)| ring.watchers == 0)
                    .min_by_key(|(_, ring)| ring.last_watched)
                    .map(|(name, _)| name.clone())?;
                rings.remove(&idle);
            }
            let ring = self.ring(Instant::now(), Some(snapshot.clone()));
            rings.insert(snapshot.name.clone(), ring);
        }
        let ring = rings.get_mut(service)?;
        ring.watchers += 1;
        Some(Watching { history: self.clone(), service: snapshot.name.clone(), generation: ring.generation })
    }

    /// The samples and markers of `service` that `cursor` has not seen, moving it on.
    pub fn since(&self, service: &str, cursor: &mut Cursor) -> HistoryUpdate {
        let clock = self.clock();
        let rings = self.lock();
        let mut update = HistoryUpdate {
            kept: false,
            reset: false,
            interval_ms: millis(SAMPLE_INTERVAL),
            window: HISTORY_SAMPLES,
            clock,
            samples: Vec::new(),
            markers: Vec::new(),
        };
        let Some(ring) = rings.get(service) else {
            update.reset = cursor.generation != 0;
            *cursor = Cursor::default();
            return update;
        };
        update.kept = true;
        if ring.generation != cursor.generation {
            update.reset = true;
            *cursor = Cursor { generation: ring.generation, samples: 0, markers: 0 };
        }
        let skip = cursor.samples.saturating_sub(ring.first_sample);
        update.samples = ring.samples.iter().skip(usize::try_from(skip).unwrap_or(usize::MAX)).cloned().collect();
        cursor.samples = ring.first_sample + ring.samples.len() as u64;
        let skip = cursor.markers.saturating_sub(ring.first_marker);
        update.markers = ring.markers.iter().skip(usize::try_from(skip).unwrap_or(usize::MAX)).cloned().collect();
        cursor.markers = ring.first_marker + ring.markers.len() as u64;
        update
    }

    fn run(&self, work: Work) {
        match work {
            Work::Sample => self.sample(),
            Work::Published(names) => self.published(&names),
            Work::Rescan => {
                let names: Vec<Arc<str>> = self.lock().keys().cloned().collect();
                self.published(&names);
            }
        }
    }

    /// Notes the registrations, departures and status changes of the services a publication
    /// changed. A service registered while there is room gets a ring, its first instances
    /// marked as registered.
    pub fn published(&self, names: &[Arc<str>]) {
        let catalog = self.overview.catalog();
        let (now, t) = self.now();
        let mut rings = self.lock();
        for name in names {
            let Some(snapshot) = catalog.get(name) else { continue };
            if !rings.contains_key(name) {
                if rings.len() >= MAX_SAMPLED_SERVICES {
                    continue;
                }
                rings.insert(name.clone(), self.ring(now, None));
            }
            if let Some(ring) = rings.get_mut(name) {
                self.compare(ring, snapshot, t);
            }
        }
    }

    /// Marks what changed between the ring's last snapshot and `snapshot`.
    fn compare(&self, ring: &mut Ring, snapshot: &Arc<ServiceSnapshot>, t: u64) {
        if ring.seen.as_ref().is_some_and(|seen| Arc::ptr_eq(seen, snapshot) || seen.epoch == snapshot.epoch) {
            return;
        }
        let before: &[Arc<Instance>] = ring.seen.as_ref().map_or(&[], |seen| &seen.instances);
        let (mut registered, mut left) = (Vec::new(), Vec::new());
        let mut statuses: BTreeMap<&'static str, Vec<Arc<str>>> = BTreeMap::new();
        for change in diff(before, &snapshot.instances) {
            match change {
                Change::Added(instance) => registered.push(instance.id.clone()),
                Change::Removed(instance) => left.push(instance.id.clone()),
                Change::Updated { old, new } if old.status != new.status => {
                    statuses.entry(new.status.as_str()).or_default().push(new.id.clone());
                }
                Change::Updated { .. } => {}
            }
        }
        if !registered.is_empty() {
            // Picks of a newly registered instance count from now: an id registered again
            // before its statistics were dropped keeps its old total, which is no new traffic.
            let totals = self.totals(&snapshot.name);
            for id in &registered {
                let total = totals.binary_search_by(|(i, _)| i.cmp(id)).map_or(0, |at| totals[at].1);
                ring.totals.insert(id.clone(), total);
            }
        }
        for id in &left {
            ring.totals.remove(id);
            ring.tripped.remove(id);
        }
        ring.marker(t, "registered", None, &registered);
        ring.marker(t, "left", None, &left);
        for (status, ids) in &statuses {
            ring.marker(t, "status", Some(status), ids);
        }
        ring.seen = Some(snapshot.clone());
    }

    /// Takes one sample of every service with a ring, first giving rings to registered
    /// services while there is room and dropping those of services the registry forgot. A
    /// ring given now is first read at the next sample: a reading needs an interval to be a
    /// rate (a reading over no time would plot as 0/0).
    pub fn sample(&self) {
        let catalog = self.overview.catalog();
        let names: Vec<Arc<str>> = {
            let now = Instant::now();
            let mut rings = self.lock();
            rings.retain(|name, _| catalog.get(name).is_some());
            let sampled: Vec<Arc<str>> = rings.keys().cloned().collect();
            if rings.len() < MAX_SAMPLED_SERVICES && catalog.len() > rings.len() {
                let room = MAX_SAMPLED_SERVICES - rings.len();
                let mut unsampled: Vec<&Arc<ServiceSnapshot>> =
                    catalog.snapshots().filter(|s| !rings.contains_key(&s.name)).collect();
                unsampled.sort_by(|a, b| a.name.cmp(&b.name));
                for snapshot in unsampled.into_iter().take(room) {
                    rings.insert(snapshot.name.clone(), self.ring(now, Some(snapshot.clone())));
                }
            }
            sampled
        };
        for name in names {
            let Some(snapshot) = catalog.get(&name) else { continue };
            let (now, t) = self.now();
            let mut rings = self.lock();
            if let Some(ring) = rings.get_mut(&name) {
                self.compare(ring, snapshot, t);
                self.read(ring, snapshot, now, t);
            }
        }
    }

    /// Reads one service's counters and statistics into a sample.
    fn read(&self, ring: &mut Ring, snapshot: &ServiceSnapshot, now: Instant, t: u64) {
        let totals = self.totals(&snapshot.name);
        let mut points = Vec::with_capacity(snapshot.instances.len().min(MAX_INSTANCE_SERIES));
        let mut others = Others::default();
        let mut versions: BTreeMap<Arc<str>, (u32, u64)> = BTreeMap::new();
        let mut next_totals = HashMap::with_capacity(snapshot.instances.len());
        let mut tripped = HashSet::new();
        let (mut opened, mut closed) = (Vec::new(), Vec::new());
        for (at, instance) in snapshot.instances.iter().enumerate() {
            let total = totals.binary_search_by(|(i, _)| i.cmp(&instance.id)).map_or(0, |at| totals[at].1);
            // A total lower than the last reading was counted again from zero.
            let picks = ring.totals.get(&instance.id).map_or(0, |&before| total.checked_sub(before).unwrap_or(total));
            next_totals.insert(instance.id.clone(), total);
            let report = self.overview.instance_stats(&snapshot.name, &instance.id);
            if report.load.tripped {
                if !ring.tripped.contains(&instance.id) {
                    opened.push(instance.id.clone());
                }
                tripped.insert(instance.id.clone());
            } else if ring.tripped.contains(&instance.id) {
                closed.push(instance.id.clone());
            }
            if at < MAX_INSTANCE_SERIES {
                points.push(Point {
                    id: instance.id.clone(),
                    picks: clamp_u32(picks),
                    latency_ms: report.load.latency_ms.map(|ms| ms as f32),
                    in_flight: clamp_u32(report.load.in_flight),
                    breaker_open: report.load.tripped,
                });
            } else {
                others.instances += 1;
                others.picks = others.picks.saturating_add(clamp_u32(picks));
            }
            let version = versions.entry(instance.version.clone()).or_default();
            version.0 += 1;
            version.1 += picks;
        }
        let mut version_picks: Vec<VersionPicks> = Vec::with_capacity(versions.len().min(MAX_VERSION_SERIES));
        for (at, (version, (instances, picks))) in versions.into_iter().enumerate() {
            if at + 1 < MAX_VERSION_SERIES {
                version_picks.push(VersionPicks { version, instances, picks: clamp_u32(picks) });
            } else if at + 1 == MAX_VERSION_SERIES {
                version_picks.push(VersionPicks { version: OTHER_VERSIONS.into(), instances, picks: clamp_u32(picks) });
            } else if let Some(other) = version_picks.last_mut() {
                other.instances += instances;
                other.picks = other.picks.saturating_add(clamp_u32(picks));
            }
        }
        ring.marker(t, "breaker_open", None, &opened);
        ring.marker(t, "breaker_closed", None, &closed);
        let ms = clamp_u32(millis(now.duration_since(ring.read_at)));
        ring.push_sample(Sample {
            t,
            ms,
            instances: points.into_boxed_slice(),
            others: (others.instances > 0).then_some(others),
            versions: version_picks.into_boxed_slice(),
        });
        ring.read_at = now;
        ring.totals = next_totals;
        ring.tripped = tripped;
    }
}

/// Samples every [`SAMPLE_INTERVAL`] and follows the registry's publications, off the async
/// runtime, until the admin listener stops or the history is gone.
async fn sampler(
    history: Weak<History>,
    mut published: broadcast::Receiver<Arc<[Arc<str>]>>,
    mut stopping: watch::Receiver<bool>,
) {
    let mut ticker = tokio::time::interval(SAMPLE_INTERVAL);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        let work = tokio::select! {
            biased;
            _ = stopping.wait_for(|stopping| *stopping) => return,
            _ = ticker.tick() => Work::Sample,
            received = published.recv() => match received {
                Ok(names) => {
                    let mut names = names.to_vec();
                    // Publications that queued up meanwhile are handled together.
                    loop {
                        match published.try_recv() {
                            Ok(more) => names.extend(more.iter().cloned()),
                            Err(broadcast::error::TryRecvError::Lagged(_)) => break,
                            Err(_) => break,
                        }
                    }
                    names.sort();
                    names.dedup();
                    Work::Published(names)
                }
                Err(broadcast::error::RecvError::Lagged(_)) => Work::Rescan,
                Err(broadcast::error::RecvError::Closed) => return,
            },
        };
        let Some(history) = history.upgrade() else { return };
        if tokio::task::spawn_blocking(move || history.run(work)).await.is_err() {
            tracing::warn!("admin history sampling failed");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balancer::{Balancer, CallOutcome, CallResult, PickQuery};
    use crate::registry::{InstanceSpec, Lease, Registry, RegistryConfig};

    fn spec(service: &str, id: &str, version: &str) -> InstanceSpec {
        InstanceSpec {
            id: id.into(),
            service: service.into(),
            host: "127.0.0.1".into(),
            port: 80,
            version: version.into(),
            ..Default::default()
        }
    }

    async fn announce(lease: &Lease, specs: Vec<InstanceSpec>) {
        let outcome = lease.announce(specs).await.unwrap();
        assert!(outcome.refused.is_empty(), "{outcome:?}");
    }

    fn history() -> (Arc<History>, Arc<Balancer>) {
        let balancer = Arc::new(Balancer::with_defaults(Registry::spawn(RegistryConfig::default())));
        (Arc::new(History::new(Overview::new(balancer.clone()))), balancer)
    }

    async fn pick(balancer: &Balancer, service: &str, version: &str, exclude: &[String], n: usize) {
        for _ in 0..n {
            balancer.pick(PickQuery { service, version, exclude, ..Default::default() }).await.unwrap();
        }
    }

    fn everything(history: &History, service: &str) -> HistoryUpdate {
        history.since(service, &mut Cursor::default())
    }

    fn picks(sample: &Sample) -> Vec<(&str, u32)> {
        sample.instances.iter().map(|p| (&*p.id, p.picks)).collect()
    }

    fn markers(update: &HistoryUpdate) -> Vec<(&'static str, Vec<String>, u32)> {
        update.markers.iter().map(|m| (m.kind, m.ids.clone(), m.count)).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn rates_are_counter_deltas_over_the_measured_interval() {
        let (history, balancer) = history();
        let lease = balancer.registry().open_lease();
        announce(&lease, vec![spec("svc", "a", ""), spec("svc", "b", ""), spec("svc", "c", "v2")]).await;
        history.published(&["svc".into()]);

        pick(&balancer, "svc", "", &[], 4).await;
        tokio::time::advance(Duration::from_millis(1500)).await;
        history.sample();
        pick(&balancer, "svc", "", &["b".to_owned()], 3).await;
        pick(&balancer, "svc", "v2", &[], 5).await;
        tokio::time::advance(Duration::from_secs(1)).await;
        history.sample();
        tokio::time::advance(Duration::from_secs(1)).await;
        history.sample();

        let update = everything(&history, "svc");
        assert!(update.kept && update.reset);
        let samples = &update.samples;
        assert_eq!(samples.iter().map(|s| s.ms).collect::<Vec<_>>(), [1500, 1000, 1000]);
        assert_eq!(picks(&samples[0]), [("a", 2), ("b", 2), ("c", 0)]);
        assert_eq!(picks(&samples[1]), [("a", 3), ("b", 0), ("c", 5)]);
        assert_eq!(picks(&samples[2]), [("a", 0), ("b", 0), ("c", 0)]);
        let versions: Vec<_> = samples[1].versions.iter().map(|v| (&*v.version, v.instances, v.picks)).collect();
        assert_eq!(versions, [("", 2, 3), ("v2", 1, 5)]);
        assert_eq!(samples[1].t - samples[0].t, 1000);
        assert_eq!(markers(&update), [("registered", vec!["a".into(), "b".into(), "c".into()], 3)]);
    }

    /// A service registered before the history starts (one a source followed before a
    /// restart, say) gets its ring at a sampling pass: its first reading spans an interval.
    #[tokio::test(start_paused = true)]
    async fn a_service_present_before_the_first_sample_reads_over_an_interval() {
        let balancer = Arc::new(Balancer::with_defaults(Registry::spawn(RegistryConfig::default())));
        let lease = balancer.registry().open_lease();
        announce(&lease, vec![spec("early", "a", "")]).await;
        pick(&balancer, "early", "", &[], 2).await;
        let history = Arc::new(History::new(Overview::new(balancer.clone())));
        history.sample();
        pick(&balancer, "early", "", &[], 3).await;
        tokio::time::advance(Duration::from_secs(1)).await;
        history.sample();
        tokio::time::advance(Duration::from_secs(1)).await;
        history.sample();
        let samples = everything(&history, "early").samples;
        assert_eq!(samples.iter().map(|s| s.ms).collect::<Vec<_>>(), [1000, 1000]);
        assert_eq!(picks(&samples[0]), [("a", 3)], "picks before the ring was given are not counted");
    }

    #[tokio::test(start_paused = true)]
    async fn registrations_departures_and_breaker_trips_are_marked() {
        let (history, balancer) = history();
        let lease = balancer.registry().open_lease();
        announce(&lease, vec![spec("svc", "a", "")]).await;
        history.published(&["svc".into()]);
        let mut cursor = Cursor::default();
        assert_eq!(markers(&history.since("svc", &mut cursor)), [("registered", vec!["a".into()], 1)]);

        let other = balancer.registry().open_lease();
        announce(&other, vec![spec("svc", "b", "")]).await;
        history.published(&["svc".into()]);
        pick(&balancer, "svc", "", &[], 2).await;
        let failure = CallOutcome {
            service: "svc".into(),
            instance_id: "b".into(),
            ticket: 0,
            latency: Duration::from_millis(20),
            result: Some(CallResult::Error),
            leased: false,
            rule: String::new(),
        };
        balancer.report(&vec![failure; 3]).unwrap();
        tokio::time::advance(SAMPLE_INTERVAL).await;
        history.sample();
        let update = history.since("svc", &mut cursor);
        assert!(!update.reset, "the same ring goes on");
        assert_eq!(markers(&update), [("registered", vec!["b".into()], 1), ("breaker_open", vec!["b".into()], 1)]);
        let b = &update.samples[0].instances[1];
        assert_eq!(
            (&*b.id, b.picks, b.latency_ms, b.breaker_open),
            ("b", 1, Some(1000.0), true),
            "a failure counts as slow"
        );

        drop(other);
        // The withdrawal is published by the registry task.
        tokio::time::timeout(Duration::from_secs(5), async {
            while balancer.registry().service("svc").unwrap().instances.len() != 1 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .unwrap();
        history.published(&["svc".into()]);
        assert_eq!(markers(&history.since("svc", &mut cursor)), [("left", vec!["b".into()], 1)]);
    }

    #[tokio::test(start_paused = true)]
    async fn an_id_registered_again_counts_only_its_new_picks() {
        let (history, balancer) = history();
        let lease = balancer.registry().open_lease();
        announce(&lease, vec![spec("svc", "a", ""), spec("svc", "keep", "")]).await;
        history.published(&["svc".into()]);
        pick(&balancer, "svc", "", &["keep".to_owned()], 5).await;
        let refs = vec![crate::registry::InstanceRef { service: "svc".into(), id: "a".into() }];
        lease.withdraw(refs).await.unwrap();
        history.published(&["svc".into()]);
        // Registered again before housekeeping dropped its statistics: the old total stays.
        announce(&lease, vec![spec("svc", "a", "")]).await;
        history.published(&["svc".into()]);
        pick(&balancer, "svc", "", &["keep".to_owned()], 2).await;
        tokio::time::advance(SAMPLE_INTERVAL).await;
        history.sample();
        let update = everything(&history, "svc");
        assert_eq!(picks(&update.samples[0]), [("a", 2), ("keep", 0)]);
    }

    #[tokio::test(start_paused = true)]
    async fn rings_samples_markers_and_series_are_bounded() {
        let (history, balancer) = history();
        let lease = balancer.registry().open_lease();
        let wide: Vec<_> =
            (0..MAX_INSTANCE_SERIES + 4).map(|n| spec("wide", &format!("i{n:02}"), &format!("v{n:02}"))).collect();
        announce(&lease, wide).await;
        history.published(&["wide".into()]);
        for _ in 0..HISTORY_SAMPLES + 20 {
            lease.touch();
            tokio::time::advance(SAMPLE_INTERVAL).await;
            history.sample();
        }
        let mut cursor = Cursor::default();
        let update = history.since("wide", &mut cursor);
        assert_eq!(update.samples.len(), HISTORY_SAMPLES);
        let last = update.samples.last().unwrap();
        assert_eq!(last.instances.len(), MAX_INSTANCE_SERIES);
        assert_eq!(last.others.map(|o| o.instances), Some(4));
        assert_eq!(last.versions.len(), MAX_VERSION_SERIES);
        assert_eq!(&*last.versions[MAX_VERSION_SERIES - 1].version, OTHER_VERSIONS);
        assert_eq!(last.versions.iter().map(|v| v.instances).sum::<u32>(), MAX_INSTANCE_SERIES as u32 + 4);
        assert_eq!(markers(&update)[0].2, MAX_INSTANCE_SERIES as u32 + 4, "one marker counts them all");
        assert_eq!(markers(&update)[0].1.len(), MARKER_IDS);
        // A stream that is up to date gets only what is new.
        assert!(history.since("wide", &mut cursor).samples.is_empty());
        tokio::time::advance(SAMPLE_INTERVAL).await;
        history.sample();
        assert_eq!(history.since("wide", &mut cursor).samples.len(), 1);

        for n in 0..HISTORY_SAMPLES {
            let ring_markers = {
                let mut rings = history.lock();
                let ring = rings.get_mut("wide").unwrap();
                ring.marker(n as u64, "left", None, &["x".into()]);
                ring.markers.len()
            };
            assert!(ring_markers <= MAX_MARKERS);
        }

        // More services than rings: the first ones registered are sampled, the rest are not.
        for n in 0..MAX_SAMPLED_SERVICES + 4 {
            announce(&lease, vec![spec(&format!("s{n:02}"), "a", "")]).await;
        }
        let names: Vec<Arc<str>> = (0..MAX_SAMPLED_SERVICES + 4).map(|n| format!("s{n:02}").into()).collect();
        history.published(&names);
        history.sample();
        assert_eq!(history.lock().len(), MAX_SAMPLED_SERVICES);
        assert!(!everything(&history, "s19").kept);

        // Opening a service on a dashboard takes the ring least recently watched, unless every
        // ring is watched.
        let watched: Vec<Watching> =
            (0..MAX_SAMPLED_SERVICES).filter_map(|n| history.watch(&format!("s{n:02}"))).collect();
        assert_eq!(watched.len(), MAX_SAMPLED_SERVICES);
        assert!(history.watch("s19").is_none(), "every ring is watched");
        assert!(!everything(&history, "wide").kept, "an unwatched ring was given away");
        drop(watched);
        let s19 = history.watch("s19").expect("rings are free again");
        assert!(everything(&history, "s19").kept);
        assert_eq!(history.lock().len(), MAX_SAMPLED_SERVICES);
        assert!(history.watch("nobody").is_none(), "a service never registered gets no ring");
        drop(s19);
    }

    #[test]
    fn a_sample_stays_small() {
        // The worst case the module docs state: a full sample under 1 KB on 64-bit targets.
        let point = std::mem::size_of::<Point>();
        let version = std::mem::size_of::<VersionPicks>();
        let sample = std::mem::size_of::<Sample>();
        let full = sample + MAX_INSTANCE_SERIES * point + MAX_VERSION_SERIES * version;
        assert!(full < 1024, "{full} bytes");
        assert!(full * HISTORY_SAMPLES * MAX_SAMPLED_SERVICES < 5 << 20);
    }
}
