//! `rota register`: one instance kept registered until Ctrl-C, across rota restarts.

use std::time::Duration;

use clap::Args;

use super::{CliError, ServerArgs, shutdown_signal};
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
    let mut registration = client.register(vec![instance.clone()]).await?;
    registration.require_all_accepted()?;
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
    loop {
        let reason = tokio::select! {
            () = &mut shutdown => break,
            reason = registration.closed() => reason,
        };
        // rota restarted, shut down or expired the stream: register again (the instance is
        // gone until then), with backoff, until it is accepted or Ctrl-C.
        eprintln!("registration lost ({reason}); registering again");
        let mut backoff = Backoff::default();
        registration = loop {
            tokio::select! {
                () = &mut shutdown => return Ok(()),
                () = tokio::time::sleep(backoff.next()) => {}
            }
            match reregister(&args.server, &instance).await {
                Ok(registration) => break registration,
                Err(error) => eprintln!("cannot register yet: {error}"),
            }
        };
        println!("registered again (lease {})", registration.ack().lease_id);
    }
    registration.close().await?;
    println!("withdrawn");
    Ok(())
}

async fn reregister(server: &ServerArgs, instance: &pb::Instance) -> Result<crate::client::Registration, CliError> {
    let mut client = server.connect().await?;
    let registration = client.register(vec![instance.clone()]).await?;
    registration.require_all_accepted()?;
    Ok(registration)
}

/// Delays between attempts: doubling from 100 ms to at most 5 s, each with up to 20% jitter so
/// providers restarted together do not reconnect in step.
#[derive(Debug)]
struct Backoff {
    next: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { next: Duration::from_millis(100) }
    }
}

impl Backoff {
    const MAX: Duration = Duration::from_secs(5);

    fn next(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(Self::MAX);
        delay + delay.mul_f64(fastrand::f64() * 0.2)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_with_bounded_jitter() {
        let mut backoff = Backoff::default();
        let delays: Vec<Duration> = (0..10).map(|_| backoff.next()).collect();
        let base = [100, 200, 400, 800, 1600, 3200, 5000, 5000, 5000, 5000].map(Duration::from_millis);
        for (delay, base) in delays.iter().zip(base) {
            assert!(*delay >= base && *delay <= base.mul_f64(1.2), "{delay:?} vs {base:?}");
        }
    }
}
