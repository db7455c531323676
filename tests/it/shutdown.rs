//! Graceful shutdown: health turns NOT_SERVING, providers are told to reconnect elsewhere,
//! picks go on being answered until the server stops.

use rota::client::PickOptions;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::harness::{PATIENCE, TestServer, instance, picked_id};

#[tokio::test]
async fn draining_moves_providers_away_and_keeps_answering_picks() {
    let server = TestServer::start().await;
    let mut provider = server.register(vec![instance("drain", "a", 1), instance("drain", "b", 2)]).await;
    let mut client = server.client().await;
    let channel = tonic::transport::Endpoint::from_shared(server.server.endpoint()).unwrap().connect().await.unwrap();
    let mut health = HealthClient::new(channel);
    let check = |service: &str| HealthCheckRequest { service: service.into() };
    assert_eq!(health.check(check("")).await.unwrap().into_inner().status(), ServingStatus::Serving);
    let admin = server.server.admin_addr().unwrap();
    assert_eq!(crate::admin::get(admin, "/readyz").await.0, 200);

    server.server.begin_drain().await;
    assert_eq!(crate::admin::get(admin, "/readyz").await, (503, "stopping".to_owned()));
    assert_eq!(crate::admin::get(admin, "/metrics").await.0, 200, "metrics stay up during the grace");

    let reason = tokio::time::timeout(PATIENCE, provider.closed()).await.expect("the provider is told");
    assert_eq!(reason, "rota is shutting down; reconnect to another replica and announce again");
    for service in ["", "rota.v1.Balancer", "rota.v1.Registry"] {
        assert_eq!(health.check(check(service)).await.unwrap().into_inner().status(), ServingStatus::NotServing);
    }
    // The stream ended but this replica still answers picks from the instances it had.
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(picked_id(&client.pick("drain", PickOptions::default()).await.expect("picks go on")));
    }
    assert_eq!(seen, ["a", "b", "a", "b"]);
    // New streams are refused at once, so clients go on to another replica without a
    // snapshot-then-close loop.
    let refused = client.watch("drain").await.expect_err("no new watch while draining");
    assert_eq!(refused.code(), Some(tonic::Code::Unavailable));
    assert!(refused.to_string().contains("rota is shutting down; connect to another replica"), "{refused}");
    let refused = client.register(vec![instance("drain", "c", 3)]).await.err().expect("no new registration");
    assert_eq!(refused.code(), Some(tonic::Code::Unavailable));

    server.server.stop().await.unwrap();
    assert!(client.pick("drain", PickOptions::default()).await.is_err(), "stopped for good");
}
