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
    /// The `[server]` settings (see `config::settings`).
    #[command(flatten)]
    pub settings: Overrides,
    /// Log lines as text or as JSON objects (one per line, on stderr).
    #[arg(long, env = "ROTA_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// A registry to follow, as a URL (repeatable; beside the file's `[[source]]` tables), e.g.
    /// `eureka+http://127.0.0.1:8761/eureka?services=orders` (see docs/sources.md).
    #[arg(long = "source", value_name = "URL")]
    pub sources: Vec<String>,
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
    let mut settings = config::resolve(args.config.as_deref(), &args.settings)?;
    settings.add_source_flags(&args.sources)?;
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
    let admin = crate::admin::ADMIN_LIMITS;
    let wanted = settings.serve.limits.connections.max_connections + admin.max_connections + admin.probe_reserve;
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
