//! Standard gRPC companions: health checking and server reflection.

use tokio_stream::StreamExt;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use crate::harness::TestServer;

#[tokio::test]
async fn health_reports_serving_for_the_server_and_each_service() {
    let server = TestServer::start().await;
    let channel = tonic::transport::Endpoint::from_shared(server.server.endpoint()).unwrap().connect().await.unwrap();
    let mut health = HealthClient::new(channel);
    for service in ["", "rota.v1.Balancer", "rota.v1.Registry"] {
        let response = health.check(HealthCheckRequest { service: service.into() }).await.unwrap().into_inner();
        assert_eq!(response.status(), ServingStatus::Serving, "{service:?}");
    }
    let unknown = health.check(HealthCheckRequest { service: "rota.v1.Nope".into() }).await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound);
}

#[tokio::test]
async fn reflection_lists_rota_services() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let server = TestServer::start().await;
    let channel = tonic::transport::Endpoint::from_shared(server.server.endpoint()).unwrap().connect().await.unwrap();
    let mut reflection = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut responses = reflection.server_reflection_info(tokio_stream::iter([request])).await.unwrap().into_inner();
    let response = responses.next().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(list)) = response.message_response else {
        panic!("unexpected reflection answer {response:?}")
    };
    let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    names.sort();
    for expected in ["grpc.health.v1.Health", "rota.v1.Balancer", "rota.v1.Registry"] {
        assert!(names.iter().any(|n| n == expected), "{expected} missing from {names:?}");
    }
}
