//! Scenario `watches`: a flood of `Watch` streams against providers registering.
//!
//! From 127.0.0.2, .3, .4 (long: up to .7), raw HTTP/2 connections open watches of many
//! services, never reading them, until rota refuses them: each address may hold
//! `max_consumer_streams_per_peer`, and watches and pick streams together four fifths of
//! `max_open_streams` (the server runs with 1,000 and 400 in the short run, its defaults of
//! 10,000 and 2,048 in the long one, where 12,000 watches are asked for). Then providers on
//! 127.0.0.1 register one after another, each on a stream of its own, and a consumer picks
//! their instances.
//!
//! Checks: (a) the watches were admitted up to the caps and no further, every refusal a
//! `RESOURCE_EXHAUSTED` naming one of the two settings; (b) every registration was accepted
//! within 5 s (the fifth of the streams kept for registrations); (c) every provider's instance
//! is picked.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::time::Instant;

use super::rawh2::{RawConnection, refusal};
use super::{CALL_TIMEOUT, Check, ScenarioReport, SoakError, SoakOptions, bounded, ms};
use crate::client::{PickOptions, RotaClient};
use crate::pb;

const REGISTER_BOUND: Duration = Duration::from_secs(5);
/// Watches per attacking connection (a connection takes at most 1,024 streams).
const WATCHES_PER_CONNECTION: usize = 500;

struct Sizing {
    max_open_streams: usize,
    per_peer: usize,
    attackers: u8,
    watches_per_attacker: usize,
    registrations: usize,
}

pub async fn run(options: &SoakOptions, report: &mut ScenarioReport) -> Result<(), SoakError> {
    let sizing = options.pick(
        Sizing { max_open_streams: 1_000, per_peer: 400, attackers: 3, watches_per_attacker: 500, registrations: 150 },
        Sizing {
            max_open_streams: 10_000,
            per_peer: 2_048,
            attackers: 6,
            watches_per_attacker: 2_000,
            registrations: 1_500,
        },
    );
    let flags = [
        "--max-open-streams".to_owned(),
        sizing.max_open_streams.to_string(),
        "--max-consumer-streams-per-peer".into(),
        sizing.per_peer.to_string(),
        "--max-registrations-per-peer".into(),
        sizing.registrations.to_string(),
    ];
    let mut target = options.target(&flags)?;
    let server: SocketAddr =
        target.addr.parse().map_err(|_| SoakError::Setup(format!("not an address: {}", target.addr)))?;

    // The flood: every watch asked for, each answer's headers awaited, none read.
    let started = Instant::now();
    let (mut held, mut connections) = (Vec::new(), Vec::new());
    let (mut admitted, mut refused, mut wrong) = (0usize, 0usize, Vec::new());
    let mut per_attacker = Vec::new();
    for a in 0..sizing.attackers {
        let from = Ipv4Addr::new(127, 0, 0, 2 + a);
        let mut theirs = 0;
        for first in (0..sizing.watches_per_attacker).step_by(WATCHES_PER_CONNECTION) {
            let connection = RawConnection::open(from, server, 65_535)
                .await
                .map_err(|e| SoakError::Setup(format!("cannot connect from {from}: {e}")))?;
            let count = WATCHES_PER_CONNECTION.min(sizing.watches_per_attacker - first);
            let calls =
                (first..first + count).map(|n| {
                    let watch = pb::WatchRequest { service: format!("watched-{a}-{n}") };
                    let connection = &connection;
                    async move {
                        tokio::time::timeout(CALL_TIMEOUT, connection.call("/rota.v1.Registry/Watch", &watch)).await
                    }
                });
            for answer in futures_util::future::join_all(calls).await {
                match answer {
                    Ok(Ok(response)) => match refusal(&response) {
                        None => {
                            admitted += 1;
                            theirs += 1;
                            held.push(response);
                        }
                        Some((code, message))
                            if code == "8"
                                && (message.contains("server.max_consumer_streams_per_peer")
                                    || message.contains("server.max_open_streams")) =>
                        {
                            refused += 1
                        }
                        Some((code, message)) => wrong.push(format!("grpc-status {code}: {message}")),
                    },
                    Ok(Err(error)) => wrong.push(error.to_string()),
                    Err(_) => wrong.push(format!("no answer within {}", ms(CALL_TIMEOUT))),
                }
            }
            connections.push(connection);
        }
        per_attacker.push(theirs);
    }
    let share = sizing.max_open_streams - sizing.max_open_streams / 5;
    let expected: usize = {
        let mut left = share;
        (0..sizing.attackers)
            .map(|_| {
                let theirs = sizing.per_peer.min(sizing.watches_per_attacker).min(left);
                left -= theirs;
                theirs
            })
            .sum()
    };
    report.figure(
        "watches",
        format!(
            "{admitted} admitted ({per_attacker:?} per address), {refused} refused, of {} asked, in {}",
            sizing.attackers as usize * sizing.watches_per_attacker,
            ms(started.elapsed())
        ),
    );
    report.check(Check::new(
        "watches are admitted up to the caps and refused past them",
        admitted == expected && wrong.is_empty() && per_attacker.iter().all(|&n| n <= sizing.per_peer),
        format!(
            "{admitted} admitted, {expected} expected ({} per address, {share} for consumers); {} other answers{}",
            sizing.per_peer,
            wrong.len(),
            wrong.first().map(|w| format!(" (first: {w})")).unwrap_or_default()
        ),
    ));

    // Providers register while the flood holds its streams.
    let (mut accepted, mut slowest, mut failures) = (0usize, Duration::ZERO, Vec::new());
    let (mut providers, mut clients) = (Vec::new(), Vec::new());
    for n in 0..sizing.registrations {
        let asked = Instant::now();
        let instance = pb::Instance {
            id: format!("p{n:04}"),
            service: "flooded".into(),
            host: "127.0.0.1".into(),
            port: 20_000 + n as u32,
            ..Default::default()
        };
        // A connection carries up to 500 registration streams, under its 1,024.
        if n % 500 == 0 {
            clients.push(bounded("connect", RotaClient::connect(&target.endpoint)).await?);
        }
        let client = clients.last_mut().expect("a client was just made");
        let registered = tokio::time::timeout(REGISTER_BOUND, async {
            let registration = client.register(vec![instance]).await?;
            registration.require_all_accepted()?;
            Ok::<_, crate::client::ClientError>(registration)
        })
        .await;
        slowest = slowest.max(asked.elapsed());
        match registered {
            Ok(Ok(registration)) => {
                accepted += 1;
                providers.push(registration);
            }
            Ok(Err(error)) => failures.push(error.to_string()),
            Err(_) => failures.push(format!("not accepted within {}", ms(REGISTER_BOUND))),
        }
    }
    report.figure("registrations", format!("{accepted} of {} accepted, slowest {}", sizing.registrations, ms(slowest)));
    report.check(Check::new(
        "registrations get in beside the flood",
        accepted == sizing.registrations,
        format!(
            "{accepted} of {} accepted within {}{}",
            sizing.registrations,
            ms(REGISTER_BOUND),
            failures.first().map(|f| format!("; first failure: {f}")).unwrap_or_default()
        ),
    ));

    let mut consumer = bounded("connect", RotaClient::connect(&target.endpoint)).await?;
    let mut picked = std::collections::HashSet::new();
    for _ in 0..accepted {
        let answer = bounded("pick", consumer.pick("flooded", PickOptions::rule("round_robin"))).await?;
        if let Some(instance) = &answer.instance {
            picked.insert(instance.id.clone());
        }
    }
    report.check(Check::new(
        "every provider's instance is picked",
        picked.len() == accepted,
        format!("{} distinct instances in {accepted} round_robin picks", picked.len()),
    ));
    report.key = format!("{admitted} watches held, {accepted}/{} registrations in", sizing.registrations);
    drop((held, connections, providers, clients));
    if let Some(check) = target.alive_check() {
        report.check(check);
    }
    Ok(())
}
