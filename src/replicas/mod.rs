//! Several rota servers acting as one, through the Redis they share their state in.
//!
//! Rotation counters and sticky assignments are read and written in Redis on the pick path
//! ([`crate::state::redis`]). Everything else a replica knows is shared in the background,
//! never on the pick path:
//!
//! - [`table`]: the instances each replica's registration streams hold, copied into every
//!   other replica's registry, and dropped when their replica stops renewing its key;
//! - [`claims`]: one owner per instance id fleet-wide, claimed when a stream announces it;
//! - [`loads`]: each replica's picks in flight, failures, breakers and latencies, merged into
//!   every other replica's statistics;
//! - [`policies`]: runtime policy overrides (`SetPolicy`, `ResetPolicy`) made on any replica;
//! - [`overrides`]: operators' instance overrides (`rota instance`) made on any replica;
//!   both through [`stamped`], a layer every replica may change;
//! - [`health`]: the active health checks, shared out (each instance checked by one replica)
//!   and their verdicts shared.
//!
//! Each replica names itself with a random id at start; the failure behaviour of each piece is
//! described in its module and in `docs/deploy.md`.

pub mod claims;
pub mod health;
pub mod lag;
pub mod loads;
pub mod overrides;
pub mod policies;
pub mod stamped;
pub mod table;
mod table_read;
mod table_write;

use std::sync::Arc;

use tokio::task::JoinHandle;

use crate::load::Stats;
use crate::policy::Policies;
use crate::registry::Registry;
use crate::state::redis::Link;

pub use loads::LoadSharing;
pub use policies::PolicySharing;
pub use table::TableSharing;

/// Starts sharing this replica's table, statistics, policies, instance overrides and health
/// verdicts through `link`. `registry` is the table shared, `stats` the statistics, `policies`
/// the runtime overrides. Returns the tasks, and what the health prober shares with the others.
pub fn spawn(
    registry: &Registry,
    stats: &Arc<Stats>,
    policies: &Arc<Policies>,
    link: &Arc<Link>,
) -> (Vec<JoinHandle<()>>, crate::health::Sharing) {
    let replica: Arc<str> = format!("{:016x}", fastrand::u64(..)).into();
    tracing::info!(%replica, target = %link.target(), "sharing state, instances, statistics and policies through Redis");
    let liveness = table::Liveness::new(replica.clone());
    registry.claim_ids_through(Arc::new(claims::IdClaims::new(link.clone(), liveness.clone())));
    let mut tasks = vec![
        TableSharing::spawn(registry.clone(), link.clone(), liveness),
        LoadSharing::spawn(stats.clone(), link.clone(), replica.clone()),
    ];
    tasks.extend(PolicySharing::spawn(policies.clone(), link.clone()));
    tasks.extend(overrides::OverrideSharing::spawn(registry.clone(), link.clone()));
    let assignment = crate::health::Assignment::new(replica);
    let (verdicts, follow) = tokio::sync::mpsc::unbounded_channel();
    tasks.push(health::HealthSharing::spawn(
        registry.clone(),
        policies.clone(),
        link.clone(),
        assignment.clone(),
        follow,
    ));
    (tasks, crate::health::Sharing { assignment, verdicts })
}
