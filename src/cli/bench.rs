//! `rota bench`: the load generator against a rota server (its own, spawned, by default).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use clap::Args;

use super::{CliError, parse_duration};
use crate::client::{Registration, RotaClient};
use crate::loadgen::{self, LoadConfig, Mode};
use crate::pb;

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Server to load; by default `rota bench` starts its own `rota serve` on a free port.
    #[arg(long)]
    pub server: Option<String>,
    /// Process id of the `--server` when it runs on this machine, to report its CPU time per
    /// request (a spawned server's is known).
    #[arg(long, requires = "server")]
    pub server_pid: Option<u32>,
    /// HTTP/2 connections.
    #[arg(long, default_value_t = 2)]
    pub connections: usize,
    /// Concurrent callers, spread over the connections.
    #[arg(long, default_value_t = 64)]
    pub callers: usize,
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Measuring window per mode.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Modes to run, in order: health, pick, stream, pipelined, lease:K, floor (a raw-bytes
    /// unary call, no protobuf, on a bare tonic server this command starts: what gRPC itself
    /// costs on this machine).
    #[arg(long, value_delimiter = ',', default_value = "health,pick,stream,pipelined", value_parser = Mode::parse)]
    pub modes: Vec<Mode>,
    /// Rounds of the modes: every even round runs them in reverse order, so each mode sees
    /// the machine early and late alike; the table takes each mode's windows together and
    /// prints the Pick / baseline ratio of every round.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub rounds: u32,
    /// Requests in flight per caller in pipelined mode.
    #[arg(long, default_value_t = 32)]
    pub window: usize,
    /// Instances registered for the benchmark service.
    #[arg(long, default_value_t = 3)]
    pub instances: usize,
    #[arg(long, default_value = "round_robin")]
    pub rule: String,
    /// The version every pick asks for; the bench's instances have none, so a version here
    /// measures the isolation fallback's answer.
    #[arg(long, default_value = "")]
    pub version: String,
    #[arg(long, default_value = "bench")]
    pub service: String,
    /// Scale run instead: register --scale-instances over --scale-streams into --scale-services,
    /// report registration time and server memory per instance, then picks with and without churn.
    #[arg(long)]
    pub scale: bool,
    #[arg(long, default_value_t = 100_000)]
    pub scale_instances: usize,
    #[arg(long, default_value_t = 1000)]
    pub scale_services: usize,
    #[arg(long, default_value_t = 100)]
    pub scale_streams: usize,
    /// With --scale: the churned picks first, before any pick built the rule's tables (then the
    /// quiet ones).
    #[arg(long)]
    pub scale_churn_first: bool,
    /// State backends run instead: unary Pick on memory, Redis exact and Redis with ticket
    /// blocks of 16 and 256 (ratios to memory, Redis commands per pick), then the time from a
    /// registration on one replica to its arrival on another.
    #[arg(long)]
    pub backends: bool,
    /// Publication run instead: the time from an Announce to its acknowledgement (the service
    /// published and its pick views in place) in services of 10,000 and 100,000 instances.
    #[arg(long)]
    pub publication: bool,
    /// xDS run instead: the time from a registration change to its assignment on every open
    /// ADS stream, with 1, 100 and 1,000 streams, and the server's memory per stream.
    #[arg(long)]
    pub xds: bool,
    /// Replica lag run instead: the time from a registration change on one replica to its
    /// arrival in a Watch on another, p50, p99 and max, with Redis 0, 100 and 200 ms of round
    /// trip away (a loopback proxy holding each chunk for half of it each way).
    #[arg(long)]
    pub replica_lag: bool,
    /// Health-check run instead: rota's CPU and memory, the checks' rate and concurrency, and
    /// pick latency, with `--health-instances` instances checked over TCP every second against
    /// the same without checks.
    #[arg(long)]
    pub health_checks: bool,
    /// Sources run instead: an etcd prefix followed by rota (Debian's `etcd` on free loopback
    /// ports): the time from a put in etcd to the instance in rota's Watch, p50 and p99, and
    /// rota's CPU and memory following 10,000 keys with one change a second.
    #[arg(long)]
    pub sources: bool,
    /// Instances of the --health-checks run.
    #[arg(long, default_value_t = 10_000)]
    pub health_instances: usize,
    /// Redis for --backends (`redis://HOST:PORT`, databases 1 to 5 are used); by default a
    /// `redis-server` is started on a free loopback port.
    #[arg(long, requires = "backends")]
    pub redis: Option<String>,
}

pub(super) struct Spawned(pub(super) Child);

/// Resident memory of a process, in bytes (Linux).
pub(super) fn resident_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `rota serve` on a free loopback port, allowing `streams` registration streams from
/// this one peer.
fn spawn_server(streams: usize) -> Result<(Spawned, String), CliError> {
    let streams = streams.max(64).to_string();
    spawn(&["serve", "--listen", "127.0.0.1:0", "--admin-listen", "off", "--max-registrations-per-peer", &streams])
}

/// Serves the floor: [`loadgen::floor::FloorService`] alone on a bare tonic server (no
/// protobuf, metrics, limits, interceptors or rota services), with Nagle off as rota's listener
/// has it. Prints `listening on ADDR` first, like `rota serve`.
pub async fn floor_server() -> Result<(), CliError> {
    use tonic::transport::server::TcpIncoming;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    println!("listening on {}", listener.local_addr()?);
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .add_service(loadgen::floor::FloorService)
        .serve_with_incoming(incoming)
        .await
        .map_err(|e| CliError::Usage(format!("floor server: {e}")))
}

/// Starts this binary with `args`, and reads the address from its first line.
pub(super) fn spawn(args: &[&str]) -> Result<(Spawned, String), CliError> {
    let (spawned, mut lines) = spawn_lines(args, 1)?;
    Ok((spawned, lines.remove(0)))
}

/// Starts `rota serve` with `args` and an admin listener: the gRPC endpoint and the admin
/// address (the first two lines it prints).
pub(super) fn spawn_with_admin(args: &[&str]) -> Result<(Spawned, String, String), CliError> {
    let (spawned, mut lines) = spawn_lines(args, 2)?;
    let admin = lines.remove(1);
    Ok((spawned, lines.remove(0), admin))
}

fn spawn_lines(args: &[&str], count: usize) -> Result<(Spawned, Vec<String>), CliError> {
    let exe = std::env::current_exe()?;
    // The benchmark registers before it picks: no start-up warm-up to wait out.
    let mut child = Command::new(exe)
        .args(args)
        .env("ROTA_WARMUP", "0s")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdout = child.stdout.take().ok_or_else(|| CliError::Usage("no stdout from rota serve".into()))?;
    let spawned = Spawned(child);
    let mut reader = BufReader::new(stdout);
    let mut lines = Vec::with_capacity(count);
    for prefix in ["listening on ", "admin on "].into_iter().take(count) {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let addr = line
            .trim()
            .strip_prefix(prefix)
            .ok_or_else(|| CliError::Usage(format!("unexpected line from rota {}: {line:?}", args[0])))?;
        lines.push(if prefix.starts_with("listening") { format!("http://{addr}") } else { addr.to_owned() });
    }
    Ok((spawned, lines))
}

/// Registers `count` instances, at most 1000 per stream.
pub(super) async fn register(endpoint: &str, service: &str, count: usize) -> Result<Vec<Registration>, CliError> {
    let mut registrations = Vec::new();
    let instances: Vec<pb::Instance> = (0..count)
        .map(|i| pb::Instance {
            id: format!("bench-{i:05}"),
            service: service.to_owned(),
            host: "127.0.0.1".into(),
            port: 10_000 + (i % 50_000) as u32,
            ..Default::default()
        })
        .collect();
    for chunk in instances.chunks(1000) {
        let mut client = RotaClient::connect(endpoint).await?;
        let registration = client.register(chunk.to_vec()).await?;
        registration.require_all_accepted()?;
        registrations.push(registration);
    }
    Ok(registrations)
}

pub async fn run(args: BenchArgs) -> Result<(), CliError> {
    if args.scale {
        return scale(args).await;
    }
    let (server, endpoint) = match &args.server {
        Some(server) => (None, server.clone()),
        None => {
            let (spawned, endpoint) = spawn_server(args.instances.div_ceil(1000))?;
            (Some(spawned), endpoint)
        }
    };
    let _registrations = register(&endpoint, &args.service, args.instances).await?;
    let server_pid = server.as_ref().map(|s| s.0.id()).or(args.server_pid);
    let config = load_config(&args, &endpoint, &args.service, server_pid);
    let failed = |e: loadgen::LoadError| CliError::Usage(e.to_string());
    let channels = loadgen::connect(&endpoint, args.connections).await.map_err(failed)?;
    // The floor runs in a process of its own, as the server does, loaded the same way.
    let floor = match args.modes.contains(&Mode::Floor) {
        true => {
            let (spawned, floor_endpoint) = spawn(&["floor-server"])?;
            let floor_channels = loadgen::connect(&floor_endpoint, args.connections).await.map_err(failed)?;
            let floor_config = LoadConfig { server_pid: Some(spawned.0.id()), ..config.clone() };
            Some((spawned, floor_channels, floor_config))
        }
        false => None,
    };
    eprintln!(
        "rota bench: {} callers over {} connections, {} instances, rule {}, {:?} warm-up + {:?} per mode, {} round(s)",
        args.callers, args.connections, args.instances, args.rule, args.warmup, args.duration, args.rounds
    );
    let mut results = Vec::new();
    for round in 0..args.rounds {
        for mode in round_order(&args.modes, round) {
            let (config, channels) = match (&floor, mode) {
                (Some((_, floor_channels, floor_config)), Mode::Floor) => (floor_config, floor_channels),
                _ => (&config, &channels),
            };
            let result = loadgen::run(config, channels, mode).await.map_err(failed)?;
            println!("{}", result.json());
            results.push(result);
        }
    }
    loadgen::print_table(&results);
    Ok(())
}

/// The load the arguments describe: picks of `service` under `--rule`.
pub(super) fn load_config(args: &BenchArgs, endpoint: &str, service: &str, server_pid: Option<u32>) -> LoadConfig {
    LoadConfig {
        endpoint: endpoint.to_owned(),
        connections: args.connections,
        callers: args.callers,
        warmup: args.warmup,
        duration: args.duration,
        window: args.window,
        // Every pick carries a key, so key-reading rules (`consistent_hash`, `sticky`) run too.
        request: pb::PickRequest {
            service: service.to_owned(),
            rule: args.rule.clone(),
            version: args.version.clone(),
            key: "bench-key".to_owned(),
            ..Default::default()
        },
        server_pid,
    }
}

/// The modes in the order round `round` runs them: as given, then reversed, alternately.
fn round_order(modes: &[Mode], round: u32) -> Vec<Mode> {
    let mut order = modes.to_vec();
    if round % 2 == 1 {
        order.reverse();
    }
    order
}

async fn scale(args: BenchArgs) -> Result<(), CliError> {
    use crate::loadgen::scale::{ScaleConfig, compare_churn, register_all};
    let (server, endpoint) = spawn_server(args.scale_streams)?;
    let pid = server.0.id();
    let before = resident_bytes(pid);
    let config = ScaleConfig {
        endpoint: endpoint.clone(),
        instances: args.scale_instances,
        services: args.scale_services,
        streams: args.scale_streams,
        load: load_config(&args, &endpoint, "scale-0000", Some(pid)),
    };
    let failed = |e: crate::loadgen::scale::ScaleError| CliError::Usage(e.to_string());
    let (mut registrations, took) = register_all(&config).await.map_err(failed)?;
    let after = resident_bytes(pid);
    let per_instance = match (before, after) {
        (Some(b), Some(a)) => format!("{:.0}", a.saturating_sub(b) as f64 / args.scale_instances as f64),
        _ => "null".into(),
    };
    println!(
        "{{\"scale\":\"register\",\"instances\":{},\"services\":{},\"streams\":{},\"seconds\":{:.3},\"rss_before\":{},\"rss_after\":{},\"bytes_per_instance\":{}}}",
        args.scale_instances,
        args.scale_services,
        args.scale_streams,
        took.as_secs_f64(),
        before.unwrap_or(0),
        after.unwrap_or(0),
        per_instance
    );
    let (quiet, churned, operations) =
        compare_churn(&config, &mut registrations, args.scale_churn_first).await.map_err(failed)?;
    let after_churn = resident_bytes(pid);
    println!("{}", quiet.json());
    println!("{}", churned.json());
    println!(
        "registered {} instances in {} services over {} streams in {:.2} s; server memory {} bytes per instance",
        args.scale_instances,
        args.scale_services,
        args.scale_streams,
        took.as_secs_f64(),
        per_instance
    );
    println!(
        "picks without churn: {:.0}/s, p99 {} µs; with churn ({} withdraw+announce of 100 instances{}): {:.0}/s, p99 {} µs, {} failed; server memory after {} MiB",
        quiet.throughput,
        quiet.p99_us,
        operations,
        if args.scale_churn_first { ", run first" } else { "" },
        churned.throughput,
        churned.p99_us,
        churned.errors,
        after_churn.map_or_else(|| "?".to_owned(), |b| (b >> 20).to_string())
    );
    drop(server);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_alternate_the_order_of_the_modes() {
        let modes = [Mode::Health, Mode::Pick, Mode::Lease(16)];
        let order: Vec<Vec<Mode>> = (0..3).map(|round| round_order(&modes, round)).collect();
        assert_eq!(
            order,
            [
                vec![Mode::Health, Mode::Pick, Mode::Lease(16)],
                vec![Mode::Lease(16), Mode::Pick, Mode::Health],
                vec![Mode::Health, Mode::Pick, Mode::Lease(16)],
            ]
        );
    }
}
