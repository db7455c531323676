//! Outlier ejection: every rule skips the instances the fleet has seen failing.
//!
//! An instance is *ejected* while its breaker is open (successive failures, Ribbon's breaker,
//! see [`super::BreakerConfig`]) or while its failure rate over the statistics window was too
//! high: at least `failure_rate_min_calls` calls in the window and at least
//! `failure_rate_percent` of them failed, as Envoy's failure-percentage ejection counts it. A
//! rate ejection lasts the breaker's base blackout and is renewed by the next failure while the
//! rate stays high; a success closes the breaker but not a rate ejection.
//!
//! Envoy's and gRPC's outlier detection wrap every policy; so does rota's: the pick path adds
//! the ejected members of the subset to the pick's `exclude` (a skip, not a smaller subset, so a
//! consistent-hash key whose instance is healthy keeps it), and leases leave them out of the
//! eligible list. At most `max_ejected_percent` of a subset (at least one instance) is skipped;
//! when more are ejected, or every remaining one is, rota skips none — the *panic mode* of
//! Envoy's load balancers: better to spread load over instances that may fail than to pile it
//! on the few left — and the response's `fallback` says so.
//!
//! What a pick reads is one per-service list of the ejected ids with the end of their
//! ejection ([`ServiceEjections`]), pushed by the statistics store when an instance's ejection
//! starts, moves or ends. It is empty for a healthy service, so a pick pays one atomic load;
//! otherwise one binary search per ejected instance.

use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use tokio::time::Instant;

use crate::registry::Instance;

/// A service's outlier-ejection settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EjectionConfig {
    /// Off: only the rules that read breakers themselves (`availability_filtering`,
    /// `best_available`, `retry`, ...) look at them, and failure rates eject nothing.
    pub enabled: bool,
    /// The most of a subset skipped at once, in percent; one instance may always be.
    pub max_ejected_percent: u32,
    /// Failure rate that ejects, in percent; above 100 turns rate ejection off.
    pub failure_rate_percent: u32,
    /// Calls the statistics window must hold before its rate counts.
    pub failure_rate_min_calls: u32,
}

impl Default for EjectionConfig {
    fn default() -> Self {
        Self { enabled: true, max_ejected_percent: 50, failure_rate_percent: 50, failure_rate_min_calls: 20 }
    }
}

impl EjectionConfig {
    /// Whether `failures` of `calls` in the window eject the instance.
    pub fn rate_ejects(&self, calls: u64, failures: u64) -> bool {
        self.enabled
            && self.failure_rate_percent <= 100
            && calls >= u64::from(self.failure_rate_min_calls)
            && failures * 100 >= u64::from(self.failure_rate_percent) * calls
    }

    /// How many of `members` instances may be skipped at once.
    pub fn cap(&self, members: usize) -> usize {
        (members * self.max_ejected_percent as usize / 100).max(1)
    }
}

/// Positions on the stack for up to 8 entries: no allocation for the common pick.
pub type Positions = smallvec::SmallVec<[usize; 8]>;

/// The ejected instances of one service and when each ejection ends, by id.
#[derive(Debug, Default)]
pub struct ServiceEjections {
    list: ArcSwap<Vec<(Arc<str>, Instant)>>,
    /// Serialises writers (rare: an ejection starting, moving or ending).
    write: Mutex<()>,
}

impl ServiceEjections {
    /// Records that `id` is ejected until `until` (`None`: it is not).
    pub fn set(&self, id: &Arc<str>, until: Option<Instant>) {
        let _writing = self.write.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let current = self.list.load();
        let found = current.iter().position(|(known, _)| known == id);
        if found.is_none() && until.is_none() {
            return;
        }
        let now = Instant::now();
        let mut next: Vec<(Arc<str>, Instant)> =
            current.iter().filter(|(known, end)| known != id && *end > now).cloned().collect();
        if let Some(until) = until.filter(|until| *until > now) {
            next.push((id.clone(), until));
        }
        self.list.store(Arc::new(next));
    }

    /// Drops ejections that are over (the list is read per pick; ended entries only cost time).
    pub fn prune(&self) {
        let now = Instant::now();
        if self.list.load().iter().all(|(_, end)| *end > now) {
            return;
        }
        let _writing = self.write.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let next: Vec<_> = self.list.load().iter().filter(|(_, end)| *end > now).cloned().collect();
        self.list.store(Arc::new(next));
    }

    /// Whether nothing of the service is ejected (or was, recently).
    pub fn is_empty(&self) -> bool {
        self.list.load().is_empty()
    }

    /// The positions among `members` (sorted by id) of the instances ejected at `now`, sorted.
    pub fn positions(&self, members: &[Arc<Instance>], now: Instant) -> Positions {
        let list = self.list.load();
        if list.is_empty() {
            return Positions::new();
        }
        let mut positions: Positions = list
            .iter()
            .filter(|(_, end)| *end > now)
            .filter_map(|(id, _)| members.binary_search_by(|i| i.id.cmp(id)).ok())
            .collect();
        positions.sort_unstable();
        positions
    }

    /// When the first ejection still running at `now` ends.
    pub fn next_end(&self, now: Instant) -> Option<Instant> {
        self.list.load().iter().map(|(_, end)| *end).filter(|end| *end > now).min()
    }

    /// Whether `id` is ejected at `now`.
    pub fn contains(&self, id: &str, now: Instant) -> bool {
        self.list.load().iter().any(|(known, end)| &**known == id && *end > now)
    }
}

/// What ejection does to one selection: the positions to skip besides `excluded`, or why none
/// are skipped although some are ejected.
#[derive(Debug, PartialEq, Eq)]
pub enum Skip {
    /// Skip these (sorted, none of them in `excluded`).
    Ejected(Positions),
    /// Panic mode: `ejected` of `members` are ejected, more than may be skipped.
    Panic { ejected: usize, members: usize },
}

impl EjectionConfig {
    /// Which of the `members.len()` candidates to skip, given the positions already excluded
    /// (sorted) and the ejected ones.
    pub fn skip(&self, members: usize, excluded: &[usize], ejected: Positions) -> Skip {
        let mut ejected = ejected;
        ejected.retain(|p| excluded.binary_search(p).is_err());
        if ejected.is_empty() {
            return Skip::Ejected(ejected);
        }
        let remaining = members - excluded.len();
        if ejected.len() > self.cap(members) || ejected.len() >= remaining {
            return Skip::Panic { ejected: ejected.len(), members };
        }
        Skip::Ejected(ejected)
    }
}

impl Skip {
    /// The note a response carries for it.
    pub fn note(&self, max_percent: u32) -> Option<String> {
        match self {
            Skip::Ejected(_) => None,
            Skip::Panic { ejected, members } => Some(format!(
                "{ejected} of {members} instances are ejected, more than may be skipped \
                 (max_ejected_percent {max_percent}, at least one); picked ignoring ejection"
            )),
        }
    }
}

/// `a` and `b` (each sorted, without duplicates) merged, sorted, without duplicates.
pub fn merge(a: &[usize], b: &[usize]) -> Positions {
    let mut merged: Positions = a.iter().chain(b).copied().collect();
    merged.sort_unstable();
    merged.dedup();
    merged
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::rules::testing::instances;

    #[test]
    fn the_rate_ejects_from_its_minimum_count() {
        let config = EjectionConfig::default();
        assert!(!config.rate_ejects(19, 19), "too few calls");
        assert!(config.rate_ejects(20, 10));
        assert!(!config.rate_ejects(20, 9));
        assert!(!EjectionConfig { failure_rate_percent: 101, ..config }.rate_ejects(100, 100));
        assert!(!EjectionConfig { enabled: false, ..config }.rate_ejects(100, 100));
    }

    #[test]
    fn the_cap_lets_one_instance_go_and_panics_beyond_it() {
        let config = EjectionConfig::default();
        assert_eq!((config.cap(1), config.cap(3), config.cap(10)), (1, 1, 5));
        let positions = |p: &[usize]| Positions::from_slice(p);
        assert_eq!(config.skip(3, &[], positions(&[1])), Skip::Ejected(positions(&[1])));
        assert_eq!(config.skip(3, &[], positions(&[0, 2])), Skip::Panic { ejected: 2, members: 3 });
        // An excluded instance is not counted twice, and skipping it is the caller's business.
        assert_eq!(config.skip(3, &[1], positions(&[1])), Skip::Ejected(positions(&[])));
        // The last instance left is never skipped.
        assert_eq!(config.skip(3, &[0, 1], positions(&[2])), Skip::Panic { ejected: 1, members: 3 });
        assert!(config.skip(3, &[], positions(&[0, 2])).note(50).unwrap().contains("2 of 3 instances"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_service_lists_its_ejected_instances_until_their_end() {
        let members = instances(4);
        let ejections = ServiceEjections::default();
        let now = Instant::now();
        assert!(ejections.positions(&members, now).is_empty());
        ejections.set(&members[2].id, Some(now + Duration::from_secs(10)));
        ejections.set(&members[0].id, Some(now + Duration::from_secs(5)));
        ejections.set(&members[3].id, None);
        assert_eq!(ejections.positions(&members, now).as_slice(), [0, 2]);
        tokio::time::advance(Duration::from_secs(6)).await;
        assert_eq!(ejections.positions(&members, Instant::now()).as_slice(), [2]);
        ejections.prune();
        assert_eq!(ejections.list.load().len(), 1);
        ejections.set(&members[2].id, None);
        assert!(ejections.is_empty());
    }
}
