//! What rota itself lays over an instance as its provider (or source) announced it: the
//! active health check's verdict, and (as it lands) an operator's override. The registry keeps
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

/// Why an instance's published status or weight is not what was announced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conditions {
    /// The status the provider or source announced.
    pub announced_status: Status,
    pub health: Option<Health>,
}

/// The layers of every instance that has one.
#[derive(Debug, Default)]
pub(crate) struct Layers {
    /// Per service, per id. Only registered instances have a verdict: it goes with them.
    health: HashMap<Arc<str>, HashMap<Arc<str>, Health>>,
}

impl Layers {
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

    /// `instance` as it is published: itself when nothing lies over it.
    pub(crate) fn apply(&self, instance: &Arc<Instance>) -> Arc<Instance> {
        let health = self.health.get(&instance.service).and_then(|ids| ids.get(&instance.id));
        let Some(health) = health else { return instance.clone() };
        let mut effective = Instance::clone(instance);
        if matches!(health, Health::Failing(_)) && effective.status == Status::Up {
            effective.status = Status::Down;
            effective.up_since = None;
        }
        effective.conditions =
            Some(Arc::new(Conditions { announced_status: instance.status, health: Some(health.clone()) }));
        Arc::new(effective)
    }

    pub(crate) fn touches(&self, service: &str) -> bool {
        self.health.contains_key(service)
    }
}

impl Instance {
    /// The instance as its provider announced it, without what rota laid over it.
    pub fn announced(&self) -> Instance {
        let mut announced = self.clone();
        if let Some(conditions) = announced.conditions.take() {
            announced.status = conditions.announced_status;
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
}
