//! `rota serve`.

use std::io::Write;

use clap::Args;

use super::{CliError, shutdown_signal};
use crate::config::{self, Overrides};
use crate::server::Server;

/// Every setting may also come from the config file's `[server]` table; flags and environment
/// variables override it (see `docs/config.md`).
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Config file (TOML): `[server]` settings, and per-service policies reloaded on change or SIGHUP.
    #[arg(long, env = "ROTA_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    /// gRPC listen address [default: 127.0.0.1:50051]; port 0 picks a free port. The bound
    /// address is printed first.
    #[arg(long, env = "ROTA_LISTEN")]
    pub listen: Option<String>,
    /// Admin HTTP listen address (metrics, health, JSON API, dashboard), or `off`
    /// [default: 127.0.0.1:9090]; port 0 picks a free port. The bound address is printed second.
    #[arg(long, env = "ROTA_ADMIN_LISTEN")]
    pub admin_listen: Option<String>,
    /// Drop a registration stream's instances after this long without a message [default: 15s].
    #[arg(long, env = "ROTA_HEARTBEAT_TIMEOUT")]
    pub heartbeat_timeout: Option<String>,
    /// After start, answer picks of a service not seen yet with UNAVAILABLE `warming_up`
    /// instead of NOT_FOUND for this long; 0s for none [default: the heartbeat timeout].
    #[arg(long, env = "ROTA_WARMUP")]
    pub warmup: Option<String>,
    /// During the warm-up, hold a seen service back from leases until none of its instances
    /// has come UP for this long, so the first provider back does not take every channel's
    /// calls; 0s serves it at once [default: a fifth of the warm-up, at most 3s].
    #[arg(long, env = "ROTA_WARMUP_SETTLE")]
    pub warmup_settle: Option<String>,
    /// On SIGTERM/SIGINT: answer picks this long while registrations move away, then exit
    /// [default: 10s].
    #[arg(long, env = "ROTA_SHUTDOWN_GRACE")]
    pub shutdown_grace: Option<String>,
    /// Most instances one registration stream may hold [default: 1000].
    #[arg(long, env = "ROTA_MAX_INSTANCES_PER_STREAM")]
    pub max_instances_per_stream: Option<String>,
    /// A pick not reported within this time stops counting as in flight [default: 30s].
    #[arg(long, env = "ROTA_IN_FLIGHT_TIMEOUT")]
    pub in_flight_timeout: Option<String>,
    /// Time constant of the latency EWMA [default: 10s].
    #[arg(long, env = "ROTA_LATENCY_DECAY")]
    pub latency_decay: Option<String>,
    /// Open registration streams per client address [default: 64].
    #[arg(long, env = "ROTA_MAX_REGISTRATIONS_PER_PEER")]
    pub max_registrations_per_peer: Option<String>,
    /// Open Watch and PickStream streams per client address [default: 2048].
    #[arg(long, env = "ROTA_MAX_CONSUMER_STREAMS_PER_PEER")]
    pub max_consumer_streams_per_peer: Option<String>,
    /// Resource names one xDS stream may subscribe to, per type [default: 1000].
    #[arg(long, env = "ROTA_MAX_XDS_NAMES_PER_STREAM")]
    pub max_xds_names_per_stream: Option<String>,
    /// Services subscribed to over xDS, summed over every stream [default: 100000].
    #[arg(long, env = "ROTA_MAX_XDS_SUBSCRIPTIONS")]
    pub max_xds_subscriptions: Option<String>,
    /// Largest request message, in bytes [default: 4194304].
    #[arg(long, env = "ROTA_MAX_MESSAGE_BYTES")]
    pub max_message_bytes: Option<String>,
    /// Requests in progress per connection; more are shed with RESOURCE_EXHAUSTED [default: 1024].
    #[arg(long, env = "ROTA_MAX_CONCURRENT_REQUESTS_PER_CONNECTION")]
    pub max_concurrent_requests_per_connection: Option<String>,
    /// HTTP/2 streams per connection [default: 1024].
    #[arg(long, env = "ROTA_MAX_STREAMS_PER_CONNECTION")]
    pub max_streams_per_connection: Option<String>,
    /// gRPC connections open at once; more are closed as they arrive [default: 10000].
    #[arg(long, env = "ROTA_MAX_CONNECTIONS")]
    pub max_connections: Option<String>,
    /// gRPC connections open at once from one client address [default: 256].
    #[arg(long, env = "ROTA_MAX_CONNECTIONS_PER_PEER")]
    pub max_connections_per_peer: Option<String>,
    /// Time a new connection has to finish its TLS handshake or send the HTTP/2 preface [default: 10s].
    #[arg(long, env = "ROTA_HANDSHAKE_TIMEOUT")]
    pub handshake_timeout: Option<String>,
    /// A connection that sends nothing for this long is closed [default: 5m].
    #[arg(long, env = "ROTA_IDLE_TIMEOUT")]
    pub idle_timeout: Option<String>,
    /// Register, Watch and PickStream streams open at once; more are refused with
    /// RESOURCE_EXHAUSTED [default: 10000].
    #[arg(long, env = "ROTA_MAX_OPEN_STREAMS")]
    pub max_open_streams: Option<String>,
    /// Bytes of answers (listings, leases, watch events) that clients have not read yet, in
    /// total; past it, answers wait for room [default: 268435456].
    #[arg(long, env = "ROTA_MAX_UNREAD_BYTES")]
    pub max_unread_bytes: Option<String>,
    /// The same per client IP address, at most max_unread_bytes [default: 33554432].
    #[arg(long, env = "ROTA_MAX_UNREAD_BYTES_PER_PEER")]
    pub max_unread_bytes_per_peer: Option<String>,
    /// Memory budget of sticky assignments, in bytes [default: 134217728].
    #[arg(long, env = "ROTA_STICKY_MEMORY_BYTES")]
    pub sticky_memory_bytes: Option<String>,
    /// Where rule state lives: `memory` (this process) or a Redis shared by several replicas,
    /// `redis://HOST:PORT[/DB]`, `redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB]` or
    /// `redis+cluster://HOST:PORT[,HOST:PORT...]`
    /// [default: memory].
    #[arg(long, env = "ROTA_STATE")]
    pub state: Option<String>,
    /// With a Redis state: spare tickets a replica reserves per Redis call (1 keeps every
    /// rotation exact per pick; more trades interleaving for fewer Redis calls) [default: 1].
    #[arg(long, env = "ROTA_TICKET_BLOCK")]
    pub ticket_block: Option<String>,
    /// With a Redis state: the longest wait for one Redis command before the replica counts
    /// Redis as unreachable and answers from local state [default: 500ms].
    #[arg(long, env = "ROTA_STATE_TIMEOUT")]
    pub state_timeout: Option<String>,
    /// Time between housekeeping rounds (departed instances' statistics, expired sticky
    /// assignments, idle counters, forgotten services) [default: 30s].
    #[arg(long, env = "ROTA_HOUSEKEEPING_INTERVAL")]
    pub housekeeping_interval: Option<String>,
    /// A service with no instance and no watcher is forgotten after this long [default: 10m].
    #[arg(long, env = "ROTA_SERVICE_IDLE_TIMEOUT")]
    pub service_idle_timeout: Option<String>,
    /// Services known at once; announcing into one more is refused [default: 100000].
    #[arg(long, env = "ROTA_MAX_SERVICES")]
    pub max_services: Option<String>,
    /// Services one token's registration streams may hold instances in at once [default: 1000].
    #[arg(long, env = "ROTA_MAX_SERVICES_PER_TOKEN")]
    pub max_services_per_token: Option<String>,
    /// Serve on a non-loopback address although no authentication is configured.
    #[arg(long, env = "ROTA_INSECURE")]
    pub insecure: bool,
    /// Log lines as text or as JSON objects (one per line, on stderr).
    #[arg(long, env = "ROTA_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Serve TLS with this PEM certificate chain (needs --tls-key); reloaded when it changes.
    #[arg(long, env = "ROTA_TLS_CERT")]
    pub tls_cert: Option<String>,
    /// PEM private key of the TLS certificate (needs --tls-cert).
    #[arg(long, env = "ROTA_TLS_KEY")]
    pub tls_key: Option<String>,
    /// PEM CA bundle: clients must present a certificate signed by it (mTLS).
    #[arg(long, env = "ROTA_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<String>,
    /// Print the effective configuration and exit.
    #[arg(long)]
    pub print_config: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

pub async fn run(args: ServeArgs) -> Result<(), CliError> {
    let overrides = Overrides {
        listen: args.listen,
        admin_listen: args.admin_listen,
        heartbeat_timeout: args.heartbeat_timeout,
        warmup: args.warmup,
        warmup_settle: args.warmup_settle,
        max_instances_per_stream: args.max_instances_per_stream,
        shutdown_grace: args.shutdown_grace,
        in_flight_timeout: args.in_flight_timeout,
        latency_decay: args.latency_decay,
        insecure: args.insecure.then_some(true),
        max_registrations_per_peer: args.max_registrations_per_peer,
        max_consumer_streams_per_peer: args.max_consumer_streams_per_peer,
        max_xds_names_per_stream: args.max_xds_names_per_stream,
        max_xds_subscriptions: args.max_xds_subscriptions,
        max_message_bytes: args.max_message_bytes,
        max_concurrent_requests_per_connection: args.max_concurrent_requests_per_connection,
        max_streams_per_connection: args.max_streams_per_connection,
        max_connections: args.max_connections,
        max_connections_per_peer: args.max_connections_per_peer,
        handshake_timeout: args.handshake_timeout,
        idle_timeout: args.idle_timeout,
        max_open_streams: args.max_open_streams,
        max_unread_bytes: args.max_unread_bytes,
        max_unread_bytes_per_peer: args.max_unread_bytes_per_peer,
        sticky_memory_bytes: args.sticky_memory_bytes,
        state: args.state,
        ticket_block: args.ticket_block,
        state_timeout: args.state_timeout,
        housekeeping_interval: args.housekeeping_interval,
        service_idle_timeout: args.service_idle_timeout,
        max_services: args.max_services,
        max_services_per_token: args.max_services_per_token,
        tls_cert: args.tls_cert,
        tls_key: args.tls_key,
        tls_client_ca: args.tls_client_ca,
    };
    let settings = config::resolve(args.config.as_deref(), &overrides)?;
    // The policy part is validated here too, so a bad file never gets as far as binding.
    let policies = match settings.policy_file() {
        Some(path) => Some(crate::policy::file::load(path).map_err(crate::server::ServeError::from)?),
        None => None,
    };
    if args.print_config {
        print!("{}", settings.to_toml());
        if let Some(policies) = &policies {
            print!("{}", crate::policy::file::to_toml(policies));
        }
        return Ok(());
    }
    let grace = settings.shutdown_grace;
    let wanted = settings.serve.limits.connections.max_connections + crate::admin::ADMIN_LIMITS.max_connections;
    crate::listener::raise_open_files_limit(wanted);
    let server = Server::start(settings.serve).await?;
    // The first line of output is the bound address, for scripts and test harnesses; the second
    // the admin address. One write, so a reader that stops after the first line cannot make
    // the second fail.
    let mut lines = format!("listening on {}\n", server.local_addr());
    if let Some(admin) = server.admin_addr() {
        lines.push_str(&format!("admin on {admin}\n"));
    }
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(lines.as_bytes())?;
    stdout.flush()?;
    drop(stdout);
    server.run_until(shutdown_signal, grace).await?;
    Ok(())
}
