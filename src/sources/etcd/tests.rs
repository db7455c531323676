use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::routing::post;

use super::*;
use crate::sources::spec::SourceTable;

/// The values `etcd-endpoints add` wrote (tests/sources/etcd/README.md), base64 as etcd sends them.
const A: &str = "eyJPcCI6MCwiQWRkciI6IjEyNy4wLjAuMTo5MDAxIiwiTWV0YWRhdGEiOm51bGx9";
const B: &str = "eyJPcCI6MCwiQWRkciI6IjEyNy4wLjAuMTo5MDAyIiwiTWV0YWRhdGEiOnsid2VpZ2h0IjozLCJ6b25lIjoiejEifX0=";
const C: &str = "eyJPcCI6MCwiQWRkciI6Ils6OjFdOjkwMDMiLCJNZXRhZGF0YSI6bnVsbH0=";

fn record(entry: &Entry) -> &(String, InstanceRecord) {
    entry.as_ref().unwrap()
}

#[test]
fn base64_and_prefix_ranges_are_etcds() {
    assert_eq!(base64_encode(b"svc/"), "c3ZjLw==");
    assert_eq!(base64_encode(b"svc0"), "c3ZjMA==");
    assert_eq!(base64_decode(A).unwrap(), br#"{"Op":0,"Addr":"127.0.0.1:9001","Metadata":null}"#);
    for text in ["", "a", "ab", "abc", "abcd", "\u{ff}\u{0}"] {
        assert_eq!(base64_decode(&base64_encode(text.as_bytes())).unwrap(), text.as_bytes());
    }
    assert_eq!(base64_decode("c3ZjLw").unwrap(), b"svc/", "padding may be left out");
    assert!(base64_decode("c3Zj*w==").is_none() && base64_decode("c").is_none() && base64_decode("c3Zj===").is_none());
    assert_eq!(prefix_range(b"svc/"), (b"svc/".to_vec(), b"svc0".to_vec()));
    assert_eq!(prefix_range(b"a\xff"), (b"a\xff".to_vec(), b"b".to_vec()));
    assert_eq!(prefix_range(b""), (vec![0], vec![0]));
    assert_eq!(prefix_range(b"\xff"), (b"\xff".to_vec(), vec![0]));
}

#[test]
fn a_range_answer_maps_each_key_as_documented() {
    // The gateway's answer to the README's session: int64s as strings, keys and values base64.
    let body = format!(
        r#"{{"header":{{"cluster_id":"15898949648367404391","member_id":"8277971459526566948","revision":"5","raft_term":"2"}},
        "kvs":[{{"key":"c3ZjL2VjaG8vYQ==","create_revision":"2","mod_revision":"2","version":"1","value":"{A}","lease":"2604384865550111496"}},
        {{"key":"c3ZjL2VjaG8vYg==","create_revision":"3","mod_revision":"3","version":"1","value":"{B}","lease":"2604384865550111499"}},
        {{"key":"c3ZjL2VjaG8vYw==","create_revision":"4","mod_revision":"4","version":"1","value":"{C}"}}],"count":"3"}}"#
    );
    let (keys, revision, left_out) = parse_range(body.as_bytes(), "svc/", 100).unwrap();
    assert_eq!((revision, left_out, keys.len()), (5, 0, 3));
    let (service, a) = record(&keys[b"svc/echo/a".as_slice()]);
    assert_eq!((service.as_str(), a.id.as_str(), a.host.as_str(), a.port), ("echo", "a", "127.0.0.1", 9001));
    assert_eq!((a.weight, a.status.as_str()), (DEFAULT_WEIGHT, "UP"));
    assert_eq!(a.metadata, [("etcd.lease".to_owned(), "2604384865550111496".to_owned())].into());
    let (_, b) = record(&keys[b"svc/echo/b".as_slice()]);
    assert_eq!((b.weight, b.zone.as_str()), (3, "z1"));
    let (_, c) = record(&keys[b"svc/echo/c".as_slice()]);
    assert_eq!((c.host.as_str(), c.port), ("::1", 9003));
    assert!(c.metadata.is_empty(), "no lease, no etcd.lease");

    // Nothing under the prefix: no kvs at all.
    let empty = br#"{"header":{"cluster_id":"1","member_id":"2","revision":"8","raft_term":"2"}}"#;
    assert_eq!(parse_range(empty, "svc/", 100).unwrap().1, 8);
    // Past max_instances: the rest is counted.
    let (keys, _, left_out) =
        parse_range(body.replace(r#""count":"3""#, r#""count":"7""#).as_bytes(), "svc/", 2).unwrap();
    assert_eq!((keys.len(), left_out), (2, 5));
    assert!(parse_range(br#"{"error":"x","code":3,"message":"etcdserver: bad"}"#, "", 1).unwrap_err().contains("bad"));
}

#[test]
fn metadata_fills_version_zone_and_weight_and_go_zero_values_are_plain_addresses() {
    let value = br#"{"Op":0,"Addr":"10.0.0.1:80","Metadata":{"version":"v2","zone":"z1","weight":"7","team":"pay","n":1,"tags":["a"]}}"#;
    let (service, record) = entry(b"svc/orders/a/b", value, Some(9), "svc/").unwrap();
    assert_eq!((service.as_str(), record.id.as_str()), ("orders", "a/b"));
    assert_eq!((record.version.as_str(), record.zone.as_str(), record.weight), ("v2", "z1", 7));
    let metadata: Vec<(&str, &str)> = record.metadata.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(metadata, [("etcd.lease", "9"), ("n", "1"), ("tags", "[\"a\"]"), ("team", "pay")]);
    let numeric = entry(b"svc/o/a", br#"{"Addr":"h:1","Metadata":{"weight":3,"version":2}}"#, None, "svc/").unwrap().1;
    assert_eq!((numeric.weight, numeric.version.as_str()), (3, "2"));

    // go-zero: PREFIX/LEASEID = address, the lease in decimal.
    let (service, record) =
        entry(b"echo.rpc/2604384865550111503", b"127.0.0.1:9101", Some(2604384865550111503), "").unwrap();
    assert_eq!((service.as_str(), record.id.as_str(), record.port), ("echo.rpc", "2604384865550111503", 9101));
    assert_eq!(record.metadata["etcd.lease"], "2604384865550111503");
}

#[test]
fn a_value_that_is_neither_layout_is_malformed_alone() {
    let cases: [(&[u8], &[u8], &str); 8] = [
        (b"svc/o/a", b"hello", "not HOST:PORT"),
        (b"svc/o/a", b"{\"Addr\":", "not JSON"),
        (b"svc/o/a", br#"{"Op":1,"Addr":"h:1"}"#, "Op is 1"),
        (b"svc/o/a", br#"{"Metadata":null}"#, "no Addr"),
        (b"svc/o/a", br#"{"Addr":"h:1","Metadata":{"weight":"heavy"}}"#, "Metadata.weight"),
        (b"svc/o/a", b"::1:80", "not HOST:PORT"),
        (b"svc/o", b"h:1", "SERVICE/ID"),
        (b"svc/o/a", b"h:99999", "not HOST:PORT"),
    ];
    for (key, value, problem) in cases {
        let error = entry(key, value, None, "svc/").unwrap_err();
        assert!(error.contains(problem), "{error} should say {problem}");
    }
    assert!(entry(b"svc/o/\xff", b"h:1", None, "svc/").unwrap_err().contains("UTF-8"));
}

#[test]
fn watch_answers_read_as_the_gateway_writes_them() {
    let created =
        br#"{"result":{"header":{"cluster_id":"1","member_id":"2","revision":"9","raft_term":"2"},"created":true}}"#;
    assert_eq!(parse_watch(created, "svc/").unwrap(), WatchAnswer::Created);
    let put = format!(
        r#"{{"result":{{"header":{{"revision":"10"}},"events":[{{"kv":{{"key":"c3ZjL2VjaG8vYQ==","create_revision":"10","mod_revision":"10","version":"1","value":"{A}","lease":"2604384865550111518"}}}}]}}}}"#
    );
    let WatchAnswer::Events { revision, events } = parse_watch(put.as_bytes(), "svc/").unwrap() else { panic!() };
    assert_eq!(revision, 10);
    let Event::Put(key, entry) = &events[0] else { panic!("{events:?}") };
    let Ok((service, record)) = &**entry else { panic!("{entry:?}") };
    assert_eq!((key.as_slice(), service.as_str(), record.port), (b"svc/echo/a".as_slice(), "echo", 9001));
    let delete = br#"{"result":{"header":{"revision":"13"},"events":[{"type":"DELETE","kv":{"key":"c3ZjL2VjaG8vYQ==","mod_revision":"13"},"prev_kv":{}}]}}"#;
    assert_eq!(
        parse_watch(delete, "svc/").unwrap(),
        WatchAnswer::Events { revision: 13, events: vec![Event::Delete(b"svc/echo/a".to_vec())] }
    );
    let progress = br#"{"result":{"header":{"revision":"20"}}}"#;
    assert_eq!(parse_watch(progress, "svc/").unwrap(), WatchAnswer::Events { revision: 20, events: vec![] });
    let compacted = br#"{"result":{"header":{"cluster_id":"1","member_id":"2","raft_term":"2"},"canceled":true,"compact_revision":"16"}}"#;
    let WatchAnswer::Ended(why) = parse_watch(compacted, "svc/").unwrap() else { panic!() };
    assert!(why.contains("compacted to revision 16"), "{why}");
    let error = br#"{"error":{"grpc_code":14,"http_code":503,"message":"etcdserver: no leader","http_status":"Service Unavailable"}}"#;
    let WatchAnswer::Ended(why) = parse_watch(error, "svc/").unwrap() else { panic!() };
    assert!(why.contains("no leader"), "{why}");
    assert!(parse_watch(b"<html>", "svc/").is_err());
}

/// An etcd gateway's answers, set by the test; counts its ranges.
#[derive(Clone, Default)]
struct Fake {
    range: Arc<std::sync::Mutex<String>>,
    watch: Arc<std::sync::Mutex<String>>,
    ranges: Arc<AtomicUsize>,
    /// The watch's answer stays open after its lines, silent, as etcd's does while nothing
    /// changes (otherwise it ends, which fails the read).
    silent_after: Arc<std::sync::atomic::AtomicBool>,
}

async fn serve(fake: Fake) -> (Endpoint, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let range = fake.clone();
    let app = Router::new()
        .route(
            "/v3/kv/range",
            post(move |body: String| async move {
                if !body.contains("count_only") {
                    range.ranges.fetch_add(1, Ordering::SeqCst);
                }
                range.range.lock().unwrap().clone()
            }),
        )
        .route(
            "/v3/watch",
            post(move || async move {
                let lines = fake.watch.lock().unwrap().clone();
                if !fake.silent_after.load(Ordering::SeqCst) {
                    return axum::body::Body::from(lines);
                }
                use futures_util::StreamExt;
                let first = futures_util::stream::iter([Ok::<_, std::io::Error>(lines)]);
                axum::body::Body::from_stream(first.chain(futures_util::stream::pending()))
            }),
        );
    let task = tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    (Endpoint { host: "127.0.0.1".into(), port, path: String::new() }, task)
}

fn spec() -> SourceSpec {
    SourceTable { url: "etcd://127.0.0.1:1/svc".into(), interval: Some("100ms".into()), ..Default::default() }
        .check()
        .unwrap()
}

const CREATED: &str = r#"{"result":{"header":{"revision":"5"},"created":true}}"#;

fn range_of(revision: u32, keys: &[(&str, &str)]) -> String {
    let kvs: Vec<String> = keys
        .iter()
        .map(|(key, addr)| {
            format!(r#"{{"key":"{}","value":"{}"}}"#, base64_encode(key.as_bytes()), base64_encode(addr.as_bytes()))
        })
        .collect();
    format!(r#"{{"header":{{"revision":"{revision}"}},"kvs":[{}],"count":"{}"}}"#, kvs.join(","), keys.len())
}

fn put(revision: u32, key: &str, addr: &str) -> String {
    format!(
        r#"{{"result":{{"header":{{"revision":"{revision}"}},"events":[{{"kv":{{"key":"{}","value":"{}"}}}}]}}}}"#,
        base64_encode(key.as_bytes()),
        base64_encode(addr.as_bytes())
    )
}

fn ports(listing: &Listing) -> Vec<u16> {
    let mut ports: Vec<u16> = listing.services.values().flatten().map(|r| r.port).collect();
    ports.sort();
    ports
}

#[tokio::test]
async fn a_burst_of_watched_puts_is_one_listing_and_the_watch_ending_fails_the_read() {
    let fake = Fake::default();
    *fake.range.lock().unwrap() = range_of(5, &[("svc/echo/a", "127.0.0.1:1")]);
    let mut lines = vec![CREATED.to_owned()];
    lines.extend((0..100).map(|i| put(6 + i, &format!("svc/echo/n{i}"), &format!("127.0.0.1:{}", 100 + i))));
    lines.push(
        r#"{"result":{"header":{"revision":"106"},"events":[{"type":"DELETE","kv":{"key":"c3ZjL2VjaG8vbjA="}}]}}"#
            .into(),
    );
    *fake.watch.lock().unwrap() = lines.join("\n") + "\n";
    let (endpoint, server) = serve(fake.clone()).await;
    let mut etcd = Etcd::new(endpoint, "svc", &spec());
    assert_eq!(ports(&etcd.next().await.unwrap()), [1]);
    // The burst arrives at once, and is taken in as few listings as it arrived in.
    let mut reads = 0;
    let listing = loop {
        reads += 1;
        let listing = etcd.next().await.unwrap();
        if listing.services["echo"].len() == 100 {
            break listing;
        }
        assert!(reads < 10, "read one by one: {reads} listings");
    };
    assert!(!ports(&listing).contains(&100), "n0 was deleted");
    assert_eq!(etcd.state.as_ref().unwrap().revision, 106);
    // The gateway ended the answer: the read fails, and the next is a range again.
    let error = etcd.next().await.unwrap_err();
    assert!(error.to_string().contains("ended the watch"), "{error}");
    etcd.reset();
    *fake.watch.lock().unwrap() = format!("{CREATED}\n");
    assert_eq!(ports(&etcd.next().await.unwrap()), [1]);
    assert_eq!(fake.ranges.load(Ordering::SeqCst), 2);
    server.abort();
}

/// A registrant's lease ran out: etcd deleted its key, the only one of its service, and then
/// says nothing more. The removal is held back (it empties the service), and applied once
/// `protect_for` has passed, although the watch stays silent.
#[tokio::test]
async fn a_held_back_delete_is_applied_at_protect_for_while_the_watch_stays_silent() {
    let fake = Fake::default();
    fake.silent_after.store(true, Ordering::SeqCst);
    *fake.range.lock().unwrap() = range_of(5, &[("svc/echo/a", "127.0.0.1:1")]);
    let delete_a = format!(
        r#"{{"result":{{"header":{{"revision":"6"}},"events":[{{"type":"DELETE","kv":{{"key":"{}"}}}}]}}}}"#,
        base64_encode(b"svc/echo/a")
    );
    *fake.watch.lock().unwrap() = format!("{CREATED}\n{delete_a}\n");
    let (endpoint, server) = serve(fake.clone()).await;
    let spec = Arc::new(
        SourceTable {
            url: format!("etcd://127.0.0.1:{}/svc", endpoint.port),
            // No count while the test runs: the watch is all the source hears.
            interval: Some("1h".into()),
            protect_for: Some("300ms".into()),
            ..Default::default()
        }
        .check()
        .unwrap(),
    );
    let registry = crate::registry::Registry::spawn(crate::registry::RegistryConfig::default());
    let status = Arc::new(crate::sources::SourceStatus::new(&spec));
    let lease = registry.open_source_lease(&spec.name, spec.max_instances);
    let follow = Etcd::new(endpoint, "svc", &spec);
    let task = tokio::spawn(crate::sources::follower::run(spec.clone(), follow, lease, status.clone()));
    let mut changes = registry.subscribe("echo").await.unwrap();
    let bounded = Duration::from_secs(10);
    tokio::time::timeout(bounded, changes.wait_for(|s| s.instances.len() == 1)).await.unwrap().unwrap();
    let listed = Instant::now();
    // The delete arrives right after the range: held back, then applied with no further read.
    let gone =
        tokio::time::timeout(bounded, changes.wait_for(|s| s.instances.is_empty())).await.is_ok_and(|r| r.is_ok());
    assert!(gone, "the held-back delete was never applied: {:?}", status.view());
    assert!(listed.elapsed() >= spec.protect_for, "applied after {:?}", listed.elapsed());
    let view = status.view();
    assert_eq!((view.reads, view.failures, view.instances), (2, 0, 0), "{view:?}");
    assert!(view.held_back.is_empty(), "{view:?}");
    server.abort();
    task.abort();
}

#[tokio::test]
async fn a_compaction_past_the_watch_fails_the_read_and_reset_reads_the_range_again() {
    let fake = Fake::default();
    *fake.range.lock().unwrap() = range_of(5, &[("svc/echo/a", "127.0.0.1:1"), ("svc/echo/b", "nonsense")]);
    *fake.watch.lock().unwrap() = format!(
        "{CREATED}\n{}\n",
        r#"{"result":{"header":{"cluster_id":"1","member_id":"2","raft_term":"2"},"canceled":true,"compact_revision":"16"}}"#
    );
    let (endpoint, server) = serve(fake.clone()).await;
    let mut etcd = Etcd::new(endpoint, "svc/", &spec());
    let first = etcd.next().await.unwrap();
    assert_eq!((ports(&first), first.malformed.len()), (vec![1], 1), "the bad value is refused alone");
    let error = etcd.next().await.unwrap_err();
    assert!(error.to_string().contains("compacted to revision 16"), "{error}");
    etcd.reset();
    *fake.range.lock().unwrap() = range_of(17, &[("svc/echo/c", "127.0.0.1:3")]);
    assert_eq!(ports(&etcd.next().await.unwrap()), [3]);
    assert_eq!(fake.ranges.load(Ordering::SeqCst), 2);
    server.abort();
}

#[tokio::test]
async fn a_watch_line_over_max_bytes_or_a_dead_server_fails_the_read() {
    let fake = Fake::default();
    *fake.range.lock().unwrap() = range_of(5, &[]);
    let long = put(6, &format!("svc/echo/{}", "x".repeat(3000)), "127.0.0.1:1");
    *fake.watch.lock().unwrap() = format!("{CREATED}\n{long}\n");
    let (endpoint, server) = serve(fake.clone()).await;
    let spec = SourceTable {
        url: "etcd://127.0.0.1:1/svc".into(),
        interval: Some("100ms".into()),
        timeout: Some("500ms".into()),
        max_bytes: Some(1024),
        ..Default::default()
    }
    .check()
    .unwrap();
    let mut etcd = Etcd::new(endpoint.clone(), "svc", &spec);
    assert!(etcd.next().await.unwrap().services.is_empty());
    let error = etcd.next().await.unwrap_err();
    assert!(error.to_string().contains("longer than 1024 bytes"), "{error}");
    etcd.reset();
    server.abort();
    let _ = server.await;
    let error = etcd.next().await.unwrap_err();
    assert!(error.to_string().contains("cannot connect"), "{error}");
}

#[tokio::test]
async fn keys_past_max_instances_are_left_out_and_read_once_there_is_room() {
    let fake = Fake::default();
    let three = [("svc/echo/a", "127.0.0.1:1"), ("svc/echo/b", "127.0.0.1:2"), ("svc/echo/c", "127.0.0.1:3")];
    *fake.range.lock().unwrap() = range_of(5, &three);
    let delete_a = format!(
        r#"{{"result":{{"header":{{"revision":"7"}},"events":[{{"type":"DELETE","kv":{{"key":"{}"}}}}]}}}}"#,
        base64_encode(b"svc/echo/a")
    );
    *fake.watch.lock().unwrap() = format!("{CREATED}\n{}\n{delete_a}\n", put(6, "svc/echo/d", "127.0.0.1:4"));
    let (endpoint, server) = serve(fake.clone()).await;
    let spec = SourceTable {
        url: "etcd://127.0.0.1:1/svc".into(),
        interval: Some("100ms".into()),
        max_instances: Some(2),
        ..Default::default()
    }
    .check()
    .unwrap();
    let mut etcd = Etcd::new(endpoint, "svc", &spec);
    let first = etcd.next().await.unwrap();
    assert_eq!(ports(&first), [1, 2]);
    assert_eq!(first.malformed, ["1 keys under \"svc/\" left out: the source's max_instances is 2"]);
    // d is put while full; a deleted makes room: the prefix is read again, whole.
    *fake.range.lock().unwrap() = range_of(7, &three[1..]);
    *fake.watch.lock().unwrap() = format!("{CREATED}\n");
    let mut listing = etcd.next().await.unwrap();
    if fake.ranges.load(Ordering::SeqCst) == 1 {
        // d's put and a's delete arrived in two batches.
        listing = etcd.next().await.unwrap();
    }
    assert_eq!((ports(&listing), listing.malformed.len()), (vec![2, 3], 0));
    assert_eq!(fake.ranges.load(Ordering::SeqCst), 2);
    server.abort();
}

proptest::proptest! {
    #[test]
    fn any_bytes_parse_or_fail_without_panicking(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..400)) {
        let _ = parse_watch(&bytes, "svc/");
        let _ = parse_range(&bytes, "svc/", 10);
        let _ = entry(&bytes, &bytes, Some(1), "");
        let _ = entry(b"svc/a/b", &bytes, None, "svc/");
        let _ = base64_decode(&String::from_utf8_lossy(&bytes));
        let _ = host_port(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn any_json_shaped_answer_parses_or_fails_without_panicking(
        revision in proptest::prop_oneof![proptest::strategy::Just("\"5\"".to_owned()), "[-0-9a-z\"]{0,24}"],
        key in "[A-Za-z0-9+/=]{0,12}",
        value in "[A-Za-z0-9+/=]{0,40}",
        kind in proptest::prop_oneof![proptest::strategy::Just("\"DELETE\""), proptest::strategy::Just("\"PUT\""), proptest::strategy::Just("7"), proptest::strategy::Just("null")],
    ) {
        let line = format!(r#"{{"result":{{"header":{{"revision":{revision}}},"events":[{{"type":{kind},"kv":{{"key":"{key}","value":"{value}","lease":{revision}}}}}]}}}}"#);
        let _ = parse_watch(line.as_bytes(), "");
        let range = format!(r#"{{"header":{{"revision":{revision}}},"kvs":[{{"key":"{key}","value":"{value}"}}],"count":{revision}}}"#);
        let _ = parse_range(range.as_bytes(), "", 10);
    }
}
