//! The attacker side of the `connections` scenario: TCP connections from 127.0.0.2 that hold a
//! server's resources while sending nothing, or sending the start of a valid exchange a byte
//! at a time.
//!
//! Each attacker slot keeps one connection open until the phase ends; when the server closes
//! it (a timeout doing its job), the slot counts that and connects again, as a real slowloris
//! does, so the pressure lasts the whole phase. The connections only ever go to the server's
//! loopback port, from 127.0.0.2, so a per-peer limit can tell them from the probe.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::Instant;

/// The attackers' source address: loopback, but not the probe's.
pub const ATTACKER_IP: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// A dribbling connection sends one byte this often.
const DRIBBLE_EVERY: Duration = Duration::from_secs(1);
/// A slot connects again at most this often. A server that closes excess connections at once
/// would otherwise see thousands of connects a second from each slot; half a second keeps its
/// capacity for this peer refilled without turning the attack into a CPU benchmark of two cores.
const RECONNECT_EVERY: Duration = Duration::from_millis(500);

/// What an attacker connection sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attack {
    /// Connects and sends nothing.
    Idle,
    /// The HTTP/2 connection preface and a SETTINGS frame header, a byte at a time.
    SlowPreface,
    /// A TLS record header announcing a 512-byte ClientHello, then its body a byte at a time.
    SlowClientHello,
}

impl Attack {
    fn bytes(self) -> Vec<u8> {
        match self {
            Attack::Idle => Vec::new(),
            Attack::SlowPreface => {
                let mut bytes = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
                // SETTINGS, 16 KiB long, never delivered.
                bytes.extend([0x00, 0x40, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00]);
                bytes.extend(std::iter::repeat_n(0u8, 256));
                bytes
            }
            Attack::SlowClientHello => {
                // Handshake record, TLS 1.0 framing, 512 bytes; ClientHello of 508; TLS 1.2.
                let mut bytes = vec![0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03];
                bytes.extend((0..32u8).map(|b| b.wrapping_mul(37)));
                bytes.extend(std::iter::repeat_n(0u8, 256));
                bytes
            }
        }
    }
}

/// The attackers' tallies, shared by their slots.
#[derive(Debug, Default)]
pub struct Tallies {
    /// Connections open right now.
    pub open: AtomicUsize,
    /// The most open at once.
    pub peak: AtomicUsize,
    pub connected: AtomicU64,
    /// Connections the server closed (or reset).
    pub closed_by_server: AtomicU64,
    /// Connection attempts that failed or took over 2 s.
    pub refused: AtomicU64,
}

impl Tallies {
    fn opened(&self) {
        let now = self.open.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak.fetch_max(now, Ordering::Relaxed);
        self.connected.fetch_add(1, Ordering::Relaxed);
    }
}

/// Connects from 127.0.0.2 to `server`.
async fn connect(server: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((ATTACKER_IP, 0)))?;
    tokio::time::timeout(Duration::from_secs(2), socket.connect(server))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect took over 2 s"))?
}

/// One attacker slot: a connection kept open (and reopened) until `until`.
pub async fn hold(server: SocketAddr, attack: Attack, until: Instant, tallies: Arc<Tallies>) {
    let bytes = attack.bytes();
    // Bounded by time, and by count: at most one connection attempt per RECONNECT_EVERY anyway.
    let mut attempts = 0;
    while Instant::now() < until && attempts < 100_000 {
        attempts += 1;
        let attempt = Instant::now();
        let Ok(mut stream) = connect(server).await else {
            tallies.refused.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep_until((attempt + RECONNECT_EVERY).min(until)).await;
            continue;
        };
        tallies.opened();
        let mut sent = 0;
        let closed = loop {
            if Instant::now() >= until {
                break false;
            }
            let next = (Instant::now() + DRIBBLE_EVERY).min(until);
            if sent < bytes.len() {
                // The TLS and HTTP/2 attacks send their first bytes at once, then dribble.
                let burst = if sent == 0 { 5.min(bytes.len()) } else { 1 };
                if stream.write_all(&bytes[sent..sent + burst]).await.is_err() {
                    break true;
                }
                sent += burst;
            }
            if server_closed(&stream, next).await {
                break true;
            }
        };
        tallies.open.fetch_sub(1, Ordering::Relaxed);
        if closed {
            tallies.closed_by_server.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep_until((attempt + RECONNECT_EVERY).min(until)).await;
        }
    }
}

/// Waits until `deadline` for the server to close the connection; true if it did. Bytes it
/// sends meanwhile (an HTTP/2 SETTINGS frame, a TLS alert) are read and dropped.
async fn server_closed(stream: &TcpStream, deadline: Instant) -> bool {
    let mut buffer = [0u8; 1024];
    loop {
        match tokio::time::timeout_at(deadline, stream.readable()).await {
            Err(_) => return false,
            Ok(Err(_)) => return true,
            Ok(Ok(())) => match stream.try_read(&mut buffer) {
                Ok(0) => return true,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(_) => return true,
            },
        }
    }
}
