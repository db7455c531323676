//! What rota knows of each instance's load, and what load-aware rules read of it, in one place.
//!
//! - Per instance, small figures, each its own type: picks in flight ([`in_flight`]), a latency
//!   average that decays in time ([`latency`]), successes and failures over a window
//!   ([`outcomes`]), and Ribbon's circuit breaker ([`breaker`]).
//! - [`Stats`] (`stats.rs`): the store that keeps those figures per instance, fed by picks and
//!   reports from every consumer and by the other replicas' figures, and that pushes each change
//!   into the indexes below.
//! - [`ejection`]: outlier ejection — the instances every rule skips — from those figures.
//! - [`LoadIndex`] ([`index`]): one subset's candidates' loads kept in segment trees, read by
//!   rules through one [`Query`] type in O(log n), never by scanning the candidates.

pub mod breaker;
pub mod ejection;
pub mod in_flight;
pub mod index;
pub mod latency;
pub mod outcomes;
mod stats;

pub use breaker::BreakerConfig;
pub use ejection::{EjectionConfig, ServiceEjections};
pub use index::{Load, LoadIndex, LoadSample, LoadTable, MAX_DEPARTED, Query, ZoneLoad, Zones};
pub use stats::{
    FAILED_CALL_LATENCY, InstancePicks, InstanceReport, LATENCY_MEMORY, LocalLoad, MAX_TALLIED_RULES, OTHER_RULE,
    Origin, Outcome, Outliers, RemoteLoad, Stats, StatsConfig, StatsHandle,
};
