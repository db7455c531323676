use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::routing::get;

use super::*;
use crate::sources::spec::SourceTable;

fn instance(id: &str, status: &str, port: u16, metadata: &str) -> String {
    format!(
        r#"{{"instanceId":"{id}","hostName":"127.0.0.1","app":"DEMO","ipAddr":"127.0.0.1","status":"{status}",
        "overriddenStatus":"UNKNOWN","port":{{"$":{port},"@enabled":"true"}},"securePort":{{"$":443,"@enabled":"false"}},
        "metadata":{metadata},"actionType":"ADDED","lastDirtyTimestamp":"1764000000000"}}"#
    )
}

fn document(hash: &str, instances: &[String]) -> String {
    format!(
        r#"{{"applications":{{"versions__delta":"1","apps__hashcode":"{hash}","application":[{{"name":"DEMO","instance":[{}]}}]}}}}"#,
        instances.join(",")
    )
}

#[test]
fn each_field_maps_as_documented() {
    let body = document(
        "OUT_OF_SERVICE_1_UP_1_",
        &[
            instance(
                "127.0.0.1:demo:8081",
                "UP",
                8081,
                r#"{"version":"zlt","zone":"z1","weight":"7","management.port":"8081"}"#,
            ),
            instance("127.0.0.1:demo:8082", "OUT_OF_SERVICE", 8082, r#"{"@class":"java.util.Collections$EmptyMap"}"#),
        ],
    );
    let parsed = parse(body.as_bytes()).unwrap();
    assert_eq!(parsed.hash_code, "OUT_OF_SERVICE_1_UP_1_");
    let records: Vec<InstanceRecord> = parsed.entries.iter().map(|(_, _, e, _)| e.record.clone().unwrap()).collect();
    assert_eq!(records[0].id, "127.0.0.1:demo:8081");
    assert_eq!((records[0].host.as_str(), records[0].port), ("127.0.0.1", 8081));
    assert_eq!((records[0].version.as_str(), records[0].zone.as_str(), records[0].weight), ("zlt", "z1", 7));
    assert_eq!(records[0].metadata.get("management.port").map(String::as_str), Some("8081"));
    assert_eq!(records[1].status, "DRAINING");
    assert!(records[1].metadata.is_empty(), "Eureka's @class entry is not metadata");
    assert_eq!(records[1].weight, DEFAULT_WEIGHT);
}

#[test]
fn a_single_application_or_instance_may_come_as_an_object() {
    let one = instance("a", "UP", 1, "{}");
    let body =
        format!(r#"{{"applications":{{"apps__hashcode":"UP_1_","application":{{"name":"DEMO","instance":{one}}}}}}}"#);
    let parsed = parse(body.as_bytes()).unwrap();
    assert_eq!(parsed.entries.len(), 1);
    let empty = parse(br#"{"applications":{"versions__delta":"1","apps__hashcode":"","application":[]}}"#).unwrap();
    assert!(empty.entries.is_empty());
}

#[test]
fn a_malformed_instance_is_refused_alone() {
    let no_port = instance("b", "UP", 2, "{}").replace(r#""@enabled":"true""#, r#""@enabled":"false""#);
    let bad_weight = instance("c", "UP", 3, r#"{"weight":"heavy"}"#);
    let body = document("UP_3_", &[instance("a", "UP", 1, "{}"), no_port, bad_weight]);
    let parsed = parse(body.as_bytes()).unwrap();
    let results: Vec<Result<u16, String>> =
        parsed.entries.iter().map(|(_, _, e, _)| e.record.clone().map(|r| r.port)).collect();
    assert_eq!(results[0], Ok(1));
    assert_eq!(results[1], Err("no enabled port".to_owned()));
    assert!(results[2].as_ref().unwrap_err().contains("metadata.weight"), "{results:?}");
    assert!(parse(b"<applications/>").is_err(), "XML is not read as JSON");
}

#[test]
fn the_hash_code_counts_instances_per_status_in_name_order() {
    let entry = |status: &str| Entry { status: status.into(), record: Err(String::new()) };
    let apps: BTreeMap<String, BTreeMap<String, Entry>> = [
        ("A".to_owned(), [("1".to_owned(), entry("UP")), ("2".to_owned(), entry("DOWN"))].into()),
        ("B".to_owned(), [("3".to_owned(), entry("UP"))].into()),
    ]
    .into();
    assert_eq!(hash_code(&apps), "DOWN_1_UP_2_");
    assert_eq!(hash_code(&BTreeMap::new()), "");
}

/// A Eureka server's answers, changed by the test; counts its full fetches.
#[derive(Clone, Default)]
struct Fake {
    full: Arc<std::sync::Mutex<String>>,
    delta: Arc<std::sync::Mutex<String>>,
    full_fetches: Arc<AtomicUsize>,
}

async fn serve(fake: Fake) -> (Endpoint, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let full = fake.clone();
    let app = Router::new()
        .route(
            "/eureka/apps/",
            get(move || async move {
                full.full_fetches.fetch_add(1, Ordering::SeqCst);
                full.full.lock().unwrap().clone()
            }),
        )
        .route("/eureka/apps/delta", get(move || async move { fake.delta.lock().unwrap().clone() }));
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (Endpoint { host: "127.0.0.1".into(), port, path: "/eureka".into() }, task)
}

fn spec() -> SourceSpec {
    SourceTable { url: "eureka+http://127.0.0.1:1/eureka".into(), interval: Some("100ms".into()), ..Default::default() }
        .check()
        .unwrap()
}

fn ports(listing: &Listing) -> Vec<u16> {
    listing.services.get("demo").map(|list| list.iter().map(|r| r.port).collect()).unwrap_or_default()
}

#[tokio::test]
async fn deltas_apply_while_the_hash_code_matches_and_a_mismatch_fetches_whole() {
    let fake = Fake::default();
    *fake.full.lock().unwrap() = document("UP_1_", &[instance("a", "UP", 1, "{}")]);
    let (endpoint, server) = serve(fake.clone()).await;
    let mut eureka = Eureka::new(endpoint, &spec());
    assert_eq!(ports(&eureka.next().await.unwrap()), [1]);
    assert_eq!(fake.full_fetches.load(Ordering::SeqCst), 1);

    // An instance added, and the server's hash code agrees with the copy: no full fetch.
    *fake.delta.lock().unwrap() = document("UP_2_", &[instance("b", "UP", 2, "{}")]);
    assert_eq!(ports(&eureka.next().await.unwrap()), [1, 2]);
    assert_eq!(fake.full_fetches.load(Ordering::SeqCst), 1);

    // One deleted, one marked down.
    let deleted = instance("a", "UP", 1, "{}").replace("ADDED", "DELETED");
    let down = instance("b", "DOWN", 2, "{}").replace("ADDED", "MODIFIED");
    *fake.delta.lock().unwrap() = document("DOWN_1_", &[deleted, down]);
    let listing = eureka.next().await.unwrap();
    assert_eq!(ports(&listing), [2]);
    assert_eq!(listing.services["demo"][0].status, "DOWN");
    assert_eq!(fake.full_fetches.load(Ordering::SeqCst), 1);

    // A delta that leaves the copy disagreeing (a change it never saw): the registry is
    // fetched whole at once, and the copy is the server's.
    *fake.full.lock().unwrap() = document("UP_2_", &[instance("c", "UP", 3, "{}"), instance("d", "UP", 4, "{}")]);
    *fake.delta.lock().unwrap() = document("UP_2_", &[]);
    assert_eq!(ports(&eureka.next().await.unwrap()), [3, 4]);
    assert_eq!(fake.full_fetches.load(Ordering::SeqCst), 2);
    server.abort();
}

#[tokio::test]
async fn an_answer_over_max_bytes_or_not_ok_fails_the_read_and_reset_fetches_whole_again() {
    let fake = Fake::default();
    *fake.full.lock().unwrap() = document("UP_1_", &[instance("a", "UP", 1, "{}")]);
    let (endpoint, server) = serve(fake.clone()).await;
    let mut small = spec();
    small.max_bytes = 64;
    let err = Eureka::new(endpoint.clone(), &small).next().await.unwrap_err();
    assert!(err.to_string().contains("larger than 64 bytes"), "{err}");

    let mut eureka = Eureka::new(endpoint.clone(), &spec());
    eureka.next().await.unwrap();
    *fake.delta.lock().unwrap() = "not json".into();
    let err = eureka.next().await.unwrap_err();
    assert!(err.to_string().contains("/apps/delta"), "{err}");
    eureka.reset();
    eureka.next().await.unwrap();
    assert_eq!(fake.full_fetches.load(Ordering::SeqCst), 3);

    let mut lost = Eureka::new(Endpoint { path: "/nowhere".into(), ..endpoint }, &spec());
    let err = lost.next().await.unwrap_err();
    assert!(err.to_string().contains("404"), "{err}");
    server.abort();
}

/// Answers a real Eureka server gave (tests/sources/eureka/samples), in the order it gave them.
mod recorded {
    use super::*;

    const TWO_UP: &str = include_str!("../../../tests/sources/eureka/samples/apps-two-up.json");
    const DELTA_OUT_OF_SERVICE: &str =
        include_str!("../../../tests/sources/eureka/samples/delta-b-out-of-service.json");
    const DELTA_STOPPED: &str = include_str!("../../../tests/sources/eureka/samples/delta-after-a-stopped.json");
    const APPS_STOPPED: &str = include_str!("../../../tests/sources/eureka/samples/apps-after-a-stopped.json");
    const EMPTY: &str = include_str!("../../../tests/sources/eureka/samples/apps-empty.json");

    fn copy(body: &str) -> BTreeMap<String, BTreeMap<String, Entry>> {
        let mut apps: BTreeMap<String, BTreeMap<String, Entry>> = BTreeMap::new();
        for (app, id, entry, _) in parse(body.as_bytes()).unwrap().entries {
            apps.entry(app).or_default().insert(id, entry);
        }
        apps
    }

    fn apply(apps: &mut BTreeMap<String, BTreeMap<String, Entry>>, delta: &str) -> String {
        let parsed = parse(delta.as_bytes()).unwrap();
        for (app, id, entry, action) in parsed.entries {
            if action == "DELETED" {
                apps.get_mut(&app).map(|i| i.remove(&id));
                apps.retain(|_, i| !i.is_empty());
            } else {
                apps.entry(app).or_default().insert(id, entry);
            }
        }
        parsed.hash_code
    }

    #[test]
    fn a_full_listing_reads_every_instance_with_its_metadata() {
        let apps = copy(TWO_UP);
        assert_eq!(hash_code(&apps), parse(TWO_UP.as_bytes()).unwrap().hash_code);
        let records: Vec<InstanceRecord> =
            apps.values().flat_map(BTreeMap::values).map(|e| e.record.clone().unwrap()).collect();
        assert_eq!(records.len(), 2);
        assert!(records.iter().all(|r| r.host == "127.0.0.1" && r.status == "UP" && r.port > 1024));
        let versions: Vec<&str> = records.iter().map(|r| r.version.as_str()).collect();
        assert!(versions.contains(&"zlt") && versions.contains(&""), "{versions:?}");
        assert!(parse(EMPTY.as_bytes()).unwrap().entries.is_empty());
    }

    #[test]
    fn recorded_deltas_leave_a_copy_that_matches_the_servers_hash_code() {
        let mut apps = copy(TWO_UP);
        let hash = apply(&mut apps, DELTA_OUT_OF_SERVICE);
        assert_eq!(hash_code(&apps), hash);
        let drained: Vec<&InstanceRecord> = apps
            .values()
            .flat_map(BTreeMap::values)
            .filter_map(|e| e.record.as_ref().ok())
            .filter(|r| r.status == "DRAINING")
            .collect();
        assert_eq!(drained.len(), 1, "OUT_OF_SERVICE is DRAINING");
        // The app stopped: its delta against the copy agrees with the full listing then.
        let mut apps = copy(TWO_UP);
        let hash = apply(&mut apps, DELTA_STOPPED);
        let full = copy(APPS_STOPPED);
        assert_eq!(hash_code(&full), parse(APPS_STOPPED.as_bytes()).unwrap().hash_code);
        assert_eq!(hash_code(&apps), hash);
        let ids = |apps: &BTreeMap<String, BTreeMap<String, Entry>>| -> Vec<String> {
            apps.values().flat_map(BTreeMap::keys).cloned().collect()
        };
        assert_eq!(ids(&apps), ids(&full));
    }
}
