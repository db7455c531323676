//! The pure pick path and its neighbours, measured with criterion:
//!
//! - `select/<rule>/<n>` — the pure pick path of every rule that is a pure selection: drawing a
//!   ticket from the in-memory counter through the subset's cached rotation (no lock) and running
//!   the rule over n instances (1,000, 10,000, 100,000) with its tables built and a load index
//!   fed by a real statistics store, excluding 0, 1 or 3 of them
//!   (`select/<rule>/excluding-k/<n>`, as a retry does);
//! - `balancer/<rule>/<n>` — the whole in-process pick: policy, snapshot, isolation, ticket,
//!   rule, pick tally and in-flight accounting (no gRPC); also for `sticky` (a central table
//!   lookup and refresh) and `retry` (a wrapper around its inner rule);
//! - `publish/snapshot/<n>` — building a service snapshot of n instances;
//! - `publish/announce/<n>` — one Announce into a service of n instances, from the provider's
//!   call to its acknowledgement: the registry task, the snapshot and the pick view (with the
//!   tables picks used: weight schedule, Maglev table, load index);
//! - `parse/cold` and `parse/cached` — a rule string parsed, or looked up in the cache.
//!
//! Before criterion runs, it prints the heap allocations per pick counted by a wrapping global
//! allocator. Run: `cargo bench --bench pick`.

use std::hint::black_box;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use criterion::{BenchmarkId, Criterion, criterion_group};
use futures_util::FutureExt;
use rota::balancer::{Balancer, PickQuery};
use rota::load::{BreakerConfig, Origin, Outcome, Stats};
use rota::registry::{Instance, InstanceSpec, Registry, RegistryConfig, ServiceSnapshot, Subset};
use rota::rules::{Candidates, Draw, Excluded, LoadIndex, LoadTable, Needs, Select, parse};
use rota::state::{CounterKey, MemoryState, RotationCache};

#[path = "../tests/support/counting_alloc.rs"]
mod counting_alloc;

#[global_allocator]
static GLOBAL: counting_alloc::Counting = counting_alloc::Counting;

const SIZES: [usize; 3] = [1_000, 10_000, 100_000];
/// Instances excluded by the pick (a retry names the ones it tried).
const EXCLUDING: [usize; 3] = [0, 1, 3];
/// Every rule whose choice is a pure function of the draw; `sticky` and `retry` wrap a selection
/// inside the balancer and are measured there.
const RULES: [&str; 10] = [
    "round_robin",
    "random",
    "repeat",
    "weighted",
    "consistent_hash",
    "response_time",
    "least_request",
    "best_available",
    "availability_filtering",
    "zone_avoidance",
];

fn instances(service: &str, n: usize) -> Vec<Arc<Instance>> {
    (0..n)
        .map(|i| {
            let spec = InstanceSpec {
                id: format!("10.{}.{}.{}:8080", i / 65536, (i / 256) % 256, i % 256),
                service: service.into(),
                host: "10.0.0.1".into(),
                port: 8080,
                weight: Some(1 + (i % 7) as u32 * 50),
                ..Default::default()
            };
            Arc::new(spec.validate("bench").unwrap())
        })
        .collect()
}

fn keys() -> Vec<String> {
    (0..1024).map(|k| format!("user-{k}")).collect()
}

fn select_benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("select");
    let stats = Stats::default();
    let state = MemoryState::default();
    let keys = keys();
    for n in SIZES {
        let candidates = Candidates::new(Subset::new("version=", instances("svc", n)));
        candidates.build(Needs { schedule: true, maglev: true, load: false });
        let index = Arc::new(LoadIndex::new(candidates.subset.members.clone()));
        stats.attach(&index);
        // Every instance has a reported latency (1 to 50 ms), so `response_time` weighs them.
        let outliers = rota::load::Outliers::breaker(BreakerConfig::default());
        for (i, instance) in candidates.members().iter().enumerate() {
            let latency = std::time::Duration::from_millis(1 + (i % 50) as u64);
            stats.on_outcome(&instance.service, &instance.id, Outcome::Success, Origin::Pick, latency, outliers);
        }
        candidates.tables.load.store(Some(Arc::new(LoadTable::own(index))));
        let rotations = RotationCache::default();
        for (name, excluding) in RULES.iter().flat_map(|name| EXCLUDING.map(|e| (*name, e))) {
            // Retries exclude instances already tried: spread over the subset.
            let excluded: Vec<usize> = (0..excluding).map(|e| e * n / excluding.max(1)).collect();
            let rule = parse(name).unwrap();
            let counter = CounterKey { service: "svc".into(), rule: rule.canonical.clone(), subset: "version=".into() };
            let picked = Arc::new(AtomicU64::new(0));
            let mut rng = fastrand::Rng::with_seed(7);
            let id = if excluding == 0 {
                BenchmarkId::new(name, n)
            } else {
                BenchmarkId::new(format!("{name}/excluding-{excluding}"), n)
            };
            group.bench_with_input(id, &n, |b, _| {
                let mut k = 0usize;
                b.iter(|| {
                    let rotation = state.rotation(&rotations, &rule.canonical, || counter.clone(), || picked.clone());
                    let ticket = state.draw(&rotation);
                    k = (k + 1) & 1023;
                    let draw = Draw {
                        candidates: &candidates,
                        ticket,
                        key: &keys[k],
                        zone: "",
                        now: tokio::time::Instant::now(),
                        excluded: Excluded::new(&excluded),
                    };
                    black_box(rule.rule.select(&draw, &mut rng))
                })
            });
        }
    }
    group.finish();
}

/// A registry holding `n` instances of `svc`, and a balancer over it.
fn balancer(runtime: &tokio::runtime::Runtime, n: usize) -> (Balancer, Vec<rota::registry::Lease>) {
    runtime.block_on(async {
        let registry = Registry::spawn(RegistryConfig { max_instances_per_stream: 1000, ..Default::default() });
        let mut leases = Vec::new();
        let specs: Vec<InstanceSpec> = instances("svc", n)
            .iter()
            .map(|i| InstanceSpec {
                id: i.id.to_string(),
                service: "svc".into(),
                host: i.host.clone(),
                port: 8080,
                weight: Some(i.weight),
                ..Default::default()
            })
            .collect();
        for chunk in specs.chunks(1000) {
            let lease = registry.open_lease();
            lease.announce(chunk.to_vec()).await.unwrap();
            leases.push(lease);
        }
        registry.subscribe("svc").await.unwrap();
        (Balancer::with_defaults(registry), leases)
    })
}

fn balancer_benches(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut group = c.benchmark_group("balancer");
    let keys = keys();
    for n in SIZES {
        let (balancer, _leases) = balancer(&runtime, n);
        let _guard = runtime.enter();
        for name in
            ["round_robin", "weighted", "consistent_hash", "best_available", "sticky", "retry(rule=round_robin)"]
        {
            // The first pick of a rule on a subset waits for its tables.
            let first = PickQuery { service: "svc", rule: name, key: "warm-up", ..Default::default() };
            runtime.block_on(balancer.pick(first)).unwrap();
            group.bench_with_input(BenchmarkId::new(name, n), &n, |b, _| {
                let mut k = 0usize;
                b.iter(|| {
                    k = (k + 1) & 1023;
                    let query = PickQuery { service: "svc", rule: name, key: &keys[k], ..Default::default() };
                    black_box(balancer.pick(query).now_or_never().expect("memory picks are ready at once").unwrap())
                })
            });
        }
    }
    group.finish();
}

fn publish_benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("publish");
    for n in [10_000, 100_000] {
        let all = instances("svc", n);
        group.bench_with_input(BenchmarkId::new("snapshot", n), &n, |b, _| {
            b.iter(|| black_box(ServiceSnapshot::build("svc".into(), 1, all.clone())))
        });
    }
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    for n in [10_000, 100_000] {
        let (balancer, _leases) = balancer(&runtime, n);
        // Picks used these rules, so every publication builds their tables.
        for rule in ["weighted", "consistent_hash", "best_available"] {
            let query = PickQuery { service: "svc", rule, key: "k", ..Default::default() };
            runtime.block_on(balancer.pick(query)).unwrap();
        }
        let lease = balancer.registry().open_lease();
        let mut k = 0u32;
        group.bench_with_input(BenchmarkId::new("announce", n), &n, |b, _| {
            b.iter(|| {
                k += 1;
                // Two ids in turn, each with a new weight every time: every announce changes
                // the service, so every one is published.
                let spec = InstanceSpec {
                    id: format!("extra-{}", k % 2),
                    service: "svc".into(),
                    host: "10.9.9.9".into(),
                    port: 8080,
                    weight: Some(100 + k % 1000),
                    ..Default::default()
                };
                runtime.block_on(lease.announce(vec![spec])).unwrap()
            })
        });
    }
    group.finish();
}

fn parse_benches(c: &mut Criterion) {
    let cache = rota::rules::RuleCache::new();
    cache.get("retry(rule=repeat(n=3), max_ms=200)").unwrap();
    c.bench_function("parse/cold", |b| b.iter(|| black_box(parse(black_box("retry(rule=repeat(n=3), max_ms=200)")))));
    c.bench_function("parse/cached", |b| {
        b.iter(|| black_box(cache.get(black_box("retry(rule=repeat(n=3), max_ms=200)"))))
    });
}

/// Heap allocations per pick, after a warm-up that builds lazy tables and counters.
fn print_allocations() {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let (balancer, _leases) = balancer(&runtime, 10_000);
    let _guard = runtime.enter();
    let keys = keys();
    println!("heap allocations per pick (Balancer::pick, 10,000 instances, after warm-up):");
    for name in ["round_robin", "random", "repeat", "weighted", "consistent_hash", "best_available"] {
        let first = PickQuery { service: "svc", rule: name, key: "warm-up", ..Default::default() };
        runtime.block_on(balancer.pick(first)).unwrap();
        let pick = |k: usize| {
            let query = PickQuery { service: "svc", rule: name, key: &keys[k & 1023], ..Default::default() };
            balancer.pick(query).now_or_never().unwrap().unwrap();
        };
        (0..20_000).for_each(pick);
        let before = counting_alloc::allocations();
        (0..10_000).for_each(pick);
        let per_pick = (counting_alloc::allocations() - before) as f64 / 10_000.0;
        println!("  {name:<16} {per_pick:.3}");
    }
}

criterion_group!(benches, select_benches, balancer_benches, publish_benches, parse_benches);

fn main() {
    print_allocations();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
