//! `rota serve`.

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;

use super::{CliError, parse_duration, shutdown_signal};
use crate::registry::{DEFAULT_MAX_INSTANCES_PER_STREAM, RegistryConfig};
use crate::server::{DEFAULT_ADMIN_LISTEN, DEFAULT_LISTEN, ServeConfig, Server};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Config file (TOML) with per-service policies; reloaded when it changes or on SIGHUP.
    #[arg(long, env = "ROTA_CONFIG")]
    pub config: Option<std::path::PathBuf>,
    /// gRPC listen address; port 0 picks a free port. The bound address is printed first.
    #[arg(long, env = "ROTA_LISTEN", default_value = DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Admin HTTP listen address (metrics, health, JSON API, dashboard), or `off`; port 0 picks
    /// a free port. The bound address is printed second.
    #[arg(long, env = "ROTA_ADMIN_LISTEN", default_value = DEFAULT_ADMIN_LISTEN, value_parser = parse_admin_listen)]
    pub admin_listen: AdminListen,
    /// Drop a registration stream's instances after this long without a message from it.
    #[arg(long, env = "ROTA_HEARTBEAT_TIMEOUT", default_value = "15s", value_parser = parse_duration)]
    pub heartbeat_timeout: Duration,
    /// Most instances one registration stream may hold.
    #[arg(long, env = "ROTA_MAX_INSTANCES_PER_STREAM", default_value_t = DEFAULT_MAX_INSTANCES_PER_STREAM)]
    pub max_instances_per_stream: usize,
}

/// `--admin-listen`: an address, or `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdminListen(pub Option<SocketAddr>);

fn parse_admin_listen(value: &str) -> Result<AdminListen, String> {
    if value == "off" {
        return Ok(AdminListen(None));
    }
    value
        .parse()
        .map(|addr| AdminListen(Some(addr)))
        .map_err(|_| format!("{value:?} is neither an address nor \"off\""))
}

pub async fn run(args: ServeArgs) -> Result<(), CliError> {
    if args.max_instances_per_stream == 0 {
        return Err(CliError::Usage("--max-instances-per-stream must be at least 1".into()));
    }
    let config = ServeConfig {
        listen: args.listen,
        admin_listen: args.admin_listen.0,
        registry: RegistryConfig {
            heartbeat_timeout: args.heartbeat_timeout,
            max_instances_per_stream: args.max_instances_per_stream,
        },
        policy_file: args.config,
        ..Default::default()
    };
    let server = Server::start(config).await?;
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
    server.run_until(shutdown_signal()).await?;
    Ok(())
}
