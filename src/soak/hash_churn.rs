//! Scenario `hash_churn`: picks of the rules that read tables (`consistent_hash`'s lookup
//! table, `best_available`'s and `sticky`'s load index) over a very large service while its
//! membership changes all the time, from the first pick on.
//!
//! N instances (long: 100,000 over 100 streams, a lookup table of 10 M slots; short: 20,000
//! over 20) are registered in one service. Then, at once and for the whole window (long: 120
//! s; short: 20 s), one provider withdraws and announces again one instance after another, 100
//! changes a second, while four callers pick: two `consistent_hash` and one `sticky` with
//! random keys, one `best_available`. The first tables are built while the membership already
//! changes: every publication replaces the view whose tables are being built.
//!
//! Checks: (a) every pick is answered, none fails; (b) once a caller's first pick (which waits
//! for the first table) is answered, its slowest pick took at most 2 s, whatever its rule; (c)
//! the RSS levels off: the last third of the window peaks within 10 % + 64 MiB of the middle
//! third.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::time::Instant;

use super::{Check, ScenarioReport, SoakError, SoakOptions, mib, ms};
use crate::client::{PickOptions, RotaClient};
use crate::loadgen::scale::{ScaleConfig, register_all};
use crate::pb::{self, register_request::Msg};

const SERVICE: &str = "scale-0000";
const WORST_PICK: Duration = Duration::from_secs(2);
/// Membership changes a second: a withdrawal and an announce each count.
const CHANGES_PER_SECOND: u64 = 100;
/// One caller per entry: its rule, and whether it sends a random key.
const CALLERS: [(&str, bool); 4] =
    [("consistent_hash", true), ("consistent_hash", true), ("best_available", false), ("sticky", true)];

pub async fn run(options: &SoakOptions, report: &mut ScenarioReport) -> Result<(), SoakError> {
    let instances = options.pick(20_000, 100_000);
    let streams = options.pick(20, 100);
    let window = options.pick(Duration::from_secs(20), Duration::from_secs(120));
    let flags = ["--max-registrations-per-peer".to_owned(), streams.max(64).to_string()];
    let mut target = options.target(&flags)?;
    let config = ScaleConfig::registration(&target.endpoint, instances, streams);
    let (mut registrations, took) = tokio::time::timeout(Duration::from_secs(120), register_all(&config))
        .await
        .map_err(|_| SoakError::Stalled(format!("registering {instances} instances took over 120 s")))?
        .map_err(|e| SoakError::Setup(e.to_string()))?;
    report.figure("registration", format!("{instances} instances over {streams} streams in {}", ms(took)));

    let started = Instant::now();
    let until = started + window;
    // The churn: the first stream's instances, one after another, withdrawn and announced.
    let churner = registrations.first_mut().ok_or_else(|| SoakError::Setup("no registration".into()))?;
    let per_stream = instances.div_ceil(streams);
    let churn = async move {
        let mut ticker = tokio::time::interval(Duration::from_millis(2000 / CHANGES_PER_SECOND));
        let (mut changes, mut n) = (0u64, 0usize);
        while Instant::now() < until {
            ticker.tick().await;
            let instance = crate::loadgen::scale::instance(n % per_stream, 1);
            let gone = pb::InstanceRef { service: instance.service.clone(), id: instance.id.clone() };
            churner.send(Msg::Withdraw(pb::Withdraw { instances: vec![gone] })).await?;
            churner.send(Msg::Announce(pb::Announce { instances: vec![instance] })).await?;
            changes += 2;
            n += 1;
        }
        Ok::<u64, crate::client::ClientError>(changes)
    };

    // The callers, and the RSS samples (time into the window, bytes).
    let failed = Arc::new(AtomicU64::new(0));
    let first_error = Arc::new(std::sync::Mutex::new(None::<String>));
    let mut callers = Vec::new();
    for (rule, keyed) in CALLERS {
        let mut client = RotaClient::connect(&target.endpoint).await?.with_pick_timeout(super::CALL_TIMEOUT);
        let (failed, first_error) = (failed.clone(), first_error.clone());
        callers.push(tokio::spawn(async move {
            let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds");
            // The first answer waits for the first table; the slowest pick is counted after it.
            let (mut worst, mut first) = (Duration::ZERO, None);
            while Instant::now() < until {
                let options = PickOptions::rule(rule);
                let options = if keyed { options.key(format!("user-{}", fastrand::u64(..))) } else { options };
                let sent = Instant::now();
                let answer = client.pick(SERVICE, options).await;
                let took = sent.elapsed();
                if first.is_some() {
                    worst = worst.max(took);
                }
                match answer {
                    Ok(_) => {
                        let _ = histogram.record(took.as_micros().clamp(1, 60_000_000) as u64);
                        first.get_or_insert(took);
                    }
                    Err(error) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        first_error.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(error.to_string());
                    }
                }
            }
            (rule, histogram, worst, first)
        }));
    }
    let sampler = async {
        let mut samples = Vec::new();
        while Instant::now() < until {
            if let Some(rss) = target.rss() {
                samples.push((started.elapsed(), rss));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        samples
    };
    let (changes, samples) = tokio::join!(churn, sampler);
    let changes = changes?;
    let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds");
    let (mut worst, mut first_answer) = (Duration::ZERO, Duration::ZERO);
    let mut per_rule: Vec<(&str, Duration, u64)> = Vec::new();
    for caller in callers {
        let (rule, theirs, their_worst, their_first) =
            caller.await.map_err(|e| SoakError::Setup(format!("a caller panicked: {e}")))?;
        let _ = histogram.add(&theirs);
        worst = worst.max(their_worst);
        first_answer = first_answer.max(their_first.unwrap_or(window));
        match per_rule.iter_mut().find(|(r, _, _)| *r == rule) {
            Some((_, w, n)) => (*w, *n) = ((*w).max(their_worst), *n + theirs.len()),
            None => per_rule.push((rule, their_worst, theirs.len())),
        }
    }
    let elapsed = started.elapsed();
    let (picks, failed) = (histogram.len(), failed.load(Ordering::Relaxed));
    let quantile = |q: f64| ms(Duration::from_micros(histogram.value_at_quantile(q)));
    report.figure(
        "churn",
        format!(
            "{changes} changes in {:.1} s ({:.0}/s)",
            elapsed.as_secs_f64(),
            changes as f64 / elapsed.as_secs_f64()
        ),
    );
    report.figure("first answer (the first table)", ms(first_answer));
    report.figure(
        "picks",
        format!("{} answered ({:.0}/s), {failed} failed", picks, picks as f64 / elapsed.as_secs_f64()),
    );
    report.figure(
        "pick p50 / p99 / max after the first",
        format!("{} / {} / {}", quantile(0.5), quantile(0.99), ms(worst)),
    );
    let by_rule: Vec<String> =
        per_rule.iter().map(|(rule, w, n)| format!("{rule} {n} picks, max {}", ms(*w))).collect();
    report.figure("per rule", by_rule.join("; "));
    let first_error = first_error.lock().unwrap_or_else(|p| p.into_inner()).clone();
    report.check(Check::new(
        "picks answered under churn",
        failed == 0 && picks > 0,
        match first_error {
            None => format!("{picks} answered, 0 failed"),
            Some(error) => format!("{failed} failed of {}; first: {error}", picks + failed),
        },
    ));
    report.check(Check::bound(
        "slowest pick under churn once the first table is built",
        worst <= WORST_PICK && first_answer < window,
        format!(
            "{} (bound {}), p99 {}; the first answers took up to {}",
            ms(worst),
            ms(WORST_PICK),
            quantile(0.99),
            ms(first_answer)
        ),
    ));
    // RSS: the last third's peak against the middle third's.
    let third = |from: f64, to: f64| {
        samples
            .iter()
            .filter(|(t, _)| (from..to).contains(&(t.as_secs_f64() / window.as_secs_f64())))
            .map(|&(_, rss)| rss)
            .max()
    };
    match (third(1.0 / 3.0, 2.0 / 3.0), third(2.0 / 3.0, 1.01)) {
        (Some(middle), Some(last)) => {
            let bound = middle + middle / 10 + (64 << 20);
            report.figure("server RSS, middle / last third peak", format!("{} / {}", mib(middle), mib(last)));
            report.check(Check::bound(
                "memory levels off under churn",
                last <= bound,
                format!("last third peaked at {}, middle third at {} (bound {})", mib(last), mib(middle), mib(bound)),
            ));
        }
        _ => report.notice("the server's RSS is not known here: the memory check is skipped"),
    }
    report.key = format!("{instances} instances, {changes} changes: {picks} picks, {failed} failed, max {}", ms(worst));
    drop(registrations);
    if let Some(check) = target.alive_check() {
        report.check(check);
    }
    Ok(())
}
