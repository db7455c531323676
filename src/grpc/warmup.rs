//! Start-up warm-up: for a while after rota starts, a service it has not seen yet is "not known
//! yet" rather than "unknown", and a service whose instances are still coming back is held
//! until they have.
//!
//! A restarted rota answers before its providers have re-registered (their reconnect backoff can
//! reach several seconds). Answering `NOT_FOUND` then would be a hard error for consumers whose
//! service is merely on its way back, and a `Watch` would open with an empty snapshot that wipes
//! the list they keep for falling back locally. Answering from the first instance back would
//! send it every pick until the others return. So, during the warm-up (by default the heartbeat
//! timeout: by then every provider that was connected before the restart has had a full
//! heartbeat period to come back), rota answers `UNAVAILABLE` with `rota-error: warming_up` —
//! which clients treat like "rota unreachable", picking from the list they kept —
//!
//! - to a pick, lease or listing of a service it has not seen: its snapshot's epoch is zero (a
//!   service only watched so far sits at epoch 0, empty);
//! - to a lease of a service whose instances are still arriving: the *settle* period (by
//!   default a fifth of the warm-up, at most 3 s) has not yet passed with no instance of it
//!   becoming UP, counted from the first instance back ([`ServiceSnapshot::arrivals_settled`]).
//!   Leases carry the channels' traffic, and a channel keeps its last list and rotates over it
//!   meanwhile. A unary pick or a listing is answered at once: its caller may have no list to
//!   fall back on. Once settled, a service stays served: an instance arriving later joins it as
//!   usual.
//!
//! A `Watch` sends its first snapshot only once the service is seen and settled, or the warm-up
//! has ended; the xDS service holds its first answer back the same way.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::balancer::PickError;
use crate::registry::{Registry, ServiceSnapshot};

/// The default settle period: a fifth of the warm-up, at most 3 s (rota's own clients retry a
/// registration within a few seconds of rota coming back; longer warm-ups are for fleets slow
/// to come back at all, and a hold costs the consumers that have no list to fall back on).
pub fn default_settle(warmup: Duration) -> Duration {
    (warmup / 5).min(Duration::from_secs(3))
}

/// When the warm-up of one server ends, and how long a service's arrivals must pause.
#[derive(Debug, Clone, Copy)]
pub struct Warmup {
    ends: Instant,
    length: Duration,
    settle: Duration,
}

/// A pick, lease or listing refused because rota has just started and the service is not back
/// yet; see [`status`](super::status) for its `Status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmingUp {
    pub service: String,
    pub warmup_ms: u64,
    /// `Some(settle period)` when the service has been seen but its instances are still
    /// arriving; `None` when it has not been seen.
    pub settling_ms: Option<u64>,
}

impl fmt::Display for WarmingUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.settling_ms {
            None => write!(
                f,
                "rota started less than {} ms ago and has not seen service {:?} yet; providers may still be re-registering",
                self.warmup_ms, self.service
            ),
            Some(settle) => write!(
                f,
                "rota started less than {} ms ago and instances of service {:?} are still re-registering; it is served once none has arrived for {} ms",
                self.warmup_ms, self.service, settle
            ),
        }
    }
}

impl std::error::Error for WarmingUp {}

/// No warm-up at all.
impl Default for Warmup {
    fn default() -> Self {
        Self::starting_now(Duration::ZERO)
    }
}

/// Why a pick, lease or listing of one service failed: as the balancer said, or because the
/// warm-up holds the service back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    Pick(PickError),
    WarmingUp(WarmingUp),
}

impl Warmup {
    /// A warm-up of `length` from now, with the default settle period; zero means none.
    pub fn starting_now(length: Duration) -> Self {
        Self { ends: Instant::now() + length, length, settle: default_settle(length) }
    }

    /// The same warm-up with a settle period of `settle` (zero: a seen service is served at once).
    pub fn with_settle(self, settle: Duration) -> Self {
        Self { settle, ..self }
    }

    /// How long a seen service's arrivals must pause before it is served.
    pub fn settle(&self) -> Duration {
        self.settle
    }

    pub fn is_active(&self) -> bool {
        Instant::now() < self.ends
    }

    fn length_ms(&self) -> u64 {
        self.length.as_millis() as u64
    }

    /// Until when the warm-up holds a service with this snapshot back (`None`: it does not, or
    /// only until it is seen), as far as its instances tell.
    fn held_until(&self, snapshot: &ServiceSnapshot) -> Option<Instant> {
        snapshot.settling_until(self.settle, self.ends)
    }

    /// Why the warm-up holds `service` back now, if it does: it is on, and the service has
    /// never had an instance since start or its instances are still arriving.
    pub fn holding(&self, registry: &Registry, service: &str) -> Option<WarmingUp> {
        if !self.is_active() {
            return None;
        }
        let settling = match registry.service(service) {
            Some(snapshot) if snapshot.epoch > 0 => {
                self.held_until(&snapshot)?;
                Some(self.settle.as_millis() as u64)
            }
            _ => None,
        };
        Some(WarmingUp { service: service.to_owned(), warmup_ms: self.length_ms(), settling_ms: settling })
    }

    /// Why the warm-up holds back `service`, a service it has seen, now: its instances are
    /// still arriving. `None` for a service not seen yet, which a pick finds unknown or empty
    /// and [`Warmup::refine`] then turns into [`WarmingUp`].
    pub fn settling(&self, registry: &Registry, service: &str) -> Option<WarmingUp> {
        self.holding(registry, service).filter(|held| held.settling_ms.is_some())
    }

    /// Why the warm-up hides `service` now, if it does: it has not been seen since start.
    pub fn unseen(&self, registry: &Registry, service: &str) -> Option<WarmingUp> {
        self.holding(registry, service).filter(|held| held.settling_ms.is_none())
    }

    /// Turns "unknown service" (or "nothing eligible" in a service held back) into
    /// [`WarmingUp`] while the warm-up lasts; other errors pass unchanged.
    pub fn refine(&self, registry: &Registry, service: &str, error: PickError) -> Refusal {
        match error {
            PickError::UnknownService(_) | PickError::Unavailable(_) => match self.holding(registry, service) {
                Some(warming_up) => Refusal::WarmingUp(warming_up),
                None => Refusal::Pick(error),
            },
            other => Refusal::Pick(other),
        }
    }

    /// Waits, for a `Watch`, until the followed service is no longer held back or the warm-up
    /// has ended, so the first snapshot sent is neither the empty one of a service that is
    /// merely not back yet nor the first instance of several coming back. Returns at once when
    /// neither applies.
    pub async fn until_seen(&self, snapshots: &mut watch::Receiver<Arc<ServiceSnapshot>>) {
        let ends = tokio::time::sleep_until(self.ends);
        tokio::pin!(ends);
        loop {
            if !self.is_active() {
                return;
            }
            let held_until = {
                let snapshot = snapshots.borrow();
                if snapshot.epoch > 0 {
                    match self.held_until(&snapshot) {
                        None => return,
                        Some(at) => Some(at),
                    }
                } else {
                    None
                }
            };
            let settled = tokio::time::sleep_until(held_until.unwrap_or(self.ends));
            tokio::select! {
                changed = snapshots.changed() => if changed.is_err() { return },
                () = &mut ends => return,
                () = settled => {}
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
        let warmup = Warmup::starting_now(Duration::from_secs(15)).with_settle(Duration::ZERO);
        let lease = registry.open_lease();
        let outcome = lease.announce(vec![spec("known", "a")]).await.expect("registry open");
        assert_eq!(outcome.accepted.len(), 1);

        let unknown = PickError::UnknownService("unseen".into());
        // The message names the warm-up's whole length, not what is left of it.
        tokio::time::advance(Duration::from_secs(1)).await;
        let refined = warmup.refine(&registry, "unseen", unknown.clone());
        let expected = WarmingUp { service: "unseen".into(), warmup_ms: 15_000, settling_ms: None };
        assert_eq!(refined, Refusal::WarmingUp(expected));
        let nothing = PickError::Unavailable("no eligible instance".into());
        assert_eq!(warmup.refine(&registry, "known", nothing.clone()), Refusal::Pick(nothing));

        tokio::time::advance(Duration::from_secs(14)).await;
        assert_eq!(warmup.refine(&registry, "unseen", unknown.clone()), Refusal::Pick(unknown));
    }

    /// Providers come back one by one after a restart: the service is held until none has
    /// arrived for the settle period, then served to all at once, and never held again.
    #[tokio::test(start_paused = true)]
    async fn a_seen_service_is_held_until_its_instances_stop_arriving() {
        let registry = Registry::spawn(RegistryConfig::default());
        let warmup = Warmup::starting_now(Duration::from_secs(15));
        assert_eq!(warmup.settle(), Duration::from_secs(3), "a fifth of the warm-up");
        let settling = WarmingUp { service: "echo".into(), warmup_ms: 15_000, settling_ms: Some(3_000) };
        let first = registry.open_lease();
        first.announce(vec![spec("echo", "a")]).await.expect("registry open");
        assert_eq!(warmup.holding(&registry, "echo"), Some(settling.clone()));
        tokio::time::advance(Duration::from_millis(2_900)).await;
        let second = registry.open_lease();
        second.announce(vec![spec("echo", "b")]).await.expect("registry open");
        tokio::time::advance(Duration::from_millis(2_999)).await;
        assert_eq!(warmup.holding(&registry, "echo"), Some(settling.clone()), "b arrived less than 3 s ago");
        let nothing = PickError::Unavailable("no eligible instance".into());
        assert_eq!(warmup.refine(&registry, "echo", nothing.clone()), Refusal::WarmingUp(settling.clone()));
        assert!(settling.to_string().contains("none has arrived for 3000 ms"), "{settling}");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(warmup.holding(&registry, "echo"), None, "3 s without an arrival: served");

        // A later arrival joins a service already served: it is not held again.
        let third = registry.open_lease();
        third.announce(vec![spec("echo", "c")]).await.expect("registry open");
        assert_eq!(warmup.holding(&registry, "echo"), None);
        assert_eq!(warmup.refine(&registry, "echo", nothing.clone()), Refusal::Pick(nothing));
    }

    /// Arrivals that never pause are held no longer than the warm-up; a settle of zero holds
    /// nothing seen.
    #[tokio::test(start_paused = true)]
    async fn the_hold_ends_with_the_warmup_and_a_zero_settle_holds_nothing_seen() {
        let registry = Registry::spawn(RegistryConfig::default());
        let warmup = Warmup::starting_now(Duration::from_secs(15));
        let mut leases = Vec::new();
        for n in 0..16 {
            let lease = registry.open_lease();
            lease.announce(vec![spec("busy", &format!("i{n:02}"))]).await.expect("registry open");
            leases.push(lease);
            assert!(warmup.holding(&registry, "busy").is_some(), "at {n} s");
            tokio::time::advance(Duration::from_millis(999)).await;
        }
        tokio::time::advance(Duration::from_millis(16)).await;
        assert!(!warmup.is_active());
        assert_eq!(warmup.holding(&registry, "busy"), None);

        let eager = Warmup::starting_now(Duration::from_secs(15)).with_settle(Duration::ZERO);
        let lease = registry.open_lease();
        lease.announce(vec![spec("fresh", "a")]).await.expect("registry open");
        assert_eq!(eager.holding(&registry, "fresh"), None);
        assert_eq!(eager.holding(&registry, "unseen").map(|w| w.settling_ms), Some(None));
    }

    /// A Watch opened while instances arrive starts with all of them, not the first one back.
    #[tokio::test(start_paused = true)]
    async fn a_watch_waits_for_the_arrivals_to_settle() {
        let registry = Registry::spawn(RegistryConfig::default());
        let warmup = Warmup::starting_now(Duration::from_secs(15));
        let mut snapshots = registry.subscribe("echo").await.expect("registry open");
        let waiting = tokio::spawn(async move {
            let started = Instant::now();
            warmup.until_seen(&mut snapshots).await;
            let ids = snapshots.borrow().instances.iter().map(|i| i.id.to_string()).collect::<Vec<_>>();
            (started.elapsed(), ids)
        });
        let a = registry.open_lease();
        a.announce(vec![spec("echo", "a")]).await.expect("registry open");
        tokio::time::advance(Duration::from_secs(2)).await;
        let b = registry.open_lease();
        b.announce(vec![spec("echo", "b")]).await.expect("registry open");
        let (waited, ids) = tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("released").unwrap();
        assert_eq!(ids, vec!["a".to_owned(), "b".to_owned()]);
        assert_eq!(waited, Duration::from_secs(5), "3 s after b arrived");
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_waits_for_the_service_to_appear() {
        let registry = Registry::spawn(RegistryConfig::default());
        let warmup = Warmup::starting_now(Duration::from_secs(15)).with_settle(Duration::ZERO);
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
