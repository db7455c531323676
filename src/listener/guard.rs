//! The socket wrapper every accepted connection is served through: it holds the connection's
//! admission slot and enforces the handshake and idle deadlines.
//!
//! The deadlines cost nothing per read: a read only adds to a byte count, and the one timer per
//! connection is looked at when a read would block. When the timer fires, the count tells what
//! happened since it was armed — fewer bytes than a handshake needs (a peer that connected and
//! says nothing, or dribbles a byte at a time), or no byte at all for the idle timeout (HTTP/2
//! keepalive pings are answered by every live client, so only a mute peer goes that long) — and
//! the read fails with `TimedOut`, which closes the connection. Otherwise the timer is re-armed
//! for one more idle period.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use super::{Admission, Timeout};

/// Bytes a plaintext HTTP/2 client sends before anything else (the connection preface), so a
/// connection that has not sent this many within the handshake timeout is not a client.
pub const PREFACE_LEN: u64 = 24;

/// Returns the connection's place to its [`Admission`] when dropped.
#[derive(Debug)]
pub(super) struct Slot {
    pub(super) admission: Arc<Admission>,
    pub(super) peer: std::net::IpAddr,
    /// A place in the probe reserve, not under the caps.
    pub(super) reserved: bool,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.admission.release(self.peer, self.reserved);
    }
}

/// An admitted connection.
#[derive(Debug)]
pub struct Guarded<IO> {
    io: IO,
    /// Boxed so the wrapper stays `Unpin`, as the TLS acceptor and hyper require.
    timer: Pin<Box<Sleep>>,
    /// Bytes read so far.
    read: u64,
    /// `read` when the timer was last armed.
    seen: u64,
    /// Bytes that end the handshake phase.
    handshake_bytes: u64,
    idle: Duration,
    slot: Slot,
}

impl<IO> Guarded<IO> {
    pub(super) fn new(io: IO, slot: Slot, handshake_bytes: u64, handshake: Duration, idle: Duration) -> Self {
        Self { io, timer: Box::pin(tokio::time::sleep(handshake)), read: 0, seen: 0, handshake_bytes, idle, slot }
    }

    /// Admitted past the caps, to the probe reserve: the server answers its health probes on it
    /// and nothing else, then closes it.
    pub fn reserved(&self) -> bool {
        self.slot.reserved
    }

    pub fn get_ref(&self) -> &IO {
        &self.io
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Guarded<IO> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                this.read += (buf.filled().len() - before) as u64;
                return Poll::Ready(Ok(()));
            }
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending => {}
        }
        // Nothing to read: this is when the deadline matters.
        while this.timer.as_mut().poll(cx).is_ready() {
            let timeout = if this.read < this.handshake_bytes {
                Timeout::Handshake
            } else if this.read == this.seen {
                Timeout::Idle
            } else {
                this.seen = this.read;
                this.timer.as_mut().reset(Instant::now() + this.idle);
                continue;
            };
            this.slot.admission.timed_out(timeout);
            return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, timeout.describe())));
        }
        Poll::Pending
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Guarded<IO> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl Guarded<TcpStream> {
    /// The client's address.
    pub fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        self.io.peer_addr().ok()
    }
}

impl tonic::transport::server::Connected for Guarded<TcpStream> {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}
