//! Successes and failures of one instance's reported calls over a sliding window of
//! [`COUNT_BUCKETS`] buckets.

use std::collections::VecDeque;

/// Buckets of the window.
pub const COUNT_BUCKETS: u64 = 6;

/// A call result as the statistics see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Failure,
}

#[derive(Debug, Default)]
pub struct OutcomeWindow {
    /// (bucket index, successes, failures), oldest first.
    buckets: VecDeque<(u64, u64, u64)>,
}

impl OutcomeWindow {
    /// Counts one `outcome` in `bucket` (the current one), dropping buckets that left the window.
    pub fn count(&mut self, bucket: u64, outcome: Outcome) {
        while self.buckets.front().is_some_and(|(b, _, _)| bucket.saturating_sub(*b) >= COUNT_BUCKETS) {
            self.buckets.pop_front();
        }
        if self.buckets.back().is_none_or(|(b, _, _)| *b != bucket) {
            self.buckets.push_back((bucket, 0, 0));
        }
        if let Some((_, ok, fail)) = self.buckets.back_mut() {
            match outcome {
                Outcome::Success => *ok += 1,
                Outcome::Failure => *fail += 1,
            }
        }
    }

    /// (successes, failures) in the window that ends with `bucket`.
    pub fn totals(&self, bucket: u64) -> (u64, u64) {
        let oldest = bucket.saturating_sub(COUNT_BUCKETS - 1);
        let live = self.buckets.iter().filter(|(b, _, _)| *b >= oldest);
        live.fold((0, 0), |(s, f), (_, ok, fail)| (s + ok, f + fail))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_keeps_its_last_buckets() {
        let mut window = OutcomeWindow::default();
        window.count(0, Outcome::Success);
        window.count(0, Outcome::Failure);
        window.count(3, Outcome::Failure);
        assert_eq!(window.totals(3), (1, 2));
        assert_eq!(window.totals(5), (1, 2), "bucket 0 is the window's oldest at 5");
        assert_eq!(window.totals(6), (0, 1), "bucket 0 left the window");
        window.count(9, Outcome::Success);
        assert_eq!(window.totals(9), (1, 0), "bucket 3 left it too");
    }
}
