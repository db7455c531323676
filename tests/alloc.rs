//! The pick path allocates nothing once warm, with or without `exclude`: `Balancer::pick` for
//! the rotation, hashing and load-aware rules is counted by a wrapping global allocator (deterministic; no
//! timing involved). Nor does the unary handler around it: the request read in place, the pick,
//! and the answer written from the bytes encoded at publish (a request naming instances to
//! exclude owns those names, and a fallback's answer its note). The tonic codec and the routed
//! call around them (`PickCodec`, `BalancerRoutes::call`) box one future per call and are not
//! counted here.

use bytes::Bytes;
use futures_util::FutureExt;
use prost::Message;
use rota::balancer::{Balancer, PickQuery};
use rota::grpc::pick_wire::{PickAnswer, PickRequestView};
use rota::pb;
use rota::registry::{InstanceSpec, Registry, RegistryConfig};

#[path = "support/counting_alloc.rs"]
mod counting_alloc;

#[global_allocator]
static GLOBAL: counting_alloc::Counting = counting_alloc::Counting;

#[test]
fn warm_picks_do_not_allocate() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let _guard = runtime.enter();
    let (balancer, _lease) = runtime.block_on(async {
        let registry = Registry::spawn(RegistryConfig::default());
        let lease = registry.open_lease();
        let specs: Vec<InstanceSpec> = (0..100)
            .map(|i| InstanceSpec {
                id: format!("i{i:03}"),
                service: "svc".into(),
                host: "10.0.0.1".into(),
                port: 8000 + i,
                weight: Some(1 + i % 5),
                ..Default::default()
            })
            .collect();
        assert!(lease.announce(specs).await.unwrap().refused.is_empty());
        registry.subscribe("svc").await.unwrap();
        let balancer = Balancer::with_defaults(registry);
        balancer.views().encode_answers_with(rota::grpc::convert::encoded_instance);
        (balancer, lease)
    });
    let keys: Vec<String> = (0..64).map(|k| format!("user-{k}")).collect();
    // Retries name instances already tried: excluding them must not allocate either.
    let tried = ["i003".to_owned(), "i050".to_owned(), "no-such-id".to_owned()];
    let rules = [
        "round_robin",
        "random",
        "repeat",
        "repeat(n=5)",
        "weighted",
        "consistent_hash",
        "consistent_hash(balance=1.25)",
        "best_available",
        "availability_filtering(limit=100000)",
        "least_request",
        "zone_avoidance",
        "response_time",
    ];
    for (rule, exclude) in rules.iter().flat_map(|rule| [(*rule, &tried[..0]), (*rule, &tried[..])]) {
        let pick = |k: usize| {
            let query = PickQuery { service: "svc", rule, key: &keys[k % 64], exclude, ..Default::default() };
            balancer.pick(query).now_or_never().expect("in-memory picks complete at once").expect("pick");
        };
        // The first pick of a rule on a subset waits for its tables to be built.
        let first = PickQuery { service: "svc", rule, key: "warm-up", exclude, ..Default::default() };
        runtime.block_on(balancer.pick(first)).expect("first pick");
        // Warm-up: counters, and every instance's statistics handle and tally for this rule (the
        // random rules need more picks to reach every instance; bounded).
        let canonical =
            balancer.pick(PickQuery { service: "svc", rule, key: "warm-up", exclude, ..Default::default() });
        let canonical = canonical.now_or_never().expect("warm pick").expect("pick").rule;
        // Rounds of 1,000 picks until every instance the rule can reach has a tally (the hashing
        // rules reach only the instances the 64 keys map to: until a round adds none).
        let mut tallied = 0;
        for _ in 0..100 {
            (0..1000).for_each(pick);
            let now = balancer.instance_picks("svc").iter().filter(|p| p.rule == canonical).count();
            if now >= 100 - excluded_instances(exclude) || now == tallied {
                break;
            }
            tallied = now;
        }
        let before = counting_alloc::allocations();
        (0..1000).for_each(pick);
        let allocations = counting_alloc::allocations() - before;
        let excluding = exclude.len();
        assert_eq!(allocations, 0, "{rule} excluding {excluding}: {allocations} allocations in 1000 warm picks");

        if !exclude.is_empty() {
            continue;
        }
        // The handler as a whole, on the rule's warm rotation.
        let requests: Vec<Bytes> = keys
            .iter()
            .map(|key| {
                let request = pb::PickRequest {
                    service: "svc".into(),
                    rule: rule.into(),
                    key: key.clone(),
                    ..Default::default()
                };
                Bytes::from(request.encode_to_vec())
            })
            .collect();
        let mut out = Vec::with_capacity(4096);
        let mut handle = |k: usize| {
            let view = PickRequestView::decode(requests[k % 64].clone()).expect("a valid request");
            let picked = balancer.pick(view.query()).now_or_never().expect("in-memory picks complete at once");
            let answer = PickAnswer::new(picked.expect("pick"));
            out.clear();
            answer.encode(&mut out);
            assert!(!out.is_empty());
        };
        (0..1000).for_each(&mut handle);
        let before = counting_alloc::allocations();
        (0..1000).for_each(&mut handle);
        let allocations = counting_alloc::allocations() - before;
        assert_eq!(allocations, 0, "{rule}: {allocations} allocations in 1000 warm unary handlings");
    }
}

/// How many of the test's instances `exclude` names (the rest are never picked with it).
fn excluded_instances(exclude: &[String]) -> usize {
    exclude.iter().filter(|id| id.starts_with('i')).count()
}
