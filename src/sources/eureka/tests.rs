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
    applications(hash, &[("DEMO", instances)])
}

/// A document of several applications, each with its instances.
fn applications(hash: &str, apps: &[(&str, &[String])]) -> String {
    let apps: Vec<String> = apps
        .iter()
        .map(|(name, instances)| format!(r#"{{"name":"{name}","instance":[{}]}}"#, instances.join(",")))
        .collect();
    format!(
        r#"{{"applications":{{"versions__delta":"1","apps__hashcode":"{hash}","application":[{}]}}}}"#,
        apps.join(",")
    )
}

fn spec() -> SourceSpec {
    SourceTable { url: "eureka+http://127.0.0.1:1/eureka".into(), interval: Some("100ms".into()), ..Default::default() }
        .check()
        .unwrap()
}

/// A source that covers only `services`.
fn covering(services: &[&str]) -> SourceSpec {
    SourceSpec { services: Some(services.iter().map(|s| s.to_string()).collect()), ..spec() }
}

/// A copy of `body` read as a full listing; its hash code as the server gave it.
fn copy_of(spec: &SourceSpec, body: &str) -> (Copy, String) {
    let mut copy = Copy::new(spec);
    let hash = parse(body.as_bytes(), &mut Apply { copy: &mut copy, spec, whole: true }).unwrap();
    (copy, hash)
}

/// Applies the delta `body` to `copy`; the hash code the server gave.
fn apply(copy: &mut Copy, spec: &SourceSpec, body: &str) -> String {
    parse(body.as_bytes(), &mut Apply { copy, spec, whole: false }).unwrap()
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
    let (copy, hash) = copy_of(&spec(), &body);
    assert_eq!(hash, "OUT_OF_SERVICE_1_UP_1_");
    assert_eq!(copy.hash_code().as_deref(), Some(hash.as_str()));
    let (records, refused) = read(body.as_bytes()).unwrap();
    assert!(refused.is_empty(), "{refused:?}");
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
    assert_eq!(read(body.as_bytes()).unwrap().0.len(), 1);
    let empty = read(br#"{"applications":{"versions__delta":"1","apps__hashcode":"","application":[]}}"#).unwrap();
    assert!(empty.0.is_empty() && empty.1.is_empty());
    let null = read(br#"{"applications":{"apps__hashcode":"","application":null}}"#).unwrap();
    assert!(null.0.is_empty() && null.1.is_empty());
}

#[test]
fn instances_written_before_their_applications_name_are_read_all_the_same() {
    let body = format!(
        r#"{{"applications":{{"application":[{{"instance":[{}],"name":"DEMO"}}],"apps__hashcode":"UP_1_"}}}}"#,
        instance("a", "UP", 1, r#"{"version":"v1"}"#)
    );
    let (copy, hash) = copy_of(&spec(), &body);
    assert_eq!(copy.hash_code(), Some(hash));
    let (records, _) = read(body.as_bytes()).unwrap();
    assert_eq!((records[0].id.as_str(), records[0].version.as_str()), ("a", "v1"));
    // One without a name cannot be counted: the copy cannot be checked.
    let nameless =
        format!(r#"{{"applications":{{"application":[{{"instance":[{}]}}]}}}}"#, instance("a", "UP", 1, "{}"));
    assert!(copy_of(&spec(), &nameless).0.hash_code().is_none());
}

#[test]
fn a_malformed_instance_is_refused_alone() {
    let no_port = instance("b", "UP", 2, "{}").replace(r#""@enabled":"true""#, r#""@enabled":"false""#);
    let bad_weight = instance("c", "UP", 3, r#"{"weight":"heavy"}"#);
    let body = document("UP_3_", &[instance("a", "UP", 1, "{}"), no_port, bad_weight]);
    let (usable, refused) = read(body.as_bytes()).unwrap();
    assert_eq!(usable.iter().map(|r| r.port).collect::<Vec<_>>(), [1]);
    assert_eq!(refused[0], "application DEMO instance b: no enabled port");
    assert!(refused[1].contains("metadata.weight"), "{refused:?}");
    assert!(read(b"<applications/>").is_err(), "XML is not read as JSON");
    assert!(read(br#"{"applications":[]}"#).is_err());
    assert!(read(br#"{"apps":{}}"#).is_err());
    assert!(read(br#"{"applications":{}} trailing"#).is_err());
}

#[test]
fn fields_past_rotas_limits_are_refused_as_they_are_read() {
    let many: Vec<String> = (0..=MAX_METADATA_ENTRIES).map(|i| format!(r#""k{i}":"v""#)).collect();
    let many = format!("{{{}}}", many.join(","));
    let long_value = format!(r#"{{"big":"{}"}}"#, "x".repeat(MAX_METADATA_VALUE_LEN + 1));
    let long_object = format!(r#"{{"big":{{"a":"{}"}}}}"#, "x".repeat(5 * MAX_METADATA_VALUE_LEN));
    let long_key = format!(r#"{{"{}":"v"}}"#, "k".repeat(MAX_METADATA_KEY_LEN + 1));
    let long_host = instance("h", "UP", 5, "{}")
        .replace(r#""hostName":"127.0.0.1""#, &format!(r#""hostName":"{}""#, "h".repeat(300)));
    let body = document(
        "UP_6_",
        &[
            instance("a", "UP", 1, &many),
            instance("b", "UP", 2, &long_value),
            instance("c", "UP", 3, &long_object),
            instance("d", "UP", 4, &long_key),
            long_host,
            instance("fine", "UP", 6, r#"{"n":7,"flag":true,"nested":{"a":1}}"#),
        ],
    );
    let (usable, refused) = read(body.as_bytes()).unwrap();
    assert_eq!(refused.len(), 5, "{refused:?}");
    assert!(refused[0].contains("metadata has 65 entries; the limit is 64"), "{refused:?}");
    assert!(
        refused[1].contains("longer than 512 bytes") && refused[2].contains("longer than 512 bytes"),
        "{refused:?}"
    );
    assert!(refused[3].contains("metadata key") && refused[4].contains("the host is 300 bytes long"), "{refused:?}");
    assert!(refused.iter().all(|r| r.len() < 200), "a refusal's message is short: {refused:?}");
    let metadata = &usable[0].metadata;
    assert_eq!((metadata["n"].as_str(), metadata["flag"].as_str()), ("7", "true"));
    assert_eq!(metadata["nested"], r#"{"a":1}"#, "anything but a string is kept as its JSON");
}

#[test]
fn the_hash_code_counts_instances_per_status_in_name_order() {
    let body = applications(
        "",
        &[
            ("A", &[instance("1", "UP", 1, "{}"), instance("2", "DOWN", 2, "{}")]),
            ("B", &[instance("3", "UP", 3, "{}")]),
        ],
    );
    assert_eq!(copy_of(&spec(), &body).0.hash_code().as_deref(), Some("DOWN_1_UP_2_"));
    // The same, when the source keeps only B: A's instances are counted, not kept.
    let (copy, _) = copy_of(&covering(&["b"]), &body);
    assert_eq!((copy.kept.len(), copy.tracked.len()), (1, 2));
    assert_eq!(copy.hash_code().as_deref(), Some("DOWN_1_UP_2_"));
    assert_eq!(copy_of(&spec(), &document("", &[])).0.hash_code().as_deref(), Some(""));
}

#[test]
fn statuses_are_counted_up_to_a_bound_past_which_the_copy_cannot_be_checked() {
    let statuses: Vec<String> =
        (0..=MAX_STATUSES).map(|i| instance(&format!("i{i}"), &format!("S{i}"), 1, "{}")).collect();
    let (copy, _) = copy_of(&spec(), &document("", &statuses));
    assert!(copy.unchecked.is_some() && copy.hash_code().is_none());
    assert_eq!(copy.statuses.len(), MAX_STATUSES);
    let long = instance("a", &"S".repeat(MAX_STATUS_LEN + 1), 1, "{}");
    assert!(copy_of(&spec(), &document("", &[long])).0.hash_code().is_none());
}

/// A Eureka server's answers, changed by the test; counts its full fetches.
#[derive(Clone, Default)]
struct Fake {
    full: Arc<std::sync::Mutex<String>>,
    delta: Arc<std::sync::Mutex<String>>,
    full_fetches: Arc<AtomicUsize>,
    delta_fetches: Arc<AtomicUsize>,
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
        .route(
            "/eureka/apps/delta",
            get(move || async move {
                fake.delta_fetches.fetch_add(1, Ordering::SeqCst);
                fake.delta.lock().unwrap().clone()
            }),
        );
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (Endpoint { host: "127.0.0.1".into(), port, path: "/eureka".into() }, task)
}

fn ports(listing: &Listing) -> Vec<u16> {
    listing.services.get("demo").map(|list| list.iter().map(|r| r.port).collect()).unwrap_or_default()
}

/// The next listing, at once (the tests do not wait out the interval).
async fn read_now(eureka: &mut Eureka) -> Listing {
    eureka.due = None;
    eureka.next().await.unwrap()
}

/// Instances of the copy: (kept, counted without being kept, left out for want of room).
fn held(eureka: &Eureka) -> (usize, usize, usize) {
    let copy = eureka.copy.as_ref().unwrap();
    (copy.kept.len(), copy.tracked.len(), copy.left_out)
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

fn added(app: &str, id: &str, status: &str) -> String {
    instance(id, status, 1, "{}").replace(r#""app":"DEMO""#, &format!(r#""app":"{app}""#))
}

/// Deltas that add instances the source does not keep: of an application it does not cover,
/// and of one it covers past `max_instances`. The copy keeps `max_instances` instances, counts
/// the others by their status only, and still matches the server's hash code.
#[tokio::test]
async fn deltas_adding_instances_the_source_does_not_keep_leave_the_copy_bounded() {
    let fake = Fake::default();
    *fake.full.lock().unwrap() = applications("UP_1_", &[("DEMO", &[added("DEMO", "d0", "UP")])]);
    let (endpoint, server) = serve(fake.clone()).await;
    let spec = SourceSpec { max_instances: 5, ..covering(&["demo"]) };
    let mut eureka = Eureka::new(endpoint, &spec);
    read_now(&mut eureka).await;
    let mut total = 1;
    for round in 0..40 {
        let others: Vec<String> = (0..100).map(|i| added("OTHER", &format!("o{round}-{i}"), "UP")).collect();
        let demos: Vec<String> = (0..10).map(|i| added("DEMO", &format!("d{round}-{i}"), "UP")).collect();
        total += others.len() + demos.len();
        *fake.delta.lock().unwrap() = applications(&format!("UP_{total}_"), &[("OTHER", &others), ("DEMO", &demos)]);
        let listing = read_now(&mut eureka).await;
        assert_eq!(listing.services.keys().collect::<Vec<_>>(), ["demo"]);
        assert_eq!(listing.services["demo"].len(), 5);
        assert_eq!(listing.over_limit, 10 * (round + 1) + 1 - 5);
    }
    // Held: five instances; the rest only counted (DEMO's past the limit among them).
    assert_eq!(held(&eureka), (5, total - 5, 40 * 10 + 1 - 5));
    assert!(eureka.copy.as_ref().unwrap().kept_bytes <= 5 * (ENTRY_BYTES + 64));
    assert_eq!(fake.full_fetches.load(Ordering::SeqCst), 1, "the hash code matched throughout");
    server.abort();
}

/// The hash code counts every instance of the server: a change to an application the source
/// does not keep, seen again in the next delta (a delta repeats the changes of the last
/// minutes), keeps the copy matching; one it never saw makes it disagree, and the registry is
/// read whole.
#[tokio::test]
async fn the_hash_code_check_counts_the_applications_not_kept_and_a_mismatch_still_fetches_whole() {
    let fake = Fake::default();
    let full = applications(
        "UP_3_",
        &[("DEMO", &[added("DEMO", "a", "UP")]), ("OTHER", &[added("OTHER", "x", "UP"), added("OTHER", "y", "UP")])],
    );
    *fake.full.lock().unwrap() = full;
    let (endpoint, server) = serve(fake.clone()).await;
    let mut eureka = Eureka::new(endpoint, &covering(&["demo"]));
    read_now(&mut eureka).await;
    assert_eq!(held(&eureka), (1, 2, 0));

    let z = added("OTHER", "z", "UP");
    let x_down = added("OTHER", "x", "DOWN").replace("ADDED", "MODIFIED");
    *fake.delta.lock().unwrap() = applications("DOWN_1_UP_3_", &[("OTHER", &[z.clone(), x_down.clone()])]);
    read_now(&mut eureka).await;
    // The same changes again, and y deleted.
    let y_gone = added("OTHER", "y", "UP").replace("ADDED", "DELETED");
    *fake.delta.lock().unwrap() = applications("DOWN_1_UP_2_", &[("OTHER", &[z, x_down, y_gone])]);
    assert_eq!(ports(&read_now(&mut eureka).await), [1]);
    assert_eq!(held(&eureka), (1, 2, 0));
    assert_eq!(fake.full_fetches.load(Ordering::SeqCst), 1);

    // An addition to OTHER the copy never saw: it disagrees, and the registry is read whole.
    *fake.delta.lock().unwrap() = applications("DOWN_1_UP_3_", &[]);
    *fake.full.lock().unwrap() =
        applications("UP_2_", &[("DEMO", &[added("DEMO", "b", "UP")]), ("OTHER", &[added("OTHER", "w", "UP")])]);
    let listing = read_now(&mut eureka).await;
    assert_eq!(listing.services["demo"].iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["b"]);
    assert_eq!(fake.full_fetches.load(Ordering::SeqCst), 2);
    server.abort();
}

#[tokio::test]
async fn a_full_listing_keeps_at_most_max_instances_and_max_bytes_of_them() {
    let fake = Fake::default();
    let instances: Vec<String> = (0..20).map(|i| added("DEMO", &format!("d{i:02}"), "UP")).collect();
    *fake.full.lock().unwrap() = applications("UP_20_", &[("DEMO", &instances)]);
    let (endpoint, server) = serve(fake.clone()).await;
    let mut eureka = Eureka::new(endpoint.clone(), &SourceSpec { max_instances: 8, ..spec() });
    let listing = read_now(&mut eureka).await;
    assert_eq!((listing.services["demo"].len(), listing.over_limit), (8, 12));
    assert_eq!(held(&eureka), (8, 12, 12));

    // Instances of 64 short metadata entries each: each is counted as far more than its text
    // in the answer, and only as many as KEPT_PER_MAX_BYTES * max_bytes allows are kept.
    let metadata: Vec<String> = (0..MAX_METADATA_ENTRIES).map(|i| format!(r#""k{i}":"v""#)).collect();
    let metadata = format!("{{{}}}", metadata.join(","));
    let many: Vec<String> = (0..100).map(|i| instance(&format!("m{i:02}"), "UP", 1, &metadata)).collect();
    let body = applications("UP_100_", &[("DEMO", &many)]);
    let max_bytes = 100_000;
    assert!(body.len() < max_bytes);
    *fake.full.lock().unwrap() = body;
    let mut eureka = Eureka::new(endpoint, &SourceSpec { max_bytes, max_instances: 1000, ..spec() });
    let listing = read_now(&mut eureka).await;
    let copy = eureka.copy.as_ref().unwrap();
    let each = held_bytes(&copy.kept.values().next().unwrap().item);
    assert!(each > ENTRY_BYTES + MAX_METADATA_ENTRIES * METADATA_BYTES, "{each}");
    let fit = KEPT_PER_MAX_BYTES * max_bytes / each;
    assert!(fit < 100);
    assert_eq!((listing.services["demo"].len(), listing.over_limit), (fit, 100 - fit));
    assert!(copy.kept_bytes <= KEPT_PER_MAX_BYTES * max_bytes);
    server.abort();
}

/// A place freed while instances are left out: the registry is read whole, to fill it.
#[tokio::test]
async fn a_place_freed_while_instances_are_left_out_is_filled_by_a_full_read() {
    let fake = Fake::default();
    let three = [added("DEMO", "a", "UP"), added("DEMO", "b", "UP"), added("DEMO", "c", "UP")];
    *fake.full.lock().unwrap() = applications("UP_3_", &[("DEMO", &three)]);
    let (endpoint, server) = serve(fake.clone()).await;
    let mut eureka = Eureka::new(endpoint, &SourceSpec { max_instances: 2, ..spec() });
    let listing = read_now(&mut eureka).await;
    assert_eq!((listing.services["demo"].len(), listing.over_limit), (2, 1));
    let kept: Vec<String> = listing.services["demo"].iter().map(|r| r.id.clone()).collect();

    let gone = added("DEMO", &kept[0], "UP").replace("ADDED", "DELETED");
    *fake.delta.lock().unwrap() = applications("UP_2_", &[("DEMO", &[gone])]);
    let remaining: Vec<String> =
        ["a", "b", "c"].iter().filter(|id| **id != kept[0]).map(|id| added("DEMO", id, "UP")).collect();
    *fake.full.lock().unwrap() = applications("UP_2_", &[("DEMO", &remaining)]);
    let listing = read_now(&mut eureka).await;
    assert_eq!((listing.services["demo"].len(), listing.over_limit), (2, 0));
    assert_eq!(fake.full_fetches.load(Ordering::SeqCst), 2);
    server.abort();
}

/// Past the instances it can count (one per [`TRACKED_BYTES`] of `max_bytes`), the copy
/// cannot be checked: it counts no more, and every read is a full one.
#[tokio::test]
async fn past_the_instances_it_can_count_the_copy_grows_no_more_and_is_read_whole() {
    let fake = Fake::default();
    *fake.full.lock().unwrap() = applications("UP_1_", &[("DEMO", &[added("DEMO", "a", "UP")])]);
    let (endpoint, server) = serve(fake.clone()).await;
    let spec = SourceSpec { max_bytes: 64 * 1024, ..covering(&["demo"]) };
    let limit = spec.max_bytes / TRACKED_BYTES;
    let light = |name: &str| format!(r#"{{"instanceId":"{name}","status":"UP","actionType":"ADDED"}}"#);
    let mut eureka = Eureka::new(endpoint.clone(), &spec);
    read_now(&mut eureka).await;
    let mut total = 1;
    for round in 0..4 {
        let others: Vec<String> = (0..300).map(|i| light(&format!("o{round}-{i}"))).collect();
        total += others.len();
        *fake.delta.lock().unwrap() = applications(&format!("UP_{total}_"), &[("OTHER", &others)]);
        read_now(&mut eureka).await;
        assert!(held(&eureka).1 <= limit);
    }
    assert_eq!(fake.full_fetches.load(Ordering::SeqCst), 2, "the delta past the bound made the copy disagree");

    // A full listing past the bound: the copy cannot be checked, so no delta is asked for.
    let others: Vec<String> = (0..limit + 10).map(|i| light(&format!("o{i}"))).collect();
    *fake.full.lock().unwrap() = applications("UP_1125_", &[("OTHER", &others)]);
    let mut eureka = Eureka::new(endpoint, &spec);
    for reads in 1..=3 {
        read_now(&mut eureka).await;
        let copy = eureka.copy.as_ref().unwrap();
        assert!(copy.unchecked.is_some() && copy.tracked.len() == limit);
        assert_eq!(fake.full_fetches.load(Ordering::SeqCst), 2 + reads);
    }
    assert_eq!(fake.delta_fetches.load(Ordering::SeqCst), 4);
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
    assert!(eureka.copy.is_none(), "a delta that failed half-way leaves no copy");
    eureka.reset();
    eureka.next().await.unwrap();
    assert_eq!(fake.full_fetches.load(Ordering::SeqCst), 3);

    let mut lost = Eureka::new(Endpoint { path: "/nowhere".into(), ..endpoint }, &spec());
    let err = lost.next().await.unwrap_err();
    assert!(err.to_string().contains("404"), "{err}");
    server.abort();
}

/// The log lines of `tracing` events, caught for the current thread.
#[derive(Clone, Default)]
struct Caught(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Caught {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Caught {
    fn count(&self, needle: &str) -> usize {
        String::from_utf8_lossy(&self.0.lock().unwrap()).matches(needle).count()
    }
}

/// A Eureka entry rota cannot use is logged when it appears, not at every read; again once it
/// changes.
#[tokio::test]
async fn a_refused_entry_is_logged_once_until_it_changes() {
    use crate::registry::{Registry, RegistryConfig};
    use crate::sources::follower::Mirror;

    let caught = Caught::default();
    let writer = caught.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let fake = Fake::default();
    let no_port = instance("b", "UP", 2, "{}").replace(r#""@enabled":"true""#, r#""@enabled":"false""#);
    *fake.full.lock().unwrap() = document("UP_2_", &[instance("a", "UP", 1, "{}"), no_port.clone()]);
    *fake.delta.lock().unwrap() = document("UP_2_", &[no_port]);
    let (endpoint, server) = serve(fake.clone()).await;
    let spec = spec();
    let registry = Registry::spawn(RegistryConfig::default());
    let mut mirror = Mirror::new(registry.open_source_lease(&spec.name, spec.max_instances), Arc::new(spec.clone()));
    let mut eureka = Eureka::new(endpoint, &spec);
    for _ in 0..3 {
        let report = mirror.apply(read_now(&mut eureka).await, Instant::now()).await.unwrap();
        assert_eq!((report.instances, report.refused), (1, 1));
    }
    assert_eq!(caught.count("no enabled port"), 1, "{}", String::from_utf8_lossy(&caught.0.lock().unwrap()));
    // Changed (now a weight rota cannot read): logged again.
    let bad_weight = instance("b", "UP", 2, r#"{"weight":"heavy"}"#).replace("ADDED", "MODIFIED");
    *fake.delta.lock().unwrap() = document("UP_2_", &[bad_weight]);
    mirror.apply(read_now(&mut eureka).await, Instant::now()).await.unwrap();
    mirror.apply(read_now(&mut eureka).await, Instant::now()).await.unwrap();
    assert_eq!(caught.count("metadata.weight"), 1);
    assert_eq!(caught.count("source entry refused"), 2);
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

    fn records(copy: &Copy) -> Vec<InstanceRecord> {
        copy.kept.values().map(|e| e.item.clone().unwrap().1).collect()
    }

    #[test]
    fn a_full_listing_reads_every_instance_with_its_metadata() {
        let (copy, hash) = copy_of(&spec(), TWO_UP);
        assert_eq!(copy.hash_code(), Some(hash));
        let records = records(&copy);
        assert_eq!(records.len(), 2);
        assert!(records.iter().all(|r| r.host == "127.0.0.1" && r.status == "UP" && r.port > 1024));
        let versions: Vec<&str> = records.iter().map(|r| r.version.as_str()).collect();
        assert!(versions.contains(&"zlt") && versions.contains(&""), "{versions:?}");
        assert!(read(EMPTY.as_bytes()).unwrap().0.is_empty());
    }

    #[test]
    fn recorded_deltas_leave_a_copy_that_matches_the_servers_hash_code() {
        let spec = spec();
        let (mut copy, _) = copy_of(&spec, TWO_UP);
        let hash = apply(&mut copy, &spec, DELTA_OUT_OF_SERVICE);
        assert_eq!(copy.hash_code(), Some(hash));
        let drained = records(&copy).into_iter().filter(|r| r.status == "DRAINING").count();
        assert_eq!(drained, 1, "OUT_OF_SERVICE is DRAINING");
        // The app stopped: its delta against the copy agrees with the full listing then.
        let (mut copy, _) = copy_of(&spec, TWO_UP);
        let hash = apply(&mut copy, &spec, DELTA_STOPPED);
        let (full, full_hash) = copy_of(&spec, APPS_STOPPED);
        assert_eq!(full.hash_code(), Some(full_hash));
        assert_eq!(copy.hash_code(), Some(hash));
        let ids = |copy: &Copy| -> Vec<String> { records(copy).into_iter().map(|r| r.id).collect() };
        assert_eq!(ids(&copy), ids(&full));
    }

    /// The server's deltas repeat a change for minutes (APP-A's addition comes again with B's
    /// status change): a copy that keeps only APP-B counts APP-A once all the same.
    #[test]
    fn recorded_deltas_match_the_hash_code_when_the_source_keeps_one_application() {
        let spec = covering(&["app-b"]);
        let (mut copy, _) = copy_of(&spec, TWO_UP);
        assert_eq!((copy.kept.len(), copy.tracked.len()), (1, 1));
        let hash = apply(&mut copy, &spec, DELTA_OUT_OF_SERVICE);
        assert_eq!(copy.hash_code(), Some(hash));
        let hash = apply(&mut copy, &spec, DELTA_STOPPED);
        assert_eq!(copy.hash_code(), Some(hash));
        assert_eq!((copy.kept.len(), copy.tracked.len()), (1, 0));
    }
}

/// Memory of following a hostile Eureka server, as the test process's resident set. Each of
/// these prints its figures; run one at a time (each in a process of its own, as RSS is the
/// process's), in release:
///
/// ```text
/// cargo test --release --lib sources::eureka::tests::memory::additions -- --ignored --nocapture --exact
/// cargo test --release --lib sources::eureka::tests::memory::large_listing -- --ignored --nocapture --exact
/// cargo test --release --lib sources::eureka::tests::memory::kept_as_counted -- --ignored --nocapture --exact
/// ```
mod memory {
    use bytes::Bytes;

    use super::*;

    /// `VmRSS` and `VmHWM` (the peak) of this process, in MiB.
    fn rss() -> (u64, u64) {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let field = |name: &str| -> u64 {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                .map_or(0, |kb| kb / 1024)
        };
        (field("VmRSS:"), field("VmHWM:"))
    }

    /// Hands the memory freed so far back to the system, and starts counting the peak
    /// (`VmHWM`) anew from the resident set then.
    fn reset_peak() {
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim only releases free memory of glibc's heap; it takes no pointer.
        unsafe {
            libc::malloc_trim(0);
        }
        let _ = std::fs::write("/proc/self/clear_refs", "5");
    }

    /// An instance as a Spring Boot app registers it (about 900 bytes).
    fn realistic(app: &str, i: usize) -> String {
        let lower = app.to_ascii_lowercase();
        let port = 10_000 + i % 50_000;
        format!(
            r#"{{"instanceId":"10.{a}.{b}.{c}:{lower}:{port}","hostName":"10.{a}.{b}.{c}","app":"{app}","ipAddr":"10.{a}.{b}.{c}","status":"UP","overriddenStatus":"UNKNOWN","port":{{"$":{port},"@enabled":"true"}},"securePort":{{"$":443,"@enabled":"false"}},"countryId":1,"dataCenterInfo":{{"@class":"com.netflix.appinfo.InstanceInfo$DefaultDataCenterInfo","name":"MyOwn"}},"leaseInfo":{{"renewalIntervalInSecs":30,"durationInSecs":90,"registrationTimestamp":1796312780089,"lastRenewalTimestamp":1796312780089,"evictionTimestamp":0,"serviceUpTimestamp":1796312780088}},"metadata":{{"management.port":"{port}","version":"v{v}"}},"homePageUrl":"http://10.{a}.{b}.{c}:{port}/","statusPageUrl":"http://10.{a}.{b}.{c}:{port}/actuator/info","healthCheckUrl":"http://10.{a}.{b}.{c}:{port}/actuator/health","vipAddress":"{lower}","secureVipAddress":"{lower}","isCoordinatingDiscoveryServer":"false","lastUpdatedTimestamp":"1796312780089","lastDirtyTimestamp":"1796312780041","actionType":"ADDED"}}"#,
            a = i / 65536 % 256,
            b = i / 256 % 256,
            c = i % 256,
            v = i % 3,
        )
    }

    /// Serves `full` and the deltas `delta(n)` makes for the n-th delta asked for.
    async fn serve(
        full: Bytes,
        delta: impl Fn(usize) -> Bytes + Send + Sync + 'static,
    ) -> (Endpoint, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let asked = Arc::new(AtomicUsize::new(0));
        let delta = Arc::new(delta);
        let app = Router::new().route("/eureka/apps/", get(move || async move { full.clone() })).route(
            "/eureka/apps/delta",
            get(move || {
                let n = asked.fetch_add(1, Ordering::SeqCst);
                let delta = delta.clone();
                async move { tokio::task::spawn_blocking(move || delta(n)).await.unwrap() }
            }),
        );
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        (Endpoint { host: "127.0.0.1".into(), port, path: "/eureka".into() }, task)
    }

    /// The issue's stream: 20,000 additions per delta to an application the source does not
    /// cover, the server's hash code counting them all; the source lists 3 instances.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "a measurement: run it alone, in release"]
    async fn additions() {
        const PER_DELTA: usize = 20_000;
        const DELTAS: usize = 200;
        let three: Vec<String> = (0..3).map(|i| realistic("DEMO", i)).collect();
        let full = Bytes::from(applications("UP_3_", &[("DEMO", &three)]));
        let (endpoint, server) = serve(full, |n| {
            let added: Vec<String> = (0..PER_DELTA).map(|i| realistic("OTHER", n * PER_DELTA + i)).collect();
            Bytes::from(applications(&format!("UP_{}_", 3 + (n + 1) * PER_DELTA), &[("OTHER", &added)]))
        })
        .await;
        let mut eureka = Eureka::new(endpoint, &covering(&["demo"]));
        reset_peak();
        let before = rss();
        let mut listed = 0;
        for n in 0..=DELTAS {
            eureka.due = None;
            listed = eureka.next().await.unwrap().services.values().map(Vec::len).sum::<usize>();
            if n % 50 == 0 {
                println!("after {n} deltas: VmRSS {} MiB", rss().0);
            }
        }
        let after = rss();
        println!(
            "{DELTAS} deltas of {PER_DELTA} additions: VmRSS {} MiB before, {} MiB after (peak {} MiB); {listed} instances listed",
            before.0, after.0, after.1
        );
        assert_eq!(listed, 3);
        server.abort();
    }

    /// What a copy's kept instances take, against what they are counted as.
    #[test]
    #[ignore = "a measurement: run it alone, in release"]
    fn kept_as_counted() {
        let instances: Vec<String> = (0..10_000).map(|i| realistic("DEMO", i)).collect();
        let body = applications("", &[("DEMO", &instances)]);
        drop(instances);
        reset_peak();
        let before = rss().0;
        let (copy, _) = copy_of(&spec(), &body);
        reset_peak();
        let after = rss().0;
        println!(
            "10,000 kept instances of two metadata entries: VmRSS {before} MiB before, {after} MiB after; counted as {} MiB",
            copy.kept_bytes >> 20,
        );
        assert_eq!(copy.kept.len(), 10_000);
        drop((copy, body));
        // And with as many metadata entries as an instance may carry, each short.
        let metadata: Vec<String> = (0..MAX_METADATA_ENTRIES).map(|i| format!(r#""key{i}":"value{i}""#)).collect();
        let metadata = format!("{{{}}}", metadata.join(","));
        let instances: Vec<String> = (0..5_000)
            .map(|i| instance(&format!("10.0.{}.{}:demo", i / 256, i % 256), "UP", 8080, &metadata))
            .collect();
        let body = applications("", &[("DEMO", &instances)]);
        drop(instances);
        reset_peak();
        let before = rss().0;
        let (copy, _) = copy_of(&SourceSpec { max_bytes: 1 << 30, ..spec() }, &body);
        reset_peak();
        let after = rss().0;
        println!(
            "5,000 kept instances of 64 metadata entries: VmRSS {before} MiB before, {after} MiB after; counted as {} MiB",
            copy.kept_bytes >> 20,
        );
        assert_eq!(copy.kept.len(), 5_000);
    }

    /// The issue's large listing: about 29 MB, 32,000 instances of one application, read whole
    /// ten times.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "a measurement: run it alone, in release"]
    async fn large_listing() {
        let instances: Vec<String> = (0..32_000).map(|i| realistic("DEMO", i)).collect();
        let full = Bytes::from(applications("UP_32000_", &[("DEMO", &instances)]));
        drop(instances);
        let size = full.len();
        let (endpoint, server) = serve(full, |_| Bytes::new()).await;
        let mut eureka = Eureka::new(endpoint, &spec());
        reset_peak();
        let before = rss();
        let mut listed = 0;
        for n in 1..=10 {
            eureka.reset();
            eureka.due = None;
            listed = eureka.next().await.unwrap().services.values().map(Vec::len).sum::<usize>();
            if n == 1 || n == 10 {
                println!("after {n} full reads: VmRSS {} MiB", rss().0);
            }
        }
        let after = rss();
        println!(
            "a listing of {size} bytes read whole 10 times: VmRSS {} MiB before (the answer served from memory), {} MiB after (peak {} MiB); {listed} instances listed",
            before.0, after.0, after.1
        );
        server.abort();
    }
}
