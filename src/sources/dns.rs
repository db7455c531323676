//! Following a DNS name: `dns+srv://_grpc._tcp.NAME` (SRV records, each target's addresses)
//! or `dns://NAME:PORT` (its A and AAAA records, at one port). This is how a Kubernetes
//! headless Service is followed: its SRV or A records list one address per ready pod.
//!
//! - The name is asked again when the shortest TTL among the records used runs out, bounded
//!   below by `min_interval` and above by `interval`.
//! - Each address is one instance, id `ADDRESS:PORT`. For SRV, records of the lowest priority
//!   are UP and the others (backups) are listed DOWN; the SRV weight is rota's weight (0 reads
//!   as 1), and the target's name is kept in the metadata (`dns.target`).
//! - A name that does not exist (NXDOMAIN) or has no records is an empty listing (its removal
//!   waits `protect_for` like any large one); a server that fails, refuses or does not answer
//!   within `timeout` leaves the source stale with its last listing.
//! - What is held is bounded, not only what is applied: an SRV answer's records times their
//!   targets' addresses stop at `max_instances` (the rest are counted, never built), and one
//!   read looks up the addresses of at most [`TARGET_LOOKUPS_PER_READ`] targets the answer did
//!   not carry them for (more fails the read, with the source stale): a hostile answer cannot
//!   make rota hold millions of instances nor ask its resolver thousands of questions a second.
//! - Queries go to the `resolver` the source names (`HOST:PORT`), else to the first
//!   `nameserver` of `/etc/resolv.conf`; over UDP, and again over TCP when the answer is
//!   truncated. An answer must come from that server and match the question and its id.

pub mod wire;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::time::Instant;

use super::{Follow, Listing, SourceError, SourceSpec};
use crate::registry::{InstanceRecord, Status};
use wire::{Data, Rcode, Record};

/// What a DNS source asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Question {
    /// SRV records of the name (`_grpc._tcp.NAME`).
    Srv(String),
    /// A and AAAA records of the name, at a port.
    Addresses(String, u16),
}

/// Where queries go when a source names no resolver.
const RESOLV_CONF: &str = "/etc/resolv.conf";
/// SRV targets resolved at once when the answer did not carry their addresses.
const TARGET_LOOKUPS: usize = 16;
/// SRV targets one read may look up (two questions each): a name whose answer carries no
/// addresses for more fails the read rather than multiply its questions.
pub const TARGET_LOOKUPS_PER_READ: usize = 64;
/// Largest answer read over TCP.
const MAX_TCP_ANSWER: usize = 65_535;

pub struct Dns {
    question: Question,
    service: String,
    resolver: Option<SocketAddr>,
    timeout: Duration,
    min_interval: Duration,
    max_interval: Duration,
    max_instances: usize,
    due: Option<Instant>,
}

/// Sends one source's questions.
#[derive(Clone, Copy)]
struct Asker {
    resolver: SocketAddr,
    timeout: Duration,
}

impl Dns {
    pub fn new(question: Question, resolver: Option<SocketAddr>, spec: &SourceSpec) -> Self {
        let service = spec.services.iter().flatten().next().cloned().unwrap_or_default();
        Self {
            question,
            service,
            resolver,
            timeout: spec.timeout,
            min_interval: spec.min_interval,
            max_interval: spec.interval,
            max_instances: spec.max_instances,
            due: None,
        }
    }

    async fn resolver(&mut self) -> Result<SocketAddr, SourceError> {
        if let Some(resolver) = self.resolver {
            return Ok(resolver);
        }
        let unreadable = |e: &dyn std::fmt::Display| {
            SourceError::new(format!("no resolver named, and {RESOLV_CONF} cannot be read: {e}"))
        };
        let conf =
            tokio::task::spawn_blocking(|| crate::config::files::read_to_string(std::path::Path::new(RESOLV_CONF)))
                .await
                .map_err(|e| unreadable(&e))?
                .map_err(|e| unreadable(&e))?;
        let found = conf
            .lines()
            .filter_map(|line| line.trim().strip_prefix("nameserver"))
            .find_map(|rest| rest.trim().parse::<IpAddr>().ok())
            .ok_or_else(|| SourceError::new(format!("no resolver named, and {RESOLV_CONF} names no nameserver")))?;
        let resolver = SocketAddr::new(found, 53);
        self.resolver = Some(resolver);
        Ok(resolver)
    }

    async fn read(&mut self) -> Result<(Listing, Option<u32>), SourceError> {
        let asker = Asker { resolver: self.resolver().await?, timeout: self.timeout };
        let mut capped = Capped::new(self.max_instances);
        let ttl = match self.question.clone() {
            Question::Addresses(name, port) => {
                let (addresses, ttl) = asker.addresses(&name).await?;
                for ip in addresses {
                    capped.push(1, || instance(ip, port, 100, Status::Up, None));
                }
                ttl
            }
            Question::Srv(name) => {
                let (answers, additional) = asker.ask(&name, wire::TYPE_SRV).await?;
                let mut ttl = answers.iter().map(|r| r.ttl).min();
                let srvs: Vec<(u16, u16, u16, String)> = answers
                    .into_iter()
                    .filter_map(|r| match r.data {
                        Data::Srv { priority, weight, port, target } => Some((priority, weight, port, target)),
                        _ => None,
                    })
                    .take(self.max_instances)
                    .collect();
                let lowest = srvs.iter().map(|s| s.0).min();
                let mut known: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();
                for record in additional {
                    if let Data::Address(ip) = record.data {
                        ttl = Some(ttl.map_or(record.ttl, |t| t.min(record.ttl)));
                        known.entry(record.name).or_default().push(ip);
                    }
                }
                let missing: Vec<String> = {
                    let mut names: Vec<String> =
                        srvs.iter().map(|s| s.3.clone()).filter(|t| !known.contains_key(t)).collect();
                    names.sort();
                    names.dedup();
                    names
                };
                if missing.len() > TARGET_LOOKUPS_PER_READ {
                    return Err(SourceError::new(format!(
                        "{name}: the answer names {} targets without their addresses; rota looks up at most \
                         {TARGET_LOOKUPS_PER_READ} per read (a server that puts the targets' A/AAAA records in \
                         the answer's additional section needs none)",
                        missing.len()
                    )));
                }
                for chunk in missing.chunks(TARGET_LOOKUPS) {
                    let mut lookups = Vec::with_capacity(chunk.len());
                    for target in chunk {
                        let target = target.clone();
                        lookups.push(async move {
                            let found = asker.addresses(&target).await;
                            (target, found)
                        });
                    }
                    for (target, found) in futures_util::future::join_all(lookups).await {
                        let (addresses, found_ttl) = found?;
                        if let Some(found_ttl) = found_ttl {
                            ttl = Some(ttl.map_or(found_ttl, |t| t.min(found_ttl)));
                        }
                        known.insert(target, addresses);
                    }
                }
                for (priority, weight, port, target) in srvs {
                    let status = if Some(priority) == lowest { Status::Up } else { Status::Down };
                    let addresses = known.get(&target).map_or(&[][..], Vec::as_slice);
                    let mut ips = addresses.iter();
                    capped.push(addresses.len(), || {
                        let ip = ips.next().expect("one address per instance asked for");
                        instance(*ip, port, u32::from(weight.max(1)), status, Some(&target))
                    });
                }
                ttl
            }
        };
        let mut listing = Listing { over_limit: capped.left_out, ..Listing::default() };
        listing.services.insert(self.service.clone(), capped.records);
        Ok((listing, ttl))
    }
}

/// The instances of one read, at most `room` of them: the rest are only counted.
struct Capped {
    records: Vec<InstanceRecord>,
    room: usize,
    left_out: usize,
}

impl Capped {
    fn new(room: usize) -> Self {
        Self { records: Vec::new(), room, left_out: 0 }
    }

    /// Keeps as many of `count` instances as there is room for, building only those.
    fn push(&mut self, count: usize, mut build: impl FnMut() -> InstanceRecord) {
        let kept = count.min(self.room - self.records.len());
        self.records.extend((0..kept).map(|_| build()));
        self.left_out += count - kept;
    }
}

impl Asker {
    /// Asks `name` for `type_`: the answer's records and its additional ones (none for a
    /// name that does not exist).
    async fn ask(self, name: &str, type_: u16) -> Result<(Vec<Record>, Vec<Record>), SourceError> {
        let Asker { resolver, timeout } = self;
        let answer = tokio::time::timeout(timeout, exchange(resolver, name, type_)).await.map_err(|_| {
            SourceError::new(format!("{name}: no answer from {resolver} within {}", crate::duration::format(timeout)))
        })??;
        match answer.rcode {
            Rcode::NoError => Ok((answer.answers, answer.additional)),
            Rcode::NxDomain => Ok((Vec::new(), Vec::new())),
            Rcode::Other(code) => Err(SourceError::new(format!(
                "{name}: {resolver} answered with error code {code} ({})",
                rcode_name(code)
            ))),
        }
    }

    async fn addresses(self, name: &str) -> Result<(Vec<IpAddr>, Option<u32>), SourceError> {
        let mut addresses = Vec::new();
        let mut ttl: Option<u32> = None;
        for type_ in [wire::TYPE_A, wire::TYPE_AAAA] {
            let (answers, _) = self.ask(name, type_).await?;
            for record in answers {
                if let Data::Address(ip) = record.data {
                    addresses.push(ip);
                    ttl = Some(ttl.map_or(record.ttl, |t| t.min(record.ttl)));
                }
            }
        }
        Ok((addresses, ttl))
    }
}

fn instance(ip: IpAddr, port: u16, weight: u32, status: Status, target: Option<&str>) -> InstanceRecord {
    let metadata = target.map(|t| [("dns.target".to_owned(), t.to_owned())].into()).unwrap_or_default();
    InstanceRecord {
        id: format!("{ip}:{port}"),
        host: ip.to_string(),
        port,
        version: String::new(),
        zone: String::new(),
        weight,
        metadata,
        status: status.as_str().to_owned(),
        ..Default::default()
    }
}

fn rcode_name(code: u8) -> &'static str {
    match code {
        1 => "FORMERR",
        2 => "SERVFAIL",
        4 => "NOTIMP",
        5 => "REFUSED",
        _ => "see RFC 6895",
    }
}

impl Follow for Dns {
    async fn next(&mut self) -> Result<Listing, SourceError> {
        if let Some(due) = self.due {
            tokio::time::sleep_until(due).await;
        }
        let started = Instant::now();
        // Until the answer says otherwise, the longest wait.
        self.due = Some(started + self.max_interval);
        let (listing, ttl) = self.read().await?;
        let wait = ttl.map_or(self.max_interval, |ttl| Duration::from_secs(u64::from(ttl)));
        self.due = Some(started + wait.clamp(self.min_interval, self.max_interval));
        Ok(listing)
    }

    fn reset(&mut self) {
        self.due = None;
    }
}

/// One question to `resolver`: over UDP, and over TCP when the answer was truncated.
async fn exchange(resolver: SocketAddr, name: &str, type_: u16) -> Result<wire::Answer, SourceError> {
    let failed = |e: &dyn std::fmt::Display| SourceError::new(format!("{name}: asking {resolver}: {e}"));
    let id = fastrand::u16(..);
    let query = wire::query(id, name, type_).map_err(|e| failed(&e))?;
    let local: SocketAddr = if resolver.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { ([0u16; 8], 0).into() };
    let socket = UdpSocket::bind(local).await.map_err(|e| failed(&e))?;
    // Connected: datagrams from anywhere else are dropped by the kernel.
    socket.connect(resolver).await.map_err(|e| failed(&e))?;
    socket.send(&query).await.map_err(|e| failed(&e))?;
    let mut buf = vec![0u8; 4096];
    let answer = loop {
        let n = socket.recv(&mut buf).await.map_err(|e| failed(&e))?;
        match wire::parse(&buf[..n]) {
            // A stray or stale datagram: wait for the real answer (the timeout bounds this).
            Ok(answer) if answer.id != id || !asked(&answer, name, type_) => continue,
            Ok(answer) => break answer,
            Err(e) => return Err(failed(&format!("unreadable answer: {e}"))),
        }
    };
    if !answer.truncated {
        return Ok(answer);
    }
    let mut stream = TcpStream::connect(resolver).await.map_err(|e| failed(&e))?;
    let mut framed = (query.len() as u16).to_be_bytes().to_vec();
    framed.extend_from_slice(&query);
    stream.write_all(&framed).await.map_err(|e| failed(&e))?;
    let length = stream.read_u16().await.map_err(|e| failed(&e))? as usize;
    let mut body = vec![0u8; length.min(MAX_TCP_ANSWER)];
    stream.read_exact(&mut body).await.map_err(|e| failed(&e))?;
    let answer = wire::parse(&body).map_err(|e| failed(&format!("unreadable answer: {e}")))?;
    if answer.id != id || !asked(&answer, name, type_) {
        return Err(failed(&"the TCP answer is not to the question asked"));
    }
    Ok(answer)
}

fn asked(answer: &wire::Answer, name: &str, type_: u16) -> bool {
    answer.question.as_ref().is_some_and(|(q, t)| *t == type_ && q.eq_ignore_ascii_case(name.trim_end_matches('.')))
}
