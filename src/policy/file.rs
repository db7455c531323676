//! The policy part of the config file, and its reloading.
//!
//! ```toml
//! [defaults]                       # every service, unless it says otherwise
//! rule = "round_robin"
//! isolation_fallback = "fail"      # or "any"
//!
//! [services.orders]
//! rule = "repeat(n=3)"
//! breaker = { failure_threshold = 3, blackout_base = "10s", blackout_max = "30s" }
//! gray = { unversioned = 90, versions = { v2 = 10 } }
//! ```
//!
//! The file is read completely and validated before anything is applied. Unknown keys are
//! errors (a typo must not silently do nothing). While rota runs, the file is re-read when it
//! changes (checked every [`POLL_INTERVAL`]) or on SIGHUP; a file that does not validate is
//! reported and the policies in force stay. A reload replaces the file's layer of the
//! policies only: runtime overrides set with `SetPolicy` stay in force (see [`super::store`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{error, info};

use super::{EjectionSpec, GraySpec, HealthCheckSpec, IsolationFallback, Policies, PolicySet, PolicySpec};
use crate::config::files::{self, OffRuntime, modified};

/// How often the file's modification time is checked.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct ConfigError {
    pub path: String,
    pub message: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    /// Server settings: read by `crate::config`, at start only.
    #[serde(default, rename = "server")]
    _server: Option<toml::Value>,
    #[serde(default, rename = "auth")]
    _auth: Option<toml::Value>,
    /// Followed registries: read by `crate::config`, at start only.
    #[serde(default, rename = "source")]
    _sources: Option<toml::Value>,
    #[serde(default)]
    defaults: PolicyToml,
    #[serde(default)]
    services: BTreeMap<String, PolicyToml>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyToml {
    rule: Option<String>,
    isolation_fallback: Option<FallbackToml>,
    gray: Option<GrayToml>,
    breaker: Option<BreakerToml>,
    ejection: Option<EjectionToml>,
    health_check: Option<HealthCheckToml>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HealthCheckToml {
    kind: String,
    path: Option<String>,
    interval: Option<String>,
    timeout: Option<String>,
    unhealthy_after: Option<u32>,
    healthy_after: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct EjectionToml {
    enabled: Option<bool>,
    max_ejected_percent: Option<u32>,
    failure_rate_percent: Option<u32>,
    failure_rate_min_calls: Option<u32>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum FallbackToml {
    Fail,
    Any,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct GrayToml {
    #[serde(default)]
    unversioned: u32,
    #[serde(default)]
    versions: BTreeMap<String, u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct BreakerToml {
    failure_threshold: Option<u32>,
    blackout_base: Option<String>,
    blackout_max: Option<String>,
}

impl PolicyToml {
    fn spec(&self, field: &str) -> Result<PolicySpec, String> {
        let duration = |name: &str, value: &Option<String>| -> Result<Option<Duration>, String> {
            value
                .as_deref()
                .map(|text| {
                    crate::duration::parse(text)
                        .map_err(|e| format!("{field}.breaker.{name}: {text:?} is not a duration ({e})"))
                })
                .transpose()
        };
        let breaker = self.breaker.as_ref();
        let check_duration = |name: &str, value: &Option<String>| -> Result<Option<Duration>, String> {
            value
                .as_deref()
                .map(|text| {
                    crate::duration::parse(text)
                        .map_err(|e| format!("{field}.health_check.{name}: {text:?} is not a duration ({e})"))
                })
                .transpose()
        };
        let health_check = match &self.health_check {
            None => None,
            Some(h) => Some(HealthCheckSpec {
                kind: h.kind.clone(),
                path: h.path.clone(),
                interval: check_duration("interval", &h.interval)?,
                timeout: check_duration("timeout", &h.timeout)?,
                unhealthy_after: h.unhealthy_after,
                healthy_after: h.healthy_after,
            }),
        };
        Ok(PolicySpec {
            health_check,
            rule: self.rule.clone(),
            isolation_fallback: self.isolation_fallback.map(|f| match f {
                FallbackToml::Fail => IsolationFallback::Fail,
                FallbackToml::Any => IsolationFallback::Any,
            }),
            gray: self.gray.as_ref().map(|g| GraySpec { unversioned: g.unversioned, versions: g.versions.clone() }),
            failure_threshold: breaker.and_then(|b| b.failure_threshold),
            blackout_base: duration("blackout_base", &breaker.and_then(|b| b.blackout_base.clone()))?,
            blackout_max: duration("blackout_max", &breaker.and_then(|b| b.blackout_max.clone()))?,
            ejection: self.ejection.as_ref().map_or_else(EjectionSpec::default, |e| EjectionSpec {
                enabled: e.enabled,
                max_ejected_percent: e.max_ejected_percent,
                failure_rate_percent: e.failure_rate_percent,
                failure_rate_min_calls: e.failure_rate_min_calls,
            }),
        })
    }
}

/// One policy spec as a TOML table body (the keys a `[services.NAME]` table takes), only the
/// fields it sets; [`spec_from_toml`] reads it back.
pub fn spec_to_toml(spec: &PolicySpec) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    if let Some(rule) = &spec.rule {
        let _ = writeln!(out, "rule = {}", toml_string(rule));
    }
    if let Some(fallback) = spec.isolation_fallback {
        let fallback = match fallback {
            IsolationFallback::Fail => "fail",
            IsolationFallback::Any => "any",
        };
        let _ = writeln!(out, "isolation_fallback = \"{fallback}\"");
    }
    if let Some(gray) = &spec.gray {
        let versions: Vec<String> = gray.versions.iter().map(|(v, w)| format!("{} = {w}", toml_string(v))).collect();
        let _ =
            writeln!(out, "gray = {{ unversioned = {}, versions = {{ {} }} }}", gray.unversioned, versions.join(", "));
    }
    let mut breaker = Vec::new();
    if let Some(threshold) = spec.failure_threshold {
        breaker.push(format!("failure_threshold = {threshold}"));
    }
    if let Some(base) = spec.blackout_base {
        breaker.push(format!("blackout_base = \"{}\"", crate::duration::format(base)));
    }
    if let Some(max) = spec.blackout_max {
        breaker.push(format!("blackout_max = \"{}\"", crate::duration::format(max)));
    }
    if !breaker.is_empty() {
        let _ = writeln!(out, "breaker = {{ {} }}", breaker.join(", "));
    }
    let ejection = &spec.ejection;
    let mut keys = Vec::new();
    if let Some(enabled) = ejection.enabled {
        keys.push(format!("enabled = {enabled}"));
    }
    for (name, value) in [
        ("max_ejected_percent", ejection.max_ejected_percent),
        ("failure_rate_percent", ejection.failure_rate_percent),
        ("failure_rate_min_calls", ejection.failure_rate_min_calls),
    ] {
        if let Some(value) = value {
            keys.push(format!("{name} = {value}"));
        }
    }
    if !keys.is_empty() {
        let _ = writeln!(out, "ejection = {{ {} }}", keys.join(", "));
    }
    if let Some(check) = &spec.health_check {
        let d = |d: Duration| format!("\"{}\"", crate::duration::format(d));
        let mut keys = vec![format!("kind = {}", toml_string(&check.kind))];
        if let Some(path) = &check.path {
            keys.push(format!("path = {}", toml_string(path)));
        }
        for (name, value) in [("interval", check.interval), ("timeout", check.timeout)] {
            if let Some(value) = value {
                keys.push(format!("{name} = {}", d(value)));
            }
        }
        for (name, value) in [("unhealthy_after", check.unhealthy_after), ("healthy_after", check.healthy_after)] {
            if let Some(value) = value {
                keys.push(format!("{name} = {value}"));
            }
        }
        let _ = writeln!(out, "health_check = {{ {} }}", keys.join(", "));
    }
    out
}

/// Reads a spec written by [`spec_to_toml`] (fields are checked when the spec is resolved).
pub fn spec_from_toml(text: &str) -> Result<PolicySpec, String> {
    let table: PolicyToml = toml::from_str(text).map_err(|e| e.to_string().trim_end().to_owned())?;
    table.spec("policy")
}

/// Parses and validates policy TOML.
pub fn parse(text: &str) -> Result<PolicySet, String> {
    let file: ConfigFile = toml::from_str(text).map_err(|e| e.to_string().trim_end().to_owned())?;
    let defaults = file.defaults.spec("defaults")?;
    let mut services = BTreeMap::new();
    for (name, policy) in &file.services {
        services.insert(name.clone(), policy.spec(&format!("services.{name}"))?);
    }
    PolicySet::build(&defaults, &services).map_err(|e| e.to_string())
}

/// Reads and validates a policy file.
pub fn load(path: &Path) -> Result<PolicySet, ConfigError> {
    let error = |message: String| ConfigError { path: path.display().to_string(), message };
    let text = files::read_to_string(path).map_err(|e| error(format!("cannot read: {e}")))?;
    parse(&text).map_err(error)
}

/// How many times the reloader read the file again, and what it made of it: the one way to
/// know that a change has been looked at (a refused one changes nothing else).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PolicyReloads {
    /// Reloads now in force.
    pub applied: u64,
    /// Reloads refused (the file did not validate, or a runtime override could not live with
    /// it); the policies in force stayed.
    pub refused: u64,
}

/// Re-reads `path` when it changes or on SIGHUP, replacing the file's layer of the policies
/// only when the new file validates; each outcome is counted in `reloads`. The file is looked
/// at off the runtime, within [`READ_TIMEOUT`](files::READ_TIMEOUT): a look that hangs (a file system that does not
/// answer) is a refused reload, and later ones start once it returns.
pub fn spawn_reloader(path: PathBuf, policies: Arc<Policies>, reloads: watch::Sender<PolicyReloads>) -> JoinHandle<()> {
    // Taken now, not when the task first runs: a change made in between is still a change.
    let mut last_seen = modified(&path);
    let off_runtime = OffRuntime::default();
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(POLL_INTERVAL);
        #[cfg(unix)]
        let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
        loop {
            #[cfg(unix)]
            let hangup = async {
                match hangups.as_mut() {
                    Some(signal) => signal.recv().await,
                    None => std::future::pending().await,
                }
            };
            #[cfg(not(unix))]
            let hangup = std::future::pending::<Option<()>>();
            let forced = tokio::select! {
                _ = ticker.tick() => false,
                _ = hangup => true,
            };
            let (seen, read) = (path.clone(), path.clone());
            let loaded =
                match off_runtime.look(&mut last_seen, forced, move || modified(&seen), move || load(&read)).await {
                    None => continue,
                    Some(Ok(loaded)) => loaded,
                    Some(Err(stalled)) => {
                        Err(ConfigError { path: path.display().to_string(), message: stalled.to_string() })
                    }
                };
            let outcome = match loaded {
                Ok(set) => policies.replace_file(set).map_err(|e| format!("{}: {e}", path.display())),
                Err(e) => {
                    policies.file_refused();
                    Err(e.to_string())
                }
            };
            match outcome {
                Ok(()) => {
                    reloads.send_modify(|r| r.applied += 1);
                    info!(path = %path.display(), "policies reloaded");
                }
                Err(e) => {
                    reloads.send_modify(|r| r.refused += 1);
                    error!(error = %e, "policy file refused; the policies in force stay");
                }
            }
        }
    })
}

/// The effective policies as config-file TOML (`[defaults]`, then `[services.NAME]` by name).
pub fn to_toml(set: &PolicySet) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let defaults_gray = set.defaults.gray.is_some();
    let mut table = |header: &str, policy: &super::Policy, is_service: bool| {
        let fallback = match policy.isolation_fallback {
            IsolationFallback::Fail => "fail",
            IsolationFallback::Any => "any",
        };
        let breaker = &policy.breaker;
        let rule = toml_string(&policy.rule.canonical);
        let _ = writeln!(out, "\n[{header}]\nrule = {rule}\nisolation_fallback = \"{fallback}\"");
        let _ = writeln!(
            out,
            "breaker = {{ failure_threshold = {}, blackout_base = \"{}\", blackout_max = \"{}\" }}",
            breaker.failure_threshold,
            crate::duration::format(breaker.blackout_base),
            crate::duration::format(breaker.blackout_max)
        );
        match &policy.health_check {
            Some(check) => {
                let _ = writeln!(out, "health_check = {}", check.to_toml());
            }
            None if is_service && set.defaults.health_check.is_some() => {
                let _ = writeln!(out, "health_check = {{ kind = \"off\" }}");
            }
            None => {}
        }
        let ejection = &policy.ejection;
        let _ = writeln!(
            out,
            "ejection = {{ enabled = {}, max_ejected_percent = {}, failure_rate_percent = {}, failure_rate_min_calls = {} }}",
            ejection.enabled,
            ejection.max_ejected_percent,
            ejection.failure_rate_percent,
            ejection.failure_rate_min_calls
        );
        match &policy.gray {
            Some(gray) => {
                let versions: Vec<String> =
                    gray.versions.iter().map(|(v, w)| format!("{} = {w}", toml_string(v))).collect();
                let _ = writeln!(
                    out,
                    "gray = {{ unversioned = {}, versions = {{ {} }} }}",
                    gray.unversioned,
                    versions.join(", ")
                );
            }
            // A service without gray release under defaults that have one: say so, or the
            // printout would read back with the defaults' gray release.
            None if is_service && defaults_gray => {
                let _ = writeln!(out, "gray = {{ unversioned = 1 }}");
            }
            None => {}
        }
    };
    table("defaults", &set.defaults, false);
    let mut names: Vec<&String> = set.services.keys().collect();
    names.sort();
    for name in names {
        table(&format!("services.{}", toml_string(name)), &set.services[name], true);
    }
    out
}

/// `text` as a TOML basic string: quotes and backslashes escaped, control characters as
/// `\uXXXX`, everything else as it is (Rust's `{:?}` escapes differ and are not TOML).
pub fn toml_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by fuzzing (fuzz/regressions/policy_toml/service-turns-gray-off.toml).
    #[test]
    fn a_service_that_turns_gray_release_off_keeps_it_off_in_the_printout() {
        let text = "[defaults]\ngray = { versions = { a = 1 } }\n\n[services.s]\ngray = { unversioned = 1 }\n";
        let set = parse(text).unwrap();
        assert!(set.defaults.gray.is_some() && set.services["s"].gray.is_none());
        let again = parse(&to_toml(&set)).unwrap();
        assert!(again.services["s"].gray.is_none(), "{}", to_toml(&set));
        assert_eq!(to_toml(&again), to_toml(&set));
    }

    /// Found by fuzzing (fuzz/regressions/config_toml/tls-path-escaped-by-debug.toml): Rust's
    /// `{:?}` writes U+00AD as `\u{ad}`, which TOML cannot read.
    #[test]
    fn toml_strings_read_back_as_written() {
        for text in ["soft\u{ad}hyphen.pem", "quote\"and\\backslash", "tab\tnew\nline\u{7f}", "é 日本 🦀", ""] {
            let line = format!("x = {}", toml_string(text));
            let value: toml::Value = toml::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
            assert_eq!(value["x"].as_str(), Some(text), "{line}");
        }
    }

    #[test]
    fn specs_read_back_as_written() {
        let set = parse(
            "[services.a]\nrule = \"repeat(n=3)\"\nisolation_fallback = \"any\"\n\
             gray = { unversioned = 1, versions = { \"v2\" = 3 } }\n\
             breaker = { failure_threshold = 5, blackout_max = \"1m\" }\n",
        )
        .unwrap();
        let spec = set.specs["a"].clone();
        assert_eq!(spec_from_toml(&spec_to_toml(&spec)).unwrap(), spec);
        let empty = PolicySpec::default();
        assert_eq!(spec_from_toml(&spec_to_toml(&empty)).unwrap(), empty);
        assert!(spec_from_toml("rule = 3").is_err());
    }

    #[test]
    fn a_full_file() {
        let set = parse(
            r#"
            [defaults]
            rule = "random"
            [services.orders]
            rule = "repeat(n=3)"
            isolation_fallback = "any"
            breaker = { failure_threshold = 5, blackout_base = "2s", blackout_max = "8s" }
            gray = { unversioned = 90, versions = { v2 = 10 } }
            "#,
        )
        .unwrap();
        let orders = set.for_service("orders");
        assert_eq!(&*orders.rule.canonical, "repeat(n=3)");
        assert_eq!(orders.isolation_fallback, IsolationFallback::Any);
        assert_eq!(orders.breaker.blackout(6), Duration::from_secs(4));
        assert_eq!(orders.gray.as_ref().unwrap().version_for(0), None);
        assert_eq!(&*set.for_service("payments").rule.canonical, "random");
    }

    #[test]
    fn printed_policies_parse_back_to_the_same_set() {
        let set = parse(
            "[services.orders]\nrule = \"repeat(n=3)\"\nisolation_fallback = \"any\"\ngray = { unversioned = 9, versions = { v2 = 1 } }\n",
        )
        .unwrap();
        let printed = to_toml(&set);
        let again = parse(&printed).unwrap_or_else(|e| panic!("{e}\n{printed}"));
        assert_eq!(again.for_service("orders"), set.for_service("orders"));
        assert_eq!(to_toml(&again), printed);
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            ("[services.orders]\nrul = \"random\"", "unknown field `rul`"),
            ("[services.orders]\nrule = \"zigzag\"", "services.orders.rule is invalid: rule \"zigzag\" is unknown"),
            ("[services.orders]\nisolation_fallback = \"maybe\"", "unknown variant `maybe`"),
            (
                "[services.orders.breaker]\nblackout_base = \"soon\"",
                "services.orders.breaker.blackout_base: \"soon\" is not a duration",
            ),
            ("[services.\"a b\"]\nrule = \"random\"", "services.a b contains ' '"),
        ];
        for (text, expected) in cases {
            let error = parse(text).unwrap_err();
            assert!(error.contains(expected), "{text:?}: {error}");
        }
    }
}
