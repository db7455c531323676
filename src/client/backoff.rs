//! The wait between reconnect attempts, shared by every stream the client keeps open (a
//! followed service's Watch, a kept registration).

use std::time::Duration;

const BACKOFF_INITIAL: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(10);

/// The wait before reconnect attempt `attempt` (from 0): exponential from 100 ms up to 10 s,
/// each wait drawn between half and all of it, so that clients that lost rota together do not
/// come back together.
pub(super) fn backoff(attempt: u32, rng: &mut fastrand::Rng) -> Duration {
    let ceiling = BACKOFF_INITIAL.saturating_mul(1u32 << attempt.min(16)).min(BACKOFF_MAX);
    ceiling / 2 + ceiling.mul_f64(rng.f64() / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reconnect_backoff_grows_with_jitter_up_to_its_ceiling() {
        let mut rng = fastrand::Rng::with_seed(7);
        for attempt in 0..40 {
            let ceiling = (BACKOFF_INITIAL * 2u32.saturating_pow(attempt.min(16))).min(BACKOFF_MAX);
            let wait = backoff(attempt, &mut rng);
            assert!(wait >= ceiling / 2 && wait <= ceiling, "attempt {attempt}: {wait:?} against {ceiling:?}");
        }
        let waits: Vec<Duration> = (0..8).map(|_| backoff(3, &mut rng)).collect();
        assert!(waits.iter().any(|w| *w != waits[0]), "jittered: {waits:?}");
    }
}
