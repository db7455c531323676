//! Open event streams (`/api/events`), bounded in total and per client address. Each holds
//! up to two events in the HTTP layer (one being written, one ready), and an event carries
//! its service's whole instance view, so their number bounds the bytes a dashboard that does
//! not read can make rota hold: at most [`MAX_EVENT_STREAMS`] events streams, and no new event
//! is built for a stream until the last one was taken.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Event streams open at once.
pub const MAX_EVENT_STREAMS: usize = 32;
/// Event streams open at once from one client address.
pub const MAX_EVENT_STREAMS_PER_PEER: usize = 4;

/// The client address of an admin connection, set on each of its requests.
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub IpAddr);

#[derive(Debug, Default)]
pub struct EventStreams {
    open: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    /// Entries only for addresses with a stream open.
    peers: HashMap<IpAddr, usize>,
}

/// One open stream; dropping it frees its place.
#[derive(Debug)]
pub struct EventSlot {
    streams: Arc<EventStreams>,
    peer: Option<IpAddr>,
}

impl EventStreams {
    /// A place for a stream of `peer`, or why there is none.
    pub fn acquire(self: &Arc<Self>, peer: Option<IpAddr>) -> Result<EventSlot, String> {
        let mut open = self.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if open.total >= MAX_EVENT_STREAMS {
            return Err(format!("rota already serves {MAX_EVENT_STREAMS} event streams, its limit; close a dashboard"));
        }
        if let Some(ip) = peer {
            let count = open.peers.get(&ip).copied().unwrap_or(0);
            if count >= MAX_EVENT_STREAMS_PER_PEER {
                return Err(format!(
                    "{ip} already holds {count} event streams, the limit per address; close a dashboard"
                ));
            }
            open.peers.insert(ip, count + 1);
        }
        open.total += 1;
        Ok(EventSlot { streams: self.clone(), peer })
    }
}

impl Drop for EventSlot {
    fn drop(&mut self) {
        let mut open = self.streams.open.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        open.total -= 1;
        if let Some(ip) = self.peer
            && let Some(count) = open.peers.get_mut(&ip)
        {
            *count -= 1;
            if *count == 0 {
                open.peers.remove(&ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_capped_per_address_and_in_total_and_places_come_back() {
        let streams = Arc::new(EventStreams::default());
        let ip = |n: u8| Some(IpAddr::from([127, 0, 0, n]));
        let mine: Vec<_> = (0..MAX_EVENT_STREAMS_PER_PEER).map(|_| streams.acquire(ip(1)).unwrap()).collect();
        let refused = streams.acquire(ip(1)).unwrap_err();
        assert_eq!(refused, "127.0.0.1 already holds 4 event streams, the limit per address; close a dashboard");
        let mut others = Vec::new();
        for n in 0..MAX_EVENT_STREAMS - MAX_EVENT_STREAMS_PER_PEER {
            others.push(streams.acquire(ip(2 + (n / MAX_EVENT_STREAMS_PER_PEER) as u8)).unwrap());
        }
        assert!(streams.acquire(ip(200)).unwrap_err().contains("32 event streams, its limit"));
        drop(mine);
        assert!(streams.acquire(ip(1)).is_ok());
        drop(others);
        let open = streams.open.lock().unwrap();
        assert_eq!((open.total, open.peers.len()), (0, 0));
    }
}
