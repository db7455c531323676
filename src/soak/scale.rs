//! Scenario `scale`: many instances in one service, then one caller's pick latency while the
//! server's periodic housekeeping runs.
//!
//! N instances (long: 100,000 over 100 streams; short: 20,000 over 20) are registered in one
//! service with the load generator's [`register_all`]. Then a single caller picks back to back
//! under `random`: the instances picked so far have statistics for a housekeeping pass to sweep,
//! and the caller keeps reaching instances it has not picked before, whose statistics rota
//! looks up on their first pick (as it does for every newly registered instance of a live
//! fleet). A round robin would have visited all of them within seconds and then only touch
//! cached handles. The server is started with `--housekeeping-interval 2s` when it
//! has the flag, so several passes fall inside the window (without it, the window lasts until
//! 35 s after the server started, past its built-in pass at 30 s); a pass that stalls the pick path
//! shows as the worst pick latency. The check: the slowest pick took at most 500 ms. A loopback
//! pick takes well under a millisecond; on two cores shared with other work, contention alone
//! was seen to explain up to about 175 ms, so the bound leaves room for that and no more.

use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::time::Instant;

use super::{CALL_TIMEOUT, Check, ScenarioReport, SoakError, SoakOptions, bounded, flag_if_supported, ms};
use crate::client::{PickOptions, RotaClient};
use crate::loadgen::scale::{ScaleConfig, register_all};

/// The worst pick latency allowed while housekeeping runs.
const WORST_PICK: Duration = Duration::from_millis(500);
/// When a server without `--housekeeping-interval` has done its second pass (30 s after its
/// start), with a margin.
const BUILT_IN_PASS: Duration = Duration::from_secs(35);
/// Registering N instances takes seconds; this much means the server is stuck.
const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(120);
/// How often the server is asked to do its housekeeping, when it can be.
const HOUSEKEEPING: &str = "2s";

pub async fn run(options: &SoakOptions, report: &mut ScenarioReport) -> Result<(), SoakError> {
    let instances = options.pick(20_000, 100_000);
    let streams = options.pick(20, 100);
    let window = options.pick(Duration::from_secs(20), Duration::from_secs(120));
    let mut flags = flag_if_supported(
        report,
        "--housekeeping-interval",
        HOUSEKEEPING,
        "housekeeping runs at its built-in interval (30 s, first at start), so the window is stretched \
         to 35 s after the server started to take in one pass",
    );
    let has_flag = !flags.is_empty();
    flags.extend(["--max-registrations-per-peer".into(), streams.max(64).to_string()]);
    let server_started = Instant::now();
    let mut target = options.target(&flags)?;
    let rss_before = target.rss();
    let config = ScaleConfig::registration(&target.endpoint, instances, streams);
    let registered = tokio::time::timeout(REGISTRATION_TIMEOUT, register_all(&config))
        .await
        .map_err(|_| SoakError::Stalled(format!("registering {instances} instances took over 120 s")))?;
    let (registrations, took) = registered.map_err(|e| SoakError::Setup(e.to_string()))?;
    report.figure("registration", format!("{instances} instances over {streams} streams in {}", ms(took)));
    if let (Some(before), Some(after)) = (rss_before, target.rss()) {
        report.figure("server bytes per instance", after.saturating_sub(before) / instances as u64);
    }

    // The soak judges a slow pick against its own CALL_TIMEOUT (a stall); the client deadline lies beyond it.
    let mut client =
        bounded("connect", RotaClient::connect(&target.endpoint)).await?.with_pick_timeout(2 * CALL_TIMEOUT);
    let service = "scale-0000";
    let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds");
    let (mut failed, mut first_error) = (0u64, None);
    let (mut worst, mut worst_at) = (Duration::ZERO, Duration::ZERO);
    let started = Instant::now();
    // Without the flag, the server's first pass after the one at start comes 30 s in: the
    // window is stretched to take it in.
    let until = if has_flag { started + window } else { (started + window).max(server_started + BUILT_IN_PASS) };
    let mut picks = 0u64;
    // A pick still unanswered this long after the window closed ends the run; its latency is
    // then known only as a lower bound.
    let give_up = until + CALL_TIMEOUT;
    let mut unanswered = false;
    // Bounded by the window, and by count.
    while Instant::now() < until && picks < 50_000_000 {
        let sent = Instant::now();
        let answer = tokio::time::timeout_at(give_up, client.pick(service, PickOptions::rule("random"))).await;
        let took = sent.elapsed();
        picks += 1;
        let Ok(answer) = answer else {
            (worst, worst_at, unanswered) = (took, sent - started, true);
            break;
        };
        match answer {
            Ok(_) => {
                let _ = histogram.record(took.as_micros().clamp(1, 60_000_000) as u64);
                if took > worst {
                    (worst, worst_at) = (took, sent - started);
                }
            }
            Err(error) => {
                failed += 1;
                first_error.get_or_insert_with(|| error.to_string());
            }
        }
    }
    let elapsed = started.elapsed();
    drop(registrations);
    let quantile = |q: f64| ms(Duration::from_micros(histogram.value_at_quantile(q)));
    report.figure(
        "picks",
        format!("{picks} in {:.1} s ({:.0}/s)", elapsed.as_secs_f64(), picks as f64 / elapsed.as_secs_f64()),
    );
    let worst_text = if unanswered { format!("over {} (still unanswered)", ms(worst)) } else { ms(worst) };
    report.figure("pick p50 / p99 / max", format!("{} / {} / {worst_text}", quantile(0.5), quantile(0.99)));
    report.key = format!("{instances} instances registered in {}, worst pick {worst_text}", ms(took));
    report.figure("picks over 50 ms", count_above(&histogram, 50_000));
    report.check(Check::bound(
        "worst pick while housekeeping runs",
        worst <= WORST_PICK && !histogram.is_empty(),
        format!(
            "slowest of {} picks took {worst_text}, sent {:.1} s into the window, {:.1} s after the server \
             started (bound {}); p99 {}",
            picks,
            worst_at.as_secs_f64(),
            (started + worst_at - server_started).as_secs_f64(),
            ms(WORST_PICK),
            quantile(0.99)
        ),
    ));
    report.check(Check::new(
        "picks answered",
        failed == 0,
        match first_error {
            None => format!("0 failed of {picks}"),
            Some(error) => format!("{failed} failed of {picks}; first: {error}"),
        },
    ));
    if let Some(check) = target.alive_check() {
        report.check(check);
    }
    Ok(())
}

/// Recorded values above `micros`.
fn count_above(histogram: &Histogram<u64>, micros: u64) -> u64 {
    histogram.iter_recorded().filter(|v| v.value_iterated_to() > micros).map(|v| v.count_at_value()).sum()
}
