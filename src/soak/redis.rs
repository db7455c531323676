//! Scenario `redis`: replicas sharing their rule state through a real `redis-server`, under two
//! faults of that Redis, while consumers pick across the replicas.
//!
//! **Phase 1, Redis restarted empty.** One `redis-server` without persistence, three `rota
//! serve --state redis://…` replicas on it. A provider on each replica registers two instances
//! in each of two services, so every replica holds some of every service and serves the rest
//! from the others. Consumers pick under `round_robin` and `repeat(n=3)` (unary `Pick`), each
//! pick on the next replica in turn, recording every answer's rule and ticket. Now and then
//! Redis is killed (SIGKILL: it saves nothing); once every replica reports the link down
//! (`rota_state_backend_up` 0), Redis stays away for a moment and a fresh, empty
//! `redis-server` starts on the same port. The restart counts as recovered when every replica
//! reports the link up again and every replica has written its instances back into the new
//! Redis (its entry in each service's holders set, with all its instances). Picks go on
//! throughout. Checks: (a) what `state::redis::tickets` promises: no replica repeated a ticket
//! of its own, and no two picks repeated one with neither overlapping an outage (a replica cut
//! off answers from its local counter, which other replicas' draws may have passed: those
//! repeats are counted as a figure); (b) no pick failed — rota answers from local state while Redis is away, and an
//! `UNAVAILABLE` "no UP instance" is a failure; (c) after every restart, every registered
//! instance was picked again.
//!
//! **Phase 2, Redis far away.** Two replicas reach a fresh Redis through an in-process proxy
//! (`soak/proxy.rs`), which holds every chunk for a set latency each way (short: 100 ms, long: 150 ms), with
//! `--state-timeout` at its default (500 ms). Consumers pick across both replicas for a
//! while. Checks: no ticket repeated; the link stayed up (`rota_state_backend_up`, read from
//! each replica's `/metrics` before, every 100 ms during, and after the picks — rota exports
//! no counter of outages, so an outage shorter than a sample could pass unseen; one lasts at
//! least a reconnection, several round trips); no pick failed.
//!
//! Every replica is this binary's `rota serve` on 127.0.0.1:0; Redis and the proxy listen on
//! free loopback ports. Every wait is for a condition, bounded in time; the pauses are the
//! workload's own pacing (how long picks run between faults, how long Redis stays away).

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;

use super::proxy::LatencyProxy;
use super::{CALL_TIMEOUT, Check, ScenarioReport, SoakError, SoakOptions, Target, bounded, ms};
use crate::cli::redis_process::{RedisProcess, query, start_redis, start_redis_on};
use crate::client::{PickOptions, Registration, RotaClient};
use crate::pb;

const RULES: [&str; 2] = ["round_robin", "repeat(n=3)"];
/// Instances each replica's provider registers in each service.
const PER_REPLICA: usize = 2;
/// The longest a replica may take to start, to bring its link up, to see every instance, or to
/// come back after Redis did.
const PATIENCE: Duration = Duration::from_secs(30);
/// How often a condition on the replicas or on Redis is looked at while waiting for it.
const POLL: Duration = Duration::from_millis(50);
/// How often phase 2 samples each replica's link gauge.
const SAMPLE: Duration = Duration::from_millis(100);

struct Sizing {
    /// Phase 1: picks before the first fault, between faults and after the last.
    between: Duration,
    restarts: usize,
    /// How long Redis stays away once every replica has seen it go.
    away: Duration,
    consumers: usize,
    /// Phase 2: the proxy's latency each way, and how long picks run through it.
    latency: Duration,
    far_window: Duration,
    far_consumers: usize,
    /// Bounds each consumer's history.
    max_picks: usize,
}

pub async fn run(options: &SoakOptions, report: &mut ScenarioReport) -> Result<(), SoakError> {
    let sizing = Sizing {
        between: options.pick(Duration::from_secs(4), Duration::from_secs(20)),
        restarts: options.pick(2, 5),
        away: options.pick(Duration::from_secs(1), Duration::from_secs(3)),
        consumers: 3,
        latency: options.pick(Duration::from_millis(100), Duration::from_millis(150)),
        far_window: options.pick(Duration::from_secs(12), Duration::from_secs(90)),
        far_consumers: options.pick(4, 8),
        max_picks: options.pick(200_000, 1_000_000),
    };
    if options.server.is_some() {
        report.notice("this scenario starts its own replicas and Redis; --server is not used");
    }
    if !on_path("redis-server") {
        return Err(SoakError::Setup(
            "redis-server is not on PATH: the redis scenario needs it (scripts/install-redis.sh installs it)".into(),
        ));
    }
    restarted(&sizing, report).await?;
    far(&sizing, report).await
}

/// Whether an executable `name` is in a directory of `PATH`.
fn on_path(name: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(name).is_file()))
}

fn setup(error: impl std::fmt::Display) -> SoakError {
    SoakError::Setup(error.to_string())
}

// ---- replicas ----

/// One `rota serve` whose state lives in Redis, and its admin address.
struct Replica {
    target: Target,
    admin: String,
}

impl Replica {
    /// Starts a replica on `state` (off the runtime: the start blocks on the child's output).
    async fn spawn(state: &str) -> Result<Self, SoakError> {
        let flags = vec!["--state".to_owned(), state.to_owned()];
        let target = tokio::task::spawn_blocking(move || Target::spawn(&flags, "http")).await.map_err(setup)??;
        let admin =
            target.admin.clone().ok_or_else(|| SoakError::Server("rota serve printed no admin address".into()))?;
        Ok(Self { target, admin })
    }

    /// `rota_state_backend_up` and `rota_state_data_losses_total` from `/metrics`.
    async fn link(&self) -> Result<LinkGauge, SoakError> {
        let metrics = bounded("GET /metrics", get_metrics(&self.admin)).await?;
        let value = |prefix: &str| {
            metrics.lines().find_map(|line| line.strip_prefix(prefix)).and_then(|rest| rest.trim().parse::<u64>().ok())
        };
        let up = value("rota_state_backend_up{backend=\"redis\"} ")
            .ok_or_else(|| SoakError::Server("no rota_state_backend_up{backend=\"redis\"} in /metrics".into()))?;
        Ok(LinkGauge { up: up == 1, losses: value("rota_state_data_losses_total ").unwrap_or(0) })
    }
}

#[derive(Debug, Clone, Copy)]
struct LinkGauge {
    up: bool,
    losses: u64,
}

/// `GET /metrics` over HTTP/1.0 (the admin listener closes after the response): the body.
async fn get_metrics(admin: &str) -> Result<String, SoakError> {
    let io = |e: std::io::Error| SoakError::Server(format!("GET http://{admin}/metrics: {e}"));
    let mut stream = tokio::net::TcpStream::connect(admin).await.map_err(io)?;
    stream.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {admin}\r\n\r\n").as_bytes()).await.map_err(io)?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.map_err(io)?;
    match response.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200") => {
            Ok(body.to_owned())
        }
        _ => Err(SoakError::Server(format!(
            "GET http://{admin}/metrics: {}",
            response.lines().next().unwrap_or("no answer")
        ))),
    }
}

/// Waits until every replica's link is `up` (or down), for at most [`PATIENCE`].
async fn wait_links(replicas: &[Replica], up: bool) -> Result<(), SoakError> {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let mut all = true;
        for replica in replicas {
            all &= replica.link().await?.up == up;
        }
        if all {
            return Ok(());
        }
        if Instant::now() >= deadline {
            let state = if up { "up" } else { "down" };
            return Err(SoakError::Stalled(format!("not every replica reported its Redis link {state} within 30 s")));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The instances replica `r` registers: `PER_REPLICA` in each of `services`.
fn instances_of(r: usize, services: &[&str]) -> Vec<pb::Instance> {
    let mut instances = Vec::new();
    for (s, service) in services.iter().enumerate() {
        for j in 0..PER_REPLICA {
            instances.push(pb::Instance {
                id: format!("r{r}-{j}"),
                service: (*service).into(),
                host: "127.0.0.1".into(),
                port: 20_000 + (s * 100 + r * 10 + j) as u32,
                ..Default::default()
            });
        }
    }
    instances
}

/// One provider per replica, each registering its instances there; returned once every replica
/// lists every instance of every service.
async fn register(replicas: &[Replica], services: &[&str]) -> Result<Vec<Registration>, SoakError> {
    let mut held = Vec::new();
    for (r, replica) in replicas.iter().enumerate() {
        let mut client = bounded("connect", RotaClient::connect(&replica.target.endpoint)).await?;
        let registration = bounded("register", client.register(instances_of(r, services))).await?;
        registration.require_all_accepted()?;
        held.push(registration);
    }
    let deadline = Instant::now() + PATIENCE;
    for replica in replicas {
        let mut client = bounded("connect", RotaClient::connect(&replica.target.endpoint)).await?;
        for service in services {
            loop {
                let listed = bounded("list instances", client.list_instances(service)).await?.instances;
                if listed.len() == replicas.len() * PER_REPLICA {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(SoakError::Stalled(format!(
                        "replica {} lists {} of the {} instances of {service} after 30 s",
                        replica.target.addr,
                        listed.len(),
                        replicas.len() * PER_REPLICA
                    )));
                }
                tokio::time::sleep(POLL).await;
            }
        }
    }
    Ok(held)
}

/// Whether every replica of the fleet (`replicas` of them) has written all its instances of
/// every service into the Redis at `url`.
async fn written_back(url: &str, services: &[&str], replicas: usize) -> bool {
    for service in services {
        let holders: Vec<String> =
            query(url, &["SMEMBERS", &format!("rota:{{{service}}}:holders")]).await.unwrap_or_default();
        if holders.len() != replicas {
            return false;
        }
        for holder in &holders {
            let key = format!("rota:{{{service}}}:instances:{holder}");
            if query::<u64>(url, &["HLEN", &key]).await.unwrap_or(0) < PER_REPLICA as u64 {
                return false;
            }
        }
    }
    true
}

// ---- consumers ----

/// One answered pick.
struct Picked {
    /// Sent and answered, since the phase started.
    at: Duration,
    end: Duration,
    replica: usize,
    service: usize,
    rule: String,
    ticket: u64,
    id: String,
}

#[derive(Default)]
struct ConsumerLog {
    picks: Vec<Picked>,
    failed: u64,
    /// The first few failures, described.
    failures: Vec<String>,
}

impl ConsumerLog {
    fn merge(&mut self, other: ConsumerLog) {
        self.picks.extend(other.picks);
        self.failed += other.failed;
        let room = 5usize.saturating_sub(self.failures.len());
        self.failures.extend(other.failures.into_iter().take(room));
    }
}

/// Picks until `stop` (or the deadline, or `max_picks`), each pick on the next replica in turn.
struct Consumer {
    endpoints: Vec<String>,
    services: Vec<String>,
    seed: u64,
    started: Instant,
    stop: Arc<AtomicBool>,
    until: Instant,
    max_picks: usize,
}

impl Consumer {
    async fn run(self) -> Result<ConsumerLog, SoakError> {
        let mut rng = fastrand::Rng::with_seed(self.seed);
        let mut clients = Vec::new();
        for endpoint in &self.endpoints {
            // The soak judges a slow pick against its own CALL_TIMEOUT; the client deadline lies beyond it.
            clients.push(bounded("connect", RotaClient::connect(endpoint)).await?.with_pick_timeout(2 * CALL_TIMEOUT));
        }
        let mut log = ConsumerLog::default();
        let mut next = rng.usize(0..clients.len());
        let mut sent = 0usize;
        while !self.stop.load(Ordering::Relaxed) && Instant::now() < self.until && sent < self.max_picks {
            sent += 1;
            let replica = next;
            next = (next + 1) % clients.len();
            let service = rng.usize(0..self.services.len());
            let rule = RULES[rng.usize(0..RULES.len())];
            let at = self.started.elapsed();
            let pick = clients[replica].pick(&self.services[service], PickOptions::rule(rule));
            let answer = match tokio::time::timeout(CALL_TIMEOUT, pick).await {
                Ok(Ok(pick)) if pick.local_fallback => Err("answered by the client's local fallback".to_owned()),
                Ok(Ok(pick)) => {
                    let response = pick.into_response();
                    match response.instance {
                        Some(instance) => Ok((response.rule, response.ticket, instance.id)),
                        None => Err("an answer without an instance".to_owned()),
                    }
                }
                Ok(Err(error)) => Err(error.to_string()),
                Err(_) => Err("no answer within 10 s".to_owned()),
            };
            match answer {
                Ok((rule, ticket, id)) => {
                    let end = self.started.elapsed();
                    log.picks.push(Picked { at, end, replica, service, rule, ticket, id });
                }
                Err(error) => {
                    log.failed += 1;
                    if log.failures.len() < 5 {
                        log.failures.push(format!(
                            "{} {rule} on replica {replica} at {:.2} s: {error}",
                            self.services[service],
                            at.as_secs_f64()
                        ));
                    }
                }
            }
        }
        Ok(log)
    }
}

/// How a phase's consumers pick: how many, seeded from `seed`, until `stop`, `until` or
/// `max_picks` each, with times taken from `started`.
struct Plan {
    count: usize,
    seed: u64,
    started: Instant,
    stop: Arc<AtomicBool>,
    until: Instant,
    max_picks: usize,
}

/// Runs the plan's consumers over `replicas`; the handles give their logs.
fn start_consumers(
    replicas: &[Replica],
    services: &[&str],
    plan: &Plan,
) -> Vec<tokio::task::JoinHandle<Result<ConsumerLog, SoakError>>> {
    (0..plan.count)
        .map(|i| {
            let consumer = Consumer {
                endpoints: replicas.iter().map(|r| r.target.endpoint.clone()).collect(),
                services: services.iter().map(|s| (*s).to_owned()).collect(),
                seed: plan.seed + i as u64,
                started: plan.started,
                stop: plan.stop.clone(),
                until: plan.until,
                max_picks: plan.max_picks,
            };
            tokio::spawn(consumer.run())
        })
        .collect()
}

async fn join_consumers(
    consumers: Vec<tokio::task::JoinHandle<Result<ConsumerLog, SoakError>>>,
) -> Result<ConsumerLog, SoakError> {
    let mut log = ConsumerLog::default();
    for consumer in consumers {
        log.merge(consumer.await.map_err(setup)??);
    }
    Ok(log)
}

/// Pairs of picks of the same rotation (service, rule) that drew the same ticket (consecutive
/// in ticket order: a ticket drawn three times is two pairs).
fn repeated_pairs(picks: &[Picked]) -> Vec<(&Picked, &Picked)> {
    let mut order: Vec<usize> = (0..picks.len()).collect();
    let key = |p: &Picked| (p.service, p.rule.clone(), p.ticket);
    order.sort_unstable_by_key(|&i| key(&picks[i]));
    order
        .windows(2)
        .map(|pair| (&picks[pair[0]], &picks[pair[1]]))
        .filter(|(first, second)| key(first) == key(second))
        .collect()
}

/// How many picks drew a ticket another pick of the same rotation drew too, and the first few
/// pairs described (`when` tells when a pick was made).
fn repeated(picks: &[Picked], services: &[&str], when: impl Fn(&Picked) -> String) -> (usize, Vec<String>) {
    let pairs = repeated_pairs(picks);
    let describe = |p: &Picked| format!("replica {} {}", p.replica, when(p));
    let examples = pairs
        .iter()
        .take(5)
        .map(|(first, second)| {
            let rotation = format!("{} {}", services[first.service], first.rule);
            format!("{rotation} ticket {}: {} and {}", first.ticket, describe(first), describe(second))
        })
        .collect();
    (pairs.len(), examples)
}

/// A pick's span, sent to answered, in seconds since the phase started.
fn span(p: &Picked) -> String {
    format!("{:.3}–{:.3} s", p.at.as_secs_f64(), p.end.as_secs_f64())
}

fn failures_check(log: &ConsumerLog) -> Check {
    let total = log.picks.len() as u64 + log.failed;
    Check::new(
        "no pick failed",
        log.failed == 0 && !log.picks.is_empty(),
        match log.failed {
            0 if log.picks.is_empty() => "no pick was made".to_owned(),
            0 => format!("0 failed of {total}"),
            n => format!("{n} failed of {total}; first: {}", log.failures.join("\n      ")),
        },
    )
}

// ---- phase 1 ----

/// One kill and restart of Redis, since the phase started.
struct Restart {
    killed: Duration,
    /// Every replica reported the link down.
    all_down: Duration,
    /// The new Redis answered `PING`.
    back: Duration,
    /// Every replica reported the link up and had written its instances back.
    recovered: Duration,
}

async fn restarted(sizing: &Sizing, report: &mut ScenarioReport) -> Result<(), SoakError> {
    let services = ["soak-redis-a", "soak-redis-b"];
    let (redis, url) = start_redis().await.map_err(setup)?;
    let port = redis.port();
    let mut redis: Option<RedisProcess> = Some(redis);
    let mut replicas = Vec::new();
    for _ in 0..3 {
        replicas.push(Replica::spawn(&url).await?);
    }
    wait_links(&replicas, true).await?;
    let registrations = register(&replicas, &services).await?;
    let registered: BTreeSet<(usize, String)> = (0..replicas.len())
        .flat_map(|r| instances_of(r, &services))
        .map(|i| (services.iter().position(|s| *s == i.service).expect("one of ours"), i.id))
        .collect();

    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    // The phase's own length, with room for every restart's waits; the consumers stop earlier.
    let budget = sizing.between * (sizing.restarts as u32 + 1) + (sizing.away + 3 * PATIENCE) * sizing.restarts as u32;
    let plan = Plan {
        count: sizing.consumers,
        seed: 0x4ed1,
        started,
        stop: stop.clone(),
        until: started + budget,
        max_picks: sizing.max_picks,
    };
    let consumers = start_consumers(&replicas, &services, &plan);
    let mut restarts = Vec::new();
    let outcome: Result<(), SoakError> = async {
        for _ in 0..sizing.restarts {
            tokio::time::sleep(sizing.between).await;
            let killed = started.elapsed();
            if let Some(old) = redis.take() {
                old.kill().await;
            }
            wait_links(&replicas, false).await?;
            let all_down = started.elapsed();
            // Redis stays away a moment: picks are answered from each replica's local state.
            tokio::time::sleep(sizing.away).await;
            let (fresh, _) = start_redis_on(port).await.map_err(setup)?;
            redis = Some(fresh);
            let back = started.elapsed();
            let deadline = Instant::now() + PATIENCE;
            loop {
                let mut up = true;
                for replica in &replicas {
                    up &= replica.link().await?.up;
                }
                if up && written_back(&url, &services, replicas.len()).await {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(SoakError::Stalled(
                        "the replicas did not all reconnect and write their instances back within 30 s of Redis's restart"
                            .into(),
                    ));
                }
                tokio::time::sleep(POLL).await;
            }
            restarts.push(Restart { killed, all_down, back, recovered: started.elapsed() });
        }
        tokio::time::sleep(sizing.between).await;
        Ok(())
    }
    .await;
    stop.store(true, Ordering::Relaxed);
    let log = join_consumers(consumers).await?;
    let elapsed = started.elapsed();
    outcome?;
    let mut losses = 0;
    for replica in &replicas {
        losses += replica.link().await?.losses;
    }
    drop(registrations);

    let picks = log.picks.len();
    report.figure(
        "phase 1 picks",
        format!(
            "{picks} over 3 replicas in {:.1} s ({:.0}/s)",
            elapsed.as_secs_f64(),
            picks as f64 / elapsed.as_secs_f64()
        ),
    );
    let during = |p: &Picked| restarts.iter().any(|r| p.end >= r.killed && p.at < r.recovered);
    report.figure("phase 1 picks while Redis was out", log.picks.iter().filter(|p| during(p)).count());
    report.figure("Redis restarts", restarts.len());
    let away: Vec<String> = restarts.iter().map(|r| ms(r.all_down - r.killed)).collect();
    report.figure("kill → every link down", away.join(", "));
    let recover: Vec<String> = restarts.iter().map(|r| ms(r.recovered - r.back)).collect();
    report.figure("Redis back → all reconnected", recover.join(", "));
    let worst = restarts.iter().map(|r| r.recovered - r.back).max().unwrap_or_default();
    report.figure("data losses found (all replicas)", losses);

    // A pick overlapping an outage (from the kill until every replica was back) may have been
    // answered from a replica's local state.
    let outage = |p: &Picked| restarts.iter().position(|r| p.end >= r.killed && p.at < r.recovered);
    let when = |p: &Picked| match outage(p) {
        Some(i) => format!("{} (restart {})", span(p), i + 1),
        None => span(p),
    };
    let (count, examples) = repeated(&log.picks, &services, when);
    let pairs = repeated_pairs(&log.picks);
    // A replica's local counter stands where its own last draw left it, below tickets other
    // replicas drew just before the kill: a repeat with one side before the outage is of the
    // same kind. Neither side near an outage would be a repeat on a working link.
    let outside = pairs.iter().filter(|(a, b)| outage(a).is_none() && outage(b).is_none()).count();
    let same_replica = pairs.iter().filter(|(a, b)| a.replica == b.replica).count();
    report.figure("phase 1 repeats away from outages", outside);
    report.figure("phase 1 repeats on one replica", same_replica);
    report.figure("phase 1 repeated tickets", count);
    report.figure("phase 1 failed picks", log.failed);
    // While Redis is away each replica draws from its own counter, so replicas may repeat one
    // another's tickets of that outage (docs/deploy.md): a figure, not a check.
    if count > 0 {
        report.figure("phase 1 first repeats", examples.join("\n      "));
    }
    // What src/state/redis/tickets.rs promises: a replica never repeats a ticket of its own,
    // a repeat across replicas needs an outage, and none given out before a restart comes back.
    report.check(Check::new(
        "(a) no ticket repeated by one replica, nor away from an outage",
        same_replica == 0 && outside == 0,
        format!(
            "{same_replica} repeats by one replica, {outside} with neither pick overlapping an outage (of {count} repeats)"
        ),
    ));
    let mut failed = failures_check(&log);
    failed.name = "(b) no pick failed while Redis was killed and restarted".into();
    report.check(failed);
    let mut missing = Vec::new();
    for (i, restart) in restarts.iter().enumerate() {
        let end = restarts.get(i + 1).map_or(elapsed, |next| next.killed);
        let seen: BTreeSet<(usize, String)> = log
            .picks
            .iter()
            .filter(|p| p.at >= restart.recovered && p.at < end)
            .map(|p| (p.service, p.id.clone()))
            .collect();
        let absent: Vec<String> =
            registered.difference(&seen).map(|(s, id)| format!("{}/{id}", services[*s])).collect();
        if !absent.is_empty() {
            missing.push(format!("after restart {}: {}", i + 1, absent.join(", ")));
        }
    }
    report.check(Check::new(
        "(c) every instance picked again after each restart",
        missing.is_empty() && restarts.len() == sizing.restarts,
        if missing.is_empty() {
            format!(
                "all {} instances (registered over 3 replicas) picked after each of {} restarts",
                registered.len(),
                restarts.len()
            )
        } else {
            format!("never picked: {}", missing.join("; "))
        },
    ));
    alive(report, &mut replicas, "phase 1");
    report.key = format!(
        "{picks} picks, {} Redis restarts, recovered in ≤ {}, {count} repeated tickets, {} failed",
        restarts.len(),
        ms(worst),
        log.failed
    );
    // The replicas go first, so none sees its Redis vanish.
    drop(replicas);
    drop(redis);
    Ok(())
}

/// A check that every replica outlived the phase.
fn alive(report: &mut ScenarioReport, replicas: &mut [Replica], phase: &str) {
    let exited: Vec<String> = replicas
        .iter_mut()
        .enumerate()
        .filter_map(|(i, r)| (r.target.alive() == Some(false)).then(|| format!("replica {i}")))
        .collect();
    report.check(Check::new(
        format!("{phase}: replicas alive"),
        exited.is_empty(),
        if exited.is_empty() {
            format!("all {} still running", replicas.len())
        } else {
            format!("exited: {}", exited.join(", "))
        },
    ));
}

// ---- phase 2 ----

/// What the sampler saw of each replica's link gauge.
#[derive(Default)]
struct Samples {
    taken: u64,
    /// Samples that found a link down: (replica, time since the phase started).
    down: Vec<(usize, Duration)>,
}

async fn far(sizing: &Sizing, report: &mut ScenarioReport) -> Result<(), SoakError> {
    let services = ["soak-redis-far"];
    let (redis, _) = start_redis().await.map_err(setup)?;
    let proxy = LatencyProxy::start(redis.port(), sizing.latency).await?;
    let url = format!("redis://127.0.0.1:{}", proxy.port);
    let mut replicas = Vec::new();
    for _ in 0..2 {
        replicas.push(Replica::spawn(&url).await?);
    }
    let started = Instant::now();
    wait_links(&replicas, true).await?;
    let replicas = Arc::new(replicas);

    // From the links' first coming up to the end, every sample must find them up.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (replicas, stop) = (replicas.clone(), stop.clone());
        // Bounded by the window's own length and its setup's waits.
        let until = Instant::now() + sizing.far_window + 3 * PATIENCE;
        tokio::spawn(async move {
            let mut samples = Samples::default();
            while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                for (i, replica) in replicas.iter().enumerate() {
                    let gauge = replica.link().await?;
                    samples.taken += 1;
                    if !gauge.up {
                        samples.down.push((i, started.elapsed()));
                    }
                }
                tokio::time::sleep(SAMPLE).await;
            }
            Ok::<_, SoakError>(samples)
        })
    };
    let outcome: Result<_, SoakError> = async {
        let registrations = register(&replicas, &services).await?;
        let mut before = Vec::new();
        for replica in replicas.iter() {
            before.push(replica.link().await?);
        }
        let picking = Instant::now();
        let plan = Plan {
            count: sizing.far_consumers,
            seed: 0xfa4,
            started,
            // The window's end stops them.
            stop: Arc::new(AtomicBool::new(false)),
            until: picking + sizing.far_window,
            max_picks: sizing.max_picks,
        };
        let consumers = start_consumers(&replicas, &services, &plan);
        let log = join_consumers(consumers).await?;
        let window = picking.elapsed();
        let mut after = Vec::new();
        for replica in replicas.iter() {
            after.push(replica.link().await?);
        }
        drop(registrations);
        Ok((before, after, log, window))
    }
    .await;
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.await.map_err(setup)??;
    let (before, after, log, window) = outcome?;

    let picks = log.picks.len();
    report.figure("phase 2 Redis latency each way", ms(sizing.latency));
    report.figure(
        "phase 2 picks",
        format!(
            "{picks} over 2 replicas in {:.1} s ({:.1}/s)",
            window.as_secs_f64(),
            picks as f64 / window.as_secs_f64()
        ),
    );
    let (count, examples) = repeated(&log.picks, &services, span);
    report.figure("phase 2 repeated tickets", count);
    report.figure("phase 2 failed picks", log.failed);
    report.figure("phase 2 link samples (down)", format!("{} ({})", samples.taken, samples.down.len()));
    report.check(Check::new(
        "phase 2: no ticket handed out twice through the slow link",
        count == 0 && picks > 0,
        match count {
            0 => format!("0 repeated among {picks} picks"),
            n => format!("{n} repeated among {picks} picks; first: {}", examples.join("\n      ")),
        },
    ));
    let up = |gauges: &[LinkGauge]| gauges.iter().all(|g| g.up);
    let stayed = up(&before) && up(&after) && samples.down.is_empty() && samples.taken > 0;
    report.check(Check::new(
        "phase 2: the link stayed up",
        stayed,
        if stayed {
            format!(
                "rota_state_backend_up 1 on both replicas before and after the picks and in all {} samples (every {})",
                samples.taken,
                ms(SAMPLE)
            )
        } else {
            let show =
                |gauges: &[LinkGauge]| gauges.iter().map(|g| u8::from(g.up).to_string()).collect::<Vec<_>>().join("/");
            let first: Vec<String> = samples
                .down
                .iter()
                .take(5)
                .map(|(i, at)| format!("replica {i} at {:.2} s", at.as_secs_f64()))
                .collect();
            format!(
                "rota_state_backend_up before {}, after {}; {} of {} samples down (first: {})",
                show(&before),
                show(&after),
                samples.down.len(),
                samples.taken,
                first.join(", ")
            )
        },
    ));
    let mut failed = failures_check(&log);
    failed.name = "phase 2: no pick failed through the slow link".into();
    report.check(failed);
    let mut replicas = Arc::try_unwrap(replicas).map_err(|_| setup("the sampler still holds the replicas"))?;
    alive(report, &mut replicas, "phase 2");
    report.key.push_str(&format!(
        "; {} away: {picks} picks, link down in {} samples",
        ms(sizing.latency),
        samples.down.len()
    ));
    // The replicas go first, so none sees its Redis vanish.
    drop(replicas);
    drop(proxy);
    drop(redis);
    Ok(())
}
