//! xDS over the network: an ADS stream on rota's gRPC listener, as a client sees it (the
//! standard clients of each language run the scenarios in clients/conformance/xds).

use std::sync::Arc;

use envoy_types::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, lb_endpoint::HostIdentifier};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use envoy_types::pb::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::rpc;
use prost::Message;
use rota::auth::{Authenticator, Principal, Scope};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;
use tonic::metadata::MetadataValue;

use crate::admin::get;
use crate::harness::{PATIENCE, TestServer, instance};

const ENDPOINTS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
const LISTENERS: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";

/// One ADS stream: requests go in through `send`, responses come out of `next`.
pub(crate) struct Ads {
    requests: mpsc::Sender<DiscoveryRequest>,
    responses: tonic::Streaming<DiscoveryResponse>,
}

impl Ads {
    pub(crate) async fn open(server: &TestServer, token: Option<&str>) -> Result<Self, tonic::Status> {
        let channel =
            tonic::transport::Channel::from_shared(server.server.endpoint()).unwrap().connect().await.unwrap();
        let mut client = AggregatedDiscoveryServiceClient::new(channel);
        let (requests, rx) = mpsc::channel(16);
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        if let Some(token) = token {
            let value: MetadataValue<_> = format!("Bearer {token}").parse().unwrap();
            request.metadata_mut().insert("authorization", value);
        }
        // The first request goes with the call, so a refusal comes back as its status.
        requests.send(ask(LISTENERS, &["echo"], "")).await.unwrap();
        let responses = client.stream_aggregated_resources(request).await?.into_inner();
        Ok(Self { requests, responses })
    }

    async fn send(&self, request: DiscoveryRequest) {
        self.requests.send(request).await.expect("the stream is open");
    }

    async fn next(&mut self) -> Result<DiscoveryResponse, tonic::Status> {
        match tokio::time::timeout(PATIENCE, self.responses.message()).await.expect("an answer within PATIENCE") {
            Ok(Some(response)) => Ok(response),
            Ok(None) => Err(tonic::Status::cancelled("the stream ended")),
            Err(status) => Err(status),
        }
    }
}

fn ask(type_url: &str, names: &[&str], nonce: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        type_url: type_url.into(),
        resource_names: names.iter().map(|n| n.to_string()).collect(),
        response_nonce: nonce.into(),
        ..Default::default()
    }
}

fn ids(response: &DiscoveryResponse) -> Vec<String> {
    assert_eq!(response.type_url, ENDPOINTS);
    let assignment = ClusterLoadAssignment::decode(&*response.resources[0].value).unwrap();
    let mut ids: Vec<String> = assignment
        .endpoints
        .iter()
        .flat_map(|l| &l.lb_endpoints)
        .filter_map(|e| match &e.host_identifier {
            Some(HostIdentifier::Endpoint(endpoint)) => Some(endpoint.hostname.clone()),
            _ => None,
        })
        .collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn an_xds_client_is_pushed_every_registration_change() {
    let server = TestServer::start().await;
    let _a = server.register(vec![instance("echo", "echo-a", 7001)]).await;
    let mut ads = Ads::open(&server, None).await.unwrap();
    let listener = ads.next().await.unwrap();
    assert_eq!(listener.type_url, LISTENERS);
    assert_eq!(listener.resources.len(), 1);
    ads.send(ask(LISTENERS, &["echo"], &listener.nonce)).await;
    ads.send(ask(ENDPOINTS, &["echo"], "")).await;
    let first = ads.next().await.unwrap();
    assert_eq!(ids(&first), ["echo-a"]);
    ads.send(ask(ENDPOINTS, &["echo"], &first.nonce)).await;

    let b = server.register(vec![instance("echo", "echo-b", 7002)]).await;
    let second = ads.next().await.unwrap();
    assert_eq!(ids(&second), ["echo-a", "echo-b"]);
    ads.send(ask(ENDPOINTS, &["echo"], &second.nonce)).await;
    drop(b);
    let third = ads.next().await.unwrap();
    assert_eq!(ids(&third), ["echo-a"], "the closed registration's instance is gone");
    assert_ne!(third.version_info, second.version_info);
}

#[tokio::test]
async fn subscribing_needs_the_pick_scope() {
    const PICK: &str = "pick-token-0123456789";
    const REGISTER: &str = "register-token-0123456789";
    let token = |secret: &str, name: &str, scope: &str| {
        (secret.to_owned(), Principal { name: name.to_owned(), scopes: vec![Scope::parse(scope).unwrap()] })
    };
    let auth = Authenticator::new(vec![token(PICK, "consumer", "pick"), token(REGISTER, "provider", "register:echo")]);
    let server = TestServer::start_with(|config| config.auth = Some(Arc::new(auth))).await;
    let refused = |result: Result<Ads, tonic::Status>| result.err().map(|status| status.code());
    assert_eq!(refused(Ads::open(&server, None).await), Some(Code::Unauthenticated));
    assert_eq!(refused(Ads::open(&server, Some("wrong-token-0123456789")).await), Some(Code::Unauthenticated));
    assert_eq!(refused(Ads::open(&server, Some(REGISTER)).await), Some(Code::PermissionDenied));
    let mut ads = Ads::open(&server, Some(PICK)).await.unwrap();
    assert_eq!(ads.next().await.unwrap().type_url, LISTENERS);
}

#[tokio::test]
async fn a_stream_past_its_bound_ends_with_a_precise_status_and_the_rest_is_unharmed() {
    let server = TestServer::start_with(|config| config.limits.xds.max_names_per_stream = 2).await;
    let _a = server.register(vec![instance("echo", "echo-a", 7001)]).await;
    let mut greedy = Ads::open(&server, None).await.unwrap();
    greedy.next().await.unwrap();
    greedy.send(ask(ENDPOINTS, &["a", "b", "c"], "")).await;
    let status = greedy.next().await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("server.max_xds_names_per_stream"), "{}", status.message());

    // Junk type URLs and a NACK loop cost nothing lasting; another stream is served as before.
    let mut ads = Ads::open(&server, None).await.unwrap();
    let listener = ads.next().await.unwrap();
    for _ in 0..50 {
        ads.send(ask("type.googleapis.com/no.Such", &["x"], "")).await;
        let mut nack = ask(LISTENERS, &["echo"], &listener.nonce);
        nack.error_detail = Some(rpc::Status { code: 3, message: "rejected".into(), details: vec![] });
        ads.send(nack).await;
    }
    ads.send(ask(ENDPOINTS, &["echo"], "")).await;
    assert_eq!(ids(&ads.next().await.unwrap()), ["echo-a"]);
    let (status, metrics) = get(server.server.admin_addr().unwrap(), "/metrics").await;
    assert_eq!(status, 200);
    assert!(metrics.contains("rota_xds_nacks_total 50"), "{metrics}");
    assert!(metrics.contains("rota_xds_unknown_types_total 50"), "{metrics}");
    assert!(metrics.contains("rota_xds_refused_total 1"), "{metrics}");
    assert!(metrics.contains("rota_xds_streams 1"), "the refused stream let go of its place: {metrics}");
}

#[tokio::test]
async fn incremental_xds_is_refused_clearly() {
    let server = TestServer::start().await;
    let channel = tonic::transport::Channel::from_shared(server.server.endpoint()).unwrap().connect().await.unwrap();
    let mut client = AggregatedDiscoveryServiceClient::new(channel);
    let requests = tokio_stream::iter(vec![DeltaDiscoveryRequest { type_url: LISTENERS.into(), ..Default::default() }]);
    let status = client.delta_aggregated_resources(requests).await.unwrap_err();
    assert_eq!(status.code(), Code::Unimplemented);
    assert!(status.message().contains("state-of-the-world"), "{}", status.message());
}

#[tokio::test]
async fn a_draining_server_ends_its_xds_streams_so_clients_move_on() {
    let server = TestServer::start().await;
    let mut ads = Ads::open(&server, None).await.unwrap();
    ads.next().await.unwrap();
    server.server.begin_drain().await;
    let status = ads.next().await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(Ads::open(&server, None).await.is_err(), "no new stream while draining");
}
