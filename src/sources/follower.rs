//! The task that follows one source: read it, plan, apply through the source's lease, report.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{info, warn};

use super::listing::{Held, Holding, Listing, next_release, plan, release};
use super::{Follow, SourceSpec, SourceStatus};
use crate::registry::{InstanceRecord, InstanceRef, Lease, RegistryClosed};

/// The first wait after a failure, doubled up to [`MAX_BACKOFF`].
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Refusals logged one by one per listing; the rest are counted.
const LOGGED_REFUSALS: usize = 8;

/// Follows `spec` into `lease` until the registry stops (or the task is aborted, which drops
/// the lease and with it the source's instances).
///
/// While a read is awaited, a held-back removal whose `protect_for` runs out is applied then,
/// not at the next listing: a source that says nothing more (an etcd watch is silent while
/// nothing under its prefix changes) does not keep a removal held for ever. While the source is
/// failing, nothing is released: its next good read decides.
pub async fn run(spec: Arc<SourceSpec>, mut follow: impl Follow, lease: Lease, status: Arc<SourceStatus>) {
    let mut mirror = Mirror::new(lease, spec.clone());
    let mut backoff = FIRST_BACKOFF;
    let mut up = false;
    info!(source = %spec.name, url = %spec.url, "following source");
    loop {
        let read = {
            let next = follow.next();
            tokio::pin!(next);
            loop {
                let due = if up { mirror.next_release() } else { None };
                tokio::select! {
                    read = &mut next => break read,
                    () = tokio::time::sleep_until(due.unwrap_or_else(Instant::now)), if due.is_some() => {
                        match mirror.release(Instant::now()).await {
                            Ok(report) => status.released(report),
                            Err(RegistryClosed) => return,
                        }
                    }
                }
            }
        };
        match read {
            Ok(listing) => {
                backoff = FIRST_BACKOFF;
                up = true;
                match mirror.apply(listing, Instant::now()).await {
                    Ok(report) => status.synced(report),
                    Err(RegistryClosed) => return,
                }
            }
            Err(error) => {
                up = false;
                warn!(source = %spec.name, %error, retry_in = ?backoff, "source failed; keeping its last listing");
                status.failed(error.to_string());
                follow.reset();
                // Jittered, so replicas that lost a source together do not come back in step.
                let wait = backoff.mul_f64(0.5 + fastrand::f64() * 0.5);
                tokio::time::sleep(wait).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// What one applied listing left, for the status board.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Instances rota holds of the source.
    pub instances: usize,
    /// Entries of this listing rota refused (malformed, invalid, over the limit).
    pub refused: usize,
    /// Services whose removals are held back.
    pub held_back: Vec<String>,
}

/// The source's instances as rota's table holds them.
pub struct Mirror {
    lease: Lease,
    spec: Arc<SourceSpec>,
    held: Held,
    /// Records rota refused, kept until the source changes or drops them.
    refused: HashMap<(String, String), InstanceRecord>,
    holding: Holding,
    /// Entries of the latest listing refused before they reached the lease (malformed, or
    /// over `max_instances`).
    dropped: usize,
    /// The malformed entries of the last listing, each logged once when it first appeared.
    logged: HashSet<String>,
    /// How many instances were left out for want of room when that was last logged.
    over_limit_logged: usize,
}

impl Mirror {
    pub fn new(lease: Lease, spec: Arc<SourceSpec>) -> Self {
        Self {
            lease,
            spec,
            held: Held::new(),
            refused: HashMap::new(),
            holding: Holding::new(),
            dropped: 0,
            logged: HashSet::new(),
            over_limit_logged: 0,
        }
    }

    /// When the earliest held-back removal is due, if any is held back.
    pub fn next_release(&self) -> Option<Instant> {
        next_release(&self.spec, &self.holding)
    }

    /// Applies the held-back removals whose time is up at `now`, as the latest listing asked.
    pub async fn release(&mut self, now: Instant) -> Result<Report, RegistryClosed> {
        let plan = release(&self.spec, &self.held, &mut self.holding, now);
        for service in &plan.released {
            warn!(source = %self.spec.name, %service, protect_for = ?self.spec.protect_for, "held-back removal applied: the source's latest listing asked for it protect_for ago");
        }
        self.withdraw(&plan.withdraw).await?;
        Ok(self.report(plan.held_back))
    }

    async fn withdraw(&mut self, withdraw: &[(String, String)]) -> Result<(), RegistryClosed> {
        if withdraw.is_empty() {
            return Ok(());
        }
        let refs =
            withdraw.iter().map(|(service, id)| InstanceRef { service: service.clone(), id: id.clone() }).collect();
        self.lease.withdraw(refs).await?;
        for (service, id) in withdraw {
            if let Some(instances) = self.held.get_mut(service) {
                instances.remove(id);
                if instances.is_empty() {
                    self.held.remove(service);
                }
            }
        }
        Ok(())
    }

    fn report(&self, held_back: Vec<(String, usize, usize)>) -> Report {
        let instances = self.held.values().map(|i| i.len()).sum();
        // Refused now, or before and unchanged since.
        let refused = self.dropped + self.refused.len();
        let held_back = held_back.into_iter().map(|(service, _, _)| service).collect();
        Report { instances, refused, held_back }
    }

    /// Makes rota's table say what `listing` says (bar held-back removals).
    pub async fn apply(&mut self, mut listing: Listing, now: Instant) -> Result<Report, RegistryClosed> {
        let malformed = listing.malformed.len();
        let source_over_limit = listing.over_limit;
        self.log_malformed(std::mem::take(&mut listing.malformed));
        let spec = self.spec.clone();
        let name = &spec.name;
        let listed: HashSet<(String, String)> = listing
            .services
            .iter()
            .flat_map(|(service, instances)| {
                instances.iter().map(move |i| (service.clone(), format!("{name}:{}", i.id)))
            })
            .collect();
        self.refused.retain(|key, _| listed.contains(key));
        let plan = plan(&self.spec, &self.held, &self.refused, listing, &mut self.holding, now);
        let over_limit = plan.over_limit + source_over_limit;
        if over_limit != self.over_limit_logged {
            if over_limit > 0 {
                warn!(source = %name, left_out = over_limit, limit = self.spec.max_instances, "source lists more instances than rota takes of it (max_instances, max_bytes)");
            }
            self.over_limit_logged = over_limit;
        }
        for (service, removing, of) in &plan.held_back {
            warn!(source = %name, %service, removing, of, protect_for = ?self.spec.protect_for, "source would remove too much of a service at once; held back");
        }
        for service in &plan.released {
            warn!(source = %name, %service, "held-back removal applied: the source still asks for it after protect_for");
        }
        self.withdraw(&plan.withdraw).await?;
        if !plan.announce.is_empty() {
            let mut sent: HashMap<(String, String), InstanceRecord> = HashMap::with_capacity(plan.announce.len());
            let specs = plan
                .announce
                .into_iter()
                .map(|(service, instance)| {
                    sent.insert((service.clone(), instance.id.clone()), instance.clone());
                    instance.spec(&service)
                })
                .collect();
            let outcome = self.lease.announce(specs).await?;
            for accepted in outcome.accepted {
                let key = (accepted.service, accepted.id);
                if let Some(instance) = sent.remove(&key) {
                    self.refused.remove(&key);
                    self.held.entry(key.0).or_default().insert(key.1, instance);
                }
            }
            for (i, (instance, why)) in outcome.refused.into_iter().enumerate() {
                if i < LOGGED_REFUSALS {
                    warn!(source = %name, service = %instance.service, id = %instance.id, %why, "source entry refused");
                }
                let key = (instance.service, instance.id);
                // A refused change to a held instance leaves the held one as it was.
                if let Some(record) = sent.remove(&key) {
                    self.refused.insert(key, record);
                }
            }
        }
        self.dropped = malformed + over_limit;
        Ok(self.report(plan.held_back))
    }

    /// Logs each entry of `malformed` that the last listing did not have (at most
    /// [`LOGGED_REFUSALS`] one by one, the rest counted), and remembers them all.
    fn log_malformed(&mut self, malformed: Vec<String>) {
        let name = &self.spec.name;
        let mut new = 0usize;
        for problem in &malformed {
            if !self.logged.contains(problem) {
                if new < LOGGED_REFUSALS {
                    warn!(source = %name, %problem, "source entry refused");
                }
                new += 1;
            }
        }
        if new > LOGGED_REFUSALS {
            warn!(source = %name, more = new - LOGGED_REFUSALS, "source entries refused, not logged one by one");
        }
        self.logged = malformed.into_iter().collect();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use super::*;
    use crate::registry::{InstanceSpec, Registry, RegistryConfig};
    use crate::sources::SourceError;
    use crate::sources::spec::SourceTable;

    fn spec() -> Arc<SourceSpec> {
        Arc::new(SourceTable { url: "eureka+http://127.0.0.1:1/eureka".into(), ..Default::default() }.check().unwrap())
    }

    fn record(id: &str, port: u16) -> InstanceRecord {
        InstanceRecord {
            id: id.into(),
            host: "127.0.0.1".into(),
            port,
            weight: 100,
            status: "UP".into(),
            ..Default::default()
        }
    }

    fn listing(records: Vec<InstanceRecord>) -> Listing {
        Listing { services: [("demo".to_owned(), records)].into(), ..Listing::default() }
    }

    async fn ids(registry: &Registry) -> Vec<(String, Option<String>)> {
        registry
            .subscribe("demo")
            .await
            .unwrap()
            .borrow()
            .instances
            .iter()
            .map(|i| (i.id.to_string(), i.source.as_deref().map(str::to_owned)))
            .collect()
    }

    #[tokio::test]
    async fn a_listing_is_mirrored_marked_with_its_source_and_an_invalid_entry_is_refused_alone() {
        let registry = Registry::spawn(RegistryConfig::default());
        let spec = spec();
        let mut mirror = Mirror::new(registry.open_source_lease(&spec.name, spec.max_instances), spec);
        let report = mirror
            .apply(listing(vec![record("a", 1), record("b", 0), record("bad id", 3)]), Instant::now())
            .await
            .unwrap();
        assert_eq!((report.instances, report.refused), (1, 2));
        assert_eq!(ids(&registry).await, [("eureka:a".to_owned(), Some("eureka".to_owned()))]);
        // The same listing again: nothing is announced, the refusals still count.
        let again = mirror
            .apply(listing(vec![record("a", 1), record("b", 0), record("bad id", 3)]), Instant::now())
            .await
            .unwrap();
        assert_eq!(again, report);
        // Fixed at the source: taken.
        let fixed = mirror.apply(listing(vec![record("a", 1), record("b", 2)]), Instant::now()).await.unwrap();
        assert_eq!((fixed.instances, fixed.refused), (2, 0));
    }

    #[tokio::test]
    async fn a_registration_stream_may_not_announce_an_id_in_a_sources_namespace() {
        let registry = Registry::spawn(RegistryConfig::default());
        let _source = registry.open_source_lease("eureka", 10);
        let stream = registry.open_lease();
        let spec = |id: &str| InstanceSpec {
            id: id.into(),
            service: "demo".into(),
            host: "127.0.0.1".into(),
            port: 1,
            ..Default::default()
        };
        let outcome = stream.announce(vec![spec("eureka:a"), spec("eurekaa")]).await.unwrap();
        assert_eq!(outcome.accepted.len(), 1);
        let (refused, why) = &outcome.refused[0];
        assert_eq!(refused.id, "eureka:a");
        assert!(why.to_string().contains("kept for the instances of source \"eureka\""), "{why}");
    }

    /// Answers from a script, one a second, then waits for ever.
    struct Scripted(VecDeque<Result<Listing, SourceError>>, Arc<std::sync::atomic::AtomicUsize>);

    impl Follow for Scripted {
        async fn next(&mut self) -> Result<Listing, SourceError> {
            tokio::time::sleep(Duration::from_secs(1)).await;
            match self.0.pop_front() {
                Some(answer) => answer,
                None => std::future::pending().await,
            }
        }

        fn reset(&mut self) {
            self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn three() -> Vec<InstanceRecord> {
        vec![record("a", 1), record("b", 2), record("c", 3)]
    }

    /// The source answers three instances, then (a second later) one, then nothing more for
    /// ever, as an etcd watch says nothing while nothing changes: the removal of two of three
    /// is held back, and applied `protect_for` after it came, with no further listing.
    #[tokio::test(start_paused = true)]
    async fn a_held_back_removal_is_applied_at_protect_for_with_no_further_listing() {
        let registry = Registry::spawn(RegistryConfig::default());
        let spec = spec();
        let status = Arc::new(SourceStatus::new(&spec));
        let resets = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let script = VecDeque::from([Ok(listing(three())), Ok(listing(vec![record("a", 1)]))]);
        let lease = registry.open_source_lease(&spec.name, spec.max_instances);
        let t0 = Instant::now();
        let task = tokio::spawn(run(spec.clone(), Scripted(script, resets), lease, status.clone()));
        let mut changes = registry.subscribe("demo").await.unwrap();
        changes.wait_for(|s| s.instances.len() == 3).await.unwrap();
        let removal = t0 + Duration::from_secs(2);
        tokio::time::sleep_until(removal + Duration::from_millis(1)).await;
        assert_eq!(status.view().held_back, ["demo"]);
        tokio::time::sleep_until(removal + spec.protect_for - Duration::from_millis(1)).await;
        assert_eq!(ids(&registry).await.len(), 3, "held back until protect_for");
        let applied = tokio::time::timeout(spec.protect_for, changes.wait_for(|s| s.instances.len() == 1)).await;
        assert!(applied.is_ok_and(|r| r.is_ok()), "not applied without another listing: {:?}", status.view());
        assert_eq!(Instant::now(), removal + spec.protect_for, "applied when protect_for ran out");
        let view = status.view();
        assert!(view.up && view.held_back.is_empty(), "{view:?}");
        assert_eq!((view.reads, view.instances), (2, 1), "no read was needed");
        task.abort();
    }

    /// While the source fails, a held-back removal stays held: the next good read decides.
    #[tokio::test(start_paused = true)]
    async fn a_failing_source_releases_nothing_until_a_read_succeeds() {
        let registry = Registry::spawn(RegistryConfig::default());
        let spec = spec();
        let status = Arc::new(SourceStatus::new(&spec));
        let resets = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut script = VecDeque::from([Ok(listing(three())), Ok(listing(vec![record("a", 1)]))]);
        // Twelve failures take over 100 s, whatever the jitter of the backoff.
        script.extend((0..12).map(|_| Err(SourceError::new("timed out"))));
        script.push_back(Ok(listing(vec![record("a", 1)])));
        let lease = registry.open_source_lease(&spec.name, spec.max_instances);
        let t0 = Instant::now();
        let task = tokio::spawn(run(spec.clone(), Scripted(script, resets), lease, status.clone()));
        tokio::time::sleep_until(t0 + Duration::from_secs(2) + spec.protect_for + Duration::from_secs(1)).await;
        let stale = status.view();
        assert!(!stale.up, "{stale:?}");
        assert_eq!(ids(&registry).await.len(), 3, "nothing released while the source fails");
        let mut changes = registry.subscribe("demo").await.unwrap();
        let bound = Duration::from_secs(600);
        let applied = tokio::time::timeout(bound, changes.wait_for(|s| s.instances.len() == 1)).await;
        assert!(applied.is_ok_and(|r| r.is_ok()), "{:?}", status.view());
        let back = status.view();
        assert!(back.up && back.held_back.is_empty(), "{back:?}");
        assert_eq!(back.reads, 3, "released by the read that succeeded");
        task.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_source_keeps_its_listing_goes_stale_and_recovers() {
        let registry = Registry::spawn(RegistryConfig::default());
        let spec = spec();
        let status = Arc::new(SourceStatus::new(&spec));
        let resets = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let script = VecDeque::from([
            Ok(listing(vec![record("a", 1), record("b", 2)])),
            Err(SourceError::new("timed out")),
            Err(SourceError::new("timed out")),
            Ok(listing(vec![record("a", 1)])),
        ]);
        let lease = registry.open_source_lease(&spec.name, spec.max_instances);
        let task = tokio::spawn(run(spec, Scripted(script, resets.clone()), lease, status.clone()));
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(status.view().up);
        assert_eq!(ids(&registry).await.len(), 2);
        tokio::time::sleep(Duration::from_secs(1)).await;
        let stale = status.view();
        assert!(!stale.up);
        assert_eq!(stale.last_error.as_deref(), Some("timed out"));
        assert_eq!(ids(&registry).await.len(), 2, "a failed read removes nothing");
        // Two failures with backoff in between, then the fourth answer.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let back = status.view();
        assert!(back.up, "{back:?}");
        assert_eq!((back.reads, back.failures, back.instances), (2, 2, 1));
        assert_eq!(resets.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert_eq!(ids(&registry).await.len(), 1);
        // Stopping the task drops the lease, and the source's instances with it.
        task.abort();
        let _ = task.await;
        let mut changes = registry.subscribe("demo").await.unwrap();
        changes.wait_for(|s| s.instances.is_empty()).await.unwrap();
    }
}
