//! How each source is doing, for the metrics, `/readyz`, `/api/sources` and the dashboard.

use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use serde::Serialize;

use super::SourceSpec;
use super::follower::Report;

/// One source's state, updated by its task after every read.
pub struct SourceStatus {
    pub name: String,
    pub kind: &'static str,
    pub url: String,
    view: Mutex<SourceView>,
}

/// What `/api/sources` shows of one source.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SourceView {
    pub name: String,
    pub kind: &'static str,
    pub url: String,
    /// The last read succeeded. False before the first answer, and after a failure (the source
    /// is stale: rota keeps its last listing).
    pub up: bool,
    pub instances: usize,
    /// Entries of the last listing rota refused.
    pub refused: usize,
    /// Services whose removals are held back now.
    pub held_back: Vec<String>,
    pub reads: u64,
    pub failures: u64,
    /// The last failure's message, kept after the source recovers.
    pub last_error: Option<String>,
    /// Seconds since the Unix epoch of the last successful read.
    pub last_read: Option<u64>,
}

impl SourceStatus {
    pub fn new(spec: &SourceSpec) -> Self {
        let view = SourceView {
            name: spec.name.clone(),
            kind: spec.kind.as_str(),
            url: spec.url.clone(),
            ..Default::default()
        };
        Self { name: spec.name.clone(), kind: spec.kind.as_str(), url: spec.url.clone(), view: Mutex::new(view) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SourceView> {
        self.view.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn synced(&self, report: Report) {
        let mut view = self.lock();
        view.up = true;
        view.instances = report.instances;
        view.refused = report.refused;
        view.held_back = report.held_back;
        view.reads += 1;
        view.last_read = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).ok().map(|d| d.as_secs());
    }

    /// Held-back removals were applied, their time being up (no read happened).
    pub fn released(&self, report: Report) {
        let mut view = self.lock();
        view.instances = report.instances;
        view.refused = report.refused;
        view.held_back = report.held_back;
    }

    pub fn failed(&self, error: String) {
        let mut view = self.lock();
        view.up = false;
        view.failures += 1;
        view.last_error = Some(error);
    }

    pub fn view(&self) -> SourceView {
        self.lock().clone()
    }
}

/// Every source's status.
#[derive(Clone, Default)]
pub struct Sources(Arc<[Arc<SourceStatus>]>);

impl Sources {
    pub fn new(list: Vec<Arc<SourceStatus>>) -> Self {
        Self(list.into())
    }

    pub fn views(&self) -> Vec<SourceView> {
        self.0.iter().map(|s| s.view()).collect()
    }

    /// The names of the sources whose last read failed (or that have not answered yet).
    pub fn stale(&self) -> Vec<String> {
        self.0.iter().map(|s| s.view()).filter(|v| !v.up).map(|v| v.name).collect()
    }
}
