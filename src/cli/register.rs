//! `rota register`.

use clap::Args;

use super::{CliError, ServerArgs, shutdown_signal};
use crate::client::ClientError;
use crate::pb;

#[derive(Debug, Args)]
pub struct RegisterArgs {
    pub service: String,
    /// The instance's address, HOST:PORT.
    pub address: String,
    /// Instance id; defaults to HOST:PORT.
    #[arg(long, default_value = "")]
    pub id: String,
    #[arg(long, default_value = "")]
    pub version: String,
    #[arg(long, default_value = "")]
    pub zone: String,
    /// Weight for weighted rules (default 100; 0 = never picked).
    #[arg(long)]
    pub weight: Option<u32>,
    /// Metadata entry KEY=VALUE (repeatable).
    #[arg(long = "meta", value_parser = parse_meta)]
    pub metadata: Vec<(String, String)>,
    #[command(flatten)]
    pub server: ServerArgs,
}

fn parse_meta(text: &str) -> Result<(String, String), String> {
    text.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())).ok_or_else(|| format!("{text:?} is not KEY=VALUE"))
}

/// Splits `HOST:PORT`, including `[::1]:80`.
pub fn split_address(address: &str) -> Result<(String, u32), CliError> {
    let bad = || CliError::Usage(format!("{address:?} is not HOST:PORT"));
    let (host, port) = address.rsplit_once(':').ok_or_else(bad)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port: u32 = port.parse().map_err(|_| bad())?;
    if host.is_empty() {
        return Err(bad());
    }
    Ok((host.to_owned(), port))
}

pub async fn run(args: RegisterArgs) -> Result<(), CliError> {
    let (host, port) = split_address(&args.address)?;
    let instance = pb::Instance {
        id: args.id,
        service: args.service,
        host,
        port,
        version: args.version,
        zone: args.zone,
        weight: args.weight,
        metadata: args.metadata.into_iter().collect(),
        status: pb::InstanceStatus::Up.into(),
    };
    let mut client = args.server.connect().await?;
    let registration = client.register(vec![instance]).await?;
    registration.require_all_accepted()?;
    for accepted in &registration.ack().accepted {
        println!(
            "registered {} in {} (lease {}); Ctrl-C to withdraw",
            accepted.id,
            accepted.service,
            registration.ack().lease_id
        );
    }
    let mut registration = registration;
    tokio::select! {
        () = shutdown_signal() => {}
        reason = registration.closed() => return Err(ClientError::Closed(reason).into()),
    }
    registration.close().await?;
    println!("withdrawn");
    Ok(())
}
