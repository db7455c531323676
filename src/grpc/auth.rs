//! Bearer-token checks at the gRPC edge: a tonic interceptor per service authenticates the
//! caller, requires the service's scope, and leaves the [`Principal`] in the request's
//! extensions for finer checks (which services a registration may touch).

use std::sync::Arc;

use super::status::MissingScope;
use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::auth::{Authenticator, Principal};

/// The scope a whole service requires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Required {
    /// Any valid token; the methods check further.
    Authenticated,
    Pick,
    Admin,
}

/// Only in place when tokens are configured: without them, services are served bare.
#[derive(Clone)]
pub struct AuthInterceptor {
    auth: Arc<Authenticator>,
    required: Required,
}

impl AuthInterceptor {
    pub fn new(auth: Arc<Authenticator>, required: Required) -> Self {
        Self { auth, required }
    }
}

impl Interceptor for AuthInterceptor {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let header = request.metadata().get("authorization").and_then(|v| v.to_str().ok());
        let principal = self.auth.authenticate_header(header)?;
        match self.required {
            Required::Pick if !principal.may_pick() => return Err(lacks(&principal, "pick")),
            Required::Admin if !principal.is_admin() => return Err(lacks(&principal, "admin")),
            _ => {}
        }
        request.extensions_mut().insert(principal);
        Ok(request)
    }
}

fn lacks(principal: &Principal, scope: &'static str) -> Status {
    MissingScope { principal: principal.name.clone(), scope }.into()
}

/// The caller, when authentication is on.
pub fn principal<T>(request: &Request<T>) -> Option<Arc<Principal>> {
    request.extensions().get::<Arc<Principal>>().cloned()
}

/// Listings and watches need the pick scope.
pub fn require_pick<T>(request: &Request<T>) -> Result<(), Status> {
    match principal(request) {
        Some(p) if !p.may_pick() => Err(lacks(&p, "pick")),
        _ => Ok(()),
    }
}

/// Registration needs a register scope for some service.
pub fn require_register<T>(request: &Request<T>) -> Result<Option<Arc<Principal>>, Status> {
    match principal(request) {
        Some(p) if !p.may_register_any() => Err(lacks(&p, "register")),
        other => Ok(other),
    }
}
