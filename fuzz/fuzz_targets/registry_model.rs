//! The registry against a reference model.
//!
//! The input is a script of operations by three providers (registration streams), applied to
//! a real `Registry` (one task, paused time) and to a model that is just a map from
//! (service, id) to the owning stream and the instance's fields, plus the set of services the
//! catalog knows. After every operation the acknowledgement (accepted and refused instances,
//! by kind of refusal) and the published catalog must match the model, and every snapshot must
//! be internally consistent (sorted, its UP/version subsets derived from its instances, epochs
//! that move forward on change).
//!
//! The semantics the model states:
//! - an announced instance belongs to the stream that announced it; another live stream's
//!   announcement of the same (service, id) is refused (`OwnedElsewhere`), its own replaces it;
//! - an announcement is refused whole if it names more than the per-stream limit, or if the
//!   stream would then hold more than the limit counting every id it does not own yet;
//! - only the owner may update (fields left unset keep their value) or withdraw an instance;
//!   withdrawing nothing withdraws everything the stream owns;
//! - closing a stream, or letting it stay silent for the heartbeat timeout, removes its
//!   instances; an expired stream's later announcements are refused and its withdrawals do
//!   nothing;
//! - every message on a stream, refused or not, is a heartbeat;
//! - a new service beyond the registry's service limit is refused (`TooManyServices`), and so
//!   is a service that a token's streams hold nothing in yet when they already hold instances
//!   in as many services as the per-token limit (streams 0 and 1 share token `t1`; stream 2
//!   has none); these limits are checked before ownership;
//! - a service left without instances stays in the catalog, empty, until it has been empty for
//!   the service idle timeout (nobody watches here), and is then forgotten.
//!
//! Input format: one byte per operation, `stream = b % 3` and `kind = b / 3 % 7`, followed by
//! that kind's argument bytes (missing bytes read as 0):
//!
//! | kind | operation | arguments                                                        |
//! |------|-----------|------------------------------------------------------------------|
//! | 0, 6 | Announce  | count n (n % 6 instances), then 2 bytes per instance, see [`spec`]|
//! | 1    | Update    | target byte (see [`target`]), fields byte (see [`update`])       |
//! | 2    | Withdraw  | count n (n % 4 refs; 0 = all), then one target byte per ref       |
//! | 3    | Close     | —                                                                |
//! | 4    | Heartbeat | —                                                                |
//! | 5    | Advance   | seconds (b % 16) of paused time                                  |
//!
//! Limits: heartbeat timeout 10 s, 4 instances per stream, 2 services, 1 service per token,
//! service idle timeout 30 s.

#![no_main]

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use rota::registry::{
    InstanceRef, InstanceSpec, InstanceUpdate, Lease, Outcome, Refused, Registry, RegistryConfig, RequestedStatus,
    Status,
};

const STREAMS: usize = 3;
const TIMEOUT_SECS: u64 = 10;
const LIMIT: usize = 4;
const MAX_OPS: usize = 64;

/// Streams 0 and 1 authenticate with the same token; stream 2 with none.
const TOKENS: [Option<&str>; STREAMS] = [Some("t1"), Some("t1"), None];
const IDLE_SECS: u64 = 30;
const MAX_SERVICES: usize = 2;
const MAX_SERVICES_PER_TOKEN: usize = 1;

const SERVICES: [&str; 4] = ["s1", "s2", "s3", "bad name"];
const IDS: [&str; 4] = ["a", "b", "c", ""];
const REF_IDS: [&str; 4] = ["a", "b", "h:1", ""];
const VERSIONS: [&str; 2] = ["", "v1"];
const WEIGHTS: [Option<u32>; 5] = [None, Some(0), Some(1), Some(100), Some(u32::MAX)];
const STATUSES: [RequestedStatus; 5] = [
    RequestedStatus::Unset,
    RequestedStatus::Known(Status::Up),
    RequestedStatus::Known(Status::Draining),
    RequestedStatus::Known(Status::Down),
    RequestedStatus::Unknown(7),
];

fuzz_target!(|data: &[u8]| {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    runtime.block_on(run(data));
});

/// Reads argument bytes; past the end, zeros.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn next(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
}

#[derive(Debug, Clone)]
enum Op {
    Announce(Vec<InstanceSpec>),
    Update(InstanceUpdate),
    Withdraw(Vec<InstanceRef>),
    Close,
    Heartbeat,
    Advance(u64),
}

/// An instance. From `x`: service (`s1`..`s3`, `x % 3`), id (`a`, `b`, `c` or none, so
/// `h:PORT`), version (none or `v1`); `x / 24` of 9 names the invalid service, of 10 port 0.
/// From `y`: weight (`y % 5`), status (`y / 5 % 5`, the last an unknown one), metadata
/// (`y / 25 % 2`), port 2 when `y / 50` is 1 (else 1), and an empty host from 250 on.
fn spec(x: u8, y: u8) -> InstanceSpec {
    let x = usize::from(x);
    let y = usize::from(y);
    let odd = x / 24;
    InstanceSpec {
        service: if odd == 9 { SERVICES[3] } else { SERVICES[x % 3] }.into(),
        id: IDS[x / 3 % 4].into(),
        port: if odd == 10 { 0 } else if y / 50 == 1 { 2 } else { 1 },
        version: VERSIONS[x / 12 % 2].into(),
        host: if y >= 250 { String::new() } else { "h".into() },
        weight: WEIGHTS[y % 5],
        status: STATUSES[y / 5 % 5],
        metadata: if y / 25 % 2 == 1 { BTreeMap::from([("k".into(), "v".into())]) } else { BTreeMap::new() },
        zone: String::new(),
    }
}

/// An instance reference: service `x % 4` of `s1`, `s2`, `s3` and an invalid name, id
/// `x / 4 % 4` of `a`, `b`, `h:1` and the empty id.
fn target(x: u8) -> InstanceRef {
    let x = usize::from(x);
    InstanceRef { service: SERVICES[x % 4].into(), id: REF_IDS[x / 4 % 4].into() }
}

/// An update of `target(x)`: weight, status, and metadata (unset, empty, one entry, or one
/// with an empty key, which is invalid) from `y`.
fn update(x: u8, y: u8) -> InstanceUpdate {
    let InstanceRef { service, id } = target(x);
    let y = usize::from(y);
    let metadata = match y / 25 % 4 {
        0 => None,
        1 => Some(BTreeMap::new()),
        2 => Some(BTreeMap::from([("k".into(), "v2".into())])),
        _ => Some(BTreeMap::from([(String::new(), "x".into())])),
    };
    InstanceUpdate { service, id, weight: WEIGHTS[y % 5], status: STATUSES[y / 5 % 5], metadata }
}

fn decode(data: &[u8]) -> Vec<(usize, Op)> {
    let mut bytes = Bytes(data);
    let mut ops = Vec::new();
    while !bytes.0.is_empty() && ops.len() < MAX_OPS {
        let b = bytes.next();
        let stream = usize::from(b) % STREAMS;
        let op = match b / 3 % 7 {
            0 | 6 => {
                let n = bytes.next() % 6;
                Op::Announce((0..n).map(|_| spec(bytes.next(), bytes.next())).collect())
            }
            1 => Op::Update(update(bytes.next(), bytes.next())),
            2 => {
                let n = bytes.next() % 4;
                Op::Withdraw((0..n).map(|_| target(bytes.next())).collect())
            }
            3 => Op::Close,
            4 => Op::Heartbeat,
            _ => Op::Advance(u64::from(bytes.next() % 16)),
        };
        ops.push((stream, op));
    }
    ops
}

// ---------------------------------------------------------------------------------------------
// The model
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StreamState {
    /// No lease: the next operation opens one.
    Closed,
    /// Open, last heard from at this second.
    Live { last: u64 },
    /// Its lease expired; the stream object is still there.
    Expired,
}

/// What the catalog shows of one instance.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fields {
    host: String,
    port: u16,
    version: String,
    weight: u32,
    status: Status,
    metadata: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Invalid,
    OwnedElsewhere,
    NotOwned,
    TooMany,
    TooManyServices,
    ShuttingDown,
}

type Key = (String, String);

/// An acknowledgement, order-free: accepted refs and refused refs with the kind of refusal.
#[derive(Debug, Default, PartialEq, Eq)]
struct Ack {
    accepted: Vec<Key>,
    refused: Vec<(Key, Kind)>,
}

impl Ack {
    fn sorted(mut self) -> Self {
        self.accepted.sort();
        self.refused.sort();
        self
    }
}

struct Model {
    now: u64,
    streams: [StreamState; STREAMS],
    instances: BTreeMap<Key, (usize, Fields)>,
    /// Services in the catalog: each with the second it was left empty, if it is.
    services: BTreeMap<String, Option<u64>>,
}

fn kind(refused: &Refused) -> Kind {
    match refused {
        Refused::Invalid(_) => Kind::Invalid,
        Refused::OwnedElsewhere { .. } => Kind::OwnedElsewhere,
        Refused::NotOwned { .. } => Kind::NotOwned,
        Refused::TooManyInstances { .. } => Kind::TooMany,
        Refused::ShuttingDown => Kind::ShuttingDown,
        Refused::TooManyServices { .. } => Kind::TooManyServices,
        other => panic!("unexpected refusal without authentication: {other}"),
    }
}

fn ack_of(outcome: &Outcome) -> Ack {
    Ack {
        accepted: outcome.accepted.iter().map(|r| (r.service.clone(), r.id.clone())).collect(),
        refused: outcome.refused.iter().map(|(r, why)| ((r.service.clone(), r.id.clone()), kind(why))).collect(),
    }
    .sorted()
}

/// The model's own validation, over the tiny alphabet the input draws from.
fn valid_service(service: &str) -> bool {
    service != "bad name"
}

fn valid_status(status: RequestedStatus) -> bool {
    !matches!(status, RequestedStatus::Unknown(_))
}

/// The id an instance is known by: its own, or `host:port` when it has none (and a host).
fn id_of(spec: &InstanceSpec) -> String {
    if spec.id.is_empty() && !spec.host.is_empty() { format!("{}:{}", spec.host, spec.port) } else { spec.id.clone() }
}

fn valid_spec(spec: &InstanceSpec) -> Option<Fields> {
    let ok = valid_service(&spec.service)
        && !spec.host.is_empty()
        && (1..=65535).contains(&spec.port)
        && valid_status(spec.status);
    ok.then(|| Fields {
        host: spec.host.clone(),
        port: spec.port as u16,
        version: spec.version.clone(),
        weight: spec.weight.unwrap_or(100),
        status: match spec.status {
            RequestedStatus::Known(status) => status,
            _ => Status::Up,
        },
        metadata: spec.metadata.clone(),
    })
}

impl Model {
    fn owned_by(&self, stream: usize) -> Vec<Key> {
        self.instances.iter().filter(|(_, (owner, _))| *owner == stream).map(|(key, _)| key.clone()).collect()
    }

    fn drop_stream(&mut self, stream: usize) {
        let keys = self.owned_by(stream);
        self.remove(&keys);
    }

    /// Removes instances; a service left without any is empty from now on.
    fn remove(&mut self, keys: &[Key]) {
        for key in keys {
            if self.instances.remove(key).is_some() && !self.instances.keys().any(|(service, _)| *service == key.0) {
                self.services.insert(key.0.clone(), Some(self.now));
            }
        }
    }

    /// Services in which the streams of `token` hold instances.
    fn token_services(&self, token: &str) -> Vec<&str> {
        let mut held: Vec<&str> = self
            .instances
            .iter()
            .filter(|(_, (owner, _))| TOKENS[*owner] == Some(token))
            .map(|((service, _), _)| service.as_str())
            .collect();
        held.dedup();
        held
    }

    /// Whether an instance of `service` from `stream` would be one service too many.
    fn over_service_limit(&self, stream: usize, service: &str) -> bool {
        if !self.services.contains_key(service) && self.services.len() >= MAX_SERVICES {
            return true;
        }
        TOKENS[stream].is_some_and(|token| {
            let held = self.token_services(token);
            !held.contains(&service) && held.len() >= MAX_SERVICES_PER_TOKEN
        })
    }

    /// Every message is a heartbeat.
    fn heard(&mut self, stream: usize) {
        if let StreamState::Live { last } = &mut self.streams[stream] {
            *last = self.now;
        }
    }

    fn announce(&mut self, stream: usize, specs: &[InstanceSpec]) -> Ack {
        self.heard(stream);
        let mut ack = Ack::default();
        if specs.is_empty() {
            ack.refused.push(((String::new(), String::new()), Kind::Invalid));
            return ack;
        }
        let raw = |spec: &InstanceSpec| (spec.service.clone(), id_of(spec));
        if specs.len() > LIMIT {
            ack.refused = specs.iter().map(|s| (raw(s), Kind::TooMany)).collect();
            return ack.sorted();
        }
        let mut valid = Vec::new();
        for spec in specs {
            match valid_spec(spec) {
                Some(fields) => valid.push((raw(spec), fields)),
                None => ack.refused.push((raw(spec), Kind::Invalid)),
            }
        }
        if self.streams[stream] == StreamState::Expired {
            ack.refused.extend(valid.into_iter().map(|(key, _)| (key, Kind::ShuttingDown)));
            return ack.sorted();
        }
        let owned = self.owned_by(stream);
        let mut new_keys: Vec<&Key> = valid.iter().map(|(key, _)| key).filter(|key| !owned.contains(key)).collect();
        new_keys.sort();
        new_keys.dedup();
        if owned.len() + new_keys.len() > LIMIT {
            ack.refused.extend(valid.into_iter().map(|(key, _)| (key, Kind::TooMany)));
            return ack.sorted();
        }
        for (key, fields) in valid {
            if self.over_service_limit(stream, &key.0) {
                ack.refused.push((key, Kind::TooManyServices));
                continue;
            }
            match self.instances.get(&key) {
                Some((owner, _)) if *owner != stream => ack.refused.push((key, Kind::OwnedElsewhere)),
                _ => {
                    ack.accepted.push(key.clone());
                    self.services.insert(key.0.clone(), None);
                    self.instances.insert(key, (stream, fields));
                }
            }
        }
        ack.sorted()
    }

    fn update(&mut self, stream: usize, update: &InstanceUpdate) -> Ack {
        self.heard(stream);
        let key = (update.service.clone(), update.id.clone());
        let valid = valid_service(&update.service)
            && !update.id.is_empty()
            && update.metadata.as_ref().is_none_or(|m| !m.contains_key(""))
            && valid_status(update.status);
        if !valid {
            return Ack { accepted: Vec::new(), refused: vec![(key, Kind::Invalid)] };
        }
        match self.instances.get_mut(&key) {
            Some((owner, fields)) if *owner == stream => {
                if let Some(weight) = update.weight {
                    fields.weight = weight;
                }
                if let RequestedStatus::Known(status) = update.status {
                    fields.status = status;
                }
                if let Some(metadata) = &update.metadata {
                    fields.metadata = metadata.clone();
                }
                Ack { accepted: vec![key], refused: Vec::new() }
            }
            _ => Ack { accepted: Vec::new(), refused: vec![(key, Kind::NotOwned)] },
        }
    }

    fn withdraw(&mut self, stream: usize, refs: &[InstanceRef]) -> Ack {
        self.heard(stream);
        let mut ack = Ack::default();
        if self.streams[stream] == StreamState::Expired {
            return ack;
        }
        let owned = self.owned_by(stream);
        if refs.is_empty() {
            ack.accepted = owned;
        } else {
            for r in refs {
                let key = (r.service.clone(), r.id.clone());
                if owned.contains(&key) {
                    ack.accepted.push(key);
                } else {
                    ack.refused.push((key, Kind::NotOwned));
                }
            }
        }
        let accepted = ack.accepted.clone();
        self.remove(&accepted);
        ack.sorted()
    }

    /// Streams whose lease runs out by `now`; services empty for the idle timeout are
    /// forgotten (the harness watches none).
    fn advance(&mut self, seconds: u64) -> Vec<usize> {
        self.now += seconds;
        let now = self.now;
        self.services.retain(|_, empty_since| empty_since.is_none_or(|since| since + IDLE_SECS > now));
        let mut expired = Vec::new();
        for stream in 0..STREAMS {
            if let StreamState::Live { last } = self.streams[stream]
                && last + TIMEOUT_SECS <= self.now
            {
                self.streams[stream] = StreamState::Expired;
                self.drop_stream(stream);
                expired.push(stream);
            }
        }
        expired
    }
}

// ---------------------------------------------------------------------------------------------
// The real registry, and the comparison
// ---------------------------------------------------------------------------------------------

type Expiry = Pin<Box<dyn Future<Output = ()> + Send>>;

struct Stream {
    lease: Lease,
    expiry: Option<Expiry>,
}

/// What the catalog said of each service when last looked at: its epoch and instances.
type Seen = HashMap<String, (u64, BTreeMap<String, Fields>)>;

async fn run(data: &[u8]) {
    let ops = decode(data);
    if ops.is_empty() {
        return;
    }
    let registry = Registry::spawn(RegistryConfig {
        heartbeat_timeout: Duration::from_secs(TIMEOUT_SECS),
        max_instances_per_stream: LIMIT,
        service_idle_timeout: Duration::from_secs(IDLE_SECS),
        max_services: MAX_SERVICES,
        max_services_per_token: MAX_SERVICES_PER_TOKEN,
        // Every batch published at once, as the model expects.
        publish_window: Duration::ZERO,
    });
    let mut streams: [Option<Stream>; STREAMS] = Default::default();
    let mut model =
        Model { now: 0, streams: [StreamState::Closed; STREAMS], instances: BTreeMap::new(), services: BTreeMap::new() };
    let mut seen = Seen::new();
    for (step, (s, op)) in ops.iter().enumerate() {
        let context = || format!("step {step}: stream {s} {op:?}\nscript: {ops:?}");
        if !matches!(op, Op::Advance(_)) && model.streams[*s] == StreamState::Closed {
            let mut lease = registry.open_lease_for(TOKENS[*s].map(Into::into));
            let expiry: Expiry = Box::pin(lease.take_expiry());
            streams[*s] = Some(Stream { lease, expiry: Some(expiry) });
            model.streams[*s] = StreamState::Live { last: model.now };
        }
        let lease = || &streams[*s].as_ref().expect("an open stream").lease;
        match op {
            Op::Announce(specs) => {
                let outcome = lease().announce(specs.clone()).await.expect("registry runs");
                let expected = model.announce(*s, specs);
                assert_eq!(ack_of(&outcome), expected, "announce acknowledged differently\n{}", context());
            }
            Op::Update(update) => {
                let outcome = lease().update(update.clone()).await.expect("registry runs");
                let expected = model.update(*s, update);
                assert_eq!(ack_of(&outcome), expected, "update acknowledged differently\n{}", context());
            }
            Op::Withdraw(refs) => {
                let outcome = lease().withdraw(refs.clone()).await.expect("registry runs");
                let expected = model.withdraw(*s, refs);
                assert_eq!(ack_of(&outcome), expected, "withdraw acknowledged differently\n{}", context());
            }
            Op::Heartbeat => {
                lease().touch();
                model.heard(*s);
                settle(&registry).await;
            }
            Op::Close => {
                streams[*s] = None;
                model.drop_stream(*s);
                model.streams[*s] = StreamState::Closed;
                settle(&registry).await;
            }
            Op::Advance(seconds) => {
                // Messages that were not acknowledged (opens, heartbeats, announcements refused
                // before reaching the registry task) must be applied at the current time.
                settle(&registry).await;
                tokio::time::advance(Duration::from_secs(*seconds)).await;
                for expired in model.advance(*seconds) {
                    let stream = streams[expired].as_mut().expect("an expired stream is still held");
                    let expiry = stream.expiry.take().expect("a lease expires once");
                    // Paused time jumps ahead when the runtime idles, so a lease the registry
                    // does not expire ends this wait rather than hanging.
                    tokio::time::timeout(Duration::from_millis(1), expiry).await.unwrap_or_else(|_| {
                        panic!("stream {expired} should have expired at {} s\n{}", model.now, context())
                    });
                }
                // Twice: a forgotten service may be noticed just after the first settles.
                settle(&registry).await;
                settle(&registry).await;
            }
        }
        compare(&registry, &model, &mut seen, &context);
    }
}

/// Waits until the registry task has applied everything sent so far (a subscription is
/// answered only after every earlier command).
async fn settle(registry: &Registry) {
    registry.subscribe("settle").await.expect("registry runs");
}

fn compare(registry: &Registry, model: &Model, seen: &mut Seen, context: &dyn Fn() -> String) {
    let catalog = registry.catalog();
    let mut published: BTreeMap<Key, Fields> = BTreeMap::new();
    let mut names: Vec<String> = Vec::new();
    for snapshot in catalog.snapshots() {
        let name = &snapshot.name;
        names.push(name.to_string());
        assert!(
            catalog.get(name).is_some_and(|s| std::sync::Arc::ptr_eq(s, snapshot)),
            "{name}: not found under its own name\n{}",
            context()
        );
        let instances: BTreeMap<String, Fields> = snapshot
            .instances
            .iter()
            .map(|i| {
                assert_eq!(*i.service, **name, "instance {:?} filed under another service\n{}", i.id, context());
                let fields = Fields {
                    host: i.host.clone(),
                    port: i.port,
                    version: i.version.to_string(),
                    weight: i.weight,
                    status: i.status,
                    metadata: i.metadata.clone(),
                };
                (i.id.to_string(), fields)
            })
            .collect();
        check_snapshot(snapshot, context);
        if let Some((epoch, before)) = seen.get(&**name) {
            assert!(snapshot.epoch >= *epoch, "{name}: epoch went back from {epoch} to {}\n{}", snapshot.epoch, context());
            if *before != instances {
                assert!(snapshot.epoch > *epoch, "{name}: instances changed at the same epoch {epoch}\n{}", context());
            }
        }
        for (id, fields) in &instances {
            published.insert((name.to_string(), id.clone()), fields.clone());
        }
        seen.insert(name.to_string(), (snapshot.epoch, instances));
    }
    // A forgotten service starts over from epoch 1 if it comes back.
    seen.retain(|name, _| names.contains(name));
    names.sort();
    let known: Vec<String> = model.services.keys().cloned().collect();
    assert_eq!(names, known, "catalog and model know different services\n{}", context());
    let expected: BTreeMap<Key, Fields> =
        model.instances.iter().map(|(key, (_, fields))| (key.clone(), fields.clone())).collect();
    if published != expected {
        let only_published: Vec<_> = published.iter().filter(|(k, v)| expected.get(*k) != Some(v)).collect();
        let only_model: Vec<_> = expected.iter().filter(|(k, v)| published.get(*k) != Some(v)).collect();
        panic!(
            "catalog and model differ\n  catalog only: {only_published:?}\n  model only:   {only_model:?}\n{}",
            context()
        );
    }
}

/// A snapshot's derived views agree with its instance list.
fn check_snapshot(snapshot: &rota::registry::ServiceSnapshot, context: &dyn Fn() -> String) {
    let ids = |members: &[std::sync::Arc<rota::registry::Instance>]| -> Vec<String> {
        members.iter().map(|i| i.id.to_string()).collect()
    };
    let all = ids(&snapshot.instances);
    assert!(all.windows(2).all(|w| w[0] < w[1]), "{}: instances not sorted by id: {all:?}\n{}", snapshot.name, context());
    let up: Vec<_> = snapshot.instances.iter().filter(|i| i.status == Status::Up).cloned().collect();
    assert_eq!(ids(&snapshot.up.members), ids(&up), "{}: `up` subset\n{}", snapshot.name, context());
    let unversioned: Vec<_> = up.iter().filter(|i| i.version.is_empty()).cloned().collect();
    assert_eq!(
        ids(&snapshot.unversioned.members),
        ids(&unversioned),
        "{}: unversioned subset\n{}",
        snapshot.name,
        context()
    );
    let mut versions: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for instance in up.iter().filter(|i| !i.version.is_empty()) {
        versions.entry(instance.version.to_string()).or_default().push(instance.id.to_string());
    }
    let published: BTreeMap<String, Vec<String>> = snapshot
        .versions
        .iter()
        .map(|(version, subset)| {
            assert_eq!(&*subset.label, format!("version={version}"), "{}: subset label\n{}", snapshot.name, context());
            (version.to_string(), ids(&subset.members))
        })
        .collect();
    assert_eq!(published, versions, "{}: version subsets\n{}", snapshot.name, context());
}
