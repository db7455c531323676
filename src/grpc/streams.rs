//! Long-lived streams — `Register`, `Watch`, `PickStream` — open at once, across every
//! connection. Each holds a task, buffers and (for registrations) a lease, so their number is
//! bounded like connections are: past the cap a new stream is refused with
//! `RESOURCE_EXHAUSTED` at once instead of costing memory without bound.
//!
//! A fifth of the cap is kept for registrations: consumers' streams (`Watch`, one per service
//! of every `rota:///` channel, and `PickStream`) may take the rest but not that fifth, so a
//! flood of watches cannot stop providers from registering, and with them every consumer's
//! instances.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tokio::sync::mpsc;
use tonic::Status;

use crate::overload::Overload;

/// Default cap on streams open at once.
pub const DEFAULT_MAX_OPEN_STREAMS: usize = 10_000;

/// Which share of the cap a stream may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    /// `Register`: the whole cap.
    Register,
    /// `Watch` and `PickStream`: all but the fifth kept for registrations.
    Consumer,
}

/// The cap was reached.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TooManyStreams {
    #[error(
        "rota already holds {open} open streams (Register, Watch, PickStream); the limit is {limit} (server.max_open_streams)"
    )]
    All { open: usize, limit: usize },
    #[error(
        "rota already holds {open} open streams; Watch and PickStream may take {share} of the {limit} (server.max_open_streams), the rest is kept for registrations"
    )]
    Consumers { open: usize, share: usize, limit: usize },
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

    /// The part of the cap consumers' streams may take: all but a fifth (at least one place).
    pub fn consumer_share(&self) -> usize {
        (self.limit - self.limit / 5).max(1).min(self.limit)
    }

    pub fn acquire(self: &Arc<Self>, kind: StreamKind) -> Result<StreamSlot, TooManyStreams> {
        let cap = match kind {
            StreamKind::Register => self.limit,
            StreamKind::Consumer => self.consumer_share(),
        };
        let taken =
            self.open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| (open < cap).then_some(open + 1));
        match taken {
            Ok(_) => Ok(StreamSlot(self.clone())),
            Err(open) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                Err(if cap == self.limit {
                    TooManyStreams::All { open, limit: self.limit }
                } else {
                    TooManyStreams::Consumers { open, share: cap, limit: self.limit }
                })
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

/// Runs the task of a stream that holds a copy of what it follows (`Watch`, xDS) until it ends
/// by itself, or until memory pressure sheds it: then its client gets `RESOURCE_EXHAUSTED`
/// with the reason ([`crate::overload`]).
pub async fn unless_shed<T>(
    overload: Arc<Overload>,
    tx: mpsc::Sender<Result<T, Status>>,
    task: impl Future<Output = ()>,
) {
    tokio::select! {
        () = task => {}
        reason = overload.shedding() => {
            let _ = tx.send(Err(reason.into())).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_exact_and_slots_come_back() {
        let streams = OpenStreams::new(2);
        let a = streams.acquire(StreamKind::Register).unwrap();
        let _b = streams.acquire(StreamKind::Register).unwrap();
        let refused = streams.acquire(StreamKind::Register).unwrap_err();
        assert_eq!(refused, TooManyStreams::All { open: 2, limit: 2 });
        assert_eq!(streams.refused(), 1);
        drop(a);
        assert_eq!(streams.open(), 1);
        assert!(streams.acquire(StreamKind::Register).is_ok());
    }

    #[test]
    fn consumers_leave_a_fifth_of_the_cap_to_registrations() {
        let streams = OpenStreams::new(10);
        let watches: Vec<_> = (0..8).map(|_| streams.acquire(StreamKind::Consumer).unwrap()).collect();
        let refused = streams.acquire(StreamKind::Consumer).unwrap_err();
        assert_eq!(refused, TooManyStreams::Consumers { open: 8, share: 8, limit: 10 });
        assert_eq!(
            refused.to_string(),
            "rota already holds 8 open streams; Watch and PickStream may take 8 of the 10 (server.max_open_streams), the rest is kept for registrations"
        );
        let _r1 = streams.acquire(StreamKind::Register).unwrap();
        let _r2 = streams.acquire(StreamKind::Register).unwrap();
        assert!(streams.acquire(StreamKind::Register).is_err(), "the whole cap is taken");
        drop(watches);
        assert_eq!(streams.open(), 2);
        // The smallest caps still let a consumer in.
        assert_eq!(OpenStreams::new(1).consumer_share(), 1);
        assert_eq!(OpenStreams::new(4).consumer_share(), 4);
        assert_eq!(OpenStreams::new(5).consumer_share(), 4);
    }
}
