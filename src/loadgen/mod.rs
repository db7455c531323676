//! A load generator for a running rota server: N concurrent callers over C HTTP/2 connections,
//! a warm-up, then a fixed measuring window; latencies go into HDR histograms.
//!
//! The modes compare rota's work with the gRPC round trip it rides on, in one run on the same
//! connections:
//!
//! - `health` — `grpc.health.v1.Health/Check`, an RPC that does no real work: the baseline;
//! - `pick` — unary `Balancer/Pick`;
//! - `stream` — `Balancer/PickStream`, one request in flight per caller (ping-pong);
//! - `pipelined` — `Balancer/PickStream` with `window` requests in flight per caller;
//! - `lease:K` — picks through the Rust client's [`LeasedPicker`](crate::client::LeasedPicker),
//!   one `Lease` round trip per K picks;
//! - `floor` — a unary call of raw bytes on a bare tonic server of its own ([`floor`]): the
//!   gRPC round trip with nothing on top.

pub mod floor;
mod report;
pub mod scale;

use std::collections::VecDeque;
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

use crate::pb;
use crate::pb::balancer_client::BalancerClient;

pub use report::{LoadResult, combine_windows, print_table};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Health,
    Pick,
    Stream,
    Pipelined,
    /// Leased tickets, K per lease.
    Lease(u32),
    /// A unary call of raw bytes on a bare tonic server (`rota bench` starts one): the floor.
    Floor,
}

impl Mode {
    pub fn name(self) -> String {
        match self {
            Mode::Health => "health".into(),
            Mode::Pick => "pick".into(),
            Mode::Stream => "stream".into(),
            Mode::Pipelined => "pipelined".into(),
            Mode::Lease(k) => format!("lease:{k}"),
            Mode::Floor => "floor".into(),
        }
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "health" => Ok(Mode::Health),
            "pick" => Ok(Mode::Pick),
            "stream" => Ok(Mode::Stream),
            "pipelined" => Ok(Mode::Pipelined),
            "floor" => Ok(Mode::Floor),
            other => match other.strip_prefix("lease:").map(str::parse::<u32>) {
                Some(Ok(k)) if (1..=65_536).contains(&k) => Ok(Mode::Lease(k)),
                _ => Err(format!(
                    "unknown mode {other:?}; modes: health, pick, stream, pipelined, lease:K (K in 1..=65536), floor"
                )),
            },
        }
    }
}

#[derive(Debug, Clone)]
pub struct LoadConfig {
    pub endpoint: String,
    pub connections: usize,
    pub callers: usize,
    pub warmup: Duration,
    pub duration: Duration,
    /// Requests in flight per caller in `pipelined` mode.
    pub window: usize,
    pub request: pb::PickRequest,
    /// The server's process id, when it runs on this machine: its CPU time per request is then
    /// reported next to the throughput.
    pub server_pid: Option<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot connect to {0}: {1}")]
    Connect(String, tonic::transport::Error),
    #[error("invalid endpoint {0:?}")]
    Endpoint(String),
    #[error("calls failed: {0}")]
    Failed(tonic::Status),
}

/// Opens `count` connections (each its own HTTP/2 connection).
pub async fn connect(endpoint: &str, count: usize) -> Result<Vec<Channel>, LoadError> {
    let mut channels = Vec::with_capacity(count);
    for _ in 0..count.max(1) {
        let ep = Endpoint::from_shared(endpoint.to_owned()).map_err(|_| LoadError::Endpoint(endpoint.to_owned()))?;
        channels.push(ep.tcp_nodelay(true).connect().await.map_err(|e| LoadError::Connect(endpoint.to_owned(), e))?);
    }
    Ok(channels)
}

/// Runs one mode over `channels` and returns its figures.
pub async fn run(config: &LoadConfig, channels: &[Channel], mode: Mode) -> Result<LoadResult, LoadError> {
    let measure_from = Instant::now() + config.warmup;
    let until = measure_from + config.duration;
    let mut callers = Vec::with_capacity(config.callers);
    for i in 0..config.callers.max(1) {
        let channel = channels[i % channels.len()].clone();
        let request = config.request.clone();
        let window = if mode == Mode::Pipelined { config.window.max(1) } else { 1 };
        callers.push(tokio::spawn(async move {
            let window_bounds = (measure_from, until);
            match mode {
                Mode::Health => unary_health(channel, window_bounds).await,
                Mode::Floor => unary_floor(channel, window_bounds).await,
                Mode::Pick => unary_pick(channel, request, window_bounds).await,
                Mode::Stream | Mode::Pipelined => streamed_pick(channel, request, window, window_bounds).await,
                Mode::Lease(k) => leased_pick(channel, request, k, window_bounds).await,
            }
        }));
    }
    let cpu_during_window = config.server_pid.map(|pid| {
        tokio::spawn(async move {
            tokio::time::sleep_until(measure_from).await;
            let before = process_cpu(pid);
            tokio::time::sleep_until(until).await;
            Some(process_cpu(pid)?.saturating_sub(before?))
        })
    });
    let mut histogram = new_histogram();
    let mut errors = 0;
    for caller in callers {
        let tally = caller.await.map_err(|e| LoadError::Failed(tonic::Status::internal(e.to_string())))??;
        histogram.add(&tally.histogram).expect("histograms share their bounds");
        errors += tally.errors;
    }
    let server_cpu = match cpu_during_window {
        Some(task) => task.await.ok().flatten(),
        None => None,
    };
    Ok(LoadResult::new(mode, config, histogram, errors, server_cpu))
}

/// Linux reports process times in `USER_HZ` ticks, 100 per second on every architecture rota
/// builds for.
const USER_HZ: u64 = 100;

/// User plus system CPU time of a process and all its threads so far (Linux; `None` elsewhere
/// or when the process is gone).
pub fn process_cpu(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; the fields after its closing parenthesis are
    // state (3), ..., utime (14), stime (15).
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(Duration::from_millis((utime + stime) * 1000 / USER_HZ))
}

struct Tally {
    histogram: Histogram<u64>,
    errors: u64,
}

fn new_histogram() -> Histogram<u64> {
    // Microseconds from 1 µs to 60 s, three significant figures.
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds")
}

fn record(tally: &mut Tally, started: Instant, (measure_from, _): (Instant, Instant)) {
    if started >= measure_from {
        let micros = started.elapsed().as_micros().clamp(1, 60_000_000) as u64;
        let _ = tally.histogram.record(micros);
    }
}

async fn unary_health(channel: Channel, window: (Instant, Instant)) -> Result<Tally, LoadError> {
    let mut client = HealthClient::new(channel);
    let mut tally = Tally { histogram: new_histogram(), errors: 0 };
    while Instant::now() < window.1 {
        let started = Instant::now();
        match client.check(HealthCheckRequest { service: String::new() }).await {
            Ok(_) => record(&mut tally, started, window),
            Err(_) => tally.errors += u64::from(started >= window.0),
        }
    }
    Ok(tally)
}

async fn unary_floor(channel: Channel, window: (Instant, Instant)) -> Result<Tally, LoadError> {
    let mut grpc = tonic::client::Grpc::new(channel);
    let mut tally = Tally { histogram: new_histogram(), errors: 0 };
    while Instant::now() < window.1 {
        let started = Instant::now();
        match floor::call(&mut grpc).await {
            Ok(_) => record(&mut tally, started, window),
            Err(_) => tally.errors += u64::from(started >= window.0),
        }
    }
    Ok(tally)
}

async fn unary_pick(
    channel: Channel,
    request: pb::PickRequest,
    window: (Instant, Instant),
) -> Result<Tally, LoadError> {
    let mut client = BalancerClient::new(channel);
    let mut tally = Tally { histogram: new_histogram(), errors: 0 };
    while Instant::now() < window.1 {
        let started = Instant::now();
        match client.pick(request.clone()).await {
            Ok(_) => record(&mut tally, started, window),
            Err(_) => tally.errors += u64::from(started >= window.0),
        }
    }
    Ok(tally)
}

/// Keeps `depth` requests in flight on one `PickStream`; responses come back in order, so the
/// send times wait in a FIFO.
async fn streamed_pick(
    channel: Channel,
    request: pb::PickRequest,
    depth: usize,
    window: (Instant, Instant),
) -> Result<Tally, LoadError> {
    let mut client = BalancerClient::new(channel);
    let (tx, rx) = mpsc::channel(depth * 2);
    let mut sent: VecDeque<Instant> = VecDeque::with_capacity(depth);
    for _ in 0..depth {
        sent.push_back(Instant::now());
        let _ = tx.send(request.clone()).await;
    }
    let mut responses = client.pick_stream(ReceiverStream::new(rx)).await.map_err(LoadError::Failed)?.into_inner();
    let mut tally = Tally { histogram: new_histogram(), errors: 0 };
    while let Some(response) = responses.next().await {
        let response = response.map_err(LoadError::Failed)?;
        let Some(started) = sent.pop_front() else { break };
        if response.error.is_some() {
            tally.errors += u64::from(started >= window.0);
        } else {
            record(&mut tally, started, window);
        }
        if Instant::now() < window.1 {
            sent.push_back(Instant::now());
            if tx.send(request.clone()).await.is_err() {
                break;
            }
        } else if sent.is_empty() {
            break;
        }
    }
    Ok(tally)
}

async fn leased_pick(
    channel: Channel,
    request: pb::PickRequest,
    k: u32,
    window: (Instant, Instant),
) -> Result<Tally, LoadError> {
    let client = crate::client::RotaClient::from_channel(channel);
    let options = crate::client::PickOptions::rule(request.rule.clone()).version(request.version.clone());
    let mut picker = crate::client::LeasedPicker::new(client, request.service.clone(), options, k);
    let mut tally = Tally { histogram: new_histogram(), errors: 0 };
    while Instant::now() < window.1 {
        let started = Instant::now();
        match picker.pick().await {
            Ok(_) => record(&mut tally, started, window),
            Err(_) => tally.errors += u64::from(started >= window.0),
        }
    }
    Ok(tally)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_cpu_counts_this_process_working() {
        let pid = std::process::id();
        let before = process_cpu(pid).expect("this process's /proc/<pid>/stat");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let mut x = 0u64;
        // Work until the kernel has charged at least 50 ms more to this process.
        while process_cpu(pid).unwrap() < before + Duration::from_millis(50) {
            for i in 0..1_000_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
            assert!(std::time::Instant::now() < deadline, "20 s of work were not charged");
        }
        assert_eq!(process_cpu(u32::MAX), None, "no such process");
    }
}
