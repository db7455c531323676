//! The one writer of the policies in force: two layers, one published set.
//!
//! Policies come from two places, and each keeps a layer of its own here:
//!
//! - the **file** layer: the config file's `[defaults]` and `[services.NAME]`, replaced as a
//!   whole when the file is reloaded;
//! - the **runtime** layer: overrides set with `SetPolicy`, one per service, kept until
//!   `ResetPolicy` drops them.
//!
//! Every change to either layer rebuilds the merged [`PolicySet`] that picks read: the file's
//! set, with each runtime override in place of the file's policy of that service. A reload
//! therefore replaces what the file said and keeps every override; dropping an override lets
//! the file's policy of the service (or the defaults) apply again.
//!
//! An override is resolved over the defaults (its unset fields take the defaults, as
//! `SetPolicy` always did), so a reload that changes the defaults re-resolves every override;
//! if one no longer validates against the new defaults (a `blackout_max` below the new
//! `blackout_base`, say), the reload is refused as a whole and names that service. The refused
//! file is held back, and applies as soon as that override is reset or replaced by one that
//! validates over it (a later read of the file, good or bad, supersedes it).
//!
//! Writes go through one mutex held while the merged set is built and stored, so two writers
//! never interleave a read-modify-swap and a reload cannot lose an override set meanwhile.
//! Readers never take it: a pick loads the published set from an `ArcSwap`. Writes are rare
//! (an operator, a file change), so the lock is never contended on a hot path, and no `.await`
//! happens while it is held.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use tokio::sync::mpsc;

use arc_swap::ArcSwap;
use tracing::info;

use super::{Policy, PolicySet, PolicySource, PolicySpec};
use crate::registry::{InvalidField, validate_service_name};

/// Most runtime overrides kept at once. Each holds a resolved policy (a gray-release schedule
/// can be large), and `SetPolicy` must not let a caller grow rota without bound; the config
/// file is not counted against it.
pub const MAX_RUNTIME_OVERRIDES: usize = 1000;

/// Why a runtime change was refused; nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error(transparent)]
    Invalid(#[from] InvalidField),
    #[error(
        "{limit} runtime overrides are in force, the most rota keeps; reset one (ResetPolicy) before overriding \
         another service"
    )]
    TooManyOverrides { limit: usize },
    /// `in_force`: where the service's policy comes from, as it has no override.
    #[error("service {service:?} has no runtime override to reset; {}", applies(*.in_force))]
    NoOverride { service: String, in_force: PolicySource },
}

fn applies(source: PolicySource) -> &'static str {
    match source {
        PolicySource::File => "the config file's policy of it applies",
        _ => "the defaults apply to it",
    }
}

/// Why a reloaded file was refused; the policies in force stay.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the runtime override of {service:?} does not validate over the file's defaults ({error}); the file applies once \
     that override is reset or replaced"
)]
pub struct OverrideConflict {
    pub service: String,
    pub error: InvalidField,
}

/// A runtime override: what the operator sent, and the policy it resolved to over the
/// defaults of the file layer in force.
#[derive(Debug, Clone)]
struct Override {
    spec: PolicySpec,
    policy: Arc<Policy>,
}

#[derive(Debug, Default)]
struct Layers {
    /// The file's policies as loaded (every service's source is `File`).
    file: PolicySet,
    runtime: BTreeMap<String, Override>,
    /// The last file read, when it was refused because an override could not live with it:
    /// it applies as soon as the overrides change so that it can.
    held_back: Option<PolicySet>,
}

impl Layers {
    /// The file's set with every override in place.
    fn merged(&self) -> PolicySet {
        let mut set = self.file.clone();
        for (service, entry) in &self.runtime {
            set.services.insert(service.clone(), entry.policy.clone());
            set.specs.insert(service.clone(), entry.spec.clone());
            set.sources.insert(service.clone(), PolicySource::Runtime);
        }
        set
    }

    /// The overrides resolved again over `file`'s defaults (`None`: the defaults did not
    /// change, nor do the overrides), or the first that does not validate over them.
    fn rebased(&self, file: &PolicySet) -> Result<Option<BTreeMap<String, Override>>, OverrideConflict> {
        if file.defaults == self.file.defaults {
            return Ok(None);
        }
        let mut runtime = BTreeMap::new();
        for (service, entry) in &self.runtime {
            let policy = entry
                .spec
                .resolve(&file.defaults, "policy")
                .map_err(|error| OverrideConflict { service: service.clone(), error })?;
            runtime.insert(service.clone(), Override { spec: entry.spec.clone(), policy: Arc::new(policy) });
        }
        Ok(Some(runtime))
    }

    /// Makes `file` the file layer if every override validates over it; else holds it back.
    fn take_file(&mut self, file: PolicySet) -> Result<(), OverrideConflict> {
        match self.rebased(&file) {
            Ok(runtime) => {
                if let Some(runtime) = runtime {
                    self.runtime = runtime;
                }
                self.file = file;
                self.held_back = None;
                Ok(())
            }
            Err(conflict) => {
                self.held_back = Some(file);
                Err(conflict)
            }
        }
    }

    /// Applies the held-back file if the overrides now allow it.
    fn retry_held_back(&mut self) {
        if let Some(file) = self.held_back.take()
            && self.take_file(file).is_ok()
        {
            info!("the policy file held back by a runtime override applies now");
        }
    }
}

/// The live policy set and its two layers.
#[derive(Debug, Default)]
pub struct Policies {
    /// What picks read: the merged set, replaced whole on every change.
    current: ArcSwap<PolicySet>,
    /// The only write path: held while a change is validated, merged and published.
    layers: Mutex<Layers>,
    /// Where changes of the runtime layer made here (`SetPolicy`, `ResetPolicy`) go, once
    /// something shares them with other replicas.
    runtime_changes: OnceLock<mpsc::UnboundedSender<RuntimeChange>>,
}

/// One change of the runtime layer made on this replica: a service's new override, or `None`
/// when it was dropped.
pub type RuntimeChange = (String, Option<PolicySpec>);

impl Policies {
    /// Policies with `file` as the file layer and no runtime overrides.
    pub fn new(file: PolicySet) -> Self {
        let layers = Layers { file, ..Layers::default() };
        Self {
            current: ArcSwap::from_pointee(layers.merged()),
            layers: Mutex::new(layers),
            runtime_changes: OnceLock::new(),
        }
    }

    /// The merged set in force.
    pub fn load(&self) -> arc_swap::Guard<Arc<PolicySet>> {
        self.current.load()
    }

    fn write(&self) -> std::sync::MutexGuard<'_, Layers> {
        // A panic while the lock was held left the layers as they were: every change is
        // computed first and stored only once it validated.
        self.layers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Replaces the file layer (a reload). Runtime overrides stay; when the defaults changed
    /// they are resolved again over the new ones, and if one no longer validates nothing
    /// changes: the file is held back until that override is reset or replaced.
    pub fn replace_file(&self, file: PolicySet) -> Result<(), OverrideConflict> {
        let mut layers = self.write();
        layers.take_file(file)?;
        self.current.store(Arc::new(layers.merged()));
        Ok(())
    }

    /// The file could not be read or did not validate: a file held back earlier is no longer
    /// what the file says, and will not apply.
    pub fn file_refused(&self) {
        self.write().held_back = None;
    }

    /// Sets `service`'s runtime override from a spec resolved over the defaults; returns the
    /// policy now in force for it.
    pub fn set_service(&self, service: &str, spec: PolicySpec) -> Result<Arc<Policy>, PolicyError> {
        validate_service_name("service", service)?;
        let mut layers = self.write();
        let policy = Arc::new(spec.resolve(&layers.file.defaults, "policy")?);
        if !layers.runtime.contains_key(service) && layers.runtime.len() >= MAX_RUNTIME_OVERRIDES {
            return Err(PolicyError::TooManyOverrides { limit: MAX_RUNTIME_OVERRIDES });
        }
        layers.runtime.insert(service.to_owned(), Override { spec: spec.clone(), policy });
        self.tell((service.to_owned(), Some(spec)));
        layers.retry_held_back();
        let merged = layers.merged();
        let now = merged.for_service(service).clone();
        self.current.store(Arc::new(merged));
        Ok(now)
    }

    /// Drops `service`'s runtime override; returns the policy now in force for it and where
    /// that comes from (the file, or the defaults).
    pub fn reset_service(&self, service: &str) -> Result<(Arc<Policy>, PolicySource), PolicyError> {
        validate_service_name("service", service)?;
        let mut layers = self.write();
        if layers.runtime.remove(service).is_none() {
            let in_force = layers.file.source(service);
            return Err(PolicyError::NoOverride { service: service.to_owned(), in_force });
        }
        self.tell((service.to_owned(), None));
        layers.retry_held_back();
        let merged = layers.merged();
        let now = (merged.for_service(service).clone(), merged.source(service));
        self.current.store(Arc::new(merged));
        Ok(now)
    }

    /// The merged set in force, to keep.
    pub fn load_full(&self) -> Arc<PolicySet> {
        self.current.load_full()
    }

    /// Every later change of the runtime layer made here, in order (one follower at most:
    /// `None` when one follows already).
    pub fn follow_runtime_changes(&self) -> Option<mpsc::UnboundedReceiver<RuntimeChange>> {
        let (tx, rx) = mpsc::unbounded_channel();
        self.runtime_changes.set(tx).ok()?;
        Some(rx)
    }

    /// Told while the layers are locked, so the follower sees changes in the order they apply.
    fn tell(&self, change: RuntimeChange) {
        if let Some(follower) = self.runtime_changes.get() {
            let _ = follower.send(change);
        }
    }

    /// The runtime layer as sent: service → spec.
    pub fn runtime_specs(&self) -> BTreeMap<String, PolicySpec> {
        self.write().runtime.iter().map(|(service, entry)| (service.clone(), entry.spec.clone())).collect()
    }

    /// Replaces the whole runtime layer with `specs` (what the replicas share), each resolved
    /// over the file's defaults; a spec that does not resolve here, or one past
    /// [`MAX_RUNTIME_OVERRIDES`], is left out and logged. Not counted as a local change.
    pub fn replace_runtime(&self, specs: BTreeMap<String, PolicySpec>) {
        let mut layers = self.write();
        let mut runtime = BTreeMap::new();
        for (service, spec) in specs {
            if runtime.len() >= MAX_RUNTIME_OVERRIDES || validate_service_name("service", &service).is_err() {
                tracing::warn!(%service, "shared policy override left out: invalid name or over the limit");
                continue;
            }
            match spec.resolve(&layers.file.defaults, "policy") {
                Ok(policy) => {
                    runtime.insert(service, Override { spec, policy: Arc::new(policy) });
                }
                Err(error) => tracing::warn!(%service, %error, "shared policy override left out"),
            }
        }
        layers.runtime = runtime;
        layers.retry_held_back();
        self.current.store(Arc::new(layers.merged()));
    }

    /// How many runtime overrides are in force.
    pub fn runtime_overrides(&self) -> usize {
        self.write().runtime.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::file::parse;

    fn rule(policies: &Policies, service: &str) -> (String, PolicySource) {
        let set = policies.load();
        (set.for_service(service).rule.canonical.to_string(), set.source(service))
    }

    fn spec(rule: &str) -> PolicySpec {
        PolicySpec { rule: Some(rule.into()), ..Default::default() }
    }

    const FILE: &str = "[defaults]\nrule = \"random\"\n[services.orders]\nrule = \"repeat(n=2)\"\n";

    #[test]
    fn the_source_says_which_layer_a_policy_came_from() {
        let policies = Policies::new(parse(FILE).unwrap());
        policies.set_service("payments", spec("weighted")).unwrap();
        assert_eq!(rule(&policies, "orders"), ("repeat(n=2)".into(), PolicySource::File));
        assert_eq!(rule(&policies, "payments"), ("weighted".into(), PolicySource::Runtime));
        assert_eq!(rule(&policies, "other"), ("random".into(), PolicySource::Default));
    }

    #[test]
    fn a_runtime_override_wins_over_the_file_and_survives_a_reload() {
        let policies = Policies::new(parse(FILE).unwrap());
        policies.set_service("orders", spec("weighted")).unwrap();
        assert_eq!(rule(&policies, "orders"), ("weighted".into(), PolicySource::Runtime));
        policies.replace_file(parse("[services.orders]\nrule = \"repeat(n=5)\"\n").unwrap()).unwrap();
        assert_eq!(rule(&policies, "orders"), ("weighted".into(), PolicySource::Runtime));
        assert_eq!(
            rule(&policies, "other"),
            ("round_robin".into(), PolicySource::Default),
            "the file's defaults apply"
        );
    }

    #[test]
    fn dropping_an_override_reverts_to_the_file_as_reloaded_meanwhile() {
        let policies = Policies::new(parse(FILE).unwrap());
        policies.set_service("orders", spec("weighted")).unwrap();
        policies.replace_file(parse("[services.orders]\nrule = \"repeat(n=5)\"\n").unwrap()).unwrap();
        let (policy, source) = policies.reset_service("orders").unwrap();
        assert_eq!((&*policy.rule.canonical, source), ("repeat(n=5)", PolicySource::File));
        assert_eq!(rule(&policies, "orders"), ("repeat(n=5)".into(), PolicySource::File));
        assert_eq!(policies.runtime_overrides(), 0);
    }

    #[test]
    fn a_service_the_file_drops_falls_back_to_the_defaults_unless_overridden() {
        let file = "[services.orders]\nrule = \"repeat(n=2)\"\n[services.payments]\nrule = \"repeat(n=3)\"\n";
        let policies = Policies::new(parse(file).unwrap());
        policies.set_service("payments", spec("weighted")).unwrap();
        policies.replace_file(parse("[defaults]\nrule = \"random\"\n").unwrap()).unwrap();
        assert_eq!(rule(&policies, "orders"), ("random".into(), PolicySource::Default));
        assert_eq!(rule(&policies, "payments"), ("weighted".into(), PolicySource::Runtime));
        let (policy, source) = policies.reset_service("payments").unwrap();
        assert_eq!((&*policy.rule.canonical, source), ("random", PolicySource::Default));
    }

    #[test]
    fn overrides_take_unset_fields_from_the_defaults_in_force() {
        let policies = Policies::new(PolicySet::default());
        let threshold = PolicySpec { failure_threshold: Some(7), ..Default::default() };
        policies.set_service("orders", threshold).unwrap();
        policies.replace_file(parse("[defaults]\nrule = \"random\"\n").unwrap()).unwrap();
        let set = policies.load();
        let orders = set.for_service("orders");
        assert_eq!((&*orders.rule.canonical, orders.breaker.failure_threshold), ("random", 7));
    }

    #[test]
    fn a_reload_an_override_cannot_live_with_is_refused_whole() {
        let policies = Policies::new(parse(FILE).unwrap());
        let short = PolicySpec { blackout_max: Some(std::time::Duration::from_secs(20)), ..Default::default() };
        policies.set_service("payments", short).unwrap();
        let before = policies.load_full();
        let conflicting = parse("[defaults]\nrule = \"weighted\"\nbreaker = { blackout_base = \"25s\" }\n").unwrap();
        let error = policies.replace_file(conflicting).unwrap_err();
        assert_eq!(error.service, "payments");
        assert!(error.to_string().contains("policy.blackout_max must be at least blackout_base"), "{error}");
        assert!(Arc::ptr_eq(&before, &policies.load_full()), "nothing was published");
        assert_eq!(rule(&policies, "other"), ("random".into(), PolicySource::Default), "the old file stays");

        // Once the override is gone, the held-back file applies.
        let (policy, source) = policies.reset_service("payments").unwrap();
        assert_eq!((&*policy.rule.canonical, source), ("weighted", PolicySource::Default));
        assert_eq!(rule(&policies, "orders"), ("weighted".into(), PolicySource::Default), "the new file applies");
    }

    #[test]
    fn a_held_back_file_applies_when_its_override_is_replaced_but_not_after_a_bad_read() {
        let policies = Policies::new(parse(FILE).unwrap());
        let max = |secs| PolicySpec { blackout_max: Some(std::time::Duration::from_secs(secs)), ..Default::default() };
        policies.set_service("payments", max(20)).unwrap();
        let conflicting = "[defaults]\nrule = \"weighted\"\nbreaker = { blackout_base = \"25s\" }\n";
        policies.replace_file(parse(conflicting).unwrap()).unwrap_err();
        // Replaced by an override that validates over the held-back file: both apply, and the
        // answer is the override resolved over the new defaults.
        let now = policies.set_service("payments", max(40)).unwrap();
        assert_eq!((&*now.rule.canonical, now.breaker.blackout_base.as_secs()), ("weighted", 25));
        assert_eq!(rule(&policies, "other"), ("weighted".into(), PolicySource::Default));

        // A refused file followed by a read that failed: the held-back file is forgotten.
        let policies = Policies::new(parse(FILE).unwrap());
        policies.set_service("payments", max(20)).unwrap();
        policies.replace_file(parse(conflicting).unwrap()).unwrap_err();
        policies.file_refused();
        policies.reset_service("payments").unwrap();
        assert_eq!(rule(&policies, "other"), ("random".into(), PolicySource::Default), "the old file stays");
    }

    #[test]
    fn bad_input_changes_nothing() {
        let policies = Policies::new(parse(FILE).unwrap());
        policies.set_service("orders", spec("weighted")).unwrap();
        let before = policies.load_full();
        assert!(matches!(policies.set_service("orders", spec("zigzag")), Err(PolicyError::Invalid(_))));
        assert!(matches!(policies.set_service("a b", spec("random")), Err(PolicyError::Invalid(_))));
        assert!(matches!(policies.reset_service(""), Err(PolicyError::Invalid(_))));
        let error = policies.reset_service("payments").unwrap_err();
        assert_eq!(error, PolicyError::NoOverride { service: "payments".into(), in_force: PolicySource::Default });
        assert_eq!(
            policies.reset_service("payments").unwrap_err().to_string(),
            "service \"payments\" has no runtime override to reset; the defaults apply to it"
        );
        assert!(Arc::ptr_eq(&before, &policies.load_full()), "nothing was published");
        assert_eq!(rule(&policies, "orders"), ("weighted".into(), PolicySource::Runtime));
    }

    #[test]
    fn runtime_overrides_are_bounded_but_existing_ones_can_change() {
        let policies = Policies::new(PolicySet::default());
        for i in 0..MAX_RUNTIME_OVERRIDES {
            policies.set_service(&format!("s{i}"), spec("random")).unwrap();
        }
        let error = policies.set_service("one-more", spec("random")).unwrap_err();
        assert_eq!(error, PolicyError::TooManyOverrides { limit: MAX_RUNTIME_OVERRIDES });
        assert_eq!(rule(&policies, "one-more").1, PolicySource::Default);
        policies.set_service("s0", spec("weighted")).unwrap();
        policies.reset_service("s1").unwrap();
        policies.set_service("one-more", spec("random")).unwrap();
        assert_eq!(policies.runtime_overrides(), MAX_RUNTIME_OVERRIDES);
    }
}
