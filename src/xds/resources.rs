//! The xDS resources of one rota service, built from the same published snapshot picks read.
//!
//! For service `S`: a Listener `S` (an API listener whose HTTP connection manager fetches the
//! RouteConfiguration `S` over ADS), that RouteConfiguration (version isolation and gray release
//! as routes), and one Cluster with its ClusterLoadAssignment per subset:
//!
//! | cluster | endpoints |
//! | --- | --- |
//! | `S` | the instances with no version |
//! | `S/version/V` | the instances of version `V` |
//! | `S/any` | every instance (the `isolation_fallback = "any"` target) |
//! | `S/none` | none: a call routed there fails `UNAVAILABLE` (`isolation_fallback = "fail"`) |
//!
//! Routes follow `Pick`'s version isolation exactly: header `x-rota-version: V` goes to
//! `S/version/V` while `V` has an UP instance; any other version, and a request without the
//! header, goes to the unversioned instances while there is one, else to the fallback's
//! cluster. A request without the header under gray release goes to `weighted_clusters` with
//! the release's weights — sampled by each client, where rota's own picks count exactly.
//!
//! Every registered instance of a subset is an endpoint with a health status, so that a client
//! stops using it the moment rota says so: UP → `HEALTHY`, DRAINING → `DRAINING`, DOWN →
//! `UNHEALTHY`, and an UP instance the fleet has ejected (open breaker or failure rate) →
//! `UNHEALTHY` while its ejection lasts, within the policy's `max_ejected_percent` (when more
//! are ejected, none is marked: rota's panic mode). Localities are zones; endpoint weights are
//! rota's weights.

use std::collections::BTreeMap;
use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3 as cluster;
use envoy_types::pb::envoy::config::core::v3 as core;
use envoy_types::pb::envoy::config::endpoint::v3 as endpoint;
use envoy_types::pb::envoy::config::listener::v3 as listener;
use envoy_types::pb::envoy::config::route::v3 as route;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3 as hcm;
use envoy_types::pb::envoy::extensions::load_balancing_policies as lb;
use envoy_types::pb::envoy::r#type::matcher::v3 as matcher;
use envoy_types::pb::google::protobuf::{Any, UInt32Value, Value, value};
use prost::{Message, Name};

use crate::policy::{IsolationFallback, Policy};
use crate::registry::{Instance, ServiceSnapshot, Status};
use crate::rules::Standard;

/// The header a request names its version with (as `Pick`'s `version`).
pub const VERSION_HEADER: &str = "x-rota-version";
/// The header a `consistent_hash` or `sticky` service's ring hashes (as `Pick`'s `key`).
pub const KEY_HEADER: &str = "x-rota-key";
/// The name rota's own load-balancing policy is offered under (gRFC A52): a client that
/// registers a policy of this name gets it; every other goes on to the standard policy after it.
pub const ROTA_POLICY_TYPE: &str = "type.googleapis.com/rota.v1.CentralRotation";

pub const LISTENER_TYPE: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
pub const ROUTE_TYPE: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";
pub const CLUSTER_TYPE: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
pub const ENDPOINT_TYPE: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";

/// `xds.type.v3.TypedStruct`: how gRFC A52 names a custom policy (the type URL it carries) with
/// its configuration as JSON. Not among envoy-types' generated messages, so declared here.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TypedStruct {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<SortedStruct>,
}

/// `google.protobuf.Struct` on the wire, with its fields in a sorted map: the generated type
/// keeps them in a `HashMap`, whose encoding order changes from build to build, and a resource
/// must encode the same whenever its content is the same (its digest decides what is resent).
#[derive(Clone, PartialEq, prost::Message)]
pub struct SortedStruct {
    #[prost(btree_map = "string, message", tag = "1")]
    pub fields: BTreeMap<String, Value>,
}

impl Name for TypedStruct {
    const NAME: &'static str = "TypedStruct";
    const PACKAGE: &'static str = "xds.type.v3";

    fn type_url() -> String {
        "type.googleapis.com/xds.type.v3.TypedStruct".to_string()
    }
}

/// The four resource types rota serves, in the order a client asks for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Listener,
    Route,
    Cluster,
    Endpoint,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Listener, Kind::Route, Kind::Cluster, Kind::Endpoint];

    pub fn from_type_url(url: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|kind| kind.type_url() == url)
    }

    pub fn type_url(self) -> &'static str {
        match self {
            Kind::Listener => LISTENER_TYPE,
            Kind::Route => ROUTE_TYPE,
            Kind::Cluster => CLUSTER_TYPE,
            Kind::Endpoint => ENDPOINT_TYPE,
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }

    /// Short name for logs and metric labels.
    pub fn label(self) -> &'static str {
        match self {
            Kind::Listener => "listener",
            Kind::Route => "route",
            Kind::Cluster => "cluster",
            Kind::Endpoint => "endpoint",
        }
    }
}

/// Which instances of a service a cluster holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Subset {
    Unversioned,
    Version(String),
    Any,
    None,
}

/// The service a resource name belongs to, and for clusters and assignments the subset; `None`
/// for a name rota never serves.
pub fn parse_name(kind: Kind, name: &str) -> Option<(&str, Subset)> {
    let valid = |service: &str| crate::registry::validate_service_name("", service).is_ok();
    match kind {
        Kind::Listener | Kind::Route => valid(name).then_some((name, Subset::Unversioned)),
        Kind::Cluster | Kind::Endpoint => {
            let (service, subset) = match name.split_once('/') {
                None => (name, Subset::Unversioned),
                Some((service, "any")) => (service, Subset::Any),
                Some((service, "none")) => (service, Subset::None),
                Some((service, rest)) => {
                    let version = rest.strip_prefix("version/")?;
                    crate::registry::validate_service_name("", version).ok()?;
                    (service, Subset::Version(version.to_string()))
                }
            };
            valid(service).then_some((service, subset))
        }
    }
}

/// The cluster name of a subset of `service`.
pub fn cluster_name(service: &str, subset: &Subset) -> String {
    match subset {
        Subset::Unversioned => service.to_string(),
        Subset::Version(version) => format!("{service}/version/{version}"),
        Subset::Any => format!("{service}/any"),
        Subset::None => format!("{service}/none"),
    }
}

/// One encoded resource and a digest of its bytes: a stream resends a resource only when the
/// digest moved, so a change of endpoints does not resend the service's listener.
#[derive(Debug, Clone)]
pub struct Resource {
    pub any: Any,
    pub digest: u64,
}

impl std::ops::Deref for Resource {
    type Target = Any;

    fn deref(&self) -> &Any {
        &self.any
    }
}

/// Every resource of one service, encoded.
#[derive(Debug)]
pub struct ServiceResources {
    pub listener: Resource,
    pub route: Resource,
    /// By cluster name.
    pub clusters: BTreeMap<String, Resource>,
    /// By cluster name.
    pub endpoints: BTreeMap<String, Resource>,
}

impl ServiceResources {
    /// The resource `name` of `kind`, when this service has it.
    pub fn get(&self, kind: Kind, name: &str) -> Option<&Resource> {
        match kind {
            Kind::Listener => Some(&self.listener),
            Kind::Route => Some(&self.route),
            Kind::Cluster => self.clusters.get(name),
            Kind::Endpoint => self.endpoints.get(name),
        }
    }
}

/// Builds every resource of `snapshot`'s service under `policy`; `ejected` says whether an
/// instance is ejected now.
pub fn build(snapshot: &ServiceSnapshot, policy: &Policy, ejected: &dyn Fn(&Instance) -> bool) -> ServiceResources {
    let service = &*snapshot.name;
    let mut subsets = vec![Subset::Unversioned, Subset::Any, Subset::None];
    let mut versions: Vec<&str> = snapshot.instances.iter().map(|i| &*i.version).filter(|v| !v.is_empty()).collect();
    versions.sort_unstable();
    versions.dedup();
    subsets.extend(versions.iter().map(|v| Subset::Version(v.to_string())));
    let lb = policy.rule.rule.standard();
    let mut clusters = BTreeMap::new();
    let mut endpoints = BTreeMap::new();
    for subset in &subsets {
        let name = cluster_name(service, subset);
        clusters.insert(name.clone(), resource(&cluster_resource(&name, service, subset, policy, lb)));
        endpoints.insert(name.clone(), resource(&assignment(&name, snapshot, subset, policy, ejected)));
    }
    ServiceResources {
        listener: resource(&listener_resource(service)),
        route: resource(&route_resource(snapshot, policy, lb)),
        clusters,
        endpoints,
    }
}

fn encode<M: Message + Name>(message: &M) -> Any {
    Any { type_url: M::type_url(), value: message.encode_to_vec() }
}

/// `message` encoded, with the digest of its bytes (a fixed-seed hash: digests compare across
/// builds, never across processes).
fn resource<M: Message + Name>(message: &M) -> Resource {
    use std::hash::{BuildHasher, Hasher};
    let any = encode(message);
    let mut hasher = foldhash::quality::FixedState::with_seed(0x7274_6f61).build_hasher();
    hasher.write(&any.value);
    Resource { digest: hasher.finish(), any }
}

fn ads() -> core::ConfigSource {
    core::ConfigSource {
        resource_api_version: core::ApiVersion::V3 as i32,
        config_source_specifier: Some(core::config_source::ConfigSourceSpecifier::Ads(
            core::AggregatedConfigSource::default(),
        )),
        ..Default::default()
    }
}

fn listener_resource(service: &str) -> listener::Listener {
    let manager = hcm::HttpConnectionManager {
        route_specifier: Some(hcm::http_connection_manager::RouteSpecifier::Rds(hcm::Rds {
            config_source: Some(ads()),
            route_config_name: service.to_string(),
        })),
        http_filters: vec![hcm::HttpFilter {
            name: "envoy.filters.http.router".to_string(),
            config_type: Some(hcm::http_filter::ConfigType::TypedConfig(encode(&Router::default()))),
            ..Default::default()
        }],
        ..Default::default()
    };
    listener::Listener {
        name: service.to_string(),
        api_listener: Some(listener::ApiListener { api_listener: Some(encode(&manager)) }),
        ..Default::default()
    }
}

/// Where a request goes that names no version (or a version with no UP instance): the
/// unversioned instances while there is one, else the isolation fallback's cluster.
fn no_version_target(snapshot: &ServiceSnapshot, policy: &Policy) -> Subset {
    if !snapshot.unversioned.is_empty() {
        Subset::Unversioned
    } else if policy.isolation_fallback == IsolationFallback::Any && !snapshot.up.is_empty() {
        Subset::Any
    } else {
        Subset::None
    }
}

fn route_resource(snapshot: &ServiceSnapshot, policy: &Policy, lb: Standard) -> route::RouteConfiguration {
    let service = &*snapshot.name;
    let fallback = no_version_target(snapshot, policy);
    let mut versions: Vec<&Arc<str>> =
        snapshot.versions.iter().filter(|(_, s)| !s.is_empty()).map(|(v, _)| v).collect();
    versions.sort_unstable();
    let hash_policy = match lb {
        Standard::RingHash => vec![route::route_action::HashPolicy {
            policy_specifier: Some(route::route_action::hash_policy::PolicySpecifier::Header(
                route::route_action::hash_policy::Header { header_name: KEY_HEADER.to_string(), regex_rewrite: None },
            )),
            terminal: false,
        }],
        _ => Vec::new(),
    };
    let action = |specifier: route::route_action::ClusterSpecifier| {
        Some(route::route::Action::Route(route::RouteAction {
            cluster_specifier: Some(specifier),
            hash_policy: hash_policy.clone(),
            ..Default::default()
        }))
    };
    let to = |subset: &Subset| route::route_action::ClusterSpecifier::Cluster(cluster_name(service, subset));
    let header = |specifier| route::HeaderMatcher {
        name: VERSION_HEADER.to_string(),
        header_match_specifier: Some(specifier),
        ..Default::default()
    };
    let matching = |headers: Vec<route::HeaderMatcher>| {
        Some(route::RouteMatch {
            path_specifier: Some(route::route_match::PathSpecifier::Prefix(String::new())),
            headers,
            ..Default::default()
        })
    };
    let mut routes = Vec::new();
    for version in versions {
        let exact = route::header_matcher::HeaderMatchSpecifier::StringMatch(matcher::StringMatcher {
            match_pattern: Some(matcher::string_matcher::MatchPattern::Exact(version.to_string())),
            ignore_case: false,
        });
        routes.push(route::Route {
            name: format!("version {version}"),
            r#match: matching(vec![header(exact)]),
            action: action(to(&Subset::Version(version.to_string()))),
            ..Default::default()
        });
    }
    routes.push(route::Route {
        name: "another version".to_string(),
        r#match: matching(vec![header(route::header_matcher::HeaderMatchSpecifier::PresentMatch(true))]),
        action: action(to(&fallback)),
        ..Default::default()
    });
    let plain = match gray_targets(snapshot, policy, &fallback) {
        Some(weights) if weights.len() > 1 => {
            route::route_action::ClusterSpecifier::WeightedClusters(route::WeightedCluster {
                clusters: weights
                    .into_iter()
                    .map(|(subset, weight)| route::weighted_cluster::ClusterWeight {
                        name: cluster_name(service, &subset),
                        weight: Some(UInt32Value { value: weight }),
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            })
        }
        Some(weights) => to(&weights[0].0),
        None => to(&fallback),
    };
    routes.push(route::Route {
        name: "no version".to_string(),
        r#match: matching(Vec::new()),
        action: action(plain),
        ..Default::default()
    });
    route::RouteConfiguration {
        name: service.to_string(),
        virtual_hosts: vec![route::VirtualHost {
            name: service.to_string(),
            domains: vec!["*".to_string()],
            routes,
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// Under gray release, each target of a version-less request with its weight (a version with
/// no UP instance gives its share to the no-version target, as a pick would fall back); `None`
/// without gray release.
fn gray_targets(snapshot: &ServiceSnapshot, policy: &Policy, fallback: &Subset) -> Option<Vec<(Subset, u32)>> {
    let gray = policy.gray.as_ref()?;
    let mut weights: BTreeMap<Subset, u32> = BTreeMap::new();
    if gray.unversioned > 0 {
        *weights.entry(fallback.clone()).or_default() += gray.unversioned;
    }
    for (version, weight) in gray.versions.iter().filter(|(_, w)| **w > 0) {
        let target = match snapshot.versions.get(version.as_str()) {
            Some(subset) if !subset.is_empty() => Subset::Version(version.clone()),
            _ => fallback.clone(),
        };
        *weights.entry(target).or_default() += weight;
    }
    (!weights.is_empty()).then(|| weights.into_iter().collect())
}

fn policy(name: &str, config: Any) -> cluster::load_balancing_policy::Policy {
    cluster::load_balancing_policy::Policy {
        typed_extension_config: Some(core::TypedExtensionConfig { name: name.to_string(), typed_config: Some(config) }),
    }
}

fn string_value(s: &str) -> Value {
    Value { kind: Some(value::Kind::StringValue(s.to_string())) }
}

/// rota's own policy for a cluster whose instances one `Lease` covers (the unversioned ones, or
/// one version's): `{"service", "version", "rule"}`, what a lease of them names.
fn rota_policy(service: &str, subset: &Subset, service_policy: &Policy) -> Option<TypedStruct> {
    let version = match subset {
        Subset::Unversioned => "",
        Subset::Version(version) => version,
        Subset::Any | Subset::None => return None,
    };
    service_policy.rule.rule.leasable().then(|| TypedStruct {
        type_url: ROTA_POLICY_TYPE.to_string(),
        value: Some(SortedStruct {
            fields: [
                ("service".to_string(), string_value(service)),
                ("version".to_string(), string_value(version)),
                ("rule".to_string(), string_value(&service_policy.rule.canonical)),
            ]
            .into_iter()
            .collect(),
        }),
    })
}

/// The ring every gRPC client accepts: xxHash is the one hash function gRFC A42 implements
/// (`DEFAULT_HASH`, murmur, makes grpc-go, grpc-java and grpc-js refuse the cluster).
fn ring_hash() -> lb::ring_hash::v3::RingHash {
    lb::ring_hash::v3::RingHash {
        hash_function: lb::ring_hash::v3::ring_hash::HashFunction::XxHash as i32,
        ..Default::default()
    }
}

fn cluster_resource(
    name: &str,
    service: &str,
    subset: &Subset,
    service_policy: &Policy,
    lb: Standard,
) -> cluster::Cluster {
    // rota's own policy first (a client that registered it gets rota's central rotation with
    // the service's rule), then the standard policy closest to the rule.
    let rota = rota_policy(service, subset, service_policy);
    let round_robin = policy("round_robin", encode(&lb::round_robin::v3::RoundRobin::default()));
    let (legacy, policies) = match lb {
        Standard::RingHash => (cluster::cluster::LbPolicy::RingHash, vec![policy("ring_hash", encode(&ring_hash()))]),
        Standard::LeastRequest | Standard::RoundRobin => {
            let mut picking: Vec<_> = rota.iter().map(|rota| policy("rota", encode(rota))).collect();
            if lb == Standard::LeastRequest {
                picking.push(policy("least_request", encode(&lb::least_request::v3::LeastRequest::default())));
            }
            picking.push(round_robin);
            let wrr = lb::wrr_locality::v3::WrrLocality {
                endpoint_picking_policy: Some(cluster::LoadBalancingPolicy { policies: picking }),
            };
            let legacy = match lb {
                Standard::LeastRequest => cluster::cluster::LbPolicy::LeastRequest,
                _ => cluster::cluster::LbPolicy::RoundRobin,
            };
            (legacy, vec![policy("wrr_locality", encode(&wrr))])
        }
    };
    cluster::Cluster {
        name: name.to_string(),
        cluster_discovery_type: Some(cluster::cluster::ClusterDiscoveryType::Type(
            cluster::cluster::DiscoveryType::Eds as i32,
        )),
        eds_cluster_config: Some(cluster::cluster::EdsClusterConfig {
            eds_config: Some(ads()),
            service_name: name.to_string(),
        }),
        lb_policy: legacy as i32,
        load_balancing_policy: Some(cluster::LoadBalancingPolicy { policies }),
        ..Default::default()
    }
}

fn in_subset(instance: &Instance, subset: &Subset) -> bool {
    match subset {
        Subset::Unversioned => instance.version.is_empty(),
        Subset::Version(version) => &*instance.version == version,
        Subset::Any => true,
        Subset::None => false,
    }
}

fn assignment(
    name: &str,
    snapshot: &ServiceSnapshot,
    subset: &Subset,
    policy: &Policy,
    ejected: &dyn Fn(&Instance) -> bool,
) -> endpoint::ClusterLoadAssignment {
    let members: Vec<&Arc<Instance>> = snapshot.instances.iter().filter(|i| in_subset(i, subset)).collect();
    let up = members.iter().filter(|i| i.status == Status::Up).count();
    let ejection = &policy.ejection;
    let out: Vec<&str> = if ejection.enabled {
        members.iter().filter(|i| i.status == Status::Up && ejected(i)).map(|i| &*i.id).collect()
    } else {
        Vec::new()
    };
    // Panic mode, as picks do it: past the cap, or with nothing left, nobody is skipped.
    let marked = !out.is_empty() && out.len() <= ejection.cap(up) && out.len() < up;
    let mut zones: BTreeMap<&str, Vec<endpoint::LbEndpoint>> = BTreeMap::new();
    let mut zone_weights: BTreeMap<&str, u32> = BTreeMap::new();
    for instance in members {
        let health = match instance.status {
            Status::Up if marked && out.contains(&&*instance.id) => core::HealthStatus::Unhealthy,
            Status::Up => core::HealthStatus::Healthy,
            Status::Draining => core::HealthStatus::Draining,
            Status::Down => core::HealthStatus::Unhealthy,
        };
        let weight = instance.weight.max(1);
        if health == core::HealthStatus::Healthy {
            let total = zone_weights.entry(&instance.zone).or_default();
            *total = total.saturating_add(weight);
        }
        zones.entry(&instance.zone).or_default().push(endpoint::LbEndpoint {
            health_status: health as i32,
            load_balancing_weight: Some(UInt32Value { value: weight }),
            host_identifier: Some(endpoint::lb_endpoint::HostIdentifier::Endpoint(endpoint::Endpoint {
                address: Some(core::Address {
                    address: Some(core::address::Address::SocketAddress(core::SocketAddress {
                        address: instance.host.clone(),
                        port_specifier: Some(core::socket_address::PortSpecifier::PortValue(u32::from(instance.port))),
                        ..Default::default()
                    })),
                }),
                hostname: instance.id.to_string(),
                ..Default::default()
            })),
            ..Default::default()
        });
    }
    let endpoints = zones
        .into_iter()
        .map(|(zone, lb_endpoints)| endpoint::LocalityLbEndpoints {
            locality: Some(core::Locality { zone: zone.to_string(), ..Default::default() }),
            lb_endpoints,
            // gRPC ignores a locality without a weight; one with nothing healthy keeps 1.
            load_balancing_weight: Some(UInt32Value { value: zone_weights.get(zone).copied().unwrap_or(1) }),
            ..Default::default()
        })
        .collect();
    endpoint::ClusterLoadAssignment { cluster_name: name.to_string(), endpoints, ..Default::default() }
}

#[cfg(test)]
mod tests;
