//! Scenario `memory`: churn of names rather than of instances, while the server's resident
//! memory is sampled once a second.
//!
//! Worker tasks repeat rounds: register a batch of services no one has used before (three
//! instances each, on a fresh stream), pick once from each under rule strings that vary from
//! round to round (`repeat(n=…)`, `consistent_hash(balance=…)` with a key, `sticky(ttl=…)` with a
//! new key each time), then close the stream so the services lose every instance. A server that keeps
//! something per service name, per rule string or per key for ever grows by the round.
//!
//! rota may keep some of this for a while by design: sticky assignments until they expire, a
//! service with no instances for `--service-idle-timeout`, an unused rotation counter for a number
//! of housekeeping rounds. So the server is started with housekeeping every second and services
//! forgotten after 1 s idle (for each flag it has; a notice says when it lacks one), and sticky
//! assignments here live 1–5 s: what the server may keep is then bounded well inside the run,
//! and growth in the last third is growth without a bound.
//!
//! The check is a plateau: split the samples into thirds; the highest RSS of the last third may
//! exceed the highest of the middle third by at most 10 % + 8 MiB. (The first third is warm-up:
//! allocator arenas, caches filling to their bounds.) Picks must also be answered.

use std::time::Duration;

use tokio::time::Instant;

use super::{CALL_TIMEOUT, Check, ScenarioReport, SoakError, SoakOptions, bounded, flag_if_supported, mib};
use crate::client::{PickOptions, RotaClient};
use crate::pb;

/// New services per round and worker.
const SERVICES_PER_ROUND: usize = 50;
const INSTANCES_PER_SERVICE: usize = 3;
/// Plateau margin: relative and absolute.
const MARGIN_RATIO: f64 = 0.10;
const MARGIN_BYTES: u64 = 8 * 1024 * 1024;

pub async fn run(options: &SoakOptions, report: &mut ScenarioReport) -> Result<(), SoakError> {
    let duration = options.pick(Duration::from_secs(30), Duration::from_secs(180));
    let workers = options.pick(3, 4);
    let mut flags = flag_if_supported(
        report,
        "--housekeeping-interval",
        "1s",
        "housekeeping runs every 30 s, so what expires (sticky assignments, idle state) goes only then",
    );
    flags.extend(flag_if_supported(
        report,
        "--service-idle-timeout",
        "1s",
        "a service that lost its instances is kept as long as the server's default",
    ));
    let mut target = options.target(&flags)?;
    let Some(pid) = target.pid else {
        report.notice("the server's pid is unknown (--server without --server-pid): no RSS to sample");
        return Ok(());
    };
    let until = Instant::now() + duration;
    let mut tasks = Vec::new();
    for worker in 0..workers {
        tasks.push(tokio::spawn(churn_names(target.endpoint.clone(), worker, until)));
    }
    // One sample a second, at most one per second of the run, plus the start.
    let mut samples = Vec::new();
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    for _ in 0..=duration.as_secs() {
        ticker.tick().await;
        match super::resident_bytes(pid) {
            Some(rss) => samples.push(rss),
            None => break,
        }
    }
    let mut totals = Totals::default();
    for task in tasks {
        totals.add(task.await.map_err(|e| SoakError::Setup(e.to_string()))??);
    }
    let end = target.rss();
    report.figure("services registered", totals.services);
    report.figure("picks (ok / failed)", format!("{} / {}", totals.picks, totals.failed));
    if let (Some(&start), Some(&peak)) = (samples.first(), samples.iter().max()) {
        let rss = format!("{} / {} / {}", mib(start), mib(peak), mib(end.unwrap_or(0)));
        report.key = format!("RSS start/peak/end {rss}, {} services", totals.services);
        report.figure("RSS start / peak / end", rss);
    }
    report.figure("RSS samples", samples.len());
    if let Some(peaks) = peaks_by_third(&samples) {
        report.figure("RSS peak per third", peaks.map(mib).join(" / "));
    }
    report.check(plateau(&samples));
    report.check(Check::new(
        "picks answered",
        totals.failed == 0,
        match &totals.first_error {
            None => format!("0 failed of {}", totals.picks),
            Some(error) => format!("{} failed of {}; first: {error}", totals.failed, totals.picks + totals.failed),
        },
    ));
    if let Some(check) = target.alive_check() {
        report.check(check);
    }
    Ok(())
}

/// The plateau check over one-second RSS samples.
pub fn plateau(samples: &[u64]) -> Check {
    const NAME: &str = "RSS levels off";
    if samples.len() < 6 {
        return Check::bound(
            NAME,
            false,
            format!("only {} RSS samples; the run was too short to judge", samples.len()),
        );
    }
    let [_, middle, last] = peaks_by_third(samples).expect("enough samples");
    let allowed = middle + (middle as f64 * MARGIN_RATIO) as u64 + MARGIN_BYTES;
    Check::bound(
        NAME,
        last <= allowed,
        format!(
            "last third peaked at {}, middle third at {} (allowed up to {}, {:+.1} MiB)",
            mib(last),
            mib(middle),
            mib(allowed),
            (last as f64 - middle as f64) / (1024.0 * 1024.0)
        ),
    )
}

/// The highest sample of the first, middle and last third (the last takes the remainder).
fn peaks_by_third(samples: &[u64]) -> Option<[u64; 3]> {
    let third = samples.len() / 3;
    if third == 0 {
        return None;
    }
    let peak = |part: &[u64]| part.iter().copied().max().unwrap_or(0);
    Some([peak(&samples[..third]), peak(&samples[third..2 * third]), peak(&samples[2 * third..])])
}

#[derive(Debug, Default)]
struct Totals {
    services: u64,
    picks: u64,
    failed: u64,
    first_error: Option<String>,
}

impl Totals {
    fn add(&mut self, other: Totals) {
        self.services += other.services;
        self.picks += other.picks;
        self.failed += other.failed;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

/// Rounds of fresh services, varied rules and keys, and a close, until `until`.
async fn churn_names(endpoint: String, worker: usize, until: Instant) -> Result<Totals, SoakError> {
    let mut totals = Totals::default();
    // The soak judges a slow pick against its own CALL_TIMEOUT (a stall); the client deadline lies beyond it.
    let client = bounded("connect", RotaClient::connect(&endpoint)).await?.with_pick_timeout(2 * CALL_TIMEOUT);
    let mut round = 0u64;
    // Bounded by time, and by count should the rounds be very fast.
    while Instant::now() < until && round < 1_000_000 {
        let services: Vec<String> = (0..SERVICES_PER_ROUND).map(|s| format!("mem-{worker}-{round}-{s}")).collect();
        let instances = services
            .iter()
            .flat_map(|service| {
                (0..INSTANCES_PER_SERVICE).map(move |i| pb::Instance {
                    id: format!("i{i}"),
                    service: service.clone(),
                    host: "127.0.0.1".into(),
                    port: 20_000 + i as u32,
                    ..Default::default()
                })
            })
            .collect();
        let mut provider = bounded("connect", RotaClient::connect(&endpoint)).await?;
        let registration = bounded("register a round's services", provider.register(instances)).await?;
        registration.require_all_accepted()?;
        totals.services += services.len() as u64;
        let rules = [
            (format!("repeat(n={})", 1 + round % 500), String::new()),
            (format!("consistent_hash(balance={:.2})", 1.0 + (round % 900) as f64 / 100.0), format!("k{round}")),
            (format!("sticky(ttl={}s)", 1 + round % 5), format!("user-{worker}-{round}")),
        ];
        // One pick per service, the rules taking turns: names churn faster than picks would
        // let them. The round's picks go out together.
        let mut picks = Vec::new();
        for (index, service) in services.iter().enumerate() {
            let (rule, key) = &rules[index % rules.len()];
            let mut client = client.clone();
            picks.push(async move {
                let pick = client.pick(service, PickOptions::rule(rule.as_str()).key(key.as_str()));
                let answer = bounded("pick", pick).await;
                answer.map_err(|error| format!("{service} {rule}: {error}"))
            });
        }
        for answer in futures_util::future::join_all(picks).await {
            match answer {
                Ok(_) => totals.picks += 1,
                Err(error) => {
                    totals.failed += 1;
                    totals.first_error.get_or_insert(error);
                }
            }
        }
        // The services lose every instance at once.
        drop(registration);
        round += 1;
    }
    Ok(totals)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1024 * 1024;

    #[test]
    fn a_level_run_passes_and_a_growing_one_fails() {
        let level: Vec<u64> = [40, 60, 62, 63, 62, 64, 63, 64, 65].iter().map(|m| m * MIB).collect();
        assert!(plateau(&level).passed, "{}", plateau(&level).evidence);
        let growing: Vec<u64> = (0..9).map(|i| (40 + 20 * i) * MIB).collect();
        let check = plateau(&growing);
        assert!(!check.passed, "{}", check.evidence);
        assert!(!plateau(&level[..3]).passed, "too few samples to judge");
    }
}
