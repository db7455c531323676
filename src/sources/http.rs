//! One bounded HTTP/1.1 `GET`, for the sources that speak HTTP (Eureka's REST API).
//!
//! A fresh connection per request, to the address the source was configured with and nowhere
//! else: no redirect is followed (a `3xx` is an error naming where it pointed), no proxy is
//! consulted, the answer body is read up to a byte limit and the whole exchange (connect,
//! request, every byte of the answer) is bounded by one timeout.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::SourceError;

/// Where to send requests: `host:port` and the path prefix the source's URL gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    /// Without a trailing `/`; empty for the root.
    pub path: String,
}

impl Endpoint {
    fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// `GET {endpoint.path}{path}` with `Accept: application/json`; the body of a `200` answer,
/// at most `max_bytes` of it, all within `timeout`.
pub async fn get(endpoint: &Endpoint, path: &str, timeout: Duration, max_bytes: usize) -> Result<Bytes, SourceError> {
    let target = format!("{}{path}", endpoint.path);
    match tokio::time::timeout(timeout, exchange(endpoint, &target, max_bytes)).await {
        Ok(answer) => answer,
        Err(_) => Err(SourceError::new(format!(
            "GET {target}: no whole answer within {}",
            humantime::format_duration(timeout)
        ))),
    }
}

async fn exchange(endpoint: &Endpoint, target: &str, max_bytes: usize) -> Result<Bytes, SourceError> {
    let failed = |what: &str, error: &dyn std::fmt::Display| SourceError::new(format!("GET {target}: {what}: {error}"));
    let stream = TcpStream::connect((endpoint.host.as_str(), endpoint.port))
        .await
        .map_err(|e| failed(&format!("cannot connect to {}", endpoint.authority()), &e))?;
    let _ = stream.set_nodelay(true);
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| failed("handshake", &e))?;
    // The connection is driven beside the request and dropped with it.
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    let _abort = AbortOnDrop(driver);
    let request = http::Request::get(target)
        .header(http::header::HOST, endpoint.authority())
        .header(http::header::ACCEPT, "application/json")
        .header(http::header::ACCEPT_ENCODING, "identity")
        .header(http::header::USER_AGENT, concat!("rota/", env!("CARGO_PKG_VERSION")))
        .body(Empty::<Bytes>::new())
        .map_err(|e| failed("request", &e))?;
    let response = sender.send_request(request).await.map_err(|e| failed("no answer", &e))?;
    let status = response.status();
    if status.is_redirection() {
        let to = response.headers().get(http::header::LOCATION).and_then(|v| v.to_str().ok()).unwrap_or("nowhere");
        return Err(SourceError::new(format!(
            "GET {target}: answered {status}, pointing to {to:?} (redirects are not followed)"
        )));
    }
    if status != http::StatusCode::OK {
        return Err(SourceError::new(format!("GET {target}: answered {status}")));
    }
    if let Some(length) =
        response.headers().get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        && length > max_bytes as u64
    {
        return Err(too_large(target, max_bytes));
    }
    match Limited::new(response.into_body(), max_bytes).collect().await {
        Ok(body) => Ok(body.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => Err(too_large(target, max_bytes)),
        Err(error) => Err(failed("reading the answer", &error)),
    }
}

fn too_large(target: &str, max_bytes: usize) -> SourceError {
    SourceError::new(format!("GET {target}: the answer is larger than {max_bytes} bytes (the source's max_bytes)"))
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
