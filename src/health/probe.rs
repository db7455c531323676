//! One check of one instance, by kind. A check connects only to the address the instance
//! announced, and only where [`Reach`] allows (never to rota's own listeners), follows no
//! redirect, reads nothing beyond what its verdict needs, and hands nothing it read to anyone:
//! the verdict is pass, or fail with a short reason of rota's own.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use http_body_util::Empty;
use tokio::net::TcpStream;

use super::reach::Reach;
use crate::policy::{CheckKind, HealthCheck};

/// What one check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    /// The instance did not answer as the check asks: why.
    Fail(String),
    /// rota does not check this address (its own listener, or outside the networks allowed):
    /// why. No connection was made; the instance fails at once.
    Refused(String),
}

/// How the prober checks one instance: over the network ([`Network`]), or a script in tests.
pub trait Probe: Send + Sync + 'static {
    fn check(&self, check: &HealthCheck, host: &str, port: u16) -> BoxFuture<'static, Verdict>;
}

/// Checks over the network, where `reach` allows.
pub struct Network {
    reach: Arc<Reach>,
}

impl Network {
    pub fn new(reach: Reach) -> Self {
        Self { reach: Arc::new(reach) }
    }
}

impl Probe for Network {
    fn check(&self, check: &HealthCheck, host: &str, port: u16) -> BoxFuture<'static, Verdict> {
        let (kind, timeout, host, reach) = (check.kind.clone(), check.timeout, host.to_owned(), self.reach.clone());
        Box::pin(async move { self::check(&kind, &host, port, timeout, &reach).await })
    }
}

/// Checks `host:port` once, within `timeout`.
pub async fn check(kind: &CheckKind, host: &str, port: u16, timeout: Duration, reach: &Reach) -> Verdict {
    match tokio::time::timeout(timeout, run(kind, host, port, timeout, reach)).await {
        Ok(verdict) => verdict,
        Err(_) => Verdict::Fail(format!("no answer within {}", crate::duration::format(timeout))),
    }
}

async fn run(kind: &CheckKind, host: &str, port: u16, timeout: Duration, reach: &Reach) -> Verdict {
    let addrs: Vec<SocketAddr> = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => match tokio::net::lookup_host((host, port)).await {
            Ok(addrs) => addrs.collect(),
            Err(_) => return Verdict::Fail(format!("cannot resolve {host}")),
        },
    };
    // Each address the name has is judged; only those allowed are connected to.
    let mut allowed = Vec::with_capacity(addrs.len());
    let mut refusal = None;
    for addr in addrs {
        match reach.refusal(addr) {
            None => allowed.push(addr),
            Some(why) => {
                refusal.get_or_insert(why);
            }
        }
    }
    if allowed.is_empty() {
        return match refusal {
            Some(why) => Verdict::Refused(why),
            None => Verdict::Fail(format!("{host} has no address")),
        };
    }
    let result = match kind {
        CheckKind::Tcp => connect(&allowed).await.map(drop),
        CheckKind::Http { path } => http(&allowed, host, port, path).await,
        CheckKind::Grpc { service } => grpc(&allowed, host, port, service, timeout).await,
    };
    match result {
        Ok(()) => Verdict::Pass,
        Err(why) => Verdict::Fail(why),
    }
}

/// The first of `addrs` that accepts a connection.
async fn connect(addrs: &[SocketAddr]) -> Result<TcpStream, String> {
    let mut last = String::from("connect: no address");
    for addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(stream) => {
                let _ = stream.set_nodelay(true);
                return Ok(stream);
            }
            Err(e) => last = format!("connect: {}", e.kind()),
        }
    }
    Err(last)
}

fn authority(host: &str, port: u16) -> String {
    if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") }
}

async fn http(addrs: &[SocketAddr], host: &str, port: u16, path: &str) -> Result<(), String> {
    let mut failure = String::from("connect: no address");
    let mut opened = None;
    for addr in addrs {
        match crate::http1::open(&addr.ip().to_string(), addr.port()).await {
            Ok(connection) => {
                opened = Some(connection);
                break;
            }
            Err(crate::http1::OpenError::Connect(e)) => failure = format!("connect: {}", e.kind()),
            Err(crate::http1::OpenError::Handshake(_)) => return Err("HTTP handshake failed".to_owned()),
        }
    }
    let Some(mut connection) = opened else { return Err(failure) };
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

async fn grpc(addrs: &[SocketAddr], host: &str, port: u16, service: &str, timeout: Duration) -> Result<(), String> {
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    let mut channel = None;
    for addr in addrs {
        // Connected to the address judged, not to the name again; asked as the name.
        let mut endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|_| "not a gRPC address".to_owned())?
            .connect_timeout(timeout)
            .timeout(timeout);
        if let Ok(origin) = format!("http://{}", authority(host, port)).parse() {
            endpoint = endpoint.origin(origin);
        }
        if let Ok(connected) = endpoint.connect().await {
            channel = Some(connected);
            break;
        }
    }
    let channel = channel.ok_or_else(|| "gRPC connect failed".to_owned())?;
    let request = tonic_health::pb::HealthCheckRequest { service: service.to_owned() };
    let answer =
        HealthClient::new(channel).check(request).await.map_err(|status| format!("gRPC {:?}", status.code()))?;
    match ServingStatus::try_from(answer.get_ref().status) {
        Ok(ServingStatus::Serving) => Ok(()),
        Ok(other) => Err(format!("gRPC health {}", other.as_str_name())),
        Err(_) => Err("gRPC health status unknown".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::super::reach::Networks;
    use super::*;

    /// A listener nothing accepts on: a check that connected left a connection in its queue.
    fn listener() -> (std::net::TcpListener, SocketAddr) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        (listener, addr)
    }

    fn connected(listener: &std::net::TcpListener) -> bool {
        match listener.accept() {
            Ok(_) => true,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
            Err(e) => panic!("{e}"),
        }
    }

    const SECOND: Duration = Duration::from_secs(1);

    #[tokio::test]
    async fn an_address_rota_does_not_check_is_refused_without_a_connection() {
        let (open, addr) = listener();
        let every = Networks::parse("0.0.0.0/0, ::/0").unwrap();
        let allowed = Reach::new(every.clone(), vec![]);
        assert_eq!(check(&CheckKind::Tcp, "127.0.0.1", addr.port(), SECOND, &allowed).await, Verdict::Pass);
        assert!(connected(&open), "allowed: checked");
        // The same listener as rota's own, or outside the networks: never connected to.
        let own = Reach::new(every, vec![(addr, "admin")]);
        let outside = Reach::new(Networks::parse("10.0.0.0/8, !127.0.0.0/8").unwrap(), vec![]);
        let kinds = [CheckKind::Tcp, CheckKind::Http { path: "/".into() }, CheckKind::Grpc { service: String::new() }];
        for kind in &kinds {
            for host in ["127.0.0.1", "::ffff:127.0.0.1"] {
                let verdict = check(kind, host, addr.port(), SECOND, &own).await;
                assert_eq!(verdict, Verdict::Refused(format!("not checked: {addr} is rota's own admin listener")));
            }
            // A name is judged by each of its addresses (localhost: 127.0.0.1, and ::1 too).
            for host in ["127.0.0.1", "localhost", "::ffff:127.0.0.1"] {
                let verdict = check(kind, host, addr.port(), SECOND, &outside).await;
                let Verdict::Refused(why) = verdict else { panic!("{kind:?} {host}: {verdict:?}") };
                assert!(why.ends_with("is outside server.health_check_networks"), "{why}");
            }
        }
        assert!(!connected(&open), "no check connected");
    }
}
