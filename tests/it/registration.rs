//! Registration streams through the gRPC edge: acks, ownership, updates, watches.

use rota::client::{PickOptions, RegistrationEvent};
use rota::pb::{self, register_request::Msg, watch_event::Event};

use crate::harness::{PATIENCE, TestServer, instance, picked_id};

#[tokio::test]
async fn ack_lists_accepted_ids_and_the_heartbeat_timeout() {
    let server = TestServer::start().await;
    let registration = server.register(vec![instance("acks", "", 8080), instance("acks", "named", 8081)]).await;
    let ack = registration.ack();
    let ids: Vec<&str> = ack.accepted.iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["127.0.0.1:8080", "named"], "id defaults to host:port");
    assert_eq!((ack.seq, ack.heartbeat_timeout_ms), (1, 15_000));
    assert!(ack.lease_id > 0);
}

#[tokio::test]
async fn a_second_stream_cannot_take_over_an_owned_id() {
    let server = TestServer::start().await;
    let _owner = server.register(vec![pb::Instance { version: "v1".into(), ..instance("own", "a", 1) }]).await;
    let mut intruder = server
        .client()
        .await
        .register(vec![pb::Instance { version: "v2".into(), ..instance("own", "a", 2) }])
        .await
        .unwrap();
    let ack = intruder.ack().clone();
    assert!(ack.accepted.is_empty());
    assert_eq!(ack.refused.len(), 1);
    assert_eq!(ack.refused[0].code, tonic::Code::AlreadyExists as i32);
    assert_eq!(ack.refused[0].message, "instance \"a\" of service \"own\" is owned by another registration stream");
    // Nor can it withdraw it.
    let withdraw =
        Msg::Withdraw(pb::Withdraw { instances: vec![pb::InstanceRef { service: "own".into(), id: "a".into() }] });
    let ack = intruder.send(withdraw).await.unwrap();
    assert_eq!(ack.refused[0].code, tonic::Code::NotFound as i32);
    assert_eq!(ack.seq, 2);

    let listing = server.client().await.list_instances("own").await.unwrap();
    assert_eq!(listing.instances.len(), 1);
    assert_eq!((listing.instances[0].version.as_str(), listing.instances[0].port), ("v1", 1));
}

#[tokio::test]
async fn draining_instances_get_no_new_picks() {
    let server = TestServer::start().await;
    let mut provider = server.register(vec![instance("drain", "a", 1), instance("drain", "b", 2)]).await;
    let update = pb::Update {
        instance: Some(pb::InstanceRef { service: "drain".into(), id: "a".into() }),
        status: pb::InstanceStatus::Draining.into(),
        ..Default::default()
    };
    let ack = provider.send(Msg::Update(update)).await.unwrap();
    assert_eq!(ack.accepted.len(), 1);
    let mut client = server.client().await;
    for _ in 0..6 {
        assert_eq!(picked_id(&client.pick("drain", PickOptions::default()).await.unwrap()), "b");
    }
    let listing = client.list_instances("drain").await.unwrap();
    assert_eq!(listing.instances[0].status, pb::InstanceStatus::Draining as i32, "still registered");
}

#[tokio::test]
async fn withdraw_removes_at_once_and_close_empties_the_service() {
    let server = TestServer::start().await;
    let mut provider = server.register(vec![instance("wd", "a", 1), instance("wd", "b", 2)]).await;
    let withdraw =
        Msg::Withdraw(pb::Withdraw { instances: vec![pb::InstanceRef { service: "wd".into(), id: "a".into() }] });
    provider.send(withdraw).await.unwrap();
    // The ack is sent after publication, so the very next read sees the change.
    let mut client = server.client().await;
    let ids: Vec<String> = client.list_instances("wd").await.unwrap().instances.into_iter().map(|i| i.id).collect();
    assert_eq!(ids, ["b"]);
    provider.close().await.unwrap();
    assert!(client.list_instances("wd").await.unwrap().instances.is_empty());
    let services = client.list_services().await.unwrap();
    let wd = services.iter().find(|s| s.name == "wd").expect("service stays listed");
    assert_eq!((wd.instances, wd.up), (0, 0));
}

#[tokio::test]
async fn watch_sends_a_snapshot_then_changes() {
    let server = TestServer::start().await;
    let mut client = server.client().await;
    let mut watch = client.watch("watched").await.unwrap();
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.epoch, 0);
    assert!(matches!(first.event, Some(Event::Snapshot(ref list)) if list.instances.is_empty()));

    let mut provider = server.register(vec![instance("watched", "a", 1)]).await;
    let added = watch.message().await.unwrap().unwrap();
    assert!(matches!(added.event, Some(Event::Added(ref i)) if i.id == "a"));
    assert_eq!(added.epoch, 1);

    let update = pb::Update {
        instance: Some(pb::InstanceRef { service: "watched".into(), id: "a".into() }),
        weight: Some(7),
        ..Default::default()
    };
    provider.send(Msg::Update(update)).await.unwrap();
    let updated = watch.message().await.unwrap().unwrap();
    assert!(matches!(updated.event, Some(Event::Updated(ref i)) if i.weight == Some(7)));

    provider.close().await.unwrap();
    let removed = watch.message().await.unwrap().unwrap();
    assert!(matches!(removed.event, Some(Event::Removed(ref r)) if r.id == "a"));
    assert_eq!(removed.epoch, 3);
}

#[tokio::test]
async fn report_counts_known_and_ignores_unknown_instances() {
    let server = TestServer::start().await;
    let _provider = server.register(vec![instance("rep", "a", 1)]).await;
    let mut client = server.client().await;
    let outcome = |service: &str, id: &str| pb::CallOutcome {
        service: service.into(),
        instance_id: id.into(),
        latency_us: 1500,
        result: pb::CallResult::Ok.into(),
        ..Default::default()
    };
    let response =
        client.report(vec![outcome("rep", "a"), outcome("rep", "gone"), outcome("never", "x")]).await.unwrap();
    assert_eq!((response.accepted, response.ignored), (1, 2));
    let bad = pb::CallOutcome { result: 0, ..outcome("rep", "a") };
    let error = client.report(vec![outcome("rep", "a"), bad]).await.unwrap_err();
    assert_eq!(error.code(), Some(tonic::Code::InvalidArgument));
    assert!(error.to_string().contains("outcomes[1].result"), "{error}");
}

/// The ids `service` lists on `server`.
async fn listed(server: &TestServer, service: &str) -> Vec<String> {
    match server.client().await.list_instances(service).await {
        Ok(listing) => listing.instances.into_iter().map(|i| i.id).collect(),
        Err(error) if error.code() == Some(tonic::Code::NotFound) => Vec::new(),
        Err(error) => panic!("listing {service}: {error}"),
    }
}

#[tokio::test]
async fn a_kept_registration_registers_again_after_rota_restarts_and_withdraws_on_close() {
    let first = TestServer::start().await;
    let address = first.server.local_addr();
    let mut kept = first.client().await.keep_registered(vec![instance("kept", "a", 1)]).await.unwrap();
    assert_eq!(kept.ack().accepted.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["a"]);
    let reweigh = |weight| pb::Update {
        instance: Some(pb::InstanceRef { service: "kept".into(), id: "a".into() }),
        weight: Some(weight),
        ..Default::default()
    };
    let ack = kept.update(reweigh(7)).await.expect("an update on the live stream");
    assert_eq!(ack.accepted.len(), 1, "{ack:?}");
    // A rolling restart: the draining rota tells its providers to go (`Closing`) and refuses
    // them until it has stopped.
    first.server.begin_drain().await;
    let lost = tokio::time::timeout(PATIENCE, kept.next_event()).await.expect("the loss is told in time");
    assert!(matches!(&lost, Some(RegistrationEvent::Lost { reason }) if reason.contains("shutting down")), "{lost:?}");
    first.server.stop().await.unwrap();
    let between = kept.update(reweigh(9)).await.expect_err("no stream to send it on");
    assert_eq!(between.code(), Some(tonic::Code::Unavailable), "{between}");

    // A new rota on the same address knows nothing until the registration comes back.
    let second = TestServer::start_with(|config| config.listen = address).await;
    let ack = loop {
        match tokio::time::timeout(PATIENCE, kept.next_event()).await.expect("registered again in time") {
            Some(RegistrationEvent::Registered { ack }) => break ack,
            // Attempts made before the new server listened.
            Some(RegistrationEvent::Retrying { .. }) => continue,
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(ack.accepted.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["a"]);
    assert_eq!(listed(&second, "kept").await, ["a"]);
    let announced = second.client().await.list_instances("kept").await.unwrap().instances;
    assert_eq!(announced[0].weight, Some(7), "announced again with the accepted update, not the refused one");

    let withdrawn = kept.close().await.unwrap().expect("registered when closed");
    assert_eq!(withdrawn.refused, []);
    assert_eq!(listed(&second, "kept").await, Vec::<String>::new(), "withdrawn on close");
}

#[tokio::test]
async fn a_kept_registration_must_be_accepted_whole_the_first_time() {
    let server = TestServer::start().await;
    let _owner = server.register(vec![instance("whole", "a", 1)]).await;
    let mut published = server.server.balancer().registry().changes();
    let client = server.client().await;
    let refused = client
        .keep_registered(vec![instance("whole", "b", 2), instance("whole", "a", 3)])
        .await
        .err()
        .expect("an owned id is refused");
    assert_eq!(refused.code(), Some(tonic::Code::AlreadyExists), "{refused}");
    // The accepted b leaves with the dropped stream, as the registry publishes its end.
    tokio::time::timeout(PATIENCE, async {
        while listed(&server, "whole").await != ["a"] {
            published.changed().await.expect("the registry runs");
        }
    })
    .await
    .expect("b removed in time");
}
