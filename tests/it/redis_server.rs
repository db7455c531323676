//! Real `redis-server` (and `redis-sentinel`) processes on free loopback ports, for the tests of
//! the shared state. `scripts/test.sh` installs Debian's packages when they are missing.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::harness::PATIENCE;

/// One Redis process; killed when dropped.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    dir: PathBuf,
    args: Vec<String>,
    binary: &'static str,
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("a free loopback port").local_addr().unwrap().port()
}

fn scratch_dir(name: &str, port: u16) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("rota-redis-{}-{name}-{port}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

impl RedisServer {
    /// A Redis server without persistence, on a free loopback port, answering `PING`.
    pub async fn start() -> Self {
        Self::start_with(&[]).await
    }

    /// A server with extra `redis-server` arguments (e.g. `--replicaof`).
    pub async fn start_with(extra: &[&str]) -> Self {
        let port = free_port();
        let dir = scratch_dir("server", port);
        let mut args: Vec<String> =
            ["--bind", "127.0.0.1", "--port", &port.to_string(), "--save", "", "--appendonly", "no"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        args.extend(["--dir".into(), dir.display().to_string()]);
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut server = Self { port, child: None, dir, args, binary: "redis-server" };
        server.spawn().await;
        server
    }

    /// A sentinel on a free loopback port watching the primary at `primary_port` as `master`,
    /// deciding alone (quorum 1) and quickly (1 s to call it down).
    pub async fn sentinel(master: &str, primary_port: u16) -> Self {
        let port = free_port();
        let dir = scratch_dir("sentinel", port);
        let config = dir.join("sentinel.conf");
        std::fs::write(
            &config,
            format!(
                "bind 127.0.0.1\nport {port}\ndir {}\nsentinel monitor {master} 127.0.0.1 {primary_port} 1\n\
                 sentinel down-after-milliseconds {master} 1000\nsentinel failover-timeout {master} 5000\n\
                 sentinel parallel-syncs {master} 1\n",
                dir.display()
            ),
        )
        .expect("sentinel config");
        let mut sentinel =
            Self { port, child: None, dir, args: vec![config.display().to_string()], binary: "redis-sentinel" };
        sentinel.spawn().await;
        sentinel
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    async fn spawn(&mut self) {
        let child = Command::new(self.binary)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {} (scripts/test.sh installs it): {e}", self.binary));
        self.child = Some(child);
        tokio::time::timeout(PATIENCE, async {
            loop {
                if self.query::<String>(&["PING"]).await.is_ok() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{} on port {} did not answer PING", self.binary, self.port));
    }

    /// Kills the process (SIGKILL): its data is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the process (SIGSTOP) without killing it, as a frozen host would: it answers
    /// nothing and copies nothing until [`RedisServer::resume`].
    pub fn freeze(&self) {
        self.signal(libc::SIGSTOP);
    }

    /// Lets a frozen process go on (SIGCONT).
    pub fn resume(&self) {
        self.signal(libc::SIGCONT);
    }

    fn signal(&self, signal: libc::c_int) {
        let child = self.child.as_ref().expect("the process runs");
        let pid = libc::pid_t::try_from(child.id()).expect("a pid");
        // SAFETY: kill(2) with the pid of a child this harness started and has not reaped.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0, "signal {signal} to {}", self.binary);
    }

    /// Starts the process again on the same port (empty: nothing is persisted).
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }

    /// Runs one command on a fresh connection.
    pub async fn query<T: redis::FromRedisValue>(&self, args: &[&str]) -> redis::RedisResult<T> {
        let client = redis::Client::open(self.url())?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        let mut command = redis::cmd(args[0]);
        for arg in &args[1..] {
            command.arg(*arg);
        }
        command.query_async(&mut conn).await
    }

    /// How many times commands named `name` (lower case, e.g. `evalsha`) ran.
    pub async fn calls(&self, name: &str) -> u64 {
        let info: String = self.query(&["INFO", "commandstats"]).await.expect("INFO");
        let prefix = format!("cmdstat_{name}:calls=");
        info.lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Redis Cluster of `redis-server` processes on free loopback ports, every slot assigned
/// (primaries only), answering `cluster_state:ok` on every node. Killed when dropped.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub async fn start(size: usize) -> Self {
        Self::start_with(size, 0, 5000).await
    }

    /// `primaries` primaries, each with `replicas` replicas, which take over a primary that
    /// has not answered for `node_timeout_ms`.
    pub async fn start_with(primaries: usize, replicas: usize, node_timeout_ms: u64) -> Self {
        let size = primaries * (1 + replicas);
        let mut nodes = Vec::with_capacity(size);
        let timeout = node_timeout_ms.to_string();
        for _ in 0..size {
            let flags =
                ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-node-timeout", &timeout];
            nodes.push(RedisServer::start_with(&flags).await);
        }
        let replicas = replicas.to_string();
        let addrs: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        let create = addrs.clone();
        let status = tokio::task::spawn_blocking(move || {
            Command::new("redis-cli")
                .args(["--cluster", "create"])
                .args(&create)
                .args(["--cluster-replicas", &replicas, "--cluster-yes"])
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .status()
        })
        .await
        .expect("redis-cli ran")
        .expect("redis-cli starts (it comes with redis-server)");
        assert!(status.success(), "redis-cli --cluster create failed: {status}");
        let cluster = Self { nodes };
        tokio::time::timeout(PATIENCE, async {
            for node in &cluster.nodes {
                loop {
                    let info: String = node.query(&["CLUSTER", "INFO"]).await.unwrap_or_default();
                    if info.contains("cluster_state:ok") {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        })
        .await
        .expect("every node of the cluster reports cluster_state:ok");
        cluster
    }

    pub fn url(&self) -> String {
        let addrs: Vec<String> = self.nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
        format!("redis+cluster://{}", addrs.join(","))
    }

    /// The positions in `nodes` of the primary serving `key`'s slot and of its replica. Waits
    /// (bounded) until the node asked knows the replica: `cluster_state:ok` comes before every
    /// node has heard, by gossip, which primary each replica follows.
    pub async fn primary_and_replica_of(&self, key: &str) -> (usize, usize) {
        let started = tokio::time::Instant::now();
        loop {
            if let Some(found) = self.try_primary_and_replica_of(key).await {
                return found;
            }
            assert!(started.elapsed() < PATIENCE, "no node knew a replica of {key}'s primary in time");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn try_primary_and_replica_of(&self, key: &str) -> Option<(usize, usize)> {
        let any = &self.nodes[0];
        let slot: u64 = any.query(&["CLUSTER", "KEYSLOT", key]).await.expect("CLUSTER KEYSLOT");
        let nodes: String = any.query(&["CLUSTER", "NODES"]).await.expect("CLUSTER NODES");
        // `ID HOST:PORT@BUS FLAGS PRIMARY_ID ... SLOT_RANGES...`, one node per line.
        let lines: Vec<Vec<&str>> = nodes.lines().map(|l| l.split_whitespace().collect()).collect();
        let serves = |fields: &Vec<&str>| {
            fields.iter().skip(8).any(|range| match range.split_once('-') {
                Some((from, to)) => (from.parse().unwrap_or(u64::MAX)..=to.parse().unwrap_or(0)).contains(&slot),
                None => range.parse() == Ok(slot),
            })
        };
        let primary = lines.iter().find(|f| f.len() > 3 && f[2].contains("master") && serves(f))?;
        let replica = lines.iter().find(|f| f.len() > 3 && f[3] == primary[0])?;
        let position = |fields: &Vec<&str>| {
            let port: u16 = fields[1].split(['@', ':']).nth(1).and_then(|p| p.parse().ok()).expect("HOST:PORT@BUS");
            self.nodes.iter().position(|n| n.port == port).expect("a node of this cluster")
        };
        Some((position(primary), position(replica)))
    }
}

/// A TCP proxy on a free loopback port in front of `127.0.0.1:target`, holding every chunk of
/// bytes for `delay` in each direction (so a round trip through it costs at least twice
/// that), as a distant or overloaded Redis would. Its accept task ends when it is dropped.
pub struct LatencyProxy {
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl LatencyProxy {
    pub async fn start(target: u16, delay: Duration) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a free loopback port");
        let port = listener.local_addr().unwrap().port();
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let Ok(outbound) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await else { continue };
                let _ = (inbound.set_nodelay(true), outbound.set_nodelay(true));
                let (from_client, to_client) = inbound.into_split();
                let (from_server, to_server) = outbound.into_split();
                tokio::spawn(delayed_copy(from_client, to_server, delay));
                tokio::spawn(delayed_copy(from_server, to_client, delay));
            }
        });
        Self { port, task }
    }
}

impl Drop for LatencyProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies `from` to `to`, each chunk written `delay` after it was read, in order.
async fn delayed_copy(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Duration,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (chunks, mut due) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let writer = tokio::spawn(async move {
        while let Some((at, bytes)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0u8; 64 << 10];
    while let Ok(n) = from.read(&mut buf).await {
        if n == 0 || chunks.send((tokio::time::Instant::now() + delay, buf[..n].to_vec())).is_err() {
            break;
        }
    }
    drop(chunks);
    let _ = writer.await;
}
