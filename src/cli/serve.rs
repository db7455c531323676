//! `rota serve`.

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;

use super::{CliError, parse_duration, shutdown_signal};
use crate::registry::{DEFAULT_MAX_INSTANCES_PER_STREAM, RegistryConfig};
use crate::server::{DEFAULT_LISTEN, ServeConfig, Server};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Config file (TOML) with per-service policies; reloaded when it changes or on SIGHUP.
    #[arg(long, env = "ROTA_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    /// gRPC listen address; port 0 picks a free port. The bound address is printed first.
    #[arg(long, env = "ROTA_LISTEN", default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Drop a registration stream's instances after this long without a message from it.
    #[arg(long, env = "ROTA_HEARTBEAT_TIMEOUT", default_value = "15s", value_parser = parse_duration)]
    pub heartbeat_timeout: Duration,
    /// On SIGTERM/SIGINT: answer picks this long while registrations move away, then exit.
    #[arg(long, env = "ROTA_SHUTDOWN_GRACE", default_value = "10s", value_parser = parse_duration)]
    pub shutdown_grace: Duration,
    /// Most instances one registration stream may hold.
    #[arg(long, env = "ROTA_MAX_INSTANCES_PER_STREAM", default_value_t = DEFAULT_MAX_INSTANCES_PER_STREAM)]
    pub max_instances_per_stream: usize,
}

pub async fn run(args: ServeArgs) -> Result<(), CliError> {
    if args.max_instances_per_stream == 0 {
        return Err(CliError::Usage("--max-instances-per-stream must be at least 1".into()));
    }
    let config = ServeConfig {
        listen: args.listen,
        registry: RegistryConfig {
            heartbeat_timeout: args.heartbeat_timeout,
            max_instances_per_stream: args.max_instances_per_stream,
        },
        policy_file: args.config,
        ..Default::default()
    };
    let server = Server::start(config).await?;
    // The first line of output is the bound address, for scripts and test harnesses.
    let mut stdout = std::io::stdout();
    writeln!(stdout, "listening on {}", server.local_addr())?;
    stdout.flush()?;
    server.run_until(shutdown_signal, args.shutdown_grace).await?;
    Ok(())
}
