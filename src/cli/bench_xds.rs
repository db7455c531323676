//! `rota bench --xds`: how long a registration change takes to reach xDS clients — from the
//! Announce (or Withdraw) sent to the ClusterLoadAssignment that shows it arriving on every
//! open ADS stream — with 1, 100 and 1,000 streams open, p50 and p99 over every stream's
//! arrival; and the server's resident memory per open stream.

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use futures_util::StreamExt;
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::CliError;
use super::bench::{BenchArgs, register, resident_bytes, spawn};
use crate::client::RotaClient;
use crate::pb::{self, register_request::Msg};

const ENDPOINTS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
/// Changes measured per stream count.
const CHANGES: usize = 50;
/// ADS streams per HTTP/2 connection, as many clients of one process would share one.
const STREAMS_PER_CONNECTION: usize = 100;

pub async fn run(args: BenchArgs) -> Result<(), CliError> {
    for streams in [1usize, 100, 1000] {
        let (server, endpoint) = spawn(&[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "off",
            "--max-consumer-streams-per-peer",
            "4096",
        ])?;
        let pid = server.0.id();
        let service = format!("{}-xds", args.service);
        let _held = register(&endpoint, &service, 3).await?;
        let before = resident_bytes(pid);
        // Each stream's task reports (stream, change number, arrival) for every assignment.
        let (arrivals, mut arrived) = mpsc::unbounded_channel::<(usize, bool, Instant)>();
        let mut channels = Vec::new();
        for _ in 0..streams.div_ceil(STREAMS_PER_CONNECTION) {
            let channel = tonic::transport::Channel::from_shared(endpoint.clone())
                .map_err(|e| CliError::Usage(format!("{endpoint}: {e}")))?
                .connect()
                .await
                .map_err(|e| CliError::Usage(format!("{endpoint}: {e}")))?;
            channels.push(channel);
        }
        let mut keep = Vec::new();
        for n in 0..streams {
            let mut client = AggregatedDiscoveryServiceClient::new(channels[n / STREAMS_PER_CONNECTION].clone());
            let (requests, rx) = mpsc::channel(4);
            let name = service.clone();
            let ask = move |nonce: String| DiscoveryRequest {
                type_url: ENDPOINTS.into(),
                resource_names: vec![name.clone()],
                response_nonce: nonce,
                ..Default::default()
            };
            requests.send(ask(String::new())).await.map_err(|_| CliError::Usage("ADS stream closed".into()))?;
            let mut responses = client
                .stream_aggregated_resources(ReceiverStream::new(rx))
                .await
                .map_err(|s| CliError::Usage(format!("ADS refused: {s}")))?
                .into_inner();
            let arrivals = arrivals.clone();
            keep.push(tokio::spawn(async move {
                while let Some(Ok(response)) = responses.next().await {
                    let at = Instant::now();
                    let _ = arrivals.send((n, has_probe(&response), at));
                    if requests.send(ask(response.nonce)).await.is_err() {
                        return;
                    }
                }
            }));
        }
        // Every stream's first answer.
        for _ in 0..streams {
            arrived.recv().await.ok_or_else(|| CliError::Usage("ADS streams ended".into()))?;
        }
        let after = resident_bytes(pid);
        let mut client = RotaClient::connect(&endpoint).await?;
        let probe = pb::Instance {
            id: "xds-probe".into(),
            service: service.clone(),
            host: "127.0.0.1".into(),
            port: 30_000,
            ..Default::default()
        };
        let mut registration = client.register(vec![]).await?;
        let mut took = Vec::with_capacity(CHANGES * streams);
        for change in 0..CHANGES {
            let present = change % 2 == 0;
            let started = Instant::now();
            let message = if present {
                Msg::Announce(pb::Announce { instances: vec![probe.clone()] })
            } else {
                Msg::Withdraw(pb::Withdraw {
                    instances: vec![pb::InstanceRef { service: service.clone(), id: probe.id.clone() }],
                })
            };
            registration.send(message).await?;
            let mut seen = vec![false; streams];
            let mut left = streams;
            while left > 0 {
                let (stream, has, at) = tokio::time::timeout(Duration::from_secs(30), arrived.recv())
                    .await
                    .map_err(|_| CliError::Usage("a change did not reach every xDS stream in 30 s".into()))?
                    .ok_or_else(|| CliError::Usage("ADS streams ended".into()))?;
                if has == present && !seen[stream] {
                    seen[stream] = true;
                    left -= 1;
                    took.push(at.duration_since(started));
                }
            }
        }
        took.sort_unstable();
        let at = |q: f64| took[((took.len() as f64 * q) as usize).min(took.len() - 1)];
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let per_stream = match (before, after) {
            (Some(before), Some(after)) => {
                format!("{:.1} KiB", after.saturating_sub(before) as f64 / 1024.0 / streams as f64)
            }
            _ => "unknown".into(),
        };
        println!(
            "xds: {streams} streams: registration change to assignment on every stream p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms over {CHANGES} changes; server memory per stream {per_stream}",
            ms(at(0.5)),
            ms(at(0.99)),
            ms(took[took.len() - 1]),
        );
        for task in keep {
            task.abort();
        }
    }
    Ok(())
}

fn has_probe(response: &DiscoveryResponse) -> bool {
    response.resources.iter().any(|resource| {
        ClusterLoadAssignment::decode(&*resource.value).is_ok_and(|assignment| {
            assignment.endpoints.iter().flat_map(|l| &l.lb_endpoints).any(|e| {
                matches!(&e.host_identifier,
                    Some(envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier::Endpoint(ep))
                        if ep.hostname == "xds-probe")
            })
        })
    })
}
