//! The one place where domain errors become gRPC status codes.

use tonic::{Code, Status};

use crate::balancer::PickError;
use crate::registry::{Refused, RegistryClosed};
use crate::state::StateError;

pub fn pick_error_code(error: &PickError) -> Code {
    match error {
        PickError::Invalid(_) | PickError::Rule(_) => Code::InvalidArgument,
        PickError::UnknownService(_) => Code::NotFound,
        PickError::Unavailable(_) => Code::Unavailable,
        PickError::State(StateError::Unavailable(_)) => Code::Unavailable,
    }
}

impl From<PickError> for Status {
    fn from(error: PickError) -> Self {
        Status::new(pick_error_code(&error), error.to_string())
    }
}

pub fn refusal_code(refused: &Refused) -> Code {
    match refused {
        Refused::Invalid(_) | Refused::TooManyInstances { .. } => Code::InvalidArgument,
        Refused::OwnedElsewhere { .. } => Code::AlreadyExists,
        Refused::NotOwned { .. } => Code::NotFound,
        Refused::ShuttingDown => Code::Unavailable,
    }
}

impl From<RegistryClosed> for Status {
    fn from(error: RegistryClosed) -> Self {
        Status::unavailable(error.to_string())
    }
}
