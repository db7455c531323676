//! `rota soak`: the soak and fault scenarios of [`crate::soak`], against a server of their own
//! (or a given one); exits non-zero when any check fails.

use std::time::Instant;

use clap::Args;

use super::CliError;
use crate::soak::{self, Scenario, SoakOptions};

#[derive(Debug, Args)]
pub struct SoakArgs {
    /// Sizes every scenario to finish in about two minutes in all (for CI).
    #[arg(long)]
    pub short: bool,
    /// Runs only this scenario (repeatable); all of them by default.
    #[arg(long, value_enum)]
    pub scenario: Vec<Scenario>,
    /// A running server to use instead of starting one per scenario (loopback only).
    #[arg(long)]
    pub server: Option<String>,
    /// Process id of --server, for its memory (the memory scenario needs it).
    #[arg(long, requires = "server")]
    pub server_pid: Option<u32>,
}

pub async fn run(args: SoakArgs) -> Result<(), CliError> {
    if let Some(server) = &args.server
        && !is_loopback_url(server)
    {
        return Err(CliError::Usage(format!("--server {server:?}: rota soak only talks to a loopback address")));
    }
    let scenarios = if args.scenario.is_empty() { Scenario::ALL.to_vec() } else { args.scenario.clone() };
    let options =
        SoakOptions { short: args.short, scenarios, server: args.server.clone().map(|url| (url, args.server_pid)) };
    let started = Instant::now();
    println!(
        "rota soak: {} mode, scenarios {}",
        if options.short { "short" } else { "long" },
        options.scenarios.iter().map(|s| s.name()).collect::<Vec<_>>().join(", ")
    );
    let reports = soak::run(&options).await;
    let failed = soak::print_summary(&reports, started.elapsed());
    if failed > 0 {
        return Err(CliError::Usage(format!("{failed} soak check(s) failed")));
    }
    Ok(())
}

/// `http(s)://` followed by 127.x.x.x, `[::1]` or localhost.
fn is_loopback_url(url: &str) -> bool {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let host = match rest.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or_default(),
        None => rest.split([':', '/']).next().unwrap_or_default(),
    };
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::is_loopback_url;

    #[test]
    fn only_loopback_servers_are_accepted() {
        for url in ["http://127.0.0.1:50051", "https://[::1]:1", "http://localhost:9", "127.0.0.2:80"] {
            assert!(is_loopback_url(url), "{url}");
        }
        for url in ["http://10.0.0.1:50051", "https://example.com:443", "http://[2001:db8::1]:1"] {
            assert!(!is_loopback_url(url), "{url}");
        }
    }
}
