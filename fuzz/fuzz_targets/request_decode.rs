//! Client messages, as rota's gRPC services receive them.
//!
//! The input is a short script of requests. Each record is one selector byte (which message),
//! a protobuf varint length, then that many bytes that are prost-decoded as the message:
//!
//! | selector % 12 | message               | what rota does with it                          |
//! |---------------|-----------------------|-------------------------------------------------|
//! | 0             | `PickRequest`         | `Balancer.Pick` as the wire reads it (twice, then reports the pick) |
//! | 1             | `LeaseRequest`        | `Balancer.Lease`                                |
//! | 2             | `ReportRequest`       | `Balancer.Report`                               |
//! | 3             | `RegisterRequest`     | one Register message on a provider's lease      |
//! | 4             | `WatchRequest`        | `Registry.Watch`, first event                   |
//! | 5             | `ListInstancesRequest`| `Registry.ListInstances`                        |
//! | 6             | `ListServicesRequest` | `Registry.ListServices`                         |
//! | 7             | `SetPolicyRequest`    | `Policies.SetPolicy`, then a pick under it      |
//! | 8             | `GetPolicyRequest`    | `Policies.GetPolicy`                            |
//! | 9             | `ListPoliciesRequest` | `Policies.ListPolicies`                         |
//! | 10            | `Update`              | `convert::instance_update` + a lease update     |
//! | 11            | `ResetPolicyRequest`  | `Policies.ResetPolicy`, then the policy applied |
//!
//! Every record runs against one small server state built per input: services `svc` (UP,
//! DRAINING and DOWN instances, two versions, two zones, a weight of 0), `gray` (a gray-release
//! policy), `solo` and `gone` (registered, then withdrawn). Time is paused, so `retry` waits
//! and breaker blackouts cost nothing. Nothing may panic; a successful pick must also name a
//! registered UP instance of the requested service that was not excluded and, without a
//! fallback, of the requested version.

#![no_main]

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::StreamExt;
use libfuzzer_sys::fuzz_target;
use prost::Message;
use rota::balancer::Balancer;
use rota::grpc::peers::PeerStreams;
use rota::grpc::streams::OpenStreams;
use rota::grpc::pick_wire::PickRequestView;
use rota::grpc::{BalancerService, PoliciesService, RegistryService, convert, status};
use rota::pb::balancer_server::Balancer as _;
use rota::pb::policies_server::Policies as _;
use rota::pb::registry_server::Registry as _;
use rota::pb::{self, register_request::Msg};
use rota::policy::{GraySpec, PolicySpec};
use rota::registry::{InstanceSpec, Lease, Outcome, Registry, RegistryConfig, RequestedStatus, Status};
use tonic::Request;

/// Records after this many are ignored, so one input stays quick.
const MAX_RECORDS: usize = 16;

fuzz_target!(|data: &[u8]| {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    runtime.block_on(run(data));
});

struct Server {
    registry: Registry,
    balancer: Arc<Balancer>,
    balancer_service: BalancerService,
    registry_service: RegistryService,
    policies_service: PoliciesService,
    /// Owns the fixture instances.
    _owner: Lease,
    /// The provider whose Register messages the input sends.
    provider: Lease,
    _drain: tokio::sync::watch::Sender<bool>,
}

fn spec(service: &str, id: &str, version: &str, zone: &str, weight: u32, status: Status) -> InstanceSpec {
    InstanceSpec {
        id: id.into(),
        service: service.into(),
        host: "127.0.0.1".into(),
        port: 9000,
        version: version.into(),
        zone: zone.into(),
        weight: Some(weight),
        metadata: BTreeMap::from([("role".to_owned(), id.to_owned())]),
        status: RequestedStatus::Known(status),
    }
}

async fn server() -> Server {
    let registry = Registry::spawn(RegistryConfig { max_instances_per_stream: 64, ..RegistryConfig::default() });
    let owner = registry.open_lease();
    let fixture = vec![
        spec("svc", "a", "", "z1", 100, Status::Up),
        spec("svc", "b", "", "z2", 0, Status::Up),
        spec("svc", "c", "", "z1", 5, Status::Draining),
        spec("svc", "d", "v2", "z2", 10, Status::Up),
        spec("svc", "e", "v2", "z1", 10, Status::Down),
        spec("svc", "f", "v3", "", 1, Status::Up),
        spec("gray", "g1", "", "z1", 100, Status::Up),
        spec("gray", "g2", "canary", "z2", 100, Status::Up),
        spec("solo", "only", "", "", 100, Status::Up),
        spec("gone", "x", "", "", 100, Status::Up),
    ];
    let outcome = owner.announce(fixture).await.expect("registry runs");
    assert!(outcome.refused.is_empty(), "fixture refused: {outcome:?}");
    let gone = rota::registry::InstanceRef { service: "gone".into(), id: "x".into() };
    owner.withdraw(vec![gone]).await.expect("registry runs");
    let provider = registry.open_lease();
    let balancer = Arc::new(Balancer::with_defaults(registry.clone()));
    // Answers encoded at publish, as `rota serve` has them.
    balancer.views().encode_answers_with(convert::encoded_instance);
    let gray = PolicySpec {
        gray: Some(GraySpec { unversioned: 3, versions: BTreeMap::from([("canary".to_owned(), 1)]) }),
        ..PolicySpec::default()
    };
    balancer.policies().set_service("gray", gray).expect("a valid gray policy");
    let (drain, drained) = tokio::sync::watch::channel(false);
    let streams = OpenStreams::new(16);
    let consumers = PeerStreams::consumers(8);
    Server {
        balancer_service: BalancerService::new(balancer.clone(), consumers.clone(), streams.clone()),
        registry_service: RegistryService::new(registry.clone(), drained, 4, consumers, streams),
        policies_service: PoliciesService::new(balancer.policies().clone(), registry.clone()),
        registry,
        balancer,
        _owner: owner,
        provider,
        _drain: drain,
    }
}

async fn run(data: &[u8]) {
    let server = server().await;
    let mut rest = data;
    for _ in 0..MAX_RECORDS {
        let Some((&selector, after)) = rest.split_first() else { break };
        rest = after;
        let len = prost::decode_length_delimiter(&mut rest).unwrap_or(0).min(rest.len());
        let (message, after) = rest.split_at(len);
        rest = after;
        record(&server, selector % 12, message).await;
    }
    server.balancer.housekeeping();
}

async fn record(server: &Server, selector: u8, bytes: &[u8]) {
    match selector {
        0 => {
            // The unary Pick reads requests in place: exactly what prost reads, the same fields.
            let view = PickRequestView::decode(bytes::Bytes::copy_from_slice(bytes));
            let Ok(request) = pb::PickRequest::decode(bytes) else {
                assert!(view.is_err(), "the wire Pick read {bytes:?}, which prost refuses");
                return;
            };
            let view = view.expect("prost reads the request, so must the wire Pick");
            assert_eq!(view.service(), request.service);
            for _ in 0..2 {
                if let Ok(answer) = server.balancer_service.pick_view(&view).await {
                    let mut wire = Vec::new();
                    answer.encode(&mut wire);
                    assert_eq!(wire.len(), answer.encoded_len());
                    let response = pb::PickResponse::decode(&wire[..]).expect("prost reads the answer");
                    check_pick(server, &request, &response);
                    let outcome = pb::CallOutcome {
                        service: request.service.clone(),
                        instance_id: response.instance.map(|i| i.id).unwrap_or_default(),
                        ticket: response.ticket,
                        rule: response.rule,
                        latency_us: response.ticket.wrapping_mul(977),
                        result: (response.ticket % 3 + 1) as i32,
                        leased: response.ticket % 2 == 0,
                    };
                    let report = pb::ReportRequest { outcomes: vec![outcome] };
                    let _ = server.balancer_service.report(Request::new(report)).await;
                }
            }
        }
        1 => {
            let Ok(request) = pb::LeaseRequest::decode(bytes) else { return };
            if let Ok(response) = server.balancer_service.lease(Request::new(request.clone())).await {
                let response = response.into_inner();
                assert!(response.count == request.count, "lease of {} tickets granted {}", request.count, response.count);
                let ids: Vec<&str> = response.instances.iter().map(|i| i.id.as_str()).collect();
                assert!(ids.windows(2).all(|w| w[0] < w[1]), "leased instances not sorted by id: {ids:?}");
            }
        }
        2 => {
            let Ok(request) = pb::ReportRequest::decode(bytes) else { return };
            let _ = server.balancer_service.report(Request::new(request)).await;
        }
        3 => {
            let Ok(request) = pb::RegisterRequest::decode(bytes) else { return };
            if let Some(outcome) = register(&server.provider, request).await {
                ack(&outcome);
            }
        }
        4 => {
            let Ok(request) = pb::WatchRequest::decode(bytes) else { return };
            if let Ok(response) = server.registry_service.watch(Request::new(request)).await {
                let mut stream = response.into_inner();
                let _ = stream.next().await;
            }
        }
        5 => {
            let Ok(request) = pb::ListInstancesRequest::decode(bytes) else { return };
            let _ = server.registry_service.list_instances(Request::new(request)).await;
        }
        6 => {
            let Ok(request) = pb::ListServicesRequest::decode(bytes) else { return };
            let _ = server.registry_service.list_services(Request::new(request)).await;
        }
        7 => {
            let Ok(request) = pb::SetPolicyRequest::decode(bytes) else { return };
            let service = request.policy.as_ref().map(|p| p.service.clone()).unwrap_or_default();
            if server.policies_service.set_policy(Request::new(request)).await.is_ok() {
                let get = pb::GetPolicyRequest { service: service.clone() };
                let stored = server.policies_service.get_policy(Request::new(get)).await;
                assert!(stored.is_ok_and(|p| !p.get_ref().is_default), "policy of {service:?} set but not stored");
                let pick = pb::PickRequest { service, key: "k".into(), ..Default::default() };
                if let Ok(response) = server.balancer_service.pick(Request::new(pick.clone())).await {
                    check_pick(server, &pick, response.get_ref());
                }
            }
        }
        8 => {
            let Ok(request) = pb::GetPolicyRequest::decode(bytes) else { return };
            let _ = server.policies_service.get_policy(Request::new(request)).await;
        }
        9 => {
            let Ok(request) = pb::ListPoliciesRequest::decode(bytes) else { return };
            let _ = server.policies_service.list_policies(Request::new(request)).await;
        }
        10 => {
            let Ok(update) = pb::Update::decode(bytes) else { return };
            let update = convert::instance_update(update);
            if let Ok(outcome) = server.provider.update(update).await {
                ack(&outcome);
            }
        }
        _ => {
            let Ok(request) = pb::ResetPolicyRequest::decode(bytes) else { return };
            let service = request.service.clone();
            if server.policies_service.reset_policy(Request::new(request)).await.is_ok() {
                // The override is gone: what applies now comes from the file or the defaults.
                let get = pb::GetPolicyRequest { service: service.clone() };
                if let Ok(policy) = server.policies_service.get_policy(Request::new(get)).await {
                    let source = policy.get_ref().source;
                    assert!(source != pb::PolicySource::Runtime as i32, "{service:?} still has an override after a reset");
                }
            }
        }
    }
}

/// One Register message applied as the server's register stream applies it (no token, so no
/// per-service scope check); `None` for heartbeats, which are not acknowledged.
async fn register(lease: &Lease, request: pb::RegisterRequest) -> Option<Outcome> {
    let applied = match request.msg? {
        Msg::Heartbeat(_) => {
            lease.touch();
            return None;
        }
        Msg::Announce(announce) => {
            lease.announce(announce.instances.into_iter().map(convert::instance_spec).collect()).await
        }
        Msg::Update(update) => lease.update(convert::instance_update(update)).await,
        Msg::Withdraw(withdraw) => {
            lease.withdraw(withdraw.instances.into_iter().map(convert::instance_ref).collect()).await
        }
    };
    applied.ok()
}

/// Renders an acknowledgement as the server does.
fn ack(outcome: &Outcome) {
    for (instance, why) in &outcome.refused {
        let _ = (status::refusal_code(why), why.to_string(), convert::pb_instance_ref(instance.clone()));
    }
}

/// What every successful pick must satisfy.
fn check_pick(server: &Server, request: &pb::PickRequest, response: &pb::PickResponse) {
    let instance = response.instance.as_ref().expect("a successful pick names an instance");
    assert_eq!(instance.service, request.service, "picked an instance of another service");
    assert_eq!(instance.status, pb::InstanceStatus::Up as i32, "picked {:?}, which is not UP", instance.id);
    assert!(!request.exclude.contains(&instance.id), "picked {:?}, which the request excluded", instance.id);
    let snapshot = server.registry.service(&request.service).expect("picked from a registered service");
    assert_eq!(snapshot.epoch, response.epoch, "pick reports another epoch than the current snapshot's");
    assert!(
        snapshot.instances.iter().any(|i| *i.id == *instance.id),
        "picked {:?}, which is not registered in {:?}",
        instance.id,
        request.service
    );
    if !request.rule.is_empty() {
        let canonical = rota::rules::parse(&request.rule).expect("a rule that picked parses").canonical;
        assert_eq!(response.rule, &*canonical, "response names another rule than the request's");
    }
    if response.fallback.is_empty() && !request.version.is_empty() {
        assert_eq!(instance.version, request.version, "picked another version without saying so");
    }
    let gray = server.balancer.policies().load().for_service(&request.service).gray.is_some();
    if response.fallback.is_empty() && request.version.is_empty() && !gray {
        assert_eq!(instance.version, "", "a request without a version got a versioned instance without a fallback");
    }
}
