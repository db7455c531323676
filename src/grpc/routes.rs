//! A `rota.v1` service with one path served by a handler of its own (a codec of its own, reading
//! or writing bytes where protobuf would build messages), every other path by the generated
//! server: how [`super::pick_wire`] serves `Pick` and [`super::watch_wire`] serves `Watch`.

use std::convert::Infallible;
use std::task::{Context, Poll};

use futures_util::future::BoxFuture;
use tonic::server::NamedService;

/// Serves one path of a service.
pub trait PathHandler: Clone + Send + 'static {
    /// The path served, `/rota.v1.SERVICE/METHOD`.
    const PATH: &'static str;

    fn serve<B>(&self, request: http::Request<B>) -> BoxFuture<'static, http::Response<tonic::body::Body>>
    where
        B: http_body::Body + Send + 'static,
        B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static;
}

/// The generated server `G`, but [`PathHandler::PATH`], which `H` serves.
#[derive(Clone)]
pub struct OnePath<G, H> {
    generated: G,
    handler: H,
}

impl<G, H> OnePath<G, H> {
    pub fn serving(generated: G, handler: H) -> Self {
        Self { generated, handler }
    }
}

impl<G: NamedService, H> NamedService for OnePath<G, H> {
    const NAME: &'static str = G::NAME;
}

impl<G, H, B> tower_service::Service<http::Request<B>> for OnePath<G, H>
where
    G: tower_service::Service<
            http::Request<B>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
            Future = BoxFuture<'static, Result<http::Response<tonic::body::Body>, Infallible>>,
        >,
    H: PathHandler,
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
        if request.uri().path() != H::PATH {
            return self.generated.call(request);
        }
        let serving = self.handler.serve(request);
        Box::pin(async move { Ok(serving.await) })
    }
}
