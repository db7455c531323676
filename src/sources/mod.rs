//! Registries rota follows but does not own: Eureka, DNS names and etcd prefixes.
//!
//! A *source* is one `[[source]]` table of the config file (or one `--source URL` flag). Its
//! task ([`follower`]) asks the registry the source names for the instances of the services it
//! covers, and mirrors the answer into rota's own table through one lease of its own, the same
//! publication path registration streams take; rules, policies and every consumer see those
//! instances like any other.
//!
//! - Ids are namespaced: an instance the source calls `ID` is `NAME:ID` in rota, and no
//!   registration stream may announce an id starting with `NAME:`.
//! - A source that fails or times out keeps its last listing (picks go on from it), is marked
//!   stale ([`SourceStatus`]: `rota_source_up{source="NAME"} 0`, `/readyz`, `/api/sources`,
//!   the dashboard) and is asked again with backoff, from a full listing.
//! - A listing that would remove more than `protect_threshold` of a service's instances at
//!   once is held back (logged, counted) for `protect_for`; one that removes less is applied at
//!   once, and a held-back removal when `protect_for` runs out, whether or not the source has
//!   answered since (an etcd watch is silent while nothing changes). A registry that restarts
//!   empty, or answers half its table for a moment, does not empty rota.
//! - A source's answers are untrusted: the answer's bytes and its instances are bounded
//!   (`max_bytes`, `max_instances`), an entry rota cannot use is refused alone (logged once,
//!   counted), and parsing runs off the runtime's worker threads.
//! - With Redis replicas, every replica follows each source itself (its instances are not
//!   written to the shared table): there is no leader to lose, and each replica's copy is as
//!   fresh as its own last answer.
//!
//! docs/sources.md says how each kind is configured.

pub mod dns;
pub mod etcd;
pub mod eureka;
pub mod follower;
pub mod http;
pub mod listing;
pub mod spec;
pub mod status;

use std::future::Future;
use std::sync::Arc;

use tokio::task::JoinHandle;

use crate::registry::Registry;

pub use listing::Listing;
pub use spec::{Kind, SourceSpec};
pub use status::{SourceStatus, Sources};

/// Why one attempt to read a source failed; the source keeps its last listing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SourceError(String);

impl SourceError {
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// One kind of registry, as its task reads it.
pub trait Follow: Send + 'static {
    /// Waits for the source's next listing (the first at once) and returns it whole: what the
    /// source holds now of every service it lists, ids as the source names them.
    fn next(&mut self) -> impl Future<Output = Result<Listing, SourceError>> + Send;
    /// Called after a failure: the next listing is read whole, not as a change to the last.
    fn reset(&mut self);
}

/// Starts following every source in `specs`; the board reports on each.
pub fn spawn(registry: &Registry, specs: &[SourceSpec]) -> (Sources, Vec<JoinHandle<()>>) {
    let mut statuses = Vec::with_capacity(specs.len());
    let mut tasks = Vec::with_capacity(specs.len());
    for spec in specs {
        let spec = Arc::new(spec.clone());
        let status = Arc::new(SourceStatus::new(&spec));
        statuses.push(status.clone());
        // Opened here, so the source's id namespace is kept from the first registration stream on.
        let lease = registry.open_source_lease(&spec.name, spec.max_instances);
        tasks.push(match &spec.kind {
            Kind::Eureka(endpoint) => {
                let follow = eureka::Eureka::new(endpoint.clone(), &spec);
                tokio::spawn(follower::run(spec, follow, lease, status))
            }
            Kind::Dns { question, resolver } => {
                let follow = dns::Dns::new(question.clone(), *resolver, &spec);
                tokio::spawn(follower::run(spec, follow, lease, status))
            }
            Kind::Etcd { endpoint, prefix } => {
                let follow = etcd::Etcd::new(endpoint.clone(), prefix, &spec);
                tokio::spawn(follower::run(spec, follow, lease, status))
            }
        });
    }
    (Sources::new(statuses), tasks)
}
