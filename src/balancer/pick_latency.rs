//! How long rota takes to answer a pick, as a histogram: `rota_pick_duration_seconds`.
//!
//! Every `Balancer::pick` (unary Pick, each PickStream pick) is timed from the call to its
//! result, refusals included, and counted in one bucket of [`PICK_BUCKETS`]. The buckets reach
//! down to 5 µs because an in-memory pick takes a few microseconds; the upper ones catch picks
//! that wait for a shared state backend (Redis) or for a table to be built. Recording is a few
//! relaxed atomic additions on counters kept in [`SHARDS`] copies, each thread adding to its
//! own: no lock, no allocation, and no cache line passed between the runtime's workers on
//! every pick. The series carry no label, so the histogram is a fixed 19 series whatever
//! clients send; `rota_picks_total` has the per-service breakdown.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Upper bounds of the pick-duration buckets, in seconds.
pub const PICK_BUCKETS: [f64; 16] = [
    0.000_005, 0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 1.0,
];

/// Copies of the counters: more than the runtime has workers on most machines.
const SHARDS: usize = 8;

/// One copy of the histogram, on cache lines of its own.
#[derive(Default)]
#[repr(align(128))]
struct Shard {
    /// Non-cumulative: one slot per bucket, then one for `+Inf`.
    buckets: [AtomicU64; PICK_BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
}

static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The copy this thread counts in, handed out in turn.
    static SHARD: usize = NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS;
}

/// The pick-duration histogram.
#[derive(Default)]
pub struct PickLatency {
    shards: [Shard; SHARDS],
}

/// The histogram read for exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct PickLatencySnapshot {
    /// Cumulative counts per bucket of [`PICK_BUCKETS`], then the total count (`+Inf`).
    pub cumulative: [u64; PICK_BUCKETS.len() + 1],
    pub sum_seconds: f64,
}

impl PickLatency {
    /// Counts one pick that took `elapsed`.
    pub fn record(&self, elapsed: Duration) {
        let shard = &self.shards[SHARD.with(|shard| *shard)];
        let seconds = elapsed.as_secs_f64();
        let bucket = PICK_BUCKETS.iter().position(|le| seconds <= *le).unwrap_or(PICK_BUCKETS.len());
        shard.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        shard.sum_nanos.fetch_add(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Every copy added up.
    pub fn snapshot(&self) -> PickLatencySnapshot {
        let mut cumulative = [0; PICK_BUCKETS.len() + 1];
        let mut total = 0;
        for (bucket, slot) in cumulative.iter_mut().enumerate() {
            total += self.shards.iter().map(|s| s.buckets[bucket].load(Ordering::Relaxed)).sum::<u64>();
            *slot = total;
        }
        let nanos: u64 = self.shards.iter().map(|s| s.sum_nanos.load(Ordering::Relaxed)).sum();
        PickLatencySnapshot { cumulative, sum_seconds: nanos as f64 / 1e9 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_land_in_the_first_bucket_that_holds_them_and_counts_are_cumulative() {
        let latency = PickLatency::default();
        latency.record(Duration::from_micros(3));
        latency.record(Duration::from_micros(5));
        latency.record(Duration::from_micros(40));
        latency.record(Duration::from_secs(2));
        let snapshot = latency.snapshot();
        // le=0.000005 holds 3 µs and exactly 5 µs; le=0.00005 adds 40 µs; 2 s is past 1 s.
        assert_eq!(snapshot.cumulative[0], 2);
        assert_eq!(snapshot.cumulative[2], 2);
        assert_eq!(snapshot.cumulative[3], 3);
        assert_eq!(snapshot.cumulative[PICK_BUCKETS.len() - 1], 3);
        assert_eq!(snapshot.cumulative[PICK_BUCKETS.len()], 4);
        assert!((snapshot.sum_seconds - 2.000_048).abs() < 1e-9, "{}", snapshot.sum_seconds);
    }

    #[test]
    fn every_thread_counts_into_the_same_histogram() {
        let latency = std::sync::Arc::new(PickLatency::default());
        let threads: Vec<_> = (0..12)
            .map(|_| {
                let latency = latency.clone();
                std::thread::spawn(move || (0..100).for_each(|_| latency.record(Duration::from_micros(200))))
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        let snapshot = latency.snapshot();
        assert_eq!(snapshot.cumulative[4], 0, "200 µs is over 100 µs");
        assert_eq!(snapshot.cumulative[5], 1200);
        assert_eq!(snapshot.cumulative[PICK_BUCKETS.len()], 1200);
    }
}
