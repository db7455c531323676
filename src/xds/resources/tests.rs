use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::route::v3::RouteAction;
use envoy_types::pb::envoy::config::route::v3::route_action::ClusterSpecifier;
use prost::Message;

use super::*;
use crate::policy::{GrayRelease, GraySpec};
use crate::registry::InstanceSpec;

fn instance(id: &str, version: &str, zone: &str, status: Status) -> Arc<Instance> {
    let spec = InstanceSpec {
        id: id.into(),
        service: "echo".into(),
        host: "127.0.0.1".into(),
        port: 7000,
        version: version.into(),
        zone: zone.into(),
        weight: Some(50),
        ..Default::default()
    };
    let mut instance = spec.validate("test").expect("valid test instance");
    instance.status = status;
    Arc::new(instance)
}

fn fleet() -> ServiceSnapshot {
    ServiceSnapshot::build(
        "echo".into(),
        7,
        vec![
            instance("echo-a", "", "z1", Status::Up),
            instance("echo-b", "", "z2", Status::Up),
            instance("echo-c", "", "z1", Status::Draining),
            instance("echo-d", "", "z1", Status::Up),
            instance("echo-zlt", "zlt", "", Status::Up),
        ],
    )
}

fn nothing_ejected(_: &Instance) -> bool {
    false
}

fn decode<M: Message + Default>(any: &Any) -> M {
    M::decode(&*any.value).expect("the resource decodes")
}

fn routes(resources: &ServiceResources) -> Vec<route::Route> {
    let config: route::RouteConfiguration = decode(&resources.route);
    assert_eq!(config.name, "echo");
    assert_eq!(config.virtual_hosts.len(), 1);
    assert_eq!(config.virtual_hosts[0].domains, vec!["*".to_string()]);
    config.virtual_hosts[0].routes.clone()
}

fn action(route: &route::Route) -> &RouteAction {
    match &route.action {
        Some(route::route::Action::Route(action)) => action,
        other => panic!("not a route action: {other:?}"),
    }
}

fn cluster_of(route: &route::Route) -> String {
    match &action(route).cluster_specifier {
        Some(ClusterSpecifier::Cluster(name)) => name.clone(),
        other => panic!("not one cluster: {other:?}"),
    }
}

/// `(id, health)` of every endpoint of `cluster`, by locality zone.
fn endpoints(resources: &ServiceResources, cluster: &str) -> BTreeMap<String, Vec<(String, core::HealthStatus)>> {
    let assignment: endpoint::ClusterLoadAssignment = decode(&resources.endpoints[cluster]);
    assert_eq!(assignment.cluster_name, cluster);
    assignment
        .endpoints
        .iter()
        .map(|locality| {
            let weight = locality.load_balancing_weight.as_ref().map(|w| w.value).unwrap_or(0);
            assert!(weight >= 1, "gRPC ignores a locality without a weight");
            let members = locality
                .lb_endpoints
                .iter()
                .map(|e| {
                    let Some(endpoint::lb_endpoint::HostIdentifier::Endpoint(ep)) = &e.host_identifier else {
                        panic!("an endpoint without an address")
                    };
                    (ep.hostname.clone(), core::HealthStatus::try_from(e.health_status).unwrap())
                })
                .collect();
            (locality.locality.as_ref().unwrap().zone.clone(), members)
        })
        .collect()
}

#[test]
fn routes_follow_version_isolation_as_pick_does() {
    let resources = build(&fleet(), &Policy::default(), &nothing_ejected);
    let routes = routes(&resources);
    let names: Vec<&str> = routes.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["version zlt", "another version", "no version"]);
    // x-rota-version: zlt → only the zlt instances.
    let headers = &routes[0].r#match.as_ref().unwrap().headers;
    assert_eq!(headers[0].name, VERSION_HEADER);
    assert_eq!(cluster_of(&routes[0]), "echo/version/zlt");
    // Any other version, and no version: the unversioned instances.
    assert_eq!(cluster_of(&routes[1]), "echo");
    assert_eq!(cluster_of(&routes[2]), "echo");
    assert!(routes[2].r#match.as_ref().unwrap().headers.is_empty());
    let clusters: Vec<&String> = resources.clusters.keys().collect();
    assert_eq!(clusters, ["echo", "echo/any", "echo/none", "echo/version/zlt"]);
    assert_eq!(resources.endpoints.keys().collect::<Vec<_>>(), clusters);
}

#[test]
fn with_no_unversioned_instance_the_isolation_fallback_decides() {
    let only_zlt = ServiceSnapshot::build("echo".into(), 3, vec![instance("echo-zlt", "zlt", "", Status::Up)]);
    let fail = routes(&build(&only_zlt, &Policy::default(), &nothing_ejected));
    assert_eq!(cluster_of(&fail[1]), "echo/none");
    assert_eq!(cluster_of(&fail[2]), "echo/none");
    let resources = build(&only_zlt, &Policy::default(), &nothing_ejected);
    assert!(endpoints(&resources, "echo/none").is_empty(), "the fail cluster has no endpoints");

    let any = Policy { isolation_fallback: IsolationFallback::Any, ..Policy::default() };
    let routes = routes(&build(&only_zlt, &any, &nothing_ejected));
    assert_eq!(cluster_of(&routes[1]), "echo/any");
    assert_eq!(cluster_of(&routes[2]), "echo/any");
}

#[test]
fn a_version_with_no_up_instance_has_no_route_of_its_own() {
    let snapshot = ServiceSnapshot::build(
        "echo".into(),
        3,
        vec![instance("echo-a", "", "", Status::Up), instance("echo-zlt", "zlt", "", Status::Draining)],
    );
    let resources = build(&snapshot, &Policy::default(), &nothing_ejected);
    let names: Vec<String> = routes(&resources).iter().map(|r| r.name.clone()).collect();
    assert_eq!(names, ["another version", "no version"]);
    // Its cluster is still served, with the instance draining.
    let zlt = endpoints(&resources, "echo/version/zlt");
    assert_eq!(zlt[""], vec![("echo-zlt".to_string(), core::HealthStatus::Draining)]);
}

#[test]
fn endpoints_carry_status_zones_and_weights() {
    let resources = build(&fleet(), &Policy::default(), &nothing_ejected);
    let unversioned = endpoints(&resources, "echo");
    assert_eq!(
        unversioned["z1"],
        vec![
            ("echo-a".to_string(), core::HealthStatus::Healthy),
            ("echo-c".to_string(), core::HealthStatus::Draining),
            ("echo-d".to_string(), core::HealthStatus::Healthy),
        ]
    );
    assert_eq!(unversioned["z2"], vec![("echo-b".to_string(), core::HealthStatus::Healthy)]);
    let assignment: endpoint::ClusterLoadAssignment = decode(&resources.endpoints["echo"]);
    let z1 = assignment.endpoints.iter().find(|l| l.locality.as_ref().unwrap().zone == "z1").unwrap();
    // The locality weighs what its healthy endpoints weigh.
    assert_eq!(z1.load_balancing_weight.as_ref().unwrap().value, 100);
    assert_eq!(z1.lb_endpoints[0].load_balancing_weight.as_ref().unwrap().value, 50);
    assert_eq!(endpoints(&resources, "echo/any").values().map(Vec::len).sum::<usize>(), 5);
}

#[test]
fn ejected_instances_are_unhealthy_within_the_cap_and_none_in_panic_mode() {
    let one = |i: &Instance| &*i.id == "echo-a";
    let resources = build(&fleet(), &Policy::default(), &one);
    let z1 = &endpoints(&resources, "echo")["z1"];
    assert_eq!(z1[0], ("echo-a".to_string(), core::HealthStatus::Unhealthy));
    assert_eq!(z1[2], ("echo-d".to_string(), core::HealthStatus::Healthy));

    // Three UP unversioned instances, two ejected: more than 50 % may skip, so none is.
    let two = |i: &Instance| matches!(&*i.id, "echo-a" | "echo-b");
    let resources = build(&fleet(), &Policy::default(), &two);
    let all_healthy = endpoints(&resources, "echo")
        .values()
        .flatten()
        .all(|(_, health)| matches!(health, core::HealthStatus::Healthy | core::HealthStatus::Draining));
    assert!(all_healthy, "panic mode marks nobody");

    // Ejection off: nothing marked.
    let off =
        Policy { ejection: crate::load::EjectionConfig { enabled: false, ..Default::default() }, ..Policy::default() };
    let resources = build(&fleet(), &off, &one);
    assert_eq!(endpoints(&resources, "echo")["z1"][0].1, core::HealthStatus::Healthy);
}

#[test]
fn gray_release_becomes_weighted_clusters() {
    let spec = GraySpec { unversioned: 3, versions: BTreeMap::from([("zlt".into(), 1), ("gone".into(), 2)]) };
    let policy = Policy { gray: GrayRelease::new(&spec, "gray").unwrap(), ..Policy::default() };
    let routes = routes(&build(&fleet(), &policy, &nothing_ejected));
    let plain = routes.last().unwrap();
    let Some(ClusterSpecifier::WeightedClusters(weighted)) = &action(plain).cluster_specifier else {
        panic!("not weighted clusters")
    };
    let weights: Vec<(String, u32)> =
        weighted.clusters.iter().map(|c| (c.name.clone(), c.weight.as_ref().unwrap().value)).collect();
    // A version with no UP instance gives its share to the unversioned instances.
    assert_eq!(weights, [("echo".to_string(), 5), ("echo/version/zlt".to_string(), 1)]);
    // A request naming a version is not split.
    assert_eq!(cluster_of(&routes[0]), "echo/version/zlt");
}

#[test]
fn clusters_offer_rotas_policy_then_the_closest_standard_one() {
    let names = |policy: &Policy| -> (i32, Vec<String>) {
        let resources = build(&fleet(), policy, &nothing_ejected);
        let cluster: cluster::Cluster = decode(&resources.clusters["echo"]);
        let eds = cluster.eds_cluster_config.unwrap();
        assert_eq!(eds.service_name, "echo");
        let top = cluster.load_balancing_policy.unwrap().policies;
        let mut names: Vec<String> = Vec::new();
        for p in top {
            let config = p.typed_extension_config.unwrap();
            names.push(config.name.clone());
            let typed = config.typed_config.unwrap();
            if typed.type_url.ends_with("WrrLocality") {
                let wrr: lb::wrr_locality::v3::WrrLocality = decode(&typed);
                for inner in wrr.endpoint_picking_policy.unwrap().policies {
                    let inner = inner.typed_extension_config.unwrap();
                    if inner.name == "rota" {
                        let typed: TypedStruct = decode(&inner.typed_config.unwrap());
                        assert_eq!(typed.type_url, ROTA_POLICY_TYPE);
                    }
                    names.push(format!("  {}", inner.name));
                }
            }
        }
        (cluster.lb_policy, names)
    };
    let round_robin = names(&Policy::default());
    assert_eq!(round_robin.1, ["wrr_locality", "  rota", "  round_robin"]);
    assert_eq!(round_robin.0, cluster::cluster::LbPolicy::RoundRobin as i32);
    let with = |rule: &str| Policy { rule: Arc::new(crate::rules::parse(rule).unwrap()), ..Policy::default() };
    // least_request cannot be leased: no rota policy to offer, the standard one first.
    assert_eq!(names(&with("least_request")).1, ["wrr_locality", "  least_request", "  round_robin"]);
    assert_eq!(names(&with("repeat(n=3)")).1, ["wrr_locality", "  rota", "  round_robin"]);
    // The fallback clusters hold no one lease's instances: no rota policy either.
    let resources = build(&fleet(), &Policy::default(), &nothing_ejected);
    let any: cluster::Cluster = decode(&resources.clusters["echo/any"]);
    let top = &any.load_balancing_policy.unwrap().policies[0];
    let wrr: lb::wrr_locality::v3::WrrLocality =
        decode(top.typed_extension_config.as_ref().unwrap().typed_config.as_ref().unwrap());
    let inner: Vec<String> = wrr
        .endpoint_picking_policy
        .unwrap()
        .policies
        .into_iter()
        .map(|p| p.typed_extension_config.unwrap().name)
        .collect();
    assert_eq!(inner, ["round_robin"]);
    let hashed = names(&with("consistent_hash"));
    assert_eq!(hashed.1, ["ring_hash"]);
    assert_eq!(hashed.0, cluster::cluster::LbPolicy::RingHash as i32);
    let routes = routes(&build(&fleet(), &with("consistent_hash"), &nothing_ejected));
    assert_eq!(action(&routes[2]).hash_policy.len(), 1, "the ring hashes x-rota-key");
}

#[test]
fn a_ring_names_the_hash_function_grpc_clients_accept() {
    for rule in ["consistent_hash", "sticky", "retry(rule=consistent_hash)"] {
        let policy = Policy { rule: Arc::new(crate::rules::parse(rule).unwrap()), ..Policy::default() };
        let resources = build(&fleet(), &policy, &nothing_ejected);
        for (name, any) in &resources.clusters {
            let cluster: cluster::Cluster = decode(any);
            let top = &cluster.load_balancing_policy.unwrap().policies[0];
            let config = top.typed_extension_config.as_ref().unwrap();
            assert_eq!(config.name, "ring_hash", "{rule}: {name}");
            let ring: lb::ring_hash::v3::RingHash = decode(config.typed_config.as_ref().unwrap());
            assert_eq!(ring.hash_function, lb::ring_hash::v3::ring_hash::HashFunction::XxHash as i32, "{rule}: {name}");
        }
    }
}

#[test]
fn names_parse_back_to_their_service_and_subset() {
    for subset in [Subset::Unversioned, Subset::Version("zlt".into()), Subset::Any, Subset::None] {
        let name = cluster_name("echo", &subset);
        assert_eq!(parse_name(Kind::Cluster, &name), Some(("echo", subset.clone())));
        assert_eq!(parse_name(Kind::Endpoint, &name), Some(("echo", subset)));
    }
    assert_eq!(parse_name(Kind::Listener, "echo"), Some(("echo", Subset::Unversioned)));
    for junk in ["", "echo/", "echo/version/", "echo/what", "a b", "echo/version/a/b", "/any"] {
        assert_eq!(parse_name(Kind::Cluster, junk), None, "{junk:?}");
    }
    assert_eq!(parse_name(Kind::Listener, "echo/any"), None);
}

#[test]
fn every_resource_kind_has_its_type_url() {
    let resources = build(&fleet(), &Policy::default(), &nothing_ejected);
    assert_eq!(resources.listener.type_url, LISTENER_TYPE);
    assert_eq!(resources.route.type_url, ROUTE_TYPE);
    assert!(resources.clusters.values().all(|c| c.type_url == CLUSTER_TYPE));
    assert!(resources.endpoints.values().all(|e| e.type_url == ENDPOINT_TYPE));
    for kind in Kind::ALL {
        assert_eq!(Kind::from_type_url(kind.type_url()), Some(kind));
    }
    let listener: listener::Listener = decode(&resources.listener);
    let manager: hcm::HttpConnectionManager = decode(listener.api_listener.unwrap().api_listener.as_ref().unwrap());
    let Some(hcm::http_connection_manager::RouteSpecifier::Rds(rds)) = manager.route_specifier else {
        panic!("not RDS")
    };
    assert_eq!(rds.route_config_name, "echo");
    assert_eq!(manager.http_filters[0].name, "envoy.filters.http.router");
}
