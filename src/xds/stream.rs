//! One ADS stream, state of the world: what the client subscribed to, what it was sent, and
//! what is due.
//!
//! Per resource type the session keeps the names subscribed and the resources last sent (each
//! with the build it came from). A request changes the names (the client's whole wish, also
//! when its nonce is stale), acknowledges or rejects the last response when its nonce is that
//! response's, or asks for a type rota does not serve (ignored, as the protocol says). A
//! response of a type is due when its names changed, or when a resource it covers was rebuilt,
//! appeared or went away; it holds every subscribed resource that exists (an absent one is
//! simply not in it, which is how xDS says "does not exist"). During the start-up warm-up, a
//! type with a name of a service not seen yet is not answered, so that a client keeps what an
//! earlier rota told it while providers re-register.
//!
//! What a session holds for its client — its names, and what it last sent of each — is charged
//! to the hub's memory budget before a request grows it (an estimate per name, see
//! [`held_bytes`]); a request past the client address's share or the server's limit ends the
//! stream with `RESOURCE_EXHAUSTED`, changing nothing.
//!
//! A rejected response (NACK) is counted and logged once per stream; nothing is resent for it,
//! so a client that rejects in a loop costs one counter increment per request.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use tracing::warn;

use super::hub::{Hub, Lookup, MAX_NAME_BYTES, MAX_NAME_BYTES_PER_STREAM, TooManySubscriptions};
use super::resources::{Kind, parse_name};
use crate::budget::{Charge, OverBudget};
use crate::registry::truncate;

/// What a stream holds beside its names: the session, its channel, HTTP/2 stream state.
pub const STREAM_BYTES: usize = 16 << 10;
/// What one subscribed name holds beside its bytes, which are held twice (the name, and the
/// last response's record of it): two strings' headers, allocator rounding, tree nodes, the
/// service's count.
pub const NAME_BYTES: usize = 192;

/// The memory a session charges for these names, over every type.
pub fn held_bytes<'a>(names: impl Iterator<Item = &'a String>) -> usize {
    STREAM_BYTES + names.map(|name| 2 * name.len() + NAME_BYTES).sum::<usize>()
}

/// Why a stream is ended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamRefused {
    #[error(
        "an xDS request names {count} {kind} resources; the limit is {limit} per stream (server.max_xds_names_per_stream)"
    )]
    TooManyNames { kind: &'static str, count: usize, limit: usize },
    #[error("an xDS resource name is {len} bytes long; the limit is {MAX_NAME_BYTES}")]
    NameTooLong { len: usize },
    #[error(
        "an xDS stream's resource names would take {bytes} bytes; the limit is {MAX_NAME_BYTES_PER_STREAM} per stream"
    )]
    NamesTooLarge { bytes: usize },
    #[error(transparent)]
    TooManySubscriptions(#[from] TooManySubscriptions),
    #[error(transparent)]
    OverBudget(#[from] OverBudget),
}

#[derive(Debug, Default)]
struct TypeState {
    requested: bool,
    names: BTreeSet<String>,
    /// The names changed since the last response.
    dirty: bool,
    /// Nonce of the last response, and each resource it held with its digest.
    sent: Option<(String, Vec<(String, u64)>)>,
    /// Responses sent of this type: the next `version_info`.
    versions: u64,
    /// The client answered (ACK or NACK) the last response.
    answered: bool,
}

#[derive(Debug)]
pub struct Session {
    hub: Arc<Hub>,
    types: [TypeState; 4],
    /// Services subscribed to through any type, with how many names name each.
    services: BTreeMap<Arc<str>, usize>,
    nonces: u64,
    nack_logged: bool,
    peer: Option<SocketAddr>,
    /// What the session holds for its client, charged to the hub's budget.
    memory: Charge,
}

impl Session {
    /// A session for a client at `peer` (`None`: counted in the server's bounds only).
    pub fn new(hub: Arc<Hub>, peer: Option<SocketAddr>) -> Self {
        hub.counters.streams.fetch_add(1, Ordering::Relaxed);
        let memory = hub.memory().charge(peer.map(|p| p.ip()));
        Self { hub, types: Default::default(), services: BTreeMap::new(), nonces: 0, nack_logged: false, peer, memory }
    }

    fn ip(&self) -> Option<IpAddr> {
        self.peer.map(|p| p.ip())
    }

    /// Takes one request in; what it makes due is in the next [`Session::responses`].
    /// Refused, changing nothing, when it passes a bound.
    pub fn on_request(&mut self, request: DiscoveryRequest) -> Result<(), StreamRefused> {
        let counters = &self.hub.counters;
        let Some(kind) = Kind::from_type_url(&request.type_url) else {
            counters.unknown_types.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        };
        let limit = self.hub.limits().max_names_per_stream;
        if request.resource_names.len() > limit {
            counters.refused.fetch_add(1, Ordering::Relaxed);
            return Err(StreamRefused::TooManyNames { kind: kind.label(), count: request.resource_names.len(), limit });
        }
        if let Some(long) = request.resource_names.iter().find(|n| n.len() > MAX_NAME_BYTES) {
            counters.refused.fetch_add(1, Ordering::Relaxed);
            return Err(StreamRefused::NameTooLong { len: long.len() });
        }
        let answers_last = self.types[kind.index()]
            .sent
            .as_ref()
            .is_some_and(|(nonce, _)| !request.response_nonce.is_empty() && *nonce == request.response_nonce);
        if answers_last {
            self.types[kind.index()].answered = true;
            match &request.error_detail {
                Some(error) => {
                    counters.nacks.fetch_add(1, Ordering::Relaxed);
                    if !self.nack_logged {
                        self.nack_logged = true;
                        warn!(peer = ?self.peer, kind = kind.label(), error = %truncate(&error.message),
                            "an xDS client rejected rota's resources (logged once per stream)");
                    }
                }
                None => {
                    counters.acks.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        let state = &self.types[kind.index()];
        let names: BTreeSet<String> = request.resource_names.into_iter().collect();
        if state.requested && names == state.names {
            return Ok(());
        }
        let bytes = |names: &BTreeSet<String>| names.iter().map(String::len).sum::<usize>();
        let held: usize = self.types.iter().map(|t| bytes(&t.names)).sum();
        let after = held - bytes(&state.names) + bytes(&names);
        if after > MAX_NAME_BYTES_PER_STREAM {
            counters.refused.fetch_add(1, Ordering::Relaxed);
            return Err(StreamRefused::NamesTooLarge { bytes: after });
        }
        let others = self.types.iter().enumerate().filter(|(i, _)| *i != kind.index()).flat_map(|(_, t)| &t.names);
        let held = held_bytes(others.chain(&names));
        let before = self.memory.bytes();
        if let Err(over) = self.memory.resize(held) {
            counters.refused.fetch_add(1, Ordering::Relaxed);
            return Err(over.into());
        }
        if let Err(refused) = self.resubscribe(kind, names) {
            self.hub.counters.refused.fetch_add(1, Ordering::Relaxed);
            let _ = self.memory.resize(before);
            return Err(refused);
        }
        Ok(())
    }

    /// Replaces the names of `kind`, moving the hub's interest with them.
    fn resubscribe(&mut self, kind: Kind, names: BTreeSet<String>) -> Result<(), StreamRefused> {
        let services_of = |names: &BTreeSet<String>| -> BTreeMap<Arc<str>, usize> {
            let mut services = BTreeMap::new();
            for name in names {
                if let Some((service, _)) = parse_name(kind, name) {
                    *services.entry(Arc::from(service)).or_default() += 1;
                }
            }
            services
        };
        let old = services_of(&self.types[kind.index()].names);
        let new = services_of(&names);
        let mut next = self.services.clone();
        for (service, count) in &old {
            let entry = next.get_mut(service).expect("a subscribed service is counted");
            *entry -= count;
            if *entry == 0 {
                next.remove(service);
            }
        }
        for (service, count) in &new {
            *next.entry(service.clone()).or_default() += count;
        }
        let added: Vec<Arc<str>> = next.keys().filter(|s| !self.services.contains_key(*s)).cloned().collect();
        let removed: Vec<Arc<str>> = self.services.keys().filter(|s| !next.contains_key(*s)).cloned().collect();
        self.hub.interest(self.ip(), &added, &removed)?;
        self.services = next;
        let state = &mut self.types[kind.index()];
        state.names = names;
        state.requested = true;
        state.dirty = true;
        Ok(())
    }

    /// The responses due now, at most one per type.
    pub fn responses(&mut self) -> Vec<DiscoveryResponse> {
        let mut due = Vec::new();
        for kind in Kind::ALL {
            let state = &self.types[kind.index()];
            if !state.requested {
                continue;
            }
            let mut resources = Vec::new();
            let mut pending = false;
            for name in &state.names {
                let Some((service, _)) = parse_name(kind, name) else { continue };
                match self.hub.lookup(service) {
                    Lookup::Found(built) => {
                        if let Some(resource) = built.resources.get(kind, name) {
                            resources.push((name.clone(), resource.digest, resource.any.clone()));
                        }
                    }
                    Lookup::Absent => {}
                    Lookup::Pending => pending = true,
                }
            }
            if pending {
                continue;
            }
            let content: Vec<(String, u64)> = resources.iter().map(|(name, id, _)| (name.clone(), *id)).collect();
            if !state.dirty && state.sent.as_ref().is_some_and(|(_, sent)| *sent == content) {
                continue;
            }
            if self.removal_waits_for_routes(kind, &content) {
                continue;
            }
            self.nonces += 1;
            let nonce = self.nonces.to_string();
            let state = &mut self.types[kind.index()];
            state.versions += 1;
            state.dirty = false;
            state.answered = false;
            state.sent = Some((nonce.clone(), content));
            self.hub.counters.responses.fetch_add(1, Ordering::Relaxed);
            due.push(DiscoveryResponse {
                version_info: state.versions.to_string(),
                resources: resources.into_iter().map(|(_, _, resource)| resource).collect(),
                type_url: kind.type_url().to_string(),
                nonce,
                ..Default::default()
            });
        }
        due
    }
}

impl Session {
    /// Make before break: a cluster (or its endpoints) the client still asks for is removed
    /// only once the client has answered the routes sent before, which stopped sending traffic
    /// to it. Until then the removal waits (the client's answer makes the next responses due),
    /// so no call is routed to a cluster the client was just told is gone.
    fn removal_waits_for_routes(&self, kind: Kind, content: &[(String, u64)]) -> bool {
        if !matches!(kind, Kind::Cluster | Kind::Endpoint) {
            return false;
        }
        let routes = &self.types[Kind::Route.index()];
        if !routes.requested || routes.sent.is_none() || routes.answered {
            return false;
        }
        let state = &self.types[kind.index()];
        let Some((_, sent)) = &state.sent else { return false };
        sent.iter().any(|(name, _)| state.names.contains(name) && !content.iter().any(|(kept, _)| kept == name))
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let removed: Vec<Arc<str>> = self.services.keys().cloned().collect();
        let _ = self.hub.interest(self.ip(), &[], &removed);
        self.hub.counters.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests;
