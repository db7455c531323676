//! The admin listener over real HTTP: exact metrics after known traffic, the JSON API, health,
//! and the dashboard's event stream ending when the server stops.

use std::net::SocketAddr;

use rota::client::PickOptions;
use rota::pb;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::harness::{PATIENCE, TestServer, instance};

/// One `GET` over HTTP/1.0 (the server closes the connection after the response): status and body.
pub(crate) async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.expect("admin listener accepts");
    stream.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).await.unwrap();
    let mut response = String::new();
    tokio::time::timeout(PATIENCE, stream.read_to_string(&mut response)).await.expect("response in time").unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("a complete response");
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("a status line");
    (status, body.to_owned())
}

fn admin(server: &TestServer) -> SocketAddr {
    server.server.admin_addr().expect("the test server has an admin listener")
}

fn failure(service: &str, id: &str) -> pb::CallOutcome {
    pb::CallOutcome {
        service: service.into(),
        instance_id: id.into(),
        latency_us: 2_000,
        result: pb::CallResult::Error as i32,
        ..Default::default()
    }
}

/// The lines of `metrics` that start with `prefix`, in order.
fn series<'a>(metrics: &'a str, prefix: &str) -> Vec<&'a str> {
    metrics.lines().filter(|line| line.starts_with(prefix)).collect()
}

/// 7 ok picks, 2 of an unknown service, 1 with an unknown rule; `b` tripped by three failures.
async fn known_traffic(server: &TestServer) {
    let mut client = server.client().await;
    for _ in 0..7 {
        client.pick("orders", PickOptions::rule("round_robin")).await.expect("pick");
    }
    for _ in 0..2 {
        let error = client.pick("nobody", PickOptions::rule("round_robin")).await.unwrap_err();
        assert_eq!(error.code(), Some(tonic::Code::NotFound));
    }
    let error = client.pick("orders", PickOptions::rule("bogus")).await.unwrap_err();
    assert_eq!(error.code(), Some(tonic::Code::InvalidArgument));
    let report = client.report(vec![failure("orders", "b"); 3]).await.unwrap();
    assert_eq!(report.accepted, 3);
}

#[tokio::test]
async fn metrics_count_known_traffic_exactly() {
    let server = TestServer::start().await;
    let _orders =
        server.register(vec![instance("orders", "a", 1), instance("orders", "b", 2), instance("orders", "c", 3)]).await;
    known_traffic(&server).await;

    let (status, metrics) = get(admin(&server), "/metrics").await;
    assert_eq!(status, 200);
    assert_eq!(
        series(&metrics, "rota_picks_total{"),
        [
            r#"rota_picks_total{service="_unknown",rule="round_robin",result="not_found"} 2"#,
            r#"rota_picks_total{service="orders",rule="_unresolved",result="invalid_argument"} 1"#,
            r#"rota_picks_total{service="orders",rule="round_robin",result="ok"} 7"#,
        ]
    );
    assert_eq!(series(&metrics, "rota_fallback_picks_total{"), Vec::<&str>::new());
    assert_eq!(
        series(&metrics, "rota_instances{"),
        [
            r#"rota_instances{service="orders",status="UP"} 3"#,
            r#"rota_instances{service="orders",status="DRAINING"} 0"#,
            r#"rota_instances{service="orders",status="DOWN"} 0"#,
        ]
    );
    assert_eq!(series(&metrics, "rota_registration_streams "), ["rota_registration_streams 1"]);
    assert_eq!(series(&metrics, "rota_state_backend_up"), ["rota_state_backend_up{backend=\"memory\"} 1"]);
    assert_eq!(
        series(&metrics, "rota_breaker_open{"),
        [
            r#"rota_breaker_open{service="orders",instance_id="a"} 0"#,
            r#"rota_breaker_open{service="orders",instance_id="b"} 1"#,
            r#"rota_breaker_open{service="orders",instance_id="c"} 0"#,
        ]
    );
    // Every pick is timed, refusals included: the 10 of the pick counters.
    assert_eq!(series(&metrics, "rota_pick_duration_seconds_count "), ["rota_pick_duration_seconds_count 10"]);
    assert_eq!(
        series(&metrics, "rota_pick_duration_seconds_bucket{le=\"+Inf\"}"),
        ["rota_pick_duration_seconds_bucket{le=\"+Inf\"} 10"]
    );
    assert_eq!(
        series(&metrics, "rota_build_info"),
        [format!("rota_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"))]
    );
    let pick = r#"grpc_method="Pick",grpc_service="rota.v1.Balancer",grpc_type="unary""#;
    assert_eq!(
        series(&metrics, "grpc_server_started_total{grpc_method=\"Pick\""),
        [format!("grpc_server_started_total{{{pick}}} 10")]
    );
    assert_eq!(
        series(&metrics, "grpc_server_handled_total{").into_iter().filter(|l| l.contains(pick)).collect::<Vec<_>>(),
        [
            format!("grpc_server_handled_total{{grpc_code=\"OK\",{pick}}} 7"),
            format!("grpc_server_handled_total{{grpc_code=\"InvalidArgument\",{pick}}} 1"),
            format!("grpc_server_handled_total{{grpc_code=\"NotFound\",{pick}}} 2"),
        ]
    );
    assert_eq!(
        series(&metrics, &format!("grpc_server_handling_seconds_count{{{pick}}}")),
        [format!("grpc_server_handling_seconds_count{{{pick}}} 10")]
    );
    assert_eq!(series(&metrics, &format!("grpc_server_handling_seconds_bucket{{{pick},le=\"+Inf\"}}")).len(), 1);
}

#[tokio::test]
async fn service_view_has_exact_fields_and_unknown_services_are_404() {
    let server = TestServer::start().await;
    let _orders =
        server.register(vec![instance("orders", "a", 1), instance("orders", "b", 2), instance("orders", "c", 3)]).await;
    known_traffic(&server).await;

    let (status, body) = get(admin(&server), "/api/services/orders").await;
    assert_eq!(status, 200, "{body}");
    let view: serde_json::Value = serde_json::from_str(&body).unwrap();
    let epoch = view["epoch"].as_u64().expect("an epoch");
    let row = |id: &str, port: u16, in_flight: u64, latency: serde_json::Value, open: bool, picks: u64| {
        // Only b had calls reported: three failures.
        let (calls, error_rate) = if open { (3, json!(1.0)) } else { (0, json!(null)) };
        json!({
            "id": id, "host": "127.0.0.1", "port": port, "version": "", "zone": "", "weight": 100,
            "status": "UP", "in_flight": in_flight, "latency_ms": latency, "breaker_open": open,
            "ejected": open, "calls": calls, "errors": calls, "error_rate": error_rate,
            "picks": picks, "picks_by_rule": { "round_robin": picks },
        })
    };
    assert_eq!(
        view,
        json!({
            "name": "orders",
            "epoch": epoch,
            "instances": [
                row("a", 1, 3, json!(null), false, 3),
                // b's reported outcomes end its calls in flight.
                row("b", 2, 0, json!(1000.0), true, 2),
                row("c", 3, 2, json!(null), false, 2),
            ],
            "picks_by_rule": { "round_robin": 7 },
        })
    );

    let (status, body) = get(admin(&server), "/api/services").await;
    assert_eq!(status, 200);
    let expected = json!({ "services": [{ "name": "orders", "instances": 3, "up": 3, "epoch": epoch }] });
    assert_eq!(serde_json::from_str::<serde_json::Value>(&body).unwrap(), expected);

    let (status, body) = get(admin(&server), "/api/services/nobody").await;
    assert_eq!(status, 404);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap(),
        json!({ "error": "service \"nobody\" has never been registered" })
    );
}

/// A report of a call routed by a leased ticket records its latency but leaves the in-flight
/// count of unary picks alone: the lease never counted its calls in flight.
#[tokio::test]
async fn leased_reports_do_not_retire_unary_picks_in_flight() {
    let server = TestServer::start().await;
    let _inventory = server.register(vec![instance("inventory", "a", 1)]).await;
    let mut client = server.client().await;
    client.pick("inventory", PickOptions::rule("round_robin")).await.expect("pick");
    let lease =
        pb::LeaseRequest { service: "inventory".into(), rule: "round_robin".into(), count: 4, ..Default::default() };
    let leased = client.balancer().lease(lease).await.expect("lease").into_inner();
    assert_eq!((leased.first_ticket, leased.count), (1, 4));
    let outcome = |leased: bool| pb::CallOutcome {
        service: "inventory".into(),
        instance_id: "a".into(),
        ticket: 1,
        rule: "round_robin".into(),
        latency_us: 4_000,
        result: pb::CallResult::Ok.into(),
        leased,
    };
    let in_flight = |body: &str| {
        let view: serde_json::Value = serde_json::from_str(body).unwrap();
        (view["instances"][0]["in_flight"].as_u64(), view["instances"][0]["latency_ms"].as_f64())
    };

    let report = client.report(vec![outcome(true); 3]).await.unwrap();
    assert_eq!((report.accepted, report.ignored), (3, 0));
    let (_, body) = get(admin(&server), "/api/services/inventory").await;
    assert_eq!(in_flight(&body), (Some(1), Some(4.0)), "the unary pick is still in flight: {body}");

    client.report(vec![outcome(false)]).await.unwrap();
    let (_, body) = get(admin(&server), "/api/services/inventory").await;
    assert_eq!(in_flight(&body).0, Some(0), "the pick's own report retires it: {body}");
}

#[tokio::test]
async fn health_policies_and_dashboard_are_served() {
    let server = TestServer::start().await;
    let addr = admin(&server);
    assert_eq!(get(addr, "/healthz").await, (200, "ok".to_owned()));
    assert_eq!(get(addr, "/readyz").await, (200, "ready".to_owned()));
    let (status, body) = get(addr, "/api/policies").await;
    assert_eq!(status, 200);
    let policies: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(policies["defaults"]["rule"], "round_robin");
    assert_eq!(policies["defaults"]["source"], "default");
    assert_eq!(policies["services"], json!([]));
    let mut client = server.client().await;
    let set = pb::Policy { service: "orders".into(), rule: "random".into(), ..Default::default() };
    client.set_policy(set).await.unwrap();
    let (_, body) = get(addr, "/api/policies").await;
    let policies: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(policies["services"][0]["service"], "orders");
    assert_eq!(policies["services"][0]["source"], "runtime");
    let (status, page) = get(addr, "/").await;
    assert_eq!(status, 200);
    assert!(page.contains("/api/events?service="), "the dashboard follows the event stream");
    assert!(!page.contains("http://") && !page.contains("https://"), "no external resources");
}

/// An open event stream gets a snapshot at once and ends when the server stops.
#[tokio::test]
async fn event_stream_pushes_a_snapshot_and_ends_on_shutdown() {
    let server = TestServer::start().await;
    let orders = server.register(vec![instance("orders", "a", 1)]).await;
    let mut stream = TcpStream::connect(admin(&server)).await.unwrap();
    stream.write_all(b"GET /api/events?service=orders HTTP/1.1\r\nHost: rota\r\n\r\n").await.unwrap();
    let mut lines = BufReader::new(stream);
    let first_event = tokio::time::timeout(PATIENCE, async {
        let mut line = String::new();
        loop {
            line.clear();
            assert!(lines.read_line(&mut line).await.unwrap() > 0, "stream ended before an event");
            if let Some(data) = line.trim_end().strip_prefix("data: ") {
                return serde_json::from_str::<serde_json::Value>(data).unwrap();
            }
        }
    })
    .await
    .expect("an event in time");
    assert_eq!(first_event["name"], "orders");
    assert_eq!(first_event["instances"][0]["id"], "a");

    // Without an open registration the gRPC side stops at once; what is left is the event stream.
    drop(orders);
    server.server.stop().await.unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(PATIENCE, lines.read_to_end(&mut rest)).await.expect("the stream ends").unwrap();
}

/// A dashboard that opens event streams without reading them holds a few places, not memory
/// without bound: four per address, 32 in all; a closed stream gives its place back.
#[tokio::test]
async fn event_streams_are_capped_per_address() {
    let server = TestServer::start().await;
    let _orders = server.register(vec![instance("orders", "a", 1)]).await;
    let open = || async {
        let mut stream = TcpStream::connect(admin(&server)).await.unwrap();
        stream
            .write_all(b"GET /api/events?service=orders HTTP/1.1\r\nHost: rota\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut lines = BufReader::new(stream);
        let mut status = String::new();
        tokio::time::timeout(PATIENCE, lines.read_line(&mut status)).await.expect("an answer in time").unwrap();
        (status, lines)
    };
    let mut held = Vec::new();
    for _ in 0..rota::admin::streams::MAX_EVENT_STREAMS_PER_PEER {
        let (status, lines) = open().await;
        assert!(status.starts_with("HTTP/1.1 200"), "{status}");
        held.push(lines);
    }
    let (status, mut refused) = open().await;
    assert!(status.starts_with("HTTP/1.1 429"), "{status}");
    let mut rest = String::new();
    tokio::time::timeout(PATIENCE, refused.read_to_string(&mut rest)).await.expect("a body in time").unwrap();
    assert!(
        rest.ends_with("\r\n\r\n127.0.0.1 already holds 4 event streams, the limit per address; close a dashboard"),
        "{rest}"
    );
    drop(held.pop());
    let reopened = tokio::time::timeout(PATIENCE, async {
        loop {
            let (status, lines) = open().await;
            if status.starts_with("HTTP/1.1 200") {
                return lines;
            }
            // The closed stream's place comes back once the server notices the close.
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("a place comes back");
    drop((held, reopened));
}

/// A PickStream's picks count one by one; the stream itself counts once, when it ends.
#[tokio::test]
async fn pick_stream_counts_each_pick_and_the_stream_once() {
    let server = TestServer::start().await;
    let _orders = server.register(vec![instance("orders", "a", 1), instance("orders", "b", 2)]).await;
    let mut client = server.client().await;
    let request = |service: &str| pb::PickRequest { service: service.into(), ..Default::default() };
    let requests = tokio_stream::iter(vec![request("orders"), request("nobody"), request("orders")]);
    let mut responses = client.balancer().pick_stream(requests).await.unwrap().into_inner();
    let mut errors = Vec::new();
    while let Some(response) = responses.message().await.unwrap() {
        errors.push(response.error.map(|e| e.code));
    }
    assert_eq!(errors, [None, Some(tonic::Code::NotFound as i32), None]);

    let (_, metrics) = get(admin(&server), "/metrics").await;
    assert_eq!(
        series(&metrics, "rota_picks_total{"),
        [
            r#"rota_picks_total{service="_unknown",rule="round_robin",result="not_found"} 1"#,
            r#"rota_picks_total{service="orders",rule="round_robin",result="ok"} 2"#,
        ]
    );
    let stream = r#"grpc_method="PickStream",grpc_service="rota.v1.Balancer",grpc_type="bidi_stream""#;
    assert_eq!(
        series(&metrics, "grpc_server_handled_total{").into_iter().filter(|l| l.contains(stream)).collect::<Vec<_>>(),
        [format!("grpc_server_handled_total{{grpc_code=\"OK\",{stream}}} 1")]
    );
}

/// A pick that falls back from its version to unversioned instances is counted as a fallback.
#[tokio::test]
async fn fallback_picks_are_counted_per_service() {
    let server = TestServer::start().await;
    let _legacy = server.register(vec![instance("legacy", "a", 1)]).await;
    let mut client = server.client().await;
    let fell_back = client.pick("legacy", PickOptions::rule("round_robin").version("zlt")).await.unwrap();
    assert!(!fell_back.fallback.is_empty());
    let direct = client.pick("legacy", PickOptions::rule("round_robin")).await.unwrap();
    assert!(direct.fallback.is_empty());

    let (_, metrics) = get(admin(&server), "/metrics").await;
    assert_eq!(series(&metrics, "rota_fallback_picks_total{"), [r#"rota_fallback_picks_total{service="legacy"} 1"#]);
    assert_eq!(
        series(&metrics, "rota_picks_total{"),
        [r#"rota_picks_total{service="legacy",rule="round_robin",result="ok"} 2"#]
    );
}

#[tokio::test]
async fn a_grpc_client_pointed_at_the_admin_port_is_told_so() {
    let server = TestServer::start().await;
    let mut client = rota::client::RotaClient::connect(&format!("http://{}", admin(&server))).await.unwrap();
    let error = client.pick("orders", PickOptions::rule("round_robin")).await.unwrap_err();
    assert_eq!(error.code(), Some(tonic::Code::Unimplemented), "{error}");
    assert!(error.to_string().contains("rota's admin HTTP port"), "{error}");
    assert!(error.to_string().contains("/rota.v1.Balancer/Pick"), "{error}");
    // Plain HTTP requests are served as before.
    assert_eq!(get(admin(&server), "/healthz").await, (200, "ok".to_owned()));
}

#[tokio::test]
async fn channel_traffic_shows_per_instance_calls_errors_and_picks() {
    let server = TestServer::start().await;
    let _web = server.register(vec![instance("web", "a", 1), instance("web", "b", 2)]).await;
    let mut client = server.client().await;
    let lease = pb::LeaseRequest { service: "web".into(), rule: "round_robin".into(), count: 10, ..Default::default() };
    let leased = client.balancer().lease(lease).await.expect("lease").into_inner();
    assert_eq!(leased.count, 10);
    // The channel spent six tickets: a answered three, b failed one and answered two.
    let outcome = |id: &str, ticket: u64, result: pb::CallResult| pb::CallOutcome {
        service: "web".into(),
        instance_id: id.into(),
        ticket,
        rule: "round_robin".into(),
        latency_us: 3_000,
        result: result.into(),
        leased: true,
    };
    let ok = pb::CallResult::Ok;
    let calls = vec![
        outcome("a", 0, ok),
        outcome("b", 1, pb::CallResult::Error),
        outcome("a", 2, ok),
        outcome("b", 3, ok),
        outcome("a", 4, ok),
        outcome("b", 5, ok),
    ];
    assert_eq!(client.report(calls).await.unwrap().accepted, 6);

    let (_, body) = get(admin(&server), "/api/services/web").await;
    let view: serde_json::Value = serde_json::from_str(&body).unwrap();
    let row = |i: usize| {
        let r = &view["instances"][i];
        (r["id"].as_str(), r["calls"].as_u64(), r["errors"].as_u64(), r["picks"].as_u64(), r["error_rate"].as_f64())
    };
    assert_eq!(row(0), (Some("a"), Some(3), Some(0), Some(3), Some(0.0)), "{body}");
    assert_eq!(row(1), (Some("b"), Some(3), Some(1), Some(3), Some(1.0 / 3.0)), "{body}");
    // The failed call does not make b look fast.
    assert!(
        view["instances"][1]["latency_ms"].as_f64().unwrap() > view["instances"][0]["latency_ms"].as_f64().unwrap()
    );

    let (_, metrics) = get(admin(&server), "/metrics").await;
    assert_eq!(
        series(&metrics, "rota_picks_total{service=\"web\""),
        [r#"rota_picks_total{service="web",rule="round_robin",result="ok"} 10"#],
        "a lease counts its tickets"
    );
    assert_eq!(
        series(&metrics, "rota_instance_calls_total{"),
        [
            r#"rota_instance_calls_total{service="web",instance_id="a",result="ok"} 3"#,
            r#"rota_instance_calls_total{service="web",instance_id="a",result="error"} 0"#,
            r#"rota_instance_calls_total{service="web",instance_id="b",result="ok"} 2"#,
            r#"rota_instance_calls_total{service="web",instance_id="b",result="error"} 1"#,
        ]
    );
    // A latency no call can have is refused whole, changing nothing.
    let mut absurd = outcome("a", 6, ok);
    absurd.latency_us = u64::MAX;
    let error = client.report(vec![absurd]).await.unwrap_err();
    assert_eq!(error.code(), Some(tonic::Code::InvalidArgument));
    assert!(error.to_string().contains("outcomes[0].latency_us"), "{error}");
    let (_, body) = get(admin(&server), "/api/services/web").await;
    let view: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(view["instances"][0]["calls"].as_u64(), Some(3));
}

/// Connects to `to` from the loopback address `ip`.
async fn connect_from(ip: std::net::Ipv4Addr, to: SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind(SocketAddr::new(ip.into(), 0)).unwrap();
    socket.connect(to).await.unwrap()
}

/// Whether the server closes `stream` (end of stream or reset) within `within`.
async fn closed_within(stream: &mut TcpStream, within: std::time::Duration) -> bool {
    let mut buf = [0u8; 64];
    matches!(tokio::time::timeout(within, stream.read(&mut buf)).await, Ok(Ok(0) | Err(_)))
}

/// Idle and half-sent admin connections hold no more than their cap and are closed in time;
/// another address still gets `/healthz`, and gRPC is not touched.
#[tokio::test]
async fn idle_and_half_sent_admin_connections_are_capped_and_closed() {
    use std::net::Ipv4Addr;
    let server = TestServer::start().await;
    let addr = admin(&server);
    let _provider = server.register(vec![instance("adm", "a", 1)]).await;
    let per_peer = rota::admin::ADMIN_LIMITS.max_connections_per_peer;

    // Connections that never send a byte: the per-address cap holds, the next is closed.
    let mut idle = Vec::new();
    for _ in 0..per_peer {
        idle.push(connect_from(Ipv4Addr::new(127, 0, 0, 1), addr).await);
    }
    let mut over = connect_from(Ipv4Addr::new(127, 0, 0, 1), addr).await;
    // (It goes to the probe reserve, which closes it when no probe arrives in 2 s.)
    assert!(closed_within(&mut over, PATIENCE).await, "the connection over the per-address cap is closed");

    // A request head that never ends.
    let mut half = connect_from(Ipv4Addr::new(127, 0, 0, 3), addr).await;
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: rota\r\n").await.unwrap();

    // Another address is served meanwhile, and so is gRPC.
    let mut other = connect_from(Ipv4Addr::new(127, 0, 0, 2), addr).await;
    other.write_all(b"GET /healthz HTTP/1.0\r\nHost: rota\r\n\r\n").await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(PATIENCE, other.read_to_string(&mut answer)).await.unwrap().unwrap();
    assert!(answer.starts_with("HTTP/1.0 200") && answer.ends_with("ok"), "{answer}");
    let picked = server.client().await.pick("adm", PickOptions::default()).await.unwrap().into_response();
    assert_eq!(picked.instance.unwrap().id, "a");

    // The header timeout closes the half-sent request, the handshake timeout the silent ones.
    let within = rota::admin::HEADER_TIMEOUT + PATIENCE;
    assert!(closed_within(&mut half, within).await, "a half-sent request head is closed");
    for conn in &mut idle {
        assert!(closed_within(conn, within).await, "a silent connection is closed");
    }
    // Their places are free again.
    let (status, body) = get(addr, "/healthz").await;
    assert_eq!((status, body.as_str()), (200, "ok"));
}

/// Idle connections from nine addresses fill the admin listener's caps (512 in all, 64 each);
/// `/healthz` and `/readyz` from another address are still answered every time, from the probe
/// reserve, which serves nothing else.
#[tokio::test]
async fn health_probes_are_answered_while_idle_connections_fill_the_admin_caps() {
    use std::net::Ipv4Addr;
    let limits = rota::admin::ADMIN_LIMITS;
    // This process holds both ends of every connection.
    rota::listener::raise_open_files_limit(4 * limits.max_connections);
    let server = TestServer::start().await;
    let addr = admin(&server);
    let mut idle = Vec::new();
    for host in 2..=10u8 {
        for _ in 0..limits.max_connections_per_peer {
            idle.push(connect_from(Ipv4Addr::new(127, 0, 0, host), addr).await);
        }
    }
    // Every attacking address also holds its share of the reserve.
    for host in 2..=10u8 {
        for _ in 0..rota::listener::RESERVE_PER_PEER {
            idle.push(connect_from(Ipv4Addr::new(127, 0, 0, host), addr).await);
        }
    }
    let probe = |path: &'static str| async move {
        let mut conn = connect_from(Ipv4Addr::new(127, 0, 0, 1), addr).await;
        conn.write_all(format!("GET {path} HTTP/1.1\r\nHost: rota\r\n\r\n").as_bytes()).await.unwrap();
        let mut answer = String::new();
        tokio::time::timeout(PATIENCE, conn.read_to_string(&mut answer)).await.unwrap().unwrap();
        answer
    };
    let mut answered = 0;
    for round in 0..80 {
        let path = if round % 2 == 0 { "/healthz" } else { "/readyz" };
        let answer = probe(path).await;
        assert!(answer.starts_with("HTTP/1.1 200"), "probe {round} of {path}: {answer:?}");
        answered += 1;
    }
    assert_eq!(answered, 80);
    // Anything else on a reserve connection is refused, saying why.
    let answer = probe("/api/services").await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("answers /healthz and /readyz only"), "{answer}");
    drop(idle);
}
