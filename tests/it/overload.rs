//! Memory pressure (`server.max_rss_bytes`): Watch and xDS streams refused, then ended, while
//! picks and registrations go on; readiness and metrics say so. The resident set is a figure
//! the test sets, read by the server's own sampler.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rota::client::{ClientError, PickOptions};
use rota::overload::{Pressure, ResidentSet};
use rota::pb::watch_event::Event;
use tonic::Code;

use crate::admin::get;
use crate::harness::{PATIENCE, TestServer, instance, metrics, picked_id};
use crate::xds::Ads;

const MIB: u64 = 1 << 20;

fn resource_exhausted(error: ClientError) -> String {
    match error {
        ClientError::Status(status) if status.code() == Code::ResourceExhausted => status.message().to_owned(),
        other => panic!("expected RESOURCE_EXHAUSTED, got {other}"),
    }
}

async fn reach(server: &TestServer, level: Pressure) {
    tokio::time::timeout(PATIENCE, server.server.overload().reached(level)).await.expect("pressure level reached");
}

#[tokio::test]
async fn holding_streams_are_refused_then_ended_near_the_memory_limit_while_picks_go_on() {
    let resident = Arc::new(AtomicU64::new(10 * MIB));
    let given = resident.clone();
    let server = TestServer::start_with(|config| {
        config.limits.max_rss_bytes = 100 * MIB;
        config.resident_set = ResidentSet::Given(given);
    })
    .await;
    let admin = server.server.admin_addr().unwrap();
    let _provider = server.register(vec![instance("echo", "a", 1)]).await;
    let mut client = server.client().await;
    let mut open_watch = client.watch("echo").await.unwrap();
    assert!(matches!(open_watch.message().await.unwrap().unwrap().event, Some(Event::Snapshot(_))));
    let mut open_ads = Ads::open(&server, None).await.unwrap();
    open_ads.next().await.unwrap();

    // 95 %: new holding streams are refused with the reason; open ones go on.
    resident.store(95 * MIB, Ordering::Relaxed);
    reach(&server, Pressure::Refusing).await;
    let refused = resource_exhausted(client.watch("echo").await.unwrap_err());
    assert!(refused.contains("95% of its limit of 104857600 (server.max_rss_bytes)"), "{refused}");
    let refused = Ads::open(&server, None).await.err().expect("xDS refused");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("server.max_rss_bytes"), "{refused:?}");
    let _second = server.register(vec![instance("echo", "b", 2)]).await;
    let added = open_watch.message().await.unwrap().unwrap();
    assert!(matches!(added.event, Some(Event::Added(ref i)) if i.id == "b"), "{added:?}");
    assert!(!picked_id(&client.pick("echo", PickOptions::default()).await.unwrap()).is_empty());
    let (code, body) = get(admin, "/readyz").await;
    assert_eq!(code, 200);
    assert!(body.contains("memory refusing"), "{body}");

    // 99 %: the open ones end, each with the reason; picks still answer.
    resident.store(99 * MIB, Ordering::Relaxed);
    reach(&server, Pressure::Shedding).await;
    let ended = tokio::time::timeout(PATIENCE, open_watch.message()).await.unwrap().unwrap_err();
    assert_eq!(ended.code(), Code::ResourceExhausted, "{ended:?}");
    assert!(ended.message().contains("99% of its limit"), "{ended:?}");
    let ended = open_ads.next().await.unwrap_err();
    assert_eq!(ended.code(), Code::ResourceExhausted, "{ended:?}");
    assert!(!picked_id(&client.pick("echo", PickOptions::default()).await.unwrap()).is_empty());
    let page = metrics(&server).await;
    for line in [
        "rota_overload_limit_bytes 104857600",
        "rota_overload_pressure{level=\"shedding\"} 1",
        "rota_overload_streams_total{action=\"refused\"} 2",
        "rota_overload_streams_total{action=\"shed\"} 2",
    ] {
        assert!(page.lines().any(|l| l == line), "{line} missing from\n{page}");
    }

    // Back under 85 %: watches open again.
    resident.store(50 * MIB, Ordering::Relaxed);
    reach(&server, Pressure::Normal).await;
    let mut watch = client.watch("echo").await.unwrap();
    assert!(matches!(watch.message().await.unwrap().unwrap().event, Some(Event::Snapshot(_))));
    assert_eq!(get(admin, "/readyz").await, (200, "ready".to_owned()));
}

#[tokio::test]
async fn without_a_limit_the_resident_set_changes_nothing() {
    let resident = Arc::new(AtomicU64::new(u64::MAX));
    let server = TestServer::start_with(|config| config.resident_set = ResidentSet::Given(resident)).await;
    let mut client = server.client().await;
    let mut watch = client.watch("echo").await.unwrap();
    assert!(matches!(watch.message().await.unwrap().unwrap().event, Some(Event::Snapshot(_))));
    assert!(!metrics(&server).await.contains("rota_overload_"));
}
