//! `rota instance`: an operator's word over what a provider or source says of one instance.
//!
//! `drain` stops new picks (the instance is published DRAINING), `disable` publishes it DOWN,
//! `enable` drops either, `weight` publishes it with another weight, `clear` drops the whole
//! override, and `overrides` lists them. An override is kept until cleared, whether the instance
//! is registered or not (one that restarts stays drained); every pick answered after the command
//! returns sees it. Needs an admin token when the server has tokens.

use clap::{Args, Subcommand};

use super::{CliError, ServerArgs};
use crate::pb;

#[derive(Debug, Args)]
pub struct InstanceArgs {
    #[command(subcommand)]
    pub command: InstanceCommand,
}

#[derive(Debug, Subcommand)]
pub enum InstanceCommand {
    /// No new picks for the instance (published DRAINING) until `enable`.
    Drain(Target),
    /// The instance is published DOWN until `enable`.
    Disable(Target),
    /// Drops a drain or disable; a weight override stays.
    Enable(Target),
    /// Publishes the instance with weight W until `clear`.
    Weight(WeightArgs),
    /// Drops the instance's whole override.
    Clear(Target),
    /// Lists every override.
    Overrides(super::policy::ServerOnly),
}

#[derive(Debug, Args)]
pub struct Target {
    pub service: String,
    pub id: String,
    #[command(flatten)]
    pub server: ServerArgs,
}

#[derive(Debug, Args)]
pub struct WeightArgs {
    pub service: String,
    pub id: String,
    pub weight: u32,
    #[command(flatten)]
    pub server: ServerArgs,
}

pub async fn run(args: InstanceArgs) -> Result<(), CliError> {
    let (target, action, weight) = match args.command {
        InstanceCommand::Overrides(args) => {
            let overrides = args.server.connect().await?.list_instance_overrides().await?;
            for item in &overrides {
                println!("{}", row(item));
            }
            if overrides.is_empty() {
                println!("no instance overrides");
            }
            return Ok(());
        }
        InstanceCommand::Drain(t) => (t, pb::OverrideAction::Drain, 0),
        InstanceCommand::Disable(t) => (t, pb::OverrideAction::Disable, 0),
        InstanceCommand::Enable(t) => (t, pb::OverrideAction::Enable, 0),
        InstanceCommand::Clear(t) => (t, pb::OverrideAction::Clear, 0),
        InstanceCommand::Weight(w) => {
            (Target { service: w.service, id: w.id, server: w.server }, pb::OverrideAction::Weight, w.weight)
        }
    };
    let request =
        pb::SetInstanceOverrideRequest { service: target.service, id: target.id, action: action.into(), weight };
    let now = target.server.connect().await?.set_instance_override(request).await?;
    println!("{}", row(&now));
    if !now.registered {
        eprintln!("rota: {} is not registered in {} now; the override applies once it is", now.id, now.service);
    }
    Ok(())
}

/// `SERVICE ID OVERRIDE`, the override as `drain`, `disable`, `weight=N` (joined by `,`) or `none`.
fn row(item: &pb::InstanceOverride) -> String {
    let mut parts = Vec::new();
    if !item.status.is_empty() {
        parts.push(item.status.clone());
    }
    if let Some(weight) = item.weight {
        parts.push(format!("weight={weight}"));
    }
    let described = if parts.is_empty() { "none".to_owned() } else { parts.join(",") };
    format!("{:<24} {:<32} {described}", item.service, item.id)
}
