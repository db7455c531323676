//! The start-up warm-up through gRPC: a service not seen yet is `UNAVAILABLE warming_up`, not
//! `NOT_FOUND`, and a Watch of it opens with its instances, not an empty snapshot.

use std::time::Duration;

use rota::client::{ClientError, PickOptions, RotaClient};
use rota::pb;
use tokio_stream::StreamExt;

use crate::harness::{PATIENCE, TestServer, instance, picked_id};

/// A warm-up of `warmup` that serves a seen service at once (no settle period).
async fn warming_up_for(warmup: Duration) -> TestServer {
    TestServer::start_with(|config| {
        config.warmup = Some(warmup);
        config.warmup_settle = Some(Duration::ZERO);
    })
    .await
}

fn reason(error: &ClientError) -> Option<String> {
    match error {
        ClientError::Status(status) => {
            status.metadata().get("rota-error").and_then(|v| v.to_str().ok()).map(str::to_owned)
        }
        _ => None,
    }
}

fn assert_warming_up(error: &ClientError) {
    assert_eq!(error.code(), Some(tonic::Code::Unavailable), "{error}");
    assert_eq!(reason(error).as_deref(), Some("warming_up"), "{error}");
}

#[tokio::test]
async fn during_the_warmup_unseen_services_are_warming_up_and_seen_ones_are_served() {
    let server = warming_up_for(Duration::from_secs(3600)).await;
    let mut client = server.client().await;
    let _provider = server.register(vec![instance("warm-seen", "a", 9001)]).await;

    assert_warming_up(&client.pick("warm-unseen", PickOptions::default()).await.unwrap_err());
    assert_warming_up(&client.list_instances("warm-unseen").await.unwrap_err());
    let lease = client
        .balancer()
        .lease(pb::LeaseRequest { service: "warm-unseen".into(), count: 4, ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(lease.code(), tonic::Code::Unavailable);
    assert_eq!(lease.metadata().get("rota-error").unwrap(), "warming_up");

    // PickStream answers in the response: the same code, and the message says why.
    let requests = tokio_stream::iter(vec![
        pb::PickRequest { service: "warm-unseen".into(), ..Default::default() },
        pb::PickRequest { service: "warm-seen".into(), ..Default::default() },
    ]);
    let mut responses = client.balancer().pick_stream(requests).await.unwrap().into_inner();
    let first = responses.next().await.unwrap().unwrap();
    let error = first.error.expect("the unseen service is refused");
    assert_eq!(error.code, tonic::Code::Unavailable as i32);
    assert!(error.message.contains("has not seen service \"warm-unseen\" yet"), "{}", error.message);
    let second = responses.next().await.unwrap().unwrap();
    assert_eq!(picked_id(&second), "a");

    // A known service and bad input answer as always.
    assert_eq!(picked_id(&client.pick("warm-seen", PickOptions::default()).await.unwrap()), "a");
    let invalid = client.pick("", PickOptions::default()).await.unwrap_err();
    assert_eq!(invalid.code(), Some(tonic::Code::InvalidArgument));
    assert_eq!(reason(&invalid).as_deref(), Some("invalid_argument"));
}

/// The first instance back after a restart does not take every channel's calls: while a seen
/// service's instances are still arriving (here, the settle period outlasts the test), a lease
/// is held back as `warming_up`, saying why, and the channel rotates over its kept list. A
/// unary pick, a PickStream and a listing are answered: their callers may have no list.
#[tokio::test]
async fn a_service_whose_instances_are_still_arriving_is_held_back_from_leases() {
    let server = TestServer::start_with(|config| {
        config.warmup = Some(Duration::from_secs(3600));
        config.warmup_settle = Some(Duration::from_secs(3600));
    })
    .await;
    let mut client = server.client().await;
    let _provider = server.register(vec![instance("warm-arriving", "a", 9001)]).await;

    let lease = client
        .balancer()
        .lease(pb::LeaseRequest { service: "warm-arriving".into(), count: 4, ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(lease.code(), tonic::Code::Unavailable);
    assert_eq!(lease.metadata().get("rota-error").unwrap(), "warming_up");
    assert!(lease.message().contains("instances of service \"warm-arriving\" are still re-registering"), "{lease:?}");
    assert!(lease.message().contains("none has arrived for 3600000 ms"), "{lease:?}");
    // Bad input is still refused as such, not as warming_up.
    let invalid = client
        .balancer()
        .lease(pb::LeaseRequest { service: "warm-arriving".into(), count: 1_000_000, ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(invalid.code(), tonic::Code::InvalidArgument, "{invalid:?}");

    assert_eq!(picked_id(&client.pick("warm-arriving", PickOptions::default()).await.unwrap()), "a");
    assert_eq!(client.list_instances("warm-arriving").await.unwrap().instances.len(), 1);
    let requests = tokio_stream::iter(vec![pb::PickRequest { service: "warm-arriving".into(), ..Default::default() }]);
    let mut responses = client.balancer().pick_stream(requests).await.unwrap().into_inner();
    assert_eq!(picked_id(&responses.next().await.unwrap().unwrap()), "a");
}

/// A seen service whose instances all left is not "warming up": rota knows it is empty.
#[tokio::test]
async fn a_service_emptied_during_the_warmup_is_unavailable_for_want_of_instances() {
    let server = warming_up_for(Duration::from_secs(3600)).await;
    let mut client = server.client().await;
    let provider = server.register(vec![instance("warm-emptied", "a", 9001)]).await;
    provider.close().await.unwrap();
    let error = client.pick("warm-emptied", PickOptions::default()).await.unwrap_err();
    assert_eq!(error.code(), Some(tonic::Code::Unavailable));
    assert_eq!(reason(&error).as_deref(), Some("no_eligible_instance"), "{error}");
}

#[tokio::test]
async fn a_watch_opened_during_the_warmup_starts_with_the_instances_not_an_empty_snapshot() {
    let server = warming_up_for(Duration::from_secs(3600)).await;
    let mut client = server.client().await;
    // The call returns once the server has accepted the stream, before anything registered.
    let mut watch = client.watch("warm-late").await.unwrap();
    let _provider = server.register(vec![instance("warm-late", "a", 9001)]).await;
    let first = tokio::time::timeout(PATIENCE, watch.message()).await.expect("an event in time").unwrap().unwrap();
    match first.event {
        Some(pb::watch_event::Event::Snapshot(list)) => {
            let ids: Vec<String> = list.instances.into_iter().map(|i| i.id).collect();
            assert_eq!(ids, ["a"]);
        }
        other => panic!("expected the first snapshot, got {other:?}"),
    }
}

/// Without a warm-up the first event of a watch of an unregistered service is the empty
/// snapshot at once: the test above would fail on a server that ignored the warm-up.
#[tokio::test]
async fn without_a_warmup_a_watch_of_an_unseen_service_opens_empty() {
    let server = TestServer::start().await;
    let mut watch = server.client().await.watch("cold-late").await.unwrap();
    let first = tokio::time::timeout(PATIENCE, watch.message()).await.expect("an event in time").unwrap().unwrap();
    assert!(matches!(first.event, Some(pb::watch_event::Event::Snapshot(ref l)) if l.instances.is_empty()));
    let error = server.client().await.pick("cold-late", PickOptions::default()).await.unwrap_err();
    assert_eq!(error.code(), Some(tonic::Code::NotFound));
    assert_eq!(reason(&error).as_deref(), Some("unknown_service"));
}

/// The warm-up ends: a waiting watch then gets its (empty) snapshot, and picks turn NOT_FOUND.
#[tokio::test]
async fn the_warmup_ends() {
    let warmup = Duration::from_millis(300);
    let started = tokio::time::Instant::now();
    let server = warming_up_for(warmup).await;
    let mut client: RotaClient = server.client().await;
    let mut watch = server.client().await.watch("warm-never").await.unwrap();
    let first = tokio::time::timeout(PATIENCE, watch.message()).await.expect("the watch opens after the warm-up");
    let first = first.unwrap().unwrap();
    assert!(matches!(first.event, Some(pb::watch_event::Event::Snapshot(ref l)) if l.instances.is_empty()));
    assert!(started.elapsed() >= warmup, "the empty snapshot came before the warm-up ended");

    let error = client.pick("warm-never-picked", PickOptions::default()).await.unwrap_err();
    assert_eq!(error.code(), Some(tonic::Code::NotFound), "{error}");
    assert_eq!(reason(&error).as_deref(), Some("unknown_service"));
}
