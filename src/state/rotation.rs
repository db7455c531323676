//! The rotation a pick draws its ticket from, as every state backend hands it out.
//!
//! A [`Rotation`] pairs the in-process counter of (service, rule, subset) with, for a backend
//! shared between replicas, its [`RemoteCounter`]; a [`RotationCache`] on each snapshot subset
//! keeps the rotations its picks use, so a pick reaches its counter without a map lookup.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use futures_util::future::BoxFuture;

/// Rotations remembered per snapshot subset (one per rule used on it); past this, picks of
/// further rules on the subset look their counter up.
pub(super) const CACHED_ROTATIONS: usize = 8;

/// A rotation's counter kept outside this process, shared with other replicas.
pub trait RemoteCounter: Send + Sync + fmt::Debug {
    /// Draws `count` consecutive tickets and returns the first.
    fn draw(&self, count: u32) -> BoxFuture<'_, u64>;
}

/// One rotation as picks reach it: its ticket counter, the counter its successful picks are
/// tallied on (operators' count of picks per service and rule), and its remote counter when
/// the backend shares one.
#[derive(Debug, Clone)]
pub struct Rotation {
    rule: Arc<str>,
    ticket: Arc<AtomicU64>,
    picked: Arc<AtomicU64>,
    remote: Option<Arc<dyn RemoteCounter>>,
}

impl Rotation {
    pub fn new(
        rule: Arc<str>,
        ticket: Arc<AtomicU64>,
        picked: Arc<AtomicU64>,
        remote: Option<Arc<dyn RemoteCounter>>,
    ) -> Self {
        Self { rule, ticket, picked, remote }
    }

    /// The in-process counter.
    pub fn ticket(&self) -> &AtomicU64 {
        &self.ticket
    }

    /// The counter shared with other replicas, if the backend has one.
    pub fn remote(&self) -> Option<&Arc<dyn RemoteCounter>> {
        self.remote.as_ref()
    }

    /// Counts one successful pick from this rotation.
    pub fn tally(&self) {
        self.picked.fetch_add(1, Ordering::Relaxed);
    }
}

/// Rotations cached on a snapshot subset, so repeated picks reach their counters with a short
/// scan of set-once slots: no hashing, no lock, no reference count touched. The counters
/// themselves live in the backend and outlive the snapshot.
#[derive(Debug, Default)]
pub struct RotationCache {
    slots: [OnceLock<Rotation>; CACHED_ROTATIONS],
}

impl RotationCache {
    pub fn find(&self, rule: &str) -> Option<&Rotation> {
        for slot in &self.slots {
            match slot.get() {
                Some(rotation) if *rotation.rule == *rule => return Some(rotation),
                Some(_) => {}
                None => return None,
            }
        }
        None
    }

    /// Puts `rotation` in the first free slot (or finds it there, set by a concurrent pick);
    /// `None` when every slot holds another rule.
    pub fn remember(&self, rotation: &Rotation) -> Option<&Rotation> {
        self.slots.iter().map(|slot| slot.get_or_init(|| rotation.clone())).find(|r| *r.rule == *rotation.rule)
    }
}
