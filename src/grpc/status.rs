//! The one place where domain errors become gRPC status codes: every `tonic::Status` the rota
//! services send is built here, from an error of the layer that refused the call.

use tonic::{Code, Status};

use super::answers::NoRoom;
use super::peers::TooManyPeerStreams;
use super::streams::TooManyStreams;
use super::warmup::{Refusal, WarmingUp};
use crate::auth::AuthError;
use crate::balancer::PickError;
use crate::overload::Overloaded;
use crate::policy::PolicyError;
use crate::registry::{InvalidField, Refused, RegistryClosed};

pub fn pick_error_code(error: &PickError) -> Code {
    match error {
        PickError::Invalid(_) | PickError::Rule(_) => Code::InvalidArgument,
        PickError::UnknownService(_) => Code::NotFound,
        PickError::Unavailable(_) => Code::Unavailable,
    }
}

/// Metadata key carrying a stable token for why rota refused a pick, so a client can tell rota's
/// own `UNAVAILABLE` ("nothing eligible") from a transport failure ("rota unreachable").
pub const ERROR_REASON_KEY: &str = "rota-error";

pub fn pick_error_reason(error: &PickError) -> &'static str {
    match error {
        PickError::Invalid(_) => "invalid_argument",
        PickError::Rule(_) => "invalid_rule",
        PickError::UnknownService(_) => "unknown_service",
        PickError::Unavailable(_) => "no_eligible_instance",
    }
}

impl From<PickError> for Status {
    fn from(error: PickError) -> Self {
        let mut status = Status::new(pick_error_code(&error), error.to_string());
        status
            .metadata_mut()
            .insert(ERROR_REASON_KEY, tonic::metadata::MetadataValue::from_static(pick_error_reason(&error)));
        status
    }
}

/// Token of [`WarmingUp`] under [`ERROR_REASON_KEY`]: clients treat it like "rota unreachable".
pub const WARMING_UP_REASON: &str = "warming_up";

/// `UNAVAILABLE`, not `NOT_FOUND`: the service may well be on its way back.
impl From<WarmingUp> for Status {
    fn from(error: WarmingUp) -> Self {
        let mut status = Status::unavailable(error.to_string());
        status.metadata_mut().insert(ERROR_REASON_KEY, tonic::metadata::MetadataValue::from_static(WARMING_UP_REASON));
        status
    }
}

/// A pick, lease or listing error, or [`WarmingUp`] when the warm-up hides the service.
impl From<Refusal> for Status {
    fn from(refusal: Refusal) -> Self {
        match refusal {
            Refusal::Pick(error) => error.into(),
            Refusal::WarmingUp(warming_up) => warming_up.into(),
        }
    }
}

pub fn refusal_code(refused: &Refused) -> Code {
    match refused {
        Refused::Invalid(_) | Refused::TooManyInstances { .. } => Code::InvalidArgument,
        Refused::OwnedElsewhere { .. } | Refused::HeldByReplica { .. } => Code::AlreadyExists,
        Refused::NotOwned { .. } => Code::NotFound,
        Refused::ShuttingDown => Code::Unavailable,
        Refused::NotPermitted { .. } => Code::PermissionDenied,
        Refused::TooManyServices { .. } => Code::ResourceExhausted,
    }
}

impl From<RegistryClosed> for Status {
    fn from(error: RegistryClosed) -> Self {
        Status::unavailable(error.to_string())
    }
}

impl From<TooManyStreams> for Status {
    fn from(error: TooManyStreams) -> Self {
        Status::resource_exhausted(error.to_string())
    }
}

impl From<NoRoom> for Status {
    fn from(error: NoRoom) -> Self {
        Status::resource_exhausted(error.to_string())
    }
}

impl From<TooManyPeerStreams> for Status {
    fn from(error: TooManyPeerStreams) -> Self {
        Status::resource_exhausted(error.to_string())
    }
}

/// A new stream asked of a server that is shutting down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("rota is shutting down; connect to another replica")]
pub struct Draining;

impl From<Draining> for Status {
    fn from(error: Draining) -> Self {
        Status::unavailable(error.to_string())
    }
}

/// A field of the request breaks a documented limit.
impl From<InvalidField> for Status {
    fn from(error: InvalidField) -> Self {
        Status::invalid_argument(error.to_string())
    }
}

/// A runtime policy change that was refused; nothing changed.
impl From<PolicyError> for Status {
    fn from(error: PolicyError) -> Self {
        match error {
            PolicyError::Invalid(invalid) => invalid.into(),
            PolicyError::TooManyOverrides { .. } => Status::resource_exhausted(error.to_string()),
            // Not an idempotent OK: a reset of a service that has no override is most often a
            // misspelled name, and an OK would hide it.
            PolicyError::NoOverride { .. } => Status::not_found(error.to_string()),
        }
    }
}

/// No token, or one rota does not know.
impl From<AuthError> for Status {
    fn from(error: AuthError) -> Self {
        Status::unauthenticated(error.to_string())
    }
}

/// A known token without the scope the call needs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("token {principal:?} does not grant the {scope} scope")]
pub struct MissingScope {
    pub principal: String,
    pub scope: &'static str,
}

impl From<MissingScope> for Status {
    fn from(error: MissingScope) -> Self {
        Status::permission_denied(error.to_string())
    }
}

/// An xDS stream passed a bound: `RESOURCE_EXHAUSTED` for counts, `INVALID_ARGUMENT` for a
/// name no resource can have.
pub fn xds_refused(error: &crate::xds::StreamRefused) -> Status {
    match error {
        crate::xds::StreamRefused::NameTooLong { .. } => Status::invalid_argument(error.to_string()),
        _ => Status::resource_exhausted(error.to_string()),
    }
}

/// Memory pressure: the client may come back once it eases, or go to another replica.
impl From<Overloaded> for Status {
    fn from(error: Overloaded) -> Self {
        Status::resource_exhausted(error.to_string())
    }
}
