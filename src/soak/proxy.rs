//! A TCP proxy on 127.0.0.1 that holds every chunk of bytes for a set latency before passing
//! it on, in order, both ways: a Redis that is far away, for the `redis` scenario.
//!
//! Each accepted connection is joined to a new connection to the target port; each direction
//! reads chunks as they come and writes each one `latency` after it was read, so the proxy adds
//! `latency` each way (twice that per round trip) without limiting how much is in flight. The
//! proxy stops accepting, and drops every connection it carries, when it is dropped.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::SoakError;

/// Connections carried at once; a replica opens one or two.
const MAX_CONNECTIONS: usize = 64;
/// Chunks read ahead of their due time, per direction (back-pressure beyond it).
const QUEUED_CHUNKS: usize = 1024;

pub struct LatencyProxy {
    /// The port to connect to instead of the target's.
    pub port: u16,
    /// Accepts; every connection's copying tasks live in it, so aborting it ends them all.
    task: tokio::task::JoinHandle<()>,
}

impl LatencyProxy {
    /// A proxy on a free loopback port to `127.0.0.1:target`, adding `latency` each way.
    pub async fn start(target: u16, latency: Duration) -> Result<Self, SoakError> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| SoakError::Setup(format!("the latency proxy cannot bind 127.0.0.1:0: {e}")))?;
        let port = listener.local_addr().map_err(|e| SoakError::Setup(e.to_string()))?.port();
        let task = tokio::spawn(accept(listener, target, latency));
        Ok(Self { port, task })
    }
}

impl Drop for LatencyProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept(listener: TcpListener, target: u16, latency: Duration) {
    let mut connections = JoinSet::new();
    loop {
        let Ok((inbound, _)) = listener.accept().await else { return };
        // Finished connections are reaped, so the cap counts live ones.
        while connections.try_join_next().is_some() {}
        if connections.len() >= MAX_CONNECTIONS {
            continue;
        }
        connections.spawn(async move {
            let Ok(outbound) = TcpStream::connect(("127.0.0.1", target)).await else { return };
            let _ = (inbound.set_nodelay(true), outbound.set_nodelay(true));
            let (client_read, client_write) = inbound.into_split();
            let (server_read, server_write) = outbound.into_split();
            // Either direction ending (a close or an error) ends the connection.
            tokio::select! {
                () = delayed(client_read, server_write, latency) => {}
                () = delayed(server_read, client_write, latency) => {}
            }
        });
    }
}

/// Copies `from` to `to`, each chunk written `latency` after it was read.
async fn delayed(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, latency: Duration) {
    let (chunks, mut due) = mpsc::channel::<(Instant, Vec<u8>)>(QUEUED_CHUNKS);
    let writer = async move {
        while let Some((at, bytes)) = due.recv().await {
            tokio::time::sleep_until(at).await;
            if to.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    let reader = async move {
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if chunks.send((Instant::now() + latency, buf[..n].to_vec())).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    // The writer finishes what was read before the reader ended, then shuts its side.
    tokio::join!(reader, writer);
}
