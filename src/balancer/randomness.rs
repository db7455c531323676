//! Where rules' random choices come from: one generator per worker thread (seeded once, never
//! per pick, and never shared between threads), or for tests one seeded generator.

use std::cell::RefCell;
use std::sync::Mutex;

thread_local! {
    static WORKER: RefCell<fastrand::Rng> = RefCell::new(fastrand::Rng::new());
}

#[derive(Debug)]
pub(super) enum Randomness {
    PerWorker,
    Seeded(Mutex<fastrand::Rng>),
}

impl Randomness {
    pub fn seeded(seed: u64) -> Self {
        Self::Seeded(Mutex::new(fastrand::Rng::with_seed(seed)))
    }

    /// Runs `f` with the generator (no await may happen inside).
    pub fn with<T>(&self, f: impl FnOnce(&mut fastrand::Rng) -> T) -> T {
        match self {
            Self::PerWorker => WORKER.with(|rng| f(&mut rng.borrow_mut())),
            Self::Seeded(rng) => f(&mut rng.lock().unwrap_or_else(|poisoned| poisoned.into_inner())),
        }
    }
}
