//! How far behind the other replicas this replica's copy of their instances is.
//!
//! Every change entry a replica writes carries the time (its wall clock, in milliseconds since
//! the Unix epoch) at which its registry published the change. The replica that copies it
//! measures the *propagation lag*: its own clock when the copy reached its registry, minus
//! that time. The last lag seen from each other replica is exported as
//! `rota_replica_propagation_lag_seconds{replica}`, and `/readyz` says the replica is
//! degraded while the fleet disagrees for longer than `server.replica_lag_limit`: a change
//! from another replica took longer than the limit to arrive (within the last
//! [`REMEMBERED`]), or this replica has not read the change stream for longer than the limit
//! while its link is up. The lag is as accurate as the replicas' clocks agree (NTP keeps them
//! within milliseconds).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// The default of `server.replica_lag_limit`.
pub const DEFAULT_LAG_LIMIT: Duration = Duration::from_secs(1);
/// Other replicas followed at most (one label each); more are measured but not kept apart.
pub const MAX_REPLICAS_FOLLOWED: usize = 256;
/// How long a lag over the limit keeps the replica degraded.
pub const REMEMBERED: Duration = Duration::from_secs(60);

/// The propagation lag from each other replica.
#[derive(Debug)]
pub struct PropagationLag {
    limit: Duration,
    seen: Mutex<Seen>,
}

#[derive(Debug, Default)]
struct Seen {
    /// The lag of the last change copied from each replica.
    last: HashMap<String, Duration>,
    /// When a change last arrived later than the limit, and from which replica.
    over: Option<(Instant, String, Duration)>,
    /// When the change stream was last read, if it was.
    read_at: Option<Instant>,
}

impl PropagationLag {
    pub fn new(limit: Duration) -> Self {
        Self { limit, seen: Mutex::new(Seen::default()) }
    }

    pub fn limit(&self) -> Duration {
        self.limit
    }

    fn seen(&self) -> std::sync::MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A change `replica` published at `published_ms` (its clock) was copied here now.
    pub fn copied(&self, replica: &str, published_ms: u64) {
        let lag = Duration::from_millis(now_ms().saturating_sub(published_ms));
        let mut seen = self.seen();
        if seen.last.len() < MAX_REPLICAS_FOLLOWED || seen.last.contains_key(replica) {
            seen.last.insert(replica.to_owned(), lag);
        }
        if lag > self.limit {
            seen.over = Some((Instant::now(), replica.to_owned(), lag));
        }
    }

    /// The change stream was read (whatever it held).
    pub fn read(&self) {
        self.seen().read_at = Some(Instant::now());
    }

    /// `replica` is gone: its label goes with it.
    pub fn forget(&self, replica: &str) {
        self.seen().last.remove(replica);
    }

    /// The last lag from each replica, by replica id, sorted.
    pub fn last(&self) -> Vec<(String, Duration)> {
        let mut last: Vec<(String, Duration)> = self.seen().last.iter().map(|(r, d)| (r.clone(), *d)).collect();
        last.sort();
        last
    }

    /// Why the fleet counts as diverged here, if it does; `link_up` says whether the stream
    /// could have been read.
    pub fn diverged(&self, link_up: bool) -> Option<String> {
        let seen = self.seen();
        let now = Instant::now();
        if let Some((at, replica, lag)) = &seen.over
            && now.duration_since(*at) < REMEMBERED
        {
            return Some(format!(
                "a change from replica {replica} arrived {} ms after it was made, over the {} ms limit",
                lag.as_millis(),
                self.limit.as_millis()
            ));
        }
        let unread = seen.read_at.map(|at| now.duration_since(at));
        match unread {
            Some(unread) if link_up && unread > self.limit => Some(format!(
                "the change stream was last read {} ms ago, over the {} ms limit",
                unread.as_millis(),
                self.limit.as_millis()
            )),
            _ => None,
        }
    }
}

/// This machine's wall clock, in milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_late_change_degrades_for_a_minute_and_a_stalled_reader_while_it_stalls() {
        let lag = PropagationLag::new(Duration::from_millis(500));
        lag.read();
        lag.copied("r1", now_ms() - 100);
        assert_eq!(lag.diverged(true), None, "100 ms is inside the limit");
        lag.copied("r2", now_ms() - 900);
        assert!(lag.diverged(true).unwrap().contains("replica r2 arrived"), "900 ms is over it");
        assert_eq!(lag.last().len(), 2);
        tokio::time::advance(REMEMBERED).await;
        lag.read();
        assert_eq!(lag.diverged(true), None, "forgotten after a minute");
        tokio::time::advance(Duration::from_millis(600)).await;
        assert!(lag.diverged(true).unwrap().contains("last read 600 ms ago"));
        assert_eq!(lag.diverged(false), None, "a link that is down says so itself");
        lag.forget("r2");
        assert_eq!(lag.last().into_iter().map(|(r, _)| r).collect::<Vec<_>>(), ["r1"]);
    }
}
