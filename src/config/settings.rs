//! Every `[server]` setting, declared once: its name (the file's key under `[server]`, and
//! `--name-with-dashes` as a flag), its kind, its environment variable and its help text.
//! From this list follow the flags and variables of `rota serve` ([`Overrides`], through clap),
//! the file's `[server]` table (`ServerTable`, unknown keys refused), and [`SETTINGS`], which a
//! test holds `docs/config.md`'s table and `--print-config` against. What a setting means — its
//! parsing, range and default — is [`super::resolve`]'s.
//!
//! Adding a setting: a line here, its resolution in `resolve` (and its place in
//! [`crate::server::ServeConfig`]), its line in `Settings::to_toml`, and its row in
//! `docs/config.md`; the tests fail until the last two are there.

use serde::Deserialize;

/// One setting's names, for the documentation check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// The key under `[server]`; the flag is the same with dashes.
    pub key: &'static str,
    pub env: &'static str,
}

impl Setting {
    pub fn flag(&self) -> String {
        format!("--{}", self.key.replace('_', "-"))
    }
}

/// The value the file's table holds, by kind (a flag or variable holds text, parsed in
/// `resolve` so that every error names its key).
macro_rules! file_type {
    (text) => { Option<String> };
    (integer) => { Option<u64> };
}

/// `values`: settings that take a value (`--name VALUE`); `switches`: settings that are on
/// when given (`--name`, or `true` in the file).
macro_rules! settings {
    (
        values { $( $(#[doc = $doc:literal])* $name:ident : $kind:ident, $env:literal; )* }
        switches { $( $(#[doc = $sdoc:literal])* $switch:ident, $senv:literal; )* }
    ) => {
        /// The settings given on the command line or in the environment (clap merges those
        /// two; a flag wins over its variable), each overriding the file's value.
        #[derive(Debug, Clone, Default, clap::Args)]
        pub struct Overrides {
            $(
                $(#[doc = $doc])*
                #[arg(long, env = $env)]
                pub $name: Option<String>,
            )*
            $(
                $(#[doc = $sdoc])*
                #[arg(long, env = $senv)]
                pub $switch: bool,
            )*
        }

        /// The file's `[server]` table.
        #[derive(Debug, Default, Deserialize)]
        #[serde(default, deny_unknown_fields)]
        pub(super) struct ServerTable {
            $( pub $name: file_type!($kind), )*
            $( pub $switch: Option<bool>, )*
        }

        /// Every setting, in declaration order.
        pub const SETTINGS: &[Setting] = &[
            $( Setting { key: stringify!($name), env: $env }, )*
            $( Setting { key: stringify!($switch), env: $senv }, )*
        ];
    };
}

settings! {
values {
    /// gRPC listen address [default: 127.0.0.1:50051]; port 0 picks a free port. The bound
    /// address is printed first.
    listen: text, "ROTA_LISTEN";
    /// Admin HTTP listen address (metrics, health, JSON API, dashboard), or `off`
    /// [default: 127.0.0.1:9090]; port 0 picks a free port. The bound address is printed second.
    admin_listen: text, "ROTA_ADMIN_LISTEN";
    /// Drop a registration stream's instances after this long without a message [default: 15s].
    heartbeat_timeout: text, "ROTA_HEARTBEAT_TIMEOUT";
    /// After start, answer picks of a service not seen yet with UNAVAILABLE `warming_up`
    /// instead of NOT_FOUND for this long; 0s for none [default: the heartbeat timeout].
    warmup: text, "ROTA_WARMUP";
    /// During the warm-up, hold a seen service back from leases until none of its instances
    /// has come UP for this long, so the first provider back does not take every channel's
    /// calls; 0s serves it at once [default: a fifth of the warm-up, at most 3s].
    warmup_settle: text, "ROTA_WARMUP_SETTLE";
    /// On SIGTERM/SIGINT: answer picks this long while registrations move away, then exit
    /// [default: 10s].
    shutdown_grace: text, "ROTA_SHUTDOWN_GRACE";
    /// Most instances one registration stream may hold [default: 1000].
    max_instances_per_stream: integer, "ROTA_MAX_INSTANCES_PER_STREAM";
    /// A pick not reported within this time stops counting as in flight [default: 30s].
    in_flight_timeout: text, "ROTA_IN_FLIGHT_TIMEOUT";
    /// Time constant of the latency EWMA [default: 10s].
    latency_decay: text, "ROTA_LATENCY_DECAY";
    /// Open registration streams per client address [default: 64].
    max_registrations_per_peer: integer, "ROTA_MAX_REGISTRATIONS_PER_PEER";
    /// Open Watch and PickStream streams per client address [default: 2048].
    max_consumer_streams_per_peer: integer, "ROTA_MAX_CONSUMER_STREAMS_PER_PEER";
    /// Resource names one xDS stream may subscribe to, per type [default: 1000].
    max_xds_names_per_stream: integer, "ROTA_MAX_XDS_NAMES_PER_STREAM";
    /// Services subscribed to over xDS, summed over every stream [default: 100000].
    max_xds_subscriptions: integer, "ROTA_MAX_XDS_SUBSCRIPTIONS";
    /// Bytes xDS streams hold for their clients (names, what was sent), summed over every
    /// stream; one client address may hold a quarter [default: 268435456].
    max_xds_bytes: integer, "ROTA_MAX_XDS_BYTES";
    /// Resident memory rota may reach: from 90 % of it Watch and xDS streams are refused,
    /// from 98 % open ones end; 0 is no limit [default: 0].
    max_rss_bytes: integer, "ROTA_MAX_RSS_BYTES";
    /// Largest request message, in bytes [default: 4194304].
    max_message_bytes: integer, "ROTA_MAX_MESSAGE_BYTES";
    /// Requests in progress per connection; more are shed with RESOURCE_EXHAUSTED [default: 1024].
    max_concurrent_requests_per_connection: integer, "ROTA_MAX_CONCURRENT_REQUESTS_PER_CONNECTION";
    /// HTTP/2 streams per connection [default: 1024].
    max_streams_per_connection: integer, "ROTA_MAX_STREAMS_PER_CONNECTION";
    /// gRPC connections open at once; more are closed as they arrive [default: 10000].
    max_connections: integer, "ROTA_MAX_CONNECTIONS";
    /// gRPC connections open at once from one client address [default: 256].
    max_connections_per_peer: integer, "ROTA_MAX_CONNECTIONS_PER_PEER";
    /// Time a new connection has to finish its TLS handshake or send the HTTP/2 preface [default: 10s].
    handshake_timeout: text, "ROTA_HANDSHAKE_TIMEOUT";
    /// A connection that sends nothing for this long is closed [default: 5m].
    idle_timeout: text, "ROTA_IDLE_TIMEOUT";
    /// Register, Watch and PickStream streams open at once; more are refused with
    /// RESOURCE_EXHAUSTED [default: 10000].
    max_open_streams: integer, "ROTA_MAX_OPEN_STREAMS";
    /// Bytes of answers (listings, leases, watch events) that clients have not read yet, in
    /// total; past it, answers wait for room [default: 268435456].
    max_unread_bytes: integer, "ROTA_MAX_UNREAD_BYTES";
    /// The same per client IP address, at most max_unread_bytes [default: 33554432].
    max_unread_bytes_per_peer: integer, "ROTA_MAX_UNREAD_BYTES_PER_PEER";
    /// Memory budget of sticky assignments, in bytes [default: 134217728].
    sticky_memory_bytes: integer, "ROTA_STICKY_MEMORY_BYTES";
    /// Where rule state lives: `memory` (this process) or a Redis shared by several replicas,
    /// `redis://HOST:PORT[/DB]`, `redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB]` or
    /// `redis+cluster://HOST:PORT[,HOST:PORT...]`
    /// [default: memory].
    state: text, "ROTA_STATE";
    /// With a Redis state: spare tickets a replica reserves per Redis call (1 keeps every
    /// rotation exact per pick; more trades interleaving for fewer Redis calls) [default: 1].
    ticket_block: integer, "ROTA_TICKET_BLOCK";
    /// With a Redis state: the longest wait for one Redis command before the replica counts
    /// Redis as unreachable and answers from local state [default: 500ms].
    state_timeout: text, "ROTA_STATE_TIMEOUT";
    /// With a Redis state: the longest a change of another replica's instances may take to
    /// reach this replica before /readyz reports the replicas diverged [default: 1s].
    replica_lag_limit: text, "ROTA_REPLICA_LAG_LIMIT";
    /// Time between housekeeping rounds (departed instances' statistics, expired sticky
    /// assignments, idle counters, forgotten services) [default: 30s].
    housekeeping_interval: text, "ROTA_HOUSEKEEPING_INTERVAL";
    /// A service with no instance and no watcher is forgotten after this long [default: 10m].
    service_idle_timeout: text, "ROTA_SERVICE_IDLE_TIMEOUT";
    /// Registration changes arriving within this long of each other are published together,
    /// and acknowledged once picks see them; 0s publishes each batch at once, at most 1s
    /// [default: 5ms].
    publish_window: text, "ROTA_PUBLISH_WINDOW";
    /// Services known at once; announcing into one more is refused [default: 100000].
    max_services: integer, "ROTA_MAX_SERVICES";
    /// Services one token's registration streams may hold instances in at once [default: 1000].
    max_services_per_token: integer, "ROTA_MAX_SERVICES_PER_TOKEN";
    /// Networks active health checks may connect to, as CIDRs separated by commas; `!CIDR`
    /// refuses one, the longest match deciding (`10.0.0.0/8, !10.0.5.0/24`). rota's own
    /// listeners are never checked [default: every address but link-local ones, and but
    /// loopback unless every listener is on loopback].
    health_check_networks: text, "ROTA_HEALTH_CHECK_NETWORKS";
    /// Serve TLS with this PEM certificate chain (needs --tls-key); reloaded when it changes.
    tls_cert: text, "ROTA_TLS_CERT";
    /// PEM private key of the TLS certificate (needs --tls-cert).
    tls_key: text, "ROTA_TLS_KEY";
    /// PEM CA bundle: clients must present a certificate signed by it (mTLS).
    tls_client_ca: text, "ROTA_TLS_CLIENT_CA";
}
switches {
    /// Serve on a non-loopback address although no authentication is configured.
    insecure, "ROTA_INSECURE";
}
}
