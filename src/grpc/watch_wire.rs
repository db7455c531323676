//! `rota.v1.Registry/Watch` on the wire: a watch's first event, the service's whole instance
//! list, encoded once per published change and shared by every watch that starts on it.
//!
//! Many watches of one service start together (a fleet of consumers restarting, every
//! `rota:///` channel of a deployment): built per watch, each snapshot cost the whole list's
//! protobuf messages and their encoding, thousands of times over. Here the first watch of an
//! epoch writes the `WatchEvent` from the bytes each instance already carries
//! ([`crate::registry::Instance::answer`]) into [`crate::registry::ServiceSnapshot::watch_answer`],
//! and every watch sends those bytes ([`WatchItem::Encoded`]); the events after it, small and
//! each watch's own, are messages as before. The bytes are what prost writes for the same
//! event (a test holds them to it).
//!
//! [`RegistryRoutes`] serves this one path with [`WatchCodec`] and hands every other path of
//! the service to the generated server.

use std::sync::Arc;

use bytes::{BufMut, Bytes};
use futures_util::Stream;
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint};
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::server::{Grpc, ServerStreamingService};

use super::registry::RegistryService;
use futures_util::future::BoxFuture;

use super::routes::{OnePath, PathHandler};
use crate::pb;
use crate::registry::ServiceSnapshot;

/// The path this module serves.
pub const WATCH_PATH: &str = "/rota.v1.Registry/Watch";

/// One event of a watch: encoded already, or a message to encode.
#[derive(Debug, Clone)]
pub enum WatchItem {
    /// A whole `WatchEvent`, encoded.
    Encoded(Bytes),
    Event(Box<pb::WatchEvent>),
}

impl WatchItem {
    pub fn encoded_len(&self) -> usize {
        match self {
            WatchItem::Encoded(bytes) => bytes.len(),
            WatchItem::Event(event) => event.encoded_len(),
        }
    }

    /// The event as a message (for the generated server's path, and tests).
    pub fn into_event(self) -> Result<pb::WatchEvent, Status> {
        match self {
            WatchItem::Encoded(bytes) => {
                pb::WatchEvent::decode(bytes).map_err(|error| Status::internal(error.to_string()))
            }
            WatchItem::Event(event) => Ok(*event),
        }
    }
}

/// `snapshot`'s first event, `WatchEvent { snapshot: InstanceList { instances }, epoch }`,
/// encoded for the first watch of its epoch and kept with it for the others.
pub fn snapshot_event(snapshot: &ServiceSnapshot) -> Bytes {
    snapshot
        .watch_answer
        .get_or_init(|| {
            let answers: Vec<&Bytes> = snapshot
                .instances
                .iter()
                .map(|i| i.answer.get_or_init(|| super::convert::encoded_instance(i)))
                .collect();
            let list_len: usize =
                answers.iter().map(|a| 1 + encoded_len_varint(a.len() as u64) + a.len()).sum::<usize>();
            let epoch_len = if snapshot.epoch == 0 { 0 } else { 1 + encoded_len_varint(snapshot.epoch) };
            let mut out = Vec::with_capacity(1 + encoded_len_varint(list_len as u64) + list_len + epoch_len);
            // WatchEvent.snapshot (1): an InstanceList, whose instances (1) are the answers.
            encode_key(1, WireType::LengthDelimited, &mut out);
            encode_varint(list_len as u64, &mut out);
            for answer in answers {
                encode_key(1, WireType::LengthDelimited, &mut out);
                encode_varint(answer.len() as u64, &mut out);
                out.put_slice(answer);
            }
            // WatchEvent.epoch (5), left out at zero as prost does.
            if snapshot.epoch != 0 {
                encode_key(5, WireType::Varint, &mut out);
                encode_varint(snapshot.epoch, &mut out);
            }
            Bytes::from(out)
        })
        .clone()
}

/// Reads `WatchRequest`s and writes [`WatchItem`]s.
#[derive(Debug, Clone, Copy, Default)]
pub struct WatchCodec;

impl Codec for WatchCodec {
    type Encode = WatchItem;
    type Decode = pb::WatchRequest;
    type Encoder = WatchCodec;
    type Decoder = WatchCodec;

    fn encoder(&mut self) -> Self::Encoder {
        WatchCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        WatchCodec
    }
}

impl Encoder for WatchCodec {
    type Item = WatchItem;
    type Error = Status;

    fn encode(&mut self, item: WatchItem, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.reserve(item.encoded_len());
        match item {
            WatchItem::Encoded(bytes) => dst.put_slice(&bytes),
            WatchItem::Event(event) => {
                event.encode(dst).map_err(|error| Status::internal(error.to_string()))?;
            }
        }
        Ok(())
    }
}

impl Decoder for WatchCodec {
    type Item = pb::WatchRequest;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<pb::WatchRequest>, Status> {
        // The status prost's codec gives a message it cannot decode.
        pb::WatchRequest::decode(src).map(Some).map_err(|error| Status::internal(error.to_string()))
    }
}

/// The watch stream, answered with [`WatchItem`]s.
struct WatchMethod(Arc<RegistryService>);

type WatchItems = std::pin::Pin<Box<dyn Stream<Item = Result<WatchItem, Status>> + Send + 'static>>;

impl ServerStreamingService<pb::WatchRequest> for WatchMethod {
    type Response = WatchItem;
    type ResponseStream = WatchItems;
    type Future = futures_util::future::BoxFuture<'static, Result<tonic::Response<WatchItems>, Status>>;

    fn call(&mut self, request: tonic::Request<pb::WatchRequest>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move { service.watch_items(request).await })
    }
}

/// `rota.v1.Registry`: [`WATCH_PATH`] served here, every other method by the generated server.
pub type RegistryRoutes = OnePath<pb::registry_server::RegistryServer<RegistryService>, WatchPath>;

/// Serves [`WATCH_PATH`] with [`WatchCodec`].
#[derive(Clone)]
pub struct WatchPath {
    service: Arc<RegistryService>,
    max_decoding_message_size: usize,
}

impl RegistryRoutes {
    /// Decodes requests of up to `max_decoding_message_size` bytes, on every method.
    pub fn new(service: RegistryService, max_decoding_message_size: usize) -> Self {
        let service = Arc::new(service);
        let generated = pb::registry_server::RegistryServer::from_arc(service.clone())
            .max_decoding_message_size(max_decoding_message_size);
        OnePath::serving(generated, WatchPath { service, max_decoding_message_size })
    }
}

impl PathHandler for WatchPath {
    const PATH: &'static str = WATCH_PATH;

    fn serve<B>(&self, request: http::Request<B>) -> BoxFuture<'static, http::Response<tonic::body::Body>>
    where
        B: http_body::Body + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
    {
        let method = WatchMethod(self.service.clone());
        let limit = self.max_decoding_message_size;
        Box::pin(async move {
            let mut grpc = Grpc::new(WatchCodec).apply_max_message_size_config(Some(limit), None);
            grpc.server_streaming(method, request).await
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{Instance, InstanceSpec};

    fn instance(id: &str, version: &str, metadata: &[(&str, &str)]) -> Arc<Instance> {
        let spec = InstanceSpec {
            id: id.into(),
            service: "svc".into(),
            host: "127.0.0.1".into(),
            port: 9000,
            version: version.into(),
            metadata: metadata.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..Default::default()
        };
        Arc::new(spec.validate("test").expect("a valid test instance"))
    }

    /// The shared snapshot is byte for byte what prost writes for the same event, at epoch 0
    /// (no epoch field) and after, empty or not; and it is encoded once per snapshot.
    #[tokio::test]
    async fn a_snapshot_event_is_what_prost_writes() {
        for (epoch, instances) in [
            (0, vec![]),
            (7, vec![instance("a", "", &[])]),
            (1 << 40, vec![instance("a", "", &[("team", "pay")]), instance("b", "zlt", &[("k", &"v".repeat(300))])]),
        ] {
            let snapshot = ServiceSnapshot::build("svc".into(), epoch, instances);
            let expected = pb::WatchEvent {
                event: Some(pb::watch_event::Event::Snapshot(pb::InstanceList {
                    instances: snapshot.instances.iter().map(|i| super::super::convert::instance(i)).collect(),
                })),
                epoch,
            };
            let bytes = snapshot_event(&snapshot);
            assert_eq!(bytes, Bytes::from(expected.encode_to_vec()), "epoch {epoch}");
            assert_eq!(WatchItem::Encoded(bytes.clone()).into_event().unwrap(), expected);
            assert_eq!(snapshot_event(&snapshot).as_ptr(), bytes.as_ptr(), "encoded once, then shared");
        }
    }
}
