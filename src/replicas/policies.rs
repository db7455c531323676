//! Runtime policy overrides shared by the replicas: a [`SharedLayer`] of the hash
//! `rota:{~fleet}:policies` (service → the override as TOML, as `SetPolicy` sent it, stamped:
//! see [`super::stamped`]). Each replica resolves the overrides over its own policy file's
//! defaults.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::mpsc;

use super::stamped::{LayerChange, LayerSharing, SharedLayer};
use crate::policy::Policies;
use crate::policy::file::{spec_from_toml, spec_to_toml};
use crate::state::redis::Link;
use crate::state::redis::keys::{POLICIES, POLICIES_VERSION};

pub use super::stamped::TOMBSTONE_KEPT;

/// The runtime layer of the policies, as the replicas share it.
pub struct PolicySharing(Arc<Policies>);

impl SharedLayer for PolicySharing {
    fn keys(&self) -> (&'static str, &'static str) {
        (POLICIES, POLICIES_VERSION)
    }

    async fn local(&self) -> BTreeMap<String, String> {
        self.0.runtime_specs().into_iter().map(|(service, spec)| (service, spec_to_toml(&spec))).collect()
    }

    async fn replace(&self, entries: BTreeMap<String, String>) {
        let mut specs = BTreeMap::new();
        for (service, text) in entries {
            match spec_from_toml(&text) {
                Ok(spec) => {
                    specs.insert(service, spec);
                }
                Err(error) => tracing::warn!(%service, %error, "shared policy override unreadable; left out"),
            }
        }
        self.0.replace_runtime(specs);
    }
}

impl PolicySharing {
    /// Shares `policies`' runtime layer through `link`; `None` when something shares it already.
    pub fn spawn(policies: Arc<Policies>, link: Arc<Link>) -> Option<tokio::task::JoinHandle<()>> {
        let mut runtime = policies.follow_runtime_changes()?;
        let (changes, follow) = mpsc::unbounded_channel::<LayerChange>();
        let sharing = LayerSharing::spawn(Arc::new(PolicySharing(policies)), link, follow);
        // The changes as written: the spec's TOML, or a removal.
        Some(tokio::spawn(async move {
            let forward = async {
                while let Some((service, spec)) = runtime.recv().await {
                    if changes.send((service, spec.as_ref().map(spec_to_toml))).is_err() {
                        return;
                    }
                }
            };
            forward.await;
            drop(changes);
            let _ = sharing.await;
        }))
    }
}
