//! The connection to Redis, and whether it answers.
//!
//! One multiplexed connection carries every command of a replica (commands are pipelined on
//! it, not one connection per request); on a Redis Cluster, one cluster connection (a
//! multiplexed connection per node, each command routed by its key's hash slot). A keeper task
//! checks it every [`CHECK_INTERVAL`] with a `PING`, reconnects when it fails, and — under
//! Sentinel — asks the sentinels for the current primary on each check, so a failover is
//! followed without a restart. The link is *up* while
//! the last command or check succeeded; callers skip Redis entirely while it is down and answer
//! from local state, so an outage costs a pick nothing after the first failure.

use std::sync::Arc;
use std::sync::Weak;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use futures_util::future::try_join_all;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionInfo, FromRedisValue, IntoConnectionInfo, Pipeline, RedisError,
    RedisFuture, Value,
};
use tokio::sync::{Notify, watch};

use super::target::Target;

/// Time between checks of the link (and, under Sentinel, of which server is the primary).
pub const CHECK_INTERVAL: Duration = Duration::from_millis(500);
/// Default longest wait for one command's answer before the link counts as down
/// (`server.state_timeout`).
pub const COMMAND_TIMEOUT: Duration = Duration::from_millis(500);
/// Longest wait to open a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Times a Cluster command is sent again after a redirection or a failed node.
const CLUSTER_RETRIES: u32 = 2;

pub struct Link {
    target: Target,
    /// Longest wait for one command's answer.
    timeout: Duration,
    conn: ArcSwapOption<Connected>,
    up: AtomicBool,
    /// The outage was logged (one line per outage, not per failed command).
    logged_down: AtomicBool,
    /// Times the link went from down to up: a replica re-publishes what it holds after each.
    recoveries: AtomicU64,
    /// Wakes the keeper early after a failed command.
    failed: Arc<Notify>,
    /// Follows `up`, for whoever waits on a change.
    changes: watch::Sender<bool>,
}

/// An open connection and the address it reached.
struct Connected {
    conn: Conn,
    addr: String,
}

/// A connection to one server, or to a Cluster. A pipeline sent on it must keep to one hash
/// slot (a Cluster node refuses others): [`Link::sequence`] and [`Link::together`] send several.
#[derive(Clone)]
pub enum Conn {
    One(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::One(conn) => conn.req_packed_command(cmd),
            Conn::Cluster(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::One(conn) => conn.req_packed_commands(pipeline, offset, count),
            Conn::Cluster(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::One(conn) => conn.get_db(),
            Conn::Cluster(conn) => conn.get_db(),
        }
    }
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link").field("target", &self.target).field("up", &self.is_up()).finish()
    }
}

impl Link {
    /// A link to `target`, with its keeper running on the current runtime. It starts down and
    /// comes up at the keeper's first successful check (which runs at once).
    pub fn spawn(target: Target, timeout: Duration) -> Arc<Self> {
        let link = Arc::new(Self {
            target,
            timeout,
            conn: ArcSwapOption::empty(),
            up: AtomicBool::new(false),
            logged_down: AtomicBool::new(false),
            recoveries: AtomicU64::new(0),
            failed: Arc::new(Notify::new()),
            changes: watch::Sender::new(false),
        });
        tokio::spawn(keep(Arc::downgrade(&link), link.failed.clone()));
        link
    }

    pub fn is_up(&self) -> bool {
        self.up.load(Ordering::Acquire)
    }

    /// Sees every change of [`Link::is_up`].
    pub fn watch(&self) -> watch::Receiver<bool> {
        self.changes.subscribe()
    }

    /// How many times the link has come up (the first connection counts).
    pub fn recoveries(&self) -> u64 {
        self.recoveries.load(Ordering::Acquire)
    }

    pub fn target(&self) -> &Target {
        &self.target
    }

    /// The connection, while the link is up.
    pub fn connection(&self) -> Option<Conn> {
        if !self.is_up() {
            return None;
        }
        self.conn.load().as_ref().map(|c| c.conn.clone())
    }

    /// Runs one command (or pipeline) on the link; any failure or a late answer marks the link
    /// down. `None` when the link is down or the command failed: the caller answers locally.
    pub async fn run<T, F>(&self, command: impl FnOnce(Conn) -> F) -> Option<T>
    where
        F: Future<Output = Result<T, RedisError>>,
    {
        let conn = self.connection()?;
        match tokio::time::timeout(self.timeout, command(conn)).await {
            Ok(Ok(value)) => Some(value),
            Ok(Err(error)) => {
                self.down(&format!("command failed: {error}"));
                None
            }
            Err(_) => {
                self.down(&format!("no answer within {:?}", self.timeout));
                None
            }
        }
    }

    /// Runs `groups` one after the other (each sent once the previous one answered), ignoring
    /// their answers; false when the link is down or a group failed. The commands of one group
    /// share one hash slot. Each group is one round trip with the command timeout to itself,
    /// so a sequence of several never times out on a Redis that answers each within it.
    pub async fn sequence(&self, groups: Vec<Pipeline>) -> bool {
        for group in &groups {
            if self.run(|mut conn| async move { group.query_async::<()>(&mut conn).await }).await.is_none() {
                return false;
            }
        }
        true
    }

    /// Runs `groups` at once (the commands of one group share one hash slot) and returns the
    /// answers of their commands not ignored, in order; `None` when the link is down or a group
    /// failed.
    pub async fn together<T: FromRedisValue + Send>(&self, groups: Vec<Pipeline>) -> Option<Vec<T>> {
        self.run(|conn| async move {
            let answers = try_join_all(groups.iter().map(|group| {
                let mut conn = conn.clone();
                async move { group.query_async::<Vec<T>>(&mut conn).await }
            }))
            .await?;
            Ok(answers.into_iter().flatten().collect())
        })
        .await
    }

    /// A command failed: the link is down and the keeper checks it at once.
    fn down(&self, why: &str) {
        self.mark_down(why);
        self.failed.notify_one();
    }

    fn mark_down(&self, why: &str) {
        self.up.store(false, Ordering::Release);
        self.changes.send_if_modified(|up| std::mem::replace(up, false));
        if !self.logged_down.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                target = %self.target,
                "state backend unreachable ({why}); answering picks from local state until it returns"
            );
        }
    }

    fn came_up(&self) {
        if !self.up.swap(true, Ordering::AcqRel) {
            self.recoveries.fetch_add(1, Ordering::AcqRel);
            self.logged_down.store(false, Ordering::Release);
            tracing::info!(target = %self.target, "state backend up");
        }
        self.changes.send_if_modified(|up| !std::mem::replace(up, true));
    }

    /// One check: reconnect if needed (asking the sentinels where the primary is), then `PING`.
    async fn check(&self) -> Result<(), String> {
        let addr = self.target.primary().await?;
        let current = self.conn.load_full();
        let conn = match current {
            Some(connected) if connected.addr == addr && self.is_up() => connected.conn.clone(),
            _ => {
                let conn = match self.target.cluster_nodes() {
                    Some(nodes) => Conn::Cluster(connect_cluster(nodes, &self.target, self.timeout).await?),
                    None => Conn::One(connect(&addr, &self.target, self.timeout).await?),
                };
                self.conn.store(Some(Arc::new(Connected { conn: conn.clone(), addr: addr.clone() })));
                conn
            }
        };
        let mut conn = conn;
        match tokio::time::timeout(self.timeout, redis::cmd("PING").query_async::<String>(&mut conn)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(error)) => Err(format!("PING to {addr} failed: {error}")),
            Err(_) => Err(format!("PING to {addr} not answered within {:?}", self.timeout)),
        }
    }
}

async fn connect(addr: &str, target: &Target, timeout: Duration) -> Result<MultiplexedConnection, String> {
    let mut info: ConnectionInfo =
        format!("redis://{addr}/").into_connection_info().map_err(|e| format!("bad address {addr}: {e}"))?;
    info = target.apply_credentials(info);
    let client = Client::open(info).map_err(|e| format!("cannot open {addr}: {e}"))?;
    let config =
        AsyncConnectionConfig::new().set_connection_timeout(Some(CONNECT_TIMEOUT)).set_response_timeout(Some(timeout));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| format!("cannot connect to {addr}: {e}"))
}

async fn connect_cluster(nodes: &[String], target: &Target, timeout: Duration) -> Result<ClusterConnection, String> {
    let mut infos = Vec::with_capacity(nodes.len());
    for node in nodes {
        let info = format!("redis://{node}/").into_connection_info().map_err(|e| format!("bad address {node}: {e}"))?;
        infos.push(target.apply_credentials(info));
    }
    // Few and short retries: enough to follow a redirection (MOVED, ASK) or a slot map that
    // just changed, not to wait out a node that is down (the client's default is 16 retries from
    // 1.28 s apart). The link answers from local state meanwhile, and its keeper reconnects.
    let client = ClusterClientBuilder::new(infos)
        .connection_timeout(CONNECT_TIMEOUT)
        .response_timeout(timeout)
        .retries(CLUSTER_RETRIES)
        .min_retry_wait(10)
        .max_retry_wait(100)
        .build()
        .map_err(|e| format!("cannot open the cluster {}: {e}", nodes.join(",")))?;
    // Connecting asks the nodes for the slot map and connects to each primary.
    match tokio::time::timeout(CONNECT_TIMEOUT * 2, client.get_async_connection()).await {
        Ok(Ok(conn)) => Ok(conn),
        Ok(Err(e)) => Err(format!("cannot connect to the cluster {}: {e}", nodes.join(","))),
        Err(_) => Err(format!("the cluster {} did not answer within {:?}", nodes.join(","), CONNECT_TIMEOUT * 2)),
    }
}

/// The keeper: checks the link until it is dropped.
async fn keep(link: Weak<Link>, failed: Arc<Notify>) {
    loop {
        let Some(strong) = link.upgrade() else { return };
        match strong.check().await {
            Ok(()) => strong.came_up(),
            Err(why) => {
                strong.mark_down(&why);
                strong.conn.store(None);
            }
        }
        drop(strong);
        tokio::select! {
            _ = tokio::time::sleep(CHECK_INTERVAL) => {}
            _ = failed.notified() => {}
        }
    }
}

/// A Lua script run on a [`Link`], loaded with a round trip of its own once each time the link
/// comes up. Without it, the first call after a (re)connection would find the script missing
/// and load it inside the same command timeout (`EVALSHA`, `SCRIPT LOAD`, `EVALSHA`: three
/// round trips), which on a Redis a third of the timeout away looks like an outage.
#[derive(Debug)]
pub struct LinkScript {
    script: redis::Script,
    /// [`Link::recoveries`] when it was last loaded (0: never).
    loaded_at: AtomicU64,
}

impl LinkScript {
    pub fn new(code: &str) -> Self {
        Self { script: redis::Script::new(code), loaded_at: AtomicU64::new(0) }
    }

    pub fn script(&self) -> &redis::Script {
        &self.script
    }

    /// Loads the script unless it was loaded since the link last came up; false when Redis
    /// did not answer (the link is then down).
    pub async fn ensure_loaded(&self, link: &Link) -> bool {
        let epoch = link.recoveries();
        if self.loaded_at.load(Ordering::Acquire) == epoch {
            return true;
        }
        let script = &self.script;
        let loaded = link.run(|mut conn| async move { script.load_async(&mut conn).await }).await.is_some();
        if loaded {
            self.loaded_at.store(epoch, Ordering::Release);
        }
        loaded
    }
}
