//! Starts a server on a free loopback port and hands out clients.

use std::time::Duration;

use rota::client::{Registration, RotaClient};
use rota::pb;
use rota::server::{ServeConfig, Server};

/// Upper bound for any wait on the server in these tests.
pub const PATIENCE: Duration = Duration::from_secs(10);

pub struct TestServer {
    pub server: Server,
}

impl TestServer {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    /// A server on free loopback ports, with `adjust` applied to its configuration.
    pub async fn start_with(adjust: impl FnOnce(&mut ServeConfig)) -> Self {
        let loopback = ([127, 0, 0, 1], 0).into();
        // No warm-up unless a test asks for one: these servers start empty, and "never
        // registered" is NOT_FOUND at once.
        let mut config = ServeConfig {
            listen: loopback,
            admin_listen: Some(loopback),
            warmup: Some(Duration::ZERO),
            ..Default::default()
        };
        adjust(&mut config);
        Self { server: Server::start(config).await.expect("server starts") }
    }

    /// A client on its own connection.
    pub async fn client(&self) -> RotaClient {
        RotaClient::connect(&self.server.endpoint()).await.expect("client connects")
    }

    /// Registers `instances` on a new stream and checks they were all accepted.
    pub async fn register(&self, instances: Vec<pb::Instance>) -> Registration {
        let registration = self.client().await.register(instances).await.expect("register");
        registration.require_all_accepted().expect("all accepted");
        registration
    }
}

pub fn instance(service: &str, id: &str, port: u32) -> pb::Instance {
    pb::Instance { id: id.into(), service: service.into(), host: "127.0.0.1".into(), port, ..Default::default() }
}

pub fn versioned(service: &str, id: &str, port: u32, version: &str) -> pb::Instance {
    pb::Instance { version: version.into(), ..instance(service, id, port) }
}

pub fn picked_id(response: &pb::PickResponse) -> String {
    response.instance.as_ref().map(|i| i.id.clone()).unwrap_or_default()
}

/// Waits for a Watch of `service` to report that `id` was removed.
pub async fn wait_until_removed(watch: &mut tonic::Streaming<pb::WatchEvent>, id: &str) {
    tokio::time::timeout(PATIENCE, async {
        while let Some(event) = watch.message().await.expect("watch stream") {
            if let Some(pb::watch_event::Event::Removed(removed)) = event.event
                && removed.id == id
            {
                return;
            }
        }
        panic!("watch ended before {id} was removed");
    })
    .await
    .expect("removal observed in time");
}

/// The admin listener's `/metrics` page.
pub async fn metrics(server: &TestServer) -> String {
    let addr = server.server.admin_addr().expect("admin listener");
    let url = format!("http://{addr}/metrics");
    let body = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
        let mut body = String::new();
        stream.read_to_string(&mut body).unwrap();
        body
    })
    .await
    .unwrap();
    assert!(body.starts_with("HTTP/1.0 200") || body.starts_with("HTTP/1.1 200"), "{url}: {body:.200}");
    body
}
