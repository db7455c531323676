//! Scenario `churn`: registration churn under a pick load, judged by the [`super::history`] checker.
//!
//! Three services each keep two *anchor* instances (one unversioned, one of version `v2`) on a
//! stream that never changes, so every subset always has an eligible instance: a pick never
//! fails for want of one and a rotation is never abandoned. Around them, provider tasks (see
//! `provider`) own a few instances of every service and announce, re-weigh, drain,
//! revive, withdraw and abruptly close them at a random pace. Consumer tasks, half on unary
//! `Pick` and half on one `PickStream` each, pick continuously from random services under
//! `round_robin` and `repeat(n=3)`, with and without version `v2`. Everything is recorded on
//! one monotonic clock and handed to [`super::judge::check`] at the end.
//!
//! Besides the checker's four checks, every pick must be answered (the anchors make
//! `UNAVAILABLE` impossible), every registration change accepted, and every closed stream's
//! instances gone from the listing within 10 s.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use super::history::{Change, Event, Findings, History, Pick, PickRule, Tally, UNKNOWN, Universe};
use super::provider::{Owned, Provider, ProviderLog};
use super::{CALL_TIMEOUT, Check, Clock, ScenarioReport, SoakError, SoakOptions, bounded};
use crate::client::{self, PickOptions, RotaClient};
use crate::pb;

const SERVICES: [&str; 3] = ["soak-a", "soak-b", "soak-c"];
const RULES: [PickRule; 2] = [PickRule::RoundRobin, PickRule::Repeat(3)];
/// Instances each provider owns in each service: two unversioned, one `v2`.
const VERSIONS: [&str; 3] = ["", "", "v2"];

struct Sizing {
    duration: Duration,
    providers: usize,
    /// Consumers of each kind (unary, streamed).
    consumers: usize,
    /// Bounds each consumer's history; a long run is paced to spread it over the duration.
    max_picks: usize,
}

pub async fn run(options: &SoakOptions, report: &mut ScenarioReport) -> Result<(), SoakError> {
    let sizing = Sizing {
        duration: options.pick(Duration::from_secs(25), Duration::from_secs(240)),
        providers: options.pick(4, 6),
        consumers: 2,
        max_picks: options.pick(1_000_000, 2_000_000),
    };
    let mut target = options.target(&[])?;
    let clock = Clock::start();
    let (universe, anchors, owned) = plan(sizing.providers);
    let universe = Arc::new(universe);

    let mut anchor_client = bounded("connect", RotaClient::connect(&target.endpoint)).await?;
    let send = clock.now();
    let anchor_instances = anchors.iter().map(|a| a.0.clone()).collect();
    let anchor_stream = bounded("register the anchors", anchor_client.register(anchor_instances)).await?;
    let ack = clock.now();
    anchor_stream.require_all_accepted()?;
    let mut events: Vec<Event> = anchors
        .iter()
        .map(|(_, instance, version)| Event {
            send,
            ack,
            instance: *instance,
            change: Change::Announce { version: *version, up: true },
            accepted: true,
        })
        .collect();

    let until = Instant::now() + sizing.duration;
    let mut providers = Vec::new();
    for (index, owned) in owned.into_iter().enumerate() {
        let provider = Provider {
            endpoint: target.endpoint.clone(),
            universe: universe.clone(),
            owned,
            clock,
            seed: 0x50a6 + index as u64,
            pace_ms: (2, 40),
            until,
            max_changes: 1_000_000,
        };
        providers.push(tokio::spawn(provider.run()));
    }
    let rate = (!options.short).then(|| sizing.max_picks as f64 / sizing.duration.as_secs_f64());
    let mut consumers = Vec::new();
    for index in 0..sizing.consumers * 2 {
        let consumer = Consumer {
            endpoint: target.endpoint.clone(),
            universe: universe.clone(),
            clock,
            seed: 0xc0de + index as u64,
            streamed: index % 2 == 1,
            until,
            max_picks: sizing.max_picks,
            rate,
        };
        consumers.push(tokio::spawn(consumer.run()));
    }
    let mut logs = ConsumerLog::default();
    for consumer in consumers {
        logs.merge(consumer.await.map_err(|e| SoakError::Setup(e.to_string()))??);
    }
    let mut provided = ProviderLog::default();
    for provider in providers {
        let log = provider.await.map_err(|e| SoakError::Setup(e.to_string()))??;
        provided.events.extend(log.events);
        provided.closes += log.closes;
        provided.refusals.extend(log.refusals);
        provided.slow_closes.extend(log.slow_closes);
    }
    drop(anchor_stream);
    let elapsed = clock.now() as f64 / 1e9;
    events.append(&mut provided.events);

    let history = History { universe: (*universe).clone(), picks: std::mem::take(&mut logs.picks), events };
    let (findings, history) = tokio::task::spawn_blocking(move || (super::judge::check(&history), history))
        .await
        .map_err(|e| SoakError::Setup(e.to_string()))?;
    figures(report, &findings, &history, &logs.counts, provided.closes, elapsed);
    checks(report, &findings, &logs, &provided);
    if let Some(check) = target.alive_check() {
        report.check(check);
    }
    Ok(())
}

type Anchor = (pb::Instance, u32, u32);

/// The universe of names, the anchors (instance, its index, its version index) and what each
/// provider owns.
fn plan(providers: usize) -> (Universe, Vec<Anchor>, Vec<Vec<Owned>>) {
    let mut universe = Universe::default();
    for version in ["", "v2"] {
        universe.version(version);
    }
    let mut anchors = Vec::new();
    for service in SERVICES {
        universe.service(service);
        for version in ["", "v2"] {
            let id = if version.is_empty() { "anchor".to_owned() } else { format!("anchor-{version}") };
            let instance = pb::Instance {
                id: id.clone(),
                service: service.into(),
                host: "127.0.0.1".into(),
                port: 20_000,
                version: version.into(),
                ..Default::default()
            };
            anchors.push((instance, universe.instance(service, &id), universe.version(version)));
        }
    }
    let owned = (0..providers)
        .map(|p| {
            let mut owned = Vec::new();
            for service in SERVICES {
                for (j, version) in VERSIONS.iter().enumerate() {
                    let id = format!("p{p}-{j}");
                    universe.instance(service, &id);
                    owned.push(Owned::new(service, &id, version));
                }
            }
            owned
        })
        .collect();
    (universe, anchors, owned)
}

fn figures(
    report: &mut ScenarioReport,
    findings: &Findings,
    history: &History,
    counts: &[u64; 2],
    closes: u64,
    elapsed: f64,
) {
    let rate = findings.picks as f64 / elapsed.max(1e-9);
    report.key = format!("{} picks ({rate:.0}/s), {} registration events", findings.picks, findings.events);
    report.figure("picks", findings.picks);
    report.figure("picks/s", format!("{rate:.0}"));
    report.figure("registration events", findings.events);
    report.figure("picks unary / stream", format!("{} / {}", counts[0], counts[1]));
    let kinds = |f: fn(&Change) -> bool| history.events.iter().filter(|e| f(&e.change)).count();
    report.figure(
        "announce/update/withdraw/close",
        format!(
            "{} / {} / {} / {} (streams closed abruptly: {closes})",
            kinds(|c| matches!(c, Change::Announce { .. })),
            kinds(|c| matches!(c, Change::Update { .. })),
            kinds(|c| matches!(c, Change::Withdraw)),
            kinds(|c| matches!(c, Change::Close)),
        ),
    );
    report.figure("quiet windows / quiet picks", format!("{} / {}", findings.quiet_windows, findings.quiet_picks));
    report.figure("run time", format!("{elapsed:.1} s"));
}

fn checks(report: &mut ScenarioReport, findings: &Findings, consumers: &ConsumerLog, providers: &ProviderLog) {
    let tally = |name: &str, tally: &Tally, over: String| {
        let evidence = match tally.count {
            0 => format!("0 violations in {over}"),
            n => format!("{n} violations in {over}; first: {}", tally.examples.join("\n      ")),
        };
        Check::new(name, tally.count == 0, evidence)
    };
    let picks = format!("{} picks", findings.picks);
    report.check(tally("(a) picked instance was live", &findings.live, picks.clone()));
    report.check(tally("(b) no pick after an acknowledged removal", &findings.stale, picks.clone()));
    report.check(tally("(c) no ticket handed out twice", &findings.tickets, picks.clone()));
    let quiet = format!("{} quiet picks in {} windows", findings.quiet_picks, findings.quiet_windows);
    let mut shares = tally("(d) exact shares in quiet windows", &findings.shares, quiet);
    if findings.quiet_picks == 0 {
        shares = Check::new(shares.name, false, "no pick fell in a quiet window: nothing was checked");
    }
    report.check(shares);
    report.check(tally(
        "(e) every pick answered under the rule and version it asked for",
        &findings.answers,
        picks.clone(),
    ));
    let errors = &consumers.errors;
    report.check(Check::new(
        "every pick answered",
        errors.count == 0,
        match errors.count {
            0 => format!("0 failed picks of {}", findings.picks),
            n => format!("{n} failed picks; first: {}", errors.examples.join("\n      ")),
        },
    ));
    let refused = providers.refusals.len() + providers.slow_closes.len();
    let mut first: Vec<&str> = providers.refusals.iter().chain(&providers.slow_closes).map(String::as_str).collect();
    first.truncate(5);
    report.check(Check::new(
        "registration changes applied",
        refused == 0,
        match refused {
            0 => {
                format!("all {} changes accepted, all {} stream closes seen applied", findings.events, providers.closes)
            }
            n => format!("{n} refused or lingering; first: {}", first.join("\n      ")),
        },
    ));
}

/// What the consumers saw.
#[derive(Default)]
struct ConsumerLog {
    picks: Vec<Pick>,
    errors: Tally,
    /// Successful picks over unary `Pick` and over `PickStream`.
    counts: [u64; 2],
}

impl ConsumerLog {
    fn merge(&mut self, other: ConsumerLog) {
        self.picks.extend(other.picks);
        self.errors.count += other.errors.count;
        self.errors.examples.extend(other.errors.examples.into_iter().take(5 - self.errors.examples.len().min(5)));
        self.counts[0] += other.counts[0];
        self.counts[1] += other.counts[1];
    }
}

struct Consumer {
    endpoint: String,
    universe: Arc<Universe>,
    clock: Clock,
    seed: u64,
    streamed: bool,
    until: Instant,
    max_picks: usize,
    /// Picks per second to hold to, if any.
    rate: Option<f64>,
}

/// One `PickStream` with one request in flight at a time.
struct PickStream {
    requests: mpsc::Sender<pb::PickRequest>,
    responses: tonic::Streaming<pb::PickResponse>,
}

impl Consumer {
    async fn run(self) -> Result<ConsumerLog, SoakError> {
        let mut rng = fastrand::Rng::with_seed(self.seed);
        // The soak judges a slow pick against its own CALL_TIMEOUT (a stall); the client deadline lies beyond it.
        let mut client =
            bounded("connect", RotaClient::connect(&self.endpoint)).await?.with_pick_timeout(2 * CALL_TIMEOUT);
        let mut stream = None;
        let mut log = ConsumerLog::default();
        let started = Instant::now();
        while Instant::now() < self.until && log.picks.len() < self.max_picks {
            if let Some(rate) = self.rate
                && log.picks.len() as f64 > started.elapsed().as_secs_f64() * rate
            {
                tokio::time::sleep(Duration::from_millis(2)).await;
                continue;
            }
            let service = SERVICES[rng.usize(0..SERVICES.len())];
            let rule = RULES[rng.usize(0..RULES.len())];
            let version = if rng.u32(0..10) < 3 { "v2" } else { "" };
            let options = PickOptions::rule(rule.canonical()).version(version);
            let start = self.clock.now();
            let answer = if self.streamed {
                if stream.is_none() {
                    stream = Some(bounded("open a pick stream", open_stream(&mut client)).await?);
                }
                let pick = pick_streamed(stream.as_mut().expect("opened"), options.request(service));
                let answer = tokio::time::timeout(CALL_TIMEOUT, pick).await.unwrap_or_else(|_| Err(STALLED.into()));
                if answer.is_err() {
                    // A broken stream is replaced; the error is counted below.
                    stream = None;
                }
                answer
            } else {
                let pick = client.pick(service, options);
                match tokio::time::timeout(CALL_TIMEOUT, pick).await {
                    Ok(answer) => answer.map(client::Pick::into_response).map_err(|e| e.to_string()),
                    Err(_) => Err(STALLED.into()),
                }
            };
            let end = self.clock.now();
            let asked = (rule, self.universe.find_version(version));
            match answer.and_then(|response| self.recorded(service, asked, (start, end), response)) {
                Ok(pick) => {
                    log.picks.push(pick);
                    log.counts[usize::from(self.streamed)] += 1;
                }
                Err(error) => log.errors.add(|| format!("{service} {} version {version:?}: {error}", rule.canonical())),
            }
        }
        Ok(log)
    }

    fn recorded(
        &self,
        service: &str,
        (asked_rule, asked_version): (PickRule, u32),
        (start, end): (u64, u64),
        response: pb::PickResponse,
    ) -> Result<Pick, String> {
        let rule = PickRule::parse(&response.rule).ok_or_else(|| format!("unexpected rule {:?}", response.rule))?;
        let instance = response.instance.ok_or("a response without an instance")?;
        Ok(Pick {
            start,
            end,
            service: self.universe.find_service(service),
            instance: self.universe.find_instance(service, &instance.id).unwrap_or(UNKNOWN),
            version: self.universe.find_version(&instance.version),
            rule,
            ticket: response.ticket,
            asked_rule,
            asked_version,
            fallback: !response.fallback.is_empty(),
        })
    }
}

/// A pick given up on after [`CALL_TIMEOUT`].
const STALLED: &str = "no answer within 10 s";

async fn open_stream(client: &mut RotaClient) -> Result<PickStream, SoakError> {
    let (requests, rx) = mpsc::channel(1);
    let responses = client
        .balancer()
        .pick_stream(ReceiverStream::new(rx))
        .await
        .map_err(crate::client::ClientError::from)?
        .into_inner();
    Ok(PickStream { requests, responses })
}

async fn pick_streamed(stream: &mut PickStream, request: pb::PickRequest) -> Result<pb::PickResponse, String> {
    stream.requests.send(request).await.map_err(|_| "the pick stream ended".to_owned())?;
    match stream.responses.message().await {
        Ok(Some(pb::PickResponse { error: Some(error), .. })) => Err(format!("code {}: {}", error.code, error.message)),
        Ok(Some(response)) => Ok(response),
        Ok(None) => Err("the pick stream ended".into()),
        Err(status) => Err(status.to_string()),
    }
}
