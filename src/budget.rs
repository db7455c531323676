//! Memory rota holds on behalf of outside parties, charged before it is allocated.
//!
//! A [`Budget`] is one class of such memory (xDS subscriptions, say): a limit for the whole
//! server and a share no one client address may pass, so that one peer cannot take what the
//! others need. Whoever holds memory for a party keeps a [`Charge`] and resizes it *before*
//! growing what it holds; a resize past the share or the limit is refused, naming both, and
//! changes nothing. Dropping the charge gives its bytes back.
//!
//! Entries exist only for addresses with a live charge, so the map is bounded by what it
//! counts.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// One class of memory held for outside parties.
#[derive(Debug)]
pub struct Budget {
    class: &'static str,
    /// The setting that sets `limit`, for messages.
    setting: &'static str,
    limit: usize,
    share: usize,
    inner: Mutex<Held>,
    refused: AtomicU64,
}

#[derive(Debug, Default)]
struct Held {
    total: usize,
    /// Bytes and live charges per address.
    parties: HashMap<IpAddr, (usize, usize)>,
}

/// A charge refused: what it would have made held, and the bound it would have passed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OverBudget {
    #[error(
        "{class} held for {peer} would take {wanted} bytes, over one client address's share of {share} (part of {setting})"
    )]
    Share { class: &'static str, peer: IpAddr, wanted: usize, share: usize, setting: &'static str },
    #[error("{class} held for every client would take {wanted} bytes, over the server's {limit} ({setting})")]
    Total { class: &'static str, wanted: usize, limit: usize, setting: &'static str },
}

impl Budget {
    /// `limit` bytes in all, of which one address may hold `share` (at most `limit`).
    pub fn new(class: &'static str, setting: &'static str, limit: usize, share: usize) -> Arc<Self> {
        Arc::new(Self {
            class,
            setting,
            limit,
            share: share.min(limit),
            inner: Mutex::new(Held::default()),
            refused: AtomicU64::new(0),
        })
    }

    /// A charge of nothing yet, for `peer` (`None`: counted in the total only).
    pub fn charge(self: &Arc<Self>, peer: Option<IpAddr>) -> Charge {
        if let Some(peer) = peer {
            self.lock().parties.entry(peer).or_default().1 += 1;
        }
        Charge { budget: self.clone(), peer, bytes: 0 }
    }

    pub fn class(&self) -> &'static str {
        self.class
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    pub fn share(&self) -> usize {
        self.share
    }

    /// Bytes charged now, in all.
    pub fn held(&self) -> usize {
        self.lock().total
    }

    /// Bytes charged now for `peer`.
    pub fn held_by(&self, peer: IpAddr) -> usize {
        self.lock().parties.get(&peer).map_or(0, |(bytes, _)| *bytes)
    }

    /// Charges refused so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn resize(&self, peer: Option<IpAddr>, from: usize, to: usize) -> Result<(), OverBudget> {
        let mut held = self.lock();
        let wanted_total = held.total - from + to;
        if to > from {
            if let Some(peer) = peer {
                let mine = held.parties.get(&peer).map_or(0, |(bytes, _)| *bytes);
                let wanted = mine - from + to;
                if wanted > self.share {
                    self.refused.fetch_add(1, Ordering::Relaxed);
                    return Err(OverBudget::Share {
                        class: self.class,
                        peer,
                        wanted,
                        share: self.share,
                        setting: self.setting,
                    });
                }
            }
            if wanted_total > self.limit {
                self.refused.fetch_add(1, Ordering::Relaxed);
                return Err(OverBudget::Total {
                    class: self.class,
                    wanted: wanted_total,
                    limit: self.limit,
                    setting: self.setting,
                });
            }
        }
        held.total = wanted_total;
        if let Some(peer) = peer
            && let Some((bytes, _)) = held.parties.get_mut(&peer)
        {
            *bytes = *bytes - from + to;
        }
        Ok(())
    }

    fn release(&self, peer: Option<IpAddr>, bytes: usize) {
        let mut held = self.lock();
        held.total -= bytes;
        if let Some(peer) = peer
            && let Some((held_bytes, charges)) = held.parties.get_mut(&peer)
        {
            *held_bytes -= bytes;
            *charges -= 1;
            if *charges == 0 {
                held.parties.remove(&peer);
            }
        }
    }
}

/// Bytes held for one party under a [`Budget`]; given back when dropped.
#[derive(Debug)]
pub struct Charge {
    budget: Arc<Budget>,
    peer: Option<IpAddr>,
    bytes: usize,
}

impl Charge {
    /// Makes the charge `bytes`, before what it stands for grows to that; refused, changing
    /// nothing, past the peer's share or the budget's limit. Shrinking always succeeds.
    pub fn resize(&mut self, bytes: usize) -> Result<(), OverBudget> {
        self.budget.resize(self.peer, self.bytes, bytes)?;
        self.bytes = bytes;
        Ok(())
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.release(self.peer, self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    #[test]
    fn a_peer_is_held_to_its_share_and_everyone_to_the_limit() {
        let budget = Budget::new("xds", "server.max_xds_bytes", 100, 40);
        let mut a = budget.charge(Some(ip(1)));
        let mut a2 = budget.charge(Some(ip(1)));
        a.resize(30).unwrap();
        let refused = a2.resize(11).unwrap_err();
        assert!(matches!(refused, OverBudget::Share { wanted: 41, share: 40, .. }), "{refused}");
        assert_eq!((a2.bytes(), budget.held(), budget.held_by(ip(1))), (0, 30, 30), "a refusal changes nothing");
        a2.resize(10).unwrap();
        let mut b = budget.charge(Some(ip(2)));
        b.resize(40).unwrap();
        let mut c = budget.charge(Some(ip(3)));
        let refused = c.resize(21).unwrap_err();
        assert!(matches!(refused, OverBudget::Total { wanted: 101, limit: 100, .. }), "{refused}");
        assert!(refused.to_string().contains("server.max_xds_bytes"), "{refused}");
        c.resize(20).unwrap();
        assert_eq!(budget.refused(), 2);
        // Shrinking always fits; dropping gives everything back and forgets the address.
        a.resize(0).unwrap();
        assert_eq!(budget.held(), 70);
        drop((a, a2, b, c));
        assert_eq!(budget.held(), 0);
        assert!(budget.lock().parties.is_empty());
    }

    #[test]
    fn a_charge_without_a_peer_counts_in_the_total_only() {
        let budget = Budget::new("xds", "server.max_xds_bytes", 10, 5);
        let mut anonymous = budget.charge(None);
        anonymous.resize(10).unwrap();
        assert!(budget.charge(None).resize(1).is_err());
        drop(anonymous);
        assert_eq!(budget.held(), 0);
    }
}
