//! Runtime policy overrides shared by the replicas.
//!
//! A `SetPolicy` or `ResetPolicy` on any replica writes the service's override to the hash
//! `rota:{~fleet}:policies` (service → the override as TOML, as `SetPolicy` sent it) and bumps
//! `rota:{~fleet}:policies:version`. Every replica reads the version each [`POLL`] and, when it moved,
//! takes the whole hash as its runtime layer; each replica resolves the overrides over its own
//! policy file's defaults. Overrides made while Redis is unreachable are written when it
//! returns, and after Redis lost its data (a restart without persistence) each replica writes
//! its whole runtime layer again.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::time::MissedTickBehavior;

use super::table::POLL;
use crate::policy::file::{spec_from_toml, spec_to_toml};
use crate::policy::{Policies, PolicySpec, RuntimeChange};
use crate::state::redis::Link;

use crate::state::redis::keys::{POLICIES, POLICIES_VERSION as VERSION};

pub struct PolicySharing {
    policies: Arc<Policies>,
    link: Arc<Link>,
    /// Changes made here and not yet written: service → override (`None`: dropped).
    pending: BTreeMap<String, Option<PolicySpec>>,
    /// The version of the shared overrides this replica applied last.
    applied: Option<u64>,
    recoveries: u64,
}

impl PolicySharing {
    /// Shares `policies`' runtime layer through `link`; `None` when something shares it already.
    pub fn spawn(policies: Arc<Policies>, link: Arc<Link>) -> Option<tokio::task::JoinHandle<()>> {
        let changes = policies.follow_runtime_changes()?;
        let sharing = Self { policies, link, pending: BTreeMap::new(), applied: None, recoveries: 0 };
        Some(tokio::spawn(sharing.run(changes)))
    }

    async fn run(mut self, mut changes: mpsc::UnboundedReceiver<RuntimeChange>) {
        let mut poll = tokio::time::interval(POLL);
        poll.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                change = changes.recv() => match change {
                    Some((service, spec)) => {
                        self.pending.insert(service, spec);
                        while let Ok((service, spec)) = changes.try_recv() {
                            self.pending.insert(service, spec);
                        }
                    }
                    None => return,
                },
                _ = poll.tick() => {}
            }
            if !self.link.is_up() {
                continue;
            }
            let recoveries = self.link.recoveries();
            if recoveries != self.recoveries {
                if self.recoveries != 0 {
                    // Redis may have lost the shared overrides: write ours again.
                    for (service, spec) in self.policies.runtime_specs() {
                        self.pending.entry(service).or_insert(Some(spec));
                    }
                }
                self.recoveries = recoveries;
            }
            if !self.pending.is_empty() && !self.write().await {
                continue;
            }
            self.read().await;
        }
    }

    /// Writes the pending changes; false when Redis did not answer (they stay pending).
    async fn write(&mut self) -> bool {
        let mut pipe = redis::pipe();
        for (service, spec) in &self.pending {
            match spec {
                Some(spec) => pipe.cmd("HSET").arg(POLICIES).arg(service).arg(spec_to_toml(spec)).ignore(),
                None => pipe.cmd("HDEL").arg(POLICIES).arg(service).ignore(),
            };
        }
        pipe.cmd("INCR").arg(VERSION).ignore();
        let written = self.link.run(|mut c| async move { pipe.query_async::<()>(&mut c).await }).await.is_some();
        if written {
            self.pending.clear();
        }
        written
    }

    /// Takes the shared overrides as the runtime layer when their version moved.
    async fn read(&mut self) {
        let Some(version) = self
            .link
            .run(|mut c| async move { redis::cmd("GET").arg(VERSION).query_async::<Option<u64>>(&mut c).await })
            .await
        else {
            return;
        };
        if version.is_none() || version == self.applied {
            return;
        }
        let Some(shared) = self
            .link
            .run(|mut c| async move {
                redis::cmd("HGETALL").arg(POLICIES).query_async::<HashMap<String, String>>(&mut c).await
            })
            .await
        else {
            return;
        };
        let mut specs = BTreeMap::new();
        for (service, text) in shared {
            match spec_from_toml(&text) {
                Ok(spec) => {
                    specs.insert(service, spec);
                }
                Err(error) => tracing::warn!(%service, %error, "shared policy override unreadable; left out"),
            }
        }
        // Changes made here since the read started are applied over what was read.
        for (service, spec) in &self.pending {
            match spec {
                Some(spec) => specs.insert(service.clone(), spec.clone()),
                None => specs.remove(service),
            };
        }
        self.policies.replace_runtime(specs);
        self.applied = version;
    }
}
