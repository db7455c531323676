//! Sessions against a live registry and hub, on paused time.

use std::time::Duration;

use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use envoy_types::pb::google::rpc;
use prost::Message;

use super::*;
use crate::balancer::Balancer;
use crate::budget::OverBudget;
use crate::registry::{InstanceRef, InstanceSpec, Lease, Registry, RegistryConfig};
use crate::xds::XdsLimits;
use crate::xds::hub::TooManySubscriptions;
use crate::xds::resources::{CLUSTER_TYPE, ENDPOINT_TYPE, LISTENER_TYPE};

fn spec(id: &str, version: &str) -> InstanceSpec {
    InstanceSpec {
        id: id.into(),
        service: "echo".into(),
        host: "127.0.0.1".into(),
        port: 80,
        version: version.into(),
        ..Default::default()
    }
}

async fn hub_with(specs: Vec<InstanceSpec>, limits: XdsLimits, warmup: Duration) -> (Arc<Hub>, Lease) {
    let registry = Registry::spawn(RegistryConfig::default());
    let lease = registry.open_lease();
    if !specs.is_empty() {
        let outcome = lease.announce(specs).await.unwrap();
        assert!(outcome.refused.is_empty(), "{outcome:?}");
    }
    // The server's default settle period: a fifth of the warm-up.
    let overview = crate::balancer::Overview::new(Arc::new(Balancer::with_defaults(registry)));
    let hub = Hub::new(overview, limits, warmup, warmup / 5);
    (hub, lease)
}

fn ask(type_url: &str, names: &[&str], nonce: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        type_url: type_url.to_string(),
        resource_names: names.iter().map(|n| n.to_string()).collect(),
        response_nonce: nonce.to_string(),
        ..Default::default()
    }
}

fn endpoint_ids(response: &DiscoveryResponse) -> Vec<String> {
    let assignment = ClusterLoadAssignment::decode(&*response.resources[0].value).unwrap();
    let mut ids: Vec<String> = assignment
        .endpoints
        .iter()
        .flat_map(|l| &l.lb_endpoints)
        .map(|e| match &e.host_identifier {
            Some(envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier::Endpoint(ep)) => {
                ep.hostname.clone()
            }
            _ => String::new(),
        })
        .collect();
    ids.sort();
    ids
}

#[tokio::test(start_paused = true)]
async fn a_subscription_is_answered_once_and_again_only_when_its_resources_change() {
    let (hub, lease) =
        hub_with(vec![spec("echo-a", ""), spec("echo-b", "")], XdsLimits::default(), Duration::ZERO).await;
    let mut session = Session::new(hub.clone(), None);
    session.on_request(ask(ENDPOINT_TYPE, &["echo"], "")).unwrap();
    let first = session.responses();
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].type_url, ENDPOINT_TYPE);
    assert_eq!(endpoint_ids(&first[0]), ["echo-a", "echo-b"]);
    // The ACK changes nothing; nothing is due.
    session.on_request(ask(ENDPOINT_TYPE, &["echo"], &first[0].nonce)).unwrap();
    assert!(session.responses().is_empty());
    assert_eq!(hub.counters.acks.load(Ordering::Relaxed), 1);

    // A withdrawal: the hub rebuilds once, and the session sends the new assignment.
    lease.withdraw(vec![InstanceRef { service: "echo".into(), id: "echo-b".into() }]).await.unwrap();
    hub.refresh();
    let next = session.responses();
    assert_eq!(next.len(), 1);
    assert_eq!(endpoint_ids(&next[0]), ["echo-a"]);
    assert_ne!(next[0].version_info, first[0].version_info);
    assert_ne!(next[0].nonce, first[0].nonce);
    // A refresh with nothing changed builds nothing and sends nothing.
    let builds = hub.counters.builds.load(Ordering::Relaxed);
    hub.refresh();
    assert_eq!(hub.counters.builds.load(Ordering::Relaxed), builds);
    assert!(session.responses().is_empty());
}

#[tokio::test(start_paused = true)]
async fn many_sessions_share_one_build_per_change() {
    let (hub, lease) = hub_with(vec![spec("echo-a", "")], XdsLimits::default(), Duration::ZERO).await;
    let mut sessions: Vec<Session> = (0..50).map(|_| Session::new(hub.clone(), None)).collect();
    for session in &mut sessions {
        session.on_request(ask(CLUSTER_TYPE, &["echo", "echo/none"], "")).unwrap();
        assert_eq!(session.responses()[0].resources.len(), 2);
    }
    assert_eq!(hub.counters.builds.load(Ordering::Relaxed), 1);
    lease.announce(vec![spec("echo-b", "")]).await.unwrap();
    hub.refresh();
    assert_eq!(hub.counters.builds.load(Ordering::Relaxed), 2);
    assert_eq!(hub.counters.subscriptions.load(Ordering::Relaxed), 50, "one service per session");
    drop(sessions);
    assert_eq!(hub.counters.subscriptions.load(Ordering::Relaxed), 0);
    assert_eq!(hub.counters.streams.load(Ordering::Relaxed), 0);
}

#[tokio::test(start_paused = true)]
async fn unknown_names_and_services_are_answered_as_absent() {
    let (hub, _lease) = hub_with(vec![spec("echo-a", "")], XdsLimits::default(), Duration::ZERO).await;
    let mut session = Session::new(hub.clone(), None);
    session.on_request(ask(LISTENER_TYPE, &["echo", "nobody", "not a name!", "echo/any"], "")).unwrap();
    let response = session.responses();
    assert_eq!(response.len(), 1);
    assert_eq!(response[0].resources.len(), 1, "only echo's listener exists");
    // A type rota does not serve is ignored and counted.
    session.on_request(ask("type.googleapis.com/nothing.Here", &["x"], "")).unwrap();
    assert!(session.responses().is_empty());
    assert_eq!(hub.counters.unknown_types.load(Ordering::Relaxed), 1);
}

#[tokio::test(start_paused = true)]
async fn a_nack_is_counted_and_nothing_is_resent_for_it() {
    let (hub, _lease) = hub_with(vec![spec("echo-a", "")], XdsLimits::default(), Duration::ZERO).await;
    let mut session = Session::new(hub.clone(), None);
    session.on_request(ask(CLUSTER_TYPE, &["echo"], "")).unwrap();
    let sent = session.responses();
    for _ in 0..100 {
        let mut nack = ask(CLUSTER_TYPE, &["echo"], &sent[0].nonce);
        nack.error_detail = Some(rpc::Status { code: 3, message: "no".into(), details: vec![] });
        session.on_request(nack).unwrap();
        assert!(session.responses().is_empty());
    }
    assert_eq!(hub.counters.nacks.load(Ordering::Relaxed), 100);
    // A stale nonce is neither an ACK nor a NACK.
    session.on_request(ask(CLUSTER_TYPE, &["echo"], "999")).unwrap();
    assert_eq!(hub.counters.acks.load(Ordering::Relaxed), 0);
}

#[tokio::test(start_paused = true)]
async fn bounds_refuse_and_change_nothing() {
    let limits = XdsLimits { max_names_per_stream: 3, max_subscriptions: 4, ..XdsLimits::default() };
    let (hub, _lease) = hub_with(vec![spec("echo-a", "")], limits, Duration::ZERO).await;
    let mut session = Session::new(hub.clone(), None);
    let refused = session.on_request(ask(CLUSTER_TYPE, &["a", "b", "c", "d"], "")).unwrap_err();
    assert_eq!(refused, StreamRefused::TooManyNames { kind: "cluster", count: 4, limit: 3 });
    let long = "x".repeat(MAX_NAME_BYTES + 1);
    assert_eq!(
        session.on_request(ask(CLUSTER_TYPE, &[&long], "")).unwrap_err(),
        StreamRefused::NameTooLong { len: MAX_NAME_BYTES + 1 }
    );
    // Names that together pass the bytes a stream may hold (each within bounds, in two types).
    let big = XdsLimits { max_names_per_stream: 1000, max_subscriptions: 100_000, ..XdsLimits::default() };
    let (roomy, _lease2) = hub_with(vec![], big, Duration::ZERO).await;
    let mut hoarder = Session::new(roomy.clone(), None);
    let names: Vec<String> = (0..600).map(|i| format!("{i:0>500}")).collect();
    let half: Vec<&str> = names[..300].iter().map(String::as_str).collect();
    hoarder.on_request(ask(CLUSTER_TYPE, &half, "")).unwrap();
    let held = roomy.counters.subscriptions.load(Ordering::Relaxed);
    let rest: Vec<&str> = names[300..].iter().map(String::as_str).collect();
    let refused = hoarder.on_request(ask(LISTENER_TYPE, &rest, "")).unwrap_err();
    assert!(matches!(refused, StreamRefused::NamesTooLarge { .. }), "{refused:?}");
    assert_eq!(roomy.counters.subscriptions.load(Ordering::Relaxed), held, "the refused request changed nothing");
    assert!(hoarder.responses().iter().all(|r| r.type_url == CLUSTER_TYPE), "no listener subscription was taken");

    session.on_request(ask(CLUSTER_TYPE, &["s1", "s2", "s3"], "")).unwrap();
    let mut other = Session::new(hub.clone(), None);
    other.on_request(ask(LISTENER_TYPE, &["s4"], "")).unwrap();
    // A fifth service across both streams passes the total.
    let refused = other.on_request(ask(LISTENER_TYPE, &["s4", "s5"], "")).unwrap_err();
    assert!(matches!(refused, StreamRefused::TooManySubscriptions(_)), "{refused:?}");
    assert_eq!(hub.counters.subscriptions.load(Ordering::Relaxed), 4, "the refused request changed nothing");
    // Replacing names within the bound is fine: s4 → s5.
    other.on_request(ask(LISTENER_TYPE, &["s5"], "")).unwrap();
    assert_eq!(hub.counters.subscriptions.load(Ordering::Relaxed), 4);
}

#[tokio::test(start_paused = true)]
async fn during_the_warmup_a_service_not_seen_yet_is_withheld_not_absent() {
    let (hub, lease) = hub_with(vec![], XdsLimits::default(), Duration::from_secs(10)).await;
    let mut session = Session::new(hub.clone(), None);
    session.on_request(ask(LISTENER_TYPE, &["echo"], "")).unwrap();
    assert!(session.responses().is_empty(), "withheld: the client keeps what it had");
    // The first instance back does not open the service: its peers are still arriving.
    lease.announce(vec![spec("echo-a", "")]).await.unwrap();
    hub.refresh();
    assert!(session.responses().is_empty(), "held while instances arrive");
    tokio::time::advance(Duration::from_secs(1)).await;
    lease.announce(vec![spec("echo-b", "")]).await.unwrap();
    hub.refresh();
    tokio::time::advance(Duration::from_millis(1_999)).await;
    hub.tick();
    assert!(session.responses().is_empty(), "2 s (a fifth of the warm-up) have not passed since echo-b");
    tokio::time::advance(Duration::from_millis(1)).await;
    hub.tick();
    let response = session.responses();
    assert_eq!(response.len(), 1);
    assert_eq!(response[0].resources.len(), 1);
    let mut endpoints = Session::new(hub.clone(), None);
    endpoints.on_request(ask(ENDPOINT_TYPE, &["echo"], "")).unwrap();
    let assignment = ClusterLoadAssignment::decode(&*endpoints.responses()[0].resources[0].value).unwrap();
    assert_eq!(assignment.endpoints.iter().map(|l| l.lb_endpoints.len()).sum::<usize>(), 2, "both instances at once");

    // Once answered, a service is not withheld again: a later arrival is pushed as usual.
    lease.announce(vec![spec("echo-c", "")]).await.unwrap();
    hub.refresh();
    assert_eq!(endpoints.responses().len(), 1, "echo-c pushed at once");

    // Another service, still unseen when the warm-up ends: answered absent then.
    let mut late = Session::new(hub.clone(), None);
    late.on_request(ask(LISTENER_TYPE, &["other"], "")).unwrap();
    assert!(late.responses().is_empty());
    tokio::time::advance(Duration::from_secs(8)).await;
    let response = late.responses();
    assert_eq!(response.len(), 1);
    assert!(response[0].resources.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_tripped_breaker_is_pushed_and_its_end_too() {
    let (hub, _lease) = hub_with(
        vec![spec("echo-a", ""), spec("echo-b", ""), spec("echo-c", "")],
        XdsLimits::default(),
        Duration::ZERO,
    )
    .await;
    let mut session = Session::new(hub.clone(), None);
    session.on_request(ask(ENDPOINT_TYPE, &["echo"], "")).unwrap();
    let healthy = |response: &DiscoveryResponse| -> Vec<String> {
        let assignment = ClusterLoadAssignment::decode(&*response.resources[0].value).unwrap();
        assignment
            .endpoints
            .iter()
            .flat_map(|l| &l.lb_endpoints)
            .filter(|e| e.health_status == envoy_types::pb::envoy::config::core::v3::HealthStatus::Healthy as i32)
            .filter_map(|e| match &e.host_identifier {
                Some(envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier::Endpoint(ep)) => {
                    Some(ep.hostname.clone())
                }
                _ => None,
            })
            .collect()
    };
    assert_eq!(healthy(&session.responses()[0]).len(), 3);
    // Nothing moved: a tick looks at no service.
    let builds = hub.counters.builds.load(Ordering::Relaxed);
    hub.tick();
    assert_eq!(hub.counters.builds.load(Ordering::Relaxed), builds);
    // Three failed calls reported by other consumers trip echo-b's breaker (10 s).
    let failed = crate::balancer::CallOutcome {
        service: "echo".into(),
        instance_id: "echo-b".into(),
        ticket: 0,
        latency: Duration::from_millis(1),
        result: Some(crate::balancer::CallResult::Error),
        leased: true,
        rule: String::new(),
    };
    hub.balancer().report(&[failed.clone(), failed.clone(), failed]).unwrap();
    hub.tick();
    assert_eq!(healthy(&session.responses()[0]), ["echo-a", "echo-c"]);
    tokio::time::advance(Duration::from_secs(5)).await;
    hub.tick();
    assert!(session.responses().is_empty(), "still ejected");
    tokio::time::advance(Duration::from_secs(6)).await;
    hub.tick();
    assert_eq!(healthy(&session.responses()[0]).len(), 3, "the ejection ended without a publication or a report");
}

#[tokio::test(start_paused = true)]
async fn a_new_policy_is_pushed_at_the_next_tick() {
    let (hub, _lease) = hub_with(vec![spec("echo-zlt", "zlt")], XdsLimits::default(), Duration::ZERO).await;
    let mut session = Session::new(hub.clone(), None);
    session.on_request(ask(crate::xds::resources::ROUTE_TYPE, &["echo"], "")).unwrap();
    let plain_cluster = |response: &DiscoveryResponse| {
        use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, route, route_action};
        let config = RouteConfiguration::decode(&*response.resources[0].value).unwrap();
        let last = config.virtual_hosts[0].routes.last().unwrap().clone();
        match last.action {
            Some(route::Action::Route(action)) => match action.cluster_specifier {
                Some(route_action::ClusterSpecifier::Cluster(name)) => name,
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(plain_cluster(&session.responses()[0]), "echo/none");
    let spec = crate::policy::PolicySpec {
        isolation_fallback: Some(crate::policy::IsolationFallback::Any),
        ..Default::default()
    };
    hub.balancer().policies().set_service("echo", spec).unwrap();
    hub.tick();
    assert_eq!(plain_cluster(&session.responses()[0]), "echo/any");
}

#[tokio::test(start_paused = true)]
async fn a_change_resends_only_the_types_whose_resources_moved() {
    let (hub, lease) =
        hub_with(vec![spec("echo-a", ""), spec("echo-b", "")], XdsLimits::default(), Duration::ZERO).await;
    let mut session = Session::new(hub.clone(), None);
    session.on_request(ask(LISTENER_TYPE, &["echo"], "")).unwrap();
    session.on_request(ask(CLUSTER_TYPE, &["echo"], "")).unwrap();
    session.on_request(ask(ENDPOINT_TYPE, &["echo"], "")).unwrap();
    assert_eq!(session.responses().len(), 3);
    lease.withdraw(vec![InstanceRef { service: "echo".into(), id: "echo-b".into() }]).await.unwrap();
    hub.refresh();
    let resent: Vec<String> = session.responses().into_iter().map(|r| r.type_url).collect();
    assert_eq!(resent, [ENDPOINT_TYPE], "the listener and the cluster did not change");
}

#[tokio::test(start_paused = true)]
async fn a_cluster_still_asked_for_is_removed_only_after_the_routes_away_from_it_are_answered() {
    use crate::xds::resources::ROUTE_TYPE;
    let (hub, lease) =
        hub_with(vec![spec("echo-a", ""), spec("echo-zlt", "zlt")], XdsLimits::default(), Duration::ZERO).await;
    let mut session = Session::new(hub.clone(), None);
    session.on_request(ask(ROUTE_TYPE, &["echo"], "")).unwrap();
    session.on_request(ask(CLUSTER_TYPE, &["echo", "echo/version/zlt"], "")).unwrap();
    let first = session.responses();
    assert_eq!(first.len(), 2);
    for response in &first {
        session
            .on_request(ask(
                &response.type_url,
                if response.type_url == ROUTE_TYPE { &["echo"] } else { &["echo", "echo/version/zlt"] },
                &response.nonce,
            ))
            .unwrap();
    }
    assert!(session.responses().is_empty());

    // The zlt instance leaves: the routes change at once, the cluster waits for their answer.
    lease.withdraw(vec![InstanceRef { service: "echo".into(), id: "echo-zlt".into() }]).await.unwrap();
    hub.refresh();
    let routes: Vec<DiscoveryResponse> = session.responses();
    assert_eq!(routes.iter().map(|r| r.type_url.as_str()).collect::<Vec<_>>(), [ROUTE_TYPE]);
    assert!(session.responses().is_empty(), "the removal waits");
    session.on_request(ask(ROUTE_TYPE, &["echo"], &routes[0].nonce)).unwrap();
    let clusters = session.responses();
    assert_eq!(clusters.iter().map(|r| r.type_url.as_str()).collect::<Vec<_>>(), [CLUSTER_TYPE]);
    assert_eq!(clusters[0].resources.len(), 1, "only the unversioned cluster is left");
}

fn peer(last: u8) -> Option<std::net::SocketAddr> {
    Some(std::net::SocketAddr::from(([127, 0, 0, last], 5000)))
}

fn names(prefix: &str, count: usize, len: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}{i:0>width$}", width = len - prefix.len())).collect()
}

fn asking(type_url: &str, names: &[String]) -> DiscoveryRequest {
    ask(type_url, &names.iter().map(String::as_str).collect::<Vec<_>>(), "")
}

/// One client address holds at most a quarter of the subscriptions across every stream; others
/// still subscribe.
#[tokio::test(start_paused = true)]
async fn one_address_holds_at_most_its_share_of_the_subscriptions() {
    let limits = XdsLimits { max_names_per_stream: 1000, max_subscriptions: 400, ..XdsLimits::default() };
    let (hub, _lease) = hub_with(vec![], limits, Duration::ZERO).await;
    let mut streams: Vec<Session> = Vec::new();
    for i in 0..4 {
        let mut session = Session::new(hub.clone(), peer(2));
        session.on_request(asking(LISTENER_TYPE, &names(&format!("h{i}-"), 25, 8))).unwrap();
        streams.push(session);
    }
    let mut over = Session::new(hub.clone(), peer(2));
    let refused = over.on_request(asking(LISTENER_TYPE, &names("over-", 1, 8))).unwrap_err();
    assert_eq!(
        refused,
        StreamRefused::TooManySubscriptions(TooManySubscriptions::Peer { peer: peer(2).unwrap().ip(), share: 100 })
    );
    assert_eq!(hub.counters.subscriptions.load(Ordering::Relaxed), 100, "the refusal changed nothing");
    let mut other = Session::new(hub.clone(), peer(3));
    other.on_request(asking(LISTENER_TYPE, &names("o-", 100, 8))).unwrap();
    // A stream that goes gives its address room again.
    streams.pop();
    over.on_request(asking(LISTENER_TYPE, &names("over-", 25, 8))).unwrap();
    assert_eq!(hub.counters.subscriptions.load(Ordering::Relaxed), 200);
}

/// What streams hold for their clients is charged before it grows: one address is held to a
/// quarter of `max_xds_bytes`, every stream together to all of it, and a refused request
/// changes nothing.
#[tokio::test(start_paused = true)]
async fn streams_hold_at_most_the_memory_budget_and_one_address_its_quarter() {
    let limits = XdsLimits { max_names_per_stream: 1000, max_bytes: 1 << 20, ..XdsLimits::default() };
    let (hub, _lease) = hub_with(vec![], limits, Duration::ZERO).await;
    let memory = hub.memory().clone();
    let listeners = names("a-", 500, 100);
    let mut first = Session::new(hub.clone(), peer(2));
    first.on_request(asking(LISTENER_TYPE, &listeners)).unwrap();
    assert_eq!(memory.held(), held_bytes(listeners.iter()));
    let mut second = Session::new(hub.clone(), peer(2));
    let refused = second.on_request(asking(CLUSTER_TYPE, &names("b-", 300, 100))).unwrap_err();
    assert!(matches!(refused, StreamRefused::OverBudget(OverBudget::Share { .. })), "{refused}");
    assert!(refused.to_string().contains("server.max_xds_bytes"), "{refused}");
    assert_eq!(memory.held(), held_bytes(listeners.iter()), "the refusal changed nothing");
    assert_eq!(hub.counters.subscriptions.load(Ordering::Relaxed), 500);

    // Other addresses fill the rest; past it, every address is refused.
    let mut others = Vec::new();
    for host in 3..=5 {
        let mut session = Session::new(hub.clone(), peer(host));
        session.on_request(asking(LISTENER_TYPE, &names(&format!("{host}-"), 500, 100))).unwrap();
        others.push(session);
    }
    let mut late = Session::new(hub.clone(), peer(6));
    let refused = late.on_request(asking(LISTENER_TYPE, &names("late-", 500, 100))).unwrap_err();
    assert!(matches!(refused, StreamRefused::OverBudget(OverBudget::Total { .. })), "{refused}");
    assert!(memory.held() <= memory.limit());
    // Fewer names shrink the charge; closed streams give theirs back.
    first.on_request(asking(LISTENER_TYPE, &listeners[..10])).unwrap();
    assert_eq!(memory.held_by(peer(2).unwrap().ip()), held_bytes(listeners[..10].iter()));
    drop((first, second, others, late));
    assert_eq!(memory.held(), 0);
}
