//! Long-lived streams — `Register`, `Watch`, `PickStream` — open at once, across every
//! connection. Each holds a task, buffers and (for registrations) a lease, so their number is
//! bounded like connections are: past the cap a new stream is refused with
//! `RESOURCE_EXHAUSTED` at once instead of costing memory without bound.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Default cap on streams open at once.
pub const DEFAULT_MAX_OPEN_STREAMS: usize = 10_000;

/// The cap was reached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "rota already holds {open} open streams (Register, Watch, PickStream); the limit is {limit} (server.max_open_streams)"
)]
pub struct TooManyStreams {
    pub open: usize,
    pub limit: usize,
}

#[derive(Debug)]
pub struct OpenStreams {
    limit: usize,
    open: AtomicUsize,
    refused: AtomicU64,
}

/// One open stream; dropping it frees its place.
#[derive(Debug)]
pub struct StreamSlot(Arc<OpenStreams>);

impl OpenStreams {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self { limit, open: AtomicUsize::new(0), refused: AtomicU64::new(0) })
    }

    pub fn acquire(self: &Arc<Self>) -> Result<StreamSlot, TooManyStreams> {
        let taken =
            self.open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| (open < self.limit).then_some(open + 1));
        match taken {
            Ok(_) => Ok(StreamSlot(self.clone())),
            Err(open) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                Err(TooManyStreams { open, limit: self.limit })
            }
        }
    }

    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Streams refused at the cap so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

impl Drop for StreamSlot {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_exact_and_slots_come_back() {
        let streams = OpenStreams::new(2);
        let a = streams.acquire().unwrap();
        let _b = streams.acquire().unwrap();
        let refused = streams.acquire().unwrap_err();
        assert_eq!(refused, TooManyStreams { open: 2, limit: 2 });
        assert_eq!(streams.refused(), 1);
        drop(a);
        assert_eq!(streams.open(), 1);
        assert!(streams.acquire().is_ok());
    }
}
