//! Long-lived streams per client address, bounded so one peer cannot hold the server's
//! attention (and memory) without limit: registration streams, and the consumers' Watch and
//! PickStream streams, each counted apart.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Default cap on one client address's `Watch` and `PickStream` streams: room for a host
/// running hundreds of `rota:///` channels (one watch per service each).
pub const DEFAULT_CONSUMER_STREAMS_PER_PEER: usize = 2048;

/// A peer reached its limit of one kind of stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("peer {ip} already holds {count} {what}; the limit is {limit} ({setting})")]
pub struct TooManyPeerStreams {
    pub ip: IpAddr,
    pub count: usize,
    pub limit: usize,
    /// The streams counted, e.g. "registration streams".
    pub what: &'static str,
    /// The setting that holds the limit.
    pub setting: &'static str,
}

#[derive(Debug)]
pub struct PeerStreams {
    limit: usize,
    what: &'static str,
    setting: &'static str,
    /// Entries only for peers with a stream open: at most as many as open streams.
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One open stream of one peer; dropping it frees the slot.
#[derive(Debug)]
pub struct PeerSlot {
    peers: Arc<PeerStreams>,
    ip: IpAddr,
}

impl PeerStreams {
    /// Registration streams, at most `limit` per peer.
    pub fn registrations(limit: usize) -> Arc<Self> {
        Self::new(limit, "registration streams", "server.max_registrations_per_peer")
    }

    /// Watch and PickStream streams, at most `limit` per peer.
    pub fn consumers(limit: usize) -> Arc<Self> {
        Self::new(limit, "Watch and PickStream streams", "server.max_consumer_streams_per_peer")
    }

    fn new(limit: usize, what: &'static str, setting: &'static str) -> Arc<Self> {
        Arc::new(Self { limit, what, setting, open: Mutex::new(HashMap::new()) })
    }

    /// Takes a slot for `ip`, or refuses at the limit.
    pub fn acquire(self: &Arc<Self>, ip: IpAddr) -> Result<PeerSlot, TooManyPeerStreams> {
        let mut open = self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let count = open.entry(ip).or_default();
        if *count >= self.limit {
            let count = *count;
            if count == 0 {
                open.remove(&ip);
            }
            return Err(TooManyPeerStreams { ip, count, limit: self.limit, what: self.what, setting: self.setting });
        }
        *count += 1;
        Ok(PeerSlot { peers: self.clone(), ip })
    }
}

impl Drop for PeerSlot {
    fn drop(&mut self) {
        let mut open = self.peers.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}
