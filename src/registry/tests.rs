//! Registry behaviour through its public handle, on paused time.

use std::time::Duration;

use super::*;

fn spec(service: &str, host: &str, port: u32) -> InstanceSpec {
    InstanceSpec { service: service.into(), host: host.into(), port, ..Default::default() }
}

/// Waits until the registry task has applied everything sent so far.
async fn settle(registry: &Registry) {
    // A subscribe round trip is queued behind every earlier command.
    registry.subscribe("settle").await.unwrap();
}

fn ids(registry: &Registry, service: &str) -> Vec<String> {
    registry.service(service).map(|s| s.instances.iter().map(|i| i.id.to_string()).collect()).unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn silent_lease_expires_after_heartbeat_timeout() {
    let registry = Registry::spawn(RegistryConfig::default());
    let mut lease = registry.open_lease();
    let expiry = lease.take_expiry();
    let outcome = lease.announce(vec![spec("orders", "10.0.0.1", 80)]).await.unwrap();
    assert_eq!(outcome.accepted.len(), 1);

    tokio::time::sleep(Duration::from_secs(14)).await;
    settle(&registry).await;
    assert_eq!(ids(&registry, "orders"), ["10.0.0.1:80"]);

    tokio::time::timeout(Duration::from_secs(2), expiry).await.expect("lease should expire at 15 s");
    settle(&registry).await;
    assert!(ids(&registry, "orders").is_empty());
}

#[tokio::test(start_paused = true)]
async fn heartbeats_keep_a_lease_alive() {
    let registry = Registry::spawn(RegistryConfig::default());
    let mut lease = registry.open_lease();
    let expiry = lease.take_expiry();
    lease.announce(vec![spec("orders", "10.0.0.1", 80)]).await.unwrap();
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_secs(10)).await;
        lease.touch();
    }
    settle(&registry).await;
    assert_eq!(ids(&registry, "orders"), ["10.0.0.1:80"]);
    // 100 s have passed; one more silent timeout ends it.
    tokio::time::timeout(Duration::from_secs(16), expiry).await.expect("expires once silent");
}

#[tokio::test(start_paused = true)]
async fn dropping_a_lease_removes_its_instances_at_once() {
    let registry = Registry::spawn(RegistryConfig::default());
    let lease = registry.open_lease();
    lease.announce(vec![spec("orders", "a", 1), spec("orders", "b", 1)]).await.unwrap();
    settle(&registry).await;
    assert_eq!(ids(&registry, "orders"), ["a:1", "b:1"]);
    drop(lease);
    settle(&registry).await;
    assert!(ids(&registry, "orders").is_empty());
    // The service stays known, so picks can tell "no instances now" from "never seen".
    assert!(registry.service("orders").is_some());
}

#[tokio::test(start_paused = true)]
async fn a_second_lease_cannot_take_over_an_owned_id() {
    let registry = Registry::spawn(RegistryConfig::default());
    let first = registry.open_lease();
    let second = registry.open_lease();
    first.announce(vec![InstanceSpec { version: "v1".into(), ..spec("orders", "a", 1) }]).await.unwrap();
    let outcome = second
        .announce(vec![InstanceSpec { version: "v2".into(), ..spec("orders", "a", 1) }, spec("orders", "b", 1)])
        .await
        .unwrap();
    assert_eq!(outcome.accepted, [InstanceRef { service: "orders".into(), id: "b:1".into() }]);
    assert!(matches!(outcome.refused[0].1, Refused::OwnedElsewhere { .. }));
    settle(&registry).await;
    let snapshot = registry.service("orders").unwrap();
    assert_eq!(&*snapshot.instances[0].version, "v1", "the owner's instance is unchanged");

    // Nor withdraw or update it.
    let a = InstanceRef { service: "orders".into(), id: "a:1".into() };
    let outcome = second.withdraw(vec![a.clone()]).await.unwrap();
    assert!(matches!(outcome.refused[0].1, Refused::NotOwned { .. }));
    let update = InstanceUpdate { service: "orders".into(), id: "a:1".into(), weight: Some(7), ..Default::default() };
    let outcome = second.update(update).await.unwrap();
    assert!(matches!(outcome.refused[0].1, Refused::NotOwned { .. }));
    settle(&registry).await;
    assert_eq!(ids(&registry, "orders"), ["a:1", "b:1"]);
    assert_eq!(registry.service("orders").unwrap().instances[0].weight, DEFAULT_WEIGHT);

    // Once the owner leaves, the id is free.
    drop(first);
    let outcome = second.announce(vec![spec("orders", "a", 1)]).await.unwrap();
    assert_eq!(outcome.accepted.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn update_and_withdraw_change_only_what_they_name() {
    let registry = Registry::spawn(RegistryConfig::default());
    let lease = registry.open_lease();
    lease.announce(vec![spec("orders", "a", 1), spec("orders", "b", 1)]).await.unwrap();
    let update = InstanceUpdate {
        service: "orders".into(),
        id: "a:1".into(),
        status: RequestedStatus::Known(Status::Draining),
        ..Default::default()
    };
    assert_eq!(lease.update(update).await.unwrap().accepted.len(), 1);
    settle(&registry).await;
    let snapshot = registry.service("orders").unwrap();
    assert_eq!(snapshot.instances[0].status, Status::Draining);
    assert_eq!(snapshot.unversioned.members.len(), 1, "a draining instance is not eligible");

    let outcome = lease.withdraw(vec![InstanceRef { service: "orders".into(), id: "b:1".into() }]).await.unwrap();
    assert_eq!(outcome.accepted.len(), 1);
    settle(&registry).await;
    assert_eq!(ids(&registry, "orders"), ["a:1"]);
    lease.withdraw(Vec::new()).await.unwrap();
    settle(&registry).await;
    assert!(ids(&registry, "orders").is_empty());
}

#[tokio::test(start_paused = true)]
async fn invalid_instances_are_refused_and_change_nothing() {
    let registry = Registry::spawn(RegistryConfig::default());
    let lease = registry.open_lease();
    let outcome =
        lease.announce(vec![spec("orders", "a", 1), spec("orders", "", 1), spec("orders", "c", 0)]).await.unwrap();
    assert_eq!(outcome.accepted.len(), 1);
    let fields: Vec<String> = outcome
        .refused
        .iter()
        .map(|(_, why)| match why {
            Refused::Invalid(field) => field.field.clone(),
            other => panic!("unexpected {other:?}"),
        })
        .collect();
    assert_eq!(fields, ["announce.instances[1].host", "announce.instances[2].port"]);
    settle(&registry).await;
    assert_eq!(ids(&registry, "orders"), ["a:1"]);
}

#[tokio::test(start_paused = true)]
async fn the_per_stream_limit_refuses_the_whole_message() {
    let config = RegistryConfig { max_instances_per_stream: 3, ..Default::default() };
    let registry = Registry::spawn(config);
    let lease = registry.open_lease();
    lease.announce(vec![spec("s", "a", 1), spec("s", "b", 1)]).await.unwrap();
    let outcome = lease.announce(vec![spec("s", "c", 1), spec("s", "d", 1)]).await.unwrap();
    assert!(outcome.accepted.is_empty());
    assert!(matches!(outcome.refused[0].1, Refused::TooManyInstances { count: 4, limit: 3 }));
    // Re-announcing owned instances does not count twice.
    let outcome = lease.announce(vec![spec("s", "a", 1), spec("s", "b", 1), spec("s", "c", 1)]).await.unwrap();
    assert_eq!(outcome.accepted.len(), 3);
    settle(&registry).await;
    assert_eq!(ids(&registry, "s"), ["a:1", "b:1", "c:1"]);
}

#[tokio::test(start_paused = true)]
async fn subscribers_see_every_published_snapshot() {
    let registry = Registry::spawn(RegistryConfig::default());
    let mut rx = registry.subscribe("orders").await.unwrap();
    assert_eq!(rx.borrow_and_update().epoch, 0);
    let lease = registry.open_lease();
    lease.announce(vec![spec("orders", "a", 1)]).await.unwrap();
    rx.changed().await.unwrap();
    let snapshot = rx.borrow_and_update().clone();
    assert_eq!(snapshot.epoch, 1);
    assert_eq!(snapshot.instances.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn empty_services_are_forgotten_after_the_idle_timeout_unless_watched() {
    let config = RegistryConfig { service_idle_timeout: Duration::from_secs(60), ..Default::default() };
    let registry = Registry::spawn(config);
    let lease = registry.open_lease();
    let services: Vec<String> = (0..500).map(|n| format!("svc-{n}")).collect();
    for name in &services {
        lease.announce(vec![spec(name, "h", 1)]).await.unwrap();
    }
    let watched = registry.subscribe("svc-7").await.unwrap();
    lease.withdraw(Vec::new()).await.unwrap();
    settle(&registry).await;
    assert_eq!(registry.catalog().len(), 500, "empty services are still known");

    tokio::time::sleep(Duration::from_secs(59)).await;
    settle(&registry).await;
    assert_eq!(registry.catalog().len(), 500);
    tokio::time::sleep(Duration::from_secs(2)).await;
    settle(&registry).await;
    let catalog = registry.catalog();
    assert_eq!(catalog.snapshots().map(|s| s.name.to_string()).collect::<Vec<_>>(), ["svc-7"], "only the watched one");

    // Announcing again brings a forgotten service back.
    let again = registry.open_lease();
    again.announce(vec![spec("svc-3", "h", 1)]).await.unwrap();
    assert_eq!(ids(&registry, "svc-3"), ["h:1"]);
    drop(watched);
}

#[tokio::test(start_paused = true)]
async fn new_services_beyond_the_registry_and_token_limits_are_refused() {
    let config = RegistryConfig { max_services: 5, max_services_per_token: 2, ..Default::default() };
    let registry = Registry::spawn(config);
    let team = registry.open_lease_for(Some("team".into()));
    let same_team = registry.open_lease_for(Some("team".into()));
    let outcome = team.announce(vec![spec("a", "h", 1), spec("b", "h", 1)]).await.unwrap();
    assert_eq!(outcome.accepted.len(), 2);
    let outcome = same_team.announce(vec![spec("a", "h", 2), spec("c", "h", 1)]).await.unwrap();
    assert_eq!(outcome.accepted, [InstanceRef { service: "a".into(), id: "h:2".into() }], "a is held already");
    assert!(
        matches!(&outcome.refused[0].1, Refused::TooManyServices { key: "max_services_per_token", limit: 2, .. }),
        "{:?}",
        outcome.refused
    );
    // Once the token holds nothing in `b`, it may use a new service.
    team.withdraw(vec![InstanceRef { service: "b".into(), id: "h:1".into() }]).await.unwrap();
    assert_eq!(same_team.announce(vec![spec("c", "h", 1)]).await.unwrap().accepted.len(), 1);

    let anyone = registry.open_lease();
    let outcome = anyone.announce((0..4).map(|n| spec(&format!("x{n}"), "h", 1)).collect()).await.unwrap();
    // a, b (empty, not yet forgotten) and c are known: two more fit under the limit of 5.
    assert_eq!(outcome.accepted.len(), 2);
    assert!(matches!(&outcome.refused[0].1, Refused::TooManyServices { key: "max_services", limit: 5, .. }));
}

/// A hook that records, each time it is told of a publication, what the registry's own
/// catalog (what a listing reads) shows of `orders` at that moment.
struct Recorder {
    registry: Registry,
    seen: Mutex<Vec<(Vec<String>, Vec<String>)>>,
}

impl PublishHook for Recorder {
    fn published(&self, catalog: &Catalog, _services: &[Arc<str>]) {
        let told = catalog.get("orders").map(|s| s.instances.iter().map(|i| i.id.to_string()).collect());
        self.seen.lock().unwrap().push((told.unwrap_or_default(), ids(&self.registry, "orders")));
    }
}

#[tokio::test(start_paused = true)]
async fn the_pick_views_are_told_of_a_publication_before_a_listing_can_show_it() {
    let registry = Registry::spawn(RegistryConfig::default());
    let recorder = Arc::new(Recorder { registry: registry.clone(), seen: Mutex::default() });
    let mut started = None;
    registry.add_hook(Arc::downgrade(&(recorder.clone() as Arc<dyn PublishHook>)), |catalog| {
        started = Some(catalog.snapshots().count());
    });
    assert_eq!(started, Some(0), "the hook starts from the catalog published before it");

    let lease = registry.open_lease();
    lease.announce(vec![spec("orders", "a", 1)]).await.unwrap();
    drop(lease);
    settle(&registry).await;
    assert!(ids(&registry, "orders").is_empty());

    let seen = recorder.seen.lock().unwrap().clone();
    // Told of the announce while the catalog still lacked it, and of the close while the
    // catalog still listed the instance: a listing can never run ahead of the picks.
    assert_eq!(seen, [(vec!["a:1".to_owned()], vec![]), (vec![], vec!["a:1".to_owned()])]);
}

/// Changes from ten streams arriving over 3 ms, inside one 5 ms window, make one publication;
/// every one is acknowledged, and only once it is published.
#[tokio::test(start_paused = true)]
async fn changes_within_the_publish_window_make_one_publication_and_all_are_acknowledged() {
    let window = Duration::from_millis(5);
    let registry = Registry::spawn(RegistryConfig { publish_window: window, ..RegistryConfig::default() });
    let generation = registry.changes();
    let before = *generation.borrow();
    let leases: Vec<Lease> = (0..10).map(|_| registry.open_lease()).collect();
    let started = tokio::time::Instant::now();
    let registry = &registry;
    let acks = leases.iter().enumerate().map(|(n, lease)| async move {
        tokio::time::sleep(Duration::from_micros(300 * n as u64)).await;
        let outcome = lease.announce(vec![spec("orders", "10.0.0.1", 80 + n as u32)]).await.unwrap();
        let published =
            registry.service("orders").is_some_and(|s| s.instances.iter().any(|i| u32::from(i.port) == 80 + n as u32));
        (outcome.accepted.len(), published, started.elapsed())
    });
    for (accepted, published, after) in futures_util::future::join_all(acks).await {
        assert_eq!(accepted, 1);
        assert!(published, "acknowledged before it was published");
        assert_eq!(after, window, "acknowledged when the window closed");
    }
    assert_eq!(*generation.borrow() - before, 1, "one publication for the ten changes");
    assert_eq!(ids(registry, "orders").len(), 10);
}

/// A zero window publishes each batch at once: changes apart in time are published apart.
#[tokio::test(start_paused = true)]
async fn a_zero_publish_window_publishes_every_batch_at_once() {
    let registry = Registry::spawn(RegistryConfig { publish_window: Duration::ZERO, ..RegistryConfig::default() });
    let generation = registry.changes();
    let before = *generation.borrow();
    let lease = registry.open_lease();
    for n in 0..3 {
        let sent = tokio::time::Instant::now();
        lease.announce(vec![spec("orders", "10.0.0.1", 80 + n)]).await.unwrap();
        assert_eq!(sent.elapsed(), Duration::ZERO);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(*generation.borrow() - before, 3);
}
