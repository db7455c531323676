//! [`Overview`]: what the pick path publishes, for the readers that change nothing — the admin
//! listener and the xDS server. They reach the registry's catalog, the policies in force, the
//! instances' statistics and ejections, the pick counters and the state backend's health here,
//! and cannot pick, report, register or set a policy through it.

use std::sync::Arc;

use arc_swap::Guard;
use tokio::sync::{broadcast, watch};

use super::{Balancer, PickCounters};
use crate::load::{InstancePicks, InstanceReport, ServiceEjections};
use crate::policy::PolicySet;
use crate::registry::{Catalog, ServiceSnapshot};
use crate::state::{StickyUsage, redis::Link};

/// A read-only handle on a [`Balancer`]; cheap to clone.
#[derive(Clone)]
pub struct Overview {
    balancer: Arc<Balancer>,
}

impl Overview {
    pub fn new(balancer: Arc<Balancer>) -> Self {
        Self { balancer }
    }

    /// The balancer itself, for tests that also pick, report or set policies.
    #[cfg(test)]
    pub(crate) fn balancer(&self) -> &Arc<Balancer> {
        &self.balancer
    }

    /// Every service's current snapshot.
    pub fn catalog(&self) -> Guard<Arc<Catalog>> {
        self.balancer.registry.catalog()
    }

    /// One service's current snapshot.
    pub fn service(&self, name: &str) -> Option<Arc<ServiceSnapshot>> {
        self.balancer.registry.service(name)
    }

    /// The names of the services each publication changed.
    pub fn published(&self) -> broadcast::Receiver<Arc<[Arc<str>]>> {
        self.balancer.registry.published()
    }

    /// Ticks on every publication.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.balancer.registry.changes()
    }

    /// Open registration streams.
    pub fn open_leases(&self) -> usize {
        self.balancer.registry.open_leases()
    }

    /// The policies in force (file and runtime layers merged).
    pub fn policies(&self) -> Guard<Arc<PolicySet>> {
        self.balancer.policies.load()
    }

    pub fn policies_full(&self) -> Arc<PolicySet> {
        self.balancer.policies.load_full()
    }

    /// Runtime policy overrides in force.
    pub fn runtime_overrides(&self) -> usize {
        self.balancer.policies.runtime_overrides()
    }

    pub fn counters(&self) -> &PickCounters {
        &self.balancer.counters
    }

    pub fn pick_latency(&self) -> &super::PickLatency {
        &self.balancer.pick_latency
    }

    pub fn instance_stats(&self, service: &str, id: &str) -> InstanceReport {
        self.balancer.instance_stats(service, id)
    }

    pub fn instance_picks(&self, service: &str) -> Vec<InstancePicks> {
        self.balancer.instance_picks(service)
    }

    /// The service's ejected instances.
    pub fn ejections(&self, service: &Arc<str>) -> Arc<ServiceEjections> {
        self.balancer.stats.ejections(service)
    }

    /// Bumped whenever an ejection starts, moves or ends early.
    pub fn ejection_changes(&self) -> u64 {
        self.balancer.stats.ejection_changes()
    }

    pub fn sticky_usage(&self) -> StickyUsage {
        self.balancer.state.sticky_usage()
    }

    /// The state backend's name and whether it answers.
    pub fn state_backend(&self) -> (&'static str, bool) {
        (self.balancer.state.name(), self.balancer.state.is_up())
    }

    /// The link to Redis, for a shared backend.
    pub fn link(&self) -> Option<&Arc<Link>> {
        self.balancer.state.link()
    }
}
