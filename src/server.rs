//! Assembles rota — registry, state, balancer, gRPC services, health and reflection — and serves
//! it on one socket until told to stop, with the operators' [admin listener](crate::admin) on a
//! second one.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tracing::info;

use crate::admin::{self, AdminError, AdminState};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryServiceServer;
use tonic::service::interceptor::InterceptedService;

use crate::auth::Authenticator;
use crate::balancer::Balancer;
use crate::grpc::answers::{AnswersLayer, UnreadAnswers};
use crate::grpc::auth::{AuthInterceptor, Required};
use crate::grpc::metrics::{GrpcMetrics, GrpcMetricsLayer};
use crate::grpc::peers::{DEFAULT_CONSUMER_STREAMS_PER_PEER, PeerStreams};
use crate::grpc::streams::{DEFAULT_MAX_OPEN_STREAMS, OpenStreams};
use crate::grpc::{
    BalancerRoutes, BalancerService, PoliciesService, RegistryRoutes, RegistryService, Warmup, XdsService,
};
use crate::listener::{self, Admission, ConnectionLimits, Plaintext};
use crate::load::StatsConfig;
use crate::overload::{Overload, ResidentSet};
use crate::pb;
use crate::policy::file::{ConfigError, PolicyReloads};
use crate::policy::{Policies, PolicySet};
use crate::registry::{Registry, RegistryConfig};
use crate::state::{StateBackend, StateConfig};
use crate::tls::{ReloadingAcceptor, TlsError, TlsFiles, TlsReloads};

/// Default gRPC listen address: loopback only, so an unconfigured rota is not exposed.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:50051";
/// Default admin (HTTP) listen address, loopback only for the same reason.
pub const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9090";

/// HTTP/2 keepalive: a peer that stops answering pings is disconnected, which ends its
/// registration stream and removes its instances even before the heartbeat timeout.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// HTTP/2 flow-control windows, `(stream, connection)`, for connections that may open
/// `streams_per_connection` streams.
///
/// h2 closes a connection (`GOAWAY ENHANCE_YOUR_CALM too_many_data_frames`) whose received and
/// not yet read DATA frames of under 256 bytes cost more framing overhead (256 bytes less each
/// frame's payload) than half its connection window. A pipelining client's unread requests
/// are such frames: the smallest a gRPC message makes is its 5-byte prefix, so they can cost
/// 50 times their bytes, and their bytes are bounded only by the stream window on each of the
/// connection's streams. So the connection window is the largest HTTP/2 allows (a 1 GiB
/// budget; the streams, not the connection, bound what a peer may have in flight), and the
/// stream window the largest, up to 64 KiB, at which every stream of a full connection can
/// hold its window in 5-byte frames inside that budget: a fast pipelining client is then
/// slowed by flow control on any number of streams, never disconnected. 64 KiB up to 319
/// streams per connection, 19 KiB at the default 1024; a connection holds at most ~20 MiB of
/// unread requests whatever the setting.
pub fn flow_windows(streams_per_connection: u32) -> (u32, u32) {
    const MAX_WINDOW: u32 = (1 << 31) - 1;
    const SMALL_FRAME: u64 = 256;
    const SMALLEST_MESSAGE_FRAME: u64 = 5;
    let budget = u64::from(MAX_WINDOW / 2);
    // Frames each stream may hold, charged the most any frame costs, and their bytes.
    let frames = budget / (SMALL_FRAME * u64::from(streams_per_connection.max(1)));
    let stream = (frames * SMALLEST_MESSAGE_FRAME).min(64 << 10);
    // Whole KiB where there is room for them.
    let stream = if stream >= 1 << 10 { stream & !((1 << 10) - 1) } else { stream.max(1) };
    (stream as u32, MAX_WINDOW)
}
/// Request headers accepted on one stream, advertised in SETTINGS so well-behaved clients refuse
/// larger ones themselves. A larger header list is refused on its own stream (HTTP 431), and
/// h2 closes the connection only for a single field larger than this, so it is generous:
/// gRPC metadata is small, and a stray large header should not cost the connection's other
/// streams (registrations among them).
const MAX_HEADER_LIST_BYTES: u32 = 256 << 10;

/// Default time between housekeeping rounds (statistics of departed instances, expired sticky
/// assignments, idle rotation counters, forgotten services).
pub const DEFAULT_HOUSEKEEPING_INTERVAL: Duration = Duration::from_secs(30);

#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub listen: SocketAddr,
    /// The admin HTTP listener (metrics, health, JSON API, dashboard); `None` disables it.
    pub admin_listen: Option<SocketAddr>,
    pub registry: RegistryConfig,
    pub stats: StatsConfig,
    /// Policy file (TOML), loaded before binding and reloaded on change or SIGHUP.
    pub policy_file: Option<PathBuf>,
    pub limits: Limits,
    /// Time between housekeeping rounds.
    pub housekeeping_interval: Duration,
    /// Memory budget of the sticky assignments, in bytes.
    pub sticky_memory_bytes: usize,
    /// Where rule state lives.
    pub state: StateConfig,
    /// TLS (and mTLS when a client CA is given) on the gRPC listener; `None` serves plaintext.
    pub tls: Option<TlsFiles>,
    /// Bearer tokens and their scopes; `None` serves without authentication.
    pub auth: Option<Arc<Authenticator>>,
    /// How long after start a service not seen yet answers `warming_up` instead of `NOT_FOUND`
    /// (see [`crate::grpc::warmup`]); `None` is the registry's heartbeat timeout.
    pub warmup: Option<Duration>,
    /// How long a seen service's arrivals must pause before the warm-up serves it; `None` is
    /// [`default_settle`](crate::grpc::warmup::default_settle), zero serves a seen service at once.
    pub warmup_settle: Option<Duration>,
    /// Registries rota follows (`[[source]]`, `--source`).
    pub sources: Vec<crate::sources::SourceSpec>,
    /// The networks active health checks may connect to; `None` is
    /// [`Networks::default_for`](crate::health::reach::Networks::default_for) the listeners.
    pub health_check_networks: Option<crate::health::reach::Networks>,
    /// Where the resident set held against `limits.max_rss_bytes` is read.
    pub resident_set: ResidentSet,
}

impl ServeConfig {
    /// The networks active health checks may connect to, given or by default.
    pub fn health_check_networks(&self) -> crate::health::reach::Networks {
        self.health_check_networks.clone().unwrap_or_else(|| {
            crate::health::reach::Networks::default_for(
                std::iter::once(self.listen.ip()).chain(self.admin_listen.map(|a| a.ip())),
            )
        })
    }
}

/// Bounds on what one peer or connection may ask of the server, so overload is refused
/// (`RESOURCE_EXHAUSTED`) instead of queued without bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Open registration streams per client IP address.
    pub registrations_per_peer: usize,
    /// Open `Watch` and `PickStream` streams per client IP address.
    pub consumer_streams_per_peer: usize,
    /// Largest request message accepted, in bytes.
    pub max_message_bytes: usize,
    /// Requests in progress per connection; more are shed with `RESOURCE_EXHAUSTED`.
    pub concurrent_requests_per_connection: usize,
    /// HTTP/2 streams per connection (advertised in SETTINGS).
    pub streams_per_connection: u32,
    /// Long-lived streams (`Register`, `Watch`, `PickStream`) open at once, in total.
    pub max_open_streams: usize,
    /// Bytes of answers (listings, leases, watch events) clients have not read yet, in total.
    pub max_unread_bytes: usize,
    /// The same per client IP address.
    pub max_unread_bytes_per_peer: usize,
    /// Connections in total and per peer, and how long one may stay silent.
    pub connections: ConnectionLimits,
    /// What xDS clients may subscribe to.
    pub xds: crate::xds::XdsLimits,
    /// Resident memory past which Watch and xDS streams are refused, then ended
    /// ([`crate::overload`]); 0 is no limit.
    pub max_rss_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            registrations_per_peer: 64,
            consumer_streams_per_peer: DEFAULT_CONSUMER_STREAMS_PER_PEER,
            max_message_bytes: 4 << 20,
            concurrent_requests_per_connection: 1024,
            streams_per_connection: 1024,
            max_open_streams: DEFAULT_MAX_OPEN_STREAMS,
            max_unread_bytes: crate::grpc::answers::DEFAULT_MAX_UNREAD_BYTES,
            max_unread_bytes_per_peer: crate::grpc::answers::DEFAULT_MAX_UNREAD_BYTES_PER_PEER,
            connections: ConnectionLimits::default(),
            xds: crate::xds::XdsLimits::default(),
            max_rss_bytes: 0,
        }
    }
}

impl Default for ServeConfig {
    fn default() -> Self {
        Self {
            listen: DEFAULT_LISTEN.parse().expect("the default listen address is valid"),
            admin_listen: Some(DEFAULT_ADMIN_LISTEN.parse().expect("the default admin address is valid")),
            registry: RegistryConfig::default(),
            stats: StatsConfig::default(),
            policy_file: None,
            limits: Limits::default(),
            housekeeping_interval: DEFAULT_HOUSEKEEPING_INTERVAL,
            sticky_memory_bytes: crate::state::DEFAULT_STICKY_MEMORY_BYTES,
            state: StateConfig::Memory,
            tls: None,
            auth: None,
            warmup: None,
            warmup_settle: None,
            sources: Vec::new(),
            health_check_networks: None,
            resident_set: ResidentSet::Process,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{}: {}", .0.key, .0)]
    Tls(#[from] TlsError),
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Admin(#[from] AdminError),
    #[error("cannot build the reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("gRPC server failed: {0}")]
    Transport(#[from] tonic::transport::Error),
}

/// Default time between the start of a graceful shutdown and the end of serving.
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// A running server.
pub struct Server {
    local_addr: SocketAddr,
    tls: bool,
    tls_reloads: Option<watch::Receiver<TlsReloads>>,
    policy_reloads: Option<watch::Receiver<PolicyReloads>>,
    admin_addr: Option<SocketAddr>,
    balancer: Arc<Balancer>,
    overload: Arc<Overload>,
    health: tonic_health::server::HealthReporter,
    /// Turns true when a graceful shutdown begins; long-lived streams watch it.
    drain: watch::Sender<bool>,
    stop: Option<oneshot::Sender<()>>,
    /// Tells the admin listener, and its event streams, to stop.
    admin_stop: watch::Sender<bool>,
    admin_task: Option<JoinHandle<()>>,
    task: JoinHandle<Result<(), tonic::transport::Error>>,
    background: Vec<JoinHandle<()>>,
}

impl Drop for Server {
    fn drop(&mut self) {
        for task in &self.background {
            task.abort();
        }
    }
}

/// Housekeeping runs on a blocking thread: it walks every statistics entry, and however long
/// that takes at scale, it must never hold up the runtime that answers picks and heartbeats.
async fn housekeeping(balancer: Arc<Balancer>, interval: Duration) {
    every(interval, "housekeeping", move || balancer.housekeeping()).await
}

/// Runs `work` on a blocking thread every `interval` (the first time after one interval).
async fn every(interval: Duration, what: &'static str, work: impl Fn() + Clone + Send + 'static) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        if tokio::task::spawn_blocking(work.clone()).await.is_err() {
            tracing::error!("{what} failed");
        }
    }
}

impl Server {
    /// Binds `config.listen` (port 0 picks a free port) and starts serving in the background.
    pub async fn start(config: ServeConfig) -> Result<Self, ServeError> {
        // Configuration is validated completely before any port is bound.
        let policy_set = match &config.policy_file {
            Some(path) => crate::policy::file::load(path)?,
            None => PolicySet::default(),
        };
        let policies = Arc::new(Policies::new(policy_set));
        let health_check_networks = config.health_check_networks();
        let tls = config.tls.map(ReloadingAcceptor::new).transpose()?;
        let listener = TcpListener::bind(config.listen)
            .await
            .map_err(|source| ServeError::Bind { addr: config.listen, source })?;
        let local_addr = listener.local_addr().map_err(|source| ServeError::Bind { addr: config.listen, source })?;
        let admin_listener = match config.admin_listen {
            Some(addr) => Some(admin::bind(addr).await?),
            None => None,
        };

        let warmup_length = config.warmup.unwrap_or(config.registry.heartbeat_timeout);
        let mut warmup = Warmup::starting_now(warmup_length);
        if let Some(settle) = config.warmup_settle {
            warmup = warmup.with_settle(settle);
        }
        let registry = Registry::spawn(config.registry);
        let balancer = Arc::new(Balancer::new(
            registry.clone(),
            StateBackend::open(&config.state, config.sticky_memory_bytes),
            policies.clone(),
            config.stats,
        ));
        let mut background = Vec::new();
        let (sources, source_tasks) = crate::sources::spawn(&registry, &config.sources);
        background.extend(source_tasks);
        let mut health_sharing = None;
        if let Some(link) = balancer.state().link() {
            let (tasks, sharing) = crate::replicas::spawn(balancer.registry(), balancer.stats(), &policies, link);
            background.extend(tasks);
            health_sharing = Some(sharing);
        }
        // Checks never reach rota's own listeners, and only the networks allowed.
        let mut own = vec![(local_addr, "gRPC")];
        own.extend(admin_listener.as_ref().map(|(_, addr)| (*addr, "admin")));
        let reach = crate::health::reach::Reach::new(health_check_networks, own);
        let probe = Arc::new(crate::health::probe::Network::new(reach));
        let (health_checks, prober) = crate::health::spawn(registry.clone(), policies.clone(), health_sharing, probe);
        background.push(prober);
        let policy_reloads = config.policy_file.as_ref().map(|path| {
            let reloads = watch::Sender::new(PolicyReloads::default());
            let receiver = reloads.subscribe();
            background.push(crate::policy::file::spawn_reloader(path.clone(), policies.clone(), reloads));
            receiver
        });
        background.push(tokio::spawn(housekeeping(balancer.clone(), config.housekeeping_interval)));
        // Unreported picks stop counting as in flight within about a second of their timeout.
        let expiring = balancer.clone();
        background
            .push(tokio::spawn(every(Duration::from_secs(1), "in-flight expiry", move || expiring.expire_in_flight())));

        let (drain, drain_rx) = watch::channel(false);
        let (health, health_service) = tonic_health::server::health_reporter();
        health.set_serving::<pb::balancer_server::BalancerServer<BalancerService>>().await;
        health.set_serving::<pb::registry_server::RegistryServer<RegistryService>>().await;
        health.set_serving::<pb::policies_server::PoliciesServer<PoliciesService>>().await;
        let reflection_v1 = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()?;
        let reflection_v1alpha = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1alpha()?;

        let grpc_metrics = Arc::new(GrpcMetrics::default());
        let limits = config.limits;
        // Sampled once before serving, so the first stream already meets the right level.
        let overload = Arc::new(Overload::new(Some(limits.max_rss_bytes)));
        if overload.limit().is_some() {
            config.resident_set.sample(&overload).await;
            background.push(tokio::spawn(config.resident_set.clone().run_sampler(overload.clone())));
        }
        let streams = OpenStreams::new(limits.max_open_streams);
        let consumers = PeerStreams::consumers(limits.consumer_streams_per_peer);
        let admission = Admission::new(limits.connections);
        let answers = UnreadAnswers::new(limits.max_unread_bytes, limits.max_unread_bytes_per_peer);
        // With tokens configured, each rota service sits behind its scope's interceptor;
        // without, requests skip the interceptor altogether.
        balancer.views().encode_answers_with(crate::grpc::convert::encoded_instance);
        let balancer_service = BalancerRoutes::new(
            BalancerService::new(balancer.clone(), consumers.clone(), streams.clone())
                .with_warmup(warmup)
                .with_answers(answers.clone()),
            limits.max_message_bytes,
        );
        let registry_service = RegistryRoutes::new(
            RegistryService::new(registry, drain_rx, limits.registrations_per_peer, consumers.clone(), streams.clone())
                .with_sources(sources.clone())
                .with_warmup(warmup)
                .with_answers(answers.clone())
                .with_overload(overload.clone()),
            limits.max_message_bytes,
        );
        let policies_service =
            pb::policies_server::PoliciesServer::new(PoliciesService::new(policies, balancer.registry().clone()))
                .max_decoding_message_size(limits.max_message_bytes);
        let overview = crate::balancer::Overview::new(balancer.clone());
        let xds_hub = crate::xds::Hub::new(overview, limits.xds, warmup_length, warmup.settle());
        background.push(xds_hub.spawn());
        let xds_service = AggregatedDiscoveryServiceServer::new(
            XdsService::new(xds_hub.clone(), consumers, streams.clone(), drain.subscribe())
                .with_answers(answers.clone())
                .with_overload(overload.clone()),
        )
        .max_decoding_message_size(limits.max_message_bytes);
        let (stream_window, connection_window) = flow_windows(limits.streams_per_connection);
        let router = tonic::transport::Server::builder()
            .layer(GrpcMetricsLayer::new(grpc_metrics.clone()))
            .layer(AnswersLayer)
            .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
            .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
            .initial_stream_window_size(stream_window)
            .initial_connection_window_size(connection_window)
            .http2_max_header_list_size(MAX_HEADER_LIST_BYTES)
            .concurrency_limit_per_connection(limits.concurrent_requests_per_connection)
            .load_shed(true)
            .max_concurrent_streams(Some(limits.streams_per_connection))
            .add_service(health_service)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .add_optional_service(guarded(&config.auth, Required::Pick, balancer_service.clone()))
            .add_optional_service(config.auth.is_none().then_some(balancer_service))
            .add_optional_service(guarded(&config.auth, Required::Authenticated, registry_service.clone()))
            .add_optional_service(config.auth.is_none().then_some(registry_service))
            .add_optional_service(guarded(&config.auth, Required::Admin, policies_service.clone()))
            .add_optional_service(config.auth.is_none().then_some(policies_service))
            .add_optional_service(guarded(&config.auth, Required::Pick, xds_service.clone()))
            .add_optional_service(config.auth.is_none().then_some(xds_service));

        let (stop, stopped) = oneshot::channel::<()>();
        let stopped = async {
            let _ = stopped.await;
        };
        let task = match &tls {
            Some(acceptor) => {
                background.push(acceptor.spawn_reloader());
                let incoming = listener::incoming(listener, admission.clone(), acceptor.handshaker());
                tokio::spawn(router.serve_with_incoming_shutdown(incoming, stopped))
            }
            None => {
                let incoming = listener::incoming(listener, admission.clone(), Plaintext);
                tokio::spawn(router.serve_with_incoming_shutdown(incoming, stopped))
            }
        };
        info!(addr = %local_addr, tls = tls.is_some(), backend = balancer.state().name(), "serving");

        let (admin_stop, admin_stopped) = watch::channel(false);
        let (admin_addr, admin_task) = match admin_listener {
            Some((listener, addr)) => {
                let state = AdminState::new(
                    crate::balancer::Overview::new(balancer.clone()),
                    grpc_metrics,
                    admin_stopped,
                    drain.subscribe(),
                )
                .with_auth(config.auth.clone())
                .with_limits(admission, streams, answers)
                .with_xds(xds_hub)
                .with_sources(sources)
                .with_health_checks(health_checks)
                .with_overload(overload.clone())
                .with_policy_reloads(policy_reloads.clone());
                info!(addr = %addr, "admin listening");
                (Some(addr), Some(admin::spawn(listener, state)))
            }
            None => (None, None),
        };
        Ok(Self {
            local_addr,
            tls: tls.is_some(),
            tls_reloads: tls.as_ref().map(ReloadingAcceptor::reloads),
            policy_reloads,
            admin_addr,
            balancer,
            overload,
            health,
            drain,
            stop: Some(stop),
            admin_stop,
            admin_task,
            task,
            background,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The admin listener's bound address, unless it is disabled.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// What the TLS reloader made of the changes it saw, when TLS is on.
    pub fn tls_reloads(&self) -> Option<watch::Receiver<TlsReloads>> {
        self.tls_reloads.clone()
    }

    /// What the policy file's reloader made of the changes it saw, when there is a file.
    pub fn policy_reloads(&self) -> Option<watch::Receiver<PolicyReloads>> {
        self.policy_reloads.clone()
    }

    /// Memory pressure as last sampled (normal for good without `max_rss_bytes`).
    pub fn overload(&self) -> &Arc<Overload> {
        &self.overload
    }

    /// The server's balancer, for embedding rota in-process.
    pub fn balancer(&self) -> &Arc<Balancer> {
        &self.balancer
    }

    /// `http://ADDR`, or `https://ADDR` with TLS, ready for a client to connect to.
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}", self.local_addr)
    }

    /// Runs until the server stops on its own (an error) or `shutdown` resolves; then drains
    /// for `grace` (see [`begin_drain`](Self::begin_drain)) and stops. `shutdown` resolving a
    /// second time ends the grace period early.
    pub async fn run_until<F: Future<Output = ()>>(
        mut self,
        mut shutdown: impl FnMut() -> F,
        grace: Duration,
    ) -> Result<(), ServeError> {
        tokio::select! {
            result = &mut self.task => return flatten(result),
            () = shutdown() => {}
        }
        self.begin_drain().await;
        info!(grace_ms = grace.as_millis() as u64, "draining");
        tokio::select! {
            () = tokio::time::sleep(grace) => {}
            () = shutdown() => info!("second signal: stopping now"),
        }
        self.stop().await
    }

    /// Starts a graceful shutdown: health turns NOT_SERVING (so balancers and probes move
    /// away), registration streams are sent `Closing` and ended (providers reconnect to another
    /// replica), watches end; picks keep being answered until [`stop`](Self::stop).
    pub async fn begin_drain(&self) {
        self.health.set_service_status("", tonic_health::ServingStatus::NotServing).await;
        self.health.set_not_serving::<pb::balancer_server::BalancerServer<BalancerService>>().await;
        self.health.set_not_serving::<pb::registry_server::RegistryServer<RegistryService>>().await;
        self.health.set_not_serving::<pb::policies_server::PoliciesServer<PoliciesService>>().await;
        self.drain.send_replace(true);
    }

    /// Stops accepting calls and aborts open streams.
    pub async fn stop(mut self) -> Result<(), ServeError> {
        for task in &self.background {
            task.abort();
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        // Readiness turns false and event streams end at once, then the admin listener drains.
        let _ = self.admin_stop.send(true);
        if let Some(admin) = self.admin_task.take()
            && tokio::time::timeout(Duration::from_secs(5), admin).await.is_err()
        {
            tracing::warn!("admin listener did not stop in time");
        }
        // Long-lived streams (registrations, watches) would hold a graceful shutdown open;
        // bound the wait, then end them.
        match tokio::time::timeout(Duration::from_secs(5), &mut self.task).await {
            Ok(result) => flatten(result),
            Err(_) => {
                self.task.abort();
                Ok(())
            }
        }
    }
}

fn flatten(result: Result<Result<(), tonic::transport::Error>, tokio::task::JoinError>) -> Result<(), ServeError> {
    match result {
        Ok(result) => result.map_err(ServeError::from),
        // The task is only aborted by `stop`, and panics are not expected; report either as done.
        Err(_) => Ok(()),
    }
}

/// `service` behind an interceptor requiring `required`, when tokens are configured.
fn guarded<S>(
    auth: &Option<Arc<crate::auth::Authenticator>>,
    required: Required,
    service: S,
) -> Option<InterceptedService<S, AuthInterceptor>> {
    auth.as_ref().map(|auth| InterceptedService::new(service, AuthInterceptor::new(auth.clone(), required)))
}

#[cfg(test)]
mod tests {
    use super::flow_windows;

    /// Every stream of a full connection holding its whole window in 5-byte DATA frames costs
    /// h2's small-frame accounting no more than its budget (half the connection window), for
    /// any setting; and the windows are as large as that allows, up to 64 KiB.
    #[test]
    fn a_full_connection_of_the_smallest_frames_stays_inside_h2s_budget() {
        for streams in [1, 2, 100, 319, 320, 1024, 4096, 20_000, 100_000, 1_000_000] {
            let (stream, connection) = flow_windows(streams);
            assert_eq!(connection, (1 << 31) - 1);
            assert!((1..=64 << 10).contains(&stream), "{streams} streams: {stream}");
            let frames = u64::from(streams) * u64::from(stream).div_ceil(5);
            assert!(frames * (256 - 5) <= u64::from(connection / 2), "{streams} streams of {stream} bytes");
        }
        assert_eq!(flow_windows(319).0, 64 << 10);
        assert!(flow_windows(320).0 < 64 << 10);
        assert_eq!(flow_windows(1024).0, 19 << 10, "the default streams per connection");
        assert_eq!(flow_windows(0), flow_windows(1));
    }
}
