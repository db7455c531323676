//! `envoy.service.discovery.v3.AggregatedDiscoveryService` on rota's gRPC listener: each
//! stream is a [`Session`] fed by the client's requests and woken by the [`Hub`].

use std::sync::Arc;

use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryService;
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::answers::{self, UnreadAnswers};
use super::peers::PeerStreams;
use super::streams::{OpenStreams, StreamKind, unless_shed};
use super::{auth, register, status};
use crate::overload::Overload;
use crate::xds::{Hub, Session};

pub struct XdsService {
    hub: Arc<Hub>,
    consumers: Arc<PeerStreams>,
    streams: Arc<OpenStreams>,
    drain: watch::Receiver<bool>,
    answers: Arc<UnreadAnswers>,
    overload: Arc<Overload>,
}

impl XdsService {
    /// Each stream takes a consumer's place per client address (`consumers`, shared with
    /// `Watch` and `PickStream`) and among the server's `streams`.
    pub fn new(
        hub: Arc<Hub>,
        consumers: Arc<PeerStreams>,
        streams: Arc<OpenStreams>,
        drain: watch::Receiver<bool>,
    ) -> Self {
        let answers = UnreadAnswers::with_default_budgets();
        Self { hub, consumers, streams, drain, answers, overload: Arc::new(Overload::new(None)) }
    }

    /// Refuses and ends streams under memory pressure ([`crate::overload`]).
    pub fn with_overload(self, overload: Arc<Overload>) -> Self {
        Self { overload, ..self }
    }

    /// Counts the responses against `answers` until their clients read them.
    pub fn with_answers(self, answers: Arc<UnreadAnswers>) -> Self {
        Self { answers, ..self }
    }
}

/// Responses queued for a client that does not read: the session computes the next one only
/// when there is room, so a slow client holds at most this many, however often things change.
const QUEUED_RESPONSES: usize = 2;

#[tonic::async_trait]
impl AggregatedDiscoveryService for XdsService {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        auth::require_pick(&request)?;
        if *self.drain.borrow() {
            return Err(status::Draining.into());
        }
        self.overload.admit()?;
        let peer = request.remote_addr();
        let peer_slot = peer.map(|addr| self.consumers.acquire(addr.ip())).transpose()?;
        let slot = (peer_slot, self.streams.acquire(StreamKind::Consumer)?);
        let mut inbound = request.into_inner();
        let mut session = Session::new(self.hub.clone(), peer);
        let mut generations = self.hub.generations();
        let mut drain = self.drain.clone();
        let (tx, rx) = mpsc::channel(QUEUED_RESPONSES);
        let meter = self.answers.meter(peer.map(|addr| addr.ip()));
        let responses = meter.clone();
        let shed = tx.clone();
        tokio::spawn(unless_shed(self.overload.clone(), shed, async move {
            let _slot = slot;
            loop {
                tokio::select! {
                    message = inbound.message() => match message {
                        Ok(Some(request)) => {
                            if let Err(refused) = session.on_request(request) {
                                let _ = tx.send(Err(status::xds_refused(&refused))).await;
                                return;
                            }
                        }
                        Ok(None) | Err(_) => return,
                    },
                    changed = generations.changed() => if changed.is_err() { return },
                    () = tx.closed() => return,
                    () = register::draining(&mut drain) => {
                        let _ = tx.send(Err(status::Draining.into())).await;
                        return;
                    }
                }
                for response in session.responses() {
                    // Room for it among the answers its client has not read yet; a client that
                    // does not read waits here, holding this batch (a response per resource type).
                    let bytes = answers::message_bytes(prost::Message::encoded_len(&response));
                    tokio::select! {
                        () = responses.reserve(bytes) => {}
                        () = tx.closed() => return,
                    }
                    if tx.send(Ok(response)).await.is_err() {
                        return;
                    }
                }
            }
        }));
        let mut response = Response::new(ReceiverStream::new(rx));
        response.extensions_mut().insert(meter);
        Ok(response)
    }

    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn delta_aggregated_resources(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        Err(Status::unimplemented(
            "rota serves state-of-the-world ADS (StreamAggregatedResources) only, not incremental (delta) xDS",
        ))
    }
}
