//! Picks in flight on one instance, counted in time buckets so that picks nobody reports
//! expire without a record per pick: a report retires the oldest outstanding pick (only the
//! count matters), and a pick stops counting between the timeout and the timeout plus one
//! bucket after it was made. The buckets are reserved once, so a warm pick never allocates.

use std::collections::VecDeque;

/// Buckets per in-flight timeout.
pub const BUCKETS_PER_TIMEOUT: u64 = 8;
/// Buckets one instance holds at most: a timeout's worth, the current one, and one that
/// straddles the timeout.
pub const IN_FLIGHT_BUCKETS: usize = BUCKETS_PER_TIMEOUT as usize + 2;

#[derive(Debug, Default)]
pub struct InFlight {
    /// (bucket since origin, picks still outstanding from that bucket), oldest first.
    buckets: VecDeque<(u64, u32)>,
    total: u64,
}

impl InFlight {
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Counts one pick made in `bucket`.
    pub fn add(&mut self, bucket: u64) {
        match self.buckets.back_mut() {
            Some((b, count)) if *b == bucket => *count += 1,
            _ => {
                if self.buckets.capacity() < IN_FLIGHT_BUCKETS {
                    self.buckets.reserve_exact(IN_FLIGHT_BUCKETS);
                }
                self.buckets.push_back((bucket, 1));
            }
        }
        self.total += 1;
    }

    /// Retires the oldest outstanding pick, if any.
    pub fn retire_oldest(&mut self) {
        let retired = self.buckets.front_mut().map(|(_, count)| {
            *count -= 1;
            *count == 0
        });
        if let Some(emptied) = retired {
            self.total -= 1;
            if emptied {
                self.buckets.pop_front();
            }
        }
    }

    /// Drops the picks older than `timeout` seconds at `second`, with buckets `width` seconds
    /// wide (measured from a bucket's last second: no pick stops counting early); whether any
    /// were.
    pub fn expire(&mut self, second: u64, timeout: u64, width: u64) -> bool {
        let mut expired = false;
        while let Some(&(bucket, count)) = self.buckets.front() {
            let last = bucket * width + width - 1;
            if second.saturating_sub(last) < timeout {
                break;
            }
            self.total -= u64::from(count);
            self.buckets.pop_front();
            expired = true;
        }
        expired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_retire_the_oldest_and_time_expires_the_rest() {
        let mut in_flight = InFlight::default();
        in_flight.add(0);
        in_flight.add(0);
        in_flight.add(3);
        assert_eq!(in_flight.total(), 3);
        in_flight.retire_oldest();
        assert_eq!(in_flight.total(), 2);
        // Buckets 4 s wide, a 30 s timeout: bucket 0 ends at second 3, so it expires at 33.
        assert!(!in_flight.expire(32, 30, 4));
        assert!(in_flight.expire(33, 30, 4));
        assert_eq!(in_flight.total(), 1, "bucket 3's pick is still in flight");
        assert!(in_flight.expire(45, 30, 4));
        assert_eq!(in_flight.total(), 0);
        in_flight.retire_oldest();
        assert_eq!(in_flight.total(), 0, "nothing to retire");
    }
}
