//! gRPC server metrics in the conventional shape (`grpc_server_started_total`,
//! `grpc_server_handled_total`, `grpc_server_handling_seconds`), recorded by a tower layer under
//! tonic's router.
//!
//! The method comes from the request path and is looked up in the fixed table of methods rota
//! serves, so the counters are plain atomics in an array (no lock, no allocation per call) and
//! a stray path cannot add series: unknown paths count under `unknown/unknown`. The array is
//! kept in [`SHARDS`] copies, each thread counting in its own, so that the runtime's workers do
//! not take turns owning the same cache lines on every call; a read adds the copies up. The code is the
//! `grpc-status` of the response — in the headers of a trailers-only response (how tonic
//! answers a unary call that fails) or in the trailers. A call is `handled` when its response
//! body ends; for a stream that is when the stream closes, and the histogram then measures the
//! stream's whole life. A response body dropped before it ended (the client went away) counts
//! as `Canceled` unless its headers already carried a code.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Instant;

use http_body::{Body, Frame, SizeHint};
use tower_layer::Layer;
use tower_service::Service;

/// Upper bounds of the handling-time histogram buckets, in seconds.
pub const HANDLING_BUCKETS: [f64; 9] = [0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0];

/// `(grpc_service, grpc_method, grpc_type)` of every method served; the last entry is the
/// catch-all for paths that name none of them.
pub const METHODS: [(&str, &str, &str); 17] = [
    ("rota.v1.Balancer", "Pick", "unary"),
    ("rota.v1.Balancer", "PickStream", "bidi_stream"),
    ("rota.v1.Balancer", "Report", "unary"),
    ("rota.v1.Balancer", "Lease", "unary"),
    ("rota.v1.Registry", "Register", "bidi_stream"),
    ("rota.v1.Registry", "ListServices", "unary"),
    ("rota.v1.Registry", "ListInstances", "unary"),
    ("rota.v1.Registry", "Watch", "server_stream"),
    ("rota.v1.Policies", "GetPolicy", "unary"),
    ("rota.v1.Policies", "SetPolicy", "unary"),
    ("rota.v1.Policies", "ListPolicies", "unary"),
    ("rota.v1.Policies", "ResetPolicy", "unary"),
    ("grpc.health.v1.Health", "Check", "unary"),
    ("grpc.health.v1.Health", "Watch", "server_stream"),
    ("grpc.reflection.v1.ServerReflection", "ServerReflectionInfo", "bidi_stream"),
    ("grpc.reflection.v1alpha.ServerReflection", "ServerReflectionInfo", "bidi_stream"),
    ("unknown", "unknown", "unknown"),
];
const UNKNOWN_METHOD: usize = 16;

/// gRPC status code names, indexed by code.
pub const CODES: [&str; 17] = [
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
];
const CANCELED: usize = 1;
const UNKNOWN_CODE: usize = 2;

#[derive(Default)]
struct MethodCounters {
    started: AtomicU64,
    handled: [AtomicU64; CODES.len()],
    /// Non-cumulative: one slot per bucket, then one for `+Inf`.
    buckets: [AtomicU64; HANDLING_BUCKETS.len() + 1],
    sum_nanos: AtomicU64,
}

/// Copies of the counters: more than the runtime has workers on most machines.
pub const SHARDS: usize = 8;

/// One copy of every method's counters, on cache lines of its own.
#[derive(Default)]
#[repr(align(128))]
struct Shard {
    methods: [MethodCounters; METHODS.len()],
}

/// The counters of every method.
#[derive(Default)]
pub struct GrpcMetrics {
    shards: [Shard; SHARDS],
}

static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// The copy this thread counts in, handed out in turn.
    static SHARD: usize = NEXT_SHARD.fetch_add(1, Ordering::Relaxed) % SHARDS;
}

/// One method's counters, read for exposition.
#[derive(Debug, Clone, PartialEq)]
pub struct MethodStats {
    pub service: &'static str,
    pub method: &'static str,
    pub kind: &'static str,
    pub started: u64,
    /// `(code, count)` for codes seen at least once.
    pub handled: Vec<(&'static str, u64)>,
    /// Cumulative counts per bucket of [`HANDLING_BUCKETS`], then the total count.
    pub cumulative: Vec<u64>,
    pub sum_seconds: f64,
}

impl GrpcMetrics {
    fn method_index(path: &str) -> usize {
        let mut parts = path.trim_start_matches('/').splitn(2, '/');
        let (service, method) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        METHODS[..UNKNOWN_METHOD].iter().position(|(s, m, _)| *s == service && *m == method).unwrap_or(UNKNOWN_METHOD)
    }

    /// This thread's counters of `method`.
    fn counters(&self, method: usize) -> &MethodCounters {
        &self.shards[SHARD.with(|shard| *shard)].methods[method]
    }

    fn finish(&self, method: usize, code: usize, started: Instant) {
        let counters = self.counters(method);
        counters.handled[code].fetch_add(1, Ordering::Relaxed);
        let elapsed = started.elapsed();
        let seconds = elapsed.as_secs_f64();
        let bucket = HANDLING_BUCKETS.iter().position(|le| seconds <= *le).unwrap_or(HANDLING_BUCKETS.len());
        counters.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        counters.sum_nanos.fetch_add(u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Methods that have been called at least once, in table order.
    pub fn snapshot(&self) -> Vec<MethodStats> {
        let mut all = Vec::new();
        for (index, (service, method, kind)) in METHODS.into_iter().enumerate() {
            let copies = || self.shards.iter().map(move |shard| &shard.methods[index]);
            let sum = |counter: fn(&MethodCounters) -> &AtomicU64| {
                copies().map(|counters| counter(counters).load(Ordering::Relaxed)).sum::<u64>()
            };
            let started = sum(|c| &c.started);
            if started == 0 {
                continue;
            }
            let handled = (0..CODES.len())
                .map(|code| (CODES[code], copies().map(|c| c.handled[code].load(Ordering::Relaxed)).sum::<u64>()))
                .filter(|(_, n)| *n > 0)
                .collect();
            let mut total = 0;
            let cumulative = (0..=HANDLING_BUCKETS.len())
                .map(|bucket| {
                    total += copies().map(|c| c.buckets[bucket].load(Ordering::Relaxed)).sum::<u64>();
                    total
                })
                .collect();
            let sum_seconds = sum(|c| &c.sum_nanos) as f64 / 1e9;
            all.push(MethodStats { service, method, kind, started, handled, cumulative, sum_seconds });
        }
        all
    }
}

fn code_of(headers: &http::HeaderMap) -> Option<usize> {
    let code: usize = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    Some(if code < CODES.len() { code } else { UNKNOWN_CODE })
}

/// Adds [`GrpcMetrics`] recording to a tonic server.
#[derive(Clone)]
pub struct GrpcMetricsLayer {
    metrics: Arc<GrpcMetrics>,
}

impl GrpcMetricsLayer {
    pub fn new(metrics: Arc<GrpcMetrics>) -> Self {
        Self { metrics }
    }
}

impl<S> Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetricsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetricsService { inner, metrics: self.metrics.clone() }
    }
}

#[derive(Clone)]
pub struct GrpcMetricsService<S> {
    inner: S,
    metrics: Arc<GrpcMetrics>,
}

/// One call in progress; recorded exactly once.
struct Call {
    metrics: Arc<GrpcMetrics>,
    method: usize,
    started: Instant,
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for GrpcMetricsService<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
{
    type Response = http::Response<MeteredBody<ResBody>>;
    type Error = S::Error;
    type Future = MeteredFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        let method = GrpcMetrics::method_index(request.uri().path());
        self.metrics.counters(method).started.fetch_add(1, Ordering::Relaxed);
        let call = Call { metrics: self.metrics.clone(), method, started: Instant::now() };
        MeteredFuture { inner: self.inner.call(request), call: Some(call) }
    }
}

pin_project_lite::pin_project! {
    pub struct MeteredFuture<F> {
        #[pin]
        inner: F,
        call: Option<Call>,
    }
}

impl<F, ResBody, E> Future for MeteredFuture<F>
where
    F: Future<Output = Result<http::Response<ResBody>, E>>,
{
    type Output = Result<http::Response<MeteredBody<ResBody>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.inner.poll(cx));
        let call = this.call.take();
        Poll::Ready(match result {
            Ok(response) => {
                let code = code_of(response.headers());
                // A trailers-only response (a failed unary call) is complete here: record it
                // before it leaves, so the count never lags behind what the client has seen.
                let call = match (call, code) {
                    (Some(call), Some(code)) => {
                        call.metrics.finish(call.method, code, call.started);
                        None
                    }
                    (call, _) => call,
                };
                Ok(response.map(|inner| MeteredBody { inner, call, code }))
            }
            Err(error) => {
                if let Some(call) = call {
                    call.metrics.finish(call.method, UNKNOWN_CODE, call.started);
                }
                Err(error)
            }
        })
    }
}

pin_project_lite::pin_project! {
    /// A response body that records its call when it ends (or is dropped).
    pub struct MeteredBody<B> {
        #[pin]
        inner: B,
        call: Option<Call>,
        code: Option<usize>,
    }

    impl<B> PinnedDrop for MeteredBody<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if let Some(call) = this.call.take() {
                call.metrics.finish(call.method, this.code.unwrap_or(CANCELED), call.started);
            }
        }
    }
}

impl<B: Body> Body for MeteredBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        let ended = match &frame {
            Some(Ok(frame)) => match frame.trailers_ref() {
                Some(trailers) => {
                    *this.code = code_of(trailers).or(*this.code);
                    true
                }
                None => false,
            },
            Some(Err(_)) => {
                *this.code = this.code.or(Some(UNKNOWN_CODE));
                true
            }
            None => true,
        };
        if ended && let Some(call) = this.call.take() {
            call.metrics.finish(call.method, this.code.unwrap_or(UNKNOWN_CODE), call.started);
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_map_to_the_method_table() {
        assert_eq!(METHODS[GrpcMetrics::method_index("/rota.v1.Balancer/Pick")].1, "Pick");
        assert_eq!(METHODS[GrpcMetrics::method_index("/grpc.health.v1.Health/Watch")].2, "server_stream");
        assert_eq!(GrpcMetrics::method_index("/rota.v1.Balancer/Nope"), UNKNOWN_METHOD);
        assert_eq!(GrpcMetrics::method_index("/"), UNKNOWN_METHOD);
    }

    #[test]
    fn finished_calls_fill_codes_and_cumulative_buckets() {
        let metrics = GrpcMetrics::default();
        let pick = GrpcMetrics::method_index("/rota.v1.Balancer/Pick");
        metrics.counters(pick).started.fetch_add(3, Ordering::Relaxed);
        // Calls counted on other threads (other copies) add up.
        std::thread::scope(|scope| {
            scope.spawn(|| metrics.finish(pick, 0, Instant::now()));
            scope.spawn(|| metrics.finish(pick, 0, Instant::now()));
        });
        metrics.finish(pick, 5, Instant::now());
        let stats = metrics.snapshot();
        assert_eq!(stats.len(), 1);
        assert_eq!(stats[0].started, 3);
        assert_eq!(stats[0].handled, [("OK", 2), ("NotFound", 1)]);
        assert_eq!(stats[0].cumulative.len(), HANDLING_BUCKETS.len() + 1);
        assert_eq!(*stats[0].cumulative.last().unwrap(), 3);
    }
}
