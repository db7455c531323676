//! `rota.v1.Registry`: registration streams, listings and watches.

use std::pin::Pin;
use std::sync::Arc;

use futures_util::Stream;
use prost::Message;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::answers::{self, Meter, UnreadAnswers};
use super::peers::PeerStreams;
use super::streams::{OpenStreams, StreamKind, unless_shed};
use super::warmup::Warmup;
use super::watch_wire::WatchItem;
use super::{auth, convert, register, status};
use crate::balancer::PickError;
use crate::overload::Overload;
use crate::pb::{self, watch_event::Event};
use crate::registry::{Change, Registry, ServiceSnapshot, diff, validate_service_name};

pub struct RegistryService {
    registry: Registry,
    drain: watch::Receiver<bool>,
    peers: Arc<PeerStreams>,
    consumers: Arc<PeerStreams>,
    streams: Arc<OpenStreams>,
    warmup: Warmup,
    answers: Arc<UnreadAnswers>,
    overload: Arc<Overload>,
    sources: crate::sources::Sources,
}

impl RegistryService {
    /// `drain` turns true when the server begins a graceful shutdown; each client address may
    /// hold at most `registrations_per_peer` registration streams and its share of
    /// `consumers` (watches and pick streams, shared with the balancer service), and
    /// registrations and watches take their places among the server's `streams`.
    pub fn new(
        registry: Registry,
        drain: watch::Receiver<bool>,
        registrations_per_peer: usize,
        consumers: Arc<PeerStreams>,
        streams: Arc<OpenStreams>,
    ) -> Self {
        Self {
            registry,
            drain,
            peers: PeerStreams::registrations(registrations_per_peer),
            consumers,
            streams,
            warmup: Warmup::default(),
            answers: UnreadAnswers::with_default_budgets(),
            overload: Arc::new(Overload::new(None)),
            sources: Default::default(),
        }
    }

    /// Counts listings and watch events against `answers` until their clients read them.
    pub fn with_answers(self, answers: Arc<UnreadAnswers>) -> Self {
        Self { answers, ..self }
    }

    /// Hides services not seen yet from listings and watches until `warmup` ends.
    pub fn with_warmup(self, warmup: Warmup) -> Self {
        Self { warmup, ..self }
    }

    /// Says in listings how the sources their instances come from are doing.
    pub fn with_sources(self, sources: crate::sources::Sources) -> Self {
        Self { sources, ..self }
    }

    /// Refuses and ends watches under memory pressure ([`crate::overload`]).
    pub fn with_overload(self, overload: Arc<Overload>) -> Self {
        Self { overload, ..self }
    }
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

fn checked_service(name: &str) -> Result<(), Status> {
    Ok(validate_service_name("service", name)?)
}

#[tonic::async_trait]
impl pb::registry_server::Registry for RegistryService {
    type RegisterStream = ReceiverStream<Result<pb::RegisterResponse, Status>>;

    async fn register(
        &self,
        request: Request<Streaming<pb::RegisterRequest>>,
    ) -> Result<Response<Self::RegisterStream>, Status> {
        let principal = auth::require_register(&request)?;
        if *self.drain.borrow() {
            // A provider that reconnects here while this server drains would be sent away at
            // once; tell it now, so it goes on to another replica without an announce.
            return Err(status::Draining.into());
        }
        let peer_slot = request.remote_addr().map(|addr| self.peers.acquire(addr.ip())).transpose()?;
        let slots = (peer_slot, self.streams.acquire(StreamKind::Register)?);
        Ok(Response::new(register::serve(&self.registry, request.into_inner(), self.drain.clone(), slots, principal)))
    }

    async fn list_services(
        &self,
        request: Request<pb::ListServicesRequest>,
    ) -> Result<Response<pb::ListServicesResponse>, Status> {
        auth::require_pick(&request)?;
        let catalog = self.registry.catalog();
        let mut services: Vec<pb::ServiceSummary> = catalog
            .snapshots()
            .map(|s| pb::ServiceSummary {
                name: s.name.to_string(),
                instances: s.instances.len() as u32,
                up: s.up_count() as u32,
                epoch: s.epoch,
            })
            .collect();
        services.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(Response::new(pb::ListServicesResponse { services }))
    }

    async fn list_instances(
        &self,
        request: Request<pb::ListInstancesRequest>,
    ) -> Result<Response<pb::ListInstancesResponse>, Status> {
        auth::require_pick(&request)?;
        let name = &request.get_ref().service;
        checked_service(name)?;
        // Only a service not seen yet: a listing is no stream of calls to hold back.
        if let Some(warming_up) = self.warmup.unseen(&self.registry, name) {
            return Err(warming_up.into());
        }
        let snapshot =
            self.registry.service(name).ok_or_else(|| Status::from(PickError::UnknownService(name.clone())))?;
        // Room for the answer first, so that a listing waiting for it holds nothing built.
        let meter = self.answers.meter(request.remote_addr().map(|addr| addr.ip()));
        let sources = self.source_states(&snapshot);
        let sources_bytes: usize = sources.iter().map(|s| 2 + s.encoded_len()).sum();
        let bytes = answers::message_bytes(answers::listing_bytes(&snapshot) + EPOCH_BYTES + sources_bytes);
        meter.reserve_within(bytes).await?;
        let instances = snapshot.instances.iter().map(|i| convert::instance(i)).collect();
        let answer = pb::ListInstancesResponse { instances, epoch: snapshot.epoch, sources };
        meter.trim_to(answers::message_bytes(answer.encoded_len()));
        let mut response = Response::new(answer);
        response.extensions_mut().insert(meter);
        Ok(response)
    }

    type WatchStream = BoxStream<pb::WatchEvent>;

    /// Served through [`super::watch_wire::RegistryRoutes`] with encoded snapshots; this path
    /// (the generated server's) decodes them back into messages.
    async fn watch(&self, request: Request<pb::WatchRequest>) -> Result<Response<Self::WatchStream>, Status> {
        use futures_util::StreamExt;
        let items = self.watch_items(request).await?;
        let (metadata, items, extensions) = items.into_parts();
        let events = items.map(|item| item.and_then(WatchItem::into_event));
        Ok(Response::from_parts(metadata, Box::pin(events) as Self::WatchStream, extensions))
    }
}

impl RegistryService {
    /// The states of the sources `snapshot`'s instances come from, in the order rota follows
    /// them (at most one per configured source).
    fn source_states(&self, snapshot: &ServiceSnapshot) -> Vec<pb::SourceState> {
        let named: std::collections::BTreeSet<&str> =
            snapshot.instances.iter().filter_map(|i| i.source.as_deref()).collect();
        if named.is_empty() {
            return Vec::new();
        }
        self.sources
            .views()
            .into_iter()
            .filter(|view| named.contains(view.name.as_str()))
            .map(|view| pb::SourceState {
                name: view.name,
                up: view.up,
                last_read_unix_seconds: view.last_read.unwrap_or(0),
            })
            .collect()
    }

    /// A service that has not been registered yet can be watched: the first event is then an
    /// empty snapshot at epoch 0, and instances arrive as they register. During the start-up
    /// [warm-up](super::warmup) that first snapshot waits until the service appears or the
    /// warm-up ends. The first event is the snapshot's shared encoding
    /// ([`super::watch_wire::snapshot_event`]).
    pub async fn watch_items(
        &self,
        request: Request<pb::WatchRequest>,
    ) -> Result<Response<std::pin::Pin<Box<dyn Stream<Item = Result<WatchItem, Status>> + Send + 'static>>>, Status>
    {
        auth::require_pick(&request)?;
        let peer = request.remote_addr();
        let name = request.into_inner().service;
        checked_service(&name)?;
        if *self.drain.borrow() {
            return Err(status::Draining.into());
        }
        self.overload.admit()?;
        let peer_slot = peer.map(|addr| self.consumers.acquire(addr.ip())).transpose()?;
        let slot = (peer_slot, self.streams.acquire(StreamKind::Consumer)?);
        let meter = self.answers.meter(peer.map(|addr| addr.ip()));
        let events = meter.clone();
        let mut snapshots = self.registry.subscribe(&name).await?;
        let mut drain = self.drain.clone();
        let warmup = self.warmup;
        let (tx, rx) = mpsc::channel(64);
        let shed = tx.clone();
        tokio::spawn(unless_shed(self.overload.clone(), shed, async move {
            let _slot = slot;
            tokio::select! {
                () = warmup.until_seen(&mut snapshots) => {}
                () = tx.closed() => return,
                () = register::draining(&mut drain) => {
                    let _ = tx.send(Err(status::Draining.into())).await;
                    return;
                }
            }
            let mut last: Arc<ServiceSnapshot> = snapshots.borrow_and_update().clone();
            // Room for the snapshot before it is built: a watch whose client does not read
            // waits here, holding no event.
            let bytes = answers::message_bytes(answers::listing_bytes(&last) + 2 * EPOCH_BYTES);
            if !reserved(&events, bytes, &tx).await {
                return;
            }
            let first = super::watch_wire::snapshot_event(&last);
            events.trim_to(answers::message_bytes(first.len()));
            if tx.send(Ok(WatchItem::Encoded(first))).await.is_err() {
                return;
            }
            loop {
                tokio::select! {
                    changed = snapshots.changed() => {
                        if changed.is_err() {
                            break;
                        }
                        let current = snapshots.borrow_and_update().clone();
                        for change in diff(&last.instances, &current.instances) {
                            let event = match change {
                                Change::Added(i) => Event::Added(convert::instance(&i)),
                                Change::Updated { new, .. } => Event::Updated(convert::instance(&new)),
                                Change::Removed(i) => Event::Removed(pb::InstanceRef {
                                    service: i.service.to_string(),
                                    id: i.id.to_string(),
                                }),
                            };
                            let event = pb::WatchEvent { event: Some(event), epoch: current.epoch };
                            if !reserved(&events, answers::message_bytes(event.encoded_len()), &tx).await
                                || tx.send(Ok(WatchItem::Event(Box::new(event)))).await.is_err()
                            {
                                return;
                            }
                        }
                        last = current;
                    }
                    () = tx.closed() => break,
                    () = register::draining(&mut drain) => {
                        let _ = tx.send(Err(status::Draining.into())).await;
                        break;
                    }
                }
            }
        }));
        let items: std::pin::Pin<Box<dyn Stream<Item = Result<WatchItem, Status>> + Send + 'static>> =
            Box::pin(ReceiverStream::new(rx));
        let mut response = Response::new(items);
        response.extensions_mut().insert(meter);
        Ok(response)
    }
}

/// The most an `epoch` field (a tag and a 64-bit varint) adds to a message.
const EPOCH_BYTES: usize = 11;

/// Waits for room for `bytes` of a watch's events; false once its client has gone.
async fn reserved(meter: &Meter, bytes: usize, tx: &mpsc::Sender<Result<WatchItem, Status>>) -> bool {
    tokio::select! {
        () = meter.reserve(bytes) => true,
        () = tx.closed() => false,
    }
}
