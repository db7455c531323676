//! The scale run: many instances over many streams, the server's memory per instance, and pick
//! latency with and without registration churn.

use std::time::Duration;

use tokio::time::Instant;

use super::{LoadConfig, LoadError, LoadResult, Mode, connect, run};
use crate::client::{ClientError, Registration, RotaClient};
use crate::pb::{self, register_request::Msg};

#[derive(Debug, Clone)]
pub struct ScaleConfig {
    pub endpoint: String,
    pub instances: usize,
    pub services: usize,
    pub streams: usize,
    /// Pick load for the with/without churn comparison.
    pub load: LoadConfig,
}

impl ScaleConfig {
    /// A configuration for [`register_all`] only: `instances` in one service over `streams`,
    /// with no pick load.
    pub fn registration(endpoint: &str, instances: usize, streams: usize) -> Self {
        Self {
            endpoint: endpoint.to_owned(),
            instances,
            services: 1,
            streams,
            load: LoadConfig {
                endpoint: endpoint.to_owned(),
                connections: 1,
                callers: 1,
                warmup: Duration::ZERO,
                duration: Duration::ZERO,
                window: 1,
                request: Default::default(),
                server_pid: None,
            },
        }
    }
}

#[derive(Debug, Clone)]
pub struct ScaleResult {
    pub registered: usize,
    pub register_seconds: f64,
    pub quiet: LoadResult,
    pub churned: LoadResult,
    /// Withdraw + re-announce round trips completed during the churned run.
    pub churn_operations: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ScaleError {
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Load(#[from] LoadError),
}

/// Instance `i` of the run: spread evenly over the services.
pub(crate) fn instance(i: usize, services: usize) -> pb::Instance {
    pb::Instance {
        id: format!("i{i:06}"),
        service: format!("scale-{:04}", i % services),
        host: format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255),
        port: 8080,
        ..Default::default()
    }
}

/// Registers `instances` over `streams` concurrent streams; returns them and the time taken.
pub async fn register_all(config: &ScaleConfig) -> Result<(Vec<Registration>, Duration), ScaleError> {
    let per_stream = config.instances.div_ceil(config.streams.max(1));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for stream in 0..config.streams {
        let endpoint = config.endpoint.clone();
        let range = (stream * per_stream)..((stream + 1) * per_stream).min(config.instances);
        let services = config.services;
        tasks.push(tokio::spawn(async move {
            let instances: Vec<pb::Instance> = range.map(|i| instance(i, services)).collect();
            let mut client = RotaClient::connect(&endpoint).await?;
            let registration = client.register(instances).await?;
            registration.require_all_accepted()?;
            Ok::<_, ClientError>(registration)
        }));
    }
    let mut registrations = Vec::new();
    for task in tasks {
        registrations.push(task.await.map_err(|e| ClientError::Closed(e.to_string()))??);
    }
    Ok((registrations, started.elapsed()))
}

/// Runs the pick load quietly, then again while some streams withdraw and re-announce their
/// instances in a loop; with `churn_first`, the churned run comes first, so that its picks are
/// the first the rule makes (tables a rule builds on first use are built under churn).
pub async fn compare_churn(
    config: &ScaleConfig,
    registrations: &mut [Registration],
    churn_first: bool,
) -> Result<(LoadResult, LoadResult, u64), ScaleError> {
    let channels = connect(&config.load.endpoint, config.load.connections).await?;
    let quiet = if churn_first { None } else { Some(run(&config.load, &channels, Mode::Pick).await?) };

    let churners = registrations.len().min(10);
    let stop_at = Instant::now() + config.load.warmup + config.load.duration;
    let mut handles = Vec::new();
    let per_stream = config.instances.div_ceil(config.streams.max(1));
    for (index, registration) in registrations.iter_mut().take(churners).enumerate() {
        // Each churner toggles its first 100 instances: withdraw, then announce again.
        let first = index * per_stream;
        let batch: Vec<pb::Instance> =
            (first..first + 100.min(per_stream)).map(|i| instance(i, config.services)).collect();
        let refs: Vec<pb::InstanceRef> =
            batch.iter().map(|i| pb::InstanceRef { service: i.service.clone(), id: i.id.clone() }).collect();
        handles.push(async move {
            let mut operations = 0u64;
            while Instant::now() < stop_at {
                registration.send(Msg::Withdraw(pb::Withdraw { instances: refs.clone() })).await?;
                registration.send(Msg::Announce(pb::Announce { instances: batch.clone() })).await?;
                operations += 1;
            }
            Ok::<u64, ClientError>(operations)
        });
    }
    let (churned, operations) =
        tokio::join!(run(&config.load, &channels, Mode::Pick), futures_util::future::join_all(handles));
    let mut total = 0;
    for result in operations {
        total += result?;
    }
    let churned = churned?;
    let quiet = match quiet {
        Some(quiet) => quiet,
        None => run(&config.load, &channels, Mode::Pick).await?,
    };
    Ok((quiet, churned, total))
}
