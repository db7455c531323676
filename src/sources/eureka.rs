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
//!
//! What rota keeps of the server (the *copy*) is bounded, whatever the server sends:
//!
//! - Of the applications the source covers, at most `max_instances` instances are kept, holding
//!   at most [`KEPT_PER_MAX_BYTES`] × `max_bytes` in all, each counted as the length of its
//!   text plus [`ENTRY_BYTES`], and [`METADATA_BYTES`] per metadata entry. The instances past either limit are left out
//!   and counted (the listing's `over_limit`); when a delta frees a place while some are left
//!   out, the registry is read whole again to fill it.
//! - Of every other instance (an application the source does not cover, or one left out),
//!   only a 64-bit digest of its application and id and its status are kept: the hash code
//!   counts every instance of the server, and a delta repeats each change for as long as the
//!   server keeps it in its recent-changes queue (three minutes by default), so the check has
//!   to know which instances it counted already. At most one such instance per
//!   [`TRACKED_BYTES`] of `max_bytes` is kept; past that (or past [`MAX_STATUSES`] distinct
//!   statuses) the copy cannot be checked, and every read is a full one.
//! - An answer is read into the copy as it is parsed, off the runtime's worker threads: no
//!   document tree is built, the fields rota does not use are skipped unread, and an instance
//!   of an application the source does not cover is read only for its id and status.
//!
//! An instance rota cannot use (no port, a weight that is not a number, a field longer than an
//! instance of rota's may carry) is kept as the reason it is refused, and listed as malformed.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::Arc;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use tokio::time::Instant;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::http::{self, Endpoint};
use super::{Follow, Listing, SourceError, SourceSpec};
use crate::registry::{
    DEFAULT_WEIGHT, InstanceRecord, MAX_METADATA_ENTRIES, MAX_METADATA_KEY_LEN, MAX_METADATA_VALUE_LEN, MAX_NAME_LEN,
    Status, truncate, validate_service_name,
};

/// The kept instances hold at most this many times `max_bytes`, as counted. An instance as a
/// Spring Boot app registers it (two metadata entries) is counted as about 2,400 bytes: the
/// default `max_instances` of them take 23 MiB of the 64 MiB the default `max_bytes` allows.
pub const KEPT_PER_MAX_BYTES: usize = 2;
/// What one kept instance is counted as besides its text: its record's fields, its slot in
/// the map (which may be half empty), its metadata map's first node, the allocator's share of
/// each string (about 1,500 bytes for an instance with two metadata entries).
pub const ENTRY_BYTES: usize = 2048;
/// What one metadata entry of a kept instance is counted as besides its text: its place in the
/// map's nodes and the allocator's share of its two strings.
pub const METADATA_BYTES: usize = 192;
/// One instance counted but not kept per this many bytes of `max_bytes` (each takes about 20).
pub const TRACKED_BYTES: usize = 64;
/// Distinct statuses a copy can count (Eureka has five), each at most [`MAX_STATUS_LEN`] bytes.
pub const MAX_STATUSES: usize = 16;
pub const MAX_STATUS_LEN: usize = 64;

/// One Eureka server's registry, as rota last read it.
pub struct Eureka {
    endpoint: Endpoint,
    spec: Arc<SourceSpec>,
    /// `None` until a full fetch (and again after a failure).
    copy: Option<Copy>,
    due: Option<Instant>,
    /// Why the copy cannot be checked against the server's hash code, as last logged.
    unchecked: Option<String>,
}

impl Eureka {
    pub fn new(endpoint: Endpoint, spec: &SourceSpec) -> Self {
        Self { endpoint, spec: Arc::new(spec.clone()), copy: None, due: None, unchecked: None }
    }

    /// Reads `path` into `copy` (every instance an addition or a change when `whole`); the
    /// copy, and the hash code the server sent.
    async fn fetch(&self, path: &'static str, copy: Copy, whole: bool) -> Result<(Copy, String), SourceError> {
        let body = http::get(&self.endpoint, path, self.spec.timeout, self.spec.max_bytes).await?;
        let spec = self.spec.clone();
        // A large registry's answer takes a while to parse: not on a worker thread.
        let parsed = tokio::task::spawn_blocking(move || {
            let mut copy = copy;
            let hash = parse(&body, &mut Apply { copy: &mut copy, spec: &spec, whole })?;
            Ok::<_, String>((copy, hash))
        })
        .await
        .map_err(|e| SourceError::new(format!("parsing {path}: {e}")))?;
        parsed.map_err(|e| SourceError::new(format!("{path}: {e}")))
    }

    async fn full(&mut self) -> Result<(), SourceError> {
        // The old copy goes first: a failure drops it all the same.
        self.copy = None;
        let (copy, _) = self.fetch("/apps/", Copy::new(&self.spec), true).await?;
        if copy.unchecked != self.unchecked {
            if let Some(why) = &copy.unchecked {
                tracing::warn!(host = %self.endpoint.host, %why, "Eureka copy cannot be checked against the server's hash code; the registry is read whole at every interval");
            }
            self.unchecked = copy.unchecked.clone();
        }
        self.copy = Some(copy);
        Ok(())
    }

    /// Applies the recent changes; false when the copy then disagrees with the server, or a
    /// place freed up while instances are left out.
    async fn delta(&mut self, mut copy: Copy) -> Result<bool, SourceError> {
        copy.freed = false;
        let (copy, hash) = self.fetch("/apps/delta", copy, false).await?;
        let agrees = copy.hash_code().is_some_and(|mine| mine == hash) && !(copy.freed && copy.left_out > 0);
        self.copy = Some(copy);
        Ok(agrees)
    }

    fn listing(&self) -> Listing {
        let mut listing = Listing::default();
        let Some(copy) = &self.copy else { return listing };
        for entry in copy.kept.values() {
            match &entry.item {
                Ok((service, record)) => listing.services.entry(service.clone()).or_default().push(record.clone()),
                Err(problem) => listing.malformed.push(problem.clone()),
            }
        }
        for records in listing.services.values_mut() {
            records.sort_by(|a, b| a.id.cmp(&b.id));
        }
        listing.malformed.sort();
        listing.over_limit = copy.left_out;
        listing
    }
}

impl Follow for Eureka {
    async fn next(&mut self) -> Result<Listing, SourceError> {
        if let Some(due) = self.due {
            tokio::time::sleep_until(due).await;
        }
        self.due = Some(Instant::now() + self.spec.interval);
        match self.copy.take() {
            Some(copy) if copy.unchecked.is_none() => {
                if !self.delta(copy).await? {
                    tracing::debug!(host = %self.endpoint.host, "Eureka delta did not match the server's hash code; fetching the whole registry");
                    self.full().await?;
                }
            }
            _ => self.full().await?,
        }
        Ok(self.listing())
    }

    fn reset(&mut self) {
        self.copy = None;
    }
}

/// A status's index in [`Copy::statuses`], and whether the instance is of a covered
/// application (left out, when counted but not kept).
const COVERED: u8 = 0x80;
/// The status of an instance whose status could not be counted (the copy is then unchecked).
const NO_STATUS: u8 = 0x7f;

/// What rota keeps of one Eureka server.
struct Copy {
    /// Of the digests of this copy (a new one at each full read, so that a collision, which
    /// makes the copy disagree with the server, lasts one read).
    seed: u64,
    max_instances: usize,
    /// At most what `kept` is counted as.
    max_kept_bytes: usize,
    max_tracked: usize,
    /// The instances of covered applications rota keeps, by digest.
    kept: HashMap<u64, Entry>,
    /// What `kept` is counted as ([`Entry::bytes`] summed).
    kept_bytes: usize,
    /// Every other instance, by digest: its status, with [`COVERED`] when it was left out.
    tracked: HashMap<u64, u8>,
    /// Instances of covered applications left out for want of room.
    left_out: usize,
    /// The statuses met, in the order met.
    statuses: Vec<Box<str>>,
    /// Why the copy cannot be checked against the server's hash code, if it cannot.
    unchecked: Option<String>,
    /// A kept instance was removed since the last delta began.
    freed: bool,
}

/// One kept instance.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    status: u8,
    /// What it is counted as against [`Copy::max_kept_bytes`].
    bytes: usize,
    /// Its service and record, or why rota cannot use it.
    item: Result<(String, InstanceRecord), String>,
}

impl Copy {
    fn new(spec: &SourceSpec) -> Self {
        Self {
            seed: fastrand::u64(..),
            max_instances: spec.max_instances,
            max_kept_bytes: spec.max_bytes.saturating_mul(KEPT_PER_MAX_BYTES),
            max_tracked: spec.max_bytes / TRACKED_BYTES,
            kept: HashMap::new(),
            kept_bytes: 0,
            tracked: HashMap::new(),
            left_out: 0,
            statuses: Vec::new(),
            unchecked: None,
            freed: false,
        }
    }

    fn status(&mut self, name: &str) -> u8 {
        if let Some(i) = self.statuses.iter().position(|s| &**s == name) {
            return i as u8;
        }
        if self.statuses.len() < MAX_STATUSES && name.len() <= MAX_STATUS_LEN {
            self.statuses.push(name.into());
            return (self.statuses.len() - 1) as u8;
        }
        self.unchecked.get_or_insert_with(|| {
            format!(
                "more than {MAX_STATUSES} distinct statuses, or one longer than {MAX_STATUS_LEN} bytes ({:?})",
                truncate(name)
            )
        });
        NO_STATUS
    }

    /// Keeps `item` if there is room for it, else counts it as left out.
    fn keep(&mut self, key: u64, status: u8, item: Result<(String, InstanceRecord), String>) {
        let bytes = held_bytes(&item);
        let old = self.kept.get(&key).map(|entry| entry.bytes);
        let fits = (old.is_some() || self.kept.len() < self.max_instances)
            && self.kept_bytes - old.unwrap_or(0) + bytes <= self.max_kept_bytes;
        if fits {
            self.untrack(key);
            self.kept_bytes = self.kept_bytes - old.unwrap_or(0) + bytes;
            self.kept.insert(key, Entry { status, bytes, item });
            return;
        }
        if let Some(old) = self.kept.remove(&key) {
            self.kept_bytes -= old.bytes;
            self.freed = true;
        }
        self.track(key, status, true);
    }

    /// Counts an instance without keeping it.
    fn track(&mut self, key: u64, status: u8, covered: bool) {
        let value = status | if covered { COVERED } else { 0 };
        if let Some(old) = self.tracked.get_mut(&key) {
            if *old & COVERED != 0 {
                self.left_out -= 1;
            }
            *old = value;
        } else if self.tracked.len() < self.max_tracked {
            self.tracked.insert(key, value);
        } else {
            let max = self.max_tracked;
            self.unchecked.get_or_insert_with(|| {
                format!("the server lists more than {max} instances rota does not keep (one per {TRACKED_BYTES} bytes of max_bytes)")
            });
        }
        if covered {
            self.left_out += 1;
        }
    }

    fn untrack(&mut self, key: u64) {
        if let Some(old) = self.tracked.remove(&key)
            && old & COVERED != 0
        {
            self.left_out -= 1;
        }
    }

    fn remove(&mut self, key: u64) {
        if let Some(old) = self.kept.remove(&key) {
            self.kept_bytes -= old.bytes;
            self.freed = true;
        }
        self.untrack(key);
    }

    /// The count of instances per status, as Eureka writes it (`STATUS_COUNT_` in status
    /// order); `None` when the copy cannot say.
    fn hash_code(&self) -> Option<String> {
        if self.unchecked.is_some() {
            return None;
        }
        let mut counts = vec![0usize; self.statuses.len()];
        let statuses = self.kept.values().map(|entry| entry.status).chain(self.tracked.values().map(|v| v & !COVERED));
        for status in statuses {
            *counts.get_mut(usize::from(status))? += 1;
        }
        let mut pairs: Vec<(&str, usize)> =
            self.statuses.iter().map(|s| &**s).zip(counts).filter(|(_, count)| *count > 0).collect();
        pairs.sort_unstable();
        Some(pairs.into_iter().map(|(status, count)| format!("{status}_{count}_")).collect())
    }
}

/// What a kept instance is counted as: its text, and a fixed share per instance and per
/// metadata entry for the rest of what holding it takes.
fn held_bytes(item: &Result<(String, InstanceRecord), String>) -> usize {
    ENTRY_BYTES
        + match item {
            Ok((service, r)) => {
                service.len()
                    + r.id.len()
                    + r.host.len()
                    + r.version.len()
                    + r.zone.len()
                    + r.status.len()
                    + r.metadata.iter().map(|(k, v)| k.len() + v.len() + METADATA_BYTES).sum::<usize>()
            }
            Err(problem) => problem.len(),
        }
}

/// Where the instances of an answer go, one by one, as it is parsed.
trait Sink {
    /// The application named `name` (its instances follow).
    fn app(&mut self, name: String) -> App;
    fn put(&mut self, app: &App, at: usize, instance: Instance);
    /// An application without a name, and with instances: they cannot be placed.
    fn nameless(&mut self);
}

/// An application of an answer.
struct App {
    name: String,
    /// Its instances are read whole (else only for their id and status).
    whole: bool,
    /// Of the digests of its instances.
    seed: u64,
}

/// An answer applied to a copy.
struct Apply<'a> {
    copy: &'a mut Copy,
    spec: &'a SourceSpec,
    /// A full listing: every instance in it is there (whatever its `actionType`).
    whole: bool,
}

impl Sink for Apply<'_> {
    fn app(&mut self, name: String) -> App {
        let whole = self.spec.covers(&name.to_ascii_lowercase());
        let seed = xxh3_64_with_seed(name.as_bytes(), self.copy.seed);
        App { name, whole, seed }
    }

    fn put(&mut self, app: &App, at: usize, instance: Instance) {
        let id = instance.id(at);
        let key = xxh3_64_with_seed(id.as_bytes(), app.seed);
        if !self.whole && instance.action.as_deref() == Some("DELETED") {
            self.copy.remove(key);
            return;
        }
        let status = self.copy.status(instance.status());
        if app.whole {
            let item = instance.record(app, &id);
            self.copy.keep(key, status, item);
        } else {
            self.copy.track(key, status, false);
        }
    }

    fn nameless(&mut self) {
        self.copy.unchecked.get_or_insert_with(|| "an application without a name".to_owned());
    }
}

/// Every instance of an answer, read whole.
#[derive(Default)]
struct Collect {
    usable: Vec<InstanceRecord>,
    refused: Vec<String>,
}

impl Sink for Collect {
    fn app(&mut self, name: String) -> App {
        App { name, whole: true, seed: 0 }
    }

    fn put(&mut self, app: &App, at: usize, instance: Instance) {
        let id = instance.id(at);
        match instance.record(app, &id) {
            Ok((_, record)) => self.usable.push(record),
            Err(problem) => self.refused.push(problem),
        }
    }

    fn nameless(&mut self) {}
}

/// Reads one answer of Eureka's (a full listing or a delta): the instances rota can use, and a
/// description of each it cannot; `Err` for a body that is not an applications document.
pub fn read(body: &[u8]) -> Result<(Vec<InstanceRecord>, Vec<String>), String> {
    let mut collect = Collect::default();
    parse(body, &mut collect)?;
    Ok((collect.usable, collect.refused))
}

/// Reads an applications document into `sink`; the hash code it gave.
fn parse(body: &[u8], sink: &mut impl Sink) -> Result<String, String> {
    let mut de = serde_json::Deserializer::from_slice(body);
    Document { sink }
        .deserialize(&mut de)
        .and_then(|hash| de.end().map(|()| hash))
        .map_err(|e| format!("not a Eureka applications document: {e}"))
}

/// One instance as the server listed it: the fields rota reads.
#[derive(Default)]
struct Instance {
    instance_id: Option<String>,
    host_name: Option<String>,
    ip_addr: Option<String>,
    status: Option<String>,
    action: Option<String>,
    /// Each when enabled.
    port: Option<u16>,
    secure_port: Option<u16>,
    metadata: Option<Result<BTreeMap<String, String>, String>>,
}

impl Instance {
    /// Its `instanceId`, else its `hostName`, else its place in the application's list.
    fn id(&self, at: usize) -> String {
        self.instance_id
            .clone()
            .filter(|id| !id.is_empty())
            .or_else(|| self.host_name.clone())
            .unwrap_or_else(|| format!("#{at}"))
    }

    fn status(&self) -> &str {
        self.status.as_deref().unwrap_or("UNKNOWN")
    }

    /// Its service and record, or why rota cannot use it (the message names it).
    fn record(self, app: &App, id: &str) -> Result<(String, InstanceRecord), String> {
        self.build(app, id)
            .map_err(|problem| format!("application {} instance {}: {problem}", truncate(&app.name), truncate(id)))
    }

    fn build(self, app: &App, id: &str) -> Result<(String, InstanceRecord), String> {
        let service = app.name.to_ascii_lowercase();
        if let Err(invalid) = validate_service_name("the application's name", &service) {
            return Err(invalid.to_string());
        }
        if id.len() > MAX_NAME_LEN {
            return Err(format!("the id is {} bytes long; the limit is {MAX_NAME_LEN}", id.len()));
        }
        let host = self.host_name.filter(|h| !h.is_empty()).or(self.ip_addr).unwrap_or_default();
        if host.is_empty() {
            return Err("neither hostName nor ipAddr".into());
        }
        if host.len() > MAX_NAME_LEN {
            return Err(format!("the host is {} bytes long; the limit is {MAX_NAME_LEN}", host.len()));
        }
        let port = self.port.or(self.secure_port).ok_or("no enabled port")?;
        let metadata = self.metadata.unwrap_or_else(|| Ok(BTreeMap::new()))?;
        let weight = match metadata.get("weight") {
            None => DEFAULT_WEIGHT,
            Some(w) => {
                w.parse().map_err(|_| format!("metadata.weight is {:?}; expected a whole number", truncate(w)))?
            }
        };
        let status = match self.status.as_deref().unwrap_or("UNKNOWN") {
            "UP" => Status::Up,
            "OUT_OF_SERVICE" => Status::Draining,
            _ => Status::Down,
        };
        let record = InstanceRecord {
            id: id.to_owned(),
            host,
            port,
            version: metadata.get("version").cloned().unwrap_or_default(),
            zone: metadata.get("zone").cloned().unwrap_or_default(),
            weight,
            metadata,
            status: status.as_str().to_owned(),
            ..Default::default()
        };
        Ok((service, record))
    }
}

// The document's parts, read by hand so that nothing is kept but what rota uses: serde's
// `untagged` enums and `serde_json::Value` would buffer every value they meet.

/// Visitor methods that take any scalar or list, skipping it, as `Default`.
macro_rules! skip_other_values {
    () => {
        skip_other_values!(scalars);
        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
            Visitor::visit_seq(IgnoredAny, seq)?;
            Ok(Default::default())
        }
    };
    (scalars) => {
        fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(Default::default())
        }
    };
}

/// A scalar as text (a string, a number, a boolean); `None` for anything else.
#[derive(Default)]
struct Text(Option<String>);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(TextVisitor)
    }
}

struct TextVisitor;

impl<'de> Visitor<'de> for TextVisitor {
    type Value = Text;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Text, E> {
        Ok(Text(Some(v.to_owned())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Text, E> {
        Ok(Text(Some(v)))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Text, E> {
        Ok(Text(Some(v.to_string())))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Text, E> {
        Ok(Text(Some(v.to_string())))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Text, E> {
        Ok(Text(Some(v.to_string())))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Text, E> {
        Ok(Text(serde_json::Number::from_f64(v).map(|n| n.to_string())))
    }
    fn visit_unit<E: de::Error>(self) -> Result<Text, E> {
        Ok(Text(None))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Text, A::Error> {
        Visitor::visit_seq(IgnoredAny, seq)?;
        Ok(Text(None))
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Text, A::Error> {
        Visitor::visit_map(IgnoredAny, map)?;
        Ok(Text(None))
    }
}

/// `{"$": 8080, "@enabled": "true"}`: the port, if enabled.
#[derive(Default)]
struct Port(Option<u16>);

impl<'de> Deserialize<'de> for Port {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(PortVisitor)
    }
}

struct PortVisitor;

impl<'de> Visitor<'de> for PortVisitor {
    type Value = Port;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a port")
    }
    skip_other_values!();
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Port, A::Error> {
        let (mut number, mut enabled) = (None, true);
        while let Some(key) = map.next_key::<PortField>()? {
            match key {
                PortField::Number => number = map.next_value::<Text>()?.0.and_then(|n| n.parse::<u16>().ok()),
                PortField::Enabled => enabled = map.next_value::<Text>()?.0.as_deref() == Some("true"),
                PortField::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Port(number.filter(|_| enabled)))
    }
}

#[derive(Deserialize)]
#[serde(field_identifier)]
enum PortField {
    #[serde(rename = "$")]
    Number,
    #[serde(rename = "@enabled")]
    Enabled,
    #[serde(other)]
    Other,
}

/// An instance's metadata, bar Eureka's own `@` entries, each value as a string (anything but
/// a string as its JSON); refused past rota's limits on metadata, which are checked as it is
/// read. Anything but an object is no metadata.
#[derive(Default)]
struct Metadata(Option<Result<BTreeMap<String, String>, String>>);

impl<'de> Deserialize<'de> for Metadata {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(MetadataVisitor)
    }
}

struct MetadataVisitor;

impl<'de> Visitor<'de> for MetadataVisitor {
    type Value = Metadata;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("metadata")
    }
    skip_other_values!();
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Metadata, A::Error> {
        let mut entries = BTreeMap::new();
        let mut problem = None;
        let mut count = 0usize;
        while let Some(key) = map.next_key::<String>()? {
            if key.starts_with('@') || problem.is_some() {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            count += 1;
            if count > MAX_METADATA_ENTRIES {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            if key.len() > MAX_METADATA_KEY_LEN {
                map.next_value::<IgnoredAny>()?;
                problem = Some(format!(
                    "metadata key {:?} is {} bytes long; the limit is {MAX_METADATA_KEY_LEN}",
                    truncate(&key),
                    key.len()
                ));
                continue;
            }
            let raw: &RawValue = map.next_value()?;
            let text = raw.get();
            // A string's text is never shorter than its value (JSON escapes at most six bytes
            // per character): only one that may fit is decoded.
            let value = if text.len() > 6 * MAX_METADATA_VALUE_LEN + 2 {
                None
            } else if text.starts_with('"') {
                Some(serde_json::from_str::<String>(text).map_err(de::Error::custom)?)
            } else {
                Some(text.to_owned())
            };
            match value.filter(|v| v.len() <= MAX_METADATA_VALUE_LEN) {
                Some(value) => {
                    entries.insert(key, value);
                }
                None => {
                    problem = Some(format!(
                        "metadata value of {:?} is longer than {MAX_METADATA_VALUE_LEN} bytes",
                        truncate(&key)
                    ));
                }
            }
        }
        if count > MAX_METADATA_ENTRIES {
            return Ok(Metadata(Some(Err(format!(
                "metadata has {count} entries; the limit is {MAX_METADATA_ENTRIES}"
            )))));
        }
        Ok(Metadata(Some(problem.map_or(Ok(entries), Err))))
    }
}

/// One instance: the fields rota reads (when `whole`, else only its id and status).
struct InstanceSeed {
    whole: bool,
}

impl<'de> DeserializeSeed<'de> for InstanceSeed {
    type Value = Instance;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Instance, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for InstanceSeed {
    type Value = Instance;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an instance")
    }
    skip_other_values!();
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Instance, A::Error> {
        let mut instance = Instance::default();
        while let Some(field) = map.next_key::<InstanceField>()? {
            match field {
                InstanceField::InstanceId => instance.instance_id = map.next_value::<Text>()?.0,
                InstanceField::HostName => instance.host_name = map.next_value::<Text>()?.0,
                InstanceField::Status => instance.status = map.next_value::<Text>()?.0,
                InstanceField::ActionType => instance.action = map.next_value::<Text>()?.0,
                InstanceField::IpAddr if self.whole => instance.ip_addr = map.next_value::<Text>()?.0,
                InstanceField::Port if self.whole => instance.port = map.next_value::<Port>()?.0,
                InstanceField::SecurePort if self.whole => instance.secure_port = map.next_value::<Port>()?.0,
                InstanceField::Metadata if self.whole => instance.metadata = map.next_value::<Metadata>()?.0,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(instance)
    }
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "camelCase")]
enum InstanceField {
    InstanceId,
    HostName,
    IpAddr,
    Status,
    ActionType,
    Port,
    SecurePort,
    Metadata,
    #[serde(other)]
    Other,
}

/// An application's instances: a list, or (Eureka's JSON writes a list of one so in some
/// versions) the instance alone; each handed to the sink as it is read.
struct Instances<'a, S> {
    sink: &'a mut S,
    app: &'a App,
}

impl<'de, S: Sink> DeserializeSeed<'de> for Instances<'_, S> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<S: Sink> Instances<'_, S> {
    /// Something that is not an instance, in the place of one: an instance without fields.
    fn one_empty(self) {
        self.sink.put(self.app, 0, Instance::default());
    }
}

impl<'de, S: Sink> Visitor<'de> for Instances<'_, S> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("instances")
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.one_empty();
        Ok(())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.one_empty();
        Ok(())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.one_empty();
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.one_empty();
        Ok(())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.one_empty();
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let whole = self.app.whole;
        let mut at = 0;
        while let Some(instance) = seq.next_element_seed(InstanceSeed { whole })? {
            self.sink.put(self.app, at, instance);
            at += 1;
        }
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        let instance = InstanceSeed { whole: self.app.whole }.visit_map(map)?;
        self.sink.put(self.app, 0, instance);
        Ok(())
    }
}

/// One application: its name, then its instances. Instances written before the name are
/// kept as the text they are (a slice of the answer, not a copy) until the name is read.
struct Application<'a, S> {
    sink: &'a mut S,
}

impl<'de, S: Sink> DeserializeSeed<'de> for Application<'_, S> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de, S: Sink> Visitor<'de> for Application<'_, S> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an application")
    }
    skip_other_values!();
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut app: Option<App> = None;
        let mut early: Vec<&'de RawValue> = Vec::new();
        while let Some(field) = map.next_key::<ApplicationField>()? {
            match field {
                ApplicationField::Name => {
                    if let Some(name) = map.next_value::<Text>()?.0 {
                        app = Some(self.sink.app(name));
                    }
                }
                ApplicationField::Instance => match &app {
                    Some(app) => map.next_value_seed(Instances { sink: &mut *self.sink, app })?,
                    None => early.push(map.next_value()?),
                },
                ApplicationField::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        match app {
            Some(app) => {
                for raw in early {
                    let mut de = serde_json::Deserializer::from_str(raw.get());
                    Instances { sink: &mut *self.sink, app: &app }.deserialize(&mut de).map_err(de::Error::custom)?;
                }
            }
            None => {
                if early.iter().any(|raw| !matches!(raw.get().trim(), "null" | "[]")) {
                    self.sink.nameless();
                }
            }
        }
        Ok(())
    }
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum ApplicationField {
    Name,
    Instance,
    #[serde(other)]
    Other,
}

/// The applications: a list, or one alone.
struct ApplicationList<'a, S> {
    sink: &'a mut S,
}

impl<'de, S: Sink> DeserializeSeed<'de> for ApplicationList<'_, S> {
    type Value = ();

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de, S: Sink> Visitor<'de> for ApplicationList<'_, S> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("applications")
    }
    skip_other_values!(scalars);
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Application { sink: &mut *self.sink })?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        Application { sink: self.sink }.visit_map(map)
    }
}

/// `{"applications": {"apps__hashcode": …, "application": […]}}`: the hash code.
struct Document<'a, S> {
    sink: &'a mut S,
}

impl<'de, S: Sink> DeserializeSeed<'de> for Document<'_, S> {
    type Value = String;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<String, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de, S: Sink> Visitor<'de> for Document<'_, S> {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an applications document")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<String, A::Error> {
        let mut hash = None;
        while let Some(key) = map.next_key::<DocumentField>()? {
            match key {
                DocumentField::Applications => {
                    hash = Some(map.next_value_seed(Applications { sink: &mut *self.sink })?);
                }
                DocumentField::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        hash.ok_or_else(|| de::Error::missing_field("applications"))
    }
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum DocumentField {
    Applications,
    #[serde(other)]
    Other,
}

struct Applications<'a, S> {
    sink: &'a mut S,
}

impl<'de, S: Sink> DeserializeSeed<'de> for Applications<'_, S> {
    type Value = String;

    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<String, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de, S: Sink> Visitor<'de> for Applications<'_, S> {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("applications")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<String, A::Error> {
        let mut hash = String::new();
        while let Some(key) = map.next_key::<ApplicationsField>()? {
            match key {
                ApplicationsField::HashCode => hash = map.next_value::<Text>()?.0.unwrap_or_default(),
                ApplicationsField::Application => map.next_value_seed(ApplicationList { sink: &mut *self.sink })?,
                ApplicationsField::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(hash)
    }
}

#[derive(Deserialize)]
#[serde(field_identifier)]
enum ApplicationsField {
    #[serde(rename = "apps__hashcode")]
    HashCode,
    #[serde(rename = "application")]
    Application,
    #[serde(other)]
    Other,
}

#[cfg(test)]
mod tests;
