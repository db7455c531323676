//! Registration streams per client address, bounded so one peer cannot hold the registry's
//! attention (and memory) without limit.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use tonic::Status;

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

    /// Takes a slot for `ip`, or refuses with `RESOURCE_EXHAUSTED` at the limit.
    pub fn acquire(self: &Arc<Self>, ip: IpAddr) -> Result<PeerSlot, Status> {
        let mut open = self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let count = open.entry(ip).or_default();
        if *count >= self.limit {
            return Err(Status::resource_exhausted(format!(
                "peer {ip} already holds {count} registration streams; the limit is {}",
                self.limit
            )));
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
