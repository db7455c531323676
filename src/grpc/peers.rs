//! Registration streams per client address, bounded so one peer cannot hold the registry's
//! attention (and memory) without limit.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// A peer reached its limit of registration streams.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "peer {ip} already holds {count} registration streams; the limit is {limit} (server.max_registrations_per_peer)"
)]
pub struct TooManyRegistrations {
    pub ip: IpAddr,
    pub count: usize,
    pub limit: usize,
}

#[derive(Debug)]
pub struct PeerStreams {
    limit: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One open stream of one peer; dropping it frees the slot.
#[derive(Debug)]
pub struct PeerSlot {
    peers: Arc<PeerStreams>,
    ip: IpAddr,
}

impl PeerStreams {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self { limit, open: Mutex::new(HashMap::new()) })
    }

    /// Takes a slot for `ip`, or refuses at the limit.
    pub fn acquire(self: &Arc<Self>, ip: IpAddr) -> Result<PeerSlot, TooManyRegistrations> {
        let mut open = self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let count = open.entry(ip).or_default();
        if *count >= self.limit {
            return Err(TooManyRegistrations { ip, count: *count, limit: self.limit });
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
