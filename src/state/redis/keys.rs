//! Every key rota writes in Redis.
//!
//! A key about one service carries the service's name as its hash tag (`rota:{orders}:…`): a
//! service's counters, sticky assignments, table and loads live in one hash slot, so on a
//! Redis Cluster they live on one shard, scripts and pipelines about one service stay on one
//! node, and a fleet scales out by service. The few fleet-wide keys share the tag `{~fleet}`
//! (`~` is not allowed in a service name, so no service shares their slot): they are small and
//! touched in the background only.

use crate::state::{CounterKey, StickyKey};

/// The stream of table changes: which replica changed which ids of which service.
pub const CHANGES: &str = "rota:{~fleet}:changes";
/// Every service some replica wrote instances of.
pub const SERVICES: &str = "rota:{~fleet}:services";
/// Every replica that wrote loads.
pub const REPLICAS: &str = "rota:{~fleet}:replicas";
/// Services with loads written lately, scored by the time of the last write.
pub const ACTIVE_LOADS: &str = "rota:{~fleet}:loads:active";
/// Runtime policy overrides, service → policy (TOML).
pub const POLICIES: &str = "rota:{~fleet}:policies";
/// The data set's generation, `ID:FLOOR`: created once (`FLOOR` 0) by the first replica of a
/// fleet, replaced when a replica finds Redis has lost its data (see
/// [`Link`](super::Link)'s generation check).
pub const GENERATION: &str = "rota:{~fleet}:generation";
/// Raised on every change of [`POLICIES`].
pub const POLICIES_VERSION: &str = "rota:{~fleet}:policies:version";
/// The operators' instance overrides: field `SERVICE/ID`, value the stamped override.
pub const OVERRIDES: &str = "rota:{~fleet}:overrides";
/// Raised on every change of [`OVERRIDES`].
pub const OVERRIDES_VERSION: &str = "rota:{~fleet}:overrides:version";

/// A rotation counter.
pub fn counter(key: &CounterKey) -> String {
    format!("rota:{{{}}}:ticket:{}:{}", key.service, key.subset, key.rule)
}

/// A sticky assignment.
pub fn sticky(key: &StickyKey) -> String {
    format!("rota:{{{}}}:sticky:{}:{}", key.service, key.subset, key.key)
}

/// The instances one replica holds of one service: a hash, id → instance (JSON).
pub fn instances(service: &str, replica: &str) -> String {
    format!("rota:{{{service}}}:instances:{replica}")
}

/// The replicas holding instances of one service.
pub fn holders(service: &str) -> String {
    format!("rota:{{{service}}}:holders")
}

/// One replica's statistics of one service's instances.
pub fn loads(service: &str, replica: &str) -> String {
    format!("rota:{{{service}}}:loads:{replica}")
}

/// The active health checks' verdicts on one service's instances: id → `REPLICA|passing` or
/// `REPLICA|failing|WHY`, written by the replica that checks the instance.
pub fn health(service: &str) -> String {
    format!("rota:{{{service}}}:health")
}

/// Alive while the replica renews it.
pub fn replica(replica: &str) -> String {
    format!("rota:{{~fleet}}:replica:{replica}")
}
