//! `rota demo`: an embedded server, three providers and a developer's local instance, and a
//! table of where a dozen picks go under each rule. With `--replicas N`, N embedded servers
//! share their state through a `redis-server` started on a loopback port, and the consumers
//! take turns on different replicas.

use std::collections::BTreeSet;
use std::time::Duration;

use clap::Args;

use super::CliError;
use super::redis_process::start_redis;
use crate::client::{PickOptions, Registration, RotaClient};
use crate::pb;
use crate::server::{ServeConfig, Server};
use crate::state::StateConfig;

const SERVICE: &str = "orders";
const PICKS: usize = 12;
/// The longest wait for the replicas to link to Redis and to see every instance.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(20);
/// The replicas' wait for one Redis command: the demo's Redis is local, so a busy machine must
/// not look like an outage (which would hand picks to local counters).
const REDIS_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Run N replicas (2 to 9) sharing their state through a redis-server started on a free
    /// loopback port (redis-server must be installed); consumers on different replicas still
    /// share one rotation.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(2..=9))]
    pub replicas: Option<u8>,
}

pub async fn run(args: DemoArgs) -> Result<(), CliError> {
    // Declared before the servers: Redis is killed last, on every path out (an error, Ctrl-C).
    let redis = match args.replicas {
        Some(_) => Some(start_redis().await?),
        None => None,
    };
    let url = redis.as_ref().map(|(_, url)| url.as_str());
    tokio::select! {
        result = demo(usize::from(args.replicas.unwrap_or(1)), url) => result,
        () = super::shutdown_signal() => Err(CliError::Usage("interrupted".into())),
    }
}

/// The demo on `replicas` embedded servers, sharing their state through the Redis at `redis`
/// (or in memory, for one server).
async fn demo(replicas: usize, redis: Option<&str>) -> Result<(), CliError> {
    let state = match redis {
        Some(url) => StateConfig::parse(&format!("{url}/0"), 1, REDIS_TIMEOUT).map_err(CliError::Usage)?,
        None => StateConfig::Memory,
    };
    let mut servers = Vec::new();
    for _ in 0..replicas {
        let config = ServeConfig {
            listen: ([127, 0, 0, 1], 0).into(),
            admin_listen: None,
            warmup: Some(Duration::ZERO),
            state: state.clone(),
            ..Default::default()
        };
        servers.push(Server::start(config).await?);
    }
    match redis {
        None => println!("rota demo: embedded server on {}", servers[0].local_addr()),
        Some(url) => {
            println!("rota demo: {replicas} replicas sharing their state through redis-server at {url}");
            for (i, server) in servers.iter().enumerate() {
                println!("replica {} on {}", i + 1, server.local_addr());
            }
            wait_for_links(&servers).await?;
        }
    }

    // Each provider holds its own registration stream, as separate processes would, spread
    // over the replicas.
    let providers =
        [("orders-a", 9001, ""), ("orders-b", 9002, ""), ("orders-c", 9003, ""), ("orders-zlt", 9100, "zlt")];
    let mut registrations: Vec<Registration> = Vec::new();
    for (i, (id, port, version)) in providers.into_iter().enumerate() {
        let replica = i % servers.len();
        let mut client = RotaClient::connect(&servers[replica].endpoint()).await?;
        let instance = pb::Instance {
            id: id.into(),
            service: SERVICE.into(),
            host: "127.0.0.1".into(),
            port,
            version: version.into(),
            ..Default::default()
        };
        let registration = client.register(vec![instance]).await?;
        registration.require_all_accepted()?;
        let label = if version.is_empty() { String::new() } else { format!(" (version {version})") };
        let through = if redis.is_some() { format!(" through replica {}", replica + 1) } else { String::new() };
        println!("registered {id} at 127.0.0.1:{port}{label}{through}");
        registrations.push(registration);
    }
    if redis.is_some() {
        let ids: BTreeSet<String> = providers.iter().map(|(id, _, _)| id.to_string()).collect();
        for (i, server) in servers.iter().enumerate() {
            wait_for_instances(i + 1, &server.endpoint(), &ids).await?;
        }
        println!("every replica sees the {} instances", ids.len());
    }

    // Two consumers on separate connections take turns (with replicas, one consumer on each
    // replica): the rotation is still one rotation.
    let mut consumers = Vec::new();
    for i in 0..servers.len().max(2) {
        consumers.push(RotaClient::connect(&servers[i % servers.len()].endpoint()).await?);
    }
    let columns = [
        ("round_robin", PickOptions::rule("round_robin")),
        ("repeat(n=3)", PickOptions::rule("repeat(n=3)")),
        ("version=zlt", PickOptions::rule("round_robin").version("zlt")),
        ("version=nobody", PickOptions::rule("round_robin").version("nobody")),
    ];
    let mut table = vec![Vec::new(); PICKS];
    let mut tickets = vec![Vec::new(); columns.len()];
    let mut notes = Vec::new();
    for (c, (name, options)) in columns.iter().enumerate() {
        for (i, row) in table.iter_mut().enumerate() {
            let mut consumer = consumers[i % consumers.len()].clone();
            let picked = consumer.pick(SERVICE, options.clone()).await?;
            let note = format!("{name}: {}", picked.fallback);
            if !picked.fallback.is_empty() && !notes.contains(&note) {
                notes.push(note);
            }
            let response = picked.into_response();
            tickets[c].push(response.ticket.to_string());
            row.push(response.instance.map(|i| i.id).unwrap_or_default());
        }
    }
    println!();
    print!("{:<6} {:<9}", "pick", "consumer");
    if redis.is_some() {
        print!(" {:<8}", "replica");
    }
    for (name, _) in &columns {
        print!(" {name:<16}");
    }
    println!();
    for (i, row) in table.iter().enumerate() {
        let consumer = i % consumers.len();
        print!("{:<6} {:<9}", i + 1, format!("#{}", consumer + 1));
        if redis.is_some() {
            print!(" {:<8}", consumer % servers.len() + 1);
        }
        for id in row {
            print!(" {id:<16}");
        }
        println!();
    }
    if redis.is_some() {
        // The tickets show the rotations are the fleet's: one counter per rule, whichever
        // replica the pick went through.
        println!();
        for ((name, _), drawn) in columns.iter().zip(&tickets) {
            println!("tickets {name:<16} {}", drawn.join(" "));
        }
        // A rotation is (service, rule, subset): the fallback lands on round_robin's own.
        println!(
            "(version=nobody fell back to the instances with no version, the subset round_robin \
             rotates over, so it drew from that same rotation: its tickets go on from round_robin's)"
        );
    }
    for note in notes {
        println!("\nfallback — {note}");
    }
    for registration in registrations {
        registration.close().await?;
    }
    for server in servers {
        server.stop().await?;
    }
    Ok(())
}

/// Waits until every replica's link to Redis is up, so no pick is answered from a local counter.
async fn wait_for_links(servers: &[Server]) -> Result<(), CliError> {
    for (i, server) in servers.iter().enumerate() {
        let Some(link) = server.balancer().state().link() else { continue };
        let mut up = link.watch();
        match tokio::time::timeout(CONVERGE_TIMEOUT, up.wait_for(|up| *up)).await {
            Ok(Ok(_)) => {}
            _ => {
                return Err(CliError::Usage(format!(
                    "replica {} did not reach redis-server within {CONVERGE_TIMEOUT:?}",
                    i + 1
                )));
            }
        }
    }
    Ok(())
}

/// Waits until the replica at `endpoint` lists exactly `ids` for the service, following its Watch.
async fn wait_for_instances(replica: usize, endpoint: &str, ids: &BTreeSet<String>) -> Result<(), CliError> {
    let watcher = RotaClient::connect(endpoint).await?;
    let seen = tokio::time::timeout(CONVERGE_TIMEOUT, async {
        watcher.follow(SERVICE).await;
        watcher.wait_followed(SERVICE, |list| list.len() == ids.len() && list.iter().all(|i| ids.contains(&i.id))).await
    })
    .await;
    seen.map(|_| ()).map_err(|_| {
        CliError::Usage(format!("replica {replica} did not see all of {ids:?} within {CONVERGE_TIMEOUT:?}"))
    })
}
