//! One check of one instance, by kind. A check only connects to the address the instance
//! announced, follows no redirect, reads nothing beyond what its verdict needs, and hands
//! nothing it read to anyone: the verdict is pass, or fail with a short reason of rota's own.

use std::time::Duration;

use http_body_util::Empty;
use tokio::net::TcpStream;

use crate::policy::CheckKind;

/// Checks `host:port` once, within `timeout`: `Ok` passes, `Err` says why it failed.
pub async fn check(kind: &CheckKind, host: &str, port: u16, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, run(kind, host, port, timeout)).await {
        Ok(verdict) => verdict,
        Err(_) => Err(format!("no answer within {}", crate::duration::format(timeout))),
    }
}

async fn run(kind: &CheckKind, host: &str, port: u16, timeout: Duration) -> Result<(), String> {
    match kind {
        CheckKind::Tcp => connect(host, port).await.map(drop),
        CheckKind::Http { path } => http(host, port, path).await,
        CheckKind::Grpc { service } => grpc(host, port, service, timeout).await,
    }
}

async fn connect(host: &str, port: u16) -> Result<TcpStream, String> {
    let stream = TcpStream::connect((host, port)).await.map_err(|e| format!("connect: {}", e.kind()))?;
    let _ = stream.set_nodelay(true);
    Ok(stream)
}

fn authority(host: &str, port: u16) -> String {
    if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") }
}

async fn http(host: &str, port: u16, path: &str) -> Result<(), String> {
    let mut connection = crate::http1::open(host, port).await.map_err(|e| match e {
        crate::http1::OpenError::Connect(e) => format!("connect: {}", e.kind()),
        crate::http1::OpenError::Handshake(_) => "HTTP handshake failed".to_owned(),
    })?;
    let request = http::Request::get(path)
        .header(http::header::HOST, authority(host, port))
        .header(http::header::USER_AGENT, concat!("rota-health/", env!("CARGO_PKG_VERSION")))
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|_| "bad request".to_owned());
    let answer = match request {
        Ok(request) => connection.sender.send_request(request).await.map_err(|_| "no HTTP answer".to_owned()),
        Err(e) => Err(e),
    };
    // The body is not read: the status decides, and the connection goes.
    drop(connection);
    let status = answer?.status();
    if status.is_success() { Ok(()) } else { Err(format!("answered HTTP {}", status.as_u16())) }
}

async fn grpc(host: &str, port: u16, service: &str, timeout: Duration) -> Result<(), String> {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{}", authority(host, port)))
        .map_err(|_| "not a gRPC address".to_owned())?
        .connect_timeout(timeout)
        .timeout(timeout);
    let channel = endpoint.connect().await.map_err(|_| "gRPC connect failed".to_owned())?;
    let request = tonic_health::pb::HealthCheckRequest { service: service.to_owned() };
    let answer =
        HealthClient::new(channel).check(request).await.map_err(|status| format!("gRPC {:?}", status.code()))?;
    match ServingStatus::try_from(answer.get_ref().status) {
        Ok(ServingStatus::Serving) => Ok(()),
        Ok(other) => Err(format!("gRPC health {}", other.as_str_name())),
        Err(_) => Err("gRPC health status unknown".to_owned()),
    }
}
