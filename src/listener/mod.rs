//! The gRPC listener's front door: which connections are accepted, and how long one may hold a
//! socket without being a client.
//!
//! One task accepts TCP connections, turns Nagle's algorithm off on each (a gRPC response is
//! one small write; with Nagle on, a client doing one call at a time waits for its delayed ACK,
//! ~40 ms per call), and admits it against two caps — connections in total and per client IP
//! address — before any byte is read. A connection over a cap is closed at once and counted.
//! Each admitted connection then gets a handshake of its own (TLS, or nothing for plaintext) in
//! a task of its own, so a slow or silent peer never holds up the next one; the handshake is
//! bounded by the handshake timeout, and the socket is wrapped in a [`Guarded`] that also bounds
//! how long a peer may stay silent. Connections that finish their handshake go to the server
//! through a bounded queue.
//!
//! Why per address: a peer that opens connections and never speaks (or speaks one byte at a
//! time, "slowloris") can only fill its own share; others still get in.

mod guard;

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tracing::{debug, warn};

use guard::Slot;
pub use guard::{Guarded, PREFACE_LEN};

/// Connections whose handshake finished, waiting for the server to take them.
const READY_QUEUE: usize = 64;
/// Probe-reserve connections one client address may hold: a prober opens one at a time (two, so
/// that one closing as the next opens is no refusal).
pub const RESERVE_PER_PEER: usize = 2;
/// Time a probe-reserve connection has for its handshake (and, at the admin server, for its one
/// request head): a probe asks at once.
pub const RESERVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Bounds on connections, checked before a connection's first byte is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Open connections in total (each holds a file descriptor and HTTP/2 buffers).
    pub max_connections: usize,
    /// Open connections from one client IP address.
    pub max_connections_per_peer: usize,
    /// Time a new connection has to finish its handshake: the TLS handshake, or for plaintext
    /// the HTTP/2 connection preface.
    pub handshake_timeout: Duration,
    /// Time a connection may go without sending a byte (live clients answer keepalive pings).
    pub idle_timeout: Duration,
    /// Connections admitted past the caps, at most [`RESERVE_PER_PEER`] per client address, for the server to
    /// serve its health probes on alone (see [`Guarded::reserved`]): what clients filling the
    /// caps cannot take from a liveness probe. 0: none.
    pub probe_reserve: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_connections: 10_000,
            max_connections_per_peer: 256,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            probe_reserve: 0,
        }
    }
}

/// Why an open connection was closed by rota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timeout {
    Handshake,
    Idle,
}

impl Timeout {
    fn describe(self) -> &'static str {
        match self {
            Timeout::Handshake => "connection did not finish its handshake in time",
            Timeout::Idle => "connection sent nothing for the idle timeout",
        }
    }
}

/// Counts of what the front door did, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConnectionCounts {
    pub open: usize,
    pub refused_total_cap: u64,
    pub refused_peer_cap: u64,
    /// Connections admitted to the probe reserve, past the caps.
    pub reserved: u64,
    pub handshake_timeouts: u64,
    pub handshake_failures: u64,
    pub idle_timeouts: u64,
}

/// The connection caps and their counters, shared by the accept task and every connection.
#[derive(Debug)]
pub struct Admission {
    limits: ConnectionLimits,
    open: AtomicUsize,
    per_peer: Mutex<HashMap<IpAddr, usize>>,
    /// Addresses holding probe-reserve connections, and how many (at most [`RESERVE_PER_PEER`]).
    reserve: Mutex<HashMap<IpAddr, usize>>,
    refused_total_cap: AtomicU64,
    refused_peer_cap: AtomicU64,
    reserved: AtomicU64,
    handshake_timeouts: AtomicU64,
    handshake_failures: AtomicU64,
    idle_timeouts: AtomicU64,
}

impl Admission {
    pub fn new(limits: ConnectionLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            open: AtomicUsize::new(0),
            per_peer: Mutex::new(HashMap::new()),
            reserve: Mutex::new(HashMap::new()),
            refused_total_cap: AtomicU64::new(0),
            refused_peer_cap: AtomicU64::new(0),
            reserved: AtomicU64::new(0),
            handshake_timeouts: AtomicU64::new(0),
            handshake_failures: AtomicU64::new(0),
            idle_timeouts: AtomicU64::new(0),
        })
    }

    pub fn limits(&self) -> ConnectionLimits {
        self.limits
    }

    pub fn counts(&self) -> ConnectionCounts {
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        ConnectionCounts {
            open: self.open.load(Ordering::Relaxed),
            refused_total_cap: load(&self.refused_total_cap),
            refused_peer_cap: load(&self.refused_peer_cap),
            reserved: load(&self.reserved),
            handshake_timeouts: load(&self.handshake_timeouts),
            handshake_failures: load(&self.handshake_failures),
            idle_timeouts: load(&self.idle_timeouts),
        }
    }

    fn peers(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, usize>> {
        self.per_peer.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Takes a place for a connection from `peer`: under the caps, else in the probe reserve
    /// (a few per address), else none, counted under the cap that refused it.
    fn admit(self: &Arc<Self>, peer: IpAddr) -> Option<Slot> {
        let mut peers = self.peers();
        let refused = if self.open.load(Ordering::Relaxed) >= self.limits.max_connections {
            &self.refused_total_cap
        } else {
            let count = peers.entry(peer).or_default();
            if *count < self.limits.max_connections_per_peer {
                *count += 1;
                self.open.fetch_add(1, Ordering::Relaxed);
                return Some(Slot { admission: self.clone(), peer, reserved: false });
            }
            &self.refused_peer_cap
        };
        drop(peers);
        let mut reserve = self.reserve.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let held: usize = reserve.values().sum();
        let mine = reserve.get(&peer).copied().unwrap_or(0);
        if held < self.limits.probe_reserve && mine < RESERVE_PER_PEER {
            reserve.insert(peer, mine + 1);
            self.reserved.fetch_add(1, Ordering::Relaxed);
            return Some(Slot { admission: self.clone(), peer, reserved: true });
        }
        refused.fetch_add(1, Ordering::Relaxed);
        None
    }

    fn release(&self, peer: IpAddr, reserved: bool) {
        if reserved {
            let mut reserve = self.reserve.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            if let Some(count) = reserve.get_mut(&peer) {
                *count -= 1;
                if *count == 0 {
                    reserve.remove(&peer);
                }
            }
            return;
        }
        let mut peers = self.peers();
        if let Some(count) = peers.get_mut(&peer) {
            *count -= 1;
            if *count == 0 {
                peers.remove(&peer);
            }
        }
        self.open.fetch_sub(1, Ordering::Relaxed);
    }

    fn timed_out(&self, timeout: Timeout) {
        let counter = match timeout {
            Timeout::Handshake => &self.handshake_timeouts,
            Timeout::Idle => &self.idle_timeouts,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// Turns an admitted socket into a connection the server can serve (a TLS handshake, or
/// nothing); the accept task bounds it by the handshake timeout.
pub trait Handshake: Clone + Send + 'static {
    type Conn: Send + 'static;
    fn handshake(&self, io: Guarded<TcpStream>) -> impl Future<Output = io::Result<Self::Conn>> + Send;
    /// Bytes a peer must send before the [`Guarded`] socket leaves its handshake phase.
    fn handshake_bytes(&self) -> u64;
}

/// Plaintext HTTP/2: no handshake of rota's own; the preface must arrive in time.
#[derive(Debug, Clone, Copy)]
pub struct Plaintext;

impl Handshake for Plaintext {
    type Conn = Guarded<TcpStream>;

    async fn handshake(&self, io: Guarded<TcpStream>) -> io::Result<Self::Conn> {
        Ok(io)
    }

    fn handshake_bytes(&self) -> u64 {
        PREFACE_LEN
    }
}

/// File descriptors rota needs beside its connections: Redis, files, the runtime's own.
const SPARE_DESCRIPTORS: usize = 256;

/// Raises this process's soft limit of open files to its hard limit (a process starts with a
/// soft limit of 1,024 on most systems, fewer than the default connection caps), and warns
/// when even the hard limit is below `connections` plus what rota needs beside them: past
/// it, `accept` fails for every listener, not only the one that is full. Returns the limit
/// now in force, when it could be read.
pub fn raise_open_files_limit(connections: usize) -> Option<u64> {
    let limit = open_files_limit()?;
    let wanted = (connections + SPARE_DESCRIPTORS) as u64;
    if limit < wanted {
        warn!(
            limit,
            wanted,
            "the open-files limit is below the connection caps; raise it (ulimit -n, LimitNOFILE) or lower the caps"
        );
    } else {
        debug!(limit, "open-files limit");
    }
    Some(limit)
}

#[cfg(unix)]
fn open_files_limit() -> Option<u64> {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit only writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit { rlim_cur: limit.rlim_max, rlim_max: limit.rlim_max };
        // SAFETY: setrlimit only reads the struct it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit.rlim_cur = limit.rlim_max;
        } else {
            warn!(error = %io::Error::last_os_error(), "cannot raise the open-files limit");
        }
    }
    // `rlim_t` is u64 on Linux but not on every unix.
    #[allow(clippy::unnecessary_cast)]
    Some(limit.rlim_cur as u64)
}

#[cfg(not(unix))]
fn open_files_limit() -> Option<u64> {
    None
}

/// Accepts connections on `listener` under `admission`'s caps and yields those whose handshake
/// succeeded. The accept task ends when the returned stream is dropped.
pub fn incoming<H: Handshake>(listener: TcpListener, admission: Arc<Admission>, handshaker: H) -> Incoming<H::Conn> {
    let (ready, queue) = mpsc::channel(READY_QUEUE);
    tokio::spawn(async move {
        let limits = admission.limits();
        loop {
            let (tcp, peer) = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Usually out of file descriptors: back off instead of spinning.
                        warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                () = ready.closed() => return,
            };
            let Some(slot) = admission.admit(peer.ip()) else {
                debug!(peer = %peer, "connection refused: connection limit reached");
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let handshake =
                if slot.reserved { limits.handshake_timeout.min(RESERVE_TIMEOUT) } else { limits.handshake_timeout };
            let io = Guarded::new(tcp, slot, handshaker.handshake_bytes(), handshake, limits.idle_timeout);
            let (ready, handshaker, admission) = (ready.clone(), handshaker.clone(), admission.clone());
            tokio::spawn(async move {
                match tokio::time::timeout(limits.handshake_timeout, handshaker.handshake(io)).await {
                    Ok(Ok(conn)) => {
                        let _ = ready.send(conn).await;
                    }
                    Ok(Err(e)) => {
                        admission.handshake_failures.fetch_add(1, Ordering::Relaxed);
                        debug!(peer = %peer, error = %e, "handshake failed");
                    }
                    Err(_) => {
                        admission.timed_out(Timeout::Handshake);
                        debug!(peer = %peer, "handshake timed out");
                    }
                }
            });
        }
    });
    Incoming { queue }
}

/// Connections ready to serve, for `serve_with_incoming`.
pub struct Incoming<C> {
    queue: mpsc::Receiver<C>,
}

impl<C> futures_util::Stream for Incoming<C> {
    type Item = io::Result<C>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.queue.poll_recv(cx).map(|conn| conn.map(Ok))
    }
}

#[cfg(test)]
mod tests;
