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
//!
//! A client that [follows](RotaClient::follow) a service keeps picking it while rota is
//! unreachable, round robin over the last instance list it saw (see [`fallback`]). A provider
//! that [keeps its instances registered](RotaClient::keep_registered) announces them again
//! whenever its stream is lost, until it closes the registration.

mod backoff;
mod error;
pub mod fallback;
mod kept;
mod lease;
mod registration;
pub mod transport;

use std::sync::Arc;
use std::time::Duration;

use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::pb;
use crate::pb::balancer_client::BalancerClient;
use crate::pb::policies_client::PoliciesClient;
use crate::pb::registry_client::RegistryClient;

pub use error::{ClientError, ERROR_REASON_KEY, WARMING_UP, code_name};
use error::{status_with_reason, transport_status_as_contract};
pub use kept::{KeptRegistration, RegistrationEvent};
pub use lease::{LeasedPicker, LocalPick};
pub use registration::Registration;

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

/// The instance chosen for one call: rota's answer, or the client's own when rota could not be
/// reached. It dereferences to the [`pb::PickResponse`].
#[derive(Debug, Clone, PartialEq)]
pub struct Pick {
    pub response: pb::PickResponse,
    /// True when rota could not be reached and this client picked, round robin over the last
    /// instance list seen (see [`RotaClient::follow`]); the ticket is then this client's own
    /// count, per service and subset, and the rule `round_robin`.
    pub local_fallback: bool,
}

impl Pick {
    pub fn into_response(self) -> pb::PickResponse {
        self.response
    }
}

impl std::ops::Deref for Pick {
    type Target = pb::PickResponse;

    fn deref(&self) -> &pb::PickResponse {
        &self.response
    }
}

/// Bounds a pick when the caller set no deadline of its own (see
/// [`RotaClient::with_pick_timeout`]); past it the pick counts as rota being unreachable.
pub const DEFAULT_PICK_TIMEOUT: Duration = Duration::from_secs(2);
/// HTTP/2 keepalive on the channel notices a rota that stopped answering without waiting for
/// TCP; rota accepts pings every 10 s or more.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The client's settings on an endpoint: keepalive, and a connect timeout no longer than a
/// pick may take.
fn tuned(endpoint: Endpoint) -> Endpoint {
    endpoint
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(KEEPALIVE_TIMEOUT)
        .keep_alive_while_idle(true)
        .connect_timeout(DEFAULT_PICK_TIMEOUT)
}

/// How to reach a rota server over TLS.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    /// PEM CA certificate(s) the server's certificate must chain to; `None`: the CAs the
    /// platform trusts (its certificate store, through rustls-native-certs).
    pub ca_pem: Option<Vec<u8>>,
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
    pick_timeout: Duration,
    /// Followed services and the local fallback's state, shared by every clone.
    fallback: Arc<fallback::Fallback>,
}

impl RotaClient {
    /// Connects to `http://HOST:PORT` (a bare `HOST:PORT` is accepted too).
    pub async fn connect(address: &str) -> Result<Self, ClientError> {
        let uri = if address.contains("://") { address.to_owned() } else { format!("http://{address}") };
        let endpoint = Endpoint::from_shared(uri.clone()).map_err(|_| ClientError::Address(address.to_owned()))?;
        let channel =
            tuned(endpoint).connect().await.map_err(|source| ClientError::Connect { address: uri, source })?;
        Ok(Self::from_channel(channel))
    }

    /// A client of `http://HOST:PORT` that connects on its first call, and again after the
    /// connection is lost, so it can be created (and pick from followed services) while rota is
    /// down.
    pub fn connect_lazy(address: &str) -> Result<Self, ClientError> {
        let uri = if address.contains("://") { address.to_owned() } else { format!("http://{address}") };
        let endpoint = Endpoint::from_shared(uri).map_err(|_| ClientError::Address(address.to_owned()))?;
        Ok(Self::from_channel(tuned(endpoint).connect_lazy()))
    }

    /// Connects to `https://HOST:PORT` (a bare `HOST:PORT` is accepted too), trusting only
    /// `tls.ca_pem` when given, else the platform's trusted CAs. A client certificate rota would
    /// refuse (X.509 v1) is refused here, before connecting.
    pub async fn connect_tls(address: &str, tls: TlsOptions) -> Result<Self, ClientError> {
        let uri = if address.contains("://") { address.to_owned() } else { format!("https://{address}") };
        let mut config = match tls.ca_pem {
            Some(ca) => ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca)),
            None => ClientTlsConfig::new().with_native_roots(),
        };
        if let Some((cert, key)) = tls.client_identity {
            transport::check_client_certificate(&cert).map_err(ClientError::ClientCertificate)?;
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(domain) = tls.domain {
            config = config.domain_name(domain);
        }
        let endpoint = Endpoint::from_shared(uri.clone()).map_err(|_| ClientError::Address(address.to_owned()))?;
        let endpoint = tuned(endpoint.tls_config(config).map_err(ClientError::Tls)?);
        let channel = endpoint.connect().await.map_err(|source| ClientError::Connect { address: uri, source })?;
        Ok(Self::from_channel(channel))
    }

    pub fn from_channel(channel: Channel) -> Self {
        Self {
            balancer: BalancerClient::new(channel.clone()),
            registry: RegistryClient::new(channel.clone()),
            policies: PoliciesClient::new(channel),
            token: None,
            pick_timeout: DEFAULT_PICK_TIMEOUT,
            fallback: Arc::default(),
        }
    }

    /// Bounds each pick by `timeout` instead of [`DEFAULT_PICK_TIMEOUT`].
    pub fn with_pick_timeout(mut self, timeout: Duration) -> Self {
        self.pick_timeout = timeout;
        self
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

    /// Asks rota for one instance of `service`, within the pick timeout.
    ///
    /// When rota cannot be reached ([`ClientError::is_unreachable`]) or is warming up after a
    /// restart, and `service` is [followed](Self::follow), the client picks itself from the
    /// last instance list seen and marks the pick [`local_fallback`](Pick::local_fallback); a
    /// warning is logged on the first local pick of an outage and when rota answers again.
    /// After [`fallback::SHORTCUT_AFTER`] unreachable picks in a row, picks of followed
    /// services go straight to the local fallback for [`fallback::SHORTCUT_FOR`]. A local pick
    /// with nothing eligible fails as rota would: `UNAVAILABLE`, reason
    /// `no_eligible_instance`. A service that is not followed gets the unreachable error.
    pub async fn pick(&mut self, service: &str, options: PickOptions) -> Result<Pick, ClientError> {
        let shared = &self.fallback.shared;
        if shared.shortcut() && shared.synced(service) {
            let cause = tonic::Status::unavailable(format!(
                "rota failed {} picks in a row; not asked again for {:?}",
                fallback::SHORTCUT_AFTER,
                fallback::SHORTCUT_FOR
            ));
            return self.local_pick(service, &options, ClientError::Status(cause));
        }
        let mut request = self.request(options.request(service));
        request.set_timeout(self.pick_timeout);
        let error = match tokio::time::timeout(self.pick_timeout, self.balancer.pick(request)).await {
            Ok(Ok(response)) => {
                shared.answered();
                return Ok(Pick { response: response.into_inner(), local_fallback: false });
            }
            Ok(Err(status)) => ClientError::Status(transport_status_as_contract(status)),
            Err(_) => ClientError::Status(tonic::Status::deadline_exceeded(format!(
                "rota did not answer within {:?}",
                self.pick_timeout
            ))),
        };
        if !error.falls_back() {
            shared.answered();
            return Err(error);
        }
        shared.unreachable();
        if !shared.synced(service) {
            return Err(error);
        }
        self.local_pick(service, &options, error)
    }

    /// Answers from the last list seen; nothing eligible there is rota's own answer
    /// (`UNAVAILABLE no_eligible_instance`), not "unreachable".
    fn local_pick(&self, service: &str, options: &PickOptions, cause: ClientError) -> Result<Pick, ClientError> {
        let shared = &self.fallback.shared;
        match shared.pick(service, &options.version, &options.exclude) {
            None => Err(cause),
            Some(Err(why)) => Err(ClientError::Status(status_with_reason(
                tonic::Code::Unavailable,
                format!("{why}; {cause}"),
                fallback::NO_ELIGIBLE_INSTANCE,
            ))),
            Some(Ok(local)) => {
                shared.picked_locally(service, &cause);
                let response = pb::PickResponse {
                    instance: Some(local.instance),
                    ticket: local.ticket,
                    rule: "round_robin".into(),
                    fallback: local.fallback,
                    epoch: local.epoch,
                    error: None,
                };
                Ok(Pick { response, local_fallback: true })
            }
        }
    }

    /// Follows `service` for the local fallback: a background `Watch`, reconnecting with
    /// jittered exponential backoff for as long as any clone of this client lives, keeps a copy
    /// of its instance list that [`pick`](Self::pick) answers from while rota is unreachable.
    /// Resolves once the first list has arrived (which may be never while rota is down: bound
    /// the wait with a timeout; the watch goes on). Following a service that does not exist
    /// yet is allowed.
    pub async fn follow(&self, service: &str) {
        self.fallback.follow(service, self.registry.clone(), self.token.clone());
        self.wait_followed(service, |_| true).await;
    }

    /// The instance list kept for `service` (all statuses, by id); `None` while it is not
    /// followed or its first list has not arrived.
    pub fn followed(&self, service: &str) -> Option<Vec<pb::Instance>> {
        self.fallback.shared.instances(service)
    }

    /// Waits until the list kept for `service` satisfies `done`; returns it.
    pub async fn wait_followed(
        &self,
        service: &str,
        mut done: impl FnMut(&[pb::Instance]) -> bool,
    ) -> Vec<pb::Instance> {
        let mut changes = self.fallback.shared.changes();
        loop {
            if let Some(instances) = self.followed(service)
                && done(&instances)
            {
                return instances;
            }
            if changes.changed().await.is_err() {
                // The sender lives in `self`; it cannot have gone.
                std::future::pending::<()>().await;
            }
        }
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

    /// Changes an operator's override of one instance (admin scope).
    pub async fn set_instance_override(
        &mut self,
        request: pb::SetInstanceOverrideRequest,
    ) -> Result<pb::InstanceOverride, ClientError> {
        Ok(self.policies.set_instance_override(self.request(request)).await?.into_inner())
    }

    /// Every operator override (admin scope).
    pub async fn list_instance_overrides(&mut self) -> Result<Vec<pb::InstanceOverride>, ClientError> {
        let request = self.request(pb::ListInstanceOverridesRequest {});
        Ok(self.policies.list_instance_overrides(request).await?.into_inner().overrides)
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

    /// Registers `instances` and keeps them registered: when the stream is lost (rota
    /// restarted, shut down or expired it), a new one announces them again, with backoff,
    /// until the returned [`KeptRegistration`] is closed or dropped. Fails unless rota accepts
    /// every instance the first time.
    pub async fn keep_registered(&self, instances: Vec<pb::Instance>) -> Result<KeptRegistration, ClientError> {
        KeptRegistration::open(self.registry.clone(), self.token.clone(), instances).await
    }
}

#[cfg(test)]
mod tests;
