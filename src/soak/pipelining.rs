//! Scenario `pipelining`: pick streams pipelined on one connection the way grpc-go sends them,
//! beside a registration on the same connection.
//!
//! One HTTP/2 connection carries a `Register` stream (announcing the instances picked) and S
//! `PickStream`s (long: 16; short: 4) that each send R requests (long: 20,000; short: 5,000)
//! without waiting for any answer, every request in a DATA frame of its own (13 bytes), as
//! grpc-go writes them; the answers are read as they come. h2 counts small frames that wait
//! unread against a per-connection budget and used to close the whole connection (`GOAWAY
//! ENHANCE_YOUR_CALM too_many_data_frames`) once two streams pipelined.
//!
//! Checks: (a) every request is answered, and the connection never closed; (b) no ticket of
//! the rotation is answered twice, across all the streams; (c) the registration outlived the
//! run: its stream is still open and its instances are still picked from another connection.

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use bytes::BytesMut;
use tokio::time::Instant;

use super::rawh2::{RawConnection, message_frame, messages};
use super::{CALL_TIMEOUT, Check, ScenarioReport, SoakError, SoakOptions, bounded, ms};
use crate::client::{PickOptions, RotaClient};
use crate::pb::{self, register_request::Msg};

const SERVICE: &str = "pipelined";
/// The longest one stream may take for all its answers.
const STREAM_BOUND: Duration = Duration::from_secs(120);

pub async fn run(options: &SoakOptions, report: &mut ScenarioReport) -> Result<(), SoakError> {
    let streams = options.pick(4usize, 16);
    let requests = options.pick(5_000usize, 20_000);
    let mut target = options.target(&[])?;
    let server: SocketAddr =
        target.addr.parse().map_err(|_| SoakError::Setup(format!("not an address: {}", target.addr)))?;
    let connection = RawConnection::open(Ipv4Addr::LOCALHOST, server, 65_535)
        .await
        .map_err(|e| SoakError::Setup(format!("cannot connect: {e}")))?;
    let setup = |e: h2::Error| SoakError::Setup(format!("connection: {e}"));

    // The registration on the same connection.
    let (mut register, registered) = connection.stream("/rota.v1.Registry/Register").await.map_err(setup)?;
    let fleet: Vec<pb::Instance> = (0..3)
        .map(|n| pb::Instance {
            id: format!("p{n}"),
            service: SERVICE.into(),
            host: "127.0.0.1".into(),
            port: 30_000 + n,
            ..Default::default()
        })
        .collect();
    let announce = pb::RegisterRequest { msg: Some(Msg::Announce(pb::Announce { instances: fleet.clone() })) };
    register.send_data(message_frame(&announce), false).map_err(setup)?;
    let registered = tokio::time::timeout(CALL_TIMEOUT, registered)
        .await
        .map_err(|_| SoakError::Stalled("the registration's answer".into()))?
        .map_err(setup)?;
    let mut acks = registered.into_body();
    let mut buffer = BytesMut::new();
    let first_ack = tokio::time::timeout(CALL_TIMEOUT, async {
        while let Some(chunk) = acks.data().await {
            let chunk = chunk?;
            let _ = acks.flow_control().release_capacity(chunk.len());
            buffer.extend_from_slice(&chunk);
            if let Some(answer) = messages::<pb::RegisterResponse>(&mut buffer).ok().and_then(|m| m.into_iter().next())
            {
                return Ok(Some(answer));
            }
        }
        Ok::<_, h2::Error>(None)
    })
    .await
    .map_err(|_| SoakError::Stalled("the announce's ack".into()))?
    .map_err(setup)?;
    if !matches!(first_ack, Some(pb::RegisterResponse { msg: Some(pb::register_response::Msg::Ack(_)) })) {
        return Err(SoakError::Setup(format!("the announce was answered {first_ack:?}")));
    }

    // The pipelined pick streams.
    let started = Instant::now();
    let request = pb::PickRequest { service: SERVICE.into(), rule: "round_robin".into(), ..Default::default() };
    let frame = message_frame(&request);
    let mut tasks = Vec::new();
    for _ in 0..streams {
        let (mut send, answer) = connection.stream("/rota.v1.Balancer/PickStream").await.map_err(setup)?;
        let frame = frame.clone();
        tasks.push(tokio::spawn(tokio::time::timeout(STREAM_BOUND, async move {
            // Every request at once, each its own DATA frame; h2 holds what the window does
            // not let out yet.
            let text = |e: h2::Error| e.to_string();
            for _ in 0..requests {
                send.send_data(frame.clone(), false).map_err(text)?;
            }
            let mut body = answer.await.map_err(text)?.into_body();
            let (mut buffer, mut tickets, mut errors) = (BytesMut::new(), Vec::with_capacity(requests), Vec::new());
            while tickets.len() + errors.len() < requests {
                let Some(chunk) = body.data().await else { break };
                let chunk = chunk.map_err(text)?;
                let _ = body.flow_control().release_capacity(chunk.len());
                buffer.extend_from_slice(&chunk);
                for answer in messages::<pb::PickResponse>(&mut buffer).map_err(|e| e.to_string())? {
                    match answer.error {
                        Some(error) => errors.push(error.message),
                        None => tickets.push(answer.ticket),
                    }
                }
            }
            send.send_data(bytes::Bytes::new(), true).map_err(text)?;
            Ok::<_, String>((tickets, errors))
        })));
    }
    let (mut answered, mut failures, mut broken) = (0usize, Vec::new(), Vec::new());
    let mut seen = HashSet::new();
    let mut repeated = 0usize;
    for task in tasks {
        match task.await {
            Ok(Ok(Ok((tickets, errors)))) => {
                answered += tickets.len() + errors.len();
                failures.extend(errors);
                repeated += tickets.into_iter().filter(|t| !seen.insert(*t)).count();
            }
            Ok(Ok(Err(error))) => broken.push(error),
            Ok(Err(_)) => broken.push(format!("not all answered within {}", ms(STREAM_BOUND))),
            Err(error) => broken.push(format!("the stream's task failed: {error}")),
        }
    }
    let took = started.elapsed();
    let asked = streams * requests;
    report.figure("picks", format!("{answered} of {asked} answered over {streams} streams in {}", ms(took)));
    report.figure("rate", format!("{:.0} picks/s", answered as f64 / took.as_secs_f64()));
    report.check(Check::new(
        "every pipelined request is answered on a connection that stays up",
        answered == asked && broken.is_empty() && failures.is_empty(),
        format!(
            "{answered} of {asked} answered, {} failed picks, {} broken streams{}",
            failures.len(),
            broken.len(),
            broken.first().or(failures.first()).map(|e| format!(" (first: {e})")).unwrap_or_default()
        ),
    ));
    report.check(Check::new(
        "no ticket answered twice across the streams",
        repeated == 0 && !seen.is_empty(),
        format!("{} distinct tickets, {repeated} repeated", seen.len()),
    ));

    // The registration is still there.
    let still_open = tokio::time::timeout(Duration::from_millis(10), acks.data()).await.is_err();
    let mut consumer = bounded("connect", RotaClient::connect(&target.endpoint)).await?;
    let mut picked = HashSet::new();
    for _ in 0..fleet.len() {
        let answer = bounded("pick", consumer.pick(SERVICE, PickOptions::rule("round_robin"))).await?;
        if let Some(instance) = &answer.instance {
            picked.insert(instance.id.clone());
        }
    }
    report.check(Check::new(
        "the registration on the same connection survives",
        still_open && picked.len() == fleet.len(),
        format!(
            "its stream {}; {} of {} instances picked from another connection",
            if still_open { "is open" } else { "ended" },
            picked.len(),
            fleet.len()
        ),
    ));
    report.key = format!("{answered}/{asked} pipelined picks on {streams} streams, {repeated} repeated tickets");
    drop((register, acks, connection));
    if let Some(check) = target.alive_check() {
        report.check(check);
    }
    Ok(())
}
