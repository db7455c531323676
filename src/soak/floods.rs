//! Scenario `floods`: xDS name floods and an admin connection flood, with a bystander picking.
//!
//! 1. From 127.0.0.1, ADS streams (short: 200 over 2 connections; long: 2,048 over 21), each
//!    subscribing to 1,000 made-up names of 64 bytes for each of the four resource types — each
//!    inside the per-stream limits, together far past `max_xds_bytes` (short: 32 MiB, long: its
//!    default of 256 MiB). Meanwhile a consumer on its own connection picks an unrelated service
//!    every 10 ms, and the server's RSS is sampled.
//! 2. Idle connections to the admin listener filling its per-address cap (64) are held open
//!    while `/healthz` is asked 80 times from the same address, each on a connection of its own
//!    (served from the probe reserve). The reserve is per address too (2 connections, each
//!    closed 2 s after it opened): a flood from the prober's own address past its cap and its
//!    reserve can still lock the prober out, one from other addresses cannot (the integration
//!    test `it::admin::health_probes_are_answered_while_idle_connections_fill_the_admin_caps`).
//!
//! Checks: (a) the RSS grew by at most one address's share of the xDS budget (a quarter) plus
//! 64 MiB (connections, streams' tasks, the allocator's slack); (b) every stream refused was
//! refused with `RESOURCE_EXHAUSTED` naming an xDS bound, and nothing else failed; (c) every
//! bystander pick was answered, p99 within 20 ms (a bound, enforced in long mode); (d) `/healthz`
//! answered 80 of 80 during the admin flood.

use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::service::discovery::v3::DiscoveryRequest;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use hdrhistogram::Histogram;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;

use super::{CALL_TIMEOUT, Check, ScenarioReport, SoakError, SoakOptions, bounded, mib, ms};
use crate::client::{PickOptions, RotaClient};
use crate::pb;

const TYPES: [&str; 4] = [
    "type.googleapis.com/envoy.config.listener.v3.Listener",
    "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
    "type.googleapis.com/envoy.config.cluster.v3.Cluster",
    "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
];
const NAMES_PER_TYPE: usize = 1_000;
const NAME_BYTES: usize = 64;
const STREAMS_PER_CONNECTION: usize = 100;
const ALLOWANCE: u64 = 64 << 20;
const PICK_P99_BOUND: Duration = Duration::from_millis(20);
const PICK_EVERY: Duration = Duration::from_millis(10);
const ADMIN_PER_PEER: usize = 64;
const PROBES: usize = 80;
const BYSTANDER: &str = "floods-bystander";

struct Sizing {
    streams: usize,
    /// `--max-xds-bytes`, when not the default.
    max_xds_bytes: Option<u64>,
}

pub async fn run(options: &SoakOptions, report: &mut ScenarioReport) -> Result<(), SoakError> {
    let sizing = options
        .pick(Sizing { streams: 200, max_xds_bytes: Some(32 << 20) }, Sizing { streams: 2_048, max_xds_bytes: None });
    let budget = sizing.max_xds_bytes.unwrap_or(crate::xds::XdsLimits::default().max_bytes as u64);
    let mut flags = Vec::new();
    if let Some(bytes) = sizing.max_xds_bytes {
        flags.extend(["--max-xds-bytes".to_owned(), bytes.to_string()]);
    }
    let mut target = options.target(&flags)?;
    let mut client = bounded("connect", RotaClient::connect(&target.endpoint)).await?;
    let provider = bounded(
        "register",
        client.register(vec![pb::Instance {
            id: "a".into(),
            service: BYSTANDER.into(),
            host: "127.0.0.1".into(),
            port: 1,
            ..Default::default()
        }]),
    )
    .await?;
    let rss_before = target.rss();

    // The bystander picks on its own connection for as long as the flood lasts.
    let (stop_picking, mut stopped) = tokio::sync::watch::channel(false);
    let mut picker = bounded("connect", RotaClient::connect(&target.endpoint)).await?;
    let picking = tokio::spawn(async move {
        let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid bounds");
        let mut failed = Vec::new();
        let mut ticker = tokio::time::interval(PICK_EVERY);
        loop {
            tokio::select! {
                _ = ticker.tick() => {}
                _ = stopped.changed() => break,
            }
            let sent = Instant::now();
            match tokio::time::timeout(CALL_TIMEOUT, picker.pick(BYSTANDER, PickOptions::default())).await {
                Ok(Ok(_)) => {
                    let _ = histogram.record(sent.elapsed().as_micros().clamp(1, 60_000_000) as u64);
                }
                Ok(Err(error)) => failed.push(error.to_string()),
                Err(_) => failed.push("no answer within 10 s".into()),
            }
        }
        (histogram, failed)
    });

    // The flood, the RSS sampled as the streams open.
    let started = Instant::now();
    let mut rss_peak = rss_before.unwrap_or(0);
    let (mut held, mut admitted, mut refused, mut wrong) = (Vec::new(), 0usize, 0usize, Vec::new());
    for first in (0..sizing.streams).step_by(STREAMS_PER_CONNECTION) {
        let endpoint = tonic::transport::Channel::from_shared(target.endpoint.clone())
            .map_err(|e| SoakError::Setup(e.to_string()))?;
        let channel = match tokio::time::timeout(CALL_TIMEOUT, endpoint.connect()).await {
            Ok(Ok(channel)) => channel,
            Ok(Err(error)) => return Err(SoakError::Setup(format!("cannot connect: {error}"))),
            Err(_) => return Err(SoakError::Stalled("connect".into())),
        };
        let count = STREAMS_PER_CONNECTION.min(sizing.streams - first);
        let opened = (first..first + count).map(|n| open_flooding_stream(channel.clone(), n));
        for outcome in futures_util::future::join_all(opened).await {
            match outcome {
                Ok(stream) => {
                    admitted += 1;
                    held.push(stream);
                }
                Err(status) if status.code() == tonic::Code::ResourceExhausted && names_an_xds_bound(&status) => {
                    refused += 1;
                }
                Err(status) => wrong.push(format!("{:?}: {}", status.code(), status.message())),
            }
        }
        rss_peak = rss_peak.max(target.rss().unwrap_or(0));
    }
    let flood_took = started.elapsed();
    rss_peak = rss_peak.max(target.rss().unwrap_or(0));
    report.figure(
        "xDS streams",
        format!(
            "{admitted} admitted, {refused} refused of {} (1,000 names × 4 types each) in {}",
            sizing.streams,
            ms(flood_took)
        ),
    );
    if let Some(before) = rss_before {
        let grown = rss_peak.saturating_sub(before);
        let bound = budget / 4 + ALLOWANCE;
        report.figure("server RSS", format!("{} before, {} at the peak", mib(before), mib(rss_peak)));
        report.check(Check::new(
            "RSS within one address's share of the xDS budget",
            grown <= bound,
            format!("grew {} (bound: a quarter of {} + {})", mib(grown), mib(budget), mib(ALLOWANCE)),
        ));
    }
    report.check(Check::new(
        "refusals name an xDS bound",
        wrong.is_empty() && refused > 0,
        match wrong.first() {
            None => format!("{refused} RESOURCE_EXHAUSTED naming max_xds_bytes or max_xds_subscriptions"),
            Some(first) => format!("{} streams failed otherwise; first: {first}", wrong.len()),
        },
    ));

    // The admin flood, with the xDS streams still held.
    let admin_probes = match &target.admin {
        Some(admin) => Some(admin_flood(admin).await?),
        None => {
            report.notice("the server printed no admin address: the admin flood is skipped");
            None
        }
    };
    if let Some((answered, idle)) = admin_probes {
        report.figure("admin flood", format!("{idle} idle connections held; /healthz answered {answered} of {PROBES}"));
        report.check(Check::new(
            "/healthz answered during the admin flood",
            answered == PROBES,
            format!("{answered} of {PROBES}"),
        ));
    }

    let _ = stop_picking.send(true);
    let (histogram, failed) = picking.await.map_err(|e| SoakError::Setup(format!("the picker failed: {e}")))?;
    drop(held);
    drop(provider);
    let p99 = Duration::from_micros(histogram.value_at_quantile(0.99));
    report.figure(
        "bystander picks",
        format!(
            "{} answered, p50 / p99 / max {} / {} / {}",
            histogram.len(),
            ms(Duration::from_micros(histogram.value_at_quantile(0.5))),
            ms(p99),
            ms(Duration::from_micros(histogram.max()))
        ),
    );
    report.check(Check::new(
        "bystander picks answered",
        failed.is_empty() && !histogram.is_empty(),
        match failed.first() {
            None => format!("0 failed of {}", histogram.len()),
            Some(first) => format!("{} failed; first: {first}", failed.len()),
        },
    ));
    report.check(Check::bound(
        "bystander pick p99 during the floods",
        p99 <= PICK_P99_BOUND,
        format!("p99 {} (bound {})", ms(p99), ms(PICK_P99_BOUND)),
    ));
    report.key = format!(
        "{admitted}/{} xDS streams admitted, RSS peak {}, bystander p99 {}",
        sizing.streams,
        mib(rss_peak),
        ms(p99)
    );
    if let Some(check) = target.alive_check() {
        report.check(check);
    }
    Ok(())
}

/// What a flooding stream keeps: its request sender (so the stream stays open) and its answers.
type Held = (
    mpsc::Sender<DiscoveryRequest>,
    tonic::Streaming<envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse>,
);

/// One ADS stream asking for 1,000 names of each type; held once its first answer arrived, or
/// the status that ended it.
async fn open_flooding_stream(channel: tonic::transport::Channel, n: usize) -> Result<Held, tonic::Status> {
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    let (requests, rx) = mpsc::channel(TYPES.len());
    for (t, type_url) in TYPES.iter().enumerate() {
        let resource_names =
            (0..NAMES_PER_TYPE).map(|i| format!("{n:08}-{t}-{i:08}-{}", "x".repeat(NAME_BYTES - 28))).collect();
        let request = DiscoveryRequest { type_url: (*type_url).into(), resource_names, ..Default::default() };
        // The channel has room for every request.
        let _ = requests.try_send(request);
    }
    let call = async {
        let mut answers = client.stream_aggregated_resources(ReceiverStream::new(rx)).await?.into_inner();
        // Every type answered (or the stream ended): what it holds is then charged.
        for _ in 0..TYPES.len() {
            match answers.message().await? {
                Some(_) => {}
                None => return Err(tonic::Status::cancelled("the stream ended")),
            }
        }
        Ok(answers)
    };
    match tokio::time::timeout(CALL_TIMEOUT, call).await {
        Ok(Ok(answers)) => Ok((requests, answers)),
        Ok(Err(status)) => Err(status),
        Err(_) => Err(tonic::Status::deadline_exceeded("no answer within 10 s")),
    }
}

fn names_an_xds_bound(status: &tonic::Status) -> bool {
    let message = status.message();
    message.contains("max_xds_bytes") || message.contains("max_xds_subscriptions")
}

/// Holds the per-address cap of idle admin connections, then asks `/healthz` 80 times on
/// connections of their own: how many were answered `200 ok`, and how many idle ones were held.
async fn admin_flood(admin: &str) -> Result<(usize, usize), SoakError> {
    let addr: SocketAddr = admin.parse().map_err(|_| SoakError::Setup(format!("not an address: {admin}")))?;
    let mut idle = Vec::new();
    for _ in 0..ADMIN_PER_PEER {
        if let Ok(Ok(stream)) = tokio::time::timeout(CALL_TIMEOUT, tokio::net::TcpStream::connect(addr)).await {
            idle.push(stream);
        }
    }
    let mut answered = 0;
    for _ in 0..PROBES {
        let probe = async {
            let mut stream = tokio::net::TcpStream::connect(addr).await?;
            stream.write_all(format!("GET /healthz HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).await?;
            let mut answer = Vec::new();
            stream.read_to_end(&mut answer).await?;
            Ok::<_, std::io::Error>(answer)
        };
        if let Ok(Ok(answer)) = tokio::time::timeout(CALL_TIMEOUT, probe).await {
            let answer = String::from_utf8_lossy(&answer);
            if answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200") {
                answered += 1;
            }
        }
    }
    Ok((answered, idle.len()))
}
