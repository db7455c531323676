//! Every rule through the real server, with central feedback from several consumers.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rota::client::{PickOptions, RotaClient};
use rota::pb;
use rota::rules::KNOWN_RULES;

use crate::harness::{PATIENCE, TestServer, instance, picked_id, versioned};

fn failure(service: &str, id: &str) -> pb::CallOutcome {
    pb::CallOutcome {
        service: service.into(),
        instance_id: id.into(),
        latency_us: 2_000,
        result: pb::CallResult::ConnectFailure.into(),
        ..Default::default()
    }
}

fn short_breaker(service: &str, blackout_ms: u64) -> pb::Policy {
    pb::Policy {
        service: service.into(),
        breaker: Some(pb::Breaker {
            failure_threshold: 3,
            blackout_base_ms: blackout_ms,
            blackout_max_ms: blackout_ms,
        }),
        ..Default::default()
    }
}

async fn ids(client: &mut RotaClient, service: &str, options: PickOptions, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(picked_id(&client.pick(service, options.clone()).await.expect("pick")));
    }
    out
}

#[tokio::test]
async fn every_rule_is_reachable_by_name() {
    let server = TestServer::start().await;
    let _provider = server.register(vec![instance("all", "a", 1), instance("all", "b", 2)]).await;
    let mut client = server.client().await;
    for rule in KNOWN_RULES {
        let picked = client.pick("all", PickOptions::rule(*rule).key("user-1")).await;
        let picked = picked.unwrap_or_else(|e| panic!("{rule}: {e}"));
        assert!(["a", "b"].contains(&picked_id(&picked).as_str()), "{rule}");
        assert!(picked.rule.starts_with(rule), "{rule} answered as {}", picked.rule);
    }
    let error = client.pick("all", PickOptions::rule("consistent_hash")).await.unwrap_err();
    assert_eq!(error.code(), Some(tonic::Code::InvalidArgument));
    assert!(error.to_string().contains("needs a request key"), "{error}");
}

/// Three consumers each report one failure of `b`: together they trip its breaker, and every
/// consumer avoids it. (The blackout is an hour, so no check depends on how fast picks are.)
#[tokio::test]
async fn failures_from_three_consumers_trip_the_breaker_for_everyone() {
    let server = TestServer::start().await;
    let _provider = server.register(vec![instance("cb", "a", 1), instance("cb", "b", 2), instance("cb", "c", 3)]).await;
    let mut admin = server.client().await;
    admin.set_policy(short_breaker("cb", 3_600_000)).await.unwrap();
    let mut consumers = [server.client().await, server.client().await, server.client().await];
    for consumer in &mut consumers {
        let response = consumer.report(vec![failure("cb", "b")]).await.unwrap();
        assert_eq!(response.accepted, 1);
    }
    for rule in ["availability_filtering", "best_available"] {
        for consumer in &mut consumers {
            let picks = ids(consumer, "cb", PickOptions::rule(rule), 6).await;
            assert!(!picks.contains(&"b".to_owned()), "{rule}: {picks:?}");
        }
    }
}

/// After its blackout a tripped instance is picked again, and not before.
#[tokio::test]
async fn a_tripped_instance_returns_after_the_blackout() {
    let server = TestServer::start().await;
    let _provider = server.register(vec![instance("cbb", "a", 1), instance("cbb", "b", 2)]).await;
    let mut client = server.client().await;
    const BLACKOUT: Duration = Duration::from_millis(500);
    client.set_policy(short_breaker("cbb", BLACKOUT.as_millis() as u64)).await.unwrap();
    // Taken before the failures, so the bound below holds however slow the reports are.
    let before_trip = Instant::now();
    client.report(vec![failure("cbb", "b"), failure("cbb", "b"), failure("cbb", "b")]).await.unwrap();
    let deadline = Instant::now() + PATIENCE;
    for rule in ["availability_filtering", "best_available"] {
        loop {
            let picks = ids(&mut client, "cbb", PickOptions::rule(rule), 3).await;
            if picks.contains(&"b".to_owned()) {
                break;
            }
            assert!(Instant::now() < deadline, "{rule} never returned to b");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert!(before_trip.elapsed() >= BLACKOUT, "b came back before its blackout ended");
}

#[tokio::test]
async fn a_success_report_clears_the_breaker_at_once() {
    let server = TestServer::start().await;
    let _provider = server.register(vec![instance("clr", "a", 1), instance("clr", "b", 2)]).await;
    let mut client = server.client().await;
    client.report(vec![failure("clr", "b"), failure("clr", "b"), failure("clr", "b")]).await.unwrap();
    assert_eq!(ids(&mut client, "clr", PickOptions::rule("availability_filtering"), 4).await, ["a"; 4]);
    let ok = pb::CallOutcome { result: pb::CallResult::Ok.into(), ..failure("clr", "b") };
    client.report(vec![ok]).await.unwrap();
    let picks = ids(&mut client, "clr", PickOptions::rule("availability_filtering"), 2).await;
    assert!(picks.contains(&"b".to_owned()), "{picks:?}");
}

#[tokio::test]
async fn retry_waits_for_a_breaker_to_close_instead_of_failing() {
    let server = TestServer::start().await;
    let _provider = server.register(vec![instance("rt", "only", 1)]).await;
    let mut client = server.client().await;
    // A blackout of an hour: the checks below cannot outlast it, however slow the machine.
    client.set_policy(short_breaker("rt", 3_600_000)).await.unwrap();
    client.report(vec![failure("rt", "only"), failure("rt", "only"), failure("rt", "only")]).await.unwrap();
    // The only instance is tripped: availability filtering can only fall back...
    let filtered = client.pick("rt", PickOptions::rule("availability_filtering")).await.unwrap();
    assert!(filtered.fallback.contains("tripped"), "{}", filtered.fallback);
    // ...and retry, with a budget far shorter than the blackout, gives up with UNAVAILABLE.
    let error = client.pick("rt", PickOptions::rule("retry(max_ms=50)")).await.unwrap_err();
    assert_eq!(error.code(), Some(tonic::Code::Unavailable));
    assert!(error.to_string().contains("retry gave up after 50 ms"), "{error}");

    // With a short blackout, retry waits for the breaker to close and then picks the
    // instance, with no fallback, never before the blackout ends.
    let _other = server.register(vec![instance("rt-short", "only", 1)]).await;
    client.set_policy(short_breaker("rt-short", 300)).await.unwrap();
    let before_trip = Instant::now();
    client
        .report(vec![failure("rt-short", "only"), failure("rt-short", "only"), failure("rt-short", "only")])
        .await
        .unwrap();
    let picked = client.pick("rt-short", PickOptions::rule("retry(rule=round_robin, max_ms=10000)")).await.unwrap();
    assert_eq!((picked_id(&picked).as_str(), picked.fallback.as_str()), ("only", ""));
    assert!(before_trip.elapsed() >= Duration::from_millis(300), "retry picked a tripped instance");
}

#[tokio::test]
async fn weighted_shares_are_exact_over_a_cycle_across_consumers() {
    let server = TestServer::start().await;
    let heavy = pb::Instance { weight: Some(3), ..instance("w", "heavy", 1) };
    let light = pb::Instance { weight: Some(1), ..instance("w", "light", 2) };
    let never = pb::Instance { weight: Some(0), ..instance("w", "zero", 3) };
    let _provider = server.register(vec![heavy, light, never]).await;
    let mut consumers = [server.client().await, server.client().await];
    let mut counts: HashMap<String, usize> = HashMap::new();
    for i in 0..40 {
        let picked = consumers[i % 2].pick("w", PickOptions::rule("weighted")).await.unwrap();
        *counts.entry(picked_id(&picked)).or_default() += 1;
    }
    assert_eq!(counts, HashMap::from([("heavy".into(), 30), ("light".into(), 10)]));
}

#[tokio::test]
async fn consistent_hash_and_sticky_agree_across_consumers() {
    let server = TestServer::start().await;
    let _a = server.register(vec![instance("aff", "a", 1)]).await;
    let b = server.register(vec![instance("aff", "b", 2)]).await;
    let _c = server.register(vec![instance("aff", "c", 3)]).await;
    let mut first = server.client().await;
    let mut second = server.client().await;
    let mut sticky_owner = HashMap::new();
    for k in 0..12 {
        let key = format!("user-{k}");
        let hashed = picked_id(&first.pick("aff", PickOptions::rule("consistent_hash").key(&key)).await.unwrap());
        let again = picked_id(&second.pick("aff", PickOptions::rule("consistent_hash").key(&key)).await.unwrap());
        assert_eq!(hashed, again, "{key}");
        let stuck = picked_id(&first.pick("aff", PickOptions::rule("sticky(ttl=1m)").key(&key)).await.unwrap());
        for _ in 0..3 {
            let from_second = second.pick("aff", PickOptions::rule("sticky(ttl=1m)").key(&key)).await.unwrap();
            assert_eq!(picked_id(&from_second), stuck, "{key} stays on its instance");
        }
        sticky_owner.insert(key, stuck);
    }
    assert!(sticky_owner.values().any(|id| id == "b"), "some keys were assigned to b: {sticky_owner:?}");

    // b's stream closes: its keys move, the others stay.
    b.close().await.unwrap();
    for (key, owner) in &sticky_owner {
        let now = picked_id(&second.pick("aff", PickOptions::rule("sticky(ttl=1m)").key(key)).await.unwrap());
        if owner == "b" {
            assert_ne!(now, "b", "{key}");
            let again = picked_id(&first.pick("aff", PickOptions::rule("sticky(ttl=1m)").key(key)).await.unwrap());
            assert_eq!(again, now, "{key} is stable on its new instance");
        } else {
            assert_eq!(&now, owner, "{key} did not move");
        }
    }
}

#[tokio::test]
async fn gray_release_sends_exactly_ten_in_a_hundred() {
    let server = TestServer::start().await;
    let _provider = server
        .register(vec![instance("gray", "s1", 1), instance("gray", "s2", 2), versioned("gray", "canary", 3, "v2")])
        .await;
    let mut admin = server.client().await;
    let gray = pb::GrayRelease { unversioned: 90, versions: [("v2".to_owned(), 10)].into() };
    admin.set_policy(pb::Policy { service: "gray".into(), gray: Some(gray), ..Default::default() }).await.unwrap();
    let mut consumers = [server.client().await, server.client().await];
    let mut canary = 0;
    for i in 0..200 {
        let picked = consumers[i % 2].pick("gray", PickOptions::default()).await.unwrap();
        canary += usize::from(picked_id(&picked) == "canary");
    }
    assert_eq!(canary, 20);
    // A request that names a version is not subject to gray weights.
    assert_eq!(ids(&mut consumers[0], "gray", PickOptions::default().version("v2"), 3).await, ["canary"; 3]);
}

#[tokio::test]
async fn a_policy_change_applies_to_every_consumer_and_bad_ones_are_refused() {
    let server = TestServer::start().await;
    let _provider = server.register(vec![instance("pol", "a", 1), instance("pol", "b", 2)]).await;
    let mut consumers = [server.client().await, server.client().await];
    assert_eq!(ids(&mut consumers[0], "pol", PickOptions::default(), 2).await, ["a", "b"]);

    let mut admin = server.client().await;
    let policy = pb::Policy { service: "pol".into(), rule: "repeat(n=2)".into(), ..Default::default() };
    let stored = admin.set_policy(policy).await.unwrap();
    assert_eq!((stored.rule.as_str(), stored.is_default), ("repeat(n=2)", false));
    let mut sequence = Vec::new();
    for i in 0..6 {
        let picked = consumers[i % 2].pick("pol", PickOptions::default()).await.unwrap();
        assert_eq!(picked.rule, "repeat(n=2)");
        sequence.push(picked_id(&picked));
    }
    assert_eq!(sequence, ["a", "a", "b", "b", "a", "a"]);

    let bad = pb::Policy { service: "pol".into(), rule: "zigzag".into(), ..Default::default() };
    let error = admin.set_policy(bad).await.unwrap_err();
    assert_eq!(error.code(), Some(tonic::Code::InvalidArgument));
    assert!(error.to_string().contains("policy.rule is invalid"), "{error}");
    assert_eq!(admin.get_policy("pol").await.unwrap().rule, "repeat(n=2)", "the old policy stays");
    assert!(admin.get_policy("other").await.unwrap().is_default);
}

#[tokio::test]
async fn isolation_fallback_any_is_a_per_service_setting() {
    let server = TestServer::start().await;
    let _provider = server.register(vec![versioned("iso-any", "dev", 1, "zlt")]).await;
    let mut client = server.client().await;
    let error = client.pick("iso-any", PickOptions::default()).await.unwrap_err();
    assert_eq!(error.code(), Some(tonic::Code::Unavailable));
    let policy = pb::Policy {
        service: "iso-any".into(),
        isolation_fallback: pb::IsolationFallback::Any.into(),
        ..Default::default()
    };
    client.set_policy(policy).await.unwrap();
    let picked = client.pick("iso-any", PickOptions::default()).await.unwrap();
    assert_eq!(picked_id(&picked), "dev");
    assert_eq!(picked.fallback, "no instance without a version; picked from any instance");
}

#[tokio::test]
async fn least_request_and_response_time_use_fleet_wide_feedback() {
    let server = TestServer::start().await;
    let _provider = server.register(vec![instance("fb", "fast", 1), instance("fb", "slow", 2)]).await;
    let mut client = server.client().await;
    // Five picks of "slow" stay unreported: it is busier, so P2C over both always prefers "fast".
    for _ in 0..5 {
        client.pick("fb", PickOptions::rule("consistent_hash").key("pin-to-slow")).await.unwrap();
    }
    let pinned = picked_id(&client.pick("fb", PickOptions::rule("consistent_hash").key("pin-to-slow")).await.unwrap());
    let other = if pinned == "fast" { "slow" } else { "fast" };
    assert_eq!(ids(&mut client, "fb", PickOptions::rule("least_request"), 5).await, vec![other; 5]);
    assert_eq!(ids(&mut client, "fb", PickOptions::rule("best_available"), 1).await, vec![other]);

    // Latency reports: 10 ms vs 990 ms gives weights 990 : 10, and one pick in 16 goes round
    // robin: 96 % of the picks go fast (192 of 200; 100 without the reports).
    let outcome = |id: &str, us: u64| pb::CallOutcome {
        service: "fb".into(),
        instance_id: id.into(),
        latency_us: us,
        result: pb::CallResult::Ok.into(),
        ..Default::default()
    };
    client.report(vec![outcome("fast", 10_000), outcome("slow", 990_000)]).await.unwrap();
    let picks = ids(&mut client, "fb", PickOptions::rule("response_time"), 200).await;
    let fast = picks.iter().filter(|id| *id == "fast").count();
    assert!(fast >= 178, "fast got {fast} of 200");
}
