//! The etcd source against a real etcd (Debian's `etcd-server`, `scripts/install-etcd.sh`) on
//! free loopback ports, with endpoints registered by `etcd-endpoints` (tests/sources/etcd, built
//! by `scripts/build-etcd-endpoints.sh`), which writes them as grpc-go's `naming/endpoints` and
//! go-zero's `core/discov` do.

use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rota::sources::etcd::{WatchAnswer, parse_watch};
use rota::sources::http::Endpoint;

use super::{UP, http, listed, scratch, source, source_views, wait_listed, wait_source_up, wait_source_views};
use crate::harness::{PATIENCE, TestServer};

/// A single-member etcd on free loopback ports, with its data in a temporary directory kept
/// across [`Etcd::stop`] and [`Etcd::start_again`].
pub struct Etcd {
    pub port: u16,
    peer: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Etcd {
    pub async fn start() -> Self {
        let port = crate::redis_server::free_port();
        let mut peer = crate::redis_server::free_port();
        while peer == port {
            peer = crate::redis_server::free_port();
        }
        let mut etcd = Self { port, peer, dir: scratch("etcd"), child: None };
        etcd.start_again().await;
        etcd
    }

    fn addr(&self) -> SocketAddr {
        ([127, 0, 0, 1], self.port).into()
    }

    /// The source URL of the keys under `prefix`.
    pub fn url(&self, prefix: &str) -> String {
        format!("etcd://{}/{prefix}", self.addr())
    }

    /// Starts it (again, on the same ports and data) and waits until `/health` says so.
    pub async fn start_again(&mut self) {
        let client = format!("http://{}", self.addr());
        let peer = format!("http://127.0.0.1:{}", self.peer);
        let child = Command::new("etcd")
            .args(["--name", "default", "--data-dir"])
            .arg(self.dir.join("etcd"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("default={peer}")])
            .args(["--logger=zap", "--log-level=error"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start etcd (scripts/install-etcd.sh installs it): {e}"));
        self.child = Some(child);
        let addr = self.addr();
        let ready = tokio::time::timeout(PATIENCE * 3, async {
            loop {
                if let Some((200, body)) = http(addr, "GET", "/health").await
                    && body.contains("\"true\"")
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await;
        assert!(ready.is_ok(), "etcd on {addr} never answered /health");
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `etcd-endpoints`, driven over its stdin and stdout: one command, one answer line.
pub struct Endpoints {
    child: Child,
    io: Arc<Mutex<(ChildStdin, BufReader<ChildStdout>)>>,
}

impl Endpoints {
    pub async fn start(etcd: &Etcd) -> Self {
        let binary = std::env::var("ROTA_ETCD_ENDPOINTS")
            .unwrap_or_else(|_| format!("{}/target/etcd-endpoints", env!("CARGO_MANIFEST_DIR")));
        assert!(
            std::path::Path::new(&binary).exists(),
            "{binary} is missing: scripts/build-etcd-endpoints.sh builds it"
        );
        let mut child = Command::new(&binary)
            .args(["-endpoints", &etcd.addr().to_string(), "-timeout", "5s", "-dial-timeout", "5s"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("etcd-endpoints starts");
        let io = (child.stdin.take().unwrap(), BufReader::new(child.stdout.take().unwrap()));
        let endpoints = Self { child, io: Arc::new(Mutex::new(io)) };
        endpoints.ok("rev").await;
        endpoints
    }

    /// Sends `command`; its answer line.
    pub async fn send(&self, command: &str) -> String {
        let io = self.io.clone();
        let line = command.to_owned();
        tokio::time::timeout(
            PATIENCE,
            tokio::task::spawn_blocking(move || {
                let mut io = io.lock().unwrap();
                writeln!(io.0, "{line}").and_then(|()| io.0.flush()).expect("etcd-endpoints takes a command");
                let mut answer = String::new();
                io.1.read_line(&mut answer).expect("etcd-endpoints answers");
                answer.trim_end().to_owned()
            }),
        )
        .await
        .unwrap_or_else(|_| panic!("etcd-endpoints did not answer {command:?}"))
        .unwrap()
    }

    /// Sends `command` and checks it went through; the answer after `ok `.
    pub async fn ok(&self, command: &str) -> String {
        let answer = self.send(command).await;
        let Some(rest) = answer.strip_prefix("ok") else { panic!("{command:?} answered {answer:?}") };
        rest.trim().to_owned()
    }

    /// `add …`: the lease it was added under, in decimal (as rota shows it).
    pub async fn add(&self, arguments: &str) -> String {
        let answer = self.ok(&format!("add {arguments}")).await;
        lease_of(&answer)
    }
}

fn lease_of(answer: &str) -> String {
    let hex = answer.split("lease=").nth(1).expect("a lease").split(' ').next().unwrap();
    u64::from_str_radix(hex, 16).expect("a hex lease").to_string()
}

impl Drop for Endpoints {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The instances of `service`, whole, by id.
async fn instances(server: &TestServer, service: &str) -> std::collections::BTreeMap<String, rota::pb::Instance> {
    let mut client = server.client().await;
    let list = client.list_instances(service).await.expect("listed");
    list.instances.into_iter().map(|i| (i.id.clone(), i)).collect()
}

#[tokio::test]
async fn grpc_go_endpoints_are_followed_through_deletes_lease_expiry_a_dead_etcd_and_its_restart() {
    let mut etcd = Etcd::start().await;
    let driver = Endpoints::start(&etcd).await;
    let lease_a =
        driver.add(r#"svc/echo a 127.0.0.1:9001 5 {"version":"v2","zone":"z1","weight":3,"team":"pay"}"#).await;
    driver.add("svc/echo b 127.0.0.1:9002 5").await;
    driver.add("svc/echo c [::1]:9003 5").await;
    driver.add("svc/echo d 127.0.0.1:9004 0").await;
    let spec = source(&etcd.url("svc"), |t| {
        t.interval = Some("500ms".into());
        t.timeout = Some("2s".into());
    });
    let server = TestServer::start_with(|c| c.sources = vec![spec]).await;

    let first = wait_listed(&server, "echo", "the four endpoints", |l| l.len() == 4).await;
    assert_eq!(first["etcd:a"], ("127.0.0.1:9001".into(), UP, 3));
    assert_eq!(first["etcd:c"].0, "::1:9003");
    let whole = instances(&server, "echo").await;
    let a = &whole["etcd:a"];
    assert_eq!((a.version.as_str(), a.zone.as_str()), ("v2", "z1"));
    assert_eq!(a.metadata.get("etcd.lease"), Some(&lease_a), "{a:?}");
    assert_eq!(a.metadata.get("team").map(String::as_str), Some("pay"));
    assert!(!whole["etcd:d"].metadata.contains_key("etcd.lease"), "d has no lease");
    let mut client = server.client().await;
    let picked = client
        .pick("echo", rota::client::PickOptions::rule("round_robin").version("v2"))
        .await
        .expect("a pick")
        .into_response();
    assert_eq!(crate::harness::picked_id(&picked), "etcd:a");

    // An endpoint deleted, and one whose lease runs out once it is no longer renewed, leave.
    driver.ok("del svc/echo b").await;
    wait_listed(&server, "echo", "b deleted", |l| l.len() == 3 && !l.contains_key("etcd:b")).await;
    driver.ok("stopkeepalive c").await;
    wait_listed(&server, "echo", "c's lease expired", |l| l.len() == 2 && !l.contains_key("etcd:c")).await;
    driver.add("svc/echo e 127.0.0.1:9005 5").await;
    wait_listed(&server, "echo", "e added", |l| l.len() == 3 && l.contains_key("etcd:e")).await;

    // etcd dies: the source goes stale, the instances stay and picks go on.
    etcd.stop();
    let stale = wait_source_up(&server, false).await;
    assert!(stale["sources"][0]["last_error"].as_str().is_some(), "{stale}");
    assert_eq!(listed(&server, "echo").await.len(), 3);
    client.pick("echo", rota::client::PickOptions::rule("round_robin")).await.expect("a pick from the last listing");
    let metrics = crate::harness::metrics(&server).await;
    assert!(metrics.contains("rota_source_up{source=\"etcd\",kind=\"etcd\"} 0"), "{metrics}");

    // Back on the same port with the same data: the source reads it again and watches on.
    etcd.start_again().await;
    wait_source_up(&server, true).await;
    driver.add("svc/echo f 127.0.0.1:9006 5").await;
    let back = wait_listed(&server, "echo", "f added after the restart", |l| l.contains_key("etcd:f")).await;
    assert_eq!(back.keys().map(String::as_str).collect::<Vec<_>>(), ["etcd:a", "etcd:d", "etcd:e", "etcd:f"]);
    driver.ok("del svc/echo e").await;
    wait_listed(&server, "echo", "e deleted after the restart", |l| !l.contains_key("etcd:e")).await;
}

/// The only endpoint of a service stops renewing its lease: etcd deletes its key, and the
/// removal, which empties the service, is held back; it is applied when `protect_for` runs out
/// although nothing under the prefix changes after the delete.
#[tokio::test]
async fn a_lapsed_lease_that_empties_a_service_is_held_back_then_applied_while_etcd_stays_silent() {
    let etcd = Etcd::start().await;
    let driver = Endpoints::start(&etcd).await;
    driver.add("svc/solo a 127.0.0.1:9101 2").await;
    let spec = source(&etcd.url("svc"), |t| {
        t.interval = Some("500ms".into());
        t.timeout = Some("2s".into());
        t.protect_for = Some("3s".into());
    });
    let server = TestServer::start_with(|c| c.sources = vec![spec]).await;
    wait_listed(&server, "solo", "the endpoint", |l| l.len() == 1).await;
    driver.ok("stopkeepalive a").await;
    let held = wait_source_views(&server, "the lapsed lease's delete held back", |v| {
        v["sources"][0]["held_back"] == serde_json::json!(["solo"])
    })
    .await;
    assert_eq!(listed(&server, "solo").await.len(), 1, "still listed while held back");
    wait_listed(&server, "solo", "the removal applied at protect_for", |l| l.is_empty()).await;
    let after = source_views(&server).await;
    assert_eq!(after["sources"][0]["reads"], held["sources"][0]["reads"], "applied without another listing");
    assert_eq!(after["sources"][0]["held_back"], serde_json::json!([]));
    assert_eq!(after["sources"][0]["up"], true);
}

#[tokio::test]
async fn after_a_compaction_and_a_restart_the_source_reads_the_prefix_again() {
    let mut etcd = Etcd::start().await;
    let driver = Endpoints::start(&etcd).await;
    for (key, port) in [("a", 9001), ("b", 9002), ("c", 9003)] {
        driver.add(&format!("svc/echo {key} 127.0.0.1:{port} 10")).await;
    }
    let spec = source(&etcd.url("svc/"), |t| {
        t.interval = Some("500ms".into());
        t.timeout = Some("2s".into());
    });
    let server = TestServer::start_with(|c| c.sources = vec![spec]).await;
    wait_listed(&server, "echo", "the three endpoints", |l| l.len() == 3).await;
    driver.ok("revoke b").await;
    wait_listed(&server, "echo", "b revoked", |l| l.len() == 2 && !l.contains_key("etcd:b")).await;
    let revision: i64 = driver.ok("rev").await.parse().expect("a revision");
    assert!(driver.ok(&format!("compact {revision}")).await.contains(&format!("rev={revision}")));

    // A watch from before the compaction is cancelled by this etcd the way the source reads it.
    let endpoint = Endpoint { host: "127.0.0.1".into(), port: etcd.port, path: String::new() };
    let create = format!(
        r#"{{"create_request":{{"key":"c3ZjLw==","range_end":"c3ZjMA==","start_revision":"{}"}}}}"#,
        revision - 1
    );
    let mut watch = rota::sources::http::post_stream(&endpoint, "/v3/watch", create, PATIENCE, 1 << 20).await.unwrap();
    let mut answers = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while let Some(line) = watch.next_line().await.unwrap() {
            let answer = parse_watch(&line, "svc/").unwrap();
            let ended = matches!(answer, WatchAnswer::Ended(_));
            answers.push(answer);
            if ended {
                return;
            }
        }
    })
    .await
    .expect("the watch is cancelled");
    let WatchAnswer::Ended(why) = answers.last().unwrap() else { panic!("{answers:?}") };
    assert!(why.contains(&format!("compacted to revision {revision}")), "{why}");
    drop(watch);

    // Changes while rota's watch is down, then a restart: the source reads the prefix whole.
    etcd.stop();
    wait_source_up(&server, false).await;
    etcd.start_again().await;
    driver.ok("revoke a").await;
    driver.add("svc/echo d 127.0.0.1:9004 10").await;
    wait_source_up(&server, true).await;
    let after = wait_listed(&server, "echo", "a gone and d added", |l| {
        l.keys().map(String::as_str).collect::<Vec<_>>() == ["etcd:c", "etcd:d"]
    })
    .await;
    assert_eq!(after["etcd:d"].0, "127.0.0.1:9004");
}

#[tokio::test]
async fn go_zero_keys_are_read_and_an_id_rota_refuses_is_refused_alone() {
    let etcd = Etcd::start().await;
    let driver = Endpoints::start(&etcd).await;
    let answer = driver.ok("gozero g1 echo.rpc 127.0.0.1:9101 10").await;
    let key = answer.split("key=").nth(1).unwrap().split(' ').next().unwrap().to_owned();
    let id = key.strip_prefix("echo.rpc/").expect("PREFIX/LEASEID").to_owned();
    assert_eq!(id, lease_of(&answer), "go-zero's id is its lease, in decimal");
    // Under the root, a grpc-go key `svc/echo/a` is service `svc`, id `echo/a`: not an id rota
    // takes. It is refused alone.
    driver.add("svc/echo a 127.0.0.1:9001 10").await;
    let spec = source(&etcd.url(""), |t| {
        t.interval = Some("500ms".into());
        t.timeout = Some("2s".into());
        t.protect_threshold = Some(1.0);
    });
    let server = TestServer::start_with(|c| c.sources = vec![spec]).await;
    let listing = wait_listed(&server, "echo.rpc", "the go-zero key", |l| l.len() == 1).await;
    assert_eq!(listing[&format!("etcd:{id}")], ("127.0.0.1:9101".into(), UP, 100));
    let whole = instances(&server, "echo.rpc").await;
    assert_eq!(whole[&format!("etcd:{id}")].metadata.get("etcd.lease"), Some(&id));
    let views = source_views(&server).await;
    assert_eq!(views["sources"][0]["refused"], 1, "{views}");
    assert!(listed(&server, "svc").await.is_empty());

    // Revoked: its key is deleted, and the instance leaves.
    driver.ok("revoke g1").await;
    wait_listed(&server, "echo.rpc", "the go-zero key revoked", |l| l.is_empty()).await;
}
