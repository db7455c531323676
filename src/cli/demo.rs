//! `rota demo`: an embedded server, three providers and a developer's local instance, and a
//! table of where a dozen picks go under each rule.

use super::CliError;
use crate::client::{PickOptions, Registration, RotaClient};
use crate::pb;
use crate::server::{ServeConfig, Server};

const SERVICE: &str = "orders";
const PICKS: usize = 12;

pub async fn run() -> Result<(), CliError> {
    let config = ServeConfig {
        listen: ([127, 0, 0, 1], 0).into(),
        admin_listen: None,
        warmup: Some(std::time::Duration::ZERO),
        ..Default::default()
    };
    let server = Server::start(config).await?;
    println!("rota demo: embedded server on {}", server.local_addr());

    // Each provider holds its own registration stream, as separate processes would.
    let providers =
        [("orders-a", 9001, ""), ("orders-b", 9002, ""), ("orders-c", 9003, ""), ("orders-zlt", 9100, "zlt")];
    let mut registrations: Vec<Registration> = Vec::new();
    for (id, port, version) in providers {
        let mut client = RotaClient::connect(&server.endpoint()).await?;
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
        println!("registered {id} at 127.0.0.1:{port}{label}");
        registrations.push(registration);
    }

    // Two consumers on separate connections take turns: the rotation is still one rotation.
    let consumers = [RotaClient::connect(&server.endpoint()).await?, RotaClient::connect(&server.endpoint()).await?];
    let columns = [
        ("round_robin", PickOptions::rule("round_robin")),
        ("repeat(n=3)", PickOptions::rule("repeat(n=3)")),
        ("version=zlt", PickOptions::rule("round_robin").version("zlt")),
        ("version=nobody", PickOptions::rule("round_robin").version("nobody")),
    ];
    let mut table = vec![Vec::new(); PICKS];
    let mut notes = Vec::new();
    for (name, options) in &columns {
        for (i, row) in table.iter_mut().enumerate() {
            let mut consumer = consumers[i % consumers.len()].clone();
            let picked = consumer.pick(SERVICE, options.clone()).await?;
            let note = format!("{name}: {}", picked.fallback);
            if !picked.fallback.is_empty() && !notes.contains(&note) {
                notes.push(note);
            }
            row.push(picked.into_response().instance.map(|i| i.id).unwrap_or_default());
        }
    }
    println!();
    print!("{:<6} {:<9}", "pick", "consumer");
    for (name, _) in &columns {
        print!(" {name:<16}");
    }
    println!();
    for (i, row) in table.iter().enumerate() {
        print!("{:<6} {:<9}", i + 1, format!("#{}", i % consumers.len() + 1));
        for id in row {
            print!(" {id:<16}");
        }
        println!();
    }
    for note in notes {
        println!("\nfallback — {note}");
    }
    for registration in registrations {
        registration.close().await?;
    }
    server.stop().await?;
    Ok(())
}
