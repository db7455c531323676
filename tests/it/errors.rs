//! Every bad input gets its precise status and message, and changes nothing.

use rota::client::{PickOptions, Registration};
use rota::pb::{self, register_request::Msg};
use tonic::Code;

use crate::harness::{TestServer, instance, versioned};

fn bad_instances() -> Vec<(pb::Instance, &'static str)> {
    let ok = || instance("table", "x", 7000);
    vec![
        (pb::Instance { service: String::new(), ..ok() }, "announce.instances[0].service must not be empty"),
        (
            pb::Instance { service: "s".repeat(254), ..ok() },
            "announce.instances[0].service is 254 bytes long; the limit is 253",
        ),
        (
            pb::Instance { service: "bad/name".into(), ..ok() },
            "announce.instances[0].service contains '/'; only [A-Za-z0-9._:-] are allowed",
        ),
        (pb::Instance { host: String::new(), ..ok() }, "announce.instances[0].host must not be empty"),
        (pb::Instance { port: 0, ..ok() }, "announce.instances[0].port must be between 1 and 65535, got 0"),
        (pb::Instance { port: 65536, ..ok() }, "announce.instances[0].port must be between 1 and 65535, got 65536"),
        (
            pb::Instance { metadata: (0..65).map(|i| (format!("k{i}"), String::new())).collect(), ..ok() },
            "announce.instances[0].metadata has 65 entries; the limit is 64",
        ),
        (
            pb::Instance { metadata: [("k".repeat(129), "v".into())].into(), ..ok() },
            "announce.instances[0].metadata[kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk…] key is 129 bytes long; the limit is 128",
        ),
        (
            pb::Instance { metadata: [("k".into(), "v".repeat(513))].into(), ..ok() },
            "announce.instances[0].metadata[k] value is 513 bytes long; the limit is 512",
        ),
        (pb::Instance { status: 9, ..ok() }, "announce.instances[0].status is 9; expected UP, DRAINING or DOWN"),
    ]
}

async fn table(server: &TestServer) -> pb::ListInstancesResponse {
    server.client().await.list_instances("table").await.expect("table is listed")
}

#[tokio::test]
async fn bad_announcements_are_refused_with_their_field_and_limit() {
    let server = TestServer::start().await;
    let mut owner: Registration =
        server.register(vec![instance("table", "a", 1), versioned("table", "v", 2, "v1")]).await;
    let before = table(&server).await;

    for (bad, message) in bad_instances() {
        // On a stream that already owns instances...
        let ack = owner.send(Msg::Announce(pb::Announce { instances: vec![bad.clone()] })).await.unwrap();
        assert!(ack.accepted.is_empty(), "{message}");
        assert_eq!(ack.refused.len(), 1, "{message}");
        assert_eq!((ack.refused[0].code, ack.refused[0].message.as_str()), (Code::InvalidArgument as i32, message));
        // ...and as the first message of a new one.
        let fresh = server.client().await.register(vec![bad]).await.unwrap();
        assert_eq!(fresh.ack().refused[0].message, message);
    }

    let too_many: Vec<pb::Instance> = (0..1001).map(|i| instance("table", &format!("n{i}"), 1 + i)).collect();
    let ack = owner.send(Msg::Announce(pb::Announce { instances: too_many })).await.unwrap();
    assert_eq!(ack.refused.len(), 1001);
    assert_eq!(ack.refused[0].message, "this stream would hold 1001 instances; the limit is 1000");
    // The limit counts the stream's instances, not the message's.
    let almost: Vec<pb::Instance> = (0..999).map(|i| instance("table", &format!("n{i}"), 1 + i)).collect();
    let ack = owner.send(Msg::Announce(pb::Announce { instances: almost })).await.unwrap();
    assert_eq!(ack.refused[0].message, "this stream would hold 1001 instances; the limit is 1000");

    let ack = owner.send(Msg::Announce(pb::Announce { instances: vec![] })).await.unwrap();
    assert_eq!(ack.refused[0].message, "announce.instances must name at least one instance");
    let update = pb::Update {
        instance: Some(pb::InstanceRef { service: "table".into(), id: "a".into() }),
        status: 7,
        ..Default::default()
    };
    let ack = owner.send(Msg::Update(update)).await.unwrap();
    assert_eq!(ack.refused[0].message, "update.status is 7; expected UP, DRAINING or DOWN");

    let after = table(&server).await;
    assert_eq!(after, before, "no refused message changed the table (epoch included)");
}

#[tokio::test]
async fn bad_picks_get_precise_codes_and_leave_rotations_alone() {
    let server = TestServer::start().await;
    let _owner = server.register(vec![instance("table", "a", 1), versioned("table", "v", 2, "v1")]).await;
    let mut client = server.client().await;
    let long = "s".repeat(254);
    let cases: Vec<(&str, PickOptions, Code, &str)> = vec![
        ("", PickOptions::default(), Code::InvalidArgument, "service must not be empty"),
        (&long, PickOptions::default(), Code::InvalidArgument, "service is 254 bytes long; the limit is 253"),
        (
            "a b",
            PickOptions::default(),
            Code::InvalidArgument,
            "service contains ' '; only [A-Za-z0-9._:-] are allowed",
        ),
        (
            "table",
            PickOptions::rule("zigzag"),
            Code::InvalidArgument,
            "rule \"zigzag\" is unknown; known rules: round_robin, random, repeat, weighted, slow_start, response_time, best_available, least_request, availability_filtering, zone_avoidance, consistent_hash, sticky, retry",
        ),
        (
            "table",
            PickOptions::rule("repeat(n=0)"),
            Code::InvalidArgument,
            "rule \"repeat\": parameter \"n\" must be an integer from 1 to 1000000, got \"0\"",
        ),
        (
            "nobody-registered-this",
            PickOptions::default(),
            Code::NotFound,
            "service \"nobody-registered-this\" has never been registered",
        ),
        (
            "table",
            PickOptions::default().exclude(["a"]),
            Code::Unavailable,
            "service \"table\" has no UP instance without a version that is not excluded",
        ),
    ];
    for (service, options, code, message) in cases {
        let error = client.pick(service, options).await.expect_err(message);
        let rota::client::ClientError::Status(status) = error else { panic!("{message}: not a status") };
        assert_eq!((status.code(), status.message()), (code, message));
        let reason = status.metadata().get("rota-error").expect("rota marks its own refusals");
        assert!(!reason.is_empty());
    }
    // None of the refused picks drew a ticket.
    let picked = client.pick("table", PickOptions::default()).await.unwrap();
    assert_eq!(picked.ticket, 0);
}

#[tokio::test]
async fn over_long_versions_zones_and_oversized_leases_are_refused() {
    let server = TestServer::start().await;
    let _owner = server.register(vec![instance("table", "a", 1)]).await;
    let mut client = server.client().await;
    let long = "v".repeat(254);
    let cases = [
        (PickOptions::default().version(&long), "version is 254 bytes long; the limit is 253"),
        (PickOptions::default().zone(&long), "zone is 254 bytes long; the limit is 253"),
    ];
    for (options, message) in cases {
        let error = client.pick("table", options).await.expect_err(message);
        let rota::client::ClientError::Status(status) = error else { panic!("{message}: not a status") };
        assert_eq!((status.code(), status.message()), (Code::InvalidArgument, message));
    }
    let request = client.request(pb::LeaseRequest { service: "table".into(), count: 65_537, ..Default::default() });
    let status = client.balancer().lease(request).await.unwrap_err();
    assert_eq!((status.code(), status.message()), (Code::InvalidArgument, "count is 65537; the limit is 65536"));
    // None of them drew a ticket.
    assert_eq!(client.pick("table", PickOptions::default()).await.unwrap().ticket, 0);
}
