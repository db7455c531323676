//! `rota bench --health-checks`: what active health checks of a large fleet cost rota.
//!
//! `rota serve` runs in its own process with `--health-instances` instances (default 10,000)
//! in one service, spread over 100 TCP listeners in this process that accept and close every
//! connection. Two phases of `--duration` each, measured the same way: without a health check,
//! then with `health_check = { kind = "tcp", interval = "1s" }` set through `SetPolicy` (once
//! every instance is checked). Each phase reports rota's CPU (from `/proc`), its resident
//! memory, the checks' rate (connections the listeners accepted) and concurrency
//! (`rota_health_checks_in_flight`, sampled every 100 ms), and the latency of back-to-back picks
//! from one caller beside them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::CliError;
use super::bench::{BenchArgs, resident_bytes, spawn_with_admin};
use crate::client::{PickOptions, RotaClient};
use crate::loadgen::process_cpu;
use crate::pb;

const LISTENERS: usize = 100;

pub async fn run(args: BenchArgs) -> Result<(), CliError> {
    let count = args.health_instances;
    let streams = (count.div_ceil(1000) + 2).to_string();
    let (server, endpoint, admin) = spawn_with_admin(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--max-registrations-per-peer",
        &streams,
    ])?;
    let pid = server.0.id();
    let accepted = Arc::new(AtomicU64::new(0));
    let mut ports = Vec::with_capacity(LISTENERS);
    for _ in 0..LISTENERS {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        ports.push(listener.local_addr()?.port());
        let accepted = accepted.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::Relaxed);
                drop(stream);
            }
        });
    }
    let service = format!("{}-health", args.service);
    let mut client = RotaClient::connect(&endpoint).await?;
    let instances: Vec<pb::Instance> = (0..count)
        .map(|i| pb::Instance {
            id: format!("checked-{i:05}"),
            service: service.clone(),
            host: "127.0.0.1".into(),
            port: u32::from(ports[i % LISTENERS]),
            ..Default::default()
        })
        .collect();
    let mut registrations = Vec::new();
    for chunk in instances.chunks(1000) {
        let registration = RotaClient::connect(&endpoint).await?.register(chunk.to_vec()).await?;
        registration.require_all_accepted()?;
        registrations.push(registration);
    }
    println!("health checks: {count} instances over {LISTENERS} listeners, {:?} per phase", args.duration);
    let without = phase(&args, &mut client, &service, pid, &admin, &accepted).await?;
    print_phase("no health check", &without);
    let check = pb::HealthCheck { kind: "tcp".into(), interval_ms: 1000, timeout_ms: 1000, ..Default::default() };
    client.set_policy(pb::Policy { service: service.clone(), health_check: Some(check), ..Default::default() }).await?;
    let started = Instant::now();
    while gauge(&admin, "rota_health_checked_instances").await? < count as f64 {
        if started.elapsed() > Duration::from_secs(60) {
            return Err(CliError::Usage("the instances were not all checked within 60 s".into()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // One interval, so every instance has had its first check.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let with = phase(&args, &mut client, &service, pid, &admin, &accepted).await?;
    print_phase("tcp check every 1s", &with);
    let failing = gauge(&admin, "rota_health_failing_instances").await?;
    println!("  instances failing their check at the end: {failing}");
    drop(registrations);
    Ok(())
}

struct Phase {
    cpu_share: f64,
    rss_mib: f64,
    checks_per_s: f64,
    in_flight_mean: f64,
    in_flight_max: f64,
    picks: usize,
    p50_ms: f64,
    p99_ms: f64,
}

fn print_phase(name: &str, p: &Phase) {
    println!(
        "  {name:<20} rota CPU {:>5.1} % of a core, RSS {:>6.1} MiB, checks {:>7.0}/s, in flight mean {:>5.1} max {:>4.0}, {} picks p50 {:.3} ms p99 {:.3} ms",
        p.cpu_share * 100.0,
        p.rss_mib,
        p.checks_per_s,
        p.in_flight_mean,
        p.in_flight_max,
        p.picks,
        p.p50_ms,
        p.p99_ms
    );
}

async fn phase(
    args: &BenchArgs,
    client: &mut RotaClient,
    service: &str,
    pid: u32,
    admin: &str,
    accepted: &AtomicU64,
) -> Result<Phase, CliError> {
    let cpu_before = process_cpu(pid).ok_or_else(|| CliError::Usage("rota's /proc entry is gone".into()))?;
    let accepted_before = accepted.load(Ordering::Relaxed);
    let started = Instant::now();
    let mut latencies = Vec::new();
    let (mut in_flight_sum, mut in_flight_max, mut samples) = (0.0, 0.0f64, 0u32);
    let mut next_sample = Instant::now();
    while started.elapsed() < args.duration {
        let t = Instant::now();
        client.pick(service, PickOptions::rule("round_robin")).await?;
        latencies.push(t.elapsed());
        if Instant::now() >= next_sample {
            let now = gauge(admin, "rota_health_checks_in_flight").await?;
            in_flight_sum += now;
            in_flight_max = in_flight_max.max(now);
            samples += 1;
            next_sample += Duration::from_millis(100);
        }
    }
    let wall = started.elapsed().as_secs_f64();
    let cpu = process_cpu(pid).ok_or_else(|| CliError::Usage("rota's /proc entry is gone".into()))? - cpu_before;
    latencies.sort_unstable();
    let at = |q: f64| latencies[((latencies.len() as f64 * q) as usize).min(latencies.len() - 1)].as_secs_f64() * 1e3;
    Ok(Phase {
        cpu_share: cpu.as_secs_f64() / wall,
        rss_mib: resident_bytes(pid).unwrap_or(0) as f64 / (1 << 20) as f64,
        checks_per_s: (accepted.load(Ordering::Relaxed) - accepted_before) as f64 / wall,
        in_flight_mean: if samples > 0 { in_flight_sum / f64::from(samples) } else { 0.0 },
        in_flight_max,
        picks: latencies.len(),
        p50_ms: at(0.5),
        p99_ms: at(0.99),
    })
}

/// One gauge of the admin listener's `/metrics`.
async fn gauge(admin: &str, name: &str) -> Result<f64, CliError> {
    let mut stream = tokio::net::TcpStream::connect(admin).await?;
    stream.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {admin}\r\n\r\n").as_bytes()).await?;
    let mut body = String::new();
    stream.read_to_string(&mut body).await?;
    body.lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .and_then(|value| value.trim().parse().ok())
        .ok_or_else(|| CliError::Usage(format!("{name} is not in rota's metrics")))
}
