//! Registries rota follows (`crate::sources`), each a real server started here on loopback:
//! Debian's `dnsmasq` for DNS names, a Spring Boot Eureka server for Eureka, and Debian's
//! etcd (`sources/etcd.rs`) for etcd.
//! `scripts/test.sh` installs and builds them.

use std::collections::BTreeMap;
use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rota::pb;
use rota::sources::SourceSpec;
use rota::sources::spec::SourceTable;

use crate::harness::{PATIENCE, TestServer};

/// A loopback port free for both UDP and TCP (dnsmasq binds both, and exits when it cannot).
fn free_udp_port() -> u16 {
    loop {
        let tcp = std::net::TcpListener::bind("127.0.0.1:0").expect("a free loopback port");
        let port = tcp.local_addr().unwrap().port();
        if UdpSocket::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rota-{name}-{}-{}", std::process::id(), fastrand::u32(..)));
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

/// dnsmasq on a free loopback port, answering from files this test writes: SRV records from
/// its config (read at start: [`Dnsmasq::restart`] to change them) and addresses from a
/// hosts directory it watches (changed live by [`Dnsmasq::hosts`]).
pub struct Dnsmasq {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Dnsmasq {
    /// `config`: dnsmasq config lines (`srv-host=…`, `local=/…/`); `hosts`: hosts-file lines.
    pub async fn start(config: &str, hosts: &str) -> Self {
        let dir = scratch("dnsmasq");
        std::fs::create_dir_all(dir.join("hosts.d")).unwrap();
        let mut dns = Self { port: free_udp_port(), dir, child: None };
        dns.write(config, hosts);
        // Another process may take the port between its check and dnsmasq's bind: then dnsmasq
        // exits, and it is started again on another port.
        for _ in 0..5 {
            if dns.spawn().await {
                return dns;
            }
            dns.port = free_udp_port();
        }
        panic!("dnsmasq did not start on any of five loopback ports");
    }

    fn write(&self, config: &str, hosts: &str) {
        std::fs::write(self.dir.join("dnsmasq.conf"), config).unwrap();
        self.hosts(hosts);
    }

    /// Replaces the addresses dnsmasq serves, at once (it watches the directory).
    pub fn hosts(&self, hosts: &str) {
        let staged = self.dir.join("hosts.d").join(".hosts.tmp");
        std::fs::write(&staged, hosts).unwrap();
        std::fs::rename(&staged, self.dir.join("hosts.d").join("hosts")).unwrap();
    }

    pub fn resolver(&self) -> SocketAddr {
        ([127, 0, 0, 1], self.port).into()
    }

    /// Starts dnsmasq and waits until it answers; false when it exited instead (its port taken).
    async fn spawn(&mut self) -> bool {
        let user = String::from_utf8(Command::new("id").arg("-un").output().unwrap().stdout).unwrap();
        let dir = |name: &str| self.dir.join(name).display().to_string();
        let child = Command::new(dnsmasq_binary())
            .args([
                "--keep-in-foreground",
                &format!("--user={}", user.trim()),
                &format!("--port={}", self.port),
                "--listen-address=127.0.0.1",
                "--bind-interfaces",
                "--no-resolv",
                "--no-hosts",
                &format!("--conf-file={}", dir("dnsmasq.conf")),
                &format!("--hostsdir={}", dir("hosts.d")),
                &format!("--pid-file={}", dir("dnsmasq.pid")),
                "--local-ttl=1",
                "--log-facility=/dev/null",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start dnsmasq (scripts/install-dnsmasq.sh installs it): {e}"));
        self.child = Some(child);
        // Ready once it answers anything on its port.
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        socket.connect(self.resolver()).await.unwrap();
        let query = rota::sources::dns::wire::query(1, "ready.test", rota::sources::dns::wire::TYPE_A).unwrap();
        let child = self.child.as_mut().expect("just started");
        let answered = tokio::time::timeout(PATIENCE, async {
            loop {
                if let Ok(Some(_)) = child.try_wait() {
                    return false;
                }
                let _ = socket.send(&query).await;
                let mut buf = [0u8; 512];
                if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(100), socket.recv(&mut buf)).await {
                    return true;
                }
            }
        })
        .await
        .expect("dnsmasq answers or exits");
        if !answered {
            self.child = None;
        }
        answered
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port with new records.
    pub async fn restart(&mut self, config: &str, hosts: &str) {
        self.stop();
        self.write(config, hosts);
        for _ in 0..5 {
            if self.spawn().await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("dnsmasq did not start again on port {}", self.port);
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn dnsmasq_binary() -> &'static str {
    if Path::new("/usr/sbin/dnsmasq").exists() { "/usr/sbin/dnsmasq" } else { "dnsmasq" }
}

pub fn source(url: &str, extra: impl FnOnce(&mut SourceTable)) -> SourceSpec {
    let mut table = SourceTable { url: url.into(), ..Default::default() };
    extra(&mut table);
    table.check().expect("a valid source")
}

/// The instances of `service` as rota lists them: id → (address, status, weight).
pub async fn listed(server: &TestServer, service: &str) -> BTreeMap<String, (String, i32, u32)> {
    let mut client = server.client().await;
    match client.list_instances(service).await {
        Ok(list) => list
            .instances
            .into_iter()
            .map(|i| (i.id.clone(), (format!("{}:{}", i.host, i.port), i.status, i.weight.unwrap_or(0))))
            .collect(),
        Err(_) => BTreeMap::new(),
    }
}

/// Waits until `check` holds of the listing of `service`.
pub async fn wait_listed(
    server: &TestServer,
    service: &str,
    what: &str,
    check: impl Fn(&BTreeMap<String, (String, i32, u32)>) -> bool,
) -> BTreeMap<String, (String, i32, u32)> {
    let mut last = BTreeMap::new();
    let waited = tokio::time::timeout(PATIENCE * 3, async {
        loop {
            last = listed(server, service).await;
            if check(&last) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "{what}: the listing stayed {last:?}");
    last
}

/// The admin API's view of the sources.
pub async fn source_views(server: &TestServer) -> serde_json::Value {
    let addr = server.server.admin_addr().expect("admin listener");
    let (status, body) = crate::admin::get(addr, "/api/sources").await;
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("JSON")
}

pub async fn wait_source_up(server: &TestServer, up: bool) -> serde_json::Value {
    wait_source_views(server, &format!("the source to turn up={up}"), |v| v["sources"][0]["up"] == up).await
}

/// Polls the admin API's view of the sources until `check` holds, and returns it.
pub async fn wait_source_views(
    server: &TestServer,
    what: &str,
    check: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let mut last = serde_json::Value::Null;
    let waited = tokio::time::timeout(PATIENCE * 3, async {
        loop {
            last = source_views(server).await;
            if check(&last) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "waited for {what}: {last}");
    last
}

const UP: i32 = pb::InstanceStatus::Up as i32;
const DOWN: i32 = pb::InstanceStatus::Down as i32;

const SRV: &str = "local=/orders.test/\n\
    srv-host=_grpc._tcp.orders.test,a.orders.test,9001,0,10\n\
    srv-host=_grpc._tcp.orders.test,b.orders.test,9002,0,30\n\
    srv-host=_grpc._tcp.orders.test,backup.orders.test,9003,5,10\n";
const HOSTS: &str = "127.0.0.1 a.orders.test\n127.0.0.2 b.orders.test\n127.0.0.9 backup.orders.test\n";

#[tokio::test]
async fn a_dns_srv_name_is_followed_through_address_and_record_changes_and_a_dead_resolver() {
    let mut dns = Dnsmasq::start(SRV, HOSTS).await;
    let spec = source("dns+srv://_grpc._tcp.orders.test", |t| {
        t.services = Some(vec!["orders".into()]);
        t.resolver = Some(dns.resolver().to_string());
        t.min_interval = Some("100ms".into());
        t.interval = Some("1s".into());
        t.timeout = Some("500ms".into());
    });
    let server = TestServer::start_with(|c| c.sources = vec![spec]).await;

    let first = wait_listed(&server, "orders", "the SRV records", |l| l.len() == 3).await;
    assert_eq!(first["dns:127.0.0.1:9001"], ("127.0.0.1:9001".into(), UP, 10));
    assert_eq!(first["dns:127.0.0.2:9002"], ("127.0.0.2:9002".into(), UP, 30));
    assert_eq!(first["dns:127.0.0.9:9003"].1, DOWN, "a higher priority is a backup: listed, not picked");
    let mut client = server.client().await;
    for _ in 0..8 {
        let pick = client.pick("orders", rota::client::PickOptions::rule("round_robin")).await.expect("pick");
        assert_ne!(crate::harness::picked_id(&pick), "dns:127.0.0.9:9003");
    }

    // A target's address changes live: the old address leaves, the new one arrives.
    dns.hosts("127.0.0.1 a.orders.test\n127.0.0.3 b.orders.test\n127.0.0.9 backup.orders.test\n");
    wait_listed(&server, "orders", "b's new address", |l| {
        l.contains_key("dns:127.0.0.3:9002") && !l.contains_key("dns:127.0.0.2:9002")
    })
    .await;

    // The SRV set changes (dnsmasq restarted with the backup gone).
    let fewer = "local=/orders.test/\n\
        srv-host=_grpc._tcp.orders.test,a.orders.test,9001,0,10\n\
        srv-host=_grpc._tcp.orders.test,b.orders.test,9002,0,30\n";
    dns.restart(fewer, "127.0.0.1 a.orders.test\n127.0.0.3 b.orders.test\n").await;
    wait_listed(&server, "orders", "the backup gone", |l| l.len() == 2 && !l.contains_key("dns:127.0.0.9:9003")).await;

    // The resolver dies: the source goes stale, the instances stay and picks go on.
    dns.stop();
    let stale = wait_source_up(&server, false).await;
    let error = stale["sources"][0]["last_error"].as_str().unwrap();
    assert!(error.contains(&format!("asking {}", dns.resolver())) || error.contains("no answer"), "{stale}");
    assert_eq!(listed(&server, "orders").await.len(), 2);
    client.pick("orders", rota::client::PickOptions::rule("round_robin")).await.expect("a pick from the last listing");
    let metrics = crate::harness::metrics(&server).await;
    assert!(metrics.contains("rota_source_up{source=\"dns\",kind=\"dns\"} 0"), "{metrics}");
    let addr = server.server.admin_addr().unwrap();
    let (_, ready) = crate::admin::get(addr, "/readyz").await;
    assert!(ready.contains("sources stale") && ready.contains("dns"), "{ready}");
    // A listing names each instance's source and says the source is stale; so does `rota ls`.
    let listing = client.list_instances("orders").await.unwrap();
    assert!(listing.instances.iter().all(|i| i.source == "dns"), "{listing:?}");
    assert_eq!(listing.sources.len(), 1, "{listing:?}");
    assert_eq!((listing.sources[0].name.as_str(), listing.sources[0].up), ("dns", false));
    assert!(listing.sources[0].last_read_unix_seconds > 0, "{listing:?}");
    let endpoint = server.server.endpoint();
    let ls = tokio::task::spawn_blocking(move || {
        std::process::Command::new(crate::processes::BIN)
            .args(["ls", "orders"])
            .env("ROTA_SERVER", endpoint)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let out = String::from_utf8_lossy(&ls.stdout);
    assert!(out.lines().nth(1).is_some_and(|row| row.contains(" dns ")), "{out}");
    assert!(out.contains("source dns: STALE (last read "), "{out}");

    // It comes back, and so does the source.
    dns.restart(fewer, "127.0.0.1 a.orders.test\n127.0.0.3 b.orders.test\n").await;
    wait_source_up(&server, true).await;
}

#[tokio::test]
async fn a_dns_name_with_a_port_follows_its_addresses_and_one_that_vanishes_is_held_back() {
    let config = "local=/orders.test/\n";
    let dns = Dnsmasq::start(config, "127.0.0.1 api.orders.test\n127.0.0.2 api.orders.test\n").await;
    let spec = source("dns://api.orders.test:7000", |t| {
        t.services = Some(vec!["api".into()]);
        t.resolver = Some(dns.resolver().to_string());
        t.min_interval = Some("100ms".into());
        t.interval = Some("1s".into());
        t.protect_for = Some("2s".into());
    });
    let server = TestServer::start_with(|c| c.sources = vec![spec]).await;
    let both = wait_listed(&server, "api", "both addresses", |l| l.len() == 2).await;
    assert_eq!(both.keys().collect::<Vec<_>>(), ["dns:127.0.0.1:7000", "dns:127.0.0.2:7000"]);

    // The name vanishes (NXDOMAIN): that is every instance at once, held back…
    dns.hosts("");
    let held = wait_source_views(&server, "the removal held back", |v| {
        v["sources"][0]["held_back"] == serde_json::json!(["api"])
    })
    .await;
    assert_eq!(held["sources"][0]["instances"], 2);
    assert_eq!(listed(&server, "api").await.len(), 2);
    // …and applied once protect_for has passed with the name still gone.
    wait_listed(&server, "api", "the removal applied after protect_for", |l| l.is_empty()).await;
}

/// A Java process of the Eureka fixture (tests/sources/eureka); killed when dropped.
struct Jvm {
    child: Option<Child>,
    args: Vec<String>,
}

fn fixture_jar(variable: &str, file: &str) -> String {
    std::env::var(variable).unwrap_or_else(|_| format!("{}/target/eureka/{file}", env!("CARGO_MANIFEST_DIR")))
}

impl Jvm {
    fn spawn(jar: &str, args: Vec<String>) -> Self {
        assert!(Path::new(jar).exists(), "{jar} is missing: scripts/build-eureka.sh builds it");
        let mut jvm = Self { child: None, args: [jar.to_owned()].into_iter().chain(args).collect() };
        jvm.start();
        jvm
    }

    fn start(&mut self) {
        let child = Command::new("java")
            .args(["-XX:TieredStopAtLevel=1", "-Xshare:auto", "-Xms64m", "-Xmx256m", "-XX:+UseSerialGC", "-jar"])
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("java starts");
        self.child = Some(child);
    }

    /// SIGTERM, and waits for the process to end (Spring deregisters from Eureka on the way).
    fn terminate(&mut self) {
        if let Some(mut child) = self.child.take() {
            // SAFETY: a plain signal to a child this test started and has not reaped.
            unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
            let _ = child.wait();
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Jvm {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One HTTP/1.0 exchange with a loopback server: (status, body).
async fn http(addr: SocketAddr, method: &str, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request = format!(
            "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: application/json\r\nContent-Length: 0\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        let (head, body) = response.split_once("\r\n\r\n")?;
        Some((head.split(' ').nth(1)?.parse().ok()?, body.to_owned()))
    };
    tokio::time::timeout(Duration::from_secs(5), exchange).await.ok().flatten()
}

/// JVMs start slowly on two busy cores.
const JVM_PATIENCE: Duration = Duration::from_secs(120);

async fn wait_http(addr: SocketAddr, path: &str, what: &str, check: impl Fn(&str) -> bool) {
    let waited = tokio::time::timeout(JVM_PATIENCE, async {
        loop {
            if let Some((200, body)) = http(addr, "GET", path).await
                && check(&body)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "{what}: GET {path} on {addr} never answered as expected");
}

struct EurekaServer {
    addr: SocketAddr,
    jvm: Jvm,
}

impl EurekaServer {
    async fn start() -> Self {
        let port = crate::redis_server::free_port();
        let jvm = Jvm::spawn(
            &fixture_jar("ROTA_EUREKA_SERVER_JAR", "eureka-server.jar"),
            vec![format!("--server.port={port}")],
        );
        let server = Self { addr: ([127, 0, 0, 1], port).into(), jvm };
        server.ready().await;
        server
    }

    async fn ready(&self) {
        wait_http(self.addr, "/eureka/apps", "the Eureka server", |_| true).await;
    }

    fn url(&self) -> String {
        format!("eureka+http://{}/eureka", self.addr)
    }

    /// Waits until `app`'s instance `id` shows `status` (`None`: is gone).
    async fn wait_instance(&self, app: &str, id: &str, status: Option<&str>) {
        let path = format!("/eureka/apps/{}", app.to_ascii_uppercase());
        let status = status.map(|s| format!("\"status\":\"{s}\""));
        wait_http(self.addr, &path, "the app's registration", |body| {
            let section = body.split("\"instanceId\"").find(|part| part.contains(&format!("\"{id}\"")));
            match (&status, section) {
                (Some(status), Some(section)) => {
                    section.split("\"port\"").next().is_some_and(|head| head.contains(status))
                }
                _ => false,
            }
        })
        .await;
    }
}

/// A Spring Boot app with the Eureka client, unmodified: registers `name` at a free port.
struct EurekaApp {
    port: u16,
    jvm: Jvm,
}

impl EurekaApp {
    async fn start(eureka: &EurekaServer, name: &str, version: Option<&str>) -> Self {
        let port = crate::redis_server::free_port();
        let mut args = vec![
            format!("--server.port={port}"),
            format!("--eureka.client.service-url.defaultZone=http://{}/eureka/", eureka.addr),
            format!("--spring.application.name={name}"),
        ];
        if let Some(version) = version {
            args.push(format!("--eureka.instance.metadata-map.version={version}"));
        }
        let app = Self { port, jvm: Jvm::spawn(&fixture_jar("ROTA_EUREKA_APP_JAR", "eureka-app.jar"), args) };
        eureka.wait_instance(name, &app.instance_id(name), Some("UP")).await;
        app
    }

    fn instance_id(&self, name: &str) -> String {
        format!("127.0.0.1:{name}:{}", self.port)
    }
}

async fn pick(server: &TestServer, options: rota::client::PickOptions) -> pb::PickResponse {
    server.client().await.pick("demo", options).await.expect("pick").into_response()
}

#[tokio::test]
async fn a_spring_cloud_eureka_fleet_is_picked_with_version_isolation_through_stops_and_a_dead_server() {
    use rota::client::PickOptions;
    let mut eureka = EurekaServer::start().await;
    let plain = EurekaApp::start(&eureka, "demo", None).await;
    let mut zlt = EurekaApp::start(&eureka, "demo", Some("zlt")).await;
    let spec = source(&eureka.url(), |t| {
        t.services = Some(vec!["demo".into()]);
        t.interval = Some("500ms".into());
        t.timeout = Some("2s".into());
    });
    let server = TestServer::start_with(|c| c.sources = vec![spec]).await;
    let (plain_id, zlt_id) =
        (format!("eureka:{}", plain.instance_id("demo")), format!("eureka:{}", zlt.instance_id("demo")));
    let both = wait_listed(&server, "demo", "both apps", |l| l.len() == 2).await;
    assert_eq!(both[&plain_id], (format!("127.0.0.1:{}", plain.port), UP, 100));

    // Plain requests never reach the developer's `zlt` instance; `zlt` requests do. Each pick
    // is an address that answers.
    for _ in 0..6 {
        let picked = pick(&server, PickOptions::rule("round_robin")).await;
        let instance = picked.instance.expect("an instance");
        assert_eq!(instance.id, plain_id);
        let (status, body) =
            http(([127, 0, 0, 1], instance.port as u16).into(), "GET", "/").await.expect("the app answers");
        assert_eq!((status, body.as_str()), (200, "demo"));
        let picked = pick(&server, PickOptions::rule("round_robin").version("zlt")).await;
        assert_eq!((crate::harness::picked_id(&picked), picked.fallback.as_str()), (zlt_id.clone(), ""));
    }

    // OUT_OF_SERVICE, set through Eureka's own API, is DRAINING in rota; lifting it brings it back.
    let status_path = format!("/eureka/apps/DEMO/{}/status?value=OUT_OF_SERVICE", plain.instance_id("demo"));
    assert_eq!(http(eureka.addr, "PUT", &status_path).await.map(|a| a.0), Some(200));
    let draining = pb::InstanceStatus::Draining as i32;
    wait_listed(&server, "demo", "plain out of service", |l| l.get(&plain_id).is_some_and(|i| i.1 == draining)).await;
    let lift = format!("/eureka/apps/DEMO/{}/status?value=UP", plain.instance_id("demo"));
    assert_eq!(http(eureka.addr, "DELETE", &lift).await.map(|a| a.0), Some(200));
    wait_listed(&server, "demo", "plain back in service", |l| l.get(&plain_id).is_some_and(|i| i.1 == UP)).await;

    // The `zlt` app stopped cleanly leaves, and its requests fall back to the plain instances.
    zlt.jvm.terminate();
    wait_listed(&server, "demo", "zlt gone", |l| l.len() == 1 && l.contains_key(&plain_id)).await;
    let fell_back = pick(&server, PickOptions::rule("round_robin").version("zlt")).await;
    assert_eq!(crate::harness::picked_id(&fell_back), plain_id);
    assert_eq!(fell_back.fallback, "no instance with version \"zlt\"; picked from instances with no version");

    // The Eureka server dies: picks go on from the last listing, and the source is stale…
    eureka.jvm.kill();
    let stale = wait_source_up(&server, false).await;
    assert!(stale["sources"][0]["last_error"].as_str().unwrap().contains("cannot connect"), "{stale}");
    assert_eq!(crate::harness::picked_id(&pick(&server, PickOptions::rule("round_robin")).await), plain_id);
    // …until it is back. It restarts empty and the app registers again at its next renewal; an
    // empty listing read in between would remove every instance at once, so it is held back.
    eureka.jvm.start();
    eureka.ready().await;
    eureka.wait_instance("demo", &plain.instance_id("demo"), Some("UP")).await;
    wait_source_up(&server, true).await;
    // The source's read that sees the registration may come a read interval after it: until
    // then an empty listing read just before it is still held back.
    wait_source_views(&server, "no listing held back", |v| v["sources"][0]["held_back"] == serde_json::json!([])).await;
    let back = wait_listed(&server, "demo", "after the restart", |l| l.len() == 1 && l.contains_key(&plain_id)).await;
    assert_eq!(back[&plain_id].1, UP);
}

/// A Eureka server of the test's own on loopback, answering the same listing to a full read
/// and as a delta (a delta repeats the changes of the last minutes, so this is one a real
/// server may send).
async fn fake_eureka(body: String) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let delta = body.clone();
    let app = axum::Router::new()
        .route("/eureka/apps/", axum::routing::get(move || async move { body.clone() }))
        .route("/eureka/apps/delta", axum::routing::get(move || async move { delta.clone() }));
    (addr, tokio::spawn(async move { axum::serve(listener, app).await.unwrap() }))
}

/// A Eureka source keeps the instances of the services it covers up to `max_instances`, and
/// reports the rest as refused; the applications it does not cover are neither listed nor
/// refused, and the reads go on as deltas that match the server's hash code.
#[tokio::test]
async fn a_eureka_source_reports_the_instances_it_leaves_out_past_max_instances() {
    let instance = |app: &str, i: u16| {
        format!(
            r#"{{"instanceId":"{app}-{i}","hostName":"127.0.0.1","app":"{app}","status":"UP","port":{{"$":{},"@enabled":"true"}},"actionType":"ADDED"}}"#,
            9000 + i
        )
    };
    let demo: Vec<String> = (0..5).map(|i| instance("DEMO", i)).collect();
    let other: Vec<String> = (0..3).map(|i| instance("OTHER", i)).collect();
    let body = format!(
        r#"{{"applications":{{"apps__hashcode":"UP_8_","application":[{{"name":"DEMO","instance":[{}]}},{{"name":"OTHER","instance":[{}]}}]}}}}"#,
        demo.join(","),
        other.join(",")
    );
    let (addr, fake) = fake_eureka(body).await;
    let spec = source(&format!("eureka+http://{addr}/eureka"), |t| {
        t.services = Some(vec!["demo".into()]);
        t.max_instances = Some(2);
        t.interval = Some("100ms".into());
    });
    let server = TestServer::start_with(|c| c.sources = vec![spec]).await;
    let views = wait_source_views(&server, "three reads", |v| v["sources"][0]["reads"].as_u64() >= Some(3)).await;
    let view = &views["sources"][0];
    assert_eq!(
        (view["up"].clone(), view["instances"].clone(), view["refused"].clone()),
        (true.into(), 2.into(), 3.into()),
        "{views}"
    );
    assert_eq!(listed(&server, "demo").await.len(), 2);
    assert!(listed(&server, "other").await.is_empty());
    fake.abort();
}

#[tokio::test]
async fn every_replica_follows_a_source_itself_and_none_writes_its_instances_to_the_shared_table() {
    let redis = crate::redis_server::RedisServer::start().await;
    let dns = Dnsmasq::start("local=/orders.test/\n", "127.0.0.1 api.orders.test\n127.0.0.2 api.orders.test\n").await;
    let spec = source("dns://api.orders.test:7000", |t| {
        t.services = Some(vec!["api".into()]);
        t.resolver = Some(dns.resolver().to_string());
        t.min_interval = Some("100ms".into());
        t.interval = Some("1s".into());
    });
    let mut replicas = Vec::new();
    for _ in 0..2 {
        let state = rota::state::StateConfig::parse(&redis.url(), 1, Duration::from_secs(5)).unwrap();
        let spec = spec.clone();
        replicas.push(
            TestServer::start_with(|c| {
                c.state = state;
                c.sources = vec![spec];
            })
            .await,
        );
    }
    for replica in &replicas {
        wait_listed(replica, "api", "both addresses on each replica", |l| l.len() == 2).await;
    }
    // A provider's own stream on one replica is shared as usual (and shows where the table is).
    let _held = replicas[0].register(vec![crate::harness::instance("api", "own", 9)]).await;
    wait_listed(&replicas[1], "api", "the stream's instance copied over", |l| l.contains_key("own")).await;
    let keys: Vec<String> = redis.query(&["KEYS", "rota:{api}:instances:*"]).await.unwrap();
    assert_eq!(keys.len(), 1, "one replica's stream, no source: {keys:?}");
    let fields: Vec<String> = redis.query(&["HKEYS", &keys[0]]).await.unwrap();
    assert!(
        fields.iter().all(|f| !f.starts_with("dns:")),
        "a source's instances stay out of the shared table: {fields:?}"
    );
    // Each replica's copy follows the source on its own: a change reaches both.
    dns.hosts("127.0.0.1 api.orders.test\n127.0.0.3 api.orders.test\n");
    for replica in &replicas {
        wait_listed(replica, "api", "the new address on each replica", |l| l.contains_key("dns:127.0.0.3:7000")).await;
    }
    // And no stream, on either replica, may take an id in the source's namespace.
    let mut client = replicas[1].client().await;
    let refused = client.register(vec![crate::harness::instance("api", "dns:127.0.0.1:7000", 7000)]).await.unwrap();
    let message = refused.require_all_accepted().unwrap_err().to_string();
    assert!(message.contains("kept for the instances of source \"dns\""), "{message}");
}

mod etcd;
