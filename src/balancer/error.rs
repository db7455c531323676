//! Why a pick failed. "Nothing eligible" is an ordinary outcome here, not an exception; the
//! gRPC edge maps each variant to its status code in one place.

use crate::registry::InvalidField;
use crate::rules::RuleError;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PickError {
    #[error(transparent)]
    Invalid(#[from] InvalidField),
    #[error(transparent)]
    Rule(#[from] RuleError),
    #[error("service {0:?} has never been registered")]
    UnknownService(String),
    #[error("{0}")]
    Unavailable(String),
}
