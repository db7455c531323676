//! The admin listener: what an operator looks at, over plain HTTP on its own socket (default
//! `127.0.0.1:9090`), served by axum on the same runtime as the gRPC server.
//!
//! - `/metrics` — Prometheus text exposition ([`metrics`]): pick counters and durations, the
//!   catalog, registration streams, tripped breakers, the gRPC server metrics and the
//!   [`process`] metrics.
//! - `/healthz` (the process answers) and `/readyz` (it is serving and not shutting down).
//! - `/api/...` — JSON views of services, instances and policies ([`api`]).
//! - `/api/events?service=NAME` — Server-Sent Events with a JSON snapshot of one service every
//!   500 ms and on every registry change, with the recent history the dashboard plots
//!   ([`events`]).
//! - `/` — the dashboard: one HTML page with inline script and style, embedded in the binary;
//!   `/favicon.ico` — its icon.
//!
//! Everything here reads what the other layers already publish (the catalog, the balancer's
//! counters and statistics, the gRPC metrics); the admin listener never changes state. When the
//! server stops, the shutdown signal ends the event streams first, so a browser left open
//! cannot hold the process.
//!
//! Connections come through the same [front door](crate::listener) as gRPC's, with caps of
//! their own ([`ADMIN_LIMITS`]: 512 in all, 64 per client address), so idle or half-open admin
//! connections can neither use up rota's file descriptors nor lock out a probe from elsewhere.
//! Past the caps, each address may still open two connections of a reserve of 64, which answers
//! `/healthz` and `/readyz` only, once, within 2 s: clients filling the caps from many addresses
//! cannot starve a liveness probe.
//! A connection must send its first byte within 10 s, and every HTTP/1 request head (the
//! first and each on a kept-alive connection) must arrive whole within [`HEADER_TIMEOUT`] of
//! rota starting to wait for it, or the connection is closed; an event stream, where the
//! client only reads, is not cut. HTTP/2 is served too, so that a gRPC client sent to this
//! port by mistake is told so.

pub mod api;
pub mod events;
pub mod history;
pub mod metrics;
pub mod process;
pub mod streams;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{Html, IntoResponse};
use axum::routing::get;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::auth::Authenticator;
use crate::balancer::Overview;
use crate::grpc::answers::UnreadAnswers;
use crate::grpc::metrics::GrpcMetrics;
use crate::grpc::streams::OpenStreams;
use crate::listener::{Admission, ConnectionLimits, Guarded, Handshake};
use crate::policy::file::PolicyReloads;

/// The dashboard page, served as is.
const DASHBOARD: &str = include_str!("dashboard.html");

#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    #[error("cannot listen for admin HTTP on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
}

/// What the handlers read.
#[derive(Clone)]
pub struct AdminState {
    overview: Overview,
    grpc: Arc<GrpcMetrics>,
    /// `true` once the server is stopping; a dropped sender means the same.
    stopping: watch::Receiver<bool>,
    /// `true` once a graceful shutdown has begun.
    draining: watch::Receiver<bool>,
    /// When set, everything but the page itself and the health checks needs a token: the
    /// metrics or admin scope for `/metrics`, the admin scope for the rest.
    auth: Option<Arc<Authenticator>>,
    /// The gRPC listener's connection caps, the server's open streams and its unread answers,
    /// when serving.
    limits: Option<(Arc<Admission>, Arc<OpenStreams>, Arc<UnreadAnswers>)>,
    /// What the policy file's reloader made of its changes, when there is a file.
    policy_reloads: Option<watch::Receiver<PolicyReloads>>,
    /// The xDS server's subscriptions, when serving.
    xds: Option<Arc<crate::xds::Hub>>,
    /// The registries rota follows.
    sources: crate::sources::Sources,
    /// The active health checks' counts, when they run.
    health_checks: Option<Arc<crate::health::HealthCounters>>,
    /// Memory pressure, when serving.
    overload: Option<Arc<crate::overload::Overload>>,
}

impl AdminState {
    /// `draining` turns true when a graceful shutdown begins (readiness goes false while the
    /// listener keeps serving metrics); `stopping` when the listener itself must stop.
    pub fn new(
        overview: Overview,
        grpc: Arc<GrpcMetrics>,
        stopping: watch::Receiver<bool>,
        draining: watch::Receiver<bool>,
    ) -> Self {
        Self {
            overview,
            grpc,
            stopping,
            draining,
            auth: None,
            limits: None,
            policy_reloads: None,
            xds: None,
            sources: Default::default(),
            health_checks: None,
            overload: None,
        }
    }

    /// Reports memory pressure in `/metrics` and `/readyz`.
    pub fn with_overload(mut self, overload: Arc<crate::overload::Overload>) -> Self {
        self.overload = Some(overload);
        self
    }

    /// Reports the connection caps, open streams and unread answers in `/metrics`.
    pub fn with_limits(
        mut self,
        connections: Arc<Admission>,
        streams: Arc<OpenStreams>,
        answers: Arc<UnreadAnswers>,
    ) -> Self {
        self.limits = Some((connections, streams, answers));
        self
    }

    /// Reports the xDS server's streams and subscriptions in `/metrics`.
    pub fn with_xds(mut self, hub: Arc<crate::xds::Hub>) -> Self {
        self.xds = Some(hub);
        self
    }

    /// Reports the sources rota follows in `/metrics`, `/readyz` and `/api/sources`.
    pub fn with_sources(mut self, sources: crate::sources::Sources) -> Self {
        self.sources = sources;
        self
    }

    /// Reports the active health checks in `/metrics`.
    pub fn with_health_checks(mut self, counters: Arc<crate::health::HealthCounters>) -> Self {
        self.health_checks = Some(counters);
        self
    }

    /// Reports the policy file's reloads in `/metrics`.
    pub fn with_policy_reloads(mut self, reloads: Option<watch::Receiver<PolicyReloads>>) -> Self {
        self.policy_reloads = reloads;
        self
    }

    /// Requires a token (the same check as gRPC): the metrics or admin scope for `/metrics`, the
    /// admin scope for the API.
    pub fn with_auth(mut self, auth: Option<Arc<Authenticator>>) -> Self {
        self.auth = auth;
        self
    }

    fn is_stopping(&self) -> bool {
        *self.stopping.borrow() || self.stopping.has_changed().is_err() || *self.draining.borrow()
    }

    /// Resolves when the server starts stopping.
    async fn stopped(mut stopping: watch::Receiver<bool>) {
        // An error means the sender is gone: the server was dropped.
        let _ = stopping.wait_for(|stopping| *stopping).await;
    }
}

/// Binds `addr` (port 0 picks a free port); returns the listener and the bound address.
pub async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), AdminError> {
    let listener = TcpListener::bind(addr).await.map_err(|source| AdminError::Bind { addr, source })?;
    let bound = listener.local_addr().map_err(|source| AdminError::Bind { addr, source })?;
    Ok((listener, bound))
}

pub fn router(state: AdminState) -> Router {
    let history = history::History::start(&state);
    Router::new()
        .route("/", get(dashboard))
        .route("/favicon.ico", get(api::favicon))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics::scrape))
        .route("/api/services", get(api::services))
        .route("/api/services/{name}", get(api::service))
        .route("/api/policies", get(api::policies))
        .route("/api/sources", get(api::sources))
        .route("/api/events", get(events::stream))
        .layer(axum::Extension(Arc::new(streams::EventStreams::default())))
        .layer(axum::middleware::from_fn_with_state(state.clone(), require_admin))
        .layer(axum::Extension(history))
        .layer(axum::middleware::from_fn(not_grpc))
        .with_state(state)
}

/// What a probe-reserve connection is served: the health probes, and for anything else a 503
/// that says why.
fn probe_router(state: AdminState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .fallback(|| async {
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "rota's admin connections are all taken (512 in all, 64 per address): this connection, past them, answers /healthz and /readyz only\n",
            )
        })
        .with_state(state)
}

/// A gRPC client pointed at this port by mistake gets a gRPC answer that says so, instead of
/// an HTTP 404 its library reports as "grpc-status header missing".
async fn not_grpc(request: axum::extract::Request, next: axum::middleware::Next) -> axum::response::Response {
    let grpc = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"));
    if !grpc {
        return next.run(request).await;
    }
    let message = format!(
        "this is rota's admin HTTP port (metrics, health, dashboard), not its gRPC port; \
         point the client at rota's listen address (`rota serve --listen`, 127.0.0.1:50051 by default) \
         instead of {}",
        request.uri().path()
    );
    // grpc-message is percent-encoded: every byte outside printable ASCII, and '%' itself.
    let encoded: String = message
        .bytes()
        .map(|b| if (0x20..0x7f).contains(&b) && b != b'%' { (b as char).to_string() } else { format!("%{b:02X}") })
        .collect();
    let mut response = StatusCode::OK.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", header::HeaderValue::from_static("12"));
    if let Ok(value) = header::HeaderValue::from_str(&encoded) {
        headers.insert("grpc-message", value);
    }
    response
}

/// With authentication on, `/metrics` needs a token with the metrics or the admin scope, and the
/// API one with the admin scope, sent as
/// `Authorization: Bearer TOKEN` or, for the dashboard's event stream (browsers cannot set
/// headers on it), as `?token=TOKEN`. The page itself, its icon and the health checks stay open.
async fn require_admin(
    axum::extract::State(state): axum::extract::State<AdminState>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let Some(auth) = &state.auth else { return next.run(request).await };
    if matches!(request.uri().path(), "/" | "/favicon.ico" | "/healthz" | "/readyz") {
        return next.run(request).await;
    }
    let header = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
        .or_else(|| {
            let query = request.uri().query()?;
            let token = query.split('&').find_map(|pair| pair.strip_prefix("token="))?;
            Some(format!("Bearer {token}"))
        });
    let scrape = request.uri().path() == "/metrics";
    match auth.authenticate_header(header.as_deref()) {
        Err(error) => api::error(StatusCode::UNAUTHORIZED, error.to_string()),
        Ok(principal) if scrape && !principal.may_scrape() => api::error(
            StatusCode::FORBIDDEN,
            format!("token {:?} grants neither the metrics nor the admin scope", principal.name),
        ),
        Ok(principal) if !scrape && !principal.is_admin() => {
            api::error(StatusCode::FORBIDDEN, format!("token {:?} does not grant the admin scope", principal.name))
        }
        Ok(_) => next.run(request).await,
    }
}

/// Serves the admin routes on `listener` until the state's shutdown signal.
/// The admin listener's connection caps. Its idle bound is the [`HEADER_TIMEOUT`] between
/// requests, not the byte timer, which would cut event streams (their clients only read).
pub const ADMIN_LIMITS: ConnectionLimits = ConnectionLimits {
    max_connections: 512,
    max_connections_per_peer: 64,
    handshake_timeout: Duration::from_secs(10),
    idle_timeout: Duration::from_secs(365 * 24 * 3600),
    probe_reserve: 64,
};

/// How long a request head may take to arrive, counted from when rota waits for it (on a new
/// connection, and after each response on a kept-alive one).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// HTTP/1 on an admitted connection: no handshake; its first byte must come in time.
#[derive(Debug, Clone, Copy)]
struct Http1;

impl Handshake for Http1 {
    type Conn = Guarded<TcpStream>;

    async fn handshake(&self, io: Guarded<TcpStream>) -> std::io::Result<Self::Conn> {
        Ok(io)
    }

    fn handshake_bytes(&self) -> u64 {
        1
    }
}

/// Serves the admin routes on `listener` until the server stops; connections still open then
/// get a graceful close (at most the server's wait for this task).
pub fn spawn(listener: TcpListener, state: AdminState) -> JoinHandle<()> {
    use futures_util::StreamExt;
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;

    let stopping = state.stopping.clone();
    let probes = probe_router(state.clone());
    let app = router(state);
    let mut incoming = crate::listener::incoming(listener, Admission::new(ADMIN_LIMITS), Http1);
    tokio::spawn(async move {
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        let stopped = AdminState::stopped(stopping);
        tokio::pin!(stopped);
        loop {
            let conn = tokio::select! {
                conn = incoming.next() => match conn {
                    Some(Ok(conn)) => conn,
                    _ => break,
                },
                () = &mut stopped => break,
            };
            // HTTP/1 for browsers, scrapers and probes; HTTP/2 too, so that a gRPC client sent
            // here by mistake gets an answer that says so.
            let mut http = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let reserved = conn.reserved();
            let app = if reserved {
                // Past the caps: one probe answered, then closed.
                http.http1()
                    .timer(TokioTimer::new())
                    .header_read_timeout(crate::listener::RESERVE_TIMEOUT)
                    .keep_alive(false);
                probes.clone()
            } else {
                http.http1().timer(TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT);
                app.clone()
            };
            let peer = conn.peer_addr().map(|addr| streams::Peer(addr.ip()));
            let app = match peer {
                Some(peer) => app.layer(axum::Extension(peer)),
                None => app,
            };
            let serving = http.serve_connection(TokioIo::new(conn), TowerToHyperService::new(app));
            let serving = graceful.watch(serving.into_owned());
            tokio::spawn(async move {
                if let Err(error) = serving.await {
                    tracing::debug!(%error, "admin connection ended");
                }
            });
        }
        graceful.shutdown().await;
    })
}

async fn dashboard() -> impl IntoResponse {
    ([(header::CACHE_CONTROL, "no-store")], Html(DASHBOARD))
}

async fn healthz() -> &'static str {
    "ok"
}

/// Ready unless stopping. A replica whose state backend is unreachable stays ready (it answers
/// picks from local state, which beats not answering) and says so in the body; so does one
/// with a stale source (it answers from the source's last listing), and one whose copy of the
/// other replicas' instances lags more than `server.replica_lag_limit`.
async fn readyz(axum::extract::State(state): axum::extract::State<AdminState>) -> (StatusCode, String) {
    if state.is_stopping() {
        return (StatusCode::SERVICE_UNAVAILABLE, "stopping".into());
    }
    let mut degraded = Vec::new();
    if !state.overview.state_backend().1 {
        degraded.push("state backend unreachable, answering from local state".to_owned());
    }
    if let Some(overload) = &state.overload
        && overload.pressure() != crate::overload::Pressure::Normal
    {
        degraded.push(format!(
            "memory {} (resident {} of server.max_rss_bytes {}), Watch and xDS streams refused",
            overload.pressure().as_str(),
            overload.rss(),
            overload.limit().unwrap_or(0)
        ));
    }
    if let Some(diverged) = state.overview.link().and_then(|link| link.propagation().diverged(link.is_up())) {
        degraded.push(format!("replicas diverged: {diverged}"));
    }
    let stale = state.sources.stale();
    if !stale.is_empty() {
        degraded.push(format!("sources stale, answering from their last listing: {}", stale.join(", ")));
    }
    if degraded.is_empty() {
        (StatusCode::OK, "ready".into())
    } else {
        (StatusCode::OK, format!("ready (degraded: {})", degraded.join("; ")))
    }
}
