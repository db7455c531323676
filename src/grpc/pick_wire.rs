//! `rota.v1.Balancer/Pick` on the wire: the request read in place, the answer written from
//! bytes encoded at publish.
//!
//! A unary Pick is rota's hottest call, and most of what it cost beyond the pick itself was
//! protobuf: the request's strings copied into owned `String`s, the answer's instance encoded
//! field by field. Here:
//!
//! - [`PickRequestView`] keeps the request's buffer and the byte ranges of its fields, checked
//!   as UTF-8 where they lie; the pick reads them as `&str`. It accepts exactly what prost's
//!   `PickRequest` accepts (a request it refuses is decoded again by prost for the very error
//!   prost gives), so clients see no difference.
//! - [`PickAnswer`] writes the `PickResponse` fields in field order, with the `Instance` message
//!   copied from [`crate::registry::Instance::answer`], which the balancer's views fill when they
//!   take a publication. Protobuf encodes an embedded message exactly as a `bytes` field of the
//!   same number, so the answer is byte for byte what prost writes for the same response.
//! - [`BalancerRoutes`] serves that one path with [`PickCodec`] and hands every other path of
//!   the service to the generated server.

use std::ops::Range;
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes};
use prost::Message;
use prost::encoding::{self, WireType};
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::server::{Grpc, UnaryService};

use super::balancer::BalancerService;
use super::convert;
use futures_util::future::BoxFuture;

use super::routes::{OnePath, PathHandler};
use crate::balancer::{PickQuery, Picked};
use crate::{pb, registry};

/// The path this module serves.
pub const PICK_PATH: &str = "/rota.v1.Balancer/Pick";

/// A `PickRequest` as it arrived: its bytes and where each field lies in them.
#[derive(Debug, Default, Clone)]
pub struct PickRequestView {
    bytes: Bytes,
    service: Range<usize>,
    rule: Range<usize>,
    version: Range<usize>,
    key: Range<usize>,
    zone: Range<usize>,
    /// Owned, and only when the request names any: retries are the rare case.
    exclude: Vec<String>,
}

impl PickRequestView {
    /// Reads `bytes` as a `PickRequest`, refusing what prost refuses with prost's own error.
    pub fn decode(bytes: Bytes) -> Result<Self, prost::DecodeError> {
        match Self::read(&bytes) {
            Some(mut view) => {
                view.bytes = bytes;
                Ok(view)
            }
            // Refused: prost says why, in its words.
            None => match pb::PickRequest::decode(bytes.clone()) {
                Err(error) => Err(error),
                // Unreachable while `read` refuses only what prost refuses (a test holds it):
                // take prost's reading rather than fail a request prost would serve.
                Ok(request) => Ok(Self::owned(request)),
            },
        }
    }

    /// The fields' ranges, or `None` for anything prost would refuse. The last occurrence of a
    /// field wins, as in prost; unknown fields are skipped as prost skips them.
    fn read(bytes: &Bytes) -> Option<Self> {
        let mut view = Self::default();
        let mut rest: &[u8] = bytes;
        while rest.has_remaining() {
            let (tag, wire_type) = encoding::decode_key(&mut rest).ok()?;
            if !(1..=6).contains(&tag) {
                encoding::skip_field(wire_type, tag, &mut rest, encoding::DecodeContext::default()).ok()?;
                continue;
            }
            if wire_type != WireType::LengthDelimited {
                return None;
            }
            let len = usize::try_from(encoding::decode_varint(&mut rest).ok()?).ok()?;
            if len > rest.len() {
                return None;
            }
            let start = bytes.len() - rest.len();
            let text = std::str::from_utf8(&rest[..len]).ok()?;
            let range = start..start + len;
            match tag {
                1 => view.service = range,
                2 => view.rule = range,
                3 => view.version = range,
                4 => view.key = range,
                5 => view.zone = range,
                _ => view.exclude.push(text.to_owned()),
            }
            rest.advance(len);
        }
        Some(view)
    }

    /// A view holding a request prost decoded (its strings laid end to end).
    fn owned(request: pb::PickRequest) -> Self {
        let mut bytes = Vec::new();
        let mut range = |text: &str| {
            let start = bytes.len();
            bytes.extend_from_slice(text.as_bytes());
            start..bytes.len()
        };
        let (service, rule, version) = (range(&request.service), range(&request.rule), range(&request.version));
        let (key, zone) = (range(&request.key), range(&request.zone));
        Self { bytes: bytes.into(), service, rule, version, key, zone, exclude: request.exclude }
    }

    fn text(&self, range: &Range<usize>) -> &str {
        // Checked as UTF-8 when read; checked again rather than trusted without a check.
        std::str::from_utf8(&self.bytes[range.clone()]).unwrap_or_default()
    }

    pub fn service(&self) -> &str {
        self.text(&self.service)
    }

    /// The request as the balancer takes it.
    pub fn query(&self) -> PickQuery<'_> {
        PickQuery {
            service: self.text(&self.service),
            rule: self.text(&self.rule),
            version: self.text(&self.version),
            key: self.text(&self.key),
            zone: self.text(&self.zone),
            exclude: &self.exclude,
        }
    }
}

/// A `PickResponse` of a successful pick, ready to be written.
#[derive(Debug, Clone)]
pub struct PickAnswer {
    /// The `Instance` message, encoded.
    instance: InstanceBytes,
    ticket: u64,
    rule: Arc<str>,
    fallback: Option<String>,
    epoch: u64,
}

/// The answer's `Instance` message: the bytes the picked instance carries since its
/// publication, read where they lie (the instance is held anyway, so no second reference count
/// is taken on a cold line), or bytes encoded now for an instance no view has encoded.
#[derive(Debug, Clone)]
enum InstanceBytes {
    Published(Arc<registry::Instance>),
    Encoded(Bytes),
}

impl InstanceBytes {
    fn bytes(&self) -> &[u8] {
        match self {
            // Published only once the bytes are set, and they are never unset.
            Self::Published(instance) => instance.answer.get().map_or(&[][..], |bytes| &bytes[..]),
            Self::Encoded(bytes) => bytes,
        }
    }
}

impl PickAnswer {
    /// The answer to `picked`: its instance's bytes as encoded at publish, or encoded now for
    /// an instance the views have not encoded.
    pub fn new(picked: Picked) -> Self {
        let instance = match picked.instance.answer.get() {
            Some(_) => InstanceBytes::Published(picked.instance),
            None => InstanceBytes::Encoded(convert::encoded_instance(&picked.instance)),
        };
        Self { instance, ticket: picked.ticket, rule: picked.rule, fallback: picked.fallback, epoch: picked.epoch }
    }

    fn fallback(&self) -> &str {
        self.fallback.as_deref().unwrap_or_default()
    }

    /// The encoded length, as prost would count it.
    pub fn encoded_len(&self) -> usize {
        let text = |tag: u32, text: &str| match text.len() {
            0 => 0,
            len => encoding::key_len(tag) + encoding::encoded_len_varint(len as u64) + len,
        };
        let number = |tag: u32, value: u64| match value {
            0 => 0,
            value => encoding::key_len(tag) + encoding::encoded_len_varint(value),
        };
        // The instance is always present, even if (it never is) empty.
        let instance = self.instance.bytes();
        let instance = encoding::key_len(1) + encoding::encoded_len_varint(instance.len() as u64) + instance.len();
        instance + number(2, self.ticket) + text(3, &self.rule) + text(4, self.fallback()) + number(5, self.epoch)
    }

    /// Writes the fields in field order, skipping defaults, as prost does.
    pub fn encode(&self, buf: &mut impl BufMut) {
        fn text(buf: &mut impl BufMut, tag: u32, text: &str) {
            if !text.is_empty() {
                encoding::encode_key(tag, WireType::LengthDelimited, buf);
                encoding::encode_varint(text.len() as u64, buf);
                buf.put_slice(text.as_bytes());
            }
        }
        fn number(buf: &mut impl BufMut, tag: u32, value: u64) {
            if value != 0 {
                encoding::encode_key(tag, WireType::Varint, buf);
                encoding::encode_varint(value, buf);
            }
        }
        let instance = self.instance.bytes();
        encoding::encode_key(1, WireType::LengthDelimited, buf);
        encoding::encode_varint(instance.len() as u64, buf);
        buf.put_slice(instance);
        number(buf, 2, self.ticket);
        text(buf, 3, &self.rule);
        text(buf, 4, self.fallback());
        number(buf, 5, self.epoch);
    }
}

/// Reads [`PickRequestView`]s and writes [`PickAnswer`]s.
#[derive(Debug, Clone, Copy, Default)]
pub struct PickCodec;

impl Codec for PickCodec {
    type Encode = PickAnswer;
    type Decode = PickRequestView;
    type Encoder = PickCodec;
    type Decoder = PickCodec;

    fn encoder(&mut self) -> Self::Encoder {
        PickCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        PickCodec
    }
}

impl Encoder for PickCodec {
    type Item = PickAnswer;
    type Error = Status;

    fn encode(&mut self, item: PickAnswer, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.reserve(item.encoded_len());
        item.encode(dst);
        Ok(())
    }
}

impl Decoder for PickCodec {
    type Item = PickRequestView;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<PickRequestView>, Status> {
        let bytes = src.copy_to_bytes(src.remaining());
        // The status prost's codec gives a message it cannot decode.
        PickRequestView::decode(bytes).map(Some).map_err(|error| Status::internal(error.to_string()))
    }
}

/// The unary Pick, answered from a [`PickRequestView`].
struct PickMethod(Arc<BalancerService>);

impl UnaryService<PickRequestView> for PickMethod {
    type Response = PickAnswer;
    type Future = futures_util::future::BoxFuture<'static, Result<tonic::Response<PickAnswer>, Status>>;

    fn call(&mut self, request: tonic::Request<PickRequestView>) -> Self::Future {
        let service = self.0.clone();
        Box::pin(async move {
            let answer = service.pick_view(request.get_ref()).await?;
            Ok(tonic::Response::new(answer))
        })
    }
}

/// `rota.v1.Balancer`: [`PICK_PATH`] served here, every other method by the generated server.
pub type BalancerRoutes = OnePath<pb::balancer_server::BalancerServer<BalancerService>, PickPath>;

/// Serves [`PICK_PATH`] with [`PickCodec`].
#[derive(Clone)]
pub struct PickPath {
    service: Arc<BalancerService>,
    max_decoding_message_size: usize,
}

impl BalancerRoutes {
    /// Decodes requests of up to `max_decoding_message_size` bytes, on every method.
    pub fn new(service: BalancerService, max_decoding_message_size: usize) -> Self {
        let service = Arc::new(service);
        let generated = pb::balancer_server::BalancerServer::from_arc(service.clone())
            .max_decoding_message_size(max_decoding_message_size);
        OnePath::serving(generated, PickPath { service, max_decoding_message_size })
    }
}

impl PathHandler for PickPath {
    const PATH: &'static str = PICK_PATH;

    fn serve<B>(&self, request: http::Request<B>) -> BoxFuture<'static, http::Response<tonic::body::Body>>
    where
        B: http_body::Body + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
    {
        let method = PickMethod(self.service.clone());
        let limit = self.max_decoding_message_size;
        Box::pin(async move {
            let mut grpc = Grpc::new(PickCodec).apply_max_message_size_config(Some(limit), None);
            grpc.unary(method, request).await
        })
    }
}

#[cfg(test)]
mod tests;
