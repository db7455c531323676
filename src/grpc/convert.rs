//! Protobuf ⇄ domain conversions. Nothing here validates: that is the registry's job, and
//! values that cannot be represented (an unknown enum number) are passed on for it to refuse.

use std::time::Duration;

use crate::balancer::{CallOutcome, CallResult, Picked};
use crate::pb;
use crate::registry::{Instance, InstanceRef, InstanceSpec, InstanceUpdate, RequestedStatus, Status};

pub fn instance_spec(instance: pb::Instance) -> InstanceSpec {
    InstanceSpec {
        id: instance.id,
        service: instance.service,
        host: instance.host,
        port: instance.port,
        version: instance.version,
        zone: instance.zone,
        weight: instance.weight,
        metadata: instance.metadata.into_iter().collect(),
        status: requested_status(instance.status),
    }
}

pub fn requested_status(value: i32) -> RequestedStatus {
    match pb::InstanceStatus::try_from(value) {
        Ok(pb::InstanceStatus::Unspecified) => RequestedStatus::Unset,
        Ok(pb::InstanceStatus::Up) => RequestedStatus::Known(Status::Up),
        Ok(pb::InstanceStatus::Draining) => RequestedStatus::Known(Status::Draining),
        Ok(pb::InstanceStatus::Down) => RequestedStatus::Known(Status::Down),
        Err(_) => RequestedStatus::Unknown(value),
    }
}

pub fn status(status: Status) -> pb::InstanceStatus {
    match status {
        Status::Up => pb::InstanceStatus::Up,
        Status::Draining => pb::InstanceStatus::Draining,
        Status::Down => pb::InstanceStatus::Down,
    }
}

/// Strings are copied with `String::from`, not `to_string` (which goes through `Display` and
/// its formatter for an `Arc<str>`): this runs for every pick.
pub fn instance(instance: &Instance) -> pb::Instance {
    pb::Instance {
        id: String::from(&*instance.id),
        service: String::from(&*instance.service),
        host: instance.host.clone(),
        port: u32::from(instance.port),
        version: String::from(&*instance.version),
        zone: String::from(&*instance.zone),
        weight: Some(instance.weight),
        metadata: instance.metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        status: status(instance.status).into(),
        announced_status: match &instance.conditions {
            Some(c) if c.announced_status != instance.status => status(c.announced_status).into(),
            _ => pb::InstanceStatus::Unspecified.into(),
        },
        // The verdict alone: why a check fails (refused, no answer, which status) would tell
        // any caller of the pick scope what answers at an address a provider names. The reason
        // is the admin scope's (the admin API, the dashboard) and the log's.
        health: match instance.conditions.as_ref().and_then(|c| c.health.as_ref()) {
            None => String::new(),
            Some(crate::registry::Health::Passing) => "passing".to_owned(),
            Some(crate::registry::Health::Failing(_)) => "failing".to_owned(),
        },
        operator: match instance.conditions.as_ref().and_then(|c| c.operator) {
            None => String::new(),
            Some(operator) => operator.describe(),
        },
        source: instance.source.as_deref().map(String::from).unwrap_or_default(),
    }
}

/// [`instance`], encoded: what a pick's answer carries (see [`super::pick_wire`]).
pub fn encoded_instance(instance: &Instance) -> bytes::Bytes {
    prost::Message::encode_to_vec(&self::instance(instance)).into()
}

pub fn instance_ref(reference: pb::InstanceRef) -> InstanceRef {
    InstanceRef { service: reference.service, id: reference.id }
}

pub fn pb_instance_ref(reference: InstanceRef) -> pb::InstanceRef {
    pb::InstanceRef { service: reference.service, id: reference.id }
}

pub fn instance_update(update: pb::Update) -> InstanceUpdate {
    let target = update.instance.unwrap_or_default();
    InstanceUpdate {
        service: target.service,
        id: target.id,
        weight: update.weight,
        status: requested_status(update.status),
        metadata: update.metadata.map(|m| m.entries.into_iter().collect()),
    }
}

pub fn picked(picked: Picked) -> pb::PickResponse {
    pb::PickResponse {
        instance: Some(instance(&picked.instance)),
        ticket: picked.ticket,
        rule: String::from(&*picked.rule),
        fallback: picked.fallback.unwrap_or_default(),
        epoch: picked.epoch,
        error: None,
    }
}

pub fn call_outcome(outcome: pb::CallOutcome) -> CallOutcome {
    let result = match pb::CallResult::try_from(outcome.result) {
        Ok(pb::CallResult::Ok) => Some(CallResult::Ok),
        Ok(pb::CallResult::ConnectFailure) => Some(CallResult::ConnectFailure),
        Ok(pb::CallResult::Error) => Some(CallResult::Error),
        Ok(pb::CallResult::Unspecified) | Err(_) => None,
    };
    CallOutcome {
        service: outcome.service,
        instance_id: outcome.instance_id,
        ticket: outcome.ticket,
        latency: Duration::from_micros(outcome.latency_us),
        result,
        leased: outcome.leased,
        rule: outcome.rule,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::registry::{Health, InstanceRecord, InstanceSpec, Registry, RegistryConfig};

    /// A pick-scoped answer says that a check fails, not why; the admin API's record says why.
    #[tokio::test]
    async fn a_failing_checks_reason_stays_out_of_pick_scoped_answers() {
        let registry = Registry::spawn(RegistryConfig::default());
        let lease = registry.open_lease();
        let spec = InstanceSpec {
            id: "a".into(),
            service: "svc".into(),
            host: "127.0.0.1".into(),
            port: 8080,
            ..Default::default()
        };
        assert_eq!(lease.announce(vec![spec]).await.unwrap().accepted.len(), 1);
        let (service, id): (Arc<str>, Arc<str>) = ("svc".into(), "a".into());
        registry.set_health(&service, &id, Some(Health::Failing("connect: connection refused".into())));
        // A round trip through the registry: the verdict is published by then.
        registry.overrides().await.unwrap();
        let snapshot = registry.service("svc").unwrap();
        let answered = instance(&snapshot.instances[0]);
        assert_eq!((answered.health.as_str(), answered.status), ("failing", pb::InstanceStatus::Down as i32));
        assert_eq!(decoded_health(&encoded_instance(&snapshot.instances[0])), "failing");
        let record = InstanceRecord::of(&snapshot.instances[0]);
        assert_eq!(record.health.as_deref(), Some("failing: connect: connection refused"));
    }

    fn decoded_health(bytes: &[u8]) -> String {
        <pb::Instance as prost::Message>::decode(bytes).unwrap().health
    }
}
