//! `rota.v1.Balancer`: unary and streamed picks.

use std::pin::Pin;
use std::sync::Arc;

use futures_util::{Stream, StreamExt};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::answers::{self, UnreadAnswers};
use super::convert;
use super::peers::{PeerSlot, PeerStreams};
use super::pick_wire::{PickAnswer, PickRequestView};
use super::streams::{OpenStreams, StreamKind, StreamSlot};
use super::warmup::Warmup;
use crate::balancer::{Balancer, MAX_LEASE, PickQuery};
use crate::pb;

/// `PickStream` requests read ahead of the picks that answer them. Reading promptly matters
/// with clients that send each small request as its own HTTP/2 DATA frames (grpc-go does):
/// frames left unread in the connection count against its small-frame budget, and a client
/// pipelining faster than picks are answered would otherwise have its whole connection closed
/// (`GOAWAY ENHANCE_YOUR_CALM`). Past this many, reading waits, and HTTP/2 flow control (the
/// small stream window set in [`crate::server`]) holds the client back.
const PICK_STREAM_READ_AHEAD: usize = 1024;

/// The most one `LeasedPick` adds to a `LeaseResponse`: tag and length, a 64-bit ticket and a
/// 32-bit position, each with its tag.
const LEASED_PICK_BYTES: usize = 2 + 11 + 6;
/// The most the other fields of a `LeaseResponse` (first ticket, count, epoch, the rule's and
/// the fallback's tags and lengths, the fallback flag) add.
const LEASE_FIELD_BYTES: usize = 11 + 6 + 11 + 6 + 2 + 64;

pub struct BalancerService {
    balancer: Arc<Balancer>,
    consumers: Arc<PeerStreams>,
    streams: Arc<OpenStreams>,
    warmup: Warmup,
    answers: Arc<UnreadAnswers>,
}

impl BalancerService {
    /// Pick streams take places among `consumers` (per client address, shared with watches)
    /// and the server's `streams`.
    pub fn new(balancer: Arc<Balancer>, consumers: Arc<PeerStreams>, streams: Arc<OpenStreams>) -> Self {
        let answers = UnreadAnswers::with_default_budgets();
        Self { balancer, consumers, streams, warmup: Warmup::default(), answers }
    }

    /// Counts leases against `answers` until their clients read them.
    pub fn with_answers(self, answers: Arc<UnreadAnswers>) -> Self {
        Self { answers, ..self }
    }

    /// Answers services not seen yet with `warming_up` until `warmup` ends.
    pub fn with_warmup(self, warmup: Warmup) -> Self {
        Self { warmup, ..self }
    }
}

/// The status of a failed pick or lease of `service`.
fn refused(balancer: &Balancer, warmup: &Warmup, service: &str, error: crate::balancer::PickError) -> Status {
    warmup.refine(balancer.registry(), service, error).into()
}

/// Refuses a lease of a seen service whose instances are still arriving during the warm-up,
/// with what its input is refused for if anything, else `warming_up`: the channels that lease
/// keep the last list and rotate over it meanwhile, so the first instance back is not sent
/// every call.
fn held(balancer: &Balancer, warmup: &Warmup, query: &PickQuery<'_>, count: u32) -> Result<(), Status> {
    match warmup.settling(balancer.registry(), query.service) {
        None => Ok(()),
        Some(warming_up) => {
            balancer.check_lease(query, count)?;
            Err(warming_up.into())
        }
    }
}

/// One pick as the API answers it, with the balancer's errors refined by the warm-up. A unary
/// pick is never held back while a seen service's instances arrive: its caller may have no list
/// to fall back on (leases are, see [`held`]).
async fn pick(balancer: &Balancer, warmup: &Warmup, query: PickQuery<'_>) -> Result<crate::balancer::Picked, Status> {
    let service = query.service;
    balancer.pick(query).await.map_err(|error| refused(balancer, warmup, service, error))
}

fn query(request: &pb::PickRequest) -> PickQuery<'_> {
    PickQuery {
        service: &request.service,
        rule: &request.rule,
        version: &request.version,
        key: &request.key,
        zone: &request.zone,
        exclude: &request.exclude,
    }
}

impl BalancerService {
    /// A unary Pick read in place and answered from the bytes encoded at publish (see
    /// [`super::pick_wire`]).
    pub async fn pick_view(&self, request: &PickRequestView) -> Result<PickAnswer, Status> {
        Ok(PickAnswer::new(pick(&self.balancer, &self.warmup, request.query()).await?))
    }
}

type PickStream = Pin<Box<dyn Stream<Item = Result<pb::PickResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl pb::balancer_server::Balancer for BalancerService {
    async fn pick(&self, request: Request<pb::PickRequest>) -> Result<Response<pb::PickResponse>, Status> {
        let picked = pick(&self.balancer, &self.warmup, query(request.get_ref())).await?;
        Ok(Response::new(convert::picked(picked)))
    }

    async fn report(&self, request: Request<pb::ReportRequest>) -> Result<Response<pb::ReportResponse>, Status> {
        let outcomes: Vec<_> = request.into_inner().outcomes.into_iter().map(convert::call_outcome).collect();
        let summary = self.balancer.report(&outcomes)?;
        Ok(Response::new(pb::ReportResponse { accepted: summary.accepted, ignored: summary.ignored }))
    }

    async fn lease(&self, request: Request<pb::LeaseRequest>) -> Result<Response<pb::LeaseResponse>, Status> {
        let peer = request.remote_addr().map(|addr| addr.ip());
        let request = request.into_inner();
        let query = PickQuery {
            service: &request.service,
            rule: &request.rule,
            version: &request.version,
            exclude: &request.exclude,
            ..Default::default()
        };
        held(&self.balancer, &self.warmup, &query, request.count)?;
        let meter = self.answers.meter(peer);
        // Room for the most the answer can take (every instance, every ticket) before any
        // ticket is drawn, so that a lease refused for want of it takes none.
        if let Some(snapshot) = self.balancer.registry().service(&request.service) {
            let picks = request.count.min(MAX_LEASE) as usize * LEASED_PICK_BYTES;
            let bytes = answers::listing_bytes(&snapshot) + picks + request.rule.len() + LEASE_FIELD_BYTES;
            meter.reserve_within(answers::message_bytes(bytes)).await?;
        }
        let leased = self
            .balancer
            .lease(query, request.count)
            .await
            .map_err(|e| refused(&self.balancer, &self.warmup, &request.service, e))?;
        let answer = pb::LeaseResponse {
            first_ticket: leased.first_ticket,
            count: leased.count,
            instances: leased.instances.iter().map(|i| convert::instance(i)).collect(),
            epoch: leased.epoch,
            rule: String::from(&*leased.rule),
            fallback: leased.fallback.unwrap_or_default(),
            picks: leased.picks.iter().map(|p| pb::LeasedPick { ticket: p.ticket, position: p.position }).collect(),
            positions: leased.positions,
        };
        meter.trim_to(answers::message_bytes(answer.encoded_len()));
        let mut response = Response::new(answer);
        response.extensions_mut().insert(meter);
        Ok(response)
    }

    type PickStreamStream = PickStream;

    /// Answers each request in order. A failed pick is reported in its response's `error` and
    /// the stream goes on; only a broken stream ends it.
    async fn pick_stream(
        &self,
        request: Request<Streaming<pb::PickRequest>>,
    ) -> Result<Response<Self::PickStreamStream>, Status> {
        let peer_slot = request.remote_addr().map(|addr| self.consumers.acquire(addr.ip())).transpose()?;
        let slot = (peer_slot, self.streams.acquire(StreamKind::Consumer)?);
        let balancer = self.balancer.clone();
        let warmup = self.warmup;
        let requests = read_ahead(request.into_inner(), slot);
        let responses = requests.then(move |request| {
            let balancer = balancer.clone();
            async move {
                let request = request?;
                Ok(match pick(&balancer, &warmup, query(&request)).await {
                    Ok(picked) => convert::picked(picked),
                    Err(status) => pb::PickResponse {
                        error: Some(pb::PickError { code: status.code() as i32, message: status.message().to_owned() }),
                        ..Default::default()
                    },
                })
            }
        });
        Ok(Response::new(Box::pin(responses)))
    }
}

/// Reads `inbound` in a task of its own into a queue of [`PICK_STREAM_READ_AHEAD`] requests; a
/// broken stream's status is passed on as the last item. The task holds the stream's `slot` and
/// ends with the stream or when the responses are dropped.
fn read_ahead(
    mut inbound: Streaming<pb::PickRequest>,
    slot: (Option<PeerSlot>, StreamSlot),
) -> ReceiverStream<Result<pb::PickRequest, Status>> {
    let (tx, rx) = mpsc::channel(PICK_STREAM_READ_AHEAD);
    tokio::spawn(async move {
        let _slot = slot;
        loop {
            let message = tokio::select! {
                message = inbound.message() => message,
                () = tx.closed() => break,
            };
            let next = match message {
                Ok(Some(request)) => Ok(request),
                Ok(None) => break,
                Err(status) => Err(status),
            };
            let end = next.is_err();
            if tx.send(next).await.is_err() || end {
                break;
            }
        }
    });
    ReceiverStream::new(rx)
}
