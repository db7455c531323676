//! What a hostile or careless client can no longer do: grow memory or the metrics with made-up
//! names, hold connections without speaking, open streams without bound, or lose a provider
//! the reason its stream was ended.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use rota::client::PickOptions;
use rota::listener::ConnectionLimits;
use tokio::io::AsyncReadExt;
use tokio::net::{TcpSocket, TcpStream};

use crate::harness::{PATIENCE, TestServer, instance, metrics};

fn value(metrics: &str, series: &str) -> u64 {
    let line = metrics.lines().find(|l| l.starts_with(series)).unwrap_or_else(|| panic!("no {series}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

#[tokio::test]
async fn made_up_service_names_never_become_metric_labels() {
    let server = TestServer::start().await;
    let _orders = server.register(vec![instance("orders", "a", 1)]).await;
    let mut client = server.client().await;
    let junk = "j".repeat(1 << 20);
    for n in 0..20 {
        let error = client.pick(&format!("{junk}{n}"), PickOptions::rule("no-such-rule")).await.unwrap_err();
        assert_eq!(error.code(), Some(tonic::Code::InvalidArgument));
    }
    for n in 0..1100 {
        let error = client.pick(&format!("nobody-{n}"), PickOptions::rule("round_robin")).await.unwrap_err();
        assert_eq!(error.code(), Some(tonic::Code::NotFound));
    }
    client.pick("orders", PickOptions::rule("round_robin")).await.unwrap();
    let text = metrics(&server).await;
    assert!(text.len() < 64 << 10, "/metrics stays small: {} bytes", text.len());
    let picks: Vec<&str> = text.lines().filter(|l| l.starts_with("rota_picks_total{")).collect();
    assert_eq!(
        picks,
        [
            r#"rota_picks_total{service="_unknown",rule="_unresolved",result="invalid_argument"} 20"#,
            r#"rota_picks_total{service="_unknown",rule="round_robin",result="not_found"} 1100"#,
            r#"rota_picks_total{service="orders",rule="round_robin",result="ok"} 1"#,
        ]
    );
}

#[tokio::test]
async fn a_register_stream_ended_by_a_bad_message_says_why() {
    let server = TestServer::start_with(|config| config.limits.max_message_bytes = 1024).await;
    let mut oversized = instance("orders", "a", 1);
    oversized.metadata =
        (0..8).map(|n| (format!("k{n}"), "v".repeat(400))).collect::<BTreeMap<_, _>>().into_iter().collect();
    let error = match server.client().await.register(vec![oversized]).await {
        Ok(_) => panic!("an oversized announce is not accepted"),
        Err(error) => error,
    };
    assert_eq!(error.code(), Some(tonic::Code::OutOfRange), "{error}");
    assert!(error.to_string().contains("message length too large"), "{error}");
    // The stream's end changed nothing.
    let error = server.client().await.pick("orders", PickOptions::default()).await.unwrap_err();
    assert_eq!(error.code(), Some(tonic::Code::NotFound));
}

/// Watches cannot take the places kept for registrations, nor more than one address's share.
#[tokio::test]
async fn a_flood_of_watches_leaves_registrations_their_places() {
    let server = TestServer::start_with(|config| {
        config.limits.max_open_streams = 10;
        config.limits.consumer_streams_per_peer = 6;
    })
    .await;
    let mut watches = Vec::new();
    for i in 0..6 {
        watches.push(server.client().await.watch(&format!("w{i}")).await.unwrap());
    }
    let refused = server.client().await.watch("w6").await.unwrap_err();
    assert_eq!(refused.code(), Some(tonic::Code::ResourceExhausted));
    assert!(
        refused.to_string().contains(
            "peer 127.0.0.1 already holds 6 Watch and PickStream streams; the limit is 6 (server.max_consumer_streams_per_peer)"
        ),
        "{refused}"
    );
    let mut client = server.client().await;
    let refused =
        client.balancer().pick_stream(tokio_stream::iter(Vec::<rota::pb::PickRequest>::new())).await.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "a pick stream is one of the address's consumer streams"
    );
    // Registrations still get in, up to the whole cap: four places are left for them.
    let mut providers = Vec::new();
    for i in 0..4 {
        providers.push(server.register(vec![instance("flood", &format!("p{i}"), 1000 + i)]).await);
    }
    let refused = server.client().await.register(vec![instance("flood", "p9", 1999)]).await.err().expect("refused");
    assert!(refused.to_string().contains("the limit is 10 (server.max_open_streams)"), "{refused}");
}

#[tokio::test]
async fn consumers_take_at_most_four_fifths_of_the_open_streams() {
    let server = TestServer::start_with(|config| config.limits.max_open_streams = 5).await;
    let mut watches = Vec::new();
    for i in 0..4 {
        watches.push(server.client().await.watch(&format!("w{i}")).await.unwrap());
    }
    let refused = server.client().await.watch("w4").await.unwrap_err();
    assert_eq!(refused.code(), Some(tonic::Code::ResourceExhausted));
    assert!(refused.to_string().contains("Watch and PickStream may take 4 of the 5"), "{refused}");
    let provider = server.register(vec![instance("kept", "a", 1)]).await;
    provider.require_all_accepted().unwrap();
}

#[tokio::test]
async fn open_streams_are_capped_across_connections() {
    let server = TestServer::start_with(|config| config.limits.max_open_streams = 2).await;
    let watch = |name: &'static str| {
        let server = &server;
        async move {
            let mut client = server.client().await;
            client.watch(name).await
        }
    };
    let first = watch("a").await.unwrap();
    let _second = watch("b").await.unwrap();
    let refused = watch("c").await.unwrap_err();
    assert_eq!(refused.code(), Some(tonic::Code::ResourceExhausted));
    assert!(refused.to_string().contains("the limit is 2 (server.max_open_streams)"), "{refused}");
    let text = metrics(&server).await;
    assert_eq!(value(&text, "rota_open_streams "), 2);
    assert_eq!(value(&text, "rota_streams_refused_total "), 1);
    drop(first);
    // The ended stream's place comes back (its task notices the client left).
    tokio::time::timeout(PATIENCE, async {
        loop {
            if watch("c").await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("a freed place is taken again");
}

async fn connect_from(ip: Ipv4Addr, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(ip.into(), 0)).unwrap();
    socket.connect(to).await.unwrap()
}

/// Resolves when the server closes the connection.
async fn closed(mut stream: TcpStream) {
    let mut buf = [0u8; 64];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

#[tokio::test]
async fn silent_connections_fill_only_their_peers_share_and_are_closed_at_the_handshake_timeout() {
    let limits = ConnectionLimits {
        max_connections_per_peer: 8,
        handshake_timeout: Duration::from_millis(500),
        ..Default::default()
    };
    let server = TestServer::start_with(|config| config.limits.connections = limits).await;
    let _orders = server.register(vec![instance("orders", "a", 1)]).await;
    let addr = server.server.local_addr();
    // 20 connections from one address that never send a byte.
    let mut silent = Vec::new();
    for _ in 0..20 {
        silent.push(connect_from(Ipv4Addr::new(127, 0, 0, 2), addr).await);
    }
    // Everyone else is still served.
    let picked =
        tokio::time::timeout(PATIENCE, async { server.client().await.pick("orders", PickOptions::default()).await })
            .await
            .expect("answered while the silent peer holds its share");
    assert!(picked.is_ok());
    // Every silent connection is closed: 12 at once (over the peer's cap), 8 at the timeout.
    tokio::time::timeout(PATIENCE, futures_util::future::join_all(silent.into_iter().map(closed)))
        .await
        .expect("silent connections are closed");
    let text = metrics(&server).await;
    assert_eq!(value(&text, "rota_connections_refused_total{cap=\"per_peer\"}"), 12);
    assert_eq!(value(&text, "rota_connections_closed_total{reason=\"handshake_timeout\"}"), 8);
}

/// A request with large headers (here 100 KiB of metadata, in several CONTINUATION frames) is
/// handled on its own stream; the connection, and the registration sharing it, live on.
#[tokio::test]
async fn large_request_headers_cost_only_their_own_stream() {
    let server = TestServer::start().await;
    let channel = tonic::transport::Endpoint::from_shared(server.server.endpoint()).unwrap().connect().await.unwrap();
    let mut client = rota::client::RotaClient::from_channel(channel.clone());
    let mut registration = client.register(vec![instance("orders", "a", 1)]).await.unwrap();

    let mut request = tonic::Request::new(rota::pb::PickRequest { service: "orders".into(), ..Default::default() });
    request.metadata_mut().insert("x-large", "v".repeat(100 << 10).parse().unwrap());
    let picked = rota::client::RotaClient::from_channel(channel).balancer().pick(request).await;
    assert!(picked.is_ok(), "{picked:?}");

    let update = rota::pb::register_request::Msg::Update(rota::pb::Update {
        instance: Some(rota::pb::InstanceRef { service: "orders".into(), id: "a".into() }),
        weight: Some(7),
        ..Default::default()
    });
    let ack = registration.send(update).await.expect("the registration's stream is still open");
    assert_eq!(ack.accepted.len(), 1);
}
