//! A service's active health check, as its policy names it:
//! `health_check = { kind = "grpc" | "http" | "tcp", path, interval, timeout, unhealthy_after,
//! healthy_after }`. Off unless set. `crate::health` runs it.

use std::time::Duration;

use crate::registry::InvalidField;

/// How an instance is asked whether it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckKind {
    /// `grpc.health.v1.Health/Check` for `service` (empty: the server as a whole); passes on
    /// `SERVING`.
    Grpc { service: String },
    /// `GET path` over HTTP/1.1; passes on a 2xx answer (a redirect is not followed: it fails).
    Http { path: String },
    /// A TCP connection; passes once it is accepted.
    Tcp,
}

impl CheckKind {
    pub fn name(&self) -> &'static str {
        match self {
            CheckKind::Grpc { .. } => "grpc",
            CheckKind::Http { .. } => "http",
            CheckKind::Tcp => "tcp",
        }
    }

    /// The `path` key: the HTTP path, or the gRPC service name.
    pub fn path(&self) -> &str {
        match self {
            CheckKind::Grpc { service } => service,
            CheckKind::Http { path } => path,
            CheckKind::Tcp => "",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthCheck {
    pub kind: CheckKind,
    /// Between two checks of one instance.
    pub interval: Duration,
    /// One check, whole; a check that takes longer fails.
    pub timeout: Duration,
    /// Checks failed in a row before the instance gets no picks.
    pub unhealthy_after: u32,
    /// Checks passed in a row before a failing instance gets picks again.
    pub healthy_after: u32,
}

pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(5);
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
pub const DEFAULT_UNHEALTHY_AFTER: u32 = 3;
pub const DEFAULT_HEALTHY_AFTER: u32 = 2;
const INTERVALS: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(3600));
const MAX_PATH: usize = 1024;

/// A health check as written: `kind` and optional keys (unset ones take the defaults).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthCheckSpec {
    pub kind: String,
    pub path: Option<String>,
    pub interval: Option<Duration>,
    pub timeout: Option<Duration>,
    pub unhealthy_after: Option<u32>,
    pub healthy_after: Option<u32>,
}

impl HealthCheckSpec {
    /// Checks every key; `field` prefixes errors (`services.orders.health_check`). `kind =
    /// "off"` turns a check the defaults set off for one service.
    pub fn resolve(&self, field: &str) -> Result<Option<HealthCheck>, InvalidField> {
        if self.kind == "off" {
            return Ok(None);
        }
        self.resolve_check(field).map(Some)
    }

    fn resolve_check(&self, field: &str) -> Result<HealthCheck, InvalidField> {
        let bad = |key: &str, problem: String| InvalidField::new(format!("{field}.{key}"), problem);
        let path = self.path.clone();
        if let Some(path) = &path
            && (path.len() > MAX_PATH || path.chars().any(|c| c.is_control() || c == ' '))
        {
            return Err(bad("path", format!("must be at most {MAX_PATH} bytes without spaces or control characters")));
        }
        let kind = match self.kind.as_str() {
            "grpc" => CheckKind::Grpc { service: path.unwrap_or_default() },
            "http" => {
                let path = path.unwrap_or_else(|| "/".to_owned());
                if !path.starts_with('/') {
                    return Err(bad("path", format!("is {path:?}; an HTTP path starts with /")));
                }
                CheckKind::Http { path }
            }
            "tcp" => {
                if path.is_some() {
                    return Err(bad("path", "is for grpc and http checks only".into()));
                }
                CheckKind::Tcp
            }
            other => return Err(bad("kind", format!("is {other:?}; expected \"grpc\", \"http\", \"tcp\" or \"off\""))),
        };
        let interval = self.interval.unwrap_or(DEFAULT_INTERVAL);
        if interval < INTERVALS.0 || interval > INTERVALS.1 {
            return Err(bad("interval", "must be from 100ms to 1h".into()));
        }
        let timeout = self.timeout.unwrap_or(DEFAULT_TIMEOUT.min(interval));
        if timeout.is_zero() || timeout > interval {
            return Err(bad("timeout", "must be more than 0 and at most the interval".into()));
        }
        let count = |key: &str, value: Option<u32>, default: u32| match value.unwrap_or(default) {
            n @ 1..=100 => Ok(n),
            n => Err(bad(key, format!("must be from 1 to 100, got {n}"))),
        };
        Ok(HealthCheck {
            kind,
            interval,
            timeout,
            unhealthy_after: count("unhealthy_after", self.unhealthy_after, DEFAULT_UNHEALTHY_AFTER)?,
            healthy_after: count("healthy_after", self.healthy_after, DEFAULT_HEALTHY_AFTER)?,
        })
    }
}

impl HealthCheck {
    /// The spec that resolves to this check (for the TOML and proto forms).
    pub fn spec(&self) -> HealthCheckSpec {
        let path = match &self.kind {
            CheckKind::Tcp => None,
            kind => Some(kind.path().to_owned()),
        };
        HealthCheckSpec {
            kind: self.kind.name().to_owned(),
            path,
            interval: Some(self.interval),
            timeout: Some(self.timeout),
            unhealthy_after: Some(self.unhealthy_after),
            healthy_after: Some(self.healthy_after),
        }
    }

    /// As an inline TOML table.
    pub fn to_toml(&self) -> String {
        let d = crate::duration::format;
        let path = match &self.kind {
            CheckKind::Tcp => String::new(),
            kind => format!(", path = {}", toml::Value::String(kind.path().to_owned())),
        };
        format!(
            "{{ kind = \"{}\"{path}, interval = \"{}\", timeout = \"{}\", unhealthy_after = {}, healthy_after = {} }}",
            self.kind.name(),
            d(self.interval),
            d(self.timeout),
            self.unhealthy_after,
            self.healthy_after
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: &str) -> HealthCheckSpec {
        HealthCheckSpec { kind: kind.into(), ..Default::default() }
    }

    #[test]
    fn defaults_fill_the_unset_keys_and_the_spec_round_trips() {
        assert_eq!(spec("off").resolve("h").unwrap(), None);
        let check = spec("http").resolve("h").unwrap().unwrap();
        assert_eq!(check.kind, CheckKind::Http { path: "/".into() });
        assert_eq!(
            (check.interval, check.timeout, check.unhealthy_after, check.healthy_after),
            (DEFAULT_INTERVAL, DEFAULT_TIMEOUT, 3, 2)
        );
        assert_eq!(check.spec().resolve("h").unwrap(), Some(check));
        let grpc =
            HealthCheckSpec { path: Some("orders.v1.Orders".into()), ..spec("grpc") }.resolve("h").unwrap().unwrap();
        assert_eq!(grpc.kind, CheckKind::Grpc { service: "orders.v1.Orders".into() });
        let tcp = spec("tcp").resolve("h").unwrap().unwrap();
        assert_eq!(tcp.spec().resolve("h").unwrap(), Some(tcp));
    }

    #[test]
    fn each_bad_key_is_named() {
        let cases = [
            (spec("icmp"), "h.kind"),
            (HealthCheckSpec { path: Some("healthz".into()), ..spec("http") }, "h.path"),
            (HealthCheckSpec { path: Some("/a b".into()), ..spec("http") }, "h.path"),
            (HealthCheckSpec { path: Some("/".into()), ..spec("tcp") }, "h.path"),
            (HealthCheckSpec { interval: Some(Duration::from_millis(10)), ..spec("tcp") }, "h.interval"),
            (HealthCheckSpec { timeout: Some(Duration::from_secs(9)), ..spec("tcp") }, "h.timeout"),
            (HealthCheckSpec { unhealthy_after: Some(0), ..spec("tcp") }, "h.unhealthy_after"),
            (HealthCheckSpec { healthy_after: Some(101), ..spec("tcp") }, "h.healthy_after"),
        ];
        for (spec, field) in cases {
            assert_eq!(spec.resolve("h").unwrap_err().field, field);
        }
    }
}
