//! Replicas that agree behind a slow Redis: with every Redis round trip costing 100 or 200 ms
//! (a loopback proxy holding each chunk for half of it each way), every change made on one
//! replica reaches another within [`bound`], and an instance whose withdrawal one replica
//! acknowledged is no longer picked on another once that bound has passed.

use std::collections::BTreeMap;
use std::time::Duration;

use rota::client::PickOptions;
use rota::pb;
use rota::state::StateConfig;
use tokio::time::Instant;

use crate::admin::get;
use crate::harness::{PATIENCE, TestServer, instance, metrics, picked_id};
use crate::redis_server::{LatencyProxy, RedisServer};

/// Changes made on replica 0 in the change test.
const CHANGES: u32 = 20;
/// Instances replica 0 withdraws, one at a time, in the withdrawal test.
const WITHDRAWALS: usize = 5;
/// Picks made on replica 1 in the withdrawal test, at most.
const MAX_PICKS: usize = 2000;

/// What rota promises of a change made on one replica: the others hold it within three round
/// trips to Redis plus 100 ms (the figures of docs/deploy.md), here with 200 ms of slack for
/// a test machine shared with other builds.
fn bound(round_trip: Duration) -> Duration {
    round_trip * 3 + Duration::from_millis(300)
}

/// A replica whose Redis is `round_trip` away, once its link is up; and its proxy.
async fn far_replica(redis: &RedisServer, round_trip: Duration) -> (TestServer, LatencyProxy) {
    far_replica_limited(redis, round_trip, rota::replicas::lag::DEFAULT_LAG_LIMIT).await
}

/// The same, with the propagation lag limit `lag_limit`.
async fn far_replica_limited(
    redis: &RedisServer,
    round_trip: Duration,
    lag_limit: Duration,
) -> (TestServer, LatencyProxy) {
    let proxy = LatencyProxy::start(redis.port, round_trip / 2).await;
    // A command timeout well above the round trip: these tests are about lag, not outages.
    let mut state = StateConfig::parse(&format!("redis://127.0.0.1:{}", proxy.port), 1, Duration::from_secs(3))
        .expect("a valid state address");
    if let StateConfig::Redis(redis) = &mut state {
        redis.lag_limit = lag_limit;
    }
    let server = TestServer::start_with(|config| config.state = state).await;
    let mut link = server.server.balancer().state().link().expect("a Redis-backed replica").watch();
    tokio::time::timeout(PATIENCE, link.wait_for(|up| *up)).await.expect("the link came up").expect("link kept");
    (server, proxy)
}

fn weight_update(service: &str, id: &str, weight: u32) -> pb::register_request::Msg {
    pb::register_request::Msg::Update(pb::Update {
        instance: Some(pb::InstanceRef { service: service.into(), id: id.into() }),
        weight: Some(weight),
        ..Default::default()
    })
}

/// Replica 0 changes one instance's weight `CHANGES` times, the next change once replica 1
/// holds the one before last (two in flight at a time); replica 1 must hold each change, or a
/// later one, within the bound of its acknowledgement on replica 0.
async fn every_change_arrives_within_the_bound(round_trip: Duration) {
    let redis = RedisServer::start().await;
    let ((zero, _p0), (one, _p1)) = (far_replica(&redis, round_trip).await, far_replica(&redis, round_trip).await);
    let mut provider = zero.register(vec![pb::Instance { weight: Some(1000), ..instance("lagged", "w", 1) }]).await;
    let mut snapshots = one.server.balancer().registry().subscribe("lagged").await.expect("registry runs");
    let weight = |s: &rota::registry::ServiceSnapshot| s.instances.first().map_or(0, |i| i.weight);
    tokio::time::timeout(PATIENCE, snapshots.wait_for(|s| weight(s) == 1000))
        .await
        .expect("replica 1 holds the instance")
        .expect("registry runs");
    let (held, mut holds) = tokio::sync::watch::channel(0u32);
    // When replica 1 first held each weight.
    let observe = async {
        let mut first = BTreeMap::new();
        while *held.borrow() < CHANGES {
            snapshots.changed().await.expect("registry runs");
            let now = weight(&snapshots.borrow_and_update()) % 1000;
            first.entry(now).or_insert_with(Instant::now);
            held.send_replace(now);
        }
        first
    };
    let change = async {
        let mut acked = Vec::new();
        for n in 1..=CHANGES {
            holds.wait_for(|held| *held + 2 >= n).await.expect("observer runs");
            let ack = provider.send(weight_update("lagged", "w", 1000 + n)).await.expect("update");
            assert_eq!(ack.accepted.len(), 1, "update {n} accepted");
            acked.push(Instant::now());
        }
        acked
    };
    let (first, acked) = tokio::time::timeout(PATIENCE * 3, async { tokio::join!(observe, change) })
        .await
        .unwrap_or_else(|_| panic!("replica 1 did not follow all {CHANGES} changes"));
    let mut lags = Vec::new();
    for (n, acked) in (1..=CHANGES).zip(acked) {
        let arrived = first.range(n..).map(|(_, at)| *at).min().expect("the last change was seen");
        lags.push(arrived.saturating_duration_since(acked));
    }
    let over: Vec<_> = lags.iter().enumerate().filter(|(_, lag)| **lag > bound(round_trip)).collect();
    assert!(
        over.is_empty(),
        "changes over the {:?} bound at {round_trip:?}: {over:?} (all: {lags:?})",
        bound(round_trip)
    );
}

/// Replica 0 withdraws its instances one at a time; replica 1 drops each within the bound of
/// its acknowledgement, and from the bound after the last one on, never picks it.
async fn a_withdrawal_is_not_picked_after_the_bound(round_trip: Duration) {
    let redis = RedisServer::start().await;
    let ((zero, _p0), (one, _p1)) = (far_replica(&redis, round_trip).await, far_replica(&redis, round_trip).await);
    let _kept = one.register(vec![instance("withdrawn", "kept", 1)]).await;
    let ids: Vec<String> = (0..WITHDRAWALS).map(|n| format!("gone-{n}")).collect();
    let mut provider =
        zero.register(ids.iter().zip(2..).map(|(id, port)| instance("withdrawn", id, port)).collect()).await;
    let mut snapshots = one.server.balancer().registry().subscribe("withdrawn").await.expect("registry runs");
    let holds = |s: &rota::registry::ServiceSnapshot, id: &str| s.instances.iter().any(|i| &*i.id == id);
    tokio::time::timeout(PATIENCE, snapshots.wait_for(|s| s.instances.len() == ids.len() + 1))
        .await
        .expect("replica 1 holds them all")
        .expect("registry runs");
    let mut lags = Vec::new();
    let mut deadline = Instant::now();
    for id in &ids {
        let withdraw =
            pb::Withdraw { instances: vec![pb::InstanceRef { service: "withdrawn".into(), id: id.clone() }] };
        let ack = provider.send(pb::register_request::Msg::Withdraw(withdraw)).await.expect("withdraw");
        assert_eq!(ack.accepted.len(), 1, "withdrawal of {id} acknowledged");
        let acked = Instant::now();
        deadline = acked + bound(round_trip);
        tokio::time::timeout(PATIENCE, snapshots.wait_for(|s| !holds(s, id)))
            .await
            .unwrap_or_else(|_| panic!("replica 1 never dropped {id}"))
            .expect("registry runs");
        lags.push(acked.elapsed());
    }
    let over: Vec<_> = lags.iter().filter(|lag| **lag > bound(round_trip)).collect();
    assert!(over.is_empty(), "withdrawals over the {:?} bound at {round_trip:?}: {lags:?}", bound(round_trip));
    // Picks on replica 1 from the last withdrawal's deadline on never answer it.
    let last = ids.last().expect("withdrawals");
    let mut client = one.client().await;
    let (mut late, mut after) = (Vec::new(), 0);
    for _ in 0..MAX_PICKS {
        let sent = Instant::now();
        if sent > deadline + bound(round_trip) {
            break;
        }
        let picked =
            picked_id(&client.pick("withdrawn", PickOptions::rule("random")).await.expect("pick").into_response());
        if sent > deadline {
            after += 1;
            if picked == *last {
                late.push(sent - deadline);
            }
        }
    }
    assert!(after > 0, "no pick was made after the bound");
    assert!(late.is_empty(), "{last} was picked on replica 1 after the {:?} bound, by {late:?}", bound(round_trip));
}

#[tokio::test]
async fn at_100_ms_a_round_trip_every_change_reaches_the_other_replica_within_the_bound() {
    every_change_arrives_within_the_bound(Duration::from_millis(100)).await;
}

#[tokio::test]
async fn at_200_ms_a_round_trip_every_change_reaches_the_other_replica_within_the_bound() {
    every_change_arrives_within_the_bound(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn at_100_ms_a_round_trip_a_withdrawn_instance_is_not_picked_elsewhere_after_the_bound() {
    a_withdrawal_is_not_picked_after_the_bound(Duration::from_millis(100)).await;
}

#[tokio::test]
async fn at_200_ms_a_round_trip_a_withdrawn_instance_is_not_picked_elsewhere_after_the_bound() {
    a_withdrawal_is_not_picked_after_the_bound(Duration::from_millis(200)).await;
}

/// A replica whose copy of another's instances arrives later than its lag limit says so in
/// `/readyz` (still 200: it answers) and shows the lag in `/metrics`; the other, which copied
/// nothing late, is plainly ready.
#[tokio::test]
async fn a_replica_whose_copies_arrive_past_its_lag_limit_reports_the_replicas_diverged() {
    let redis = RedisServer::start().await;
    let round_trip = Duration::from_millis(100);
    let (zero, _p0) = far_replica(&redis, round_trip).await;
    // No change can cross a 100 ms round trip within 10 ms.
    let (one, _p1) = far_replica_limited(&redis, round_trip, Duration::from_millis(10)).await;
    let _a = zero.register(vec![instance("diverged", "a", 1)]).await;
    let mut snapshots = one.server.balancer().registry().subscribe("diverged").await.expect("registry runs");
    tokio::time::timeout(PATIENCE, snapshots.wait_for(|s| s.instances.len() == 1))
        .await
        .expect("replica 1 holds the instance")
        .expect("registry runs");
    let admin = |server: &TestServer| server.server.admin_addr().expect("an admin listener");
    let (status, body) = get(admin(&one), "/readyz").await;
    assert_eq!(status, 200, "a lagging replica still answers: {body}");
    assert!(body.starts_with("ready (degraded: replicas diverged: a change from replica "), "{body}");
    assert!(body.contains("over the 10 ms limit"), "{body}");
    let page = metrics(&one).await;
    let lag: f64 = page
        .lines()
        .find_map(|l| l.strip_prefix("rota_replica_propagation_lag_seconds{replica=\""))
        .and_then(|l| l.split_once("\"} "))
        .and_then(|(_, value)| value.parse().ok())
        .unwrap_or_else(|| panic!("no propagation lag in /metrics: {page}"));
    assert!(lag >= 0.01, "the lag shown is the one over the limit: {lag}");
    assert!(page.contains("rota_replica_propagation_lag_limit_seconds 0.01"), "{page}");
    assert_eq!(get(admin(&zero), "/readyz").await, (200, "ready".to_owned()));
}
