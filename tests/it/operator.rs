//! An operator's word over what providers say: `rota instance drain|disable|enable|weight|clear`
//! through the admin RPC and the CLI, kept until cleared, visible wherever an instance is shown.

use std::collections::BTreeSet;
use std::process::Command;

use rota::client::PickOptions;
use rota::pb;

use crate::harness::{TestServer, instance, picked_id};
use crate::processes::{BIN, serve};

fn action(service: &str, id: &str, action: pb::OverrideAction, weight: u32) -> pb::SetInstanceOverrideRequest {
    pb::SetInstanceOverrideRequest { service: service.into(), id: id.into(), action: action.into(), weight }
}

async fn picked(server: &TestServer, service: &str, rule: &str, n: usize) -> BTreeSet<String> {
    let mut client = server.client().await;
    let mut ids = BTreeSet::new();
    for _ in 0..n {
        ids.insert(picked_id(&client.pick(service, PickOptions::rule(rule)).await.expect("pick")));
    }
    ids
}

async fn listed(server: &TestServer, service: &str, id: &str) -> pb::Instance {
    let list = server.client().await.list_instances(service).await.unwrap();
    list.instances.into_iter().find(|i| i.id == id).expect("listed")
}

#[tokio::test]
async fn a_drained_instance_gets_no_picks_until_enabled_and_shows_why() {
    let server = TestServer::start().await;
    let _held =
        server.register(vec![instance("orders", "a", 1), instance("orders", "b", 2), instance("orders", "c", 3)]).await;
    let mut admin = server.client().await;
    let drained = admin.set_instance_override(action("orders", "b", pb::OverrideAction::Drain, 0)).await.unwrap();
    assert_eq!((drained.status.as_str(), drained.registered), ("drain", true));
    // Every pick after the answer sees it.
    assert_eq!(picked(&server, "orders", "round_robin", 9).await, ["a".to_owned(), "c".to_owned()].into());
    let b = listed(&server, "orders", "b").await;
    assert_eq!(b.status, pb::InstanceStatus::Draining as i32);
    assert_eq!((b.announced_status, b.operator.as_str()), (pb::InstanceStatus::Up as i32, "drain"));
    let mut watch = server.client().await.watch("orders").await.unwrap();
    let first = watch.message().await.unwrap().unwrap();
    let Some(pb::watch_event::Event::Snapshot(snapshot)) = first.event else { panic!("{first:?}") };
    assert!(snapshot.instances.iter().any(|i| i.id == "b" && i.operator == "drain"), "Watch shows it too");

    // Re-weighting stacks on the drain; enabling drops the drain and keeps the weight.
    admin.set_instance_override(action("orders", "a", pb::OverrideAction::Weight, 0)).await.unwrap();
    assert_eq!(picked(&server, "orders", "weighted", 12).await, ["c".to_owned()].into());
    let enabled = admin.set_instance_override(action("orders", "b", pb::OverrideAction::Enable, 0)).await.unwrap();
    assert_eq!((enabled.status.as_str(), enabled.weight), ("", None));
    assert_eq!(picked(&server, "orders", "weighted", 12).await, ["b".to_owned(), "c".to_owned()].into());
    assert_eq!(listed(&server, "orders", "a").await.weight, Some(0));
    let all = admin.list_instance_overrides().await.unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!((all[0].id.as_str(), all[0].weight), ("a", Some(0)));
    admin.set_instance_override(action("orders", "a", pb::OverrideAction::Clear, 0)).await.unwrap();
    assert_eq!(listed(&server, "orders", "a").await.weight, Some(100));
    assert!(admin.list_instance_overrides().await.unwrap().is_empty());
}

#[tokio::test]
async fn an_override_outlives_a_restart_of_its_instance_and_bad_requests_change_nothing() {
    let server = TestServer::start().await;
    let mut admin = server.client().await;
    let early = admin.set_instance_override(action("orders", "late", pb::OverrideAction::Disable, 0)).await.unwrap();
    assert!(!early.registered);
    let held = server.register(vec![instance("orders", "late", 1), instance("orders", "other", 2)]).await;
    assert_eq!(listed(&server, "orders", "late").await.status, pb::InstanceStatus::Down as i32);
    drop(held);
    let _again = server.register(vec![instance("orders", "late", 1), instance("orders", "other", 2)]).await;
    assert_eq!(picked(&server, "orders", "round_robin", 4).await, ["other".to_owned()].into(), "still disabled");

    let cases = [
        (action("bad name", "x", pb::OverrideAction::Drain, 0), tonic::Code::InvalidArgument, "service"),
        (action("orders", "", pb::OverrideAction::Drain, 0), tonic::Code::InvalidArgument, "id"),
        (action("orders", "a/b", pb::OverrideAction::Drain, 0), tonic::Code::InvalidArgument, "id"),
        (action("orders", "x", pb::OverrideAction::Unspecified, 0), tonic::Code::InvalidArgument, "action"),
        (
            pb::SetInstanceOverrideRequest { action: 99, ..action("orders", "x", pb::OverrideAction::Drain, 0) },
            tonic::Code::InvalidArgument,
            "action",
        ),
        (action("orders", "other", pb::OverrideAction::Enable, 0), tonic::Code::NotFound, "no status override"),
        (action("orders", "other", pb::OverrideAction::Clear, 0), tonic::Code::NotFound, "no operator override"),
    ];
    for (request, code, says) in cases {
        let refused = admin.set_instance_override(request.clone()).await.expect_err("refused");
        let rota::client::ClientError::Status(status) = refused else { panic!("{refused:?}") };
        assert_eq!(status.code(), code, "{request:?}: {status:?}");
        assert!(status.message().contains(says), "{request:?}: {}", status.message());
    }
    let all = admin.list_instance_overrides().await.unwrap();
    assert_eq!(all.len(), 1, "the bad requests left nothing: {all:?}");
}

/// Kills the child when dropped.
struct Guard(std::process::Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_cli_drains_and_lists() {
    let server = serve("127.0.0.1:0", &[]);
    let run = |args: &[&str]| Command::new(BIN).args(args).env("ROTA_SERVER", &server.endpoint).output().unwrap();
    let drained = run(&["instance", "drain", "orders", "a"]);
    assert!(drained.status.success(), "{}", String::from_utf8_lossy(&drained.stderr));
    let out = String::from_utf8_lossy(&drained.stdout);
    assert!(out.contains("orders") && out.contains("drain"), "{out}");
    assert!(String::from_utf8_lossy(&drained.stderr).contains("not registered"), "a warning for an unknown id");
    let weighted = run(&["instance", "weight", "orders", "a", "5"]);
    assert!(weighted.status.success());
    let listing = run(&["instance", "overrides"]);
    let out = String::from_utf8_lossy(&listing.stdout);
    assert!(out.contains("drain,weight=5"), "{out}");
    let provider = Command::new(BIN)
        .args(["register", "orders", "127.0.0.1:9", "--id", "a"])
        .env("ROTA_SERVER", &server.endpoint)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut provider = Guard(provider);
    let deadline = std::time::Instant::now() + crate::harness::PATIENCE;
    let shown = loop {
        let ls = run(&["ls", "orders"]);
        let out = String::from_utf8_lossy(&ls.stdout).into_owned();
        if out.contains("operator") || std::time::Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert!(shown.contains("DRAINING") && shown.contains("announced UP; operator drain,weight=5"), "{shown}");
    let _ = provider.0.kill();
    let nothing = run(&["instance", "enable", "orders", "b"]);
    assert_eq!(nothing.status.code(), Some(1), "{}", String::from_utf8_lossy(&nothing.stderr));
    assert!(String::from_utf8_lossy(&nothing.stderr).contains("NOT_FOUND"));
}

#[tokio::test]
async fn an_override_set_through_one_replica_applies_on_the_other_and_so_does_its_clearing() {
    let redis = crate::redis_server::RedisServer::start().await;
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let state = rota::state::StateConfig::parse(&redis.url(), 1, std::time::Duration::from_secs(5)).unwrap();
        replicas.push(TestServer::start_with(|c| c.state = state).await);
    }
    let _held = replicas[0].register(vec![instance("orders", "a", 1), instance("orders", "b", 2)]).await;
    let wait = |replica: usize, status: pb::InstanceStatus, operator: &'static str| {
        let server = &replicas[replica];
        async move {
            let mut last = None;
            let waited = tokio::time::timeout(crate::harness::PATIENCE, async {
                loop {
                    let list =
                        server.client().await.list_instances("orders").await.map(|l| l.instances).unwrap_or_default();
                    let b = list.into_iter().find(|i| i.id == "b");
                    if b.as_ref().is_some_and(|b| b.status == status as i32 && b.operator == operator) {
                        return;
                    }
                    last = b;
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
            })
            .await;
            assert!(waited.is_ok(), "replica {replica}: b stayed {last:?}");
        }
    };
    wait(1, pb::InstanceStatus::Up, "").await;
    let mut admin = replicas[0].client().await;
    admin.set_instance_override(action("orders", "b", pb::OverrideAction::Drain, 0)).await.unwrap();
    wait(1, pb::InstanceStatus::Draining, "drain").await;
    assert_eq!(picked(&replicas[1], "orders", "round_robin", 6).await, ["a".to_owned()].into());
    // Cleared through the other replica: both see it gone.
    let mut other = replicas[1].client().await;
    other.set_instance_override(action("orders", "b", pb::OverrideAction::Clear, 0)).await.unwrap();
    wait(0, pb::InstanceStatus::Up, "").await;
    wait(1, pb::InstanceStatus::Up, "").await;
    // Set while the first replica restarts its view of Redis: a new replica reads it at start.
    other.set_instance_override(action("orders", "b", pb::OverrideAction::Disable, 0)).await.unwrap();
    let state = rota::state::StateConfig::parse(&redis.url(), 1, std::time::Duration::from_secs(5)).unwrap();
    let late = TestServer::start_with(|c| c.state = state).await;
    let overrides = tokio::time::timeout(crate::harness::PATIENCE, async {
        loop {
            let all = late.client().await.list_instance_overrides().await.unwrap();
            if !all.is_empty() {
                return all;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the late replica reads the shared overrides");
    assert_eq!((overrides[0].id.as_str(), overrides[0].status.as_str()), ("b", "disable"));
}
