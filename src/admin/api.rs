//! The JSON API: services, one service's instances with their statistics and pick counts, and
//! the policies in force. Read-only; the same service view feeds the dashboard's event stream.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::AdminState;
use crate::balancer::PickResult;
use crate::policy::{IsolationFallback, Policy, PolicySource};
use crate::registry::InstanceRecord;

#[derive(Debug, Serialize)]
pub struct ServiceSummary {
    pub name: String,
    pub instances: usize,
    pub up: usize,
    pub epoch: u64,
}

#[derive(Debug, Serialize)]
pub struct InstanceView {
    /// Its own fields (id, host, port, version, zone, weight, metadata, status).
    #[serde(flatten)]
    pub instance: InstanceRecord,
    pub in_flight: u64,
    /// Recent latency; `null` until a call to the instance has been reported.
    pub latency_ms: Option<f64>,
    pub breaker_open: bool,
    /// Whether every rule skips it now (its breaker is open or its failure rate too high).
    pub ejected: bool,
    /// Calls consumers reported for the instance (since it was first seen), and the failed ones.
    pub calls: u64,
    pub errors: u64,
    /// Failed share of the calls reported over the statistics window; `null` without any.
    pub error_rate: Option<f64>,
    /// Successful picks of this instance since it was registered (or since rota started),
    /// leased calls included once they are reported.
    pub picks: u64,
    pub picks_by_rule: BTreeMap<String, u64>,
}

#[derive(Debug, Serialize)]
pub struct ServiceView {
    pub name: String,
    pub epoch: u64,
    pub instances: Vec<InstanceView>,
    /// Successful picks and leases of the service since start, by rule.
    pub picks_by_rule: BTreeMap<String, u64>,
}

/// `{"error": "..."}` with a status code.
pub fn error(status: StatusCode, message: String) -> Response {
    (status, Json(serde_json::json!({ "error": message }))).into_response()
}

pub async fn services(State(state): State<AdminState>) -> Json<serde_json::Value> {
    let catalog = state.overview.catalog();
    let mut services: Vec<ServiceSummary> = catalog
        .snapshots()
        .map(|s| ServiceSummary {
            name: s.name.to_string(),
            instances: s.instances.len(),
            up: s.up_count(),
            epoch: s.epoch,
        })
        .collect();
    services.sort_by(|a, b| a.name.cmp(&b.name));
    Json(serde_json::json!({ "services": services }))
}

pub async fn service(State(state): State<AdminState>, Path(name): Path<String>) -> Response {
    match service_view(&state, &name) {
        Some(view) => Json(view).into_response(),
        None => error(StatusCode::NOT_FOUND, format!("service {name:?} has never been registered")),
    }
}

/// One service as operators see it, or `None` if it has never been registered.
pub fn service_view(state: &AdminState, name: &str) -> Option<ServiceView> {
    let snapshot = state.overview.service(name)?;
    let counters = state.overview.counters();
    let policies = state.overview.policies();
    let policy = policies.for_service(name);
    // One pass over the tallies, grouped by instance: the view is linear in the instances.
    let mut per_instance: HashMap<Arc<str>, BTreeMap<String, u64>> = HashMap::new();
    for tally in state.overview.instance_picks(name) {
        per_instance.entry(tally.instance).or_default().insert(tally.rule.to_string(), tally.count);
    }
    let instances = snapshot
        .instances
        .iter()
        .map(|instance| {
            let report = state.overview.instance_stats(name, &instance.id);
            let picks_by_rule = per_instance.remove(&instance.id).unwrap_or_default();
            InstanceView {
                instance: InstanceRecord::of(instance),
                in_flight: report.load.in_flight,
                latency_ms: report.load.latency_ms,
                breaker_open: report.load.tripped,
                ejected: report.load.tripped && policy.ejection.enabled,
                calls: report.calls,
                errors: report.errors,
                error_rate: (report.successes + report.failures > 0)
                    .then(|| report.failures as f64 / (report.successes + report.failures) as f64),
                picks: picks_by_rule.values().sum(),
                picks_by_rule,
            }
        })
        .collect();
    let picks_by_rule = counters
        .picks()
        .into_iter()
        .filter(|p| &*p.service == name && p.result == PickResult::Ok)
        .map(|p| (p.rule.to_string(), p.count))
        .collect();
    Some(ServiceView { name: snapshot.name.to_string(), epoch: snapshot.epoch, instances, picks_by_rule })
}

pub(super) fn policy_json(service: Option<&str>, policy: &Policy, source: PolicySource) -> serde_json::Value {
    serde_json::json!({
        "service": service,
        "source": source.as_str(),
        "rule": &*policy.rule.canonical,
        "isolation_fallback": match policy.isolation_fallback {
            IsolationFallback::Fail => "fail",
            IsolationFallback::Any => "any",
        },
        "gray": policy.gray.as_ref().map(|g| serde_json::json!({
            "unversioned": g.unversioned,
            "versions": g.versions,
        })),
        "breaker": {
            "failure_threshold": policy.breaker.failure_threshold,
            "blackout_base_ms": policy.breaker.blackout_base.as_millis() as u64,
            "blackout_max_ms": policy.breaker.blackout_max.as_millis() as u64,
        },
        "health_check": policy.health_check.as_ref().map(|check| serde_json::json!({
            "kind": check.kind.name(),
            "path": check.kind.path(),
            "interval_ms": check.interval.as_millis() as u64,
            "timeout_ms": check.timeout.as_millis() as u64,
            "unhealthy_after": check.unhealthy_after,
            "healthy_after": check.healthy_after,
        })),
    })
}

pub async fn policies(State(state): State<AdminState>) -> Json<serde_json::Value> {
    let set = state.overview.policies();
    let mut names: Vec<&String> = set.services.keys().collect();
    names.sort();
    let services: Vec<_> =
        names.into_iter().map(|name| policy_json(Some(name), &set.services[name], set.source(name))).collect();
    let defaults = policy_json(None, &set.defaults, PolicySource::Default);
    Json(serde_json::json!({ "defaults": defaults, "services": services }))
}

/// The registries rota follows: each one's state (`up` false when its last read failed), what
/// rota holds of it, and its last error.
pub async fn sources(State(state): State<AdminState>) -> Json<serde_json::Value> {
    Json(serde_json::json!({ "sources": state.sources.views() }))
}

/// A small icon for the browser tab (a ring with a marked position), so that the browser's
/// request for `/favicon.ico` is answered.
const FAVICON: &str = concat!(
    r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32">"##,
    r##"<circle cx="16" cy="16" r="11" fill="none" stroke="#2f6fde" stroke-width="5"/>"##,
    r##"<circle cx="16" cy="5" r="5" fill="#1d2330"/></svg>"##,
);

pub async fn favicon() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "image/svg+xml"), (axum::http::header::CACHE_CONTROL, "max-age=86400")],
        FAVICON,
    )
        .into_response()
}
