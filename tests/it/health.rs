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
    assert!(steady_now.health.starts_with("failing: "), "{steady_now:?}");
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
    wait_health(&server, "orders", "grpc", "failing: gRPC health NOT_SERVING").await;

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
            if listed(&server, "web", "app").await.health.starts_with("failing") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(gone.is_ok());
    assert!(listed(&server, "web", "app").await.health.contains("503"));
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
            let health = listed(&server, "files", "python").await.health;
            if health.starts_with("failing") {
                return health;
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
        wait_health(replica, "fleet", "dead", "failing: connect: connection refused").await;
        assert_eq!(listed(replica, "fleet", "dead").await.status, pb::InstanceStatus::Down as i32);
        wait_health(replica, "fleet", "i00", "passing").await;
    }
    // One replica stops: the other checks the whole fleet.
    let survivor = replicas.pop().unwrap();
    drop(replicas);
    wait_health(&survivor, "fleet", "dead", "failing: connect: connection refused").await;
    let alone = tokio::time::timeout(PATIENCE * 2, async {
        while gauge(&survivor, "rota_health_checked_instances").await != 25 {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(alone.is_ok(), "the survivor did not take the departed replica's checks over");
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
