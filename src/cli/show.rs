//! `rota ls` and `rota watch`.

use super::{CliError, LsArgs, WatchArgs};
use crate::pb::{self, watch_event::Event};

pub async fn ls(args: LsArgs) -> Result<(), CliError> {
    let mut client = args.server.connect().await?;
    match args.service {
        None => {
            println!("{:<32} {:>9} {:>5} {:>7}", "SERVICE", "INSTANCES", "UP", "EPOCH");
            for service in client.list_services().await? {
                println!("{:<32} {:>9} {:>5} {:>7}", service.name, service.instances, service.up, service.epoch);
            }
        }
        Some(service) => {
            let listing = client.list_instances(&service).await?;
            println!("{:<24} {:<24} {:<10} {:<10} {:<8} {:>6}", "ID", "ADDRESS", "VERSION", "ZONE", "STATUS", "WEIGHT");
            for instance in &listing.instances {
                println!("{}", instance_row(instance));
            }
        }
    }
    Ok(())
}

pub async fn watch(args: WatchArgs) -> Result<(), CliError> {
    let mut client = args.server.connect().await?;
    // A service rota has never seen gets the answer `ls` gives (NOT_FOUND), not a silent wait.
    client.list_instances(&args.service).await?;
    let mut events = client.watch(&args.service).await?;
    while let Some(event) = events.message().await.map_err(crate::client::ClientError::from)? {
        match event.event {
            Some(Event::Snapshot(list)) => {
                println!("epoch {}: {} instances", event.epoch, list.instances.len());
                for instance in &list.instances {
                    println!("  {}", instance_row(instance));
                }
            }
            Some(Event::Added(instance)) => println!("epoch {}: + {}", event.epoch, instance_row(&instance)),
            Some(Event::Updated(instance)) => println!("epoch {}: ~ {}", event.epoch, instance_row(&instance)),
            Some(Event::Removed(removed)) => println!("epoch {}: - {}", event.epoch, removed.id),
            None => {}
        }
    }
    Ok(())
}

/// One instance: its fields, then why rota publishes another status or weight than was
/// announced (`announced UP`, `operator drain`, `health failing`), when it does.
fn instance_row(instance: &pb::Instance) -> String {
    let name = |status: i32| pb::InstanceStatus::try_from(status).map_or("?", |s| s.as_str_name());
    let mut row = format!(
        "{:<24} {:<24} {:<10} {:<10} {:<8} {:>6}",
        instance.id,
        format!("{}:{}", instance.host, instance.port),
        if instance.version.is_empty() { "-" } else { &instance.version },
        if instance.zone.is_empty() { "-" } else { &instance.zone },
        name(instance.status),
        instance.weight.unwrap_or(crate::registry::DEFAULT_WEIGHT),
    );
    let mut why = Vec::new();
    if instance.announced_status != pb::InstanceStatus::Unspecified as i32 {
        why.push(format!("announced {}", name(instance.announced_status)));
    }
    if !instance.operator.is_empty() {
        why.push(format!("operator {}", instance.operator));
    }
    if !instance.health.is_empty() {
        why.push(format!("health {}", instance.health));
    }
    if !why.is_empty() {
        row.push_str("  ");
        row.push_str(&why.join("; "));
    }
    row
}
