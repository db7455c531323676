//! One instance's recent latency: an average whose weight decays in time (time constant
//! `latency_decay`), so it follows the recent window rather than the lifetime mean Ribbon's
//! `ServerStats` used, and which is forgotten after [`super::LATENCY_MEMORY`] time constants
//! without a sample (so a slow spell that starved the instance of picks ends in time).

use std::time::Duration;

use tokio::time::Instant;

/// Every sample moves the average by at least this fraction, so a burst of samples at one
/// instant (no time elapsed) still counts.
const MIN_SAMPLE_WEIGHT: f64 = 1.0 / 16.0;

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
