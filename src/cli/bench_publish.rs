//! `rota bench --publication`: how long one Announce into a big service takes to be
//! acknowledged — the registry applies it, publishes the service, and the pick views for the
//! new snapshot are in place — measured from outside, p50 and p99.

use std::time::{Duration, Instant};

use crate::client::RotaClient;
use crate::pb::{self, register_request::Msg};

use super::CliError;
use super::bench::{BenchArgs, register, spawn};

/// Announces measured per service size.
const ANNOUNCES: usize = 200;

pub async fn run(args: BenchArgs) -> Result<(), CliError> {
    for size in [10_000usize, 100_000] {
        let streams = (size.div_ceil(1000) + 2).to_string();
        let (_server, endpoint) = spawn(&[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "off",
            "--max-registrations-per-peer",
            &streams,
        ])?;
        let service = format!("{}-publication", args.service);
        let _held = register(&endpoint, &service, size).await?;
        let mut client = RotaClient::connect(&endpoint).await?.with_pick_timeout(Duration::from_secs(60));
        // Rules that need tables have them built, as in a service in use: the first pick of a
        // rule queues the build (a Maglev table of 100,000 instances takes seconds) and answers
        // without it, with a fallback note, until the table is in.
        for rule in ["round_robin", "weighted", "consistent_hash", "best_available"] {
            let building = tokio::time::Instant::now();
            loop {
                let pick = client.pick(&service, crate::client::PickOptions::rule(rule).key("k")).await?;
                if pick.response.fallback != crate::rules::table_free::NOTE {
                    break;
                }
                if building.elapsed() > Duration::from_secs(120) {
                    let why = format!("the {rule} tables were not built within 120 s");
                    return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, why).into());
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let probe = |n: usize| pb::Instance {
            id: format!("publication-probe-{n}"),
            service: service.clone(),
            host: "127.0.0.1".into(),
            port: 30_000,
            ..Default::default()
        };
        let mut stream = client.register(vec![probe(0)]).await?;
        stream.require_all_accepted()?;
        let mut took = Vec::with_capacity(ANNOUNCES);
        for n in 1..=ANNOUNCES {
            let started = Instant::now();
            let ack = stream.send(Msg::Announce(pb::Announce { instances: vec![probe(n)] })).await?;
            took.push(started.elapsed());
            if !ack.refused.is_empty() {
                return Err(CliError::Usage(format!("announce refused: {:?}", ack.refused)));
            }
        }
        took.sort_unstable();
        let at = |q: f64| took[((took.len() as f64 * q) as usize).min(took.len() - 1)];
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        println!(
            "publication into a service of {size} instances: announce to ack p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms over {ANNOUNCES} announces",
            ms(at(0.5)),
            ms(at(0.99)),
            ms(took[took.len() - 1])
        );
    }
    Ok(())
}
