//! The server's settings: one model, filled from the config file, then the environment, then
//! command-line flags (each overriding the one before), validated as a whole before any port is
//! bound.
//!
//! The file's `[server]` table holds the settings below; its `[defaults]` and `[services.*]`
//! tables hold policies (see [`crate::policy::file`]). Server settings are read at start;
//! policies also reload while rota runs. Every key, its variable and its default are listed in
//! `docs/config.md`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use std::sync::Arc;

use serde::Deserialize;

use crate::auth::{Authenticator, Principal, Scope};

use crate::listener::ConnectionLimits;
use crate::load::StatsConfig;
use crate::registry::{
    DEFAULT_HEARTBEAT_TIMEOUT, DEFAULT_MAX_INSTANCES_PER_STREAM, DEFAULT_MAX_SERVICES, DEFAULT_MAX_SERVICES_PER_TOKEN,
    DEFAULT_SERVICE_IDLE_TIMEOUT, RegistryConfig,
};
use crate::server::{
    DEFAULT_ADMIN_LISTEN, DEFAULT_HOUSEKEEPING_INTERVAL, DEFAULT_LISTEN, DEFAULT_SHUTDOWN_GRACE, Limits, ServeConfig,
};
use crate::state::redis::MAX_TICKET_BLOCK;
use crate::state::{DEFAULT_STICKY_MEMORY_BYTES, StateConfig};
use crate::tls::TlsFiles;

mod settings;
use settings::ServerTable;
pub use settings::{Overrides, SETTINGS, Setting};

/// Everything `rota serve` needs, resolved.
#[derive(Debug, Clone)]
pub struct Settings {
    pub serve: ServeConfig,
    /// Serving a non-loopback address without authentication was allowed explicitly.
    pub insecure: bool,
    pub shutdown_grace: Duration,
}

/// A setting that is missing, malformed or out of range; `key` is its name in the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{source_name}: {key}: {problem}")]
pub struct ConfigError {
    /// Where the bad value came from: the file's path, or "command line / environment".
    pub source_name: String,
    pub key: String,
    pub problem: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default)]
    server: ServerTable,
    #[serde(default)]
    auth: AuthTable,
    // Policies: accepted here, parsed and validated by `policy::file`.
    #[serde(default, rename = "defaults")]
    _defaults: Option<toml::Value>,
    #[serde(default, rename = "services")]
    _services: Option<toml::Value>,
    /// Registries rota follows (`crate::sources`).
    #[serde(default, rename = "source")]
    sources: Vec<crate::sources::spec::SourceTable>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct AuthTable {
    #[serde(default)]
    tokens: Vec<TokenEntry>,
}

/// One token: its secret comes from a file or an environment variable, never the config itself.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    name: String,
    token_file: Option<PathBuf>,
    token_env: Option<String>,
    scopes: Vec<String>,
}

/// Shortest accepted token, so a guessable one is refused at start.
pub const MIN_TOKEN_LEN: usize = 16;

const FLAGS: &str = "command line / environment";

/// The smallest `server.max_rss_bytes` other than 0: below it rota would refuse streams as it
/// starts.
pub const MIN_RSS_LIMIT: u64 = 16 << 20;

/// Resolves the settings from an optional config file and the overrides.
pub fn resolve(file: Option<&Path>, overrides: &Overrides) -> Result<Settings, ConfigError> {
    let (file_config, file_name) = match file {
        Some(path) => (read_file(path)?, path.display().to_string()),
        None => (FileConfig::default(), String::new()),
    };
    let auth = resolve_auth(&file_config.auth, &file_name)?;
    let sources = crate::sources::spec::check_all(file_config.sources).map_err(|(i, e)| ConfigError {
        source_name: file_name.clone(),
        key: format!("source[{i}].{}", e.key),
        problem: e.problem,
    })?;
    let table = file_config.server;
    // Each setting: the override if given, else the file's value, else the default.
    let pick = |over: &Option<String>, from_file: Option<String>| -> Option<(String, String)> {
        over.clone().map(|v| (v, FLAGS.to_owned())).or_else(|| from_file.map(|v| (v, file_name.clone())))
    };
    let listen = match pick(&overrides.listen, table.listen.clone()) {
        Some((value, source)) => value.parse::<SocketAddr>().map_err(|_| ConfigError {
            source_name: source,
            key: "server.listen".into(),
            problem: format!("{value:?} is not an address like 127.0.0.1:50051"),
        })?,
        None => DEFAULT_LISTEN.parse().expect("the default listen address is valid"),
    };
    let admin_listen = match pick(&overrides.admin_listen, table.admin_listen.clone()) {
        Some((value, _)) if value == "off" => None,
        Some((value, source)) => Some(value.parse::<SocketAddr>().map_err(|_| ConfigError {
            source_name: source,
            key: "server.admin_listen".into(),
            problem: format!("{value:?} is neither an address like 127.0.0.1:9090 nor \"off\""),
        })?),
        None => Some(DEFAULT_ADMIN_LISTEN.parse().expect("the default admin address is valid")),
    };
    let duration = |key: &'static str, over: &Option<String>, from_file: &Option<String>, default: Duration| match pick(
        over,
        from_file.clone(),
    ) {
        None => Ok(default),
        Some((value, source)) => match crate::duration::parse(&value) {
            Ok(d) if !d.is_zero() => Ok(d),
            Ok(_) => {
                Err(ConfigError { source_name: source, key: key.into(), problem: "must be longer than zero".into() })
            }
            Err(e) => Err(ConfigError {
                source_name: source,
                key: key.into(),
                problem: format!("{value:?} is not a duration ({e}); try 15s or 500ms"),
            }),
        },
    };
    let heartbeat_timeout = duration(
        "server.heartbeat_timeout",
        &overrides.heartbeat_timeout,
        &table.heartbeat_timeout,
        DEFAULT_HEARTBEAT_TIMEOUT,
    )?;
    // Zero is allowed here: no warm-up at all.
    let warmup = match pick(&overrides.warmup, table.warmup.clone()) {
        None => heartbeat_timeout,
        Some((value, source)) => crate::duration::parse(&value).map_err(|e| ConfigError {
            source_name: source,
            key: "server.warmup".into(),
            problem: format!("{value:?} is not a duration ({e}); try 15s, 500ms or 0s"),
        })?,
    };
    // Zero is allowed: a seen service is served at once.
    let warmup_settle = match pick(&overrides.warmup_settle, table.warmup_settle.clone()) {
        None => crate::grpc::warmup::default_settle(warmup),
        Some((value, source)) => crate::duration::parse(&value).map_err(|e| ConfigError {
            source_name: source,
            key: "server.warmup_settle".into(),
            problem: format!("{value:?} is not a duration ({e}); try 3s, 500ms or 0s"),
        })?,
    };
    // Zero is allowed: every batch of changes published at once.
    let publish_window = match pick(&overrides.publish_window, table.publish_window.clone()) {
        None => crate::registry::DEFAULT_PUBLISH_WINDOW,
        Some((value, source)) => crate::duration::parse(&value)
            .map_err(|e| format!("{value:?} is not a duration ({e}); try 5ms or 0s"))
            .and_then(|window| match window <= crate::registry::MAX_PUBLISH_WINDOW {
                true => Ok(window),
                false => Err(format!("{value:?} is longer than 1s")),
            })
            .map_err(|problem| ConfigError { source_name: source, key: "server.publish_window".into(), problem })?,
    };
    let shutdown_grace =
        duration("server.shutdown_grace", &overrides.shutdown_grace, &table.shutdown_grace, DEFAULT_SHUTDOWN_GRACE)?;
    let stats_defaults = StatsConfig::default();
    let in_flight_timeout = duration(
        "server.in_flight_timeout",
        &overrides.in_flight_timeout,
        &table.in_flight_timeout,
        stats_defaults.in_flight_timeout,
    )?;
    let latency_decay =
        duration("server.latency_decay", &overrides.latency_decay, &table.latency_decay, stats_defaults.latency_decay)?;
    let integer = |key: &'static str,
                   over: &Option<String>,
                   from_file: Option<u64>,
                   range: std::ops::RangeInclusive<u64>,
                   default: u64| {
        match pick(over, from_file.map(|n| n.to_string())) {
            None => Ok(default),
            Some((value, source)) => match value.parse::<u64>() {
                Ok(n) if range.contains(&n) => Ok(n),
                _ => Err(ConfigError {
                    source_name: source,
                    key: key.into(),
                    problem: format!("must be an integer from {} to {}, got {value:?}", range.start(), range.end()),
                }),
            },
        }
    };
    let defaults = Limits::default();
    let limits = Limits {
        registrations_per_peer: integer(
            "server.max_registrations_per_peer",
            &overrides.max_registrations_per_peer,
            table.max_registrations_per_peer,
            1..=100_000,
            defaults.registrations_per_peer as u64,
        )? as usize,
        consumer_streams_per_peer: integer(
            "server.max_consumer_streams_per_peer",
            &overrides.max_consumer_streams_per_peer,
            table.max_consumer_streams_per_peer,
            1..=1_000_000,
            defaults.consumer_streams_per_peer as u64,
        )? as usize,
        xds: crate::xds::XdsLimits {
            max_names_per_stream: integer(
                "server.max_xds_names_per_stream",
                &overrides.max_xds_names_per_stream,
                table.max_xds_names_per_stream,
                1..=100_000,
                defaults.xds.max_names_per_stream as u64,
            )? as usize,
            max_subscriptions: integer(
                "server.max_xds_subscriptions",
                &overrides.max_xds_subscriptions,
                table.max_xds_subscriptions,
                1..=10_000_000,
                defaults.xds.max_subscriptions as u64,
            )? as usize,
            max_bytes: integer(
                "server.max_xds_bytes",
                &overrides.max_xds_bytes,
                table.max_xds_bytes,
                (1 << 20)..=(64 << 30),
                defaults.xds.max_bytes as u64,
            )? as usize,
        },
        max_rss_bytes: match integer(
            "server.max_rss_bytes",
            &overrides.max_rss_bytes,
            table.max_rss_bytes,
            0..=(1 << 40),
            defaults.max_rss_bytes,
        )? {
            bytes @ 1..MIN_RSS_LIMIT => {
                return Err(ConfigError {
                    source_name: pick(&overrides.max_rss_bytes, table.max_rss_bytes.map(|n| n.to_string()))
                        .map_or_else(String::new, |(_, source)| source),
                    key: "server.max_rss_bytes".into(),
                    problem: format!("must be 0 (no limit) or at least {MIN_RSS_LIMIT} bytes, got {bytes}"),
                });
            }
            bytes => bytes,
        },
        max_message_bytes: integer(
            "server.max_message_bytes",
            &overrides.max_message_bytes,
            table.max_message_bytes,
            1024..=(64 << 20),
            defaults.max_message_bytes as u64,
        )? as usize,
        concurrent_requests_per_connection: integer(
            "server.max_concurrent_requests_per_connection",
            &overrides.max_concurrent_requests_per_connection,
            table.max_concurrent_requests_per_connection,
            1..=1_000_000,
            defaults.concurrent_requests_per_connection as u64,
        )? as usize,
        streams_per_connection: integer(
            "server.max_streams_per_connection",
            &overrides.max_streams_per_connection,
            table.max_streams_per_connection,
            1..=1_000_000,
            u64::from(defaults.streams_per_connection),
        )? as u32,
        max_open_streams: integer(
            "server.max_open_streams",
            &overrides.max_open_streams,
            table.max_open_streams,
            1..=10_000_000,
            defaults.max_open_streams as u64,
        )? as usize,
        max_unread_bytes: integer(
            "server.max_unread_bytes",
            &overrides.max_unread_bytes,
            table.max_unread_bytes,
            (64 << 10)..=(1 << 40),
            defaults.max_unread_bytes as u64,
        )? as usize,
        max_unread_bytes_per_peer: integer(
            "server.max_unread_bytes_per_peer",
            &overrides.max_unread_bytes_per_peer,
            table.max_unread_bytes_per_peer,
            (64 << 10)..=(4 << 30) - 1,
            defaults.max_unread_bytes_per_peer as u64,
        )? as usize,
        connections: ConnectionLimits {
            max_connections: integer(
                "server.max_connections",
                &overrides.max_connections,
                table.max_connections,
                1..=10_000_000,
                defaults.connections.max_connections as u64,
            )? as usize,
            max_connections_per_peer: integer(
                "server.max_connections_per_peer",
                &overrides.max_connections_per_peer,
                table.max_connections_per_peer,
                1..=10_000_000,
                defaults.connections.max_connections_per_peer as u64,
            )? as usize,
            handshake_timeout: duration(
                "server.handshake_timeout",
                &overrides.handshake_timeout,
                &table.handshake_timeout,
                defaults.connections.handshake_timeout,
            )?,
            idle_timeout: duration(
                "server.idle_timeout",
                &overrides.idle_timeout,
                &table.idle_timeout,
                defaults.connections.idle_timeout,
            )?,
            // The gRPC listener has no probe reserve: its health probe is gRPC health, on a
            // connection a client already holds; the admin listener's probes have one.
            probe_reserve: 0,
        },
    };
    if limits.max_unread_bytes_per_peer > limits.max_unread_bytes {
        let source = pick(&overrides.max_unread_bytes_per_peer, table.max_unread_bytes_per_peer.map(|n| n.to_string()))
            .map_or_else(|| FLAGS.to_owned(), |(_, source)| source);
        return Err(ConfigError {
            source_name: source,
            key: "server.max_unread_bytes_per_peer".into(),
            problem: format!(
                "is {}, more than server.max_unread_bytes ({}); one client address cannot hold more than the whole server",
                limits.max_unread_bytes_per_peer, limits.max_unread_bytes
            ),
        });
    }
    let sticky_memory_bytes = integer(
        "server.sticky_memory_bytes",
        &overrides.sticky_memory_bytes,
        table.sticky_memory_bytes,
        (64 << 10)..=(1 << 40),
        DEFAULT_STICKY_MEMORY_BYTES as u64,
    )? as usize;
    let ticket_block = integer(
        "server.ticket_block",
        &overrides.ticket_block,
        table.ticket_block,
        1..=u64::from(MAX_TICKET_BLOCK),
        1,
    )? as u32;
    let state_timeout = duration(
        "server.state_timeout",
        &overrides.state_timeout,
        &table.state_timeout,
        crate::state::redis::COMMAND_TIMEOUT,
    )?;
    let replica_lag_limit = duration(
        "server.replica_lag_limit",
        &overrides.replica_lag_limit,
        &table.replica_lag_limit,
        crate::replicas::lag::DEFAULT_LAG_LIMIT,
    )?;
    let mut state = match pick(&overrides.state, table.state.clone()) {
        None => StateConfig::Memory,
        Some((value, source)) => StateConfig::parse(&value, ticket_block, state_timeout)
            .map_err(|problem| ConfigError { source_name: source, key: "server.state".into(), problem })?,
    };
    if let StateConfig::Redis(redis) = &mut state {
        redis.lag_limit = replica_lag_limit;
    }
    let housekeeping_interval = duration(
        "server.housekeeping_interval",
        &overrides.housekeeping_interval,
        &table.housekeeping_interval,
        DEFAULT_HOUSEKEEPING_INTERVAL,
    )?;
    let max_instances_per_stream =
        match pick(&overrides.max_instances_per_stream, table.max_instances_per_stream.map(|n| n.to_string())) {
            None => DEFAULT_MAX_INSTANCES_PER_STREAM,
            Some((value, source)) => match value.parse::<usize>() {
                Ok(n) if (1..=100_000).contains(&n) => n,
                _ => {
                    return Err(ConfigError {
                        source_name: source,
                        key: "server.max_instances_per_stream".into(),
                        problem: format!("must be an integer from 1 to 100000, got {value:?}"),
                    });
                }
            },
        };
    let health_check_networks = match pick(&overrides.health_check_networks, table.health_check_networks.clone()) {
        None => None,
        Some((value, source)) => Some(crate::health::reach::Networks::parse(&value).map_err(|problem| {
            ConfigError { source_name: source, key: "server.health_check_networks".into(), problem }
        })?),
    };
    let tls = resolve_tls(
        pick(&overrides.tls_cert, table.tls_cert.clone()),
        pick(&overrides.tls_key, table.tls_key.clone()),
        pick(&overrides.tls_client_ca, table.tls_client_ca.clone()),
    )?;
    // Without authentication, rota is only reachable from this machine unless told otherwise.
    let insecure = overrides.insecure || table.insecure.unwrap_or(false);
    if !insecure && auth.is_none() {
        let exposed = [("server.listen", Some(listen)), ("server.admin_listen", admin_listen)];
        if let Some((key, Some(addr))) =
            exposed.into_iter().find(|(_, addr)| addr.is_some_and(|a| !a.ip().is_loopback()))
        {
            let source = if overrides.listen.is_some() || overrides.admin_listen.is_some() {
                FLAGS.to_owned()
            } else {
                file_name
            };
            return Err(ConfigError {
                source_name: source,
                key: key.into(),
                problem: format!(
                    "{addr} is not a loopback address and no authentication is configured; \
                     give --insecure (ROTA_INSECURE=true, or insecure = true in [server]) to serve it anyway"
                ),
            });
        }
    }
    Ok(Settings {
        insecure,
        serve: ServeConfig {
            listen,
            admin_listen,
            registry: RegistryConfig {
                heartbeat_timeout,
                max_instances_per_stream,
                service_idle_timeout: duration(
                    "server.service_idle_timeout",
                    &overrides.service_idle_timeout,
                    &table.service_idle_timeout,
                    DEFAULT_SERVICE_IDLE_TIMEOUT,
                )?,
                max_services: integer(
                    "server.max_services",
                    &overrides.max_services,
                    table.max_services,
                    1..=100_000_000,
                    DEFAULT_MAX_SERVICES as u64,
                )? as usize,
                max_services_per_token: integer(
                    "server.max_services_per_token",
                    &overrides.max_services_per_token,
                    table.max_services_per_token,
                    1..=100_000_000,
                    DEFAULT_MAX_SERVICES_PER_TOKEN as u64,
                )? as usize,
                publish_window,
            },
            stats: StatsConfig { in_flight_timeout, latency_decay, ..stats_defaults },
            policy_file: file.map(Path::to_path_buf),
            limits,
            housekeeping_interval,
            sticky_memory_bytes,
            state,
            tls,
            auth,
            warmup: Some(warmup),
            warmup_settle: Some(warmup_settle),
            sources,
            health_check_networks,
            resident_set: Default::default(),
        },
        shutdown_grace,
    })
}

/// Certificate and key come together; the client CA needs them. Every file is read and parsed
/// here, so a bad one stops rota before binding rather than at the first handshake.
fn resolve_tls(
    cert: Option<(String, String)>,
    key: Option<(String, String)>,
    client_ca: Option<(String, String)>,
) -> Result<Option<TlsFiles>, ConfigError> {
    let missing = |source: &str, key: &str, problem: &str| ConfigError {
        source_name: source.to_owned(),
        key: key.into(),
        problem: problem.into(),
    };
    let ((cert, cert_source), (key, key_source)) = match (cert, key, client_ca.clone()) {
        (None, None, None) => return Ok(None),
        (Some(cert), Some(key), _) => (cert, key),
        (Some((_, source)), None, _) => {
            return Err(missing(&source, "server.tls_key", "is required when server.tls_cert is set"));
        }
        (None, Some((_, source)), _) => {
            return Err(missing(&source, "server.tls_cert", "is required when server.tls_key is set"));
        }
        (None, None, Some((_, source))) => {
            return Err(missing(&source, "server.tls_cert", "is required when server.tls_client_ca is set"));
        }
    };
    let files = TlsFiles { cert: cert.into(), key: key.into(), client_ca: None };
    crate::tls::load_certified_key(&files.cert, &files.key).map_err(|e| {
        let source = if e.key == "server.tls_cert" { cert_source.clone() } else { key_source.clone() };
        ConfigError { source_name: source, key: e.key.into(), problem: e.to_string() }
    })?;
    let client_ca = match client_ca {
        Some((path, source)) => {
            let path = PathBuf::from(path);
            crate::tls::load_client_roots(&path).map_err(|e| ConfigError {
                source_name: source,
                key: e.key.into(),
                problem: e.to_string(),
            })?;
            Some(path)
        }
        None => None,
    };
    Ok(Some(TlsFiles { client_ca, ..files }))
}

fn read_file(path: &Path) -> Result<FileConfig, ConfigError> {
    let error =
        |key: &str, problem: String| ConfigError { source_name: path.display().to_string(), key: key.into(), problem };
    let text = files::read_to_string(path).map_err(|e| error("file", format!("cannot read: {e}")))?;
    toml::from_str(&text).map_err(|e| error("file", e.to_string().trim_end().to_owned()))
}

/// Reads every token's secret and parses its scopes; `None` when no token is configured.
fn resolve_auth(table: &AuthTable, source: &str) -> Result<Option<Arc<Authenticator>>, ConfigError> {
    let mut tokens = Vec::new();
    for (i, entry) in table.tokens.iter().enumerate() {
        let key = format!("auth.tokens[{i}]");
        let error = |field: &str, problem: String| ConfigError {
            source_name: source.to_owned(),
            key: format!("{key}.{field}"),
            problem,
        };
        let secret = match (&entry.token_file, &entry.token_env) {
            (Some(file), None) => files::read_to_string(file)
                .map_err(|e| error("token_file", format!("cannot read {}: {e}", file.display())))?,
            (None, Some(var)) => std::env::var(var).map_err(|_| error("token_env", format!("{var} is not set")))?,
            _ => return Err(error("token_file", "give exactly one of token_file and token_env".into())),
        };
        let secret = secret.trim().to_owned();
        if secret.len() < MIN_TOKEN_LEN {
            return Err(error("token", format!("is {} characters long; the minimum is {MIN_TOKEN_LEN}", secret.len())));
        }
        let scopes = entry
            .scopes
            .iter()
            .map(|s| Scope::parse(s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| error("scopes", e))?;
        if scopes.is_empty() {
            return Err(error("scopes", "must grant at least one scope".into()));
        }
        tokens.push((secret, Principal { name: entry.name.clone(), scopes }));
    }
    Ok((!tokens.is_empty()).then(|| Arc::new(Authenticator::new(tokens))))
}

impl Settings {
    /// The effective settings as the `[server]` table of a config file.
    pub fn to_toml(&self) -> String {
        let d = crate::duration::format;
        let mut toml = format!(
            "[server]\nlisten = \"{}\"\nadmin_listen = \"{}\"\nheartbeat_timeout = \"{}\"\nwarmup = \"{}\"\nwarmup_settle = \"{}\"\nmax_instances_per_stream = {}\nshutdown_grace = \"{}\"\nin_flight_timeout = \"{}\"\nlatency_decay = \"{}\"\ninsecure = {}\nmax_registrations_per_peer = {}\nmax_consumer_streams_per_peer = {}\nmax_xds_names_per_stream = {}\nmax_xds_subscriptions = {}\nmax_xds_bytes = {}\nmax_message_bytes = {}\nmax_concurrent_requests_per_connection = {}\nmax_streams_per_connection = {}\nmax_open_streams = {}\nmax_unread_bytes = {}\nmax_unread_bytes_per_peer = {}\nmax_connections = {}\nmax_connections_per_peer = {}\nhandshake_timeout = \"{}\"\nidle_timeout = \"{}\"\nsticky_memory_bytes = {}\nstate = {}\nticket_block = {}\nstate_timeout = \"{}\"\nreplica_lag_limit = \"{}\"\nhousekeeping_interval = \"{}\"\nservice_idle_timeout = \"{}\"\nmax_services = {}\nmax_services_per_token = {}\npublish_window = \"{}\"\nhealth_check_networks = {}\n",
            self.serve.listen,
            self.serve.admin_listen.map_or_else(|| "off".to_owned(), |a| a.to_string()),
            d(self.serve.registry.heartbeat_timeout),
            d(self.serve.warmup.unwrap_or(self.serve.registry.heartbeat_timeout)),
            d(self.serve.warmup_settle.unwrap_or_default()),
            self.serve.registry.max_instances_per_stream,
            d(self.shutdown_grace),
            d(self.serve.stats.in_flight_timeout),
            d(self.serve.stats.latency_decay),
            self.insecure,
            self.serve.limits.registrations_per_peer,
            self.serve.limits.consumer_streams_per_peer,
            self.serve.limits.xds.max_names_per_stream,
            self.serve.limits.xds.max_subscriptions,
            self.serve.limits.xds.max_bytes,
            self.serve.limits.max_message_bytes,
            self.serve.limits.concurrent_requests_per_connection,
            self.serve.limits.streams_per_connection,
            self.serve.limits.max_open_streams,
            self.serve.limits.max_unread_bytes,
            self.serve.limits.max_unread_bytes_per_peer,
            self.serve.limits.connections.max_connections,
            self.serve.limits.connections.max_connections_per_peer,
            d(self.serve.limits.connections.handshake_timeout),
            d(self.serve.limits.connections.idle_timeout),
            self.serve.sticky_memory_bytes,
            crate::policy::file::toml_string(&self.serve.state.to_url()),
            self.serve.state.ticket_block(),
            d(self.serve.state.timeout()),
            d(self.serve.state.lag_limit()),
            d(self.serve.housekeeping_interval),
            d(self.serve.registry.service_idle_timeout),
            self.serve.registry.max_services,
            self.serve.registry.max_services_per_token,
            d(self.serve.registry.publish_window),
            crate::policy::file::toml_string(&self.serve.health_check_networks().to_string()),
        );
        toml.push_str(&format!("max_rss_bytes = {}\n", self.serve.limits.max_rss_bytes));
        if let Some(tls) = &self.serve.tls {
            let path = |p: &Path| crate::policy::file::toml_string(&p.display().to_string());
            toml.push_str(&format!("tls_cert = {}\ntls_key = {}\n", path(&tls.cert), path(&tls.key)));
            if let Some(ca) = &tls.client_ca {
                toml.push_str(&format!("tls_client_ca = {}\n", path(ca)));
            }
        }
        for source in &self.serve.sources {
            toml.push('\n');
            toml.push_str(&source.to_toml());
        }
        toml
    }

    /// Adds the sources given as `--source URL` flags after the file's; a name both use is
    /// refused.
    pub fn add_source_flags(&mut self, flags: &[String]) -> Result<(), ConfigError> {
        let first = self.serve.sources.len();
        let mut tables = Vec::with_capacity(flags.len());
        for (i, flag) in flags.iter().enumerate() {
            let table = crate::sources::spec::SourceTable::from_flag(flag).map_err(|e| ConfigError {
                source_name: FLAGS.into(),
                key: format!("--source[{i}] {}", e.key),
                problem: e.problem,
            })?;
            tables.push(table);
        }
        let added = crate::sources::spec::check_all(tables).map_err(|(i, e)| ConfigError {
            source_name: FLAGS.into(),
            key: format!("--source[{i}] {}", e.key),
            problem: e.problem,
        })?;
        for spec in added {
            if let Some(i) = self.serve.sources.iter().position(|s| s.name == spec.name) {
                return Err(ConfigError {
                    source_name: FLAGS.into(),
                    key: format!("--source[{}] name", self.serve.sources.len() - first),
                    problem: format!("is {:?}, as source[{i}]'s is; give one a `name`", spec.name),
                });
            }
            self.serve.sources.push(spec);
        }
        Ok(())
    }

    pub fn policy_file(&self) -> Option<&PathBuf> {
        self.serve.policy_file.as_ref()
    }
}

#[cfg(test)]
mod tests;

pub mod files;
