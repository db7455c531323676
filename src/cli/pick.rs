//! `rota pick`.

use clap::Args;

use super::{CliError, ServerArgs};
use crate::client::PickOptions;
use crate::pb;

#[derive(Debug, Args)]
pub struct PickArgs {
    pub service: String,
    /// Rule, with optional parameters: round_robin, repeat(n=5), consistent_hash, sticky(ttl=10m), ...
    #[arg(long, default_value = "")]
    pub rule: String,
    /// Version isolation: pick instances of this version.
    #[arg(long, default_value = "")]
    pub version: String,
    /// Affinity key for hashing rules.
    #[arg(long, default_value = "")]
    pub key: String,
    /// The consumer's zone, for zone-aware rules.
    #[arg(long, default_value = "")]
    pub zone: String,
    /// Instance ids not to pick (repeatable).
    #[arg(long)]
    pub exclude: Vec<String>,
    /// How many picks to make (at least 1).
    #[arg(short = 'n', long = "count", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub count: u32,
    #[command(flatten)]
    pub server: ServerArgs,
}

pub async fn run(args: PickArgs) -> Result<(), CliError> {
    let mut client = args.server.connect().await?;
    let options =
        PickOptions { rule: args.rule, version: args.version, key: args.key, zone: args.zone, exclude: args.exclude };
    // The header once the first pick is answered: a pick refused at once prints only its error.
    for n in 0..args.count {
        let picked = client.pick(&args.service, options.clone()).await?;
        if n == 0 {
            println!("{}", HEADER);
        }
        println!("{}", describe(&picked));
    }
    Ok(())
}

/// The column names above the lines of [`describe`].
pub const HEADER: &str = "TICKET  INSTANCE             ADDRESS          RULE  [VERSION]  [FALLBACK]";

/// `ticket  id  host:port  rule  [version]  [fallback]` on one line.
pub fn describe(picked: &pb::PickResponse) -> String {
    let instance = picked.instance.clone().unwrap_or_default();
    let address = format!("{}:{}", instance.host, instance.port);
    let mut line = format!("{:>6}  {:<20} {:<16} {}", picked.ticket, instance.id, address, picked.rule);
    if !instance.version.is_empty() {
        line.push_str(&format!("  version={}", instance.version));
    }
    if !picked.fallback.is_empty() {
        line.push_str(&format!("  fallback: {}", picked.fallback));
    }
    line
}
