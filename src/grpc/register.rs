//! The server side of one `Register` stream.
//!
//! The stream holds a [`Lease`](crate::registry::Lease) for its whole life. Each Announce,
//! Update and Withdraw is applied and acknowledged in order; every message, heartbeats included,
//! keeps the lease alive. When the stream ends — a clean close, a reset, or the consumer of the
//! responses going away — the lease is dropped and its instances leave the registry at once.
//! When the registry expires a silent lease, or the server begins a graceful shutdown, the
//! provider is sent `Closing` and the stream ends.

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};
use tracing::debug;

use super::peers::PeerSlot;
use super::streams::StreamSlot;
use super::{convert, status};
use crate::pb::{self, register_request::Msg};
use std::sync::Arc;

use crate::auth::Principal;
use crate::registry::{InstanceRef, InvalidField, Lease, Outcome, Refused, Registry};

/// Responses buffered for a slow reader before the stream stops reading requests.
const RESPONSE_BUFFER: usize = 16;

/// Why a stream is ended when the server shuts down.
pub const SHUTTING_DOWN: &str = "rota is shutting down; reconnect to another replica and announce again";

pub fn serve(
    registry: &Registry,
    inbound: Streaming<pb::RegisterRequest>,
    drain: watch::Receiver<bool>,
    slots: (Option<PeerSlot>, StreamSlot),
    principal: Option<Arc<Principal>>,
) -> ReceiverStream<Result<pb::RegisterResponse, Status>> {
    let (tx, rx) = mpsc::channel(RESPONSE_BUFFER);
    let lease = registry.open_lease_for(principal.as_ref().map(|p| Arc::from(p.name.as_str())));
    tokio::spawn(async move {
        run(lease, inbound, tx, drain, principal).await;
        // The peer's and the server's places are free once the stream has ended.
        drop(slots);
    });
    ReceiverStream::new(rx)
}

/// Resolves once a graceful shutdown has begun; never if the server is gone without one.
pub async fn draining(drain: &mut watch::Receiver<bool>) {
    if drain.wait_for(|draining| *draining).await.is_err() {
        std::future::pending::<()>().await;
    }
}

async fn run(
    mut lease: Lease,
    mut inbound: Streaming<pb::RegisterRequest>,
    tx: mpsc::Sender<Result<pb::RegisterResponse, Status>>,
    mut drain: watch::Receiver<bool>,
    principal: Option<Arc<Principal>>,
) {
    let expiry = lease.take_expiry();
    tokio::pin!(expiry);
    let mut seq = 0;
    let mut drained = false;
    loop {
        tokio::select! {
            () = &mut expiry => {
                let reason = format!(
                    "no message within the heartbeat timeout of {} ms; instances removed, reconnect and announce again",
                    lease.heartbeat_timeout().as_millis()
                );
                let closing = pb::register_response::Msg::Closing(pb::Closing { reason });
                let _ = tx.send(Ok(pb::RegisterResponse { msg: Some(closing) })).await;
                break;
            }
            () = draining(&mut drain) => {
                let closing = pb::register_response::Msg::Closing(pb::Closing { reason: SHUTTING_DOWN.into() });
                let _ = tx.send(Ok(pb::RegisterResponse { msg: Some(closing) })).await;
                drained = true;
                break;
            }
            message = inbound.message() => match message {
                Ok(Some(request)) => {
                    let Some(outcome) = handle(&lease, request, principal.as_deref()).await else { continue };
                    seq += 1;
                    let ack = ack(&lease, seq, outcome);
                    if tx.send(Ok(ack)).await.is_err() {
                        break;
                    }
                }
                Ok(None) => break,
                Err(error) => {
                    // An undecodable or oversized message: the provider is told why (with the
                    // code the decoder gave) rather than seeing the stream end as if closed.
                    debug!(lease = lease.id(), %error, "registration stream broken");
                    let _ = tx.send(Err(error)).await;
                    break;
                }
            },
            () = tx.closed() => break,
        }
    }
    if drained {
        // The provider moves to another replica, but this one keeps answering picks during
        // its grace period: the stream ends, its instances stay (kept alive) until exit.
        drop((inbound, tx));
        let mut ticker = tokio::time::interval(lease.heartbeat_timeout() / 3);
        loop {
            ticker.tick().await;
            lease.touch();
        }
    }
    // Dropping the lease here removes its instances.
}

/// Applies one message; `None` for heartbeats, which are not acknowledged.
async fn handle(lease: &Lease, request: pb::RegisterRequest, principal: Option<&Principal>) -> Option<Outcome> {
    // With authentication on, a token only touches the services its register scopes name.
    let mut forbidden = Vec::new();
    let mut permitted = |service: &str, id: &str| match principal {
        Some(p) if !p.may_register(service) => {
            let refusal = Refused::NotPermitted { service: service.to_owned(), principal: p.name.clone() };
            forbidden.push((InstanceRef { service: service.to_owned(), id: id.to_owned() }, refusal));
            false
        }
        _ => true,
    };
    let applied = match request.msg {
        Some(Msg::Heartbeat(_)) => {
            lease.touch();
            return None;
        }
        Some(Msg::Announce(announce)) => {
            let specs: Vec<_> = announce
                .instances
                .into_iter()
                .filter(|i| permitted(&i.service, &i.id))
                .map(convert::instance_spec)
                .collect();
            if specs.is_empty() && !forbidden.is_empty() { Ok(Outcome::default()) } else { lease.announce(specs).await }
        }
        Some(Msg::Update(update)) => {
            let target = update.instance.clone().unwrap_or_default();
            if permitted(&target.service, &target.id) {
                lease.update(convert::instance_update(update)).await
            } else {
                Ok(Outcome::default())
            }
        }
        Some(Msg::Withdraw(withdraw)) => {
            let refs: Vec<_> = withdraw.instances.into_iter().filter(|r| permitted(&r.service, &r.id)).collect();
            if refs.is_empty() && !forbidden.is_empty() {
                Ok(Outcome::default())
            } else {
                lease.withdraw(refs.into_iter().map(convert::instance_ref).collect()).await
            }
        }
        None => {
            lease.touch();
            let problem = InvalidField::new("msg", "is empty; set one of announce, heartbeat, update or withdraw");
            return Some(Outcome { accepted: Vec::new(), refused: vec![(Default::default(), problem.into())] });
        }
    };
    let mut outcome = applied.unwrap_or_else(|_| Outcome {
        accepted: Vec::new(),
        refused: vec![(Default::default(), Refused::ShuttingDown)],
    });
    outcome.refused.extend(forbidden);
    Some(outcome)
}

fn ack(lease: &Lease, seq: u64, outcome: Outcome) -> pb::RegisterResponse {
    let refused = outcome
        .refused
        .into_iter()
        .map(|(instance, why)| pb::Refusal {
            instance: Some(convert::pb_instance_ref(instance)),
            code: status::refusal_code(&why) as i32,
            message: why.to_string(),
        })
        .collect();
    let ack = pb::Ack {
        lease_id: lease.id(),
        seq,
        accepted: outcome.accepted.into_iter().map(convert::pb_instance_ref).collect(),
        refused,
        heartbeat_timeout_ms: lease.heartbeat_timeout().as_millis() as u64,
    };
    pb::RegisterResponse { msg: Some(pb::register_response::Msg::Ack(ack)) }
}
