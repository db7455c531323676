//! Errors of the client, and what counts as rota being unreachable.

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid server address {0:?}")]
    Address(String),
    #[error("the token cannot be sent as a header: it contains characters outside visible ASCII")]
    Token,
    #[error("cannot connect to rota at {address}: {}", explained_causes(.source))]
    Connect { address: String, source: tonic::transport::Error },
    #[error("cannot set up TLS: {}", causes(.0))]
    Tls(tonic::transport::Error),
    /// A client certificate rota would refuse, found before connecting.
    #[error("cannot use the client certificate: {0}")]
    ClientCertificate(String),
    #[error("{}: {}", code_name(.0.code()), .0.message())]
    Status(tonic::Status),
    #[error("{}: registration refused: {message}", code_name(*.code))]
    Refused { code: tonic::Code, message: String },
    #[error("the server closed the registration stream: {0}")]
    Closed(String),
}

/// A call's status, in plain words when its transport failure is one a misconfigured TLS client
/// runs into (see [`transport`](super::transport)).
impl From<tonic::Status> for ClientError {
    fn from(status: tonic::Status) -> Self {
        ClientError::Status(super::transport::explained(status))
    }
}

/// The trailer with which rota marks a pick failure it decided itself.
pub const ERROR_REASON_KEY: &str = "rota-error";
/// The reason of a rota that started recently and has not seen the service yet.
pub const WARMING_UP: &str = "warming_up";

impl ClientError {
    /// The gRPC status code, when the call ended with one or rota refused an instance with one.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            ClientError::Status(status) => Some(status.code()),
            ClientError::Refused { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// rota's stable token for a pick it refused (the `rota-error` trailer:
    /// `no_eligible_instance`, `unknown_service`, `warming_up`, ...); `None` when rota did not
    /// decide the failure.
    pub fn reason(&self) -> Option<&str> {
        match self {
            ClientError::Status(status) => status.metadata().get(ERROR_REASON_KEY).and_then(|v| v.to_str().ok()),
            _ => None,
        }
    }

    /// Whether rota could not be reached, as opposed to answering with an error: a connection
    /// that could not be made, or a call that ended `UNAVAILABLE` or `DEADLINE_EXCEEDED` without
    /// rota's `rota-error` trailer (connection refused, reset or lost, the deadline passing, a
    /// proxy with no rota behind it). Every failure rota decides carries that trailer,
    /// `warming_up` included, so none of them is unreachable; every other code is an answer too.
    /// The definition all clients share is in `clients/conformance/README.md`, "Unreachable".
    pub fn is_unreachable(&self) -> bool {
        match self {
            ClientError::Connect { .. } => true,
            ClientError::Status(status) => {
                matches!(status.code(), tonic::Code::Unavailable | tonic::Code::DeadlineExceeded)
                    && status.metadata().get(ERROR_REASON_KEY).is_none()
            }
            _ => false,
        }
    }

    /// Whether a failed pick may be answered by the local fallback: rota unreachable, or
    /// warming up after a restart.
    pub(super) fn falls_back(&self) -> bool {
        self.is_unreachable() || self.reason() == Some(WARMING_UP)
    }
}

/// Statuses tonic makes up from its own transport errors, rather than receives from the server,
/// in the codes the contract gives an unreachable rota: a connection that failed under the call
/// (closed or reset by a server that went away), which tonic reports as `UNKNOWN: transport
/// error`, becomes `UNAVAILABLE`; the pick's deadline expiring in tonic's timeout layer, which it
/// reports as `CANCELLED: Timeout expired`, becomes `DEADLINE_EXCEEDED` (a Rust caller cancels by
/// dropping the call, which leaves no status at all).
pub(super) fn transport_status_as_contract(status: tonic::Status) -> tonic::Status {
    if super::transport::explain(&status).is_some() {
        return super::transport::explained(status);
    }
    let from_transport =
        std::error::Error::source(&status).is_some_and(|source| source.is::<tonic::transport::Error>());
    match status.code() {
        _ if !from_transport => status,
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded => status,
        tonic::Code::Cancelled => tonic::Status::deadline_exceeded(format!("no answer from rota: {}", causes(&status))),
        _ => tonic::Status::unavailable(format!("connection to rota lost: {}", causes(&status))),
    }
}

/// A status carrying rota's `rota-error` reason, as rota itself would send it.
pub(super) fn status_with_reason(code: tonic::Code, message: String, reason: &'static str) -> tonic::Status {
    let mut status = tonic::Status::new(code, message);
    status.metadata_mut().insert(ERROR_REASON_KEY, tonic::metadata::MetadataValue::from_static(reason));
    status
}

/// An error and its causes, `outer: inner: innermost` (tonic's transport error alone says only
/// "transport error"; the cause — connection refused, a TLS or DNS failure — is below it).
pub(super) fn causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// [`causes`], led by a plain explanation when there is one.
fn explained_causes(error: &(dyn std::error::Error + 'static)) -> String {
    match super::transport::explain(error) {
        Some(explanation) => format!("{explanation} ({})", causes(error)),
        None => causes(error),
    }
}

/// `NOT_FOUND` rather than tonic's "Some requested entity was not found".
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}
