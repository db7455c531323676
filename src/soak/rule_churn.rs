//! Scenario `rule_churn`: a picker per rule over a very large service whose membership changes
//! hundreds of times a second, against a server whose runtime has one worker thread.
//!
//! N instances (long: 100,000 over 100 streams; short: 20,000 over 20) are registered in one
//! service. Then, for the whole window (long: 60 s; short: 15 s), churners (long: 20, short: 10,
//! each on a stream of its own) withdraw and announce again one of their instances after
//! another, together aiming at a rate (long: 1,000 changes a second; short: 500) that their
//! acknowledgements may hold back, while one caller per rule picks as fast as it is answered:
//! `round_robin`, `weighted`, `least_request`, `best_available`, `sticky` and `consistent_hash`
//! (random keys), `zone_avoidance`. The server spawned for it runs with
//! `TOKIO_WORKER_THREADS=1`, so table builds, publications and picks contend for one worker as
//! they would for one core: a pick that waited for a build would show here.
//!
//! Checks: (a) every pick is answered and every rule answered some; (b) every change is
//! acknowledged; in long mode also (c) at a quarter of the aimed rate at least, and (d) each
//! rule's p99 within 20 ms and its slowest pick within 1 s.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::time::{Instant, MissedTickBehavior};

use super::server::Target;
use super::{Check, ScenarioReport, SoakError, SoakOptions, mib, ms};
use crate::client::{PickOptions, RotaClient};
use crate::loadgen::scale::{ScaleConfig, register_all};
use crate::pb::{self, register_request::Msg};

const SERVICE: &str = "scale-0000";
/// One caller per entry: its rule, and whether it sends a random key.
const CALLERS: [(&str, bool); 7] = [
    ("round_robin", false),
    ("weighted", false),
    ("least_request", false),
    ("best_available", false),
    ("sticky", true),
    ("consistent_hash", true),
    ("zone_avoidance", false),
];
/// Distinct keys the keyed callers draw from.
const KEYS: u64 = 10_000;
const P99_BOUND: Duration = Duration::from_millis(20);
const WORST_BOUND: Duration = Duration::from_secs(1);

/// One caller's figures.
struct Caller {
    rule: &'static str,
    histogram: Histogram<u64>,
    worst: Duration,
}

pub async fn run(options: &SoakOptions, report: &mut ScenarioReport) -> Result<(), SoakError> {
    let instances = options.pick(20_000, 100_000);
    let streams = options.pick(20, 100);
    let churners = options.pick(10, 20);
    let rate: u64 = options.pick(500, 1_000);
    let window = options.pick(Duration::from_secs(15), Duration::from_secs(60));
    let flags = ["--max-registrations-per-peer".to_owned(), streams.max(64).to_string()];
    let mut target = match &options.server {
        Some(_) => {
            report.notice("a given server runs with the worker threads it was started with");
            options.target(&flags)?
        }
        None => Target::spawn_with_env(&flags, "http", &[("TOKIO_WORKER_THREADS", "1")])?,
    };
    let config = ScaleConfig::registration(&target.endpoint, instances, streams);
    let (registrations, took) = tokio::time::timeout(Duration::from_secs(120), register_all(&config))
        .await
        .map_err(|_| SoakError::Stalled(format!("registering {instances} instances took over 120 s")))?
        .map_err(|e| SoakError::Setup(e.to_string()))?;
    report.figure("registration", format!("{instances} instances over {streams} streams in {}", ms(took)));

    let started = Instant::now();
    let until = started + window;
    let per_stream = instances.div_ceil(streams);
    let mut registrations = registrations.into_iter();
    let mut churn = Vec::new();
    for churner in 0..churners {
        let mut registration = registrations.next().ok_or_else(|| SoakError::Setup("too few streams".into()))?;
        // Each churner's pairs (a withdrawal and an announce) at its share of the rate.
        let pair_every = Duration::from_secs_f64(2.0 * churners as f64 / rate as f64);
        churn.push(tokio::spawn(async move {
            let mut ticker = tokio::time::interval(pair_every);
            ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
            let mut acks = 0u64;
            for n in 0.. {
                ticker.tick().await;
                if Instant::now() >= until {
                    break;
                }
                let instance = crate::loadgen::scale::instance(churner * per_stream + n % per_stream, 1);
                let gone = pb::InstanceRef { service: instance.service.clone(), id: instance.id.clone() };
                registration.send(Msg::Withdraw(pb::Withdraw { instances: vec![gone] })).await?;
                registration.send(Msg::Announce(pb::Announce { instances: vec![instance] })).await?;
                acks += 2;
            }
            Ok::<u64, crate::client::ClientError>(acks)
        }));
    }
    let held: Vec<_> = registrations.collect();

    let failed = Arc::new(AtomicU64::new(0));
    let first_error = Arc::new(std::sync::Mutex::new(None::<String>));
    let mut callers = Vec::new();
    for (rule, keyed) in CALLERS {
        let mut client = RotaClient::connect(&target.endpoint).await?.with_pick_timeout(super::CALL_TIMEOUT);
        let (failed, first_error) = (failed.clone(), first_error.clone());
        callers.push(tokio::spawn(async move {
            let mut caller = Caller {
                rule,
                histogram: Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid bounds"),
                worst: Duration::ZERO,
            };
            while Instant::now() < until {
                let options = PickOptions::rule(rule);
                let options = if keyed { options.key(format!("user-{}", fastrand::u64(..KEYS))) } else { options };
                let sent = Instant::now();
                let answer = client.pick(SERVICE, options).await;
                let took = sent.elapsed();
                match answer {
                    Ok(_) => {
                        caller.worst = caller.worst.max(took);
                        let _ = caller.histogram.record(took.as_micros().clamp(1, 60_000_000) as u64);
                    }
                    Err(error) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        first_error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(error.to_string());
                    }
                }
            }
            caller
        }));
    }
    let mut peak_rss = None;
    while Instant::now() < until {
        if let Some(rss) = target.rss() {
            peak_rss = peak_rss.max(Some(rss));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let (mut acks, mut churn_error) = (0u64, None);
    for churner in churn {
        match churner.await.map_err(|e| SoakError::Setup(format!("a churner panicked: {e}")))? {
            Ok(theirs) => acks += theirs,
            Err(error) => churn_error = churn_error.or(Some(error.to_string())),
        }
    }
    let elapsed = started.elapsed();
    let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds");
    let (mut worst, mut slow_rules, mut silent_rules) = (Duration::ZERO, Vec::new(), Vec::new());
    for caller in callers {
        let caller = caller.await.map_err(|e| SoakError::Setup(format!("a caller panicked: {e}")))?;
        let _ = all.add(&caller.histogram);
        let p = |q: f64| Duration::from_micros(caller.histogram.value_at_quantile(q));
        let n = caller.histogram.len();
        report.figure(
            caller.rule,
            format!(
                "{n} picks ({:.0}/s), p50 / p99 / max {} / {} / {}",
                n as f64 / elapsed.as_secs_f64(),
                ms(p(0.5)),
                ms(p(0.99)),
                ms(caller.worst)
            ),
        );
        if n == 0 {
            silent_rules.push(caller.rule);
        } else if p(0.99) > P99_BOUND || caller.worst > WORST_BOUND {
            slow_rules.push(caller.rule);
        }
        worst = worst.max(caller.worst);
    }
    let (picks, failed) = (all.len(), failed.load(Ordering::Relaxed));
    let acks_per_second = acks as f64 / elapsed.as_secs_f64();
    let quantile = |q: f64| ms(Duration::from_micros(all.value_at_quantile(q)));
    report.figure(
        "changes acknowledged",
        format!("{acks} in {:.1} s ({acks_per_second:.0}/s, aimed at {rate}/s)", elapsed.as_secs_f64()),
    );
    report.figure(
        "picks",
        format!(
            "{picks} answered ({:.0}/s), {failed} failed; p50 / p99 / max {} / {} / {}",
            picks as f64 / elapsed.as_secs_f64(),
            quantile(0.5),
            quantile(0.99),
            ms(worst)
        ),
    );
    if let Some(rss) = peak_rss {
        report.figure("server RSS peak", mib(rss));
    }
    let first_error = first_error.lock().unwrap_or_else(|p| p.into_inner()).clone();
    report.check(Check::new(
        "every pick answered under churn, by every rule",
        failed == 0 && silent_rules.is_empty(),
        match (first_error, silent_rules.is_empty()) {
            (None, true) => format!("{picks} answered, 0 failed"),
            (None, false) => format!("no pick answered for {}", silent_rules.join(", ")),
            (Some(error), _) => format!("{failed} failed of {}; first: {error}", picks + failed),
        },
    ));
    report.check(Check::new(
        "changes acknowledged under picks",
        churn_error.is_none() && acks > 0,
        match &churn_error {
            Some(error) => format!("a churner failed: {error}"),
            None => format!("{acks} acknowledged"),
        },
    ));
    report.check(Check::bound(
        "acknowledgements keep up under picks",
        acks_per_second * 4.0 >= rate as f64,
        format!("{acks_per_second:.0}/s (bound {}/s, a quarter of the aimed rate)", rate / 4),
    ));
    report.check(Check::bound(
        "each rule's p99 and slowest pick under churn",
        slow_rules.is_empty(),
        match slow_rules.is_empty() {
            true => format!("every rule's p99 within {} and max within {}", ms(P99_BOUND), ms(WORST_BOUND)),
            false => format!("over {} (p99) or {} (max): {}", ms(P99_BOUND), ms(WORST_BOUND), slow_rules.join(", ")),
        },
    ));
    report.key = format!("{instances} instances, {acks} changes: {picks} picks, {failed} failed, max {}", ms(worst));
    drop(held);
    if let Some(check) = target.alive_check() {
        report.check(check);
    }
    Ok(())
}
