//! Active health checks against real servers on loopback: a gRPC health server, an HTTP server
//! (in process, and a separate `python3 -m http.server` that is SIGSTOPped to hang), and a TCP
//! listener. Instances that stop answering stop getting picks; picks resume when they answer.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rota::client::PickOptions;
use rota::pb;

use crate::harness::{PATIENCE, TestServer, instance, picked_id};

/// A check every `ms`, each within `ms` (long enough not to fail a busy test machine's
/// answers, except where a hang is the point).
fn check(kind: &str, path: &str, ms: u64) -> pb::HealthCheck {
    pb::HealthCheck {
        kind: kind.into(),
        path: path.into(),
        interval_ms: ms,
        timeout_ms: ms,
        unhealthy_after: 2,
        healthy_after: 2,
    }
}

async fn checked_service(server: &TestServer, service: &str, check: pb::HealthCheck) {
    let policy = pb::Policy { service: service.into(), health_check: Some(check), ..Default::default() };
    let set = server.client().await.set_policy(policy).await.expect("a valid policy");
    assert!(set.health_check.is_some(), "{set:?}");
}

/// A TCP listener that accepts and holds connections until dropped.
async fn listener() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            held.push(stream);
            held.truncate(64);
        }
    });
    (addr, task)
}

/// The ids a few round-robin picks of `service` return.
async fn picked(server: &TestServer, service: &str) -> BTreeSet<String> {
    let mut client = server.client().await;
    let mut ids = BTreeSet::new();
    for _ in 0..6 {
        match client.pick(service, PickOptions::rule("round_robin")).await {
            Ok(pick) => ids.insert(picked_id(&pick)),
            Err(_) => break,
        };
    }
    ids
}

async fn wait_picked(server: &TestServer, service: &str, what: &str, expected: &[&str]) {
    let expected: BTreeSet<String> = expected.iter().map(|s| s.to_string()).collect();
    let mut last = BTreeSet::new();
    let waited = tokio::time::timeout(PATIENCE, async {
        loop {
            last = picked(server, service).await;
            if last == expected {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let listing = server.client().await.list_instances(service).await.map(|l| l.instances);
    assert!(waited.is_ok(), "{what}: picks reached {last:?}, not {expected:?}; listed: {listing:?}");
}

/// The instance `id` of `service` as rota lists it.
async fn listed(server: &TestServer, service: &str, id: &str) -> pb::Instance {
    let list = server.client().await.list_instances(service).await.expect("listed");
    list.instances.into_iter().find(|i| i.id == id).expect("the instance is listed")
}

/// The instance `id` of `service`'s verdict as the admin API shows it, reason and all.
async fn admin_health(server: &TestServer, service: &str, id: &str) -> String {
    let addr = server.server.admin_addr().expect("admin listener");
    let (status, body) = crate::admin::get(addr, &format!("/api/services/{service}")).await;
    assert_eq!(status, 200, "{body}");
    let view: serde_json::Value = serde_json::from_str(&body).unwrap();
    let instances = view["instances"].as_array().expect("instances");
    let instance = instances.iter().find(|i| i["id"] == id).expect("the instance is in the admin API");
    instance["health"].as_str().unwrap_or_default().to_owned()
}

/// Waits until a pick-scoped listing shows `id` failing, and checks the admin API gives the
/// reason `why`, which listings leave out.
async fn wait_failing(server: &TestServer, service: &str, id: &str, why: &str) {
    wait_health(server, service, id, "failing").await;
    assert_eq!(admin_health(server, service, id).await, format!("failing: {why}"));
}

async fn wait_health(server: &TestServer, service: &str, id: &str, health: &str) {
    let mut last = String::new();
    let waited = tokio::time::timeout(PATIENCE, async {
        loop {
            last = listed(server, service, id).await.health;
            if last == health {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "{id}'s health stayed {last:?}, not {health:?}");
}

#[tokio::test]
async fn a_grpc_instance_not_serving_gets_no_picks_until_it_serves_again() {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter.set_service_status("orders.v1.Orders", tonic_health::ServingStatus::Serving).await;
    let grpc = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let grpc_addr = grpc.local_addr().unwrap();
    let serving = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(grpc)),
    );
    let (steady, _steady_task) = listener().await;
    let server = TestServer::start_with(|_| {}).await;
    checked_service(&server, "orders", check("grpc", "orders.v1.Orders", 400)).await;
    let _held = server
        .register(vec![
            instance("orders", "grpc", grpc_addr.port().into()),
            instance("orders", "steady", steady.port().into()),
        ])
        .await;
    // The steady one does not speak gRPC: it fails, and only the health server is picked.
    wait_picked(&server, "orders", "the gRPC server only", &["grpc"]).await;
    let steady_now = listed(&server, "orders", "steady").await;
    assert_eq!(steady_now.status, pb::InstanceStatus::Down as i32);
    assert_eq!(steady_now.announced_status, pb::InstanceStatus::Up as i32);
    assert_eq!(steady_now.health, "failing", "the reason is the admin scope's: {steady_now:?}");
    assert!(admin_health(&server, "orders", "steady").await.starts_with("failing: "));
    wait_health(&server, "orders", "grpc", "passing").await;

    reporter.set_service_status("orders.v1.Orders", tonic_health::ServingStatus::NotServing).await;
    let no_picks = tokio::time::timeout(PATIENCE, async {
        loop {
            if let Err(refused) = server.client().await.pick("orders", PickOptions::rule("round_robin")).await {
                return refused.to_string();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("no instance left to pick");
    assert!(no_picks.contains("UNAVAILABLE"), "{no_picks}");
    wait_failing(&server, "orders", "grpc", "gRPC health NOT_SERVING").await;

    reporter.set_service_status("orders.v1.Orders", tonic_health::ServingStatus::Serving).await;
    wait_picked(&server, "orders", "serving again", &["grpc"]).await;
    serving.abort();
}

#[tokio::test]
async fn an_http_instance_that_fails_or_dies_and_a_tcp_listener_that_closes_leave_and_come_back() {
    let failing = Arc::new(AtomicBool::new(false));
    let answer = failing.clone();
    let app = axum::Router::new().route(
        "/healthz",
        axum::routing::get(move || {
            let failing = answer.load(Ordering::SeqCst);
            async move { if failing { axum::http::StatusCode::SERVICE_UNAVAILABLE } else { axum::http::StatusCode::OK } }
        }),
    );
    let http = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let http_addr = http.local_addr().unwrap();
    let http_task = tokio::spawn(async move {
        let _ = axum::serve(http, app).await;
    });
    let (tcp_addr, tcp_task) = listener().await;
    let server = TestServer::start_with(|_| {}).await;
    checked_service(&server, "web", check("http", "/healthz", 400)).await;
    checked_service(&server, "raw", check("tcp", "", 400)).await;
    let (other, _other_task) = listener().await;
    let _web = server.register(vec![instance("web", "app", http_addr.port().into())]).await;
    let _raw = server
        .register(vec![instance("raw", "tcp", tcp_addr.port().into()), instance("raw", "other", other.port().into())])
        .await;
    wait_picked(&server, "web", "the app answering 200", &["app"]).await;
    wait_picked(&server, "raw", "both listeners", &["other", "tcp"]).await;

    // 503: the app gets no picks; 200 again: it does.
    failing.store(true, Ordering::SeqCst);
    let gone = tokio::time::timeout(PATIENCE, async {
        loop {
            if listed(&server, "web", "app").await.health == "failing" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(gone.is_ok());
    assert_eq!(admin_health(&server, "web", "app").await, "failing: answered HTTP 503");
    failing.store(false, Ordering::SeqCst);
    wait_picked(&server, "web", "the app answering 200 again", &["app"]).await;

    // The listener closes: refused connections fail the check.
    tcp_task.abort();
    let _ = tcp_task.await;
    wait_picked(&server, "raw", "the closed listener left", &["other"]).await;
    http_task.abort();
}

/// `python3 -m http.server`, for a process that can be stopped (SIGSTOP) and hang.
struct PythonHttp {
    child: Child,
    port: u16,
}

impl PythonHttp {
    async fn start() -> Self {
        let port = crate::redis_server::free_port();
        let child = Command::new("python3")
            .args(["-m", "http.server", &port.to_string(), "--bind", "127.0.0.1"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 starts");
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        tokio::time::timeout(PATIENCE, async {
            while tokio::net::TcpStream::connect(addr).await.is_err() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("python3 -m http.server listens");
        Self { child, port }
    }

    fn signal(&self, signal: libc::c_int) {
        // SAFETY: a plain signal to a child this test started and has not reaped.
        unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
    }
}

impl Drop for PythonHttp {
    fn drop(&mut self) {
        self.signal(libc::SIGCONT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn a_hung_instance_fails_through_the_timeout_and_returns_when_it_answers() {
    let python = PythonHttp::start().await;
    let (steady, _steady_task) = listener().await;
    let server = TestServer::start_with(|_| {}).await;
    checked_service(&server, "files", check("http", "/", 250)).await;
    let _held = server
        .register(vec![
            instance("files", "python", python.port.into()),
            instance("files", "steady", steady.port().into()),
        ])
        .await;
    // The steady listener never answers HTTP: it fails through the timeout from the start.
    wait_picked(&server, "files", "python only", &["python"]).await;
    python.signal(libc::SIGSTOP);
    let hung = tokio::time::timeout(PATIENCE, async {
        loop {
            if listed(&server, "files", "python").await.health == "failing" {
                return admin_health(&server, "files", "python").await;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the hung instance fails");
    assert!(hung.contains("no answer within 250ms"), "{hung}");
    let refused = server.client().await.pick("files", PickOptions::rule("round_robin")).await;
    assert!(refused.is_err(), "nothing answers: {refused:?}");
    python.signal(libc::SIGCONT);
    wait_picked(&server, "files", "python answering again", &["python"]).await;
}

/// `rota_NAME VALUE` from a replica's metrics.
async fn gauge(server: &TestServer, name: &str) -> u64 {
    let metrics = crate::harness::metrics(server).await;
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from the metrics"))
}

#[tokio::test]
async fn replicas_share_the_checks_out_and_each_sees_the_others_verdicts() {
    let redis = crate::redis_server::RedisServer::start().await;
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let state = rota::state::StateConfig::parse(&redis.url(), 1, Duration::from_secs(5)).unwrap();
        replicas.push(TestServer::start_with(|c| c.state = state).await);
    }
    checked_service(&replicas[0], "fleet", check("tcp", "", 300)).await;
    let (open, _open_task) = listener().await;
    let closed = crate::redis_server::free_port();
    let mut instances: Vec<pb::Instance> =
        (0..24).map(|i| instance("fleet", &format!("i{i:02}"), open.port().into())).collect();
    instances.push(instance("fleet", "dead", closed.into()));
    // Registered on the replica that stays (the other's own registrations would leave with it).
    let _held = replicas[1].register(instances).await;
    // Each instance is checked by one replica: the two counts add up to the fleet, and both
    // take a share.
    let shared = tokio::time::timeout(PATIENCE * 2, async {
        loop {
            let (a, b) = (
                gauge(&replicas[0], "rota_health_checked_instances").await,
                gauge(&replicas[1], "rota_health_checked_instances").await,
            );
            if a + b == 25 && a > 0 && b > 0 {
                return (a, b);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(shared.is_ok(), "the checks were not shared out");
    // The dead one is DOWN on both, whichever replica checks it.
    for replica in &replicas {
        wait_failing(replica, "fleet", "dead", "connect: connection refused").await;
        assert_eq!(listed(replica, "fleet", "dead").await.status, pb::InstanceStatus::Down as i32);
        wait_health(replica, "fleet", "i00", "passing").await;
    }
    // One replica stops: the other checks the whole fleet.
    let survivor = replicas.pop().unwrap();
    drop(replicas);
    wait_failing(&survivor, "fleet", "dead", "connect: connection refused").await;
    let alone = tokio::time::timeout(PATIENCE * 2, async {
        while gauge(&survivor, "rota_health_checked_instances").await != 25 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(alone.is_ok(), "the survivor did not take the departed replica's checks over");
}

/// An instance announced at rota's own gRPC or admin listener is never connected to: it fails
/// at its first check, saying so to the admin scope only.
#[tokio::test]
async fn rotas_own_listeners_are_never_checked() {
    let (other, _other_task) = listener().await;
    let server = TestServer::start().await;
    let (grpc, admin) = (server.server.local_addr(), server.server.admin_addr().unwrap());
    let slow = pb::HealthCheck { unhealthy_after: 100, ..check("tcp", "", 400) };
    checked_service(&server, "inside", slow).await;
    let _held = server
        .register(vec![
            instance("inside", "grpc", grpc.port().into()),
            instance("inside", "admin", admin.port().into()),
            instance("inside", "other", other.port().into()),
        ])
        .await;
    // unhealthy_after is 100: only an address rota does not check fails this soon.
    wait_failing(&server, "inside", "grpc", &format!("not checked: {grpc} is rota's own gRPC listener")).await;
    wait_failing(&server, "inside", "admin", &format!("not checked: {admin} is rota's own admin listener")).await;
    wait_health(&server, "inside", "other", "passing").await;
    wait_picked(&server, "inside", "the other listener only", &["other"]).await;
}

/// With the networks rota checks by default once it is reachable from elsewhere (no loopback),
/// a provider registering loopback ports learns nothing: an open port and a closed one both
/// fail unchecked, alike to the pick scope, and nothing connects to the open one.
#[tokio::test]
async fn outside_the_networks_checked_an_open_port_and_a_closed_one_look_the_same() {
    let open = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let open_port = open.local_addr().unwrap().port();
    let closed = crate::redis_server::free_port();
    let networks = rota::health::reach::Networks::parse("0.0.0.0/0, ::/0, !127.0.0.0/8, !::1/128").unwrap();
    let server = TestServer::start_with(|c| c.health_check_networks = Some(networks)).await;
    checked_service(&server, "scan", check("tcp", "", 200)).await;
    let _held = server
        .register(vec![instance("scan", "open", open_port.into()), instance("scan", "closed", closed.into())])
        .await;
    for id in ["open", "closed"] {
        wait_failing(&server, "scan", id, "not checked: 127.0.0.1 is outside server.health_check_networks").await;
    }
    let listing = server.client().await.list_instances("scan").await.unwrap().instances;
    let shown: Vec<(&str, &str, i32)> = listing.iter().map(|i| (i.id.as_str(), i.health.as_str(), i.status)).collect();
    let down = pb::InstanceStatus::Down as i32;
    assert_eq!(shown, [("closed", "failing", down), ("open", "failing", down)]);
    let accepted = tokio::time::timeout(Duration::from_millis(1), open.accept()).await;
    assert!(accepted.is_err(), "rota connected to a port outside the networks it checks");
}

/// A health check rota cannot run is refused over gRPC, naming the field that is wrong, and
/// changes nothing.
#[tokio::test]
async fn a_bad_health_check_is_refused_by_field_and_changes_nothing() {
    let server = TestServer::start().await;
    let mut admin = server.client().await;
    checked_service(&server, "kept", check("tcp", "", 1000)).await;
    let before = admin.list_policies().await.unwrap();
    let cases = [
        (pb::HealthCheck { kind: "udp".into(), ..check("tcp", "", 1000) }, "kind"),
        (check("tcp", "", 10), "interval"),
        (pb::HealthCheck { timeout_ms: 5000, ..check("tcp", "", 1000) }, "timeout"),
        (pb::HealthCheck { unhealthy_after: 1000, ..check("tcp", "", 1000) }, "unhealthy_after"),
        (pb::HealthCheck { healthy_after: 101, ..check("tcp", "", 1000) }, "healthy_after"),
        (check("http", "no-slash", 1000), "path"),
        (check("tcp", "/x", 1000), "path"),
        (check("http", "/a b", 1000), "path"),
    ];
    for service in ["kept", "new"] {
        for (bad, field) in &cases {
            let policy = pb::Policy { service: service.into(), health_check: Some(bad.clone()), ..Default::default() };
            let error = admin.set_policy(policy).await.unwrap_err();
            assert_eq!(error.code(), Some(tonic::Code::InvalidArgument), "{bad:?}: {error}");
            let prefix = format!("INVALID_ARGUMENT: policy.health_check.{field} ");
            assert!(error.to_string().starts_with(&prefix), "{bad:?}: {error}");
        }
    }
    assert_eq!(admin.list_policies().await.unwrap(), before, "nothing changed");
}
