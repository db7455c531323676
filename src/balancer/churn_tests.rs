//! Picks of a large service while its table builds are held and its membership changes, on
//! paused time: no pick waits for a build, and the service's views stay few.

use std::sync::Arc;
use std::time::Duration;

use super::view::INLINE_BUILD;
use super::*;
use crate::registry::{InstanceSpec, Lease, RegistryConfig};
use crate::rules::table_free;

const SIZE: usize = INLINE_BUILD + 500;

fn spec(n: usize) -> InstanceSpec {
    InstanceSpec {
        id: format!("i{n:05}"),
        service: "big".into(),
        host: "127.0.0.1".into(),
        port: 80,
        ..Default::default()
    }
}

/// A balancer over one service larger than [`INLINE_BUILD`], whose tables a pick cannot build.
async fn big_service() -> (Arc<Balancer>, Lease) {
    let registry = Registry::spawn(RegistryConfig { max_instances_per_stream: 10_000, ..RegistryConfig::default() });
    let lease = registry.open_lease();
    let outcome = lease.announce((0..SIZE).map(spec).collect()).await.expect("registry open");
    assert!(outcome.refused.is_empty(), "{:?}", outcome.refused.first());
    (Arc::new(Balancer::with_defaults(registry)), lease)
}

fn query<'a>(rule: &'a str, key: &'a str) -> PickQuery<'a> {
    PickQuery { service: "big", rule, key, ..Default::default() }
}

/// Every rule that reads a table answers its first pick on the service while no build can run,
/// without a table, and says so; a key keeps its instance meanwhile.
#[tokio::test(start_paused = true)]
async fn first_picks_answer_while_every_build_is_held() {
    let (balancer, _lease) = big_service().await;
    let _held = balancer.views().build_pool().hold().await;
    for rule in ["weighted", "consistent_hash", "least_request", "best_available", "sticky", "zone_avoidance"] {
        let pick = tokio::time::timeout(Duration::from_secs(1), balancer.pick(query(rule, "user-1")))
            .await
            .unwrap_or_else(|_| panic!("a {rule} pick waited for a build"))
            .unwrap_or_else(|error| panic!("{rule}: {error}"));
        assert_eq!(pick.fallback.as_deref(), Some(table_free::NOTE), "{rule}");
    }
    let first = balancer.pick(query("consistent_hash", "user-2")).await.unwrap();
    for _ in 0..10 {
        let again = balancer.pick(query("consistent_hash", "user-2")).await.unwrap();
        assert_eq!(again.instance.id, first.instance.id);
    }
}

/// While builds are held, every publication makes a new view and a pick runs on each: the
/// picks finish, and the views they read are freed with them, so the service keeps one view
/// however many publications came.
#[tokio::test(start_paused = true)]
async fn views_held_stay_bounded_under_churn_while_builds_are_held() {
    let (balancer, lease) = big_service().await;
    let held = balancer.views().build_pool().hold().await;
    let mut picks = Vec::new();
    for n in 0..30 {
        lease.announce(vec![spec(SIZE + n)]).await.expect("registry open");
        let balancer = balancer.clone();
        picks.push(tokio::spawn(async move {
            let key = format!("user-{n}");
            balancer.pick(query("consistent_hash", &key)).await.map(|picked| picked.instance.id.clone())
        }));
    }
    let answered = tokio::time::timeout(Duration::from_secs(1), futures_util::future::join_all(picks)).await;
    let live = balancer.views().load().get("big").expect("a view").live();
    assert!(live <= 2, "{live} views of the service alive after 30 publications");
    let answered = answered.expect("the picks waited for a build");
    assert!(answered.iter().all(|pick| matches!(pick, Ok(Ok(_)))));
    drop(held);
}
