//! Scenario `unread`: clients that ask for large answers and never read them.
//!
//! One service of N instances with some metadata each (long: 5,000, a listing of ~0.7 MB;
//! short: 2,000). From 127.0.0.2, connections whose streams have a zero flow-control window
//! (rota can send them headers, never data) each send many `ListInstances` and `Lease(0)`
//! calls and open `Watch`es of the service, and keep every answer unread for the window (long:
//! 16,000 calls and 3,840 watches over 64 connections, the attack that once made rota hold
//! gigabytes; short: 640 and 160 over 16). Meanwhile a probe from 127.0.0.1 lists the service
//! and picks every few hundred milliseconds, and the server's RSS is sampled.
//!
//! Checks: (a) the RSS grew by at most the per-address budget of unread answers (32 MiB), 64
//! MiB for the connections and 16 KiB per watch asked for (its stream, task and buffers); (b) the calls that found no
//! room were refused with `RESOURCE_EXHAUSTED` naming that budget (watches past the address's
//! share of streams naming that), nothing else failed; (c)
//! every probe was answered within 5 s; (d) once the attackers close their connections,
//! 127.0.0.2 is answered in full again (their room came back).

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use super::rawh2::{RawConnection, read_all, refusal};
use super::{CALL_TIMEOUT, Check, ScenarioReport, SoakError, SoakOptions, bounded, mib, ms};
use crate::client::{PickOptions, RotaClient};
use crate::pb;

const SERVICE: &str = "unread-listing";
const ATTACKER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// The per-address budget of a server with default settings.
const PER_PEER_BUDGET: u64 = crate::grpc::answers::DEFAULT_MAX_UNREAD_BYTES_PER_PEER as u64;
/// What the attack may cost beyond that budget: its connections, the allocator's slack, and
/// per watch asked for its stream, task and buffers.
const ALLOWANCE: u64 = 64 << 20;
const PER_WATCH: u64 = 16 << 10;
const PROBE_BOUND: Duration = Duration::from_secs(5);
const PROBE_EVERY: Duration = Duration::from_millis(300);

#[derive(Default)]
struct Tally {
    admitted: AtomicU64,
    refused_by_budget: AtomicU64,
    other: AtomicU64,
    first_other: std::sync::Mutex<Option<String>>,
}

impl Tally {
    fn record(&self, answer: &Result<http::Response<h2::RecvStream>, String>) {
        match answer {
            Ok(response) => match refusal(response) {
                None => self.admitted.fetch_add(1, Ordering::Relaxed),
                // Past the budgets, or (watches) past the address's share of streams.
                Some((code, message))
                    if code == "8"
                        && (message.contains("server.max_unread_bytes")
                            || message.contains("server.max_consumer_streams_per_peer")) =>
                {
                    self.refused_by_budget.fetch_add(1, Ordering::Relaxed)
                }
                Some((code, message)) => self.other(format!("grpc-status {code}: {message}")),
            },
            Err(error) => self.other(error.clone()),
        };
    }

    fn other(&self, what: String) -> u64 {
        self.first_other.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(what);
        self.other.fetch_add(1, Ordering::Relaxed)
    }
}

pub async fn run(options: &SoakOptions, report: &mut ScenarioReport) -> Result<(), SoakError> {
    let instances = options.pick(2_000, 5_000);
    let connections = options.pick(16, 64);
    let calls_per_connection = options.pick(40, 250);
    let watches_per_connection = options.pick(10, 60);
    let window = options.pick(Duration::from_secs(10), Duration::from_secs(60));
    let mut target = options.target(&[])?;
    let server: SocketAddr =
        target.addr.parse().map_err(|_| SoakError::Setup(format!("not an address: {}", target.addr)))?;

    let mut provider = bounded("connect", RotaClient::connect(&target.endpoint)).await?;
    let mut registrations = Vec::new();
    let fleet: Vec<pb::Instance> = (0..instances)
        .map(|n| pb::Instance {
            id: format!("u{n:05}"),
            service: SERVICE.into(),
            host: "127.0.0.1".into(),
            port: 10_000 + n as u32,
            metadata: [("note".to_owned(), "x".repeat(100))].into_iter().collect(),
            ..Default::default()
        })
        .collect();
    for chunk in fleet.chunks(1000) {
        registrations.push(bounded("register", provider.register(chunk.to_vec())).await?);
    }
    let mut probe = bounded("connect", RotaClient::connect(&target.endpoint)).await?;
    let listing = bounded("list", probe.list_instances(SERVICE)).await?;
    let listing_bytes = prost::Message::encoded_len(&listing) + 5;
    report.figure("listing", format!("{} instances, {} bytes", listing.instances.len(), listing_bytes));
    let rss_before = target.rss();

    // The attack: every call sent at once, every answer kept unread.
    let tally = Arc::new(Tally::default());
    let mut attackers = Vec::new();
    let mut calls = Vec::new();
    let started = Instant::now();
    for _ in 0..connections {
        let connection = Arc::new(
            RawConnection::open(ATTACKER, server, 0)
                .await
                .map_err(|e| SoakError::Setup(format!("cannot connect from {ATTACKER}: {e}")))?,
        );
        for n in 0..calls_per_connection + watches_per_connection {
            let (connection, tally) = (connection.clone(), tally.clone());
            calls.push(tokio::spawn(async move {
                let answer = if n >= calls_per_connection {
                    let watch = pb::WatchRequest { service: SERVICE.into() };
                    connection.call("/rota.v1.Registry/Watch", &watch).await
                } else if n % 4 == 3 {
                    let lease = pb::LeaseRequest { service: SERVICE.into(), count: 0, ..Default::default() };
                    connection.call("/rota.v1.Balancer/Lease", &lease).await
                } else {
                    let list = pb::ListInstancesRequest { service: SERVICE.into() };
                    connection.call("/rota.v1.Registry/ListInstances", &list).await
                };
                let answer = answer.map_err(|e| e.to_string());
                tally.record(&answer);
                answer.ok()
            }));
        }
        attackers.push(connection);
    }
    let sent = calls.len();
    report.figure("attack", format!("{sent} calls over {connections} connections from {ATTACKER}"));

    // The probe and the RSS samples, for the window.
    let (mut probes, mut failed_probes, mut slowest) = (0u32, Vec::new(), Duration::ZERO);
    let mut rss_peak = rss_before.unwrap_or(0);
    let end = Instant::now() + window;
    while Instant::now() < end {
        let asked = Instant::now();
        let answered = tokio::time::timeout(PROBE_BOUND, async {
            probe.list_instances(SERVICE).await?;
            probe.pick(SERVICE, PickOptions::rule("round_robin")).await
        })
        .await;
        probes += 1;
        slowest = slowest.max(asked.elapsed());
        match answered {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => failed_probes.push(error.to_string()),
            Err(_) => failed_probes.push(format!("no answer within {}", ms(PROBE_BOUND))),
        }
        rss_peak = rss_peak.max(target.rss().unwrap_or(0));
        tokio::time::sleep(PROBE_EVERY).await;
    }
    // Every call has its answer's headers by now.
    let mut held = Vec::new();
    for call in calls {
        if let Ok(Ok(Some(response))) = tokio::time::timeout(CALL_TIMEOUT, call).await {
            held.push(response);
        }
    }
    rss_peak = rss_peak.max(target.rss().unwrap_or(0));
    let attack_time = started.elapsed();
    let (admitted, refused, other) = (
        tally.admitted.load(Ordering::Relaxed),
        tally.refused_by_budget.load(Ordering::Relaxed),
        tally.other.load(Ordering::Relaxed),
    );
    report.figure(
        "answers",
        format!(
            "{admitted} admitted and held unread, {refused} refused for room, {other} other, in {}",
            ms(attack_time)
        ),
    );
    report.figure("probes", format!("{probes}, slowest {}", ms(slowest)));

    if let (Some(before), true) = (rss_before, rss_peak > 0) {
        let grown = rss_peak.saturating_sub(before);
        report.figure("server RSS", format!("{} before, {} at the peak", mib(before), mib(rss_peak)));
        let allowance = ALLOWANCE + PER_WATCH * (connections * watches_per_connection) as u64;
        let bound = PER_PEER_BUDGET + allowance;
        report.check(Check::bound(
            "unread answers stay within the address's budget",
            grown <= bound,
            format!(
                "RSS grew by {} with {sent} calls of ~{listing_bytes} bytes left unread; bound {} (the 32 MiB budget, {} for the connections and 16 KiB per watch)",
                mib(grown),
                mib(bound),
                mib(ALLOWANCE)
            ),
        ));
    } else {
        report.notice("the server's RSS is not known here: the memory check is skipped");
    }
    let first_other = tally.first_other.lock().unwrap_or_else(|p| p.into_inner()).clone();
    report.check(Check::new(
        "calls without room are refused naming the budget, nothing else fails",
        other == 0 && refused > 0 && admitted + refused + other == sent as u64,
        format!(
            "{refused} refused with RESOURCE_EXHAUSTED (server.max_unread_bytes_per_peer, or for watches server.max_consumer_streams_per_peer), {other} other{}, {} of {sent} answered",
            first_other.map(|o| format!(" (first: {o})")).unwrap_or_default(),
            admitted + refused + other
        ),
    ));
    report.check(Check::new(
        "other clients are answered",
        failed_probes.is_empty() && probes > 0,
        format!(
            "{} of {probes} probes (list and pick from 127.0.0.1) answered within {}, slowest {}{}",
            probes as usize - failed_probes.len(),
            ms(PROBE_BOUND),
            ms(slowest),
            failed_probes.first().map(|f| format!("; first failure: {f}")).unwrap_or_default()
        ),
    ));

    // The attackers go away: their room comes back.
    drop((held, attackers));
    // The server notices the closes as it reads them: ask until answered, for a bounded time.
    let back = tokio::time::timeout(CALL_TIMEOUT, async {
        loop {
            let reader = RawConnection::open(ATTACKER, server, 65_535).await.map_err(|e| e.to_string())?;
            let list = pb::ListInstancesRequest { service: SERVICE.into() };
            let response = reader.call("/rota.v1.Registry/ListInstances", &list).await.map_err(|e| e.to_string())?;
            match refusal(&response) {
                None => return read_all(response).await.map_err(|e| e.to_string()),
                Some((code, message)) if code == "8" && message.contains("server.max_unread_bytes") => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Some((code, message)) => return Err(format!("grpc-status {code}: {message}")),
            }
        }
    })
    .await;
    let (ok, evidence) = match back {
        Ok(Ok(read)) if read == listing_bytes => (true, format!("a listing of {read} bytes read in full")),
        Ok(Ok(read)) => (false, format!("{read} bytes read, {listing_bytes} expected")),
        Ok(Err(error)) => (false, error),
        Err(_) => (false, format!("no listing within {}", ms(CALL_TIMEOUT))),
    };
    report.check(Check::new("the attackers' room comes back once they close", ok, evidence));
    report.key = format!(
        "{sent} unread calls: {admitted} held, {refused} refused; RSS +{}",
        mib(rss_peak.saturating_sub(rss_before.unwrap_or(rss_peak)))
    );
    drop(registrations);
    if let Some(check) = target.alive_check() {
        report.check(check);
    }
    Ok(())
}
