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
        health: match instance.conditions.as_ref().and_then(|c| c.health.as_ref()) {
            None => String::new(),
            Some(crate::registry::Health::Passing) => "passing".to_owned(),
            Some(crate::registry::Health::Failing(why)) => format!("failing: {why}"),
        },
        operator: match instance.conditions.as_ref().and_then(|c| c.operator) {
            None => String::new(),
            Some(operator) => operator.describe(),
        },
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
