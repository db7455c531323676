//! The wire Pick against prost: requests read as prost reads them, answers written as prost
//! writes them.

use std::collections::{BTreeMap, HashMap};

use proptest::prelude::*;

use super::*;
use crate::balancer::Balancer;
use crate::registry::{Health, InstanceSpec, InstanceUpdate, OverrideChange, Registry, RegistryConfig};

fn fields(view: &PickRequestView) -> (String, String, String, String, String, Vec<String>) {
    let q = view.query();
    (q.service.into(), q.rule.into(), q.version.into(), q.key.into(), q.zone.into(), q.exclude.to_vec())
}

fn prost_fields(r: &pb::PickRequest) -> (String, String, String, String, String, Vec<String>) {
    (r.service.clone(), r.rule.clone(), r.version.clone(), r.key.clone(), r.zone.clone(), r.exclude.clone())
}

/// Decodes `bytes` both ways: the same verdict, the same fields, the same error text.
fn agree(bytes: &[u8]) {
    let ours = PickRequestView::decode(Bytes::copy_from_slice(bytes));
    let theirs = pb::PickRequest::decode(bytes);
    match (&ours, &theirs) {
        (Ok(view), Ok(request)) => assert_eq!(fields(view), prost_fields(request), "{bytes:?}"),
        (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
        _ => panic!("{bytes:?}: ours {ours:?}, prost's {theirs:?}"),
    }
    // Ours refuses by itself what prost refuses: prost is asked only for the words.
    assert_eq!(PickRequestView::read(&Bytes::copy_from_slice(bytes)).is_some(), theirs.is_ok(), "{bytes:?}");
}

fn request() -> impl Strategy<Value = pb::PickRequest> {
    let text = || "(\\PC|[\u{80}-\u{10ffff}]){0,12}";
    (text(), text(), text(), text(), text(), proptest::collection::vec(text(), 0..3)).prop_map(
        |(service, rule, version, key, zone, exclude)| pb::PickRequest { service, rule, version, key, zone, exclude },
    )
}

proptest! {
    #[test]
    fn requests_read_as_prost_reads_them(request in request()) {
        agree(&request.encode_to_vec());
    }

    /// Two messages end to end (the later scalar wins, lists add up), a field of another
    /// number, a truncation, a byte changed: prost's verdict every time.
    #[test]
    fn any_bytes_read_as_prost_reads_them(
        a in request(),
        b in request(),
        cut in any::<prop::sample::Index>(),
        flip in any::<(prop::sample::Index, u8)>(),
        noise in proptest::collection::vec(any::<u8>(), 0..24),
    ) {
        let mut both = a.encode_to_vec();
        both.extend(b.encode_to_vec());
        agree(&both);
        agree(&both[..cut.index(both.len() + 1)]);
        let mut flipped = both.clone();
        if !flipped.is_empty() {
            let at = flip.0.index(flipped.len());
            flipped[at] ^= flip.1;
        }
        agree(&flipped);
        agree(&noise);
        let mut unknown = a.encode_to_vec();
        unknown.extend([0x3a, 0x02, b'h', b'i', 0x40, 0x07, 0x4d, 1, 2, 3, 4]);
        agree(&unknown);
    }
}

#[test]
fn refusals_carry_prosts_words() {
    // service = "\xff": not UTF-8.
    static BAD: [u8; 3] = [0x0a, 0x01, 0xff];
    let bad = BAD;
    let ours = PickRequestView::decode(Bytes::from_static(&BAD)).unwrap_err().to_string();
    assert_eq!(ours, pb::PickRequest::decode(&bad[..]).unwrap_err().to_string());
    assert!(ours.contains("PickRequest.service"), "{ours}");
    // A field of the request's numbers with another wire type.
    agree(&[0x10, 0x01]);
    agree(&[0x0a, 0x05, b'a']);
    agree(&[0x0b, 0x0c]);
}

fn spec(id: &str, version: &str, metadata: &[(&str, &str)]) -> InstanceSpec {
    InstanceSpec {
        id: id.into(),
        service: "svc".into(),
        host: "10.0.0.1".into(),
        port: 80,
        version: version.into(),
        zone: if id.ends_with('1') { "z1".into() } else { String::new() },
        weight: Some(if id.ends_with('2') { 0 } else { 7 }),
        metadata: metadata.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect::<BTreeMap<_, _>>(),
        ..Default::default()
    }
}

/// What prost makes of the old answer and of the new one must be the same message; with at most
/// one metadata entry (prost writes a map in its hash order) the same bytes too.
fn same_answer(picked: &Picked) {
    let old = convert::picked(picked.clone());
    let new = PickAnswer::new(picked.clone());
    let mut bytes = Vec::new();
    new.encode(&mut bytes);
    assert_eq!(bytes.len(), new.encoded_len());
    assert_eq!(pb::PickResponse::decode(&bytes[..]).unwrap(), old, "{picked:?}");
    if picked.instance.metadata.len() <= 1 {
        assert_eq!(bytes, old.encode_to_vec(), "{picked:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn answers_are_what_prost_writes_for_every_rule_and_fallback() {
    let registry = Registry::spawn(RegistryConfig::default());
    let lease = registry.open_lease();
    let many: Vec<(String, String)> = (0..40).map(|i| (format!("key-{i}"), "v".repeat(i * 12))).collect();
    let many: Vec<(&str, &str)> = many.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let specs = vec![
        spec("a1", "", &[]),
        spec("a2", "", &[("owner", "team-ä")]),
        spec("a3", "", &many),
        spec("v1", "v2", &[("version", "v2")]),
        spec("v3", "v2", &many),
    ];
    assert!(lease.announce(specs).await.unwrap().refused.is_empty());
    registry.subscribe("svc").await.unwrap();
    let balancer = Balancer::with_defaults(registry.clone());
    balancer.views().encode_answers_with(convert::encoded_instance);
    // An operator's weight and a passing check: conditions that are part of the answer.
    registry.change_override("svc", "a1", OverrideChange::Weight(3)).await.unwrap().unwrap();
    registry.set_health(&"svc".into(), &"a2".into(), Some(Health::Passing));
    registry.subscribe("svc").await.unwrap();

    let mut seen = HashMap::new();
    for rule in crate::rules::KNOWN_RULES.iter().chain(&["repeat(n=3)", "consistent_hash(balance=1.25)"]) {
        for version in ["", "v2", "nobody"] {
            for key in ["", "user-1", "user-2"] {
                let query = PickQuery { service: "svc", rule, version, key, zone: "z1", exclude: &[] };
                let picked = match balancer.pick(query).await {
                    Ok(picked) => picked,
                    // The hashing rules need a key: the only refusal this service may give.
                    Err(error) if key.is_empty() && error.to_string().contains("needs a request key") => continue,
                    Err(error) => panic!("{rule} {version:?} {key:?}: {error}"),
                };
                assert!(picked.instance.answer.get().is_some(), "{rule}: encoded at publish, not by the pick");
                same_answer(&picked);
                *seen.entry((picked.fallback.is_some(), picked.instance.id.clone())).or_insert(0) += 1;
            }
        }
    }
    assert!(seen.keys().any(|(fallback, _)| *fallback), "a fallback was answered");
    assert!(seen.keys().any(|(_, id)| &**id == "a3"), "a metadata-heavy instance was answered");

    // A changed instance is answered as it is now, not as it was encoded.
    let update = InstanceUpdate { service: "svc".into(), id: "v1".into(), weight: Some(42), ..Default::default() };
    lease.update(update).await.unwrap();
    let mut weights = Vec::new();
    for _ in 0..2 {
        let picked = balancer
            .pick(PickQuery { service: "svc", rule: "round_robin", version: "v2", ..Default::default() })
            .await
            .unwrap();
        same_answer(&picked);
        let mut bytes = Vec::new();
        PickAnswer::new(picked.clone()).encode(&mut bytes);
        let answer = pb::PickResponse::decode(&bytes[..]).unwrap();
        weights.push((picked.instance.id.to_string(), answer.instance.unwrap().weight));
    }
    assert!(weights.contains(&("v1".to_owned(), Some(42))), "{weights:?}");
}

#[tokio::test(start_paused = true)]
async fn an_instance_no_view_encoded_is_answered_encoded_now() {
    let registry = Registry::spawn(RegistryConfig::default());
    let lease = registry.open_lease();
    assert!(lease.announce(vec![spec("a1", "", &[("owner", "team-ä")])]).await.unwrap().refused.is_empty());
    registry.subscribe("svc").await.unwrap();
    // No encoder given to the views: nothing is encoded at publish.
    let balancer = Balancer::with_defaults(registry.clone());
    let query = PickQuery { service: "svc", rule: "round_robin", ..Default::default() };
    let picked = balancer.pick(query).await.unwrap();
    assert!(picked.instance.answer.get().is_none());
    same_answer(&picked);
}
