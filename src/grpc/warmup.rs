//! Start-up warm-up: for a while after rota starts, a service it has not seen yet is "not known
//! yet" rather than "unknown".
//!
//! A restarted rota answers before its providers have re-registered (their reconnect backoff can
//! reach several seconds). Answering `NOT_FOUND` then would be a hard error for consumers whose
//! service is merely on its way back, and a `Watch` would open with an empty snapshot that wipes
//! the list they keep for falling back locally. So, during the warm-up (by default the heartbeat
//! timeout: by then every provider that was connected before the restart has had a full
//! heartbeat period to come back), a pick, lease or listing of a service rota has not seen is
//! `UNAVAILABLE` with `rota-error: warming_up` — which clients treat like "rota unreachable" —
//! and a `Watch` of it sends nothing until the service appears or the warm-up ends.
//!
//! "Seen" means the service has had an instance since this server started: its snapshot's epoch
//! is above zero (a service only watched so far sits at epoch 0, empty).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::balancer::PickError;
use crate::registry::{Registry, ServiceSnapshot};

/// When the warm-up of one server ends.
#[derive(Debug, Clone, Copy)]
pub struct Warmup {
    ends: Instant,
    length: Duration,
}

/// A pick, lease or listing refused because rota has just started and has not seen the service
/// yet; see [`status`](super::status) for its `Status`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "rota started less than {warmup_ms} ms ago and has not seen service {service:?} yet; providers may still be re-registering"
)]
pub struct WarmingUp {
    pub service: String,
    pub warmup_ms: u64,
}

/// No warm-up at all.
impl Default for Warmup {
    fn default() -> Self {
        Self::starting_now(Duration::ZERO)
    }
}

/// Why a pick, lease or listing of one service failed: as the balancer said, or because the
/// warm-up hides the service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Pick(PickError),
    WarmingUp(WarmingUp),
}

impl Warmup {
    /// A warm-up of `length` from now; zero means none.
    pub fn starting_now(length: Duration) -> Self {
        Self { ends: Instant::now() + length, length }
    }

    pub fn is_active(&self) -> bool {
        Instant::now() < self.ends
    }

    fn length_ms(&self) -> u64 {
        self.length.as_millis() as u64
    }

    /// Whether `service` counts as not seen yet: the warm-up is on and the service has never had
    /// an instance since start.
    pub fn hides(&self, registry: &Registry, service: &str) -> bool {
        self.is_active() && registry.service(service).is_none_or(|s| s.epoch == 0)
    }

    /// Turns "unknown service" (or "nothing eligible" in a service never seen) into
    /// [`WarmingUp`] while the warm-up lasts; other errors pass unchanged.
    pub fn refine(&self, registry: &Registry, service: &str, error: PickError) -> Refusal {
        match error {
            PickError::UnknownService(_) | PickError::Unavailable(_) if self.hides(registry, service) => {
                Refusal::WarmingUp(WarmingUp { service: service.to_owned(), warmup_ms: self.length_ms() })
            }
            other => Refusal::Pick(other),
        }
    }

    /// Waits, for a `Watch`, until the followed service has been seen or the warm-up has ended,
    /// so the first snapshot sent is never the empty one of a service that is merely not back
    /// yet. Returns at once when neither applies.
    pub async fn until_seen(&self, snapshots: &mut watch::Receiver<Arc<ServiceSnapshot>>) {
        let ends = tokio::time::sleep_until(self.ends);
        tokio::pin!(ends);
        loop {
            if snapshots.borrow().epoch > 0 || !self.is_active() {
                return;
            }
            tokio::select! {
                changed = snapshots.changed() => if changed.is_err() { return },
                () = &mut ends => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{InstanceSpec, RegistryConfig};

    fn spec(service: &str, id: &str) -> InstanceSpec {
        InstanceSpec {
            id: id.into(),
            service: service.into(),
            host: "127.0.0.1".into(),
            port: 9001,
            ..Default::default()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_warmup_ends_after_its_length() {
        let warmup = Warmup::starting_now(Duration::from_secs(15));
        assert!(warmup.is_active());
        tokio::time::advance(Duration::from_millis(14_999)).await;
        assert!(warmup.is_active());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!warmup.is_active());
        assert!(!Warmup::starting_now(Duration::ZERO).is_active());
    }

    #[tokio::test(start_paused = true)]
    async fn unknown_services_are_warming_up_until_the_end_and_known_ones_never() {
        let registry = Registry::spawn(RegistryConfig::default());
        let warmup = Warmup::starting_now(Duration::from_secs(15));
        let lease = registry.open_lease();
        let outcome = lease.announce(vec![spec("known", "a")]).await.expect("registry open");
        assert_eq!(outcome.accepted.len(), 1);

        let unknown = PickError::UnknownService("unseen".into());
        // The message names the warm-up's whole length, not what is left of it.
        tokio::time::advance(Duration::from_secs(1)).await;
        let refined = warmup.refine(&registry, "unseen", unknown.clone());
        let expected = WarmingUp { service: "unseen".into(), warmup_ms: 15_000 };
        assert_eq!(refined, Refusal::WarmingUp(expected));
        let nothing = PickError::Unavailable("no eligible instance".into());
        assert_eq!(warmup.refine(&registry, "known", nothing.clone()), Refusal::Pick(nothing));

        tokio::time::advance(Duration::from_secs(14)).await;
        assert_eq!(warmup.refine(&registry, "unseen", unknown.clone()), Refusal::Pick(unknown));
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_waits_for_the_service_to_appear() {
        let registry = Registry::spawn(RegistryConfig::default());
        let warmup = Warmup::starting_now(Duration::from_secs(15));
        let mut snapshots = registry.subscribe("late").await.expect("registry open");
        let waiting = tokio::spawn(async move {
            warmup.until_seen(&mut snapshots).await;
            snapshots.borrow().instances.iter().map(|i| i.id.to_string()).collect::<Vec<_>>()
        });
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(!waiting.is_finished());
        let lease = registry.open_lease();
        lease.announce(vec![spec("late", "a")]).await.expect("registry open");
        let seen = tokio::time::timeout(Duration::from_secs(1), waiting).await.expect("released").unwrap();
        assert_eq!(seen, vec!["a".to_owned()]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_of_a_service_that_never_comes_waits_until_the_warmup_ends() {
        let registry = Registry::spawn(RegistryConfig::default());
        let warmup = Warmup::starting_now(Duration::from_secs(15));
        let mut snapshots = registry.subscribe("never").await.expect("registry open");
        let started = Instant::now();
        warmup.until_seen(&mut snapshots).await;
        assert_eq!(started.elapsed(), Duration::from_secs(15));
        assert!(snapshots.borrow().instances.is_empty());

        let mut again = registry.subscribe("never").await.expect("registry open");
        let started = Instant::now();
        warmup.until_seen(&mut again).await;
        assert_eq!(started.elapsed(), Duration::ZERO);
    }
}
