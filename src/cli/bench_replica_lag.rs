//! `rota bench --replica-lag`: how long a registration change made on one replica takes to
//! reach another, with Redis 0, 100 and 200 ms of round trip away.
//!
//! One `redis-server` on a free loopback port; for each added round trip, a loopback proxy in
//! front of it holding every chunk for half of it each way, and two `rota serve` replicas
//! reaching Redis through it (each round on its own database). A provider on replica 1 makes
//! 100 changes one at a time, alternately announcing a new instance and withdrawing the one
//! before, each after a random pause of up to 250 ms (changes land at any moment of the other
//! replica's reads); a Watch on replica 2 times each from its acknowledgement to its event.
//! Prints p50, p99 and max per round trip, for the announces and the withdrawals.

use std::time::{Duration, Instant};

use crate::client::RotaClient;
use crate::pb::{self, register_request::Msg, watch_event::Event};
use crate::soak::proxy::LatencyProxy;

use super::CliError;
use super::bench::{BenchArgs, spawn};
use super::redis_process::start_redis;

/// Changes timed per round trip.
const CHANGES: u32 = 100;
/// The longest a change may take before the run fails.
const PATIENCE: Duration = Duration::from_secs(10);

fn usage(e: impl std::fmt::Display) -> CliError {
    CliError::Usage(e.to_string())
}

pub async fn run(args: BenchArgs) -> Result<(), CliError> {
    let (_redis, base) = start_redis().await.map_err(|e| usage(format!("{e} (needs redis-server)")))?;
    let port: u16 = base.rsplit(':').next().and_then(|p| p.parse().ok()).ok_or_else(|| usage("redis address"))?;
    println!("added round trip | announce p50 / p99 / max | withdrawal p50 / p99 / max ({CHANGES} changes)");
    for (n, round_trip) in [0u64, 100, 200].into_iter().enumerate() {
        let proxy = LatencyProxy::start(port, Duration::from_millis(round_trip / 2)).await.map_err(usage)?;
        let state = format!("redis://127.0.0.1:{}/{}", proxy.port, n + 6);
        let (announced, withdrawn) = lags(&state, &format!("{}-lag", args.service)).await?;
        println!("{round_trip:>13} ms | {} | {}", summary(announced), summary(withdrawn));
    }
    Ok(())
}

/// The lags of announces and of withdrawals between two replicas on `state`.
async fn lags(state: &str, service: &str) -> Result<(Vec<Duration>, Vec<Duration>), CliError> {
    let serve = || spawn(&["serve", "--listen", "127.0.0.1:0", "--admin-listen", "off", "--state", state]);
    let (_one, first) = serve()?;
    let (_two, second) = serve()?;
    let instance = |n: u32| pb::Instance {
        id: format!("lag-{n:03}"),
        service: service.to_owned(),
        host: "127.0.0.1".into(),
        port: 20_000 + n,
        ..Default::default()
    };
    // The service must exist on the second replica before it can be watched.
    let seed = RotaClient::connect(&second).await?.register(vec![instance(999)]).await?;
    seed.require_all_accepted()?;
    let mut events = RotaClient::connect(&second).await?.watch(service).await?;
    let mut provider = RotaClient::connect(&first).await?.register(vec![instance(0)]).await?;
    provider.require_all_accepted()?;
    let (mut announced, mut withdrawn) = (Vec::new(), Vec::new());
    for n in 1..=CHANGES {
        tokio::time::sleep(Duration::from_millis(fastrand::u64(0..250))).await;
        let (message, id, added) = if n % 2 == 1 {
            (Msg::Announce(pb::Announce { instances: vec![instance(n)] }), format!("lag-{n:03}"), true)
        } else {
            let gone = format!("lag-{:03}", n - 1);
            let target = pb::InstanceRef { service: service.to_owned(), id: gone.clone() };
            (Msg::Withdraw(pb::Withdraw { instances: vec![target] }), gone, false)
        };
        let ack = provider.send(message).await?;
        let acked = Instant::now();
        if !ack.refused.is_empty() {
            return Err(usage(format!("{id} refused: {:?}", ack.refused)));
        }
        tokio::time::timeout(PATIENCE, async {
            while let Some(event) = events.message().await? {
                match event.event {
                    Some(Event::Added(i)) if added && i.id == id => return Ok(()),
                    Some(Event::Removed(r)) if !added && r.id == id => return Ok(()),
                    _ => {}
                }
            }
            Err(tonic::Status::unavailable("watch ended"))
        })
        .await
        .map_err(|_| usage(format!("{id} did not reach the second replica within {PATIENCE:?}")))?
        .map_err(usage)?;
        if added { &mut announced } else { &mut withdrawn }.push(acked.elapsed());
    }
    Ok((announced, withdrawn))
}

fn summary(mut lags: Vec<Duration>) -> String {
    lags.sort_unstable();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let at = |q: f64| lags[((lags.len() as f64 * q) as usize).min(lags.len() - 1)];
    format!("{:>4.0} / {:>4.0} / {:>4.0} ms", ms(at(0.5)), ms(at(0.99)), ms(*lags.last().unwrap_or(&Duration::ZERO)))
}
