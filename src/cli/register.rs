//! `rota register`: one instance kept registered until Ctrl-C, across rota restarts.

use clap::Args;

use super::{CliError, ServerArgs, shutdown_signal};
use crate::client::RegistrationEvent;
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
        ..Default::default()
    };
    let client = args.server.connect().await?;
    let mut registration = client.keep_registered(vec![instance]).await?;
    for accepted in &registration.ack().accepted {
        println!(
            "registered {} in {} (lease {}); Ctrl-C to withdraw",
            accepted.id,
            accepted.service,
            registration.ack().lease_id
        );
    }
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    // rota restarted, shut down or expired the stream: the registration registers again (the
    // instance is gone until then), with backoff, until it is accepted or Ctrl-C.
    loop {
        let event = tokio::select! {
            () = &mut shutdown => break,
            event = registration.next_event() => event,
        };
        match event {
            Some(RegistrationEvent::Lost { reason }) => eprintln!("registration lost ({reason}); registering again"),
            Some(RegistrationEvent::Retrying { error }) => eprintln!("cannot register yet: {error}"),
            Some(RegistrationEvent::Registered { ack }) => println!("registered again (lease {})", ack.lease_id),
            None => break,
        }
    }
    if registration.close().await?.is_some() {
        println!("withdrawn");
    }
    Ok(())
}
