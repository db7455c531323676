//! Following a Eureka server, as Eureka's own clients do.
//!
//! The first read (and the first after any failure) fetches the whole registry
//! (`GET {base}/apps/`); every later one fetches the recent changes (`GET {base}/apps/delta`),
//! applies them to the local copy, and checks the copy against the `apps__hashcode` the server
//! sent with them: the count of instances per status, `STATUS_COUNT_` for each status in name
//! order (`DOWN_1_UP_2_`). A copy that does not match (a change fell out of the server's
//! recent-changes queue, or the server restarted) is replaced by a full fetch at once.
//!
//! Each Eureka instance becomes one rota instance of the service named like its application,
//! in lower case (Eureka upper-cases application names; Spring Cloud looks them up either way):
//!
//! - id: the instance's `instanceId` (its `hostName` when it has none), namespaced by rota;
//! - address: `hostName` (what Spring Cloud's Eureka client connects to; with
//!   `prefer-ip-address` it is the IP) or, when empty, `ipAddr`; the port when enabled, else
//!   the secure port;
//! - status: `UP` → UP, `OUT_OF_SERVICE` → DRAINING, anything else (`DOWN`, `STARTING`,
//!   `UNKNOWN`) → DOWN;
//! - `metadata.version`, `metadata.zone` and `metadata.weight` → version, zone and weight (the
//!   metadata is kept whole beside them, bar Eureka's own `@class` entries).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use tokio::time::Instant;

use super::http::{self, Endpoint};
use super::{Follow, Listing, SourceError, SourceSpec};
use crate::registry::{DEFAULT_WEIGHT, InstanceRecord, Status};

/// One Eureka server's registry, as rota last read it.
pub struct Eureka {
    endpoint: Endpoint,
    interval: Duration,
    timeout: Duration,
    max_bytes: usize,
    /// Per application (as Eureka names it), per instance id. `None` until a full fetch.
    apps: Option<BTreeMap<String, BTreeMap<String, Entry>>>,
    due: Option<Instant>,
}

/// One instance as the server listed it.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    /// Eureka's status, as sent: what the hash code counts.
    status: String,
    /// What rota makes of it, or why it cannot.
    record: Result<InstanceRecord, String>,
}

impl Eureka {
    pub fn new(endpoint: Endpoint, spec: &SourceSpec) -> Self {
        Self {
            endpoint,
            interval: spec.interval,
            timeout: spec.timeout,
            max_bytes: spec.max_bytes,
            apps: None,
            due: None,
        }
    }

    async fn fetch(&self, path: &str) -> Result<Applications, SourceError> {
        let body = http::get(&self.endpoint, path, self.timeout, self.max_bytes).await?;
        // A large registry's answer takes a while to parse: not on a worker thread.
        let parsed = tokio::task::spawn_blocking(move || parse(&body))
            .await
            .map_err(|e| SourceError::new(format!("parsing {path}: {e}")))?;
        parsed.map_err(|e| SourceError::new(format!("{path}: {e}")))
    }

    async fn full(&mut self) -> Result<(), SourceError> {
        let answer = self.fetch("/apps/").await?;
        let mut apps: BTreeMap<String, BTreeMap<String, Entry>> = BTreeMap::new();
        for (app, id, entry, _) in answer.entries {
            apps.entry(app).or_default().insert(id, entry);
        }
        self.apps = Some(apps);
        Ok(())
    }

    /// Applies the recent changes; false when the copy then disagrees with the server.
    async fn delta(&mut self) -> Result<bool, SourceError> {
        let answer = self.fetch("/apps/delta").await?;
        let apps = self.apps.get_or_insert_with(BTreeMap::new);
        for (app, id, entry, action) in answer.entries {
            match action.as_str() {
                "DELETED" => {
                    if let Some(instances) = apps.get_mut(&app) {
                        instances.remove(&id);
                        if instances.is_empty() {
                            apps.remove(&app);
                        }
                    }
                }
                _ => {
                    apps.entry(app).or_default().insert(id, entry);
                }
            }
        }
        Ok(hash_code(apps) == answer.hash_code)
    }

    fn listing(&self) -> Listing {
        let mut listing = Listing::default();
        for (app, instances) in self.apps.iter().flatten() {
            let service = app.to_ascii_lowercase();
            for (id, entry) in instances {
                match &entry.record {
                    Ok(record) => listing.services.entry(service.clone()).or_default().push(record.clone()),
                    Err(problem) => listing.malformed.push(format!("application {app} instance {id}: {problem}")),
                }
            }
        }
        listing
    }
}

impl Follow for Eureka {
    async fn next(&mut self) -> Result<Listing, SourceError> {
        if let Some(due) = self.due {
            tokio::time::sleep_until(due).await;
        }
        self.due = Some(Instant::now() + self.interval);
        if self.apps.is_none() {
            self.full().await?;
        } else if !self.delta().await? {
            tracing::debug!(host = %self.endpoint.host, "Eureka delta did not match the server's hash code; fetching the whole registry");
            self.full().await?;
        }
        Ok(self.listing())
    }

    fn reset(&mut self) {
        self.apps = None;
    }
}

/// The count of instances per status, as Eureka writes it: `STATUS_COUNT_` in status order.
fn hash_code(apps: &BTreeMap<String, BTreeMap<String, Entry>>) -> String {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for entry in apps.values().flat_map(BTreeMap::values) {
        *counts.entry(&entry.status).or_default() += 1;
    }
    counts.into_iter().map(|(status, count)| format!("{status}_{count}_")).collect()
}

/// One answer: each instance as (application, id, entry, action type), and the hash code.
struct Applications {
    entries: Vec<(String, String, Entry, String)>,
    hash_code: String,
}

#[derive(Deserialize)]
struct Root {
    applications: Apps,
}

#[derive(Deserialize)]
struct Apps {
    #[serde(default, rename = "apps__hashcode")]
    hash_code: String,
    #[serde(default)]
    application: OneOrMany,
}

/// Eureka's JSON writes a list of one as the element alone in some versions.
#[derive(Deserialize, Default)]
#[serde(untagged)]
enum OneOrMany {
    #[default]
    None,
    Many(Vec<Value>),
    One(Value),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<Value> {
        match self {
            OneOrMany::None => Vec::new(),
            OneOrMany::Many(list) => list,
            OneOrMany::One(Value::Null) => Vec::new(),
            OneOrMany::One(one) => vec![one],
        }
    }
}

/// Reads one answer of Eureka's (a full listing or a delta): the instances rota can use, and a
/// description of each it cannot; `Err` for a body that is not an applications document.
pub fn read(body: &[u8]) -> Result<(Vec<InstanceRecord>, Vec<String>), String> {
    let parsed = parse(body)?;
    let mut usable = Vec::new();
    let mut refused = Vec::new();
    for (app, id, entry, _) in parsed.entries {
        match entry.record {
            Ok(record) => usable.push(record),
            Err(problem) => refused.push(format!("application {app} instance {id}: {problem}")),
        }
    }
    Ok((usable, refused))
}

fn parse(body: &[u8]) -> Result<Applications, String> {
    let root: Root = serde_json::from_slice(body).map_err(|e| format!("not a Eureka applications document: {e}"))?;
    let mut entries = Vec::new();
    for (i, app) in root.applications.application.into_vec().into_iter().enumerate() {
        let Some(name) = app.get("name").and_then(Value::as_str).map(str::to_owned) else {
            // Nothing of it can be placed; the hash code check then fetches whole, which
            // refuses it the same way.
            tracing::warn!(application = i, "Eureka application without a name ignored");
            continue;
        };
        let instances = match app.get("instance") {
            Some(Value::Array(list)) => list.clone(),
            Some(Value::Null) | None => Vec::new(),
            Some(one) => vec![one.clone()],
        };
        for (j, instance) in instances.into_iter().enumerate() {
            let id = text(&instance, "instanceId")
                .filter(|s| !s.is_empty())
                .or_else(|| text(&instance, "hostName"))
                .unwrap_or_else(|| format!("#{j}"));
            let status = text(&instance, "status").unwrap_or_else(|| "UNKNOWN".to_owned());
            let action = text(&instance, "actionType").unwrap_or_default();
            let record = record(&id, &status, &instance);
            entries.push((name.clone(), id, Entry { status, record }, action));
        }
    }
    Ok(Applications { entries, hash_code: root.applications.hash_code })
}

fn text(value: &Value, key: &str) -> Option<String> {
    match value.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// `{"$": 8080, "@enabled": "true"}`: the port, if enabled.
fn port(value: &Value, key: &str) -> Option<u16> {
    let port = value.get(key)?;
    let enabled = port.get("@enabled").map(|e| e.as_str() == Some("true") || e.as_bool() == Some(true)).unwrap_or(true);
    if !enabled {
        return None;
    }
    match port.get("$")? {
        Value::Number(n) => n.as_u64().and_then(|n| u16::try_from(n).ok()),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

fn record(id: &str, status: &str, instance: &Value) -> Result<InstanceRecord, String> {
    let host =
        text(instance, "hostName").filter(|h| !h.is_empty()).or_else(|| text(instance, "ipAddr")).unwrap_or_default();
    if host.is_empty() {
        return Err("neither hostName nor ipAddr".into());
    }
    let port = port(instance, "port").or_else(|| port(instance, "securePort")).ok_or("no enabled port")?;
    let mut metadata = BTreeMap::new();
    if let Some(Value::Object(map)) = instance.get("metadata") {
        for (key, value) in map {
            if key.starts_with('@') {
                continue;
            }
            let value = match value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            metadata.insert(key.clone(), value);
        }
    }
    let weight = match metadata.get("weight") {
        None => DEFAULT_WEIGHT,
        Some(w) => w.parse().map_err(|_| format!("metadata.weight is {w:?}; expected a whole number"))?,
    };
    let status = match status {
        "UP" => Status::Up,
        "OUT_OF_SERVICE" => Status::Draining,
        _ => Status::Down,
    };
    Ok(InstanceRecord {
        id: id.to_owned(),
        host,
        port,
        version: metadata.get("version").cloned().unwrap_or_default(),
        zone: metadata.get("zone").cloned().unwrap_or_default(),
        weight,
        metadata,
        status: status.as_str().to_owned(),
        ..Default::default()
    })
}

#[cfg(test)]
mod tests;
