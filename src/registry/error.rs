//! Errors of the registry layer. They carry no gRPC types; `grpc::status` maps them to codes.

use std::sync::Arc;

/// A value that breaks a documented limit. `field` is the path of the offending value as the
/// caller sent it (`announce.instances[0].port`), `problem` says which limit it broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {problem}")]
pub struct InvalidField {
    pub field: String,
    pub problem: String,
}

impl InvalidField {
    pub fn new(field: impl Into<String>, problem: impl Into<String>) -> Self {
        Self { field: field.into(), problem: problem.into() }
    }
}

/// Why one instance in a registration message was not applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(transparent)]
    Invalid(#[from] InvalidField),
    #[error("instance {id:?} of service {service:?} is owned by another registration stream")]
    OwnedElsewhere { service: Arc<str>, id: Arc<str> },
    #[error("instance {id:?} of service {service:?} is registered through another rota replica ({replica})")]
    HeldByReplica { service: Arc<str>, id: Arc<str>, replica: String },
    #[error("instance {id:?} of service {service:?} is not registered on this stream")]
    NotOwned { service: Arc<str>, id: Arc<str> },
    #[error("this stream would hold {count} instances; the limit is {limit}")]
    TooManyInstances { count: usize, limit: usize },
    #[error("the registry is shutting down")]
    ShuttingDown,
    #[error("token {principal:?} may not register service {service:?}")]
    NotPermitted { service: String, principal: String },
    #[error("service {service:?} would be a new service beyond {holder}'s limit of {limit} (server.{key})")]
    TooManyServices { service: Arc<str>, holder: String, limit: usize, key: &'static str },
}

/// The registry task has stopped (the server is shutting down).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the registry is shutting down")]
pub struct RegistryClosed;
