//! The floor `rota bench` compares against: a unary call of raw bytes on a bare tonic server,
//! with no protobuf on either side (the codec passes bytes through), no metrics, limits or
//! interceptors. What a Pick costs beyond it is rota's work and its messages; what the gRPC
//! round trip itself costs is in both.

use std::convert::Infallible;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut, Bytes};
use futures_util::future::BoxFuture;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::transport::Channel;

/// The one method of the floor service.
pub const PATH: &str = "/rota.bench.Floor/Echo";

/// The answer: as many bytes as a Pick's answer of a short id and address, none of them read.
pub const ANSWER: &[u8] = &[b'x'; 64];

/// Bytes in, bytes out.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

struct Echo;

impl UnaryService<Bytes> for Echo {
    type Response = Bytes;
    type Future = std::future::Ready<Result<tonic::Response<Bytes>, Status>>;

    fn call(&mut self, _request: tonic::Request<Bytes>) -> Self::Future {
        std::future::ready(Ok(tonic::Response::new(Bytes::from_static(ANSWER))))
    }
}

/// `rota.bench.Floor`: [`PATH`] answers [`ANSWER`]; any other path is `UNIMPLEMENTED`.
#[derive(Debug, Clone, Copy, Default)]
pub struct FloorService;

impl NamedService for FloorService {
    const NAME: &'static str = "rota.bench.Floor";
}

impl<B> tower_service::Service<http::Request<B>> for FloorService
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        Box::pin(async move {
            if request.uri().path() != PATH {
                return Ok(Status::unimplemented("the floor answers only rota.bench.Floor/Echo").into_http());
            }
            Ok(Grpc::new(RawCodec).unary(Echo, request).await)
        })
    }
}

/// One call of the floor.
pub async fn call(grpc: &mut tonic::client::Grpc<Channel>) -> Result<Bytes, Status> {
    grpc.ready().await.map_err(|e| Status::unavailable(e.to_string()))?;
    let path = http::uri::PathAndQuery::from_static(PATH);
    Ok(grpc.unary(tonic::Request::new(Bytes::new()), path, RawCodec).await?.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_floor_answers_its_bytes_and_nothing_else() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let server =
            tokio::spawn(tonic::transport::Server::builder().add_service(FloorService).serve_with_incoming(incoming));
        let channel =
            tonic::transport::Endpoint::from_shared(format!("http://{address}")).unwrap().connect().await.unwrap();
        let mut grpc = tonic::client::Grpc::new(channel.clone());
        assert_eq!(&call(&mut grpc).await.unwrap()[..], ANSWER);
        let other = http::uri::PathAndQuery::from_static("/rota.bench.Floor/Other");
        grpc.ready().await.unwrap();
        let refused = grpc.unary(tonic::Request::new(Bytes::new()), other, RawCodec).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unimplemented);
        server.abort();
    }
}
