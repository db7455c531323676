//! Per-service policies: which rule a service uses when a request names none, what version
//! isolation does when nothing is left, gray-release version weights, and breaker settings.
//!
//! Policies come from the config file (`[defaults]` and `[services.NAME]`, see [`mod@file`]) and
//! from runtime overrides (`SetPolicy`); [`Policies`] keeps the two as layers and is their one
//! writer (see [`store`]). What picks read is one immutable merged [`PolicySet`] behind an
//! `ArcSwap`: a pick loads it once, so it sees the old policy or the new one, never a mix.
//! Every policy is validated completely before it is stored; a bad one is refused and the old
//! one stays.

pub mod file;
mod gray;
pub mod health;
pub mod store;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::hash::Map;
use crate::load::{BreakerConfig, EjectionConfig};
use crate::registry::{InvalidField, validate_service_name};
use crate::rules::{self, ParsedRule};

pub use health::{CheckKind, HealthCheck, HealthCheckSpec};

pub use gray::GrayRelease;
pub use store::{MAX_RUNTIME_OVERRIDES, OverrideConflict, Policies, PolicyError, RuntimeChange};

/// Which layer the policy in force for a service came from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum PolicySource {
    /// The service has no policy of its own; the defaults apply.
    #[default]
    Default,
    /// The config file's `[services.NAME]`.
    File,
    /// A runtime override (`SetPolicy`).
    Runtime,
}

impl PolicySource {
    pub fn as_str(self) -> &'static str {
        match self {
            PolicySource::Default => "default",
            PolicySource::File => "file",
            PolicySource::Runtime => "runtime",
        }
    }
}

impl std::fmt::Display for PolicySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What version isolation does when neither the requested version nor unversioned instances
/// are available.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum IsolationFallback {
    /// `UNAVAILABLE`.
    #[default]
    Fail,
    /// Pick from any UP instance (Ribbon's `super.choose`), and say so.
    Any,
}

/// A complete, validated policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// Rule for requests that name none.
    pub rule: Arc<ParsedRule>,
    pub isolation_fallback: IsolationFallback,
    pub gray: Option<GrayRelease>,
    pub breaker: BreakerConfig,
    /// Outlier ejection: which failing instances every rule skips.
    pub ejection: EjectionConfig,
    /// The active health check of every instance, if any (`crate::health` runs it).
    pub health_check: Option<HealthCheck>,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            rule: Arc::new(rules::parse("round_robin").expect("round_robin parses")),
            isolation_fallback: IsolationFallback::Fail,
            gray: None,
            breaker: BreakerConfig::default(),
            ejection: EjectionConfig::default(),
            health_check: None,
        }
    }
}

/// A policy as written by an operator: every field optional, unset fields inherit.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicySpec {
    pub rule: Option<String>,
    pub isolation_fallback: Option<IsolationFallback>,
    pub gray: Option<GraySpec>,
    pub failure_threshold: Option<u32>,
    pub blackout_base: Option<Duration>,
    pub blackout_max: Option<Duration>,
    pub ejection: EjectionSpec,
    /// `None` inherits the base's check; `kind = "off"` turns it off.
    pub health_check: Option<HealthCheckSpec>,
}

/// Outlier-ejection settings as written; unset ones inherit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EjectionSpec {
    pub enabled: Option<bool>,
    pub max_ejected_percent: Option<u32>,
    pub failure_rate_percent: Option<u32>,
    pub failure_rate_min_calls: Option<u32>,
}

impl EjectionSpec {
    fn resolve(&self, base: &EjectionConfig, field: &str) -> Result<EjectionConfig, InvalidField> {
        let config = EjectionConfig {
            enabled: self.enabled.unwrap_or(base.enabled),
            max_ejected_percent: self.max_ejected_percent.unwrap_or(base.max_ejected_percent),
            failure_rate_percent: self.failure_rate_percent.unwrap_or(base.failure_rate_percent),
            failure_rate_min_calls: self.failure_rate_min_calls.unwrap_or(base.failure_rate_min_calls),
        };
        if !(1..=100).contains(&config.max_ejected_percent) {
            let problem = format!("must be from 1 to 100, got {}", config.max_ejected_percent);
            return Err(InvalidField::new(format!("{field}.ejection.max_ejected_percent"), problem));
        }
        if !(1..=101).contains(&config.failure_rate_percent) {
            let problem = format!("must be from 1 to 100, or 101 for off, got {}", config.failure_rate_percent);
            return Err(InvalidField::new(format!("{field}.ejection.failure_rate_percent"), problem));
        }
        if !(1..=1_000_000).contains(&config.failure_rate_min_calls) {
            let problem = format!("must be from 1 to 1000000, got {}", config.failure_rate_min_calls);
            return Err(InvalidField::new(format!("{field}.ejection.failure_rate_min_calls"), problem));
        }
        Ok(config)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GraySpec {
    pub unversioned: u32,
    pub versions: BTreeMap<String, u32>,
}

impl PolicySpec {
    /// Validates every field and fills the unset ones from `base`. `field` prefixes errors.
    pub fn resolve(&self, base: &Policy, field: &str) -> Result<Policy, InvalidField> {
        let rule = match &self.rule {
            None => base.rule.clone(),
            Some(text) if text.trim().is_empty() => base.rule.clone(),
            Some(text) => Arc::new(
                rules::parse(text)
                    .map_err(|e| InvalidField::new(format!("{field}.rule"), format!("is invalid: {e}")))?,
            ),
        };
        let gray = match &self.gray {
            None => base.gray.clone(),
            Some(spec) => GrayRelease::new(spec, &format!("{field}.gray"))?,
        };
        let breaker = BreakerConfig {
            failure_threshold: self.failure_threshold.unwrap_or(base.breaker.failure_threshold),
            blackout_base: self.blackout_base.unwrap_or(base.breaker.blackout_base),
            blackout_max: self.blackout_max.unwrap_or(base.breaker.blackout_max),
        };
        if !(1..=1000).contains(&breaker.failure_threshold) {
            let problem = format!("must be from 1 to 1000, got {}", breaker.failure_threshold);
            return Err(InvalidField::new(format!("{field}.failure_threshold"), problem));
        }
        let hour = Duration::from_secs(3600);
        if breaker.blackout_base.is_zero() || breaker.blackout_base > hour {
            return Err(InvalidField::new(format!("{field}.blackout_base"), "must be from 1ms to 1h"));
        }
        if breaker.blackout_max < breaker.blackout_base || breaker.blackout_max > hour {
            return Err(InvalidField::new(
                format!("{field}.blackout_max"),
                "must be at least blackout_base and at most 1h",
            ));
        }
        Ok(Policy {
            rule,
            isolation_fallback: self.isolation_fallback.unwrap_or(base.isolation_fallback),
            gray,
            breaker,
            ejection: self.ejection.resolve(&base.ejection, field)?,
            health_check: match &self.health_check {
                None => base.health_check.clone(),
                Some(spec) => spec.resolve(&format!("{field}.health_check"))?,
            },
        })
    }
}

/// Defaults plus per-service policies, swapped as a whole.
#[derive(Debug, Clone, Default)]
pub struct PolicySet {
    pub defaults: Arc<Policy>,
    pub services: Map<String, Arc<Policy>>,
    /// The specs the services' policies were resolved from, to re-resolve them when the
    /// defaults change and to show operators what they wrote.
    pub specs: Map<String, PolicySpec>,
    /// Where each of `services` came from (a service not in it has [`PolicySource::Default`]).
    pub sources: Map<String, PolicySource>,
}

impl PolicySet {
    pub fn for_service(&self, service: &str) -> &Arc<Policy> {
        self.services.get(service).unwrap_or(&self.defaults)
    }

    pub fn source(&self, service: &str) -> PolicySource {
        self.sources.get(service).copied().unwrap_or_default()
    }

    /// Builds a set from the defaults' spec and the services' specs, validating everything.
    pub fn build(defaults: &PolicySpec, services: &BTreeMap<String, PolicySpec>) -> Result<Self, InvalidField> {
        let defaults = Arc::new(defaults.resolve(&Policy::default(), "defaults")?);
        let mut set = PolicySet { defaults, ..Default::default() };
        for (name, spec) in services {
            validate_service_name(&format!("services.{name}"), name)?;
            let policy = spec.resolve(&set.defaults, &format!("services.{name}"))?;
            set.services.insert(name.clone(), Arc::new(policy));
            set.specs.insert(name.clone(), spec.clone());
            set.sources.insert(name.clone(), PolicySource::File);
        }
        Ok(set)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_fields_inherit_from_the_defaults() {
        let defaults = PolicySpec { rule: Some("repeat(n=2)".into()), ..Default::default() };
        let services = BTreeMap::from([(
            "orders".to_owned(),
            PolicySpec {
                isolation_fallback: Some(IsolationFallback::Any),
                failure_threshold: Some(5),
                ..Default::default()
            },
        )]);
        let set = PolicySet::build(&defaults, &services).unwrap();
        let orders = set.for_service("orders");
        assert_eq!(&*orders.rule.canonical, "repeat(n=2)");
        assert_eq!(orders.isolation_fallback, IsolationFallback::Any);
        assert_eq!(orders.breaker.failure_threshold, 5);
        assert_eq!(set.for_service("other").isolation_fallback, IsolationFallback::Fail);
    }

    #[test]
    fn bad_policies_name_the_field() {
        let bad = |spec: PolicySpec| {
            PolicySet::build(&PolicySpec::default(), &BTreeMap::from([("s".to_owned(), spec)])).unwrap_err().to_string()
        };
        assert!(
            bad(PolicySpec { rule: Some("zigzag".into()), ..Default::default() })
                .starts_with("services.s.rule is invalid: rule \"zigzag\" is unknown")
        );
        assert_eq!(
            bad(PolicySpec { failure_threshold: Some(0), ..Default::default() }),
            "services.s.failure_threshold must be from 1 to 1000, got 0"
        );
        assert_eq!(
            bad(PolicySpec { blackout_max: Some(Duration::from_secs(1)), ..Default::default() }),
            "services.s.blackout_max must be at least blackout_base and at most 1h"
        );
    }
}
