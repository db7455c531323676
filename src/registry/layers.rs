//! What rota itself lays over an instance as its provider (or source) announced it: an
//! operator's override (`rota instance drain|disable|weight`) and the active health check's
//! verdict. The registry keeps
//! the announced instance and publishes the instance with its layers applied, so every reader
//! — pick views, Watch, listings, xDS, the dashboard — sees one effective status, and the
//! [`Conditions`] that made it.

use std::collections::HashMap;
use std::sync::Arc;

use super::instance::{Instance, Status};

/// The active health check's verdict on one instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// Its checks pass (or it has not failed `unhealthy_after` in a row yet).
    Passing,
    /// It failed `unhealthy_after` checks in a row and has not passed `healthy_after` since:
    /// it gets no picks. The last failure, for people.
    Failing(Arc<str>),
}

/// What an operator set on one instance, over what its provider or source says. Kept until
/// cleared, whether the instance is registered or not (one that restarts stays drained).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Override {
    pub status: Option<OperatorStatus>,
    pub weight: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperatorStatus {
    /// No new picks (an UP instance is published DRAINING).
    Drain,
    /// Published DOWN.
    Disable,
}

impl Override {
    pub fn is_empty(&self) -> bool {
        self.status.is_none() && self.weight.is_none()
    }

    /// Reads what [`Override::describe`] wrote.
    pub fn parse(text: &str) -> Option<Self> {
        let mut value = Override::default();
        for part in text.split(',').filter(|p| !p.is_empty()) {
            match part {
                "drain" => value.status = Some(OperatorStatus::Drain),
                "disable" => value.status = Some(OperatorStatus::Disable),
                _ => value.weight = Some(part.strip_prefix("weight=")?.parse().ok()?),
            }
        }
        Some(value)
    }

    /// `drain`, `disable`, `weight=N`, joined by `,`; empty when nothing is set.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        match self.status {
            Some(OperatorStatus::Drain) => parts.push("drain".to_owned()),
            Some(OperatorStatus::Disable) => parts.push("disable".to_owned()),
            None => {}
        }
        if let Some(weight) = self.weight {
            parts.push(format!("weight={weight}"));
        }
        parts.join(",")
    }
}

/// What an operator asks of one instance's override.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverrideChange {
    Drain,
    Disable,
    /// Drops the status override (drain or disable); the weight override stays.
    Enable,
    Weight(u32),
    /// Drops the whole override.
    Clear,
}

/// Why a change to an override was refused; nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OverrideRefused {
    #[error("{MAX_OVERRIDES} instance overrides are kept at most; clear one first")]
    TooMany,
    #[error("instance {id:?} of service {service:?} has no {what} override to clear")]
    NothingToClear { service: String, id: String, what: &'static str },
}

impl Override {
    /// This override with `change` made.
    pub fn changed(mut self, change: OverrideChange) -> Self {
        match change {
            OverrideChange::Drain => self.status = Some(OperatorStatus::Drain),
            OverrideChange::Disable => self.status = Some(OperatorStatus::Disable),
            OverrideChange::Enable => self.status = None,
            OverrideChange::Weight(weight) => self.weight = Some(weight),
            OverrideChange::Clear => self = Override::default(),
        }
        self
    }
}

/// Every override: (service, id, override), by service then id.
pub type OverrideList = Vec<(Arc<str>, Arc<str>, Override)>;

/// The most operator overrides kept at once.
pub const MAX_OVERRIDES: usize = 10_000;

/// Why an instance's published status or weight is not what was announced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conditions {
    /// The status the provider or source announced.
    pub announced_status: Status,
    pub announced_weight: u32,
    pub operator: Option<Override>,
    pub health: Option<Health>,
}

/// The layers of every instance that has one.
#[derive(Debug, Default)]
pub(crate) struct Layers {
    /// Per service, per id. Only registered instances have a verdict: it goes with them.
    health: HashMap<Arc<str>, HashMap<Arc<str>, Health>>,
    /// Per service, per id; at most [`MAX_OVERRIDES`] in all.
    operator: HashMap<Arc<str>, HashMap<Arc<str>, Override>>,
    overrides: usize,
}

impl Layers {
    /// Replaces an instance's override (an empty one clears it). `None` when it would be one
    /// too many.
    pub(crate) fn set_override(&mut self, service: &Arc<str>, id: &Arc<str>, value: Override) -> Option<()> {
        let entry = self.operator.entry(service.clone()).or_default();
        let had = entry.contains_key(id);
        if value.is_empty() {
            if entry.remove(id).is_some() {
                self.overrides -= 1;
            }
        } else {
            if !had && self.overrides >= MAX_OVERRIDES {
                if entry.is_empty() {
                    self.operator.remove(service);
                }
                return None;
            }
            if entry.insert(id.clone(), value).is_none() {
                self.overrides += 1;
            }
        }
        if self.operator.get(service).is_some_and(HashMap::is_empty) {
            self.operator.remove(service);
        }
        Some(())
    }

    /// Replaces every override with `all` (the replicas' shared layer); returns the services
    /// whose overrides changed. Past [`MAX_OVERRIDES`], the rest are left out.
    pub(crate) fn replace_overrides(&mut self, all: OverrideList) -> Vec<Arc<str>> {
        let before = std::mem::take(&mut self.operator);
        self.overrides = 0;
        for (service, id, value) in all {
            if !value.is_empty() && self.set_override(&service, &id, value).is_none() {
                tracing::warn!(%service, %id, "shared instance override left out: over the limit");
            }
        }
        let mut changed: Vec<Arc<str>> = before
            .keys()
            .chain(self.operator.keys())
            .filter(|s| before.get(*s) != self.operator.get(*s))
            .cloned()
            .collect();
        changed.sort();
        changed.dedup();
        changed
    }

    pub(crate) fn operator(&self, service: &str, id: &str) -> Override {
        self.operator.get(service).and_then(|ids| ids.get(id)).copied().unwrap_or_default()
    }

    /// Every override, by service then id.
    pub(crate) fn overrides(&self) -> OverrideList {
        let mut all: Vec<_> = self
            .operator
            .iter()
            .flat_map(|(service, ids)| ids.iter().map(move |(id, value)| (service.clone(), id.clone(), *value)))
            .collect();
        all.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
        all
    }

    /// Sets (or, with `None`, clears) an instance's verdict; true when that changed it.
    pub(crate) fn set_health(&mut self, service: &Arc<str>, id: &Arc<str>, health: Option<Health>) -> bool {
        match health {
            Some(health) => {
                let entry = self.health.entry(service.clone()).or_default();
                entry.insert(id.clone(), health.clone()) != Some(health)
            }
            None => {
                let Some(entry) = self.health.get_mut(service) else { return false };
                let removed = entry.remove(id).is_some();
                if entry.is_empty() {
                    self.health.remove(service);
                }
                removed
            }
        }
    }

    /// Forgets what rota knew of an instance that left.
    pub(crate) fn forget(&mut self, service: &Arc<str>, id: &Arc<str>) {
        self.set_health(service, id, None);
    }

    /// `instance` as it is published: itself when nothing lies over it. The operator's
    /// override comes first; a failing health check then keeps an instance still UP from picks.
    pub(crate) fn apply(&self, instance: &Arc<Instance>) -> Arc<Instance> {
        let health = self.health.get(&instance.service).and_then(|ids| ids.get(&instance.id));
        let operator = self.operator.get(&instance.service).and_then(|ids| ids.get(&instance.id));
        if health.is_none() && operator.is_none() {
            return instance.clone();
        }
        let mut effective = Instance::clone(instance);
        if let Some(operator) = operator {
            match operator.status {
                Some(OperatorStatus::Disable) => effective.status = Status::Down,
                Some(OperatorStatus::Drain) if effective.status == Status::Up => effective.status = Status::Draining,
                _ => {}
            }
            if let Some(weight) = operator.weight {
                effective.weight = weight;
            }
        }
        if matches!(health, Some(Health::Failing(_))) && effective.status == Status::Up {
            effective.status = Status::Down;
        }
        if effective.status != Status::Up {
            effective.up_since = None;
        }
        effective.conditions = Some(Arc::new(Conditions {
            announced_status: instance.status,
            announced_weight: instance.weight,
            operator: operator.copied(),
            health: health.cloned(),
        }));
        Arc::new(effective)
    }

    pub(crate) fn touches(&self, service: &str) -> bool {
        self.health.contains_key(service) || self.operator.contains_key(service)
    }
}

impl Instance {
    /// The instance as its provider announced it, without what rota laid over it.
    pub fn announced(&self) -> Instance {
        let mut announced = self.clone();
        if let Some(conditions) = announced.conditions.take() {
            announced.status = conditions.announced_status;
            announced.weight = conditions.announced_weight;
        }
        announced
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::InstanceSpec;

    fn instance(status: Status) -> Arc<Instance> {
        let spec = InstanceSpec {
            service: "orders".into(),
            host: "127.0.0.1".into(),
            port: 1,
            status: crate::registry::RequestedStatus::Known(status),
            ..Default::default()
        };
        Arc::new(spec.validate("i").unwrap())
    }

    #[test]
    fn a_failing_instance_is_published_down_with_what_was_announced_and_why() {
        let mut layers = Layers::default();
        let up = instance(Status::Up);
        assert!(Arc::ptr_eq(&layers.apply(&up), &up), "nothing laid over: the same instance");
        assert!(layers.set_health(&up.service, &up.id, Some(Health::Failing("refused".into()))));
        assert!(!layers.set_health(&up.service, &up.id, Some(Health::Failing("refused".into()))), "no change");
        let published = layers.apply(&up);
        assert_eq!(published.status, Status::Down);
        let conditions = published.conditions.as_ref().unwrap();
        assert_eq!(conditions.announced_status, Status::Up);
        assert_eq!(published.announced(), *up);
        // A draining instance stays draining: the verdict only keeps picks away.
        let draining = instance(Status::Draining);
        assert_eq!(layers.apply(&draining).status, Status::Draining);
        layers.set_health(&up.service, &up.id, Some(Health::Passing));
        assert_eq!(layers.apply(&up).status, Status::Up);
        layers.forget(&up.service, &up.id);
        assert!(!layers.touches("orders"));
    }

    #[test]
    fn an_operators_override_comes_first_and_stays_until_cleared() {
        let mut layers = Layers::default();
        let up = instance(Status::Up);
        let drain = Override { status: Some(OperatorStatus::Drain), weight: Some(7) };
        layers.set_override(&up.service, &up.id, drain).unwrap();
        let published = layers.apply(&up);
        assert_eq!((published.status, published.weight), (Status::Draining, 7));
        assert_eq!(published.conditions.as_ref().unwrap().operator.unwrap().describe(), "drain,weight=7");
        assert_eq!(published.announced(), *up);
        // Forgetting a departed instance's health leaves the operator's word.
        layers.forget(&up.service, &up.id);
        assert_eq!(layers.apply(&up).status, Status::Draining);
        let disable = Override { status: Some(OperatorStatus::Disable), weight: None };
        layers.set_override(&up.service, &up.id, disable).unwrap();
        assert_eq!(layers.apply(&instance(Status::Draining)).status, Status::Down);
        layers.set_override(&up.service, &up.id, Override::default()).unwrap();
        assert!(Arc::ptr_eq(&layers.apply(&up), &up));
        assert!(layers.overrides().is_empty() && !layers.touches("orders"));
    }

    #[test]
    fn overrides_are_bounded_and_replacing_one_is_always_allowed() {
        let mut layers = Layers::default();
        let service: Arc<str> = "orders".into();
        let weight = Override { status: None, weight: Some(1) };
        for i in 0..MAX_OVERRIDES {
            layers.set_override(&service, &format!("i{i}").into(), weight).unwrap();
        }
        assert_eq!(layers.set_override(&"other".into(), &"new".into(), weight), None);
        assert!(!layers.touches("other"), "a refused override leaves nothing behind");
        assert_eq!(layers.set_override(&service, &"i0".into(), Override { weight: Some(2), ..weight }), Some(()));
        layers.set_override(&service, &"i0".into(), Override::default()).unwrap();
        assert_eq!(layers.set_override(&"other".into(), &"new".into(), weight), Some(()));
    }
}
