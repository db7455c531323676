//! `rota bench --sources`: how quickly a change in a followed registry is pickable in rota, and
//! what following a large one costs.
//!
//! Runs Debian's `etcd` (`scripts/install-etcd.sh`) on free loopback ports with a scratch data
//! directory, and `rota serve --source etcd://…/bench` in its own process. Then:
//! 1. 200 puts of a new key, one at a time: the time from sending the put to the instance
//!    arriving in a Watch of the service on rota (p50, p99, max);
//! 2. 10,000 keys put, then `--duration` of one changed key a second: rota's CPU (from `/proc`)
//!    and resident memory, and the same put-to-Watch time for each change.
//!
//! Eureka and DNS are read by polling: a change is pickable within one `interval` (plus the
//! Eureka server's own response cache, 30 s by default), so their figure is the interval chosen,
//! not measured here.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::CliError;
use super::bench::{BenchArgs, Spawned, resident_bytes, spawn};
use crate::client::RotaClient;
use crate::loadgen::process_cpu;
use crate::pb::watch_event::Event;
use crate::sources::etcd::base64_encode;
use crate::sources::http::{Endpoint, post};

const PUTS: usize = 200;
const FLEET: usize = 10_000;

fn free_port() -> Result<u16, CliError> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub async fn run(args: BenchArgs) -> Result<(), CliError> {
    let dir = std::env::temp_dir().join(format!("rota-bench-etcd-{}", std::process::id()));
    let _cleanup = Cleanup(dir.clone());
    let (port, peer) = (free_port()?, free_port()?);
    let client_url = format!("http://127.0.0.1:{port}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let etcd = Command::new("etcd")
        .args(["--name", "default", "--data-dir"])
        .arg(dir.join("etcd"))
        .args(["--listen-client-urls", &client_url, "--advertise-client-urls", &client_url])
        .args(["--listen-peer-urls", &peer_url, "--initial-advertise-peer-urls", &peer_url])
        .args(["--initial-cluster", &format!("default={peer_url}"), "--logger=zap", "--log-level=error"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| CliError::Usage(format!("cannot start etcd (scripts/install-etcd.sh installs it): {e}")))?;
    let _etcd = Spawned(etcd);
    let endpoint = Endpoint { host: "127.0.0.1".into(), port, path: String::new() };
    let started = Instant::now();
    while put(&endpoint, "ready", 1).await.is_err() {
        if started.elapsed() > Duration::from_secs(30) {
            return Err(CliError::Usage("etcd did not answer within 30 s".into()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let source = format!("etcd://127.0.0.1:{port}/bench?max_instances=20000&interval=5s");
    let (server, rota) = spawn(&["serve", "--listen", "127.0.0.1:0", "--admin-listen", "off", "--source", &source])?;
    let pid = server.0.id();
    let mut client = RotaClient::connect(&rota).await?;
    let mut watch = client.watch("svc").await?;
    // The first event is the snapshot (empty: nothing is registered yet).
    next_event(&mut watch, "the snapshot").await?;

    let mut next = 0usize;
    let arrival = async |key: usize,
                         watch: &mut tonic::Streaming<crate::pb::WatchEvent>|
           -> Result<Duration, CliError> {
        let id = format!("etcd:k{key:05}");
        let sent = Instant::now();
        put(&endpoint, &format!("k{key:05}"), 20_000 + key as u16 % 40_000).await?;
        loop {
            let event = next_event(watch, &id).await?;
            match event.event {
                Some(Event::Added(i) | Event::Updated(i)) if i.id == id => return Ok(sent.elapsed()),
                Some(Event::Snapshot(list)) if list.instances.iter().any(|i| i.id == id) => return Ok(sent.elapsed()),
                _ => {}
            }
        }
    };
    let mut took = Vec::with_capacity(PUTS);
    for _ in 0..PUTS {
        took.push(arrival(next, &mut watch).await?);
        next += 1;
    }
    report("a new key put in etcd, to the instance in rota's Watch", &mut took);

    // A large prefix: 10,000 keys, then one change a second.
    for key in next..FLEET {
        put(&endpoint, &format!("k{key:05}"), 20_000 + key as u16 % 40_000).await?;
    }
    let started = Instant::now();
    while client.list_instances("svc").await?.instances.len() < FLEET {
        if started.elapsed() > Duration::from_secs(60) {
            return Err(CliError::Usage(format!("rota did not hold {FLEET} instances within 60 s")));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut watch = client.watch("svc").await?;
    next_event(&mut watch, "the snapshot").await?;
    let cpu_before = process_cpu(pid).ok_or_else(|| CliError::Usage("rota's /proc entry is gone".into()))?;
    let window = Instant::now();
    let mut changes = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    while window.elapsed() < args.duration {
        tick.tick().await;
        // A changed value of an existing key: its port moves.
        let key = changes.len() * 37 % FLEET;
        let id = format!("etcd:k{key:05}");
        let sent = Instant::now();
        put(&endpoint, &format!("k{key:05}"), 60_000 + (changes.len() % 5_000) as u16).await?;
        loop {
            let event = next_event(&mut watch, &id).await?;
            if let Some(Event::Updated(i) | Event::Added(i)) = event.event
                && i.id == id
            {
                changes.push(sent.elapsed());
                break;
            }
        }
    }
    let wall = window.elapsed().as_secs_f64();
    let cpu = process_cpu(pid).ok_or_else(|| CliError::Usage("rota's /proc entry is gone".into()))? - cpu_before;
    let rss = resident_bytes(pid).unwrap_or(0) as f64 / (1 << 20) as f64;
    println!(
        "following {FLEET} keys with one change a second for {wall:.0} s: rota CPU {:.1} % of a core, RSS {rss:.1} MiB",
        cpu.as_secs_f64() / wall * 100.0
    );
    report("a changed key in a prefix of 10,000, to the change in rota's Watch", &mut changes);
    Ok(())
}

/// The Watch's next event, within 30 s.
async fn next_event(
    watch: &mut tonic::Streaming<crate::pb::WatchEvent>,
    what: &str,
) -> Result<crate::pb::WatchEvent, CliError> {
    tokio::time::timeout(Duration::from_secs(30), watch.message())
        .await
        .map_err(|_| CliError::Usage(format!("{what} did not arrive within 30 s")))?
        .map_err(crate::client::ClientError::from)?
        .ok_or_else(|| CliError::Usage("the watch ended".into()))
}

fn report(what: &str, took: &mut [Duration]) {
    took.sort_unstable();
    let at = |q: f64| took[((took.len() as f64 * q) as usize).min(took.len() - 1)].as_secs_f64() * 1e3;
    println!("{what}: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms over {}", at(0.5), at(0.99), at(1.0), took.len());
}

/// Puts `bench/svc/KEY` = grpc-go's endpoint value for `127.0.0.1:PORT`.
async fn put(endpoint: &Endpoint, key: &str, port: u16) -> Result<(), CliError> {
    let value = format!(r#"{{"Op":0,"Addr":"127.0.0.1:{port}","Metadata":null}}"#);
    let body = format!(
        r#"{{"key":"{}","value":"{}"}}"#,
        base64_encode(format!("bench/svc/{key}").as_bytes()),
        base64_encode(value.as_bytes())
    );
    post(endpoint, "/v3/kv/put", body, Duration::from_secs(5), 1 << 20)
        .await
        .map(drop)
        .map_err(|e| CliError::Usage(format!("etcd put: {e}")))
}

struct Cleanup(std::path::PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
