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

use super::keys;
use super::target::Target;
use crate::replicas::lag::PropagationLag;

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
    /// The generation marker last seen ([`keys::GENERATION`]), `(id, floor)`.
    generation: std::sync::Mutex<Option<(String, u64)>>,
    /// The primary's address at the last successful check: another one at a later check is a
    /// failover (only a Sentinel target's primary moves).
    primary: std::sync::Mutex<Option<String>>,
    /// Every ticket drawn through this link is at least this: the floor of the data set's
    /// generation, raised above every ticket handed out before Redis lost its data.
    ticket_floor: AtomicU64,
    /// Times this replica found that Redis had lost its data.
    losses: AtomicU64,
    /// Times the generation marker changed under this replica (a loss it found, or another
    /// replica's replacement it followed).
    generation_changes: AtomicU64,
    /// Longest wait for one command's answer.
    timeout: Duration,
    /// Draws waiting for a ticket from Redis, over every rotation (see [`DrawWaiting`]).
    draws_waiting: AtomicU64,
    /// Calls made to Redis to draw tickets, over every rotation.
    draw_calls: AtomicU64,
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
    /// How far behind the other replicas this one's copy of their instances is.
    propagation: PropagationLag,
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
    /// `lag_limit` is the longest propagation lag from another replica before this one counts
    /// as degraded.
    pub fn spawn(target: Target, timeout: Duration, lag_limit: Duration) -> Arc<Self> {
        let link = Arc::new(Self {
            target,
            generation: std::sync::Mutex::new(None),
            primary: std::sync::Mutex::new(None),
            ticket_floor: AtomicU64::new(0),
            losses: AtomicU64::new(0),
            generation_changes: AtomicU64::new(0),
            timeout,
            draws_waiting: AtomicU64::new(0),
            draw_calls: AtomicU64::new(0),
            conn: ArcSwapOption::empty(),
            up: AtomicBool::new(false),
            logged_down: AtomicBool::new(false),
            recoveries: AtomicU64::new(0),
            failed: Arc::new(Notify::new()),
            changes: watch::Sender::new(false),
            propagation: PropagationLag::new(lag_limit),
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

    /// The least ticket a draw may hand out: the floor of the data set's generation, raised
    /// above every earlier ticket when Redis is found to have lost its data.
    pub fn ticket_floor(&self) -> u64 {
        self.ticket_floor.load(Ordering::Acquire)
    }

    /// Draws of this replica waiting for their tickets from Redis: queued for a rotation's
    /// drawer, or in the batch its call carries.
    pub fn draws_waiting(&self) -> u64 {
        self.draws_waiting.load(Ordering::Relaxed)
    }

    /// Calls this replica made to Redis to draw tickets (each answers every draw waiting when
    /// it starts).
    pub fn draw_calls(&self) -> u64 {
        self.draw_calls.load(Ordering::Relaxed)
    }

    pub(super) fn count_draw_call(&self) {
        self.draw_calls.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one draw as waiting until the guard is dropped (answered, or the pick gone).
    pub fn draw_waiting(&self) -> DrawWaiting<'_> {
        self.draws_waiting.fetch_add(1, Ordering::Relaxed);
        DrawWaiting(self)
    }

    /// How many times this replica found that Redis had lost its data (restarted empty,
    /// flushed, or failed over to a replica that had none of it).
    pub fn losses(&self) -> u64 {
        self.losses.load(Ordering::Acquire)
    }

    /// How many times the generation marker changed under this replica: Redis lost its data
    /// (found here or by another replica) since it first looked.
    pub fn generation_changes(&self) -> u64 {
        self.generation_changes.load(Ordering::Acquire)
    }

    /// How many times the link has come up (the first connection counts).
    pub fn recoveries(&self) -> u64 {
        self.recoveries.load(Ordering::Acquire)
    }

    /// How far behind the other replicas this one's copy of their instances is.
    pub fn propagation(&self) -> &PropagationLag {
        &self.propagation
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

    /// Runs `groups` in order and returns every answer of every command, in order; `None` when
    /// the link is down or a group failed. On one server (or a Sentinel's primary) they go as
    /// one pipeline on one connection, which Redis runs in order: one round trip for all of
    /// them. On a Cluster each group (one hash slot) is sent once the previous one answered.
    pub async fn in_order(&self, groups: Vec<Pipeline>) -> Option<Vec<Value>> {
        match self.connection()? {
            Conn::One(_) => {
                let mut all = redis::pipe();
                for command in groups.iter().flat_map(|group| group.cmd_iter()) {
                    all.add_command(command.clone());
                }
                self.run(|mut conn| async move { all.query_async::<Vec<Value>>(&mut conn).await }).await
            }
            Conn::Cluster(_) => {
                let mut answers = Vec::new();
                for group in &groups {
                    answers.extend(
                        self.run(|mut conn| async move { group.query_async::<Vec<Value>>(&mut conn).await }).await?,
                    );
                }
                Some(answers)
            }
        }
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
            Ok(Ok(_)) => {}
            Ok(Err(error)) => return Err(format!("PING to {addr} failed: {error}")),
            Err(_) => return Err(format!("PING to {addr} not answered within {:?}", self.timeout)),
        }
        let previous = self.primary.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let failover = previous.as_ref().filter(|previous| **previous != addr);
        self.follow_generation(&mut conn, failover.map(String::as_str))
            .await
            .map_err(|e| format!("generation check on {addr}: {e}"))?;
        *self.primary.lock().unwrap_or_else(|p| p.into_inner()) = Some(addr);
        Ok(())
    }

    /// Reads the data set's generation marker (creating it, floor 0, in a new data set) and
    /// notices when Redis has lost its data: the marker this replica saw is gone and another
    /// one, with a floor no higher than the one known here, stands in its place (created by a
    /// replica that found Redis empty). This replica then replaces it with a new generation
    /// whose floor, taken from the clock ([`time_floor`]), lies above every ticket handed out
    /// before; a marker with a higher floor is another replica's such replacement, and is
    /// followed. Every draw passes the floor, so after a loss every rotation resumes above
    /// every ticket any replica gave out, whether or not this replica drew from it. Runs
    /// before the link is declared up, so no draw on a recovered link goes below the floor.
    ///
    /// After a failover (`failover_from` names the old primary) the promoted replica may lack
    /// the last writes the old primary took — draws other replicas were answered — while its
    /// marker is the one copied before. That is a loss too, which no marker shows: this replica
    /// starts a new generation above the one it finds, whatever that one is.
    async fn follow_generation(&self, conn: &mut Conn, failover_from: Option<&str>) -> Result<(), String> {
        let fresh = format!("{:016x}:0", fastrand::u64(..));
        let mut pipe = redis::pipe();
        pipe.cmd("SET").arg(keys::GENERATION).arg(&fresh).arg("NX").ignore();
        pipe.cmd("GET").arg(keys::GENERATION);
        let (value,): (Option<String>,) = match tokio::time::timeout(self.timeout, pipe.query_async(conn)).await {
            Ok(Ok(value)) => value,
            Ok(Err(error)) => return Err(error.to_string()),
            Err(_) => return Err(format!("not answered within {:?}", self.timeout)),
        };
        let current = value.as_deref().and_then(parse_generation).ok_or("the marker does not read as ID:FLOOR")?;
        let known = self.generation.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let lost = match (&known, failover_from) {
            (_, Some(_)) => Some(known.as_ref().map_or(current.1, |known| known.1.max(current.1))),
            (Some(known), None) if known.0 != current.0 && current.1 <= known.1 => Some(known.1),
            _ => None,
        };
        let adopted = match lost {
            Some(known_floor) => {
                // Lost: start a generation above everything handed out before.
                let floor = time_floor().max(known_floor + 1).max(self.ticket_floor());
                let next = (format!("{:016x}", fastrand::u64(..)), floor);
                let set = redis::cmd("SET").arg(keys::GENERATION).arg(format!("{}:{}", next.0, next.1)).clone();
                match tokio::time::timeout(self.timeout, set.query_async::<()>(conn)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(error)) => return Err(error.to_string()),
                    Err(_) => return Err(format!("not answered within {:?}", self.timeout)),
                }
                self.losses.fetch_add(1, Ordering::AcqRel);
                match failover_from {
                    Some(old) => tracing::warn!(
                        target = %self.target,
                        floor,
                        old_primary = old,
                        "the Redis primary failed over: writes it had not copied may be lost; every rotation resumes from the new floor"
                    ),
                    None => tracing::warn!(
                        target = %self.target,
                        floor,
                        "Redis has lost rota's data (its generation marker was replaced); every rotation resumes from the new floor"
                    ),
                }
                next
            }
            None => current,
        };
        self.ticket_floor.fetch_max(adopted.1, Ordering::AcqRel);
        let mut generation = self.generation.lock().unwrap_or_else(|p| p.into_inner());
        if generation.as_ref().is_some_and(|seen| seen.0 != adopted.0) {
            self.generation_changes.fetch_add(1, Ordering::AcqRel);
        }
        *generation = Some(adopted);
        Ok(())
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

/// A ticket floor from the clock: 1,024 per millisecond since the Unix epoch (about 2^51 in
/// 2026, far inside u64). It lies above every ticket of a rotation that drew fewer than 1,024
/// tickets per millisecond on average since the last such floor — far more than any rotation
/// draws.
pub fn time_floor() -> u64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    (now.as_millis() as u64).saturating_mul(1024)
}

fn parse_generation(value: &str) -> Option<(String, u64)> {
    let (id, floor) = value.split_once(':')?;
    Some((id.to_owned(), floor.parse().ok()?))
}

/// A Lua script run on a [`Link`], loaded with a round trip of its own once each time the link
/// comes up. Without it, the first call after a (re)connection would find the script missing
/// and load it inside the same command timeout (`EVALSHA`, `SCRIPT LOAD`, `EVALSHA`: three
/// round trips), which on a Redis a third of the timeout away looks like an outage.
#[derive(Debug)]
/// One draw counted in [`Link::draws_waiting`] while it is held.
pub struct DrawWaiting<'a>(&'a Link);

impl Drop for DrawWaiting<'_> {
    fn drop(&mut self) {
        self.0.draws_waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

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
