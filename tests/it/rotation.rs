//! Shared rotations across consumers on separate connections.

use std::collections::HashMap;

use rota::client::PickOptions;

use crate::harness::{TestServer, instance, picked_id, versioned, wait_until_removed};

#[tokio::test]
async fn four_concurrent_consumers_share_one_round_robin() {
    let server = TestServer::start().await;
    let _provider = server.register(vec![instance("rr", "a", 1), instance("rr", "b", 2), instance("rr", "c", 3)]).await;
    const PER_CONSUMER: usize = 30; // 4 × 30 = 120 = 3 × 40
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let mut client = server.client().await;
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for _ in 0..PER_CONSUMER {
                let picked = client.pick("rr", PickOptions::rule("round_robin")).await.expect("pick");
                ids.push((picked.ticket, picked_id(&picked)));
            }
            ids
        }));
    }
    let mut counts: HashMap<String, usize> = HashMap::new();
    let mut tickets = Vec::new();
    for task in tasks {
        for (ticket, id) in task.await.unwrap() {
            *counts.entry(id).or_default() += 1;
            tickets.push(ticket);
        }
    }
    assert_eq!(counts, HashMap::from([("a".into(), 40), ("b".into(), 40), ("c".into(), 40)]));
    tickets.sort_unstable();
    assert_eq!(tickets, (0..120).collect::<Vec<u64>>(), "every ticket drawn exactly once");
}

async fn alternating(server: &TestServer, service: &str, rule: &str, picks: usize) -> String {
    let mut consumers = [server.client().await, server.client().await];
    let mut sequence = String::new();
    for i in 0..picks {
        let picked = consumers[i % 2].pick(service, PickOptions::rule(rule)).await.expect("pick");
        sequence.push_str(&picked_id(&picked));
    }
    sequence
}

#[tokio::test]
async fn repeat_is_exact_across_alternating_consumers() {
    let server = TestServer::start().await;
    let _provider =
        server.register(vec![instance("rep", "A", 1), instance("rep", "B", 2), instance("rep", "C", 3)]).await;
    assert_eq!(alternating(&server, "rep", "repeat(n=3)", 12).await, "AAABBBCCCAAA");
    assert_eq!(alternating(&server, "rep", "repeat(n=5)", 17).await, "AAAAABBBBBCCCCCAA");
    // `repeat` with no parameter is repeat(n=3) and continues its rotation at ticket 12.
    assert_eq!(alternating(&server, "rep", "repeat", 6).await, "BBBCCC");
}

/// The next `n` picked ids the consumers report, waiting at most PATIENCE for each.
async fn next_ids(picked: &mut tokio::sync::mpsc::UnboundedReceiver<String>, n: usize) -> Vec<String> {
    let mut ids = Vec::new();
    while ids.len() < n {
        let id = tokio::time::timeout(crate::harness::PATIENCE, picked.recv())
            .await
            .expect("the consumers keep picking")
            .expect("a consumer is running");
        ids.push(id);
    }
    ids
}

#[tokio::test]
async fn a_stream_closing_mid_rotation_fails_no_pick_and_is_never_picked_again() {
    let server = TestServer::start().await;
    let _a = server.register(vec![instance("mid", "a", 1)]).await;
    let b = server.register(vec![instance("mid", "b", 2)]).await;
    let _c = server.register(vec![instance("mid", "c", 3)]).await;
    let mut watch = server.client().await.watch("mid").await.unwrap();

    // Consumers keep picking while b's stream goes away: none of their picks may fail. Each
    // answered pick is reported, so b leaves after a known number of picks (b among them),
    // with the consumers' next picks in flight, and they go on for a known number after.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let (picked_tx, mut picked_rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let mut consumers = Vec::new();
    for _ in 0..2 {
        let mut client = server.client().await;
        let stop = stop_rx.clone();
        let picked_tx = picked_tx.clone();
        consumers.push(tokio::spawn(async move {
            while !*stop.borrow() {
                let picked =
                    client.pick("mid", PickOptions::default()).await.expect("no pick fails while an instance leaves");
                let _ = picked_tx.send(picked_id(&picked));
            }
        }));
    }
    let before = next_ids(&mut picked_rx, 30).await;
    assert!(before.iter().any(|id| id == "b"), "b was in the rotation before it left: {before:?}");
    drop(b); // the stream ends without a Withdraw, as when a provider process dies
    wait_until_removed(&mut watch, "b").await;
    let after = next_ids(&mut picked_rx, 30).await;
    assert_eq!(after.len(), 30);
    stop_tx.send(true).unwrap();
    for consumer in consumers {
        consumer.await.expect("no consumer failed a pick");
    }

    let mut client = server.client().await;
    for _ in 0..30 {
        let picked = client.pick("mid", PickOptions::default()).await.unwrap();
        assert_ne!(picked_id(&picked), "b");
    }
}

#[tokio::test]
async fn version_isolation_keeps_developer_instances_private() {
    let server = TestServer::start().await;
    let _provider = server
        .register(vec![
            instance("iso", "plain-1", 1),
            instance("iso", "plain-2", 2),
            versioned("iso", "zlt-1", 3, "zlt"),
            versioned("iso", "bob-1", 4, "bob"),
        ])
        .await;
    let mut client = server.client().await;
    for _ in 0..6 {
        let picked = client.pick("iso", PickOptions::default()).await.unwrap();
        assert!(["plain-1", "plain-2"].contains(&picked_id(&picked).as_str()));
        assert_eq!(picked.fallback, "");
    }
    for _ in 0..3 {
        let picked = client.pick("iso", PickOptions::default().version("zlt")).await.unwrap();
        assert_eq!((picked_id(&picked).as_str(), picked.fallback.as_str()), ("zlt-1", ""));
    }
    let mut seen = Vec::new();
    for _ in 0..4 {
        let picked = client.pick("iso", PickOptions::default().version("nobody")).await.unwrap();
        assert_eq!(picked.fallback, "no instance with version \"nobody\"; picked from instances with no version");
        seen.push(picked_id(&picked));
    }
    seen.sort();
    assert_eq!(seen, ["plain-1", "plain-1", "plain-2", "plain-2"]);
}

#[tokio::test]
async fn pick_stream_answers_in_order_and_survives_a_bad_request() {
    use tokio_stream::StreamExt;
    let server = TestServer::start().await;
    let _provider = server.register(vec![instance("ps", "a", 1), instance("ps", "b", 2)]).await;
    let mut client = server.client().await;
    let good = PickOptions::rule("round_robin").request("ps");
    let bad = PickOptions::rule("zigzag").request("ps");
    let requests = vec![good.clone(), good.clone(), bad, good.clone(), good];
    let mut responses = client.balancer().pick_stream(tokio_stream::iter(requests)).await.unwrap().into_inner();
    let mut answers = Vec::new();
    while let Some(response) = responses.next().await {
        let response = response.unwrap();
        answers.push(match response.error {
            Some(error) => format!("error {}", error.code),
            None => format!("{}#{}", picked_id(&response), response.ticket),
        });
    }
    assert_eq!(answers, ["a#0", "b#1", "error 3", "a#2", "b#3"]);
}

#[tokio::test]
async fn leased_tickets_and_unary_picks_share_one_exact_rotation() {
    use rota::client::LeasedPicker;
    let server = TestServer::start().await;
    let _provider =
        server.register(vec![instance("lease", "a", 1), instance("lease", "b", 2), instance("lease", "c", 3)]).await;
    let mut leased = LeasedPicker::new(server.client().await, "lease", PickOptions::rule("round_robin"), 4);
    let mut local = Vec::new();
    for _ in 0..4 {
        let pick = leased.pick().await.unwrap();
        local.push((pick.ticket, pick.instance.id.to_string()));
    }
    assert_eq!(local, [(0, "a".into()), (1, "b".into()), (2, "c".into()), (3, "a".into())]);
    let mut client = server.client().await;
    let unary = client.pick("lease", PickOptions::rule("round_robin")).await.unwrap();
    assert_eq!((unary.ticket, picked_id(&unary).as_str()), (4, "b"), "the lease reserved tickets 0..=3");
    let next = leased.pick().await.unwrap();
    assert_eq!((next.ticket, &*next.instance.id), (5, "c"), "a new block starts after the unary pick");

    let mut repeat = LeasedPicker::new(server.client().await, "lease", PickOptions::rule("repeat(n=2)"), 3);
    let mut ids = String::new();
    for _ in 0..8 {
        ids.push_str(&repeat.pick().await.unwrap().instance.id);
    }
    assert_eq!(ids, "aabbccaa");

    let error = client
        .balancer()
        .lease(rota::pb::LeaseRequest {
            service: "lease".into(),
            rule: "random".into(),
            version: String::new(),
            count: 4,
            exclude: Vec::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(error.code(), tonic::Code::InvalidArgument);
    assert_eq!(
        error.message(),
        "rule is \"random\", which cannot be leased; leasable rules: round_robin, repeat, weighted"
    );
}

#[tokio::test]
async fn a_leased_block_follows_instance_changes_without_wasting_tickets() {
    use rota::client::LeasedPicker;
    let server = TestServer::start().await;
    let _a = server.register(vec![instance("lease-epoch", "a", 1)]).await;
    let b = server.register(vec![instance("lease-epoch", "b", 2)]).await;
    let mut picker = LeasedPicker::new(server.client().await, "lease-epoch", PickOptions::rule("round_robin"), 100);
    picker.follow_changes().await.unwrap();
    let mut watch = server.client().await.watch("lease-epoch").await.unwrap();
    assert_eq!(&*picker.pick().await.unwrap().instance.id, "a");
    assert_eq!(&*picker.pick().await.unwrap().instance.id, "b");
    b.close().await.unwrap();
    crate::harness::wait_until_removed(&mut watch, "b").await;
    let epoch = server.client().await.list_instances("lease-epoch").await.unwrap().epoch;
    assert!(tokio::time::timeout(crate::harness::PATIENCE, picker.wait_for_epoch(epoch)).await.unwrap());
    // The rest of the block maps onto [a], and no ticket is skipped.
    for expected_ticket in 2..40 {
        let pick = picker.pick().await.unwrap();
        assert_eq!((pick.ticket, &*pick.instance.id), (expected_ticket, "a"));
    }
}
