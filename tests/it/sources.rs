//! Registries rota follows (`crate::sources`), each a real server started here on loopback:
//! Debian's `dnsmasq` for DNS names and a Spring Boot Eureka server for Eureka.
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

fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0").expect("a free loopback port").local_addr().unwrap().port()
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
        dns.spawn().await;
        dns
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

    async fn spawn(&mut self) {
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
        tokio::time::timeout(PATIENCE, async {
            loop {
                let _ = socket.send(&query).await;
                let mut buf = [0u8; 512];
                if let Ok(Ok(_)) = tokio::time::timeout(Duration::from_millis(100), socket.recv(&mut buf)).await {
                    return;
                }
            }
        })
        .await
        .expect("dnsmasq answers");
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
        self.spawn().await;
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
    let mut last = serde_json::Value::Null;
    let waited = tokio::time::timeout(PATIENCE * 3, async {
        loop {
            last = source_views(server).await;
            if last["sources"][0]["up"] == up {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(waited.is_ok(), "the source did not turn up={up}: {last}");
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
    let held = tokio::time::timeout(PATIENCE, async {
        loop {
            let views = source_views(&server).await;
            if views["sources"][0]["held_back"] == serde_json::json!(["api"]) {
                return views;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the removal is held back");
    assert_eq!(held["sources"][0]["instances"], 2);
    assert_eq!(listed(&server, "api").await.len(), 2);
    // …and applied once protect_for has passed with the name still gone.
    wait_listed(&server, "api", "the removal applied after protect_for", |l| l.is_empty()).await;
}
