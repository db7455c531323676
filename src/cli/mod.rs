//! The `rota` command line: a server (`serve`), client commands against a running server
//! (`pick`, `register`, `ls`, `watch`, `policy`) and a self-contained `demo`.

mod bench;
mod bench_backends;
mod bench_health;
mod bench_publish;
mod bench_replica_lag;
mod bench_sources;
mod bench_xds;
mod demo;
mod instance;
mod pick;
mod policy;
pub(crate) mod redis_process;
mod register;
mod serve;
mod show;
mod soak;

use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::client::{ClientError, RotaClient, TlsOptions};
use crate::server::ServeError;

#[derive(Debug, Parser)]
#[command(name = "rota", version, about = "A central load-balancing decision service")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the rota server.
    Serve(Box<serve::ServeArgs>),
    /// Pick instances of a service.
    Pick(pick::PickArgs),
    /// Register one instance and keep it registered until Ctrl-C, then withdraw it.
    Register(register::RegisterArgs),
    /// List services, or the instances of one service.
    Ls(LsArgs),
    /// Print a service's instances, then every change to them.
    Watch(WatchArgs),
    /// Show the policies in force; set or reset (drop) a service's runtime override.
    Policy(policy::PolicyArgs),
    /// Drain, disable, enable or re-weight one instance over what its provider says.
    Instance(instance::InstanceArgs),
    /// Start an embedded server with three providers and show the rules at work; with
    /// `--replicas N`, N replicas sharing their state through a local redis-server.
    Demo(demo::DemoArgs),
    /// Load a server (its own by default) and print throughput and latency per mode.
    Bench(bench::BenchArgs),
    /// Run bounded soak and fault scenarios against a loopback server; non-zero exit if a check fails.
    Soak(soak::SoakArgs),
    /// A bare tonic server with only the gRPC health service, on a free loopback port: the
    /// floor `rota bench --modes floor` measures against.
    #[command(hide = true)]
    FloorServer,
}

/// Where the client commands find rota.
#[derive(Debug, Args)]
pub struct ServerArgs {
    /// Address of the rota server.
    #[arg(long, env = "ROTA_SERVER", default_value = "http://127.0.0.1:50051")]
    pub server: String,
    /// PEM CA certificate to trust for an `https://` server; without it, the CAs the system trusts.
    #[arg(long, env = "ROTA_TLS_CA")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// PEM client certificate, for a server that requires mTLS (with --tls-key).
    #[arg(long, env = "ROTA_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<std::path::PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "ROTA_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<std::path::PathBuf>,
    /// Bearer token, for a server with authentication.
    #[arg(long, env = "ROTA_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
}

impl ServerArgs {
    async fn connect(&self) -> Result<RotaClient, CliError> {
        let client = self.connect_channel().await?;
        Ok(match &self.token {
            Some(token) => client.with_token(token)?,
            None => client,
        })
    }

    async fn connect_channel(&self) -> Result<RotaClient, CliError> {
        if !self.server.starts_with("https://") {
            return Ok(RotaClient::connect(&self.server).await?);
        }
        let read = |path: &std::path::Path| {
            std::fs::read(path).map_err(|e| CliError::Usage(format!("cannot read {}: {e}", path.display())))
        };
        // Without --tls-ca, the CAs the platform trusts.
        let ca_pem = self.tls_ca.as_deref().map(read).transpose()?;
        let client_identity = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
            _ => None,
        };
        let tls = TlsOptions { ca_pem, client_identity, domain: None };
        Ok(RotaClient::connect_tls(&self.server, tls).await?)
    }
}

#[derive(Debug, Args)]
pub struct LsArgs {
    /// List this service's instances instead of all services.
    pub service: Option<String>,
    #[command(flatten)]
    pub server: ServerArgs,
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    pub service: String,
    #[command(flatten)]
    pub server: ServerArgs,
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Client(#[from] ClientError),
    #[error(transparent)]
    Serve(#[from] ServeError),
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// EX_USAGE from sysexits.h: the configuration (file, environment or flags) is invalid.
pub const EXIT_CONFIG: u8 = 64;

impl CliError {
    /// The process exit status for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            // A TLS file that changed between the check and the start is a configuration error too.
            CliError::Config(_)
            | CliError::Serve(crate::server::ServeError::Config(_))
            | CliError::Serve(crate::server::ServeError::Tls(_)) => EXIT_CONFIG,
            _ => 1,
        }
    }
}

pub async fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Serve(args) => serve::run(*args).await,
        Command::Pick(args) => pick::run(args).await,
        Command::Register(args) => register::run(args).await,
        Command::Ls(args) => show::ls(args).await,
        Command::Watch(args) => show::watch(args).await,
        Command::Policy(args) => policy::run(args).await,
        Command::Instance(args) => instance::run(args).await,
        Command::Demo(args) => demo::run(args).await,
        Command::Bench(args) if args.backends => bench_backends::run(args).await,
        Command::Bench(args) if args.publication => bench_publish::run(args).await,
        Command::Bench(args) if args.xds => bench_xds::run(args).await,
        Command::Bench(args) if args.health_checks => bench_health::run(args).await,
        Command::Bench(args) if args.sources => bench_sources::run(args).await,
        Command::Bench(args) if args.replica_lag => bench_replica_lag::run(args).await,
        Command::Bench(args) => bench::run(args).await,
        Command::Soak(args) => soak::run(args).await,
        Command::FloorServer => bench::floor_server().await,
    }
}

/// Logs go to stderr (stdout carries results); `RUST_LOG` overrides the default level.
pub fn init_tracing(cli: &Cli) {
    let (default, json) = match &cli.command {
        Command::Serve(args) => ("info", args.log_format == serve::LogFormat::Json),
        _ => ("warn", false),
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colour only for a person at a terminal, never into a file or a log collector.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = if json { logs.json().try_init() } else { logs.try_init() };
}

/// Parses `15s`, `500ms`, `1m`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let duration =
        crate::duration::parse(text).map_err(|e| format!("{text:?} is not a duration ({e}); try 15s or 500ms"))?;
    if duration.is_zero() {
        return Err("must be longer than zero".into());
    }
    Ok(duration)
}

/// Resolves when the process is asked to stop (Ctrl-C or SIGTERM).
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
