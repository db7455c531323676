//! Bounded HTTP/1.1 exchanges, for the sources that speak HTTP: a `GET` (Eureka's REST API), a
//! `POST` with a JSON body and a streaming `POST` read one line at a time (etcd's JSON gateway).
//!
//! A fresh connection per request, to the address the source was configured with and nowhere
//! else: no redirect is followed (a `3xx` is an error naming where it pointed), no proxy is
//! consulted, an answer body is read up to a byte limit and the whole exchange (connect,
//! request, every byte of the answer) is bounded by one timeout. A stream's lines are bounded
//! one by one; only its start (connect, request, the answer's head) is bounded in time.

use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Body, Incoming};

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
    let exchange = async {
        let request = request(endpoint, http::Method::GET, &target).body(Empty::<Bytes>::new());
        let (response, _driver) = send(endpoint, "GET", &target, request).await?;
        collect(response, "GET", &target, max_bytes).await
    };
    within(timeout, "GET", &target, exchange).await
}

/// `POST {endpoint.path}{path}` with the JSON `body`; the body of a `200` answer, at most
/// `max_bytes` of it, all within `timeout`.
pub async fn post(
    endpoint: &Endpoint,
    path: &str,
    body: String,
    timeout: Duration,
    max_bytes: usize,
) -> Result<Bytes, SourceError> {
    let target = format!("{}{path}", endpoint.path);
    let exchange = async {
        let request = request(endpoint, http::Method::POST, &target)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)));
        let (response, _driver) = send(endpoint, "POST", &target, request).await?;
        collect(response, "POST", &target, max_bytes).await
    };
    within(timeout, "POST", &target, exchange).await
}

/// `POST {endpoint.path}{path}` with the JSON `body`, whose `200` answer is a stream of lines
/// (one JSON object each): connecting and the answer's head are bounded by `timeout`, each
/// line by `max_bytes`; the stream itself lasts as long as the server keeps it.
pub async fn post_stream(
    endpoint: &Endpoint,
    path: &str,
    body: String,
    timeout: Duration,
    max_bytes: usize,
) -> Result<Lines, SourceError> {
    let target = format!("{}{path}", endpoint.path);
    let exchange = async {
        let request = request(endpoint, http::Method::POST, &target)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)));
        let (response, driver) = send(endpoint, "POST", &target, request).await?;
        Ok(Lines {
            body: response.into_body(),
            buffer: BytesMut::new(),
            max_bytes,
            target: target.clone(),
            _driver: driver,
        })
    };
    within(timeout, "POST", &target, exchange).await
}

/// The lines of a streamed answer, each at most `max_bytes` (without its `\n`).
pub struct Lines {
    body: Incoming,
    buffer: BytesMut,
    max_bytes: usize,
    target: String,
    _driver: crate::http1::Driver,
}

impl Lines {
    /// The next whole line (without its `\n`), or `None` once the server ended the answer.
    ///
    /// Cancel-safe: a line read in part is kept for the next call.
    pub async fn next_line(&mut self) -> Result<Option<Bytes>, SourceError> {
        loop {
            if let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
                if end > self.max_bytes {
                    return Err(self.too_long());
                }
                let line = self.buffer.split_to(end + 1).freeze();
                return Ok(Some(line.slice(..end)));
            }
            if self.buffer.len() > self.max_bytes {
                return Err(self.too_long());
            }
            match self.body.frame().await {
                None => {
                    // A last line without its `\n` is a line all the same.
                    if self.buffer.is_empty() {
                        return Ok(None);
                    }
                    return Ok(Some(self.buffer.split().freeze()));
                }
                Some(Err(error)) => {
                    return Err(SourceError::new(format!("POST {}: reading the stream: {error}", self.target)));
                }
                Some(Ok(frame)) => {
                    if let Ok(mut data) = frame.into_data() {
                        while data.has_remaining() {
                            let chunk = data.chunk();
                            self.buffer.extend_from_slice(chunk);
                            let n = chunk.len();
                            data.advance(n);
                        }
                    }
                }
            }
        }
    }

    fn too_long(&self) -> SourceError {
        SourceError::new(format!(
            "POST {}: a line of the stream is longer than {} bytes (the source's max_bytes)",
            self.target, self.max_bytes
        ))
    }
}

fn request(endpoint: &Endpoint, method: http::Method, target: &str) -> http::request::Builder {
    http::Request::builder()
        .method(method)
        .uri(target)
        .header(http::header::HOST, endpoint.authority())
        .header(http::header::ACCEPT, "application/json")
        .header(http::header::ACCEPT_ENCODING, "identity")
        .header(http::header::USER_AGENT, concat!("rota/", env!("CARGO_PKG_VERSION")))
}

async fn within<T>(
    timeout: Duration,
    method: &str,
    target: &str,
    exchange: impl Future<Output = Result<T, SourceError>>,
) -> Result<T, SourceError> {
    match tokio::time::timeout(timeout, exchange).await {
        Ok(answer) => answer,
        Err(_) => Err(SourceError::new(format!(
            "{method} {target}: no whole answer within {}",
            crate::duration::format(timeout)
        ))),
    }
}

/// Connects, sends `request` and checks the answer is a `200`; the connection is driven beside
/// it until the returned guard is dropped.
async fn send<B>(
    endpoint: &Endpoint,
    method: &str,
    target: &str,
    request: Result<http::Request<B>, http::Error>,
) -> Result<(http::Response<Incoming>, crate::http1::Driver), SourceError>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let failed =
        |what: &str, error: &dyn std::fmt::Display| SourceError::new(format!("{method} {target}: {what}: {error}"));
    let request = request.map_err(|e| failed("request", &e))?;
    let mut connection = crate::http1::open(&endpoint.host, endpoint.port).await.map_err(|e| match e {
        crate::http1::OpenError::Connect(e) => failed(&format!("cannot connect to {}", endpoint.authority()), &e),
        crate::http1::OpenError::Handshake(e) => failed("handshake", &e),
    })?;
    let response = connection.sender.send_request(request).await.map_err(|e| failed("no answer", &e))?;
    let status = response.status();
    if status.is_redirection() {
        let to = response.headers().get(http::header::LOCATION).and_then(|v| v.to_str().ok()).unwrap_or("nowhere");
        return Err(SourceError::new(format!(
            "{method} {target}: answered {status}, pointing to {to:?} (redirects are not followed)"
        )));
    }
    if status != http::StatusCode::OK {
        return Err(SourceError::new(format!("{method} {target}: answered {status}")));
    }
    Ok((response, connection.driver))
}

/// The answer's body, read into one buffer (sized from `Content-Length` when it has one), so
/// that reading it holds at most `max_bytes` and a frame.
async fn collect(
    response: http::Response<Incoming>,
    method: &str,
    target: &str,
    max_bytes: usize,
) -> Result<Bytes, SourceError> {
    let length =
        response.headers().get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if let Some(length) = length
        && length > max_bytes as u64
    {
        return Err(too_large(method, target, max_bytes));
    }
    let mut body = response.into_body();
    let mut buffer = BytesMut::with_capacity(length.unwrap_or(0) as usize);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| SourceError::new(format!("{method} {target}: reading the answer: {e}")))?;
        if let Ok(data) = frame.into_data() {
            if data.len() > max_bytes - buffer.len() {
                return Err(too_large(method, target, max_bytes));
            }
            buffer.extend_from_slice(&data);
        }
    }
    Ok(buffer.freeze())
}

fn too_large(method: &str, target: &str, max_bytes: usize) -> SourceError {
    SourceError::new(format!("{method} {target}: the answer is larger than {max_bytes} bytes (the source's max_bytes)"))
}
