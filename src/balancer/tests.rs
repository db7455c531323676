//! The pick path against a live registry, on paused time.

use std::time::Duration;

use super::*;
use crate::policy::PolicySpec;
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
        rule: String::new(),
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
    // Three failures in a row trip b's breaker; every rule then skips b (ejection), so retry's
    // rotation goes on over [a, c] with no re-pick to count.
    balancer.report(&[failure("b"), failure("b"), failure("b")]).unwrap();
    let retry = "retry(rule=round_robin, max_ms=100)";
    assert_eq!(ids(&balancer, query(retry, ""), 3).await, ["a", "c", "a"]);
    let last = balancer.pick(query(retry, "")).await.unwrap();
    assert_eq!((&*last.instance.id, last.ticket), ("c", 3));
    let canonical = last.rule;
    assert_eq!(ok_picks(&balancer, "round_robin"), 4);
    assert_eq!(ok_picks(&balancer, &canonical), 4, "four answers");
    let per_instance: Vec<_> =
        balancer.instance_picks("svc").iter().map(|p| (p.instance.to_string(), p.rule == canonical, p.count)).collect();
    assert_eq!(
        per_instance,
        [
            ("a".to_owned(), true, 2),
            ("a".to_owned(), false, 2),
            ("b".to_owned(), false, 1),
            ("c".to_owned(), true, 2),
            ("c".to_owned(), false, 1)
        ]
    );
    // In flight: every counted pick of an instance, less the reports for it.
    let in_flight: Vec<u64> =
        ["a", "b", "c"].iter().map(|id| balancer.instance_stats("svc", id).load.in_flight).collect();
    assert_eq!(in_flight, [4, 0, 3]);
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

/// The instance each of 40 keys hashes to.
async fn hashed(balancer: &Balancer) -> Vec<String> {
    let mut out = Vec::new();
    for k in 0..40 {
        let key = format!("key-{k}");
        let q = PickQuery { key: &key, ..query("consistent_hash", "") };
        out.push(balancer.pick(q).await.unwrap().instance.id.to_string());
    }
    out
}

fn failures(id: &str, n: usize) -> Vec<CallOutcome> {
    vec![failure(id); n]
}

fn success(id: &str) -> CallOutcome {
    CallOutcome { result: Some(CallResult::Ok), latency: Duration::from_millis(5), ..failure(id) }
}

#[tokio::test(start_paused = true)]
async fn every_rule_skips_an_ejected_instance() {
    let specs = ["a", "b", "c", "d"].iter().map(|id| spec(id, "")).collect();
    let (balancer, _lease) = balancer_with(specs).await;
    let before = hashed(&balancer).await;
    balancer.report(&failures("b", 3)).unwrap();
    // Round robin goes on over the others with equal shares, from the next ticket.
    assert_eq!(ids(&balancer, query("round_robin", ""), 6).await, ["a", "c", "d", "a", "c", "d"]);
    assert_eq!(ids(&balancer, query("repeat(n=2)", ""), 6).await, ["a", "a", "c", "c", "d", "d"]);
    for rule in ["random", "weighted", "response_time", "least_request", "best_available", "slow_start"] {
        let picked = ids(&balancer, query(rule, ""), 30).await;
        assert!(!picked.contains(&"b".to_owned()), "{rule}: {picked:?}");
    }
    let sticky = PickQuery { key: "user-1", ..query("sticky", "") };
    assert_ne!(balancer.pick(sticky).await.unwrap().instance.id.as_ref(), "b");
    // Consistent hashing moves only b's keys.
    let after = hashed(&balancer).await;
    for (old, new) in before.iter().zip(&after) {
        if old == "b" {
            assert_ne!(new, "b");
        } else {
            assert_eq!(old, new, "a key whose instance is healthy keeps it");
        }
    }
    assert!(before.contains(&"b".to_owned()), "some key hashed to b");
    // A lease leaves b out of the eligible list.
    let leased = balancer.lease(query("round_robin", ""), 4).await.unwrap();
    let listed: Vec<&str> = leased.instances.iter().map(|i| &*i.id).collect();
    assert_eq!(listed, ["a", "c", "d"]);
    // A success closes b's breaker: b is back in every rotation.
    balancer.report(&[success("b")]).unwrap();
    let back = ids(&balancer, query("round_robin", ""), 4).await;
    assert!(back.contains(&"b".to_owned()), "{back:?}");
}

#[tokio::test(start_paused = true)]
async fn a_failing_instance_is_not_preferred_for_being_fast() {
    let (balancer, _lease) = balancer_with(vec![spec("a", ""), spec("b", ""), spec("c", "")]).await;
    // Ejection off: only the latency weights stand between b and the traffic.
    let off = PolicySpec {
        ejection: crate::policy::EjectionSpec { enabled: Some(false), ..Default::default() },
        ..Default::default()
    };
    balancer.policies().set_service("svc", off).unwrap();
    let slow_ok = |id: &str| CallOutcome { latency: Duration::from_millis(50), ..success(id) };
    for _ in 0..5 {
        balancer.report(&[slow_ok("a"), slow_ok("c"), failure("b")]).unwrap();
        tokio::time::advance(Duration::from_millis(100)).await;
    }
    // Sampled: b's weight is about 100 of 2,200 (≈ 27 of 600 expected); a tenth would take a
    // tail far past chance (and a failure counted as fast gives it over a third).
    let picked = ids(&balancer, query("response_time", ""), 600).await;
    let on_b = picked.iter().filter(|id| *id == "b").count();
    assert!(on_b < 60, "b failed every call in 1 ms and got {on_b} of 600");
    // With ejection off, round robin still reaches the tripped b: the switch works.
    assert!(ids(&balancer, query("round_robin", ""), 3).await.contains(&"b".to_owned()));
}

#[tokio::test(start_paused = true)]
async fn a_high_failure_rate_ejects_without_successive_failures() {
    let (balancer, _lease) = balancer_with(vec![spec("a", ""), spec("b", ""), spec("c", "")]).await;
    // Alternating failures never reach three in a row, but 50 % of 20 calls ejects.
    for _ in 0..10 {
        balancer.report(&[failure("b"), success("b")]).unwrap();
    }
    assert!(!balancer.instance_stats("svc", "b").load.tripped, "the rate counts at a failure");
    balancer.report(&[failure("b")]).unwrap();
    assert!(balancer.instance_stats("svc", "b").load.tripped);
    assert!(!ids(&balancer, query("round_robin", ""), 6).await.contains(&"b".to_owned()));
    // A success does not end a rate ejection; its time does (the breaker's base blackout).
    balancer.report(&[success("b")]).unwrap();
    assert!(!ids(&balancer, query("round_robin", ""), 6).await.contains(&"b".to_owned()));
    tokio::time::advance(Duration::from_secs(10)).await;
    assert!(ids(&balancer, query("round_robin", ""), 6).await.contains(&"b".to_owned()));
}

#[tokio::test(start_paused = true)]
async fn beyond_the_ejected_share_nothing_is_skipped_and_the_answer_says_so() {
    let (balancer, _lease) = balancer_with(vec![spec("a", ""), spec("b", ""), spec("c", "")]).await;
    balancer.report(&failures("a", 3)).unwrap();
    balancer.report(&failures("b", 3)).unwrap();
    // Two of three ejected is more than the default 50 % (one of three): panic mode.
    let picked = balancer.pick(query("round_robin", "")).await.unwrap();
    assert_eq!(&*picked.instance.id, "a");
    let note = picked.fallback.unwrap();
    assert!(note.contains("2 of 3 instances are ejected"), "{note}");
    // A policy that allows it skips both.
    let wide = PolicySpec {
        ejection: crate::policy::EjectionSpec { max_ejected_percent: Some(70), ..Default::default() },
        ..Default::default()
    };
    balancer.policies().set_service("svc", wide).unwrap();
    assert_eq!(ids(&balancer, query("round_robin", ""), 3).await, ["c", "c", "c"]);
    // Every instance ejected: panic again, whatever the share.
    balancer.report(&failures("c", 3)).unwrap();
    let picked = balancer.pick(query("round_robin", "")).await.unwrap();
    assert!(picked.fallback.unwrap().contains("3 of 3 instances are ejected"));
}

#[tokio::test(start_paused = true)]
async fn a_versionless_lease_under_gray_release_maps_exact_picks() {
    let specs = vec![spec("a", ""), spec("b", ""), spec("v", "v2")];
    let (balancer, _lease) = balancer_with(specs).await;
    let gray = PolicySpec {
        gray: Some(crate::policy::GraySpec { unversioned: 2, versions: [("v2".to_owned(), 1)].into() }),
        ..Default::default()
    };
    balancer.policies().set_service("svc", gray).unwrap();
    let mut seen = Vec::new();
    let mut tickets = Vec::new();
    for count in [4, 5, 3] {
        let leased = balancer.lease(query("round_robin", ""), count).await.unwrap();
        assert_eq!((leased.first_ticket, leased.count, leased.picks.len()), (0, count, count as usize));
        for pick in &leased.picks {
            let instance = &leased.instances[pick.position as usize];
            seen.push(instance.id.to_string());
            tickets.push((instance.version.to_string(), pick.ticket));
        }
    }
    // Gray tickets 0..12 over a 2:1 schedule: 8 unversioned picks (a, b alternating), 4 on v2.
    let count = |id: &str| seen.iter().filter(|s| *s == id).count();
    assert_eq!((count("a"), count("b"), count("v")), (4, 4, 4), "{seen:?}");
    // Each version's rotation is drawn once per ticket, in order.
    let unversioned: Vec<u64> = tickets.iter().filter(|(v, _)| v.is_empty()).map(|(_, t)| *t).collect();
    assert_eq!(unversioned, (0..8).collect::<Vec<u64>>());
    // A unary pick goes on from the same gray counter and rotations.
    let next = balancer.pick(query("round_robin", "")).await.unwrap();
    assert!(next.ticket == 8 || (next.ticket == 4 && &*next.instance.id == "v"), "{next:?}");
}

/// A balancer given a seed makes the same random choices every time: the `random` rule's picks
/// repeat exactly, and another seed gives other picks.
#[tokio::test(start_paused = true)]
async fn a_seeded_balancer_repeats_its_random_choices() {
    let specs = || (0..10).map(|n| spec(&format!("i{n}"), "")).collect::<Vec<_>>();
    let picks = |seed: u64| async move {
        let (balancer, _lease) = balancer_with(specs()).await;
        let balancer = balancer.with_seed(seed);
        let mut ids = Vec::new();
        for _ in 0..20 {
            ids.push(balancer.pick(query("random", "")).await.expect("a pick").instance.id.to_string());
        }
        ids
    };
    let first = picks(7).await;
    assert_eq!(picks(7).await, first, "the same seed, the same choices");
    assert_ne!(picks(8).await, first, "another seed, other choices");
}

/// A ticket range's positions name the instance each ticket goes to, as a unary pick of that
/// ticket would: for every leasable rule, a lease of two cycles, then two cycles of unary picks
/// (tickets one cycle on), land alike.
#[tokio::test(start_paused = true)]
async fn a_leased_ticket_range_positions_each_ticket_as_a_pick_would() {
    let weighted = |id: &str, weight: u32| InstanceSpec { weight: Some(weight), ..spec(id, "") };
    let specs = vec![weighted("a", 1), weighted("b", 2), weighted("c", 3)];
    let (balancer, _lease) = balancer_with(specs).await;
    // Cycles: round_robin 3 tickets, repeat(n=2) 6, weighted 1 + 2 + 3 = 6.
    for (rule, cycle) in [("round_robin", 3u32), ("repeat(n=2)", 6), ("weighted", 6)] {
        let leased = balancer.lease(query(rule, ""), 2 * cycle).await.unwrap();
        assert_eq!((leased.first_ticket, leased.positions.len()), (0, 2 * cycle as usize), "{rule}");
        let leased_ids: Vec<String> =
            leased.positions.iter().map(|p| leased.instances[*p as usize].id.to_string()).collect();
        let picked = ids(&balancer, query(rule, ""), 2 * cycle as usize).await;
        assert_eq!(leased_ids, picked, "{rule}");
        assert!(leased.picks.is_empty());
    }
    let repeat = balancer.lease(query("repeat(n=2)", ""), 0).await.unwrap();
    assert!(repeat.positions.is_empty(), "no ticket, no position");
}

/// `exclude` leaves the named instances out of the list, and the tickets are mapped over the
/// others; ids that are not eligible are ignored; excluding every instance is refused.
#[tokio::test(start_paused = true)]
async fn a_lease_maps_its_tickets_over_the_instances_it_does_not_exclude() {
    let (balancer, _lease) = balancer_with(vec![spec("a", ""), spec("b", ""), spec("c", "")]).await;
    let exclude = vec!["b".to_owned(), "nobody".to_owned()];
    let leased = balancer.lease(PickQuery { exclude: &exclude, ..query("round_robin", "") }, 5).await.unwrap();
    let listed: Vec<&str> = leased.instances.iter().map(|i| &*i.id).collect();
    assert_eq!(listed, ["a", "c"]);
    assert_eq!((leased.first_ticket, leased.positions.as_slice()), (0, &[0, 1, 0, 1, 0][..]));
    let everyone = vec!["a".to_owned(), "b".to_owned(), "c".to_owned()];
    let refused = balancer.lease(PickQuery { exclude: &everyone, ..query("round_robin", "") }, 5).await.unwrap_err();
    assert_eq!(
        refused,
        PickError::Unavailable("service \"svc\" has no eligible instance for a lease that is not excluded".into())
    );
    // The refused lease took no ticket.
    let next = balancer.lease(query("round_robin", ""), 1).await.unwrap();
    assert_eq!(next.first_ticket, 5);

    // Under gray release (v2 has no instance: its share falls back to the unversioned ones),
    // rota's own picks skip the excluded instances too.
    let gray = PolicySpec {
        gray: Some(crate::policy::GraySpec { unversioned: 1, versions: [("v2".to_owned(), 1)].into() }),
        ..Default::default()
    };
    balancer.policies().set_service("svc", gray).unwrap();
    let exclude = vec!["a".to_owned()];
    let leased = balancer.lease(PickQuery { exclude: &exclude, ..query("round_robin", "") }, 6).await.unwrap();
    let picked: Vec<&str> = leased.picks.iter().map(|p| &*leased.instances[p.position as usize].id).collect();
    assert_eq!(picked.len(), 6);
    assert!(picked.iter().all(|id| ["b", "c"].contains(id)), "{picked:?}");
    // Excluding every instance a version's share falls on does not refuse the lease: that share
    // still names them (the caller passes over those picks).
    let leased = balancer.lease(PickQuery { exclude: &everyone, ..query("round_robin", "") }, 4).await.unwrap();
    assert_eq!(leased.picks.len(), 4);
}
