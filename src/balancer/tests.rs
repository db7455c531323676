//! The pick path against a live registry, on paused time.

use super::*;
use crate::registry::{InstanceSpec, RegistryConfig};

fn spec(id: &str, version: &str) -> InstanceSpec {
    InstanceSpec {
        id: id.into(),
        service: "svc".into(),
        host: "127.0.0.1".into(),
        port: 80,
        version: version.into(),
        ..Default::default()
    }
}

async fn balancer_with(specs: Vec<InstanceSpec>) -> (Balancer, crate::registry::Lease) {
    let registry = Registry::spawn(RegistryConfig::default());
    let lease = registry.open_lease();
    let outcome = lease.announce(specs).await.unwrap();
    assert!(outcome.refused.is_empty(), "{outcome:?}");
    registry.subscribe("svc").await.unwrap();
    (Balancer::with_defaults(registry), lease)
}

fn query<'a>(rule: &'a str, version: &'a str) -> PickQuery<'a> {
    PickQuery { service: "svc", rule, version, ..Default::default() }
}

async fn ids(balancer: &Balancer, q: PickQuery<'_>, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(balancer.pick(q).await.unwrap().instance.id.to_string());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn empty_rule_means_round_robin_and_shares_its_rotation() {
    let (balancer, _lease) = balancer_with(vec![spec("a", ""), spec("b", ""), spec("c", "")]).await;
    assert_eq!(ids(&balancer, query("", ""), 2).await, ["a", "b"]);
    assert_eq!(ids(&balancer, query("round_robin", ""), 2).await, ["c", "a"]);
    let picked = balancer.pick(query("", "")).await.unwrap();
    assert_eq!((picked.ticket, &*picked.rule), (4, "round_robin"));
}

#[tokio::test(start_paused = true)]
async fn repeat_and_its_default_share_one_rotation() {
    let (balancer, _lease) = balancer_with(vec![spec("a", ""), spec("b", "")]).await;
    assert_eq!(ids(&balancer, query("repeat", ""), 2).await, ["a", "a"]);
    assert_eq!(ids(&balancer, query("repeat(n=3)", ""), 3).await, ["a", "b", "b"]);
}

#[tokio::test(start_paused = true)]
async fn version_isolation_with_fallback() {
    let (balancer, _lease) =
        balancer_with(vec![spec("p1", ""), spec("p2", ""), spec("z", "zlt"), spec("b", "bob")]).await;
    assert_eq!(ids(&balancer, query("", ""), 4).await, ["p1", "p2", "p1", "p2"]);
    assert_eq!(ids(&balancer, query("", "zlt"), 2).await, ["z", "z"]);
    let picked = balancer.pick(query("", "nobody")).await.unwrap();
    assert!(["p1", "p2"].contains(&&*picked.instance.id));
    assert_eq!(
        picked.fallback.as_deref(),
        Some("no instance with version \"nobody\"; picked from instances with no version")
    );
}

#[tokio::test(start_paused = true)]
async fn exclude_skips_tried_instances_and_can_exhaust() {
    let (balancer, _lease) = balancer_with(vec![spec("a", ""), spec("b", "")]).await;
    let exclude = vec!["a".to_owned()];
    let q = PickQuery { exclude: &exclude, ..query("", "") };
    assert_eq!(ids(&balancer, q, 3).await, ["b", "b", "b"]);
    let exclude = vec!["a".to_owned(), "b".to_owned()];
    let err = balancer.pick(PickQuery { exclude: &exclude, ..query("", "") }).await.unwrap_err();
    assert_eq!(
        err,
        PickError::Unavailable("service \"svc\" has no UP instance without a version that is not excluded".into())
    );
}

#[tokio::test(start_paused = true)]
async fn errors_distinguish_bad_input_unknown_and_unavailable() {
    let (balancer, _lease) = balancer_with(vec![spec("v", "v1")]).await;
    assert!(matches!(balancer.pick(PickQuery { service: "", ..Default::default() }).await, Err(PickError::Invalid(_))));
    assert!(matches!(balancer.pick(query("zigzag", "")).await, Err(PickError::Rule(_))));
    let unknown = balancer.pick(PickQuery { service: "other", ..Default::default() }).await;
    assert_eq!(unknown, Err(PickError::UnknownService("other".into())));
    assert!(matches!(balancer.pick(query("", "")).await, Err(PickError::Unavailable(_))));
    let long_key = "k".repeat(MAX_KEY_LEN + 1);
    let err = balancer.pick(PickQuery { key: &long_key, ..query("", "v1") }).await.unwrap_err();
    assert_eq!(err.to_string(), "key is 1025 bytes long; the limit is 1024");
}

fn failure(id: &str) -> CallOutcome {
    CallOutcome {
        service: "svc".into(),
        instance_id: id.into(),
        ticket: 0,
        latency: Duration::from_millis(1),
        result: Some(CallResult::Error),
        leased: false,
    }
}

fn ok_picks(balancer: &Balancer, rule: &str) -> u64 {
    let picks = balancer.counters().picks();
    picks.iter().filter(|p| &*p.rule == rule && p.result == PickResult::Ok).map(|p| p.count).sum()
}

#[tokio::test(start_paused = true)]
async fn picks_are_counted_once_per_answer_and_per_instance() {
    let (balancer, _lease) = balancer_with(vec![spec("a", ""), spec("b", ""), spec("c", "")]).await;
    assert_eq!(ids(&balancer, query("round_robin", ""), 4).await, ["a", "b", "c", "a"]);
    // Three failures in a row trip b's breaker; retry then skips b (drawing again without it:
    // tickets 1, 4 land on b, tickets 2, 5 go to [a, c]) without counting the skips.
    balancer.report(&[failure("b"), failure("b"), failure("b")]).unwrap();
    let retry = "retry(rule=round_robin, max_ms=100)";
    assert_eq!(ids(&balancer, query(retry, ""), 3).await, ["a", "a", "a"]);
    let last = balancer.pick(query(retry, "")).await.unwrap();
    assert_eq!((&*last.instance.id, last.ticket), ("c", 5));
    let canonical = last.rule;
    assert_eq!(ok_picks(&balancer, "round_robin"), 4);
    assert_eq!(ok_picks(&balancer, &canonical), 4, "four answers; the two skips are not picks");
    let per_instance: Vec<_> =
        balancer.instance_picks("svc").iter().map(|p| (p.instance.to_string(), p.rule == canonical, p.count)).collect();
    assert_eq!(
        per_instance,
        [
            ("a".to_owned(), true, 3),
            ("a".to_owned(), false, 2),
            ("b".to_owned(), false, 1),
            ("c".to_owned(), true, 1),
            ("c".to_owned(), false, 1)
        ]
    );
    // In flight: every counted pick of an instance, less the reports for it.
    let in_flight: Vec<u64> =
        ["a", "b", "c"].iter().map(|id| balancer.instance_stats("svc", id).load.in_flight).collect();
    assert_eq!(in_flight, [5, 0, 2]);
}

/// Whether the view of `svc` has, in the subset labelled `label`, a Maglev table built for
/// its current members.
fn maglev_current(balancer: &Balancer, label: &str) -> Option<bool> {
    let views = balancer.views().load();
    let view = views.get("svc")?;
    let subset = view.subsets().find(|s| &**s.label() == label)?;
    let built = subset.candidates.tables.maglev.load();
    built.as_ref().map(|b| b.is_for(&subset.candidates.subset))
}

#[tokio::test(start_paused = true)]
async fn a_hash_table_in_use_is_built_for_the_next_snapshot_before_its_ack() {
    let (balancer, lease) = balancer_with(vec![spec("a", ""), spec("b", "")]).await;
    assert_eq!(maglev_current(&balancer, "version="), None, "no table before a rule needs one");
    let keyed = PickQuery { key: "user-1", ..query("consistent_hash", "") };
    balancer.pick(keyed).await.unwrap();
    assert_eq!(maglev_current(&balancer, "version="), Some(true), "the first pick had it built");

    lease.announce(vec![spec("c", "")]).await.unwrap();
    // Acknowledged: the new view is published, with its table, before any pick.
    let views = balancer.views().load();
    assert_eq!(views.get("svc").unwrap().unversioned.candidates.len(), 3);
    assert_eq!(maglev_current(&balancer, "version="), Some(true));
    // A subset no pick hashed into is left alone.
    lease.announce(vec![spec("v1", "v1")]).await.unwrap();
    assert_eq!(maglev_current(&balancer, "version=v1"), None);
}

#[tokio::test]
async fn a_large_subset_picks_from_the_previous_table_until_its_own_is_built() {
    let registry = Registry::spawn(RegistryConfig { max_instances_per_stream: 2000, ..RegistryConfig::default() });
    let lease = registry.open_lease();
    let specs: Vec<InstanceSpec> = (0..view::INLINE_BUILD + 10).map(|i| spec(&format!("i{i:05}"), "")).collect();
    lease.announce(specs).await.unwrap();
    let balancer = Balancer::with_defaults(registry);
    let keyed = |key: &'static str| PickQuery { key, ..query("consistent_hash", "") };
    let before = balancer.pick(keyed("user-7")).await.unwrap();
    // The instance holding the key leaves; the next view starts with the previous table, read
    // through member ids, while its own is built on a blocking thread.
    let gone = before.instance.id.to_string();
    lease.withdraw(vec![crate::registry::InstanceRef { service: "svc".into(), id: gone.clone() }]).await.unwrap();
    for key in ["user-7", "user-8", "user-9"] {
        assert_ne!(&*balancer.pick(keyed(key)).await.unwrap().instance.id, gone, "a departed instance is never picked");
    }
    // The new table arrives (bounded wait on the blocking builder).
    tokio::time::timeout(std::time::Duration::from_secs(60), async {
        while maglev_current(&balancer, "version=") != Some(true) {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    })
    .await
    .expect("the table of the new members is built");
    assert_ne!(&*balancer.pick(keyed("user-7")).await.unwrap().instance.id, gone);
}
