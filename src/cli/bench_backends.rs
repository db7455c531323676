//! `rota bench --backends`: unary Pick on each state backend in one run — memory, Redis exact,
//! Redis with ticket blocks of 16 and 256 — as ratios to memory, with the Redis commands each
//! pick cost; then the time from a registration on one replica to its arrival on another.

use std::time::{Duration, Instant};

use crate::client::RotaClient;
use crate::loadgen::{self, LoadResult, Mode};
use crate::pb::{self, register_request::Msg};

use super::CliError;
use super::bench::{BenchArgs, Spawned, load_config, register, spawn};
use super::redis_process::{query, start_redis};

fn usage(e: impl std::fmt::Display) -> CliError {
    CliError::Usage(e.to_string())
}

/// Commands the Redis server ran since its statistics were last reset.
async fn commands(url: &str) -> Result<u64, CliError> {
    let info: String = query(url, &["INFO", "commandstats"]).await.map_err(usage)?;
    Ok(info.lines().filter_map(|line| line.split_once("calls=")?.1.split(',').next()?.parse::<u64>().ok()).sum())
}

struct Backend {
    label: String,
    state: String,
    ticket_block: u32,
    server: Spawned,
    endpoint: String,
    results: Vec<LoadResult>,
    commands: u64,
}

pub async fn run(args: BenchArgs) -> Result<(), CliError> {
    let (_redis, base) = match &args.redis {
        Some(url) => (None, url.trim_end_matches('/').to_owned()),
        None => {
            let (process, url) =
                start_redis().await.map_err(|e| usage(format!("{e} (or give --redis URL of a running Redis)")))?;
            (Some(process), url)
        }
    };
    // Each Redis backend on its own database: their counters and tables stay apart.
    let plan = [("memory", "memory".to_owned(), 1), ("redis exact", format!("{base}/1"), 1)]
        .into_iter()
        .chain([16u32, 256].into_iter().enumerate().map(|(i, k)| ("redis", format!("{base}/{}", i + 2), k)));
    let mut backends = Vec::new();
    for (label, state, ticket_block) in plan {
        let label = if ticket_block > 1 { format!("{label} block {ticket_block}") } else { label.to_owned() };
        let block = ticket_block.to_string();
        let (server, endpoint) = spawn(&[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "off",
            "--state",
            &state,
            "--ticket-block",
            &block,
        ])?;
        backends.push(Backend { label, state, ticket_block, server, endpoint, results: Vec::new(), commands: 0 });
    }
    let mut held = Vec::new();
    for backend in &backends {
        held.push(register(&backend.endpoint, &args.service, args.instances).await?);
    }
    eprintln!(
        "rota bench --backends: unary Pick, {} callers over {} connections, {} instances, rule {}, {:?} warm-up + {:?} per window, {} round(s); Redis at {base}",
        args.callers, args.connections, args.instances, args.rule, args.warmup, args.duration, args.rounds
    );
    for round in 0..args.rounds {
        let order: Vec<usize> =
            if round % 2 == 0 { (0..backends.len()).collect() } else { (0..backends.len()).rev().collect() };
        for i in order {
            let backend = &mut backends[i];
            let config = load_config(&args, &backend.endpoint, &args.service, Some(backend.server.0.id()));
            let channels = loadgen::connect(&backend.endpoint, args.connections).await.map_err(usage)?;
            let redis_backend = backend.state != "memory";
            if redis_backend {
                query::<()>(&base, &["CONFIG", "RESETSTAT"]).await.map_err(usage)?;
            }
            let result = loadgen::run(&config, &channels, Mode::Pick).await.map_err(usage)?;
            if redis_backend {
                backend.commands += commands(&base).await?;
            }
            println!("{{\"backend\":\"{}\",\"result\":{}}}", backend.label, result.json());
            backend.results.push(result);
        }
    }
    print_backends(&backends);
    propagation(&base, &args).await?;
    drop(held);
    Ok(())
}

fn print_backends(backends: &[Backend]) {
    let memory = backends.first().map(|b| throughput(&b.results)).unwrap_or(0.0);
    println!(
        "{:<18} {:>12} {:>10} {:>9} {:>9} {:>14} {:>8}",
        "backend", "picks/s", "× memory", "p50 µs", "p99 µs", "commands/pick", "block"
    );
    for backend in backends {
        let combined = combine(&backend.results);
        let picks: u64 = backend.results.iter().map(|r| r.requests).sum();
        // Requests counted include the warm-up's; the commands do too (reset before each window).
        let per_pick = if backend.state == "memory" {
            "-".to_owned()
        } else {
            format!("{:.4}", backend.commands as f64 / picks.max(1) as f64)
        };
        println!(
            "{:<18} {:>12.0} {:>10.3} {:>9} {:>9} {:>14} {:>8}",
            backend.label,
            combined.throughput,
            combined.throughput / memory.max(f64::MIN_POSITIVE),
            combined.p50_us,
            combined.p99_us,
            per_pick,
            backend.ticket_block
        );
    }
}

fn combine(results: &[LoadResult]) -> LoadResult {
    loadgen::combine_windows(results).expect("every backend ran at least one window")
}

fn throughput(results: &[LoadResult]) -> f64 {
    combine(results).throughput
}

/// Registers instances one at a time on one replica and times their arrival on a Watch of
/// another: p50 and p99 over 100 registrations.
async fn propagation(base: &str, args: &BenchArgs) -> Result<(), CliError> {
    let state = format!("{base}/5");
    let serve = |state: &str| spawn(&["serve", "--listen", "127.0.0.1:0", "--admin-listen", "off", "--state", state]);
    let (_one, first) = serve(&state)?;
    let (_two, second) = serve(&state)?;
    let service = format!("{}-propagation", args.service);
    let mut watcher = RotaClient::connect(&second).await?;
    // The service must exist on the second replica before it can be watched.
    let _seed = register(&second, &service, 1).await?;
    let mut events = watcher.watch(&service).await?;
    let mut provider = RotaClient::connect(&first).await?;
    let probe = |n: u32| pb::Instance {
        id: format!("probe-{n:03}"),
        service: service.clone(),
        host: "127.0.0.1".into(),
        port: 20_000 + n,
        ..Default::default()
    };
    // One stream announces every probe, one at a time.
    let mut registration = provider.register(vec![probe(0)]).await?;
    registration.require_all_accepted()?;
    let mut delays = Vec::new();
    for n in 1..=100 {
        // A random pause first: registrations arrive at any moment of the other replica's poll
        // (back to back, each would land just after the poll that saw the one before).
        tokio::time::sleep(Duration::from_millis(fastrand::u64(0..250))).await;
        let id = format!("probe-{n:03}");
        let ack = registration.send(Msg::Announce(pb::Announce { instances: vec![probe(n)] })).await?;
        let acked = Instant::now();
        if !ack.refused.is_empty() {
            return Err(usage(format!("{id} refused: {:?}", ack.refused)));
        }
        let arrived = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(event) = events.message().await? {
                if let Some(pb::watch_event::Event::Added(added)) = event.event
                    && added.id == id
                {
                    return Ok(Instant::now());
                }
            }
            Err(tonic::Status::unavailable("watch ended"))
        })
        .await
        .map_err(|_| usage(format!("{id} did not reach the second replica within 10 s")))?
        .map_err(usage)?;
        delays.push(arrived.duration_since(acked));
    }
    delays.sort_unstable();
    let at = |q: f64| delays[((delays.len() as f64 * q) as usize).min(delays.len() - 1)];
    println!(
        "registration on replica 1 → Watch on replica 2: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms over {} registrations",
        at(0.5).as_secs_f64() * 1e3,
        at(0.99).as_secs_f64() * 1e3,
        delays.last().map_or(0.0, |d| d.as_secs_f64() * 1e3),
        delays.len()
    );
    Ok(())
}
