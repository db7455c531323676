//! One instance's recent latency: an average whose weight decays in time (time constant
//! `latency_decay`), so it follows the recent window rather than the lifetime mean Ribbon's
//! `ServerStats` used, and which is forgotten after [`super::LATENCY_MEMORY`] time constants
//! without a sample (so a slow spell that starved the instance of picks ends in time).
//!
//! One sample moves an established average at most [`MAX_SAMPLE_RATIO`] times up: a report
//! of an hour against an average of 5 ms counts as 40 ms. A real slowdown still shows within a
//! handful of calls (each raises the average by up to half of itself), but one reporter can no
//! longer make an instance the rest of the fleet finds fast look like the slowest by far.

use std::time::Duration;

use tokio::time::Instant;

/// Every sample moves the average by at least this fraction, so a burst of samples at one
/// instant (no time elapsed) still counts.
const MIN_SAMPLE_WEIGHT: f64 = 1.0 / 16.0;

/// A sample counts as at most this many times the average it updates (an average under
/// 1 ms counts as that).
pub const MAX_SAMPLE_RATIO: f64 = 8.0;
const RATIO_FLOOR_MS: f64 = 1.0;

#[derive(Debug, Default)]
pub struct Ewma {
    ms: Option<f64>,
    last_sample: Option<Instant>,
}

impl Ewma {
    /// The average in milliseconds; `None` before the first sample or once forgotten.
    pub fn ms(&self) -> Option<f64> {
        self.ms
    }

    /// Takes in one call's `latency`, measured at `now`.
    pub fn sample(&mut self, now: Instant, latency: Duration, decay: Duration) {
        let sample = latency.as_secs_f64() * 1000.0;
        self.ms = Some(match (self.ms, self.last_sample) {
            (Some(previous), Some(last)) => {
                let sample = sample.min(previous.max(RATIO_FLOOR_MS) * MAX_SAMPLE_RATIO);
                let elapsed = now.duration_since(last).as_secs_f64();
                let decay = decay.as_secs_f64().max(f64::EPSILON);
                let weight = (1.0 - (-elapsed / decay).exp()).max(MIN_SAMPLE_WEIGHT);
                previous + (sample - previous) * weight
            }
            _ => sample,
        });
        self.last_sample = Some(now);
    }

    /// Forgets an average that had no sample for `memory`; whether it did.
    pub fn forget_if_stale(&mut self, now: Instant, memory: Duration) -> bool {
        match self.last_sample {
            Some(last) if self.ms.is_some() && now.duration_since(last) >= memory => {
                self.ms = None;
                true
            }
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DECAY: Duration = Duration::from_secs(10);

    #[test]
    fn one_huge_sample_moves_an_established_average_at_most_its_ratio() {
        let start = Instant::now();
        let mut ewma = Ewma::default();
        ewma.sample(start, Duration::from_millis(5), DECAY);
        // Long enough apart that the new sample takes almost all the weight.
        ewma.sample(start + Duration::from_secs(30), Duration::from_secs(3600), DECAY);
        let ms = ewma.ms().unwrap();
        assert!(ms <= 5.0 * MAX_SAMPLE_RATIO, "{ms}");
        assert!(ms > 30.0, "the sample still counts, as 40 ms: {ms}");
    }

    #[test]
    fn a_real_slowdown_shows_within_a_few_dozen_calls() {
        let start = Instant::now();
        let mut ewma = Ewma::default();
        ewma.sample(start, Duration::from_millis(5), DECAY);
        // Calls 10 ms apart, each taking 2 s.
        let calls = (1..=40).take_while(|&i| {
            ewma.sample(start + Duration::from_millis(10 * i), Duration::from_secs(2), DECAY);
            ewma.ms().unwrap() < 1000.0
        });
        assert!(calls.count() < 40, "the average reached 1 s: {:?}", ewma.ms());
    }

    #[test]
    fn an_average_of_zero_can_still_rise() {
        let start = Instant::now();
        let mut ewma = Ewma::default();
        ewma.sample(start, Duration::ZERO, DECAY);
        ewma.sample(start + Duration::from_secs(60), Duration::from_millis(100), DECAY);
        assert!(ewma.ms().unwrap() > 5.0, "{:?}", ewma.ms());
    }
}
