//! The operators' instance overrides (`rota instance drain|disable|weight`) shared by the
//! replicas: a [`SharedLayer`] of the hash `rota:{~fleet}:overrides` (field `SERVICE/ID`, value
//! the override as `drain,weight=5`, stamped: see [`super::stamped`]). An override set through
//! any replica applies on all within about one poll (200 ms), and one set while Redis is away is
//! written when it returns.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::mpsc;

use super::stamped::{LayerChange, LayerSharing, SharedLayer};
use crate::registry::{Override, Registry};
use crate::state::redis::Link;
use crate::state::redis::keys::{OVERRIDES, OVERRIDES_VERSION};

/// The registry's operator layer, as the replicas share it.
pub struct OverrideSharing(Registry);

/// `SERVICE/ID`: neither may hold a `/`.
fn field(service: &str, id: &str) -> String {
    format!("{service}/{id}")
}

impl SharedLayer for OverrideSharing {
    fn keys(&self) -> (&'static str, &'static str) {
        (OVERRIDES, OVERRIDES_VERSION)
    }

    async fn local(&self) -> BTreeMap<String, String> {
        let all = self.0.overrides().await.unwrap_or_default();
        all.into_iter().map(|(service, id, value)| (field(&service, &id), value.describe())).collect()
    }

    async fn replace(&self, entries: BTreeMap<String, String>) {
        let mut all = Vec::with_capacity(entries.len());
        for (key, text) in entries {
            match (key.split_once('/'), Override::parse(&text)) {
                (Some((service, id)), Some(value)) => all.push((service.into(), id.into(), value)),
                _ => tracing::warn!(field = %key, value = %text, "shared instance override unreadable; left out"),
            }
        }
        self.0.replace_overrides(all);
    }
}

impl OverrideSharing {
    /// Shares `registry`'s operator overrides through `link`; `None` when something shares
    /// them already.
    pub fn spawn(registry: Registry, link: Arc<Link>) -> Option<tokio::task::JoinHandle<()>> {
        let mut changes = registry.follow_override_changes()?;
        let (tell, follow) = mpsc::unbounded_channel::<LayerChange>();
        let sharing = LayerSharing::spawn(Arc::new(OverrideSharing(registry)), link, follow);
        Some(tokio::spawn(async move {
            while let Some((service, id, value)) = changes.recv().await {
                let body = (!value.is_empty()).then(|| value.describe());
                if tell.send((field(&service, &id), body)).is_err() {
                    break;
                }
            }
            drop(tell);
            let _ = sharing.await;
        }))
    }
}
