//! Clients that never read their answers: the bytes rota holds for them stay inside the
//! per-address and server budgets, other clients are answered, and a client that reads again
//! (or goes away) gives its room back. The clients here are raw HTTP/2 connections whose
//! stream windows are zero, so rota can send them headers but no data.

use std::net::{Ipv4Addr, SocketAddr};

use prost::Message;
use rota::pb;
use rota::soak::rawh2::{RawConnection, read_all, refusal};

use crate::harness::{PATIENCE, TestServer, instance, metrics};

/// A listing of 300 instances with 300 bytes of metadata each: ~110 KB.
const INSTANCES: usize = 300;

fn gauge(metrics: &str, series: &str) -> u64 {
    let line = metrics.lines().find(|l| l.starts_with(&format!("{series} "))).unwrap_or_else(|| panic!("no {series}"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

async fn call(connection: &RawConnection, path: &str, message: impl Message) -> http::Response<h2::RecvStream> {
    tokio::time::timeout(PATIENCE, connection.call(path, &message)).await.expect("headers in time").unwrap()
}

async fn connect(from: Ipv4Addr, server: SocketAddr, window: u32) -> RawConnection {
    RawConnection::open(from, server, window).await.unwrap()
}

fn listing(service: &str) -> pb::ListInstancesRequest {
    pb::ListInstancesRequest { service: service.into() }
}

#[tokio::test]
async fn unread_answers_stay_inside_their_budgets_and_come_back_when_read() {
    let server = TestServer::start_with(|config| {
        config.limits.max_unread_bytes = 400 << 10;
        config.limits.max_unread_bytes_per_peer = 250 << 10;
    })
    .await;
    let fleet = (0..INSTANCES)
        .map(|n| {
            let mut i = instance("big", &format!("i{n:03}"), 1000 + n as u32);
            i.metadata.insert("note".into(), "x".repeat(300));
            i
        })
        .collect();
    let _provider = server.register(fleet).await;
    let addr = server.server.local_addr();
    let listing_bytes = {
        let mut client = server.client().await;
        let full = client.list_instances("big").await.unwrap();
        assert_eq!(full.instances.len(), INSTANCES);
        full.encoded_len() + 5
    };
    assert!((100 << 10..125 << 10).contains(&listing_bytes), "{listing_bytes}");

    // 127.0.0.1 never reads: two listings fit in its 250 KiB, the third is refused at once and
    // names the budget.
    let stuck = connect(Ipv4Addr::LOCALHOST, addr, 0).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let response = call(&stuck, "/rota.v1.Registry/ListInstances", listing("big")).await;
        assert_eq!(refusal(&response), None, "admitted: headers, then data the client does not read");
        held.push(response);
    }
    let refused = call(&stuck, "/rota.v1.Registry/ListInstances", listing("big")).await;
    let (code, message) = refusal(&refused).expect("refused at once with trailers");
    assert_eq!(code, "8", "RESOURCE_EXHAUSTED: {message}");
    assert!(
        message.starts_with(&format!("answers peer 127.0.0.1 has not read yet hold {} bytes;", 2 * listing_bytes)),
        "{message}"
    );
    assert!(message.ends_with("does not fit in its 256000 (server.max_unread_bytes_per_peer)"), "{message}");
    let text = metrics(&server).await;
    assert_eq!(gauge(&text, "rota_unread_bytes"), 2 * listing_bytes as u64);
    assert_eq!(gauge(&text, "rota_unread_refused_total"), 1);

    // A watch on that connection waits for room without building its snapshot.
    let watch = call(&stuck, "/rota.v1.Registry/Watch", pb::WatchRequest { service: "big".into() }).await;
    assert_eq!(refusal(&watch), None);
    assert_eq!(gauge(&metrics(&server).await, "rota_unread_bytes"), 2 * listing_bytes as u64);

    // Another address is answered in full; a third one that does not read either fills the
    // server's budget, so the next listing anyone asks for is refused naming it.
    let reader = connect(Ipv4Addr::new(127, 0, 0, 2), addr, 65_535).await;
    let response = call(&reader, "/rota.v1.Registry/ListInstances", listing("big")).await;
    assert_eq!(tokio::time::timeout(PATIENCE, read_all(response)).await.expect("data in time").unwrap(), listing_bytes);
    let other = connect(Ipv4Addr::new(127, 0, 0, 3), addr, 0).await;
    let other_held = call(&other, "/rota.v1.Registry/ListInstances", listing("big")).await;
    assert_eq!(refusal(&other_held), None);
    let response = call(&reader, "/rota.v1.Registry/ListInstances", listing("big")).await;
    let (code, message) = refusal(&response).expect("refused");
    assert_eq!(code, "8");
    assert!(message.contains("does not fit in the server's 409600 (server.max_unread_bytes)"), "{message}");
    assert_eq!(gauge(&metrics(&server).await, "rota_unread_bytes"), 3 * listing_bytes as u64);

    // The first client goes away: its room comes back, and the other address's listing is
    // all that is still counted.
    drop((stuck, held, watch, refused));
    settles(&server, listing_bytes as u64).await;
    // A client that reads has its answers counted only until it has read them: a listing
    // read in full leaves nothing, a watch's snapshot read in full at most its last byte (given
    // back as soon as the stream is polled again).
    let response = call(&reader, "/rota.v1.Registry/ListInstances", listing("big")).await;
    assert_eq!(tokio::time::timeout(PATIENCE, read_all(response)).await.expect("data in time").unwrap(), listing_bytes);
    assert_eq!(gauge(&metrics(&server).await, "rota_unread_bytes"), listing_bytes as u64);
    let watch = call(&reader, "/rota.v1.Registry/Watch", pb::WatchRequest { service: "big".into() }).await;
    let mut events = watch.into_body();
    let mut snapshot = Vec::new();
    let complete = |s: &[u8]| s.len() >= 5 && s.len() >= 5 + u32::from_be_bytes([s[1], s[2], s[3], s[4]]) as usize;
    while !complete(&snapshot) {
        let chunk = tokio::time::timeout(PATIENCE, events.data()).await.expect("snapshot in time").unwrap().unwrap();
        events.flow_control().release_capacity(chunk.len()).unwrap();
        snapshot.extend_from_slice(&chunk);
    }
    let event = pb::WatchEvent::decode(&snapshot[5..]).unwrap();
    assert_eq!(snapshot.len(), 5 + event.encoded_len(), "one event");
    let Some(pb::watch_event::Event::Snapshot(list)) = event.event else { panic!("a snapshot first") };
    assert_eq!(list.instances.len(), INSTANCES);
    settles_within(&server, listing_bytes as u64..=listing_bytes as u64 + 1).await;
    // Closing the rest gives everything back.
    drop((events, other, other_held));
    settles(&server, 0).await;
}

/// Waits until rota counts `bytes` of unread answers.
async fn settles(server: &TestServer, bytes: u64) {
    settles_within(server, bytes..=bytes).await;
}

/// Waits until rota counts a number of unread answer bytes in `bytes`.
async fn settles_within(server: &TestServer, bytes: std::ops::RangeInclusive<u64>) {
    let mut last = u64::MAX;
    let settled = tokio::time::timeout(PATIENCE, async {
        loop {
            last = gauge(&metrics(server).await, "rota_unread_bytes");
            if bytes.contains(&last) {
                return;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(settled.is_ok(), "rota_unread_bytes stayed at {last}, not in {bytes:?}");
}
