//! What one `[[source]]` table (or `--source URL` flag) says, checked.
//!
//! ```toml
//! [[source]]
//! url = "eureka+http://127.0.0.1:8761/eureka"
//! name = "eureka"            # the id namespace; default: the kind
//! services = ["orders"]      # default: every service the source lists
//! interval = "5s"            # time between reads
//! timeout = "5s"             # one read, whole
//! max_instances = 10000
//! max_bytes = 33554432       # one answer
//! protect_threshold = 0.5    # share of a service's instances one listing may remove at once
//! protect_for = "60s"        # how long a larger removal is held back
//! ```
//!
//! A flag gives the same keys as the URL's query: `--source
//! 'eureka+http://127.0.0.1:8761/eureka?name=main&services=orders,users&interval=2s'`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;

use super::dns::Question;
use super::http::Endpoint;
use crate::registry::validate_service_name;

pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
/// The shortest wait between two questions of a DNS source, whatever the TTL.
pub const DEFAULT_MIN_INTERVAL: Duration = Duration::from_secs(1);
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
pub const DEFAULT_MAX_INSTANCES: usize = 10_000;
pub const DEFAULT_MAX_BYTES: usize = 32 << 20;
pub const DEFAULT_PROTECT_THRESHOLD: f64 = 0.5;
pub const DEFAULT_PROTECT_FOR: Duration = Duration::from_secs(60);
/// Bounds on what a source may be configured with.
const INTERVALS: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(3600));
const MAX_SOURCES: usize = 64;

/// Which registry, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// `eureka+http://HOST:PORT/PATH`: Eureka's REST API under `PATH` (usually `/eureka`).
    Eureka(Endpoint),
    /// `dns+srv://NAME` (SRV records) or `dns://NAME:PORT` (A and AAAA records), asked of
    /// `resolver` (`None`: the system's).
    Dns { question: Question, resolver: Option<SocketAddr> },
    /// `etcd://HOST:PORT/PREFIX`: every key under `PREFIX/`, through etcd's JSON gateway at
    /// `HOST:PORT` (an empty prefix: every key).
    Etcd { endpoint: Endpoint, prefix: String },
}

impl Kind {
    pub fn as_str(&self) -> &'static str {
        match self {
            Kind::Eureka(_) => "eureka",
            Kind::Dns { .. } => "dns",
            Kind::Etcd { .. } => "etcd",
        }
    }
}

/// One source, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct SourceSpec {
    /// The id namespace, and the `source` label of its metrics.
    pub name: String,
    pub kind: Kind,
    /// The URL as configured, without its query.
    pub url: String,
    /// `None`: every service the source lists.
    pub services: Option<BTreeSet<String>>,
    /// Between reads (Eureka); the longest wait between questions (DNS).
    pub interval: Duration,
    /// The shortest wait between questions (DNS, whose TTLs decide between the two).
    pub min_interval: Duration,
    pub timeout: Duration,
    pub max_instances: usize,
    pub max_bytes: usize,
    pub protect_threshold: f64,
    pub protect_for: Duration,
}

/// One `[[source]]` table as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceTable {
    pub url: String,
    pub name: Option<String>,
    pub services: Option<Vec<String>>,
    pub interval: Option<String>,
    pub min_interval: Option<String>,
    pub timeout: Option<String>,
    /// DNS: the server asked, `IP:PORT`.
    pub resolver: Option<String>,
    pub max_instances: Option<u64>,
    pub max_bytes: Option<u64>,
    pub protect_threshold: Option<f64>,
    pub protect_for: Option<String>,
}

/// A bad source setting: `key` names it (`url`, `interval`, …).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError {
    pub key: &'static str,
    pub problem: String,
}

impl SpecError {
    fn new(key: &'static str, problem: impl Into<String>) -> Self {
        Self { key, problem: problem.into() }
    }
}

impl SourceTable {
    /// The table a `--source` flag stands for: its URL, and its query's keys.
    pub fn from_flag(flag: &str) -> Result<Self, SpecError> {
        let (url, query) = flag.split_once('?').unwrap_or((flag, ""));
        let mut table = SourceTable { url: url.to_owned(), ..Default::default() };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = value.to_owned();
            let number = |key: &'static str| {
                value.parse::<u64>().map_err(|_| SpecError::new(key, format!("is {value:?}; expected a whole number")))
            };
            match key {
                "name" => table.name = Some(value),
                "services" => table.services = Some(value.split(',').map(str::to_owned).collect()),
                "interval" => table.interval = Some(value),
                "min_interval" => table.min_interval = Some(value),
                "resolver" => table.resolver = Some(value),
                "timeout" => table.timeout = Some(value),
                "max_instances" => table.max_instances = Some(number("max_instances")?),
                "max_bytes" => table.max_bytes = Some(number("max_bytes")?),
                "protect_threshold" => {
                    table.protect_threshold = Some(value.parse().map_err(|_| {
                        SpecError::new("protect_threshold", format!("is {value:?}; expected a number from 0 to 1"))
                    })?)
                }
                "protect_for" => table.protect_for = Some(value),
                _ => {
                    return Err(SpecError::new(
                        "url",
                        format!(
                            "has the query key {key:?}; known: name, services, interval, min_interval, timeout, \
                             resolver, max_instances, max_bytes, protect_threshold, protect_for"
                        ),
                    ));
                }
            }
        }
        Ok(table)
    }

    pub fn check(self) -> Result<SourceSpec, SpecError> {
        let resolver = match &self.resolver {
            None => None,
            Some(text) => Some(text.parse::<SocketAddr>().map_err(|_| {
                SpecError::new("resolver", format!("is {text:?}; expected IP:PORT, e.g. 127.0.0.1:53 or [::1]:53"))
            })?),
        };
        let kind = parse_url(&self.url, resolver)?;
        if resolver.is_some() && !matches!(kind, Kind::Dns { .. }) {
            return Err(SpecError::new("resolver", "is for DNS sources only"));
        }
        let name = self.name.unwrap_or_else(|| kind.as_str().to_owned());
        if name.is_empty()
            || name.len() > 64
            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        {
            return Err(SpecError::new("name", format!("is {name:?}; expected 1 to 64 of [A-Za-z0-9._-]")));
        }
        let services = match self.services {
            None => None,
            Some(list) => {
                if list.is_empty() {
                    return Err(SpecError::new("services", "is empty; leave it out to follow every service"));
                }
                for service in &list {
                    validate_service_name("services", service)
                        .map_err(|e| SpecError::new("services", e.to_string()))?;
                }
                Some(list.into_iter().collect::<BTreeSet<_>>())
            }
        };
        if matches!(kind, Kind::Dns { .. }) && services.as_ref().is_none_or(|s| s.len() != 1) {
            return Err(SpecError::new(
                "services",
                "must name exactly one service: the one a DNS name's records are instances of",
            ));
        }
        let interval = duration("interval", self.interval, DEFAULT_INTERVAL, INTERVALS)?;
        let min_interval = duration("min_interval", self.min_interval, DEFAULT_MIN_INTERVAL.min(interval), INTERVALS)?;
        if min_interval > interval {
            return Err(SpecError::new(
                "min_interval",
                format!("is longer than interval ({})", crate::duration::format(interval)),
            ));
        }
        let timeout =
            duration("timeout", self.timeout, DEFAULT_TIMEOUT, (Duration::from_millis(10), Duration::from_secs(300)))?;
        let max_instances = bounded("max_instances", self.max_instances, DEFAULT_MAX_INSTANCES, 1, 1_000_000)?;
        let max_bytes = bounded("max_bytes", self.max_bytes, DEFAULT_MAX_BYTES, 1024, 1 << 30)?;
        let protect_threshold = self.protect_threshold.unwrap_or(DEFAULT_PROTECT_THRESHOLD);
        if !(0.0..=1.0).contains(&protect_threshold) {
            return Err(SpecError::new(
                "protect_threshold",
                format!("is {protect_threshold}; expected 0 to 1 (1 turns it off)"),
            ));
        }
        let protect_for = duration(
            "protect_for",
            self.protect_for,
            DEFAULT_PROTECT_FOR,
            (Duration::ZERO, Duration::from_secs(86_400)),
        )?;
        let url = self.url;
        Ok(SourceSpec {
            name,
            kind,
            url,
            services,
            interval,
            min_interval,
            timeout,
            max_instances,
            max_bytes,
            protect_threshold,
            protect_for,
        })
    }
}

/// Checks every source, refusing two with one name (their ids would share a namespace).
pub fn check_all(tables: Vec<SourceTable>) -> Result<Vec<SourceSpec>, (usize, SpecError)> {
    if tables.len() > MAX_SOURCES {
        return Err((
            MAX_SOURCES,
            SpecError::new("url", format!("is one source too many; the limit is {MAX_SOURCES}")),
        ));
    }
    let mut seen = BTreeMap::new();
    let mut specs = Vec::with_capacity(tables.len());
    for (i, table) in tables.into_iter().enumerate() {
        let spec = table.check().map_err(|e| (i, e))?;
        if let Some(first) = seen.insert(spec.name.clone(), i) {
            let problem = format!("is {:?}, as source {first}'s is; give one a `name`", spec.name);
            return Err((i, SpecError::new("name", problem)));
        }
        specs.push(spec);
    }
    Ok(specs)
}

fn parse_url(url: &str, resolver: Option<SocketAddr>) -> Result<Kind, SpecError> {
    let bad = |problem: String| SpecError::new("url", format!("{url:?} {problem}"));
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(bad("is not a URL; expected eureka+http://HOST:PORT/PATH, dns+srv://NAME, dns://NAME:PORT or \
             etcd://HOST:PORT/PREFIX"
            .into()));
    };
    match scheme {
        "eureka+http" => Ok(Kind::Eureka(endpoint(rest).map_err(bad)?)),
        "eureka+https" => Err(bad("uses https, which rota's Eureka source does not speak yet; use eureka+http".into())),
        "dns+srv" => {
            dns_name(rest).map_err(bad)?;
            Ok(Kind::Dns { question: Question::Srv(rest.trim_end_matches('.').to_owned()), resolver })
        }
        "dns" => {
            let (name, port) = rest.rsplit_once(':').ok_or_else(|| bad("needs NAME:PORT".into()))?;
            dns_name(name).map_err(bad)?;
            let port: u16 =
                port.parse().ok().filter(|p| *p != 0).ok_or_else(|| bad(format!("has the port {port:?}")))?;
            Ok(Kind::Dns { question: Question::Addresses(name.trim_end_matches('.').to_owned(), port), resolver })
        }
        "etcd" => {
            let endpoint = endpoint(rest).map_err(bad)?;
            let prefix = endpoint.path.trim_start_matches('/').to_owned();
            if prefix.contains("//") {
                return Err(bad(format!("has the prefix {prefix:?}, with an empty segment")));
            }
            Ok(Kind::Etcd { endpoint: Endpoint { path: String::new(), ..endpoint }, prefix })
        }
        "etcd+https" | "etcds" => Err(bad("uses TLS, which rota's etcd source does not speak yet; use etcd://".into())),
        _ => Err(bad(format!("has the scheme {scheme:?}; known: eureka+http, dns+srv, dns, etcd"))),
    }
}

fn dns_name(name: &str) -> Result<(), String> {
    super::dns::wire::query(0, name, super::dns::wire::TYPE_A).map(drop).map_err(|e| format!("has a name that {e}"))
}

/// `HOST:PORT/PATH` (an IPv6 host in brackets).
fn endpoint(rest: &str) -> Result<Endpoint, String> {
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let (host, port) = bracketed.split_once("]:").ok_or("needs [IPV6]:PORT")?;
        (host, port)
    } else {
        authority.rsplit_once(':').ok_or("needs HOST:PORT")?
    };
    if host.is_empty() || host.contains(['@', ' ']) {
        return Err(format!("has the host {host:?}"));
    }
    let port: u16 = port.parse().ok().filter(|p| *p != 0).ok_or_else(|| format!("has the port {port:?}"))?;
    if path.contains(['?', '#', ' ']) {
        return Err(format!("has the path {path:?}"));
    }
    Ok(Endpoint { host: host.to_owned(), port, path: path.trim_end_matches('/').to_owned() })
}

fn duration(
    key: &'static str,
    value: Option<String>,
    default: Duration,
    (low, high): (Duration, Duration),
) -> Result<Duration, SpecError> {
    let Some(value) = value else { return Ok(default) };
    let parsed = crate::duration::parse(&value)
        .map_err(|e| SpecError::new(key, format!("is {value:?}: {e} (write e.g. \"5s\" or \"500ms\")")))?;
    if parsed < low || parsed > high {
        let (low, high) = (crate::duration::format(low), crate::duration::format(high));
        return Err(SpecError::new(key, format!("is {value}; expected {low} to {high}")));
    }
    Ok(parsed)
}

fn bounded(key: &'static str, value: Option<u64>, default: usize, low: u64, high: u64) -> Result<usize, SpecError> {
    match value {
        None => Ok(default),
        Some(v) if (low..=high).contains(&v) => Ok(v as usize),
        Some(v) => Err(SpecError::new(key, format!("is {v}; expected {low} to {high}"))),
    }
}

impl SourceSpec {
    /// The table that stands for this source, for `--print-config`.
    pub fn to_toml(&self) -> String {
        let mut out = String::from("[[source]]\n");
        let quote = |s: &str| toml::Value::String(s.to_owned()).to_string();
        out.push_str(&format!("url = {}\n", quote(&self.url)));
        out.push_str(&format!("name = {}\n", quote(&self.name)));
        if let Some(services) = &self.services {
            let list: Vec<String> = services.iter().map(|s| quote(s)).collect();
            out.push_str(&format!("services = [{}]\n", list.join(", ")));
        }
        out.push_str(&format!("interval = \"{}\"\n", crate::duration::format(self.interval)));
        if let Kind::Dns { resolver, .. } = &self.kind {
            out.push_str(&format!("min_interval = \"{}\"\n", crate::duration::format(self.min_interval)));
            if let Some(resolver) = resolver {
                out.push_str(&format!("resolver = \"{resolver}\"\n"));
            }
        }
        out.push_str(&format!("timeout = \"{}\"\n", crate::duration::format(self.timeout)));
        out.push_str(&format!("max_instances = {}\n", self.max_instances));
        out.push_str(&format!("max_bytes = {}\n", self.max_bytes));
        out.push_str(&format!("protect_threshold = {}\n", self.protect_threshold));
        out.push_str(&format!("protect_for = \"{}\"\n", crate::duration::format(self.protect_for)));
        out
    }

    /// Whether the source covers `service`.
    pub fn covers(&self, service: &str) -> bool {
        self.services.as_ref().is_none_or(|list| list.contains(service))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(url: &str) -> SourceTable {
        SourceTable { url: url.into(), ..Default::default() }
    }

    #[test]
    fn a_eureka_url_gives_host_port_and_path_with_the_defaults() {
        let spec = table("eureka+http://127.0.0.1:8761/eureka/").check().unwrap();
        assert_eq!(spec.kind, Kind::Eureka(Endpoint { host: "127.0.0.1".into(), port: 8761, path: "/eureka".into() }));
        assert_eq!(spec.name, "eureka");
        assert_eq!((spec.interval, spec.max_instances, spec.services), (DEFAULT_INTERVAL, DEFAULT_MAX_INSTANCES, None));
        let v6 = table("eureka+http://[::1]:8761").check().unwrap();
        assert_eq!(v6.kind, Kind::Eureka(Endpoint { host: "::1".into(), port: 8761, path: String::new() }));
    }

    #[test]
    fn a_flag_sets_the_same_keys_through_its_query() {
        let spec =
            SourceTable::from_flag("eureka+http://h:1/eureka?name=main&services=a,b&interval=2s&protect_threshold=1")
                .unwrap()
                .check()
                .unwrap();
        assert_eq!(spec.name, "main");
        assert_eq!(spec.services, Some(["a".to_owned(), "b".to_owned()].into()));
        assert_eq!(spec.interval, Duration::from_secs(2));
        assert_eq!(spec.protect_threshold, 1.0);
        assert_eq!(spec.url, "eureka+http://h:1/eureka");
        let err = SourceTable::from_flag("eureka+http://h:1/eureka?colour=red").unwrap_err();
        assert!(err.problem.contains("\"colour\""), "{err:?}");
    }

    #[test]
    fn each_bad_value_names_its_key() {
        let cases = [
            (table("http://h:1"), "url"),
            (table("eureka+http://h"), "url"),
            (table("eureka+http://h:0/e"), "url"),
            (table("eureka+https://h:1/e"), "url"),
            (table("nope"), "url"),
            (SourceTable { name: Some("a b".into()), ..table("eureka+http://h:1") }, "name"),
            (SourceTable { services: Some(vec![]), ..table("eureka+http://h:1") }, "services"),
            (SourceTable { services: Some(vec!["bad name".into()]), ..table("eureka+http://h:1") }, "services"),
            (SourceTable { interval: Some("1ms".into()), ..table("eureka+http://h:1") }, "interval"),
            (SourceTable { interval: Some("soon".into()), ..table("eureka+http://h:1") }, "interval"),
            (SourceTable { max_instances: Some(0), ..table("eureka+http://h:1") }, "max_instances"),
            (SourceTable { max_bytes: Some(1), ..table("eureka+http://h:1") }, "max_bytes"),
            (SourceTable { protect_threshold: Some(1.5), ..table("eureka+http://h:1") }, "protect_threshold"),
        ];
        for (table, key) in cases {
            let err = table.check().expect_err(key);
            assert_eq!(err.key, key, "{err:?}");
        }
    }

    #[test]
    fn dns_urls_name_one_service_and_may_name_their_resolver() {
        let srv = SourceTable {
            services: Some(vec!["orders".into()]),
            resolver: Some("127.0.0.1:5353".into()),
            ..table("dns+srv://_grpc._tcp.orders.default.svc.cluster.local.")
        }
        .check()
        .unwrap();
        let question = Question::Srv("_grpc._tcp.orders.default.svc.cluster.local".into());
        assert_eq!(srv.kind, Kind::Dns { question, resolver: Some("127.0.0.1:5353".parse().unwrap()) });
        assert_eq!((srv.name.as_str(), srv.min_interval), ("dns", DEFAULT_MIN_INTERVAL));
        let a =
            SourceTable { services: Some(vec!["orders".into()]), ..table("dns://orders.test:9000") }.check().unwrap();
        assert_eq!(a.kind, Kind::Dns { question: Question::Addresses("orders.test".into(), 9000), resolver: None });
        let cases = [
            (table("dns://orders.test:9000"), "services"),
            (
                SourceTable { services: Some(vec!["a".into(), "b".into()]), ..table("dns://orders.test:9000") },
                "services",
            ),
            (SourceTable { services: Some(vec!["a".into()]), ..table("dns://orders.test") }, "url"),
            (SourceTable { services: Some(vec!["a".into()]), ..table("dns+srv://bad name") }, "url"),
            (
                SourceTable {
                    services: Some(vec!["a".into()]),
                    resolver: Some("localhost".into()),
                    ..table("dns://o.test:1")
                },
                "resolver",
            ),
            (SourceTable { resolver: Some("127.0.0.1:53".into()), ..table("eureka+http://h:1") }, "resolver"),
            (
                SourceTable {
                    services: Some(vec!["a".into()]),
                    min_interval: Some("10s".into()),
                    ..table("dns://o.test:1")
                },
                "min_interval",
            ),
        ];
        for (table, key) in cases {
            let err = table.check().expect_err(key);
            assert_eq!(err.key, key, "{err:?}");
        }
    }

    #[test]
    fn etcd_urls_give_the_gateway_and_the_key_prefix() {
        let etcd = |host: &str, port: u16, prefix: &str| Kind::Etcd {
            endpoint: Endpoint { host: host.into(), port, path: String::new() },
            prefix: prefix.into(),
        };
        let spec = table("etcd://127.0.0.1:2379/services").check().unwrap();
        assert_eq!((spec.kind, spec.name.as_str()), (etcd("127.0.0.1", 2379, "services"), "etcd"));
        assert_eq!(table("etcd://127.0.0.1:2379/svc/echo/").check().unwrap().kind, etcd("127.0.0.1", 2379, "svc/echo"));
        assert_eq!(table("etcd://[::1]:2379").check().unwrap().kind, etcd("::1", 2379, ""));
        assert_eq!(table("etcd://h:1/").check().unwrap().kind, etcd("h", 1, ""));
        let flag = SourceTable::from_flag("etcd://h:1/svc?name=grpc&interval=2s").unwrap().check().unwrap();
        assert_eq!((flag.kind, flag.name.as_str(), flag.url.as_str()), (etcd("h", 1, "svc"), "grpc", "etcd://h:1/svc"));
        let cases = [
            table("etcd://h/svc"),
            table("etcd://h:0/svc"),
            table("etcd://:1/svc"),
            table("etcd://h:1/a//b"),
            table("etcd://h:1/svc#x"),
            table("etcd+https://h:1/svc"),
            table("etcd:/h:1/svc"),
        ];
        for table in cases {
            let url = table.url.clone();
            let err = table.check().expect_err(&url);
            assert_eq!(err.key, "url", "{err:?}");
            assert!(err.problem.contains(&url), "{err:?}");
        }
        let err = SourceTable { resolver: Some("127.0.0.1:53".into()), ..table("etcd://h:1/svc") }.check().unwrap_err();
        assert_eq!(err.key, "resolver");
    }

    #[test]
    fn two_sources_may_not_share_a_name() {
        let err = check_all(vec![table("eureka+http://a:1"), table("eureka+http://b:1")]).unwrap_err();
        assert_eq!((err.0, err.1.key), (1, "name"));
        let named = SourceTable { name: Some("other".into()), ..table("eureka+http://b:1") };
        assert_eq!(check_all(vec![table("eureka+http://a:1"), named]).unwrap().len(), 2);
    }
}
