//! A Rust client for rota: picks, listings, watches and registrations.
//!
//! ```no_run
//! # async fn demo() -> Result<(), rota::client::ClientError> {
//! use rota::client::{PickOptions, RotaClient};
//! let mut client = RotaClient::connect("http://127.0.0.1:50051").await?;
//! let picked = client.pick("orders", PickOptions::rule("repeat(n=3)")).await?;
//! println!("{:?}", picked.instance);
//! # Ok(()) }
//! ```

mod lease;
mod registration;

use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::pb;
use crate::pb::balancer_client::BalancerClient;
use crate::pb::policies_client::PoliciesClient;
use crate::pb::registry_client::RegistryClient;

pub use lease::{LeasedPicker, LocalPick};
pub use registration::Registration;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid server address {0:?}")]
    Address(String),
    #[error("the token cannot be sent as a header: it contains characters outside visible ASCII")]
    Token,
    #[error("cannot connect to rota at {address}: {}", causes(.source))]
    Connect { address: String, source: tonic::transport::Error },
    #[error("cannot set up TLS: {}", causes(.0))]
    Tls(tonic::transport::Error),
    #[error("{}: {}", code_name(.0.code()), .0.message())]
    Status(#[from] tonic::Status),
    #[error("{}: registration refused: {message}", code_name(*.code))]
    Refused { code: tonic::Code, message: String },
    #[error("the server closed the registration stream: {0}")]
    Closed(String),
}

impl ClientError {
    /// The gRPC status code, when the server answered with one.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            ClientError::Status(status) => Some(status.code()),
            _ => None,
        }
    }
}

/// An error and its causes, `outer: inner: innermost` (tonic's transport error alone says only
/// "transport error"; the cause — connection refused, a TLS or DNS failure — is below it).
fn causes(error: &(dyn std::error::Error + 'static)) -> String {
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

/// Everything in a pick request but the service.
#[derive(Debug, Clone, Default)]
pub struct PickOptions {
    pub rule: String,
    pub version: String,
    pub key: String,
    pub zone: String,
    pub exclude: Vec<String>,
}

impl PickOptions {
    pub fn rule(rule: impl Into<String>) -> Self {
        Self { rule: rule.into(), ..Default::default() }
    }

    pub fn version(mut self, version: impl Into<String>) -> Self {
        self.version = version.into();
        self
    }

    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = key.into();
        self
    }

    pub fn zone(mut self, zone: impl Into<String>) -> Self {
        self.zone = zone.into();
        self
    }

    pub fn exclude(mut self, ids: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.exclude = ids.into_iter().map(Into::into).collect();
        self
    }

    pub fn request(&self, service: &str) -> pb::PickRequest {
        pb::PickRequest {
            service: service.to_owned(),
            rule: self.rule.clone(),
            version: self.version.clone(),
            key: self.key.clone(),
            zone: self.zone.clone(),
            exclude: self.exclude.clone(),
        }
    }
}

/// How to reach a rota server over TLS.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// PEM CA certificate(s) the server's certificate must chain to.
    pub ca_pem: Vec<u8>,
    /// PEM certificate chain and private key to present, for servers that require mTLS.
    pub client_identity: Option<(Vec<u8>, Vec<u8>)>,
    /// Name to check the server's certificate against; `None` uses the address's host.
    pub domain: Option<String>,
}

/// One connection to a rota server. Cloning shares the connection.
#[derive(Debug, Clone)]
pub struct RotaClient {
    balancer: BalancerClient<Channel>,
    registry: RegistryClient<Channel>,
    policies: PoliciesClient<Channel>,
    /// `Bearer TOKEN`, sent with every call when set.
    token: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
}

impl RotaClient {
    /// Connects to `http://HOST:PORT` (a bare `HOST:PORT` is accepted too).
    pub async fn connect(address: &str) -> Result<Self, ClientError> {
        let uri = if address.contains("://") { address.to_owned() } else { format!("http://{address}") };
        let endpoint = Endpoint::from_shared(uri.clone()).map_err(|_| ClientError::Address(address.to_owned()))?;
        let channel = endpoint.connect().await.map_err(|source| ClientError::Connect { address: uri, source })?;
        Ok(Self::from_channel(channel))
    }

    /// Connects to `https://HOST:PORT` (a bare `HOST:PORT` is accepted too), trusting only
    /// `tls.ca_pem`.
    pub async fn connect_tls(address: &str, tls: TlsOptions) -> Result<Self, ClientError> {
        let uri = if address.contains("://") { address.to_owned() } else { format!("https://{address}") };
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(tls.ca_pem));
        if let Some((cert, key)) = tls.client_identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(domain) = tls.domain {
            config = config.domain_name(domain);
        }
        let endpoint = Endpoint::from_shared(uri.clone()).map_err(|_| ClientError::Address(address.to_owned()))?;
        let endpoint = endpoint.tls_config(config).map_err(ClientError::Tls)?;
        let channel = endpoint.connect().await.map_err(|source| ClientError::Connect { address: uri, source })?;
        Ok(Self::from_channel(channel))
    }

    pub fn from_channel(channel: Channel) -> Self {
        Self {
            balancer: BalancerClient::new(channel.clone()),
            registry: RegistryClient::new(channel.clone()),
            policies: PoliciesClient::new(channel),
            token: None,
        }
    }

    /// Sends `token` as `authorization: Bearer TOKEN` with every call.
    pub fn with_token(mut self, token: &str) -> Result<Self, ClientError> {
        let value = format!("Bearer {token}").parse().map_err(|_| ClientError::Token)?;
        self.token = Some(value);
        Ok(self)
    }

    /// Wraps `message` in a request carrying this client's token, if any.
    pub fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        if let Some(token) = &self.token {
            request.metadata_mut().insert("authorization", token.clone());
        }
        request
    }

    pub async fn pick(&mut self, service: &str, options: PickOptions) -> Result<pb::PickResponse, ClientError> {
        Ok(self.balancer.pick(self.request(options.request(service))).await?.into_inner())
    }

    /// Reports call outcomes; returns how many were recorded and how many ignored.
    pub async fn report(&mut self, outcomes: Vec<pb::CallOutcome>) -> Result<pb::ReportResponse, ClientError> {
        Ok(self.balancer.report(self.request(pb::ReportRequest { outcomes })).await?.into_inner())
    }

    pub async fn get_policy(&mut self, service: &str) -> Result<pb::Policy, ClientError> {
        let request = pb::GetPolicyRequest { service: service.to_owned() };
        Ok(self.policies.get_policy(self.request(request)).await?.into_inner())
    }

    /// Replaces a service's policy; returns the policy now in force.
    pub async fn set_policy(&mut self, policy: pb::Policy) -> Result<pb::Policy, ClientError> {
        Ok(self.policies.set_policy(self.request(pb::SetPolicyRequest { policy: Some(policy) })).await?.into_inner())
    }

    /// Drops a service's runtime policy override; returns the policy now in force (the config
    /// file's, or the defaults). `NOT_FOUND` when the service has no override.
    pub async fn reset_policy(&mut self, service: &str) -> Result<pb::Policy, ClientError> {
        let request = pb::ResetPolicyRequest { service: service.to_owned() };
        Ok(self.policies.reset_policy(self.request(request)).await?.into_inner())
    }

    pub async fn list_policies(&mut self) -> Result<pb::ListPoliciesResponse, ClientError> {
        Ok(self.policies.list_policies(self.request(pb::ListPoliciesRequest {})).await?.into_inner())
    }

    /// Raw access to the `Balancer` stub (for `PickStream`).
    pub fn balancer(&mut self) -> &mut BalancerClient<Channel> {
        &mut self.balancer
    }

    pub async fn list_services(&mut self) -> Result<Vec<pb::ServiceSummary>, ClientError> {
        Ok(self.registry.list_services(self.request(pb::ListServicesRequest {})).await?.into_inner().services)
    }

    pub async fn list_instances(&mut self, service: &str) -> Result<pb::ListInstancesResponse, ClientError> {
        let request = pb::ListInstancesRequest { service: service.to_owned() };
        Ok(self.registry.list_instances(self.request(request)).await?.into_inner())
    }

    /// A snapshot of the service, then its changes.
    pub async fn watch(&mut self, service: &str) -> Result<tonic::Streaming<pb::WatchEvent>, ClientError> {
        let request = pb::WatchRequest { service: service.to_owned() };
        Ok(self.registry.watch(self.request(request)).await?.into_inner())
    }

    /// Opens a registration stream and announces `instances`. The instances stay registered
    /// while the returned [`Registration`] lives (it sends heartbeats in the background).
    pub async fn register(&mut self, instances: Vec<pb::Instance>) -> Result<Registration, ClientError> {
        Registration::open(&mut self.registry, self.token.clone(), instances).await
    }
}
