//! The DNS source against a resolver on loopback that answers what each test scripts: what a
//! read holds and how many questions it asks, whatever the answer.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::UdpSocket;

use super::wire::testing::{answer, srv};
use super::wire::{TYPE_A, TYPE_SRV};
use super::*;
use crate::sources::spec::SourceTable;

/// A resolver answering each question with `reply(name, type)`'s records (name, type, ttl,
/// rdata) and counting the questions.
struct Resolver {
    addr: SocketAddr,
    questions: Arc<AtomicUsize>,
}

type Reply = Arc<dyn Fn(&str, u16) -> Vec<(String, u16, u32, Vec<u8>)> + Send + Sync>;

impl Resolver {
    async fn start(reply: Reply) -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let questions = Arc::new(AtomicUsize::new(0));
        let counted = questions.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 512];
            loop {
                let Ok((n, from)) = socket.recv_from(&mut buf).await else { return };
                counted.fetch_add(1, Ordering::Relaxed);
                let query = &buf[..n];
                let (name, type_) = question(query);
                let records = reply(&name, type_);
                let records: Vec<(&str, u16, u32, Vec<u8>)> =
                    records.iter().map(|(n, t, ttl, data)| (n.as_str(), *t, *ttl, data.clone())).collect();
                let _ = socket.send_to(&answer(query, 0, &records), from).await;
            }
        });
        Self { addr, questions }
    }

    fn asked(&self) -> usize {
        self.questions.load(Ordering::Relaxed)
    }
}

/// The question of a query: its name (lower case, no final dot) and type.
fn question(query: &[u8]) -> (String, u16) {
    let mut at = 12;
    let mut labels = Vec::new();
    while query[at] != 0 {
        let len = usize::from(query[at]);
        labels.push(String::from_utf8_lossy(&query[at + 1..at + 1 + len]).to_lowercase());
        at += 1 + len;
    }
    (labels.join("."), u16::from_be_bytes([query[at + 1], query[at + 2]]))
}

fn encoded(name: &str) -> Vec<u8> {
    let mut out = Vec::new();
    for label in name.split('.') {
        out.push(label.len() as u8);
        out.extend_from_slice(label.as_bytes());
    }
    out.push(0);
    out
}

fn address(i: usize) -> Vec<u8> {
    Ipv4Addr::new(127, 1, (i >> 8) as u8, i as u8).octets().to_vec()
}

fn source(resolver: SocketAddr, max_instances: u64) -> Dns {
    let spec = SourceTable {
        url: "dns+srv://_grpc._tcp.svc.test".to_owned(),
        services: Some(vec!["svc".to_owned()]),
        max_instances: Some(max_instances),
        ..SourceTable::default()
    }
    .check()
    .unwrap();
    Dns::new(Question::Srv("_grpc._tcp.svc.test".to_owned()), Some(resolver), &spec)
}

/// 40 SRV records sharing one target of 200 addresses would be 8,000 instances: a read builds
/// `max_instances` of them and counts the rest.
#[tokio::test]
async fn srv_records_times_addresses_stop_at_max_instances() {
    let resolver = Resolver::start(Arc::new(|_, type_| match type_ {
        TYPE_SRV => {
            (0..40).map(|i| ("@".to_owned(), TYPE_SRV, 0, srv(0, 1, 9000 + i, &encoded("pods.svc.test")))).collect()
        }
        TYPE_A => (0..200).map(|i| ("@".to_owned(), TYPE_A, 0, address(i))).collect(),
        _ => Vec::new(),
    }))
    .await;
    let mut dns = source(resolver.addr, 1000);
    let (listing, _) = dns.read().await.unwrap();
    let records = &listing.services["svc"];
    assert_eq!(records.len(), 1000);
    assert_eq!(listing.over_limit, 7000);
    assert_eq!(resolver.asked(), 3, "one SRV question, then the one target's A and AAAA");
    let first: IpAddr = "127.1.0.0".parse().unwrap();
    assert_eq!(records[0].host, first.to_string());
}

/// SRV answers naming `targets` distinct targets without their addresses, each of which has one.
fn unresolved_targets(targets: usize) -> Reply {
    Arc::new(move |_, type_| match type_ {
        TYPE_SRV => (0..targets)
            .map(|i| ("@".to_owned(), TYPE_SRV, 0, srv(0, 1, 9000, &encoded(&format!("pod{i}.svc.test")))))
            .collect(),
        TYPE_A => vec![("@".to_owned(), TYPE_A, 0, address(1))],
        _ => Vec::new(),
    })
}

/// An answer naming more targets than a read may look up fails the read after one question,
/// instead of asking two questions per target every time the source reads.
#[tokio::test]
async fn an_answer_with_too_many_unresolved_targets_is_refused_before_asking_for_them() {
    let resolver = Resolver::start(unresolved_targets(TARGET_LOOKUPS_PER_READ + 1)).await;
    let mut dns = source(resolver.addr, 10_000);
    let error = dns.read().await.unwrap_err();
    assert!(error.to_string().contains("names 65 targets without their addresses"), "{error}");
    assert_eq!(resolver.asked(), 1);

    // At the limit, every target is looked up once per read.
    let resolver = Resolver::start(unresolved_targets(TARGET_LOOKUPS_PER_READ)).await;
    let mut dns = source(resolver.addr, 10_000);
    let (listing, _) = dns.read().await.unwrap();
    assert_eq!(listing.services["svc"].len(), TARGET_LOOKUPS_PER_READ);
    assert_eq!(resolver.asked(), 1 + 2 * TARGET_LOOKUPS_PER_READ);
}
