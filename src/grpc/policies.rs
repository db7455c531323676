//! `rota.v1.Policies`: read per-service policies, and set or drop their runtime overrides.

use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Response, Status};

use crate::pb;
use crate::policy::{
    EjectionSpec, GraySpec, HealthCheckSpec, IsolationFallback, Policies, Policy, PolicySource, PolicySpec,
};
use crate::registry::{InvalidField, validate_service_name};

pub struct PoliciesService {
    policies: Arc<Policies>,
    /// Where operators' instance overrides are kept.
    registry: crate::registry::Registry,
}

impl PoliciesService {
    pub fn new(policies: Arc<Policies>, registry: crate::registry::Registry) -> Self {
        Self { policies, registry }
    }
}

fn to_pb(service: &str, policy: &Policy, source: PolicySource) -> pb::Policy {
    pb::Policy {
        service: service.to_owned(),
        rule: policy.rule.canonical.to_string(),
        isolation_fallback: match policy.isolation_fallback {
            IsolationFallback::Fail => pb::IsolationFallback::Fail,
            IsolationFallback::Any => pb::IsolationFallback::Any,
        }
        .into(),
        gray: policy.gray.as_ref().map(|gray| pb::GrayRelease {
            unversioned: gray.unversioned,
            versions: gray.versions.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        }),
        breaker: Some(pb::Breaker {
            failure_threshold: policy.breaker.failure_threshold,
            blackout_base_ms: policy.breaker.blackout_base.as_millis() as u64,
            blackout_max_ms: policy.breaker.blackout_max.as_millis() as u64,
        }),
        is_default: source == PolicySource::Default,
        source: match source {
            PolicySource::Default => pb::PolicySource::Default,
            PolicySource::File => pb::PolicySource::File,
            PolicySource::Runtime => pb::PolicySource::Runtime,
        }
        .into(),
        ejection: Some(pb::Ejection {
            disabled: !policy.ejection.enabled,
            max_ejected_percent: policy.ejection.max_ejected_percent,
            failure_rate_percent: policy.ejection.failure_rate_percent,
            failure_rate_min_calls: policy.ejection.failure_rate_min_calls,
        }),
        health_check: policy.health_check.as_ref().map(|check| pb::HealthCheck {
            kind: check.kind.name().to_owned(),
            path: check.kind.path().to_owned(),
            interval_ms: check.interval.as_millis() as u64,
            timeout_ms: check.timeout.as_millis() as u64,
            unhealthy_after: check.unhealthy_after,
            healthy_after: check.healthy_after,
        }),
    }
}

fn spec(policy: &pb::Policy) -> Result<PolicySpec, Status> {
    let isolation_fallback = match pb::IsolationFallback::try_from(policy.isolation_fallback) {
        Ok(pb::IsolationFallback::Unspecified) => None,
        Ok(pb::IsolationFallback::Fail) => Some(IsolationFallback::Fail),
        Ok(pb::IsolationFallback::Any) => Some(IsolationFallback::Any),
        Err(_) => {
            let problem =
                format!("is {}; expected ISOLATION_FALLBACK_FAIL or ISOLATION_FALLBACK_ANY", policy.isolation_fallback);
            return Err(InvalidField::new("policy.isolation_fallback", problem).into());
        }
    };
    let breaker = policy.breaker.unwrap_or_default();
    let nonzero_ms = |ms: u64| (ms > 0).then(|| Duration::from_millis(ms));
    let health_check = policy.health_check.as_ref().map(|h| HealthCheckSpec {
        kind: h.kind.clone(),
        path: Some(h.path.clone()).filter(|p| !p.is_empty()),
        interval: nonzero_ms(h.interval_ms),
        timeout: nonzero_ms(h.timeout_ms),
        unhealthy_after: Some(h.unhealthy_after).filter(|n| *n > 0),
        healthy_after: Some(h.healthy_after).filter(|n| *n > 0),
    });
    Ok(PolicySpec {
        health_check,
        rule: Some(policy.rule.clone()).filter(|r| !r.is_empty()),
        isolation_fallback,
        gray: policy.gray.as_ref().map(|g| GraySpec {
            unversioned: g.unversioned,
            versions: g.versions.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        }),
        failure_threshold: Some(breaker.failure_threshold).filter(|t| *t > 0),
        blackout_base: nonzero_ms(breaker.blackout_base_ms),
        blackout_max: nonzero_ms(breaker.blackout_max_ms),
        ejection: policy.ejection.map_or_else(EjectionSpec::default, |e| {
            let nonzero = |value: u32| (value > 0).then_some(value);
            EjectionSpec {
                enabled: e.disabled.then_some(false),
                max_ejected_percent: nonzero(e.max_ejected_percent),
                failure_rate_percent: nonzero(e.failure_rate_percent),
                failure_rate_min_calls: nonzero(e.failure_rate_min_calls),
            }
        }),
    })
}

#[tonic::async_trait]
impl pb::policies_server::Policies for PoliciesService {
    async fn get_policy(&self, request: Request<pb::GetPolicyRequest>) -> Result<Response<pb::Policy>, Status> {
        let service = &request.get_ref().service;
        validate_service_name("service", service)?;
        let set = self.policies.load();
        Ok(Response::new(to_pb(service, set.for_service(service), set.source(service))))
    }

    async fn set_policy(&self, request: Request<pb::SetPolicyRequest>) -> Result<Response<pb::Policy>, Status> {
        let policy = request.into_inner().policy.ok_or_else(|| InvalidField::new("policy", "must be set"))?;
        validate_service_name("policy.service", &policy.service)?;
        let spec = spec(&policy)?;
        let stored = self.policies.set_service(&policy.service, spec)?;
        tracing::info!(service = %policy.service, rule = %stored.rule.canonical, "policy override set");
        Ok(Response::new(to_pb(&policy.service, &stored, PolicySource::Runtime)))
    }

    async fn list_policies(
        &self,
        _request: Request<pb::ListPoliciesRequest>,
    ) -> Result<Response<pb::ListPoliciesResponse>, Status> {
        let set = self.policies.load();
        let mut services: Vec<pb::Policy> =
            set.services.iter().map(|(name, p)| to_pb(name, p, set.source(name))).collect();
        services.sort_by(|a, b| a.service.cmp(&b.service));
        let defaults = to_pb("", &set.defaults, PolicySource::Default);
        Ok(Response::new(pb::ListPoliciesResponse { defaults: Some(defaults), services }))
    }

    async fn reset_policy(&self, request: Request<pb::ResetPolicyRequest>) -> Result<Response<pb::Policy>, Status> {
        let service = &request.get_ref().service;
        let (policy, source) = self.policies.reset_service(service)?;
        tracing::info!(service = %service, now = %source, "policy override dropped");
        Ok(Response::new(to_pb(service, &policy, source)))
    }

    async fn set_instance_override(
        &self,
        request: Request<pb::SetInstanceOverrideRequest>,
    ) -> Result<Response<pb::InstanceOverride>, Status> {
        use crate::registry::{OverrideChange, OverrideRefused};
        let request = request.into_inner();
        validate_service_name("service", &request.service)?;
        if request.id.is_empty() {
            return Err(InvalidField::new("id", "must not be empty").into());
        }
        crate::registry::validate_optional_name("id", &request.id)?;
        let change = match pb::OverrideAction::try_from(request.action) {
            Ok(pb::OverrideAction::Drain) => OverrideChange::Drain,
            Ok(pb::OverrideAction::Disable) => OverrideChange::Disable,
            Ok(pb::OverrideAction::Enable) => OverrideChange::Enable,
            Ok(pb::OverrideAction::Weight) => OverrideChange::Weight(request.weight),
            Ok(pb::OverrideAction::Clear) => OverrideChange::Clear,
            Ok(pb::OverrideAction::Unspecified) | Err(_) => {
                let problem = format!("is {}; expected DRAIN, DISABLE, ENABLE, WEIGHT or CLEAR", request.action);
                return Err(InvalidField::new("action", problem).into());
            }
        };
        let answer = self
            .registry
            .change_override(&request.service, &request.id, change)
            .await
            .map_err(|_| Status::unavailable("the registry is shutting down"))?;
        match answer {
            Ok((now, registered)) => Ok(Response::new(override_pb(&request.service, &request.id, now, registered))),
            Err(refused @ OverrideRefused::TooMany) => Err(Status::resource_exhausted(refused.to_string())),
            Err(refused @ OverrideRefused::NothingToClear { .. }) => Err(Status::not_found(refused.to_string())),
        }
    }

    async fn list_instance_overrides(
        &self,
        _request: Request<pb::ListInstanceOverridesRequest>,
    ) -> Result<Response<pb::ListInstanceOverridesResponse>, Status> {
        let overrides =
            self.registry.overrides().await.map_err(|_| Status::unavailable("the registry is shutting down"))?;
        let overrides =
            overrides.into_iter().map(|(service, id, value)| override_pb(&service, &id, value, false)).collect();
        Ok(Response::new(pb::ListInstanceOverridesResponse { overrides }))
    }
}

fn override_pb(service: &str, id: &str, value: crate::registry::Override, registered: bool) -> pb::InstanceOverride {
    use crate::registry::OperatorStatus;
    pb::InstanceOverride {
        service: service.to_owned(),
        id: id.to_owned(),
        status: match value.status {
            Some(OperatorStatus::Drain) => "drain".into(),
            Some(OperatorStatus::Disable) => "disable".into(),
            None => String::new(),
        },
        weight: value.weight,
        registered,
    }
}
