//! Following a key prefix of etcd, through etcd's JSON gateway (`/v3/…` on the client port).
//!
//! `etcd://HOST:PORT/PREFIX` follows every key under `PREFIX/`: the first read (and the first
//! after any failure) is a range over the prefix (`POST /v3/kv/range`), whose `header.revision`
//! starts a watch (`POST /v3/watch`, `start_revision` = that revision + 1). Each later
//! [`Follow::next`] waits for the watch's next answer, applies it and every answer already
//! arrived behind it (a burst of puts is one listing) to the local copy, and returns the copy.
//!
//! - Key `PREFIX/SERVICE/ID` is the instance `ID` of service `SERVICE` (the first segment after
//!   the prefix; the id is the rest, `/` and all). This covers grpc-go's `naming/endpoints`
//!   (`TARGET/KEY`, with the URL's prefix the target's parent) and go-zero's `core/discov`
//!   (`KEY/LEASEID`, with the URL's prefix the keys' parent).
//! - Value: grpc-go's `{"Op":0,"Addr":"HOST:PORT","Metadata":{…}}` (`Metadata.version`, `.zone`
//!   and `.weight` become rota's fields, the rest of it metadata, stringified), or go-zero's
//!   plain `HOST:PORT`. Anything else is a malformed entry, refused alone.
//! - The key's lease, when it has one, is in the metadata as `etcd.lease` (decimal): when the
//!   registrant stops renewing it, etcd deletes the key and the instance leaves rota, as with
//!   any delete (held back by the follower when it removes more than `protect_threshold` of
//!   the service, and applied when `protect_for` runs out, the watch silent or not).
//! - A watch that etcd cancels (a compaction past the revision it started from answers
//!   `canceled` with `compact_revision`), ends, or breaks, and a connection error, fail the
//!   read: the source is stale with its last listing, and the next read is a range again.
//! - A watch is silent while nothing changes (it asks for etcd's progress notifications, every
//!   10 minutes on etcd's default). So that a server that went away without closing the
//!   connection is noticed, the prefix is counted (a range with `count_only`, bounded by
//!   `timeout`) each `interval` the watch stays silent; a failed count fails the read.
//! - Bounds: one range answer and one watch line are at most `max_bytes`; at most
//!   `max_instances` keys are read and held (the keys past that are one refusal saying how
//!   many, and are read by the next range once there is room).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures_util::FutureExt;
use serde_json::{Value, json};
use tokio::time::Instant;

use super::http::{self, Endpoint, Lines};
use super::{Follow, Listing, SourceError, SourceSpec};
use crate::registry::{DEFAULT_WEIGHT, InstanceRecord, Status};

/// Watch answers applied in one listing at most (the rest wait for the next).
const BATCH: usize = 4096;

/// One etcd prefix, as rota last read it.
pub struct Etcd {
    endpoint: Endpoint,
    /// The keys' prefix, with its trailing `/` (empty: every key).
    prefix: String,
    interval: Duration,
    timeout: Duration,
    max_bytes: usize,
    max_instances: usize,
    /// `None` until a range was read (and again after a failure).
    state: Option<State>,
}

struct State {
    keys: Keys,
    /// The revision the copy is at.
    revision: i64,
    watch: Lines,
    /// Keys the last range left out for want of room.
    left_out: usize,
    /// Keys the watch put since, left out for want of room (at most `max_instances` of them
    /// remembered; the rest counted in `left_out`). A range reads them once there is room.
    skipped: BTreeSet<Vec<u8>>,
    /// Why the watch cannot go on, seen while a batch was read: the next read fails with it.
    broken: Option<SourceError>,
}

/// One key, read: its service and instance, or why rota cannot use it.
pub type Entry = Result<(String, InstanceRecord), String>;
/// By key (bytes as etcd has them), each key read.
pub type Keys = BTreeMap<Vec<u8>, Entry>;

impl Etcd {
    pub fn new(endpoint: Endpoint, prefix: &str, spec: &SourceSpec) -> Self {
        let prefix = if prefix.is_empty() { String::new() } else { format!("{}/", prefix.trim_end_matches('/')) };
        Self {
            endpoint,
            prefix,
            interval: spec.interval,
            timeout: spec.timeout,
            max_bytes: spec.max_bytes,
            max_instances: spec.max_instances,
            state: None,
        }
    }

    /// The `key` and `range_end` of the prefix, base64 as the gateway takes them.
    fn range(&self) -> (String, String) {
        let (key, end) = prefix_range(self.prefix.as_bytes());
        (base64_encode(&key), base64_encode(&end))
    }

    async fn full(&mut self) -> Result<(), SourceError> {
        let (key, range_end) = self.range();
        // One more than the limit, to tell "exactly full" from "more".
        let body = json!({"key": key, "range_end": range_end, "limit": self.max_instances + 1}).to_string();
        let answer = http::post(&self.endpoint, "/v3/kv/range", body, self.timeout, self.max_bytes).await?;
        let (prefix, max_instances) = (self.prefix.clone(), self.max_instances);
        let (keys, revision, left_out) =
            tokio::task::spawn_blocking(move || parse_range(&answer, &prefix, max_instances))
                .await
                .map_err(|e| SourceError::new(format!("parsing /v3/kv/range: {e}")))?
                .map_err(|e| SourceError::new(format!("/v3/kv/range: {e}")))?;
        let create = json!({"create_request": {
            "key": key, "range_end": range_end, "start_revision": revision.saturating_add(1).to_string(),
            "progress_notify": true,
        }});
        let mut watch =
            http::post_stream(&self.endpoint, "/v3/watch", create.to_string(), self.timeout, self.max_bytes).await?;
        // The watch is there once etcd says it was created.
        let first = tokio::time::timeout(self.timeout, watch.next_line())
            .await
            .map_err(|_| SourceError::new("POST /v3/watch: the watch was not created within the timeout"))??
            .ok_or_else(|| SourceError::new("POST /v3/watch: etcd ended the answer before creating the watch"))?;
        match parse_watch(&first, &self.prefix).map_err(|e| SourceError::new(format!("/v3/watch: {e}")))? {
            WatchAnswer::Created => {}
            WatchAnswer::Ended(why) => return Err(SourceError::new(why)),
            WatchAnswer::Events { .. } => {
                return Err(SourceError::new("/v3/watch: events before etcd said the watch was created"));
            }
        }
        self.state = Some(State { keys, revision, watch, left_out, skipped: BTreeSet::new(), broken: None });
        Ok(())
    }

    /// Waits for the watch's next answers and applies them; false when a range is due instead.
    async fn follow(&mut self) -> Result<bool, SourceError> {
        let (prefix, max_instances) = (self.prefix.clone(), self.max_instances);
        let state = self.state.as_mut().expect("a watch");
        if let Some(error) = state.broken.take() {
            return Err(error);
        }
        let mut lines = Vec::new();
        let mut probe_at = Instant::now() + self.interval;
        loop {
            tokio::select! {
                line = state.watch.next_line() => {
                    lines.push(line?.ok_or_else(ended)?);
                    break;
                }
                () = tokio::time::sleep_until(probe_at) => {
                    probe(&self.endpoint, &prefix, self.timeout, self.max_bytes).await?;
                    probe_at = Instant::now() + self.interval;
                }
            }
        }
        // Whatever already arrived behind it goes in the same listing (the connection's task
        // is let run once first, to hand over what it has read).
        tokio::task::yield_now().await;
        while lines.len() < BATCH {
            match state.watch.next_line().now_or_never() {
                None => break,
                Some(Ok(Some(line))) => lines.push(line),
                Some(Ok(None)) => {
                    state.broken = Some(ended());
                    break;
                }
                Some(Err(error)) => {
                    state.broken = Some(error);
                    break;
                }
            }
        }
        let parsing = prefix.clone();
        let answers = tokio::task::spawn_blocking(move || {
            lines.iter().map(|line| parse_watch(line, &parsing)).collect::<Vec<_>>()
        })
        .await
        .map_err(|e| SourceError::new(format!("parsing /v3/watch: {e}")))?;
        for answer in answers {
            match answer.map_err(|e| SourceError::new(format!("/v3/watch: {e}")))? {
                WatchAnswer::Created => {}
                WatchAnswer::Ended(why) => return Err(SourceError::new(why)),
                WatchAnswer::Events { revision, events } => {
                    for event in events {
                        match event {
                            Event::Delete(key) => {
                                state.keys.remove(&key);
                                state.skipped.remove(&key);
                            }
                            Event::Put(key, entry) => {
                                if state.keys.contains_key(&key) || state.keys.len() < max_instances {
                                    state.keys.insert(key, *entry);
                                } else if state.skipped.len() < max_instances {
                                    state.skipped.insert(key);
                                } else if !state.skipped.contains(&key) {
                                    state.left_out += 1;
                                }
                            }
                        }
                    }
                    state.revision = state.revision.max(revision);
                }
            }
        }
        // Keys were left out and there is room now: read them with a range.
        let left_out = state.left_out + state.skipped.len();
        Ok(!(left_out > 0 && state.keys.len() < max_instances))
    }

    fn listing(&self) -> Listing {
        let mut listing = Listing::default();
        let Some(state) = &self.state else { return listing };
        for entry in state.keys.values() {
            match entry {
                Ok((service, record)) => listing.services.entry(service.clone()).or_default().push(record.clone()),
                Err(problem) => listing.malformed.push(problem.clone()),
            }
        }
        let left_out = state.left_out + state.skipped.len();
        if left_out > 0 {
            listing.malformed.push(format!(
                "{left_out} keys under {:?} left out: the source's max_instances is {}",
                self.prefix, self.max_instances
            ));
        }
        listing
    }
}

fn ended() -> SourceError {
    SourceError::new("/v3/watch: etcd ended the watch")
}

impl Follow for Etcd {
    async fn next(&mut self) -> Result<Listing, SourceError> {
        if self.state.is_none() || !self.follow().await? {
            self.state = None;
            self.full().await?;
        }
        Ok(self.listing())
    }

    fn reset(&mut self) {
        self.state = None;
    }
}

/// Counts the prefix: etcd answers, or the read fails.
async fn probe(endpoint: &Endpoint, prefix: &str, timeout: Duration, max_bytes: usize) -> Result<(), SourceError> {
    let (key, end) = prefix_range(prefix.as_bytes());
    let body = json!({"key": base64_encode(&key), "range_end": base64_encode(&end), "count_only": true}).to_string();
    let answer = http::post(endpoint, "/v3/kv/range", body, timeout, max_bytes).await?;
    let value: Value =
        serde_json::from_slice(&answer).map_err(|e| SourceError::new(format!("/v3/kv/range: not JSON: {e}")))?;
    if value.get("header").is_none() {
        return Err(SourceError::new(format!("/v3/kv/range: an answer without a header: {}", excerpt(&answer))));
    }
    Ok(())
}

/// The range of every key starting with `prefix`: (`key`, `range_end`). An empty prefix is
/// every key (`"\0"` to `"\0"`).
pub fn prefix_range(prefix: &[u8]) -> (Vec<u8>, Vec<u8>) {
    if prefix.is_empty() {
        return (vec![0], vec![0]);
    }
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return (prefix.to_vec(), end);
        }
    }
    // All 0xff: every key from the prefix on.
    (prefix.to_vec(), vec![0])
}

/// A range answer: the keys read, the revision, and how many keys were left out.
pub fn parse_range(body: &[u8], prefix: &str, max_instances: usize) -> Result<(Keys, i64, usize), String> {
    let value: Value = serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
    if let Some(error) = error_message(&value) {
        return Err(error);
    }
    let header = value.get("header").ok_or_else(|| format!("an answer without a header: {}", excerpt(body)))?;
    let revision = int(header.get("revision")).ok_or("the header has no revision")?;
    let mut keys = BTreeMap::new();
    let kvs = match value.get("kvs") {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(kvs)) => kvs.as_slice(),
        Some(_) => return Err("kvs is not a list".into()),
    };
    for kv in kvs.iter().take(max_instances) {
        let (key, entry) = read_kv(kv, prefix)?;
        keys.insert(key, entry);
    }
    let count = int(value.get("count")).and_then(|c| usize::try_from(c).ok()).unwrap_or(kvs.len());
    let left_out = count.max(kvs.len()).saturating_sub(keys.len());
    Ok((keys, revision, left_out))
}

/// One answer of the watch.
#[derive(Debug, PartialEq)]
pub enum WatchAnswer {
    Created,
    /// Events (or none: a progress notification) up to `revision`.
    Events {
        revision: i64,
        events: Vec<Event>,
    },
    /// The watch cannot go on: why.
    Ended(String),
}

#[derive(Debug, PartialEq)]
pub enum Event {
    Put(Vec<u8>, Box<Entry>),
    Delete(Vec<u8>),
}

pub fn parse_watch(line: &[u8], prefix: &str) -> Result<WatchAnswer, String> {
    let value: Value = serde_json::from_slice(line).map_err(|e| format!("not JSON: {e}: {}", excerpt(line)))?;
    if let Some(error) = error_message(&value) {
        return Ok(WatchAnswer::Ended(format!("/v3/watch: etcd ended the watch: {error}")));
    }
    let result = value.get("result").ok_or_else(|| format!("an answer without a result: {}", excerpt(line)))?;
    if result.get("canceled").and_then(Value::as_bool) == Some(true) {
        let why = match int(result.get("compact_revision")).filter(|r| *r > 0) {
            Some(compacted) => format!(
                "/v3/watch: etcd canceled the watch: the store is compacted to revision {compacted}, past the \
                 watch's start; reading the prefix again"
            ),
            None => {
                let reason = result.get("cancel_reason").and_then(Value::as_str).unwrap_or("no reason given");
                format!("/v3/watch: etcd canceled the watch: {reason}")
            }
        };
        return Ok(WatchAnswer::Ended(why));
    }
    if result.get("created").and_then(Value::as_bool) == Some(true) {
        return Ok(WatchAnswer::Created);
    }
    let revision = result.get("header").and_then(|h| int(h.get("revision"))).unwrap_or(0);
    let mut events = Vec::new();
    match result.get("events") {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) => {
            for event in list {
                let kv = event.get("kv").ok_or("an event without kv")?;
                match event.get("type").and_then(Value::as_str) {
                    None | Some("PUT") => {
                        let (key, entry) = read_kv(kv, prefix)?;
                        events.push(Event::Put(key, Box::new(entry)));
                    }
                    Some("DELETE") => events.push(Event::Delete(key_of(kv)?)),
                    Some(other) => return Err(format!("an event of type {other:?}")),
                }
            }
        }
        Some(_) => return Err("events is not a list".into()),
    }
    Ok(WatchAnswer::Events { revision, events })
}

/// The gateway's error answer (`{"error": …}` or `{"code": …, "message": …}`), if it is one.
fn error_message(value: &Value) -> Option<String> {
    let error = value.get("error").unwrap_or(value);
    let message = error.get("message").and_then(Value::as_str)?;
    Some(message.to_owned())
}

/// An int64 as the gateway writes it (a string), or a number.
fn int(value: Option<&Value>) -> Option<i64> {
    match value? {
        Value::String(s) => s.parse().ok(),
        Value::Number(n) => n.as_i64(),
        _ => None,
    }
}

fn key_of(kv: &Value) -> Result<Vec<u8>, String> {
    let key = kv.get("key").and_then(Value::as_str).ok_or("a key-value without a key")?;
    base64_decode(key).ok_or_else(|| format!("the key {key:?} is not base64"))
}

/// One key-value: its key, and what rota makes of it.
fn read_kv(kv: &Value, prefix: &str) -> Result<(Vec<u8>, Entry), String> {
    let key = key_of(kv)?;
    let value = match kv.get("value").and_then(Value::as_str) {
        None => Vec::new(),
        Some(text) => match base64_decode(text) {
            Some(value) => value,
            None => {
                let problem = format!("key {}: the value is not base64", show(&key));
                return Ok((key, Err(problem)));
            }
        },
    };
    let lease = int(kv.get("lease")).filter(|l| *l != 0);
    let entry = entry(&key, &value, lease, prefix);
    Ok((key, entry))
}

fn show(key: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(key))
}

/// What rota makes of key `key` with value `value` (under `prefix`) and lease `lease`.
pub fn entry(key: &[u8], value: &[u8], lease: Option<i64>, prefix: &str) -> Entry {
    let name = std::str::from_utf8(key).map_err(|_| format!("key {}: not UTF-8", show(key)))?;
    let rest = name.strip_prefix(prefix).ok_or_else(|| format!("key {name:?}: not under {prefix:?}"))?;
    let (service, id) = rest
        .split_once('/')
        .filter(|(s, i)| !s.is_empty() && !i.is_empty())
        .ok_or_else(|| format!("key {name:?}: expected {prefix}SERVICE/ID"))?;
    let bad = |problem: String| format!("key {name:?}: {problem}");
    let text = std::str::from_utf8(value).map_err(|_| bad("the value is not UTF-8".into()))?.trim();
    let mut metadata = BTreeMap::new();
    let (addr, version, zone, weight) = if text.starts_with('{') {
        let value: Value = serde_json::from_str(text).map_err(|e| bad(format!("the value is not JSON: {e}")))?;
        match value.get("Op") {
            None => {}
            Some(op) if op.as_u64() == Some(0) => {}
            Some(op) => return Err(bad(format!("the value's Op is {op}; expected 0 (an endpoint added)"))),
        }
        let addr = value.get("Addr").and_then(Value::as_str).ok_or_else(|| bad("the value has no Addr".into()))?;
        let (mut version, mut zone, mut weight) = (String::new(), String::new(), DEFAULT_WEIGHT);
        match value.get("Metadata") {
            None | Some(Value::Null) => {}
            Some(Value::Object(map)) => {
                for (field, item) in map {
                    let text = match item {
                        Value::String(s) => s.clone(),
                        other => other.to_string(),
                    };
                    match field.as_str() {
                        "version" => version = text,
                        "zone" => zone = text,
                        "weight" => {
                            weight = text
                                .parse()
                                .map_err(|_| bad(format!("Metadata.weight is {text}; expected a whole number")))?
                        }
                        _ => {
                            metadata.insert(field.clone(), text);
                        }
                    }
                }
            }
            Some(other) => {
                metadata.insert("metadata".to_owned(), other.to_string());
            }
        }
        (addr.to_owned(), version, zone, weight)
    } else {
        (text.to_owned(), String::new(), String::new(), DEFAULT_WEIGHT)
    };
    let (host, port) =
        host_port(&addr).ok_or_else(|| bad(format!("the address {addr:?} is not HOST:PORT or [IPV6]:PORT")))?;
    if let Some(lease) = lease {
        metadata.insert("etcd.lease".to_owned(), lease.to_string());
    }
    Ok((
        service.to_owned(),
        InstanceRecord {
            id: id.to_owned(),
            host,
            port,
            version,
            zone,
            weight,
            metadata,
            status: Status::Up.as_str().to_owned(),
            ..Default::default()
        },
    ))
}

/// `HOST:PORT` or `[IPV6]:PORT`.
fn host_port(addr: &str) -> Option<(String, u16)> {
    let (host, port) = match addr.strip_prefix('[') {
        Some(bracketed) => bracketed.split_once("]:")?,
        None => {
            let (host, port) = addr.rsplit_once(':')?;
            if host.contains(':') {
                return None;
            }
            (host, port)
        }
    };
    if host.is_empty() || host.contains(|c: char| c.is_whitespace() || c == '/') {
        return None;
    }
    Some((host.to_owned(), port.parse().ok()?))
}

fn excerpt(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).into_owned();
    if bytes.len() > 200 { format!("{text}…") } else { text }
}

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding, as etcd's gateway writes bytes.
pub fn base64_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = (u32::from(chunk[0]) << 16)
            | (u32::from(*chunk.get(1).unwrap_or(&0)) << 8)
            | u32::from(*chunk.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Standard base64, padded or not; `None` for anything else.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let digits = text.trim_end_matches('=').as_bytes();
    if text.len() - digits.len() > 2 || digits.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(digits.len() * 3 / 4);
    let (mut acc, mut bits) = (0u32, 0u32);
    for &c in digits {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests;
