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
            println!(
                "{:<24} {:<24} {:<10} {:<10} {:<8} {:>6} {:<12} METADATA",
                "ID", "ADDRESS", "VERSION", "ZONE", "STATUS", "WEIGHT", "SOURCE"
            );
            for instance in &listing.instances {
                println!("{}", instance_row(instance));
            }
            print_sources(&listing.sources, now_unix());
        }
    }
    Ok(())
}

pub async fn watch(args: WatchArgs) -> Result<(), CliError> {
    let mut client = args.server.connect().await?;
    // A service rota has never seen gets the answer `ls` gives (NOT_FOUND), not a silent wait.
    let listing = client.list_instances(&args.service).await?;
    print_sources(&listing.sources, now_unix());
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
    let dash = |text: &str| if text.is_empty() { "-".to_owned() } else { text.to_owned() };
    let mut row = format!(
        "{:<24} {:<24} {:<10} {:<10} {:<8} {:>6} {:<12} {}",
        instance.id,
        format!("{}:{}", instance.host, instance.port),
        dash(&instance.version),
        dash(&instance.zone),
        name(instance.status),
        instance.weight.unwrap_or(crate::registry::DEFAULT_WEIGHT),
        dash(&instance.source),
        metadata(instance),
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

/// Longest metadata value shown in a row; longer ones end in `…`.
const SHOWN_VALUE_CHARS: usize = 32;

/// `key=value,…` in key order, `-` for none.
fn metadata(instance: &pb::Instance) -> String {
    if instance.metadata.is_empty() {
        return "-".to_owned();
    }
    let mut entries: Vec<_> = instance.metadata.iter().collect();
    entries.sort();
    let shown: Vec<String> = entries
        .into_iter()
        .map(|(key, value)| match value.char_indices().nth(SHOWN_VALUE_CHARS) {
            Some((cut, _)) => format!("{key}={}…", &value[..cut]),
            None => format!("{key}={value}"),
        })
        .collect();
    shown.join(",")
}

/// One line per source the instances come from: up or stale, and how long since its last
/// good read.
fn print_sources(sources: &[pb::SourceState], now: u64) {
    for line in source_lines(sources, now) {
        println!("{line}");
    }
}

fn source_lines(sources: &[pb::SourceState], now: u64) -> Vec<String> {
    sources
        .iter()
        .map(|source| {
            let last = match source.last_read_unix_seconds {
                0 => "never read".to_owned(),
                at => format!("last read {} s ago", now.saturating_sub(at)),
            };
            if source.up {
                format!("source {}: up, {last}", source.name)
            } else {
                format!("source {}: STALE ({last}); its instances are those of its last good listing", source.name)
            }
        })
        .collect()
}

fn now_unix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_shows_source_and_metadata_and_a_stale_source_says_so() {
        let instance = pb::Instance {
            id: "a".into(),
            host: "127.0.0.1".into(),
            port: 80,
            source: "eureka".into(),
            metadata: [("version".to_owned(), "zlt".to_owned()), ("long".to_owned(), "x".repeat(40))].into(),
            ..Default::default()
        };
        let row = instance_row(&instance);
        assert!(row.contains(&format!(" eureka       long={}…,version=zlt", "x".repeat(32))), "{row}");
        let bare = instance_row(&pb::Instance { id: "b".into(), ..Default::default() });
        assert!(bare.ends_with(" -            -"), "{bare:?}");

        let sources = [
            pb::SourceState { name: "eureka".into(), up: true, last_read_unix_seconds: 990 },
            pb::SourceState { name: "dns".into(), up: false, last_read_unix_seconds: 958 },
            pb::SourceState { name: "etcd".into(), up: false, last_read_unix_seconds: 0 },
        ];
        assert_eq!(
            source_lines(&sources, 1000),
            [
                "source eureka: up, last read 10 s ago",
                "source dns: STALE (last read 42 s ago); its instances are those of its last good listing",
                "source etcd: STALE (never read); its instances are those of its last good listing",
            ]
        );
    }
}
