//! The registry's view of one instance, and the validation that turns a provider's announcement
//! into one.
//!
//! Validation happens once, when an instance is announced or updated; everything downstream
//! (snapshots, rules, the gRPC edge) can rely on the invariants below.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::error::InvalidField;

/// Longest service name, in bytes (the length of a DNS name).
pub const MAX_NAME_LEN: usize = 253;
/// Most metadata entries one instance may carry.
pub const MAX_METADATA_ENTRIES: usize = 64;
/// Longest metadata key, in bytes.
pub const MAX_METADATA_KEY_LEN: usize = 128;
/// Longest metadata value, in bytes.
pub const MAX_METADATA_VALUE_LEN: usize = 512;
/// Weight of an instance that announced none.
pub const DEFAULT_WEIGHT: u32 = 100;

/// Whether an instance takes new picks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    Up,
    /// Registered, finishing in-flight work, receiving no new picks.
    Draining,
    /// Registered but not eligible.
    Down,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Up => "UP",
            Status::Draining => "DRAINING",
            Status::Down => "DOWN",
        }
    }

    /// The status named `name` (as [`Status::as_str`] spells it).
    pub fn named(name: &str) -> Option<Status> {
        [Status::Up, Status::Draining, Status::Down].into_iter().find(|status| status.as_str() == name)
    }
}

/// One instance's own fields as rota writes them out in JSON: in the table replicas share
/// through Redis, and (with its statistics beside them) in the admin API. The service is the
/// key it is filed under, so it is not repeated.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InstanceRecord {
    pub id: String,
    pub host: String,
    pub port: u16,
    /// Empty when it has none (written out all the same; an absent one reads as empty).
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub zone: String,
    pub weight: u32,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    pub status: String,
    /// The source it was followed from, if rota followed it from a registry (`[[source]]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// The status its provider announced, when rota publishes another (a failing health check).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub announced_status: Option<String>,
    /// The active health check's verdict: `passing`, or `failing: WHY`; absent without checks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<String>,
    /// An operator's override (`drain`, `disable`, `weight=N`), absent without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<String>,
}

impl InstanceRecord {
    pub fn of(instance: &Instance) -> Self {
        Self {
            id: instance.id.to_string(),
            host: instance.host.clone(),
            port: instance.port,
            version: instance.version.to_string(),
            zone: instance.zone.to_string(),
            weight: instance.weight,
            metadata: instance.metadata.clone(),
            status: instance.status.as_str().to_owned(),
            source: instance.source.as_deref().map(str::to_owned),
            announced_status: instance
                .conditions
                .as_ref()
                .filter(|c| c.announced_status != instance.status)
                .map(|c| c.announced_status.as_str().to_owned()),
            health: instance.conditions.as_ref().and_then(|c| c.health.as_ref()).map(|health| match health {
                super::layers::Health::Passing => "passing".to_owned(),
                super::layers::Health::Failing(why) => format!("failing: {why}"),
            }),
            operator: instance.conditions.as_ref().and_then(|c| c.operator).map(|o| o.describe()),
        }
    }

    /// What to announce to register the instance again under `service`; a status rota does
    /// not know reads as UP.
    pub fn spec(self, service: &str) -> InstanceSpec {
        InstanceSpec {
            id: self.id,
            service: service.to_owned(),
            host: self.host,
            port: u32::from(self.port),
            version: self.version,
            zone: self.zone,
            weight: Some(self.weight),
            metadata: self.metadata,
            status: RequestedStatus::Known(Status::named(&self.status).unwrap_or(Status::Up)),
        }
    }
}

/// A validated, registered instance. Immutable once published: an update replaces the `Arc`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    pub id: Arc<str>,
    pub service: Arc<str>,
    pub host: String,
    pub port: u16,
    /// Empty when the instance has no version.
    pub version: Arc<str>,
    pub zone: Arc<str>,
    pub weight: u32,
    pub metadata: BTreeMap<String, String>,
    pub status: Status,
    /// When the instance last became UP, as the registry saw it (`None` while it is not UP,
    /// and for instances validated outside the registry). Rules that ramp traffic up after a
    /// start read it (`slow_start`).
    pub up_since: Option<tokio::time::Instant>,
    /// The source rota followed this instance from (`[[source]]`), `None` for one a
    /// registration stream (or another replica) holds.
    pub source: Option<Arc<str>>,
    /// What rota laid over the announced instance (a failing health check), when anything:
    /// `status` is then the effective one and this says what was announced, and why.
    pub conditions: Option<Arc<super::layers::Conditions>>,
    /// The instance as the gRPC edge answers it, encoded once when the balancer's views take
    /// the publication it is in, so a pick copies bytes instead of encoding fields.
    pub answer: Encoded,
}

/// Bytes encoded from the instance they are kept with, by whoever set them (the registry
/// neither reads nor writes them). A clone starts empty, so an instance changed from a copy
/// is never answered with its original's bytes; and they take no part in comparisons.
#[derive(Default)]
pub struct Encoded(std::sync::OnceLock<bytes::Bytes>);

impl Encoded {
    /// The bytes, once set.
    pub fn get(&self) -> Option<&bytes::Bytes> {
        self.0.get()
    }

    /// The bytes, set by `encode` the first time.
    pub fn get_or_init(&self, encode: impl FnOnce() -> bytes::Bytes) -> &bytes::Bytes {
        self.0.get_or_init(encode)
    }
}

impl Clone for Encoded {
    fn clone(&self) -> Self {
        Self::default()
    }
}

impl PartialEq for Encoded {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Encoded {}

impl std::fmt::Debug for Encoded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.get() {
            Some(bytes) => write!(f, "Encoded({} bytes)", bytes.len()),
            None => f.write_str("Encoded(none)"),
        }
    }
}

impl Instance {
    pub fn is_up(&self) -> bool {
        self.status == Status::Up
    }

    /// This instance as registered at `now`, following `previous` (the same id, if it was
    /// registered): an instance that stays UP keeps the moment it became UP.
    pub fn registered_after(mut self, previous: Option<&Instance>, now: tokio::time::Instant) -> Self {
        self.up_since = match (self.is_up(), previous) {
            (false, _) => None,
            (true, Some(previous)) if previous.is_up() => previous.up_since.or(Some(now)),
            (true, _) => Some(now),
        };
        self
    }
}

/// An instance as a provider described it, before validation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstanceSpec {
    pub id: String,
    pub service: String,
    pub host: String,
    pub port: u32,
    pub version: String,
    pub zone: String,
    pub weight: Option<u32>,
    pub metadata: BTreeMap<String, String>,
    pub status: RequestedStatus,
}

/// The status a provider asked for, as sent; an unknown wire value is kept for the error message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RequestedStatus {
    /// Not given: an announced instance is UP, an update keeps the current status.
    #[default]
    Unset,
    Known(Status),
    Unknown(i32),
}

impl RequestedStatus {
    /// The status to apply, if any.
    pub fn validate(self, field: &str) -> Result<Option<Status>, InvalidField> {
        match self {
            RequestedStatus::Unset => Ok(None),
            RequestedStatus::Known(status) => Ok(Some(status)),
            RequestedStatus::Unknown(value) => {
                Err(InvalidField::new(field, format!("is {value}; expected UP, DRAINING or DOWN")))
            }
        }
    }
}

impl InstanceSpec {
    /// Checks every field against the registry's limits. `field` prefixes error messages, e.g.
    /// `announce.instances[2]`, so the provider learns exactly which value was refused.
    pub fn validate(self, field: &str) -> Result<Instance, InvalidField> {
        validate_service_name(&format!("{field}.service"), &self.service)?;
        if self.host.is_empty() {
            return Err(InvalidField::new(format!("{field}.host"), "must not be empty"));
        }
        validate_token(&format!("{field}.host"), &self.host)?;
        let port = match u16::try_from(self.port) {
            Ok(port) if port != 0 => port,
            _ => {
                return Err(InvalidField::new(
                    format!("{field}.port"),
                    format!("must be between 1 and 65535, got {}", self.port),
                ));
            }
        };
        let id = if self.id.is_empty() { default_id(&self.host, port) } else { self.id };
        validate_token(&format!("{field}.id"), &id)?;
        if !self.version.is_empty() {
            validate_token(&format!("{field}.version"), &self.version)?;
        }
        if !self.zone.is_empty() {
            validate_token(&format!("{field}.zone"), &self.zone)?;
        }
        validate_metadata(&format!("{field}.metadata"), &self.metadata)?;
        let status = self.status.validate(&format!("{field}.status"))?.unwrap_or(Status::Up);
        Ok(Instance {
            id: id.into(),
            service: self.service.into(),
            host: self.host,
            port,
            version: self.version.into(),
            zone: self.zone.into(),
            weight: self.weight.unwrap_or(DEFAULT_WEIGHT),
            metadata: self.metadata,
            status,
            up_since: None,
            source: None,
            conditions: None,
            answer: Encoded::default(),
        })
    }
}

/// A service name: 1..=253 bytes of `[A-Za-z0-9._:-]`.
/// The id of an instance announced without one: `HOST:PORT`.
pub fn default_id(host: &str, port: impl std::fmt::Display) -> String {
    format!("{host}:{port}")
}

pub fn validate_service_name(field: &str, name: &str) -> Result<(), InvalidField> {
    if name.is_empty() {
        return Err(InvalidField::new(field, "must not be empty"));
    }
    validate_token(field, name)
}

/// A version or zone as a request names it: empty, or a name like a service's.
pub fn validate_optional_name(field: &str, value: &str) -> Result<(), InvalidField> {
    if value.is_empty() { Ok(()) } else { validate_token(field, value) }
}

/// Ids, hosts, versions and zones follow the same alphabet and length limit as service names,
/// so they can appear in counter keys, metric labels and Redis keys without escaping.
fn validate_token(field: &str, value: &str) -> Result<(), InvalidField> {
    if value.len() > MAX_NAME_LEN {
        return Err(InvalidField::new(field, format!("is {} bytes long; the limit is {MAX_NAME_LEN}", value.len())));
    }
    if let Some(bad) = value.chars().find(|c| !is_name_char(*c)) {
        return Err(InvalidField::new(field, format!("contains {bad:?}; only [A-Za-z0-9._:-] are allowed")));
    }
    Ok(())
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')
}

/// At most 64 entries, keys 1..=128 bytes, values at most 512 bytes.
pub fn validate_metadata(field: &str, metadata: &BTreeMap<String, String>) -> Result<(), InvalidField> {
    if metadata.len() > MAX_METADATA_ENTRIES {
        return Err(InvalidField::new(
            field,
            format!("has {} entries; the limit is {MAX_METADATA_ENTRIES}", metadata.len()),
        ));
    }
    for (key, value) in metadata {
        if key.is_empty() {
            return Err(InvalidField::new(field, "has an empty key"));
        }
        if key.len() > MAX_METADATA_KEY_LEN {
            return Err(InvalidField::new(
                format!("{field}[{}]", truncate(key)),
                format!("key is {} bytes long; the limit is {MAX_METADATA_KEY_LEN}", key.len()),
            ));
        }
        if value.len() > MAX_METADATA_VALUE_LEN {
            return Err(InvalidField::new(
                format!("{field}[{key}]"),
                format!("value is {} bytes long; the limit is {MAX_METADATA_VALUE_LEN}", value.len()),
            ));
        }
    }
    Ok(())
}

/// Keeps error messages short when echoing an over-long name or key: its first 32
/// characters and an ellipsis.
pub fn truncate(s: &str) -> String {
    let end = s.char_indices().nth(32).map_or(s.len(), |(i, _)| i);
    if end < s.len() { format!("{}…", &s[..end]) } else { s.to_owned() }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> InstanceSpec {
        InstanceSpec { service: "orders".into(), host: "10.0.0.1".into(), port: 8080, ..Default::default() }
    }

    #[test]
    fn id_defaults_to_host_port_and_status_to_up() {
        let instance = spec().validate("i").unwrap();
        assert_eq!(&*instance.id, "10.0.0.1:8080");
        assert_eq!(instance.status, Status::Up);
        assert_eq!(instance.weight, DEFAULT_WEIGHT);
    }

    #[test]
    fn explicit_weight_zero_is_kept() {
        let instance = InstanceSpec { weight: Some(0), ..spec() }.validate("i").unwrap();
        assert_eq!(instance.weight, 0);
    }

    #[test]
    fn each_limit_names_its_field() {
        let cases: Vec<(InstanceSpec, &str)> = vec![
            (InstanceSpec { service: String::new(), ..spec() }, "i.service"),
            (InstanceSpec { service: "a".repeat(254), ..spec() }, "i.service"),
            (InstanceSpec { service: "bad name".into(), ..spec() }, "i.service"),
            (InstanceSpec { host: String::new(), ..spec() }, "i.host"),
            (InstanceSpec { port: 0, ..spec() }, "i.port"),
            (InstanceSpec { port: 65536, ..spec() }, "i.port"),
            (InstanceSpec { version: "v/1".into(), ..spec() }, "i.version"),
            (InstanceSpec { status: RequestedStatus::Unknown(9), ..spec() }, "i.status"),
            (
                InstanceSpec { metadata: (0..65).map(|i| (format!("k{i}"), String::new())).collect(), ..spec() },
                "i.metadata",
            ),
            (
                InstanceSpec { metadata: [("k".repeat(129), String::new())].into(), ..spec() },
                "i.metadata[kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk…]",
            ),
            (InstanceSpec { metadata: [("k".into(), "v".repeat(513))].into(), ..spec() }, "i.metadata[k]"),
        ];
        for (spec, field) in cases {
            let err = spec.clone().validate("i").expect_err(&format!("{spec:?} should be refused"));
            assert_eq!(err.field, field, "{err}");
        }
    }

    #[test]
    fn limits_are_inclusive() {
        let ok = InstanceSpec {
            service: "a".repeat(253),
            port: 65535,
            metadata: (0..64).map(|i| (format!("{i:0>128}"), "v".repeat(512))).collect(),
            ..spec()
        };
        assert!(ok.validate("i").is_ok());
    }

    #[test]
    fn up_since_is_kept_while_up_and_restarts_after_a_pause() {
        let t0 = tokio::time::Instant::now();
        let t1 = t0 + std::time::Duration::from_secs(5);
        let first = spec().validate("i").unwrap().registered_after(None, t0);
        assert_eq!(first.up_since, Some(t0));
        let again = spec().validate("i").unwrap().registered_after(Some(&first), t1);
        assert_eq!(again.up_since, Some(t0), "re-announced while UP: the ramp goes on");
        let draining = Instance { status: Status::Draining, ..again.clone() }.registered_after(Some(&again), t1);
        assert_eq!(draining.up_since, None);
        let back = Instance { status: Status::Up, ..draining.clone() }.registered_after(Some(&draining), t1);
        assert_eq!(back.up_since, Some(t1), "UP again: the ramp starts over");
    }
}
