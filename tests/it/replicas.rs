//! Several rota replicas sharing their rule state through a real Redis server: one rotation
//! across replicas, exact under concurrency, sticky from any replica, and picks that go on
//! while Redis is away without repeating a ticket after it returns.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use rota::client::{PickOptions, RotaClient};
use rota::pb;
use rota::replicas::table::{REPLICA_LEASE, RESYNC};
use rota::state::StateConfig;

use crate::admin::get;
use crate::harness::{PATIENCE, TestServer, instance, picked_id};
use crate::redis_server::{RedisCluster, RedisServer};

/// A replica whose state lives at `url`, once its link to Redis is up.
async fn replica(url: &str, ticket_block: u32) -> TestServer {
    // A generous command timeout: a slow test machine must not look like an outage (the
    // outages these tests make are refused connections and READONLY errors, seen at once).
    let state = StateConfig::parse(url, ticket_block, Duration::from_secs(5)).expect("a valid state address");
    let server = TestServer::start_with(|config| config.state = state).await;
    wait_link(&server, true).await;
    server
}

/// Waits until the replica's link to Redis is `up` (or down).
async fn wait_link(server: &TestServer, up: bool) {
    let mut link = server.server.balancer().state().link().expect("a Redis-backed replica").watch();
    tokio::time::timeout(PATIENCE, link.wait_for(|now| *now == up))
        .await
        .unwrap_or_else(|_| panic!("the link did not become {}", if up { "up" } else { "down" }))
        .expect("the link is kept");
}

/// A replica whose link to `redis` passes a proxy adding 100 ms each way (200 ms of round
/// trip), with the command timeout `timeout`, once its link is up; and the proxy.
async fn far_replica(redis: &RedisServer, timeout: Duration) -> (TestServer, crate::redis_server::LatencyProxy) {
    let proxy = crate::redis_server::LatencyProxy::start(redis.port, Duration::from_millis(100)).await;
    let url = format!("redis://127.0.0.1:{}", proxy.port);
    let state = StateConfig::parse(&url, 1, timeout).expect("a valid state address");
    let server = TestServer::start_with(|config| config.state = state).await;
    wait_link(&server, true).await;
    (server, proxy)
}

/// The three instances `a`, `b`, `c` of `service`, each registered on one replica in turn (a
/// provider talks to one replica), once every replica holds all three.
async fn register_spread(replicas: &[&TestServer], service: &str) -> Vec<rota::client::Registration> {
    let mut held = Vec::new();
    for (i, (id, port)) in [("a", 1), ("b", 2), ("c", 3)].into_iter().enumerate() {
        held.push(replicas[i % replicas.len()].register(vec![instance(service, id, port)]).await);
    }
    for replica in replicas {
        wait_instances(replica, service, &["a", "b", "c"]).await;
    }
    held
}

async fn clients(replicas: &[&TestServer]) -> Vec<RotaClient> {
    let mut clients = Vec::new();
    for replica in replicas {
        clients.push(replica.client().await);
    }
    clients
}

async fn pick(client: &mut RotaClient, service: &str, options: PickOptions) -> pb::PickResponse {
    client.pick(service, options).await.expect("pick").into_response()
}

/// The ids of `count` picks of `service` under `rule` through `server`, sorted.
async fn picked_sorted(server: &TestServer, service: &str, rule: &str, count: usize) -> Vec<String> {
    let mut client = server.client().await;
    let mut ids = Vec::with_capacity(count);
    for _ in 0..count {
        ids.push(picked_id(&pick(&mut client, service, PickOptions::rule(rule)).await));
    }
    ids.sort();
    ids
}

#[tokio::test]
async fn consumers_alternating_replicas_follow_one_rotation() {
    let redis = RedisServer::start().await;
    let (one, two, three) =
        (replica(&redis.url(), 1).await, replica(&redis.url(), 1).await, replica(&redis.url(), 1).await);
    let _held = register_spread(&[&one, &two, &three], "alt").await;
    let mut consumers = clients(&[&one, &two, &three]).await;
    let mut sequence = String::new();
    let mut tickets = Vec::new();
    for i in 0..12 {
        let picked = pick(&mut consumers[i % 3], "alt", PickOptions::rule("round_robin")).await;
        sequence.push_str(&picked_id(&picked));
        tickets.push(picked.ticket);
    }
    assert_eq!(sequence, "abcabcabcabc");
    assert_eq!(tickets, (0..12).collect::<Vec<u64>>(), "one counter across the replicas");
    let mut repeat = String::new();
    for i in 0..9 {
        // Two consumers per replica, alternating replicas on every pick.
        repeat.push_str(&picked_id(&pick(&mut consumers[i % 2], "alt", PickOptions::rule("repeat(n=3)")).await));
    }
    assert_eq!(repeat, "aaabbbccc");
}

/// Picks `per_consumer` times from each of `consumers` concurrently; (ticket, id) of each.
async fn concurrent_picks(
    consumers: Vec<RotaClient>,
    service: &'static str,
    per_consumer: usize,
) -> Vec<(u64, String)> {
    let mut tasks = Vec::new();
    for mut client in consumers {
        tasks.push(tokio::spawn(async move {
            let mut picks = Vec::new();
            for _ in 0..per_consumer {
                let picked = pick(&mut client, service, PickOptions::rule("round_robin")).await;
                picks.push((picked.ticket, picked_id(&picked)));
            }
            picks
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.extend(task.await.expect("consumer task"));
    }
    all
}

fn shares(picks: &[(u64, String)]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for (_, id) in picks {
        *counts.entry(id.clone()).or_default() += 1;
    }
    counts
}

#[tokio::test]
async fn concurrent_picks_on_two_replicas_draw_each_ticket_once() {
    let redis = RedisServer::start().await;
    let (one, two) = (replica(&redis.url(), 1).await, replica(&redis.url(), 1).await);
    let _held = register_spread(&[&one, &two], "busy").await;
    let mut consumers = clients(&[&one, &two, &one, &two, &one, &two, &one, &two]).await;
    // Warm each connection (and each replica's rotation) with one pick.
    for consumer in &mut consumers[..2] {
        pick(consumer, "busy", PickOptions::rule("round_robin")).await;
    }
    let before = redis.calls("evalsha").await + redis.calls("eval").await;
    let picks = concurrent_picks(consumers, "busy", 60).await;
    let calls = redis.calls("evalsha").await + redis.calls("eval").await - before;
    let mut tickets: Vec<u64> = picks.iter().map(|(ticket, _)| *ticket).collect();
    tickets.sort_unstable();
    assert_eq!(tickets, (2..482).collect::<Vec<u64>>(), "each ticket drawn once across replicas");
    // Tickets 2..482 map to b, c, a, ...: 160 each.
    assert_eq!(shares(&picks), HashMap::from([("a".into(), 160), ("b".into(), 160), ("c".into(), 160)]));
    assert!(calls <= 480, "at most one Redis call per pick, got {calls}");
}

/// Picks that queue while Redis holds a draw are answered together by the next call: Redis is
/// paused for writes (the draw script writes), so the first draw's call waits in Redis while
/// every other pick queues behind it; once all of them wait, Redis resumes, and two calls
/// answer them all.
#[tokio::test]
async fn picks_queued_behind_a_draw_in_flight_are_answered_by_one_more_call() {
    let redis = RedisServer::start().await;
    // A command timeout longer than the pause, so that the paused call is not an outage.
    let state = StateConfig::parse(&redis.url(), 1, Duration::from_secs(60)).expect("a valid state address");
    let server = TestServer::start_with(|config| config.state = state).await;
    wait_link(&server, true).await;
    let _held = register_spread(&[&server], "queued").await;
    let mut consumers = clients(&[&server, &server, &server, &server]).await;
    // The rotation and the draw script exist before the pause.
    pick(&mut consumers[0], "queued", PickOptions::rule("round_robin")).await;
    let link = server.server.balancer().state().link().expect("a Redis-backed replica").clone();
    assert_eq!(link.draws_waiting(), 0);

    let _: String = redis.query(&["CLIENT", "PAUSE", "60000", "WRITE"]).await.expect("CLIENT PAUSE");
    let (before, redis_before) = (link.draw_calls(), redis.calls("evalsha").await);
    const PICKS: usize = 40;
    let mut waiting = tokio::task::JoinSet::new();
    for n in 0..PICKS {
        let mut consumer = consumers[n % consumers.len()].clone();
        waiting.spawn(async move { pick(&mut consumer, "queued", PickOptions::rule("round_robin")).await.ticket });
    }
    let all_waiting = async {
        while link.draws_waiting() < PICKS as u64 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    tokio::time::timeout(PATIENCE, all_waiting).await.unwrap_or_else(|_| {
        panic!("{} of {PICKS} picks waited for Redis", link.draws_waiting());
    });
    assert!(waiting.try_join_next().is_none(), "no pick is answered while Redis is paused");
    let _: String = redis.query(&["CLIENT", "UNPAUSE"]).await.expect("CLIENT UNPAUSE");

    let mut tickets = waiting.join_all().await;
    tickets.sort_unstable();
    assert_eq!(tickets, (1..=PICKS as u64).collect::<Vec<_>>(), "each ticket drawn once");
    assert_eq!(link.draw_calls() - before, 2, "the paused call, then one call for every pick queued behind it");
    assert!(redis.calls("evalsha").await - redis_before >= 2, "Redis ran both");
    assert_eq!(link.draws_waiting(), 0);
}

#[tokio::test]
async fn ticket_blocks_hand_out_each_ticket_once_with_few_redis_calls() {
    let redis = RedisServer::start().await;
    let (one, two) = (replica(&redis.url(), 16).await, replica(&redis.url(), 16).await);
    let _held = register_spread(&[&one, &two], "blocks").await;
    let consumers = clients(&[&one, &two, &one, &two]).await;
    let before = redis.calls("evalsha").await + redis.calls("eval").await;
    let picks = concurrent_picks(consumers, "blocks", 48).await;
    let calls = redis.calls("evalsha").await + redis.calls("eval").await - before;
    let mut tickets: Vec<u64> = picks.iter().map(|(ticket, _)| *ticket).collect();
    tickets.sort_unstable();
    tickets.dedup();
    assert_eq!(tickets.len(), 192, "no ticket handed out twice");
    // Each replica drew 96 tickets in blocks of 16 (a call may draw a few more when picks
    // arrive together): far fewer calls than picks.
    assert!(calls <= 2 * 96 / 16 + 4, "{calls} Redis calls for 192 picks");
}

#[tokio::test]
async fn sticky_keys_answer_the_same_from_any_replica() {
    let redis = RedisServer::start().await;
    let (one, two) = (replica(&redis.url(), 1).await, replica(&redis.url(), 1).await);
    let _held = register_spread(&[&one, &two], "cart").await;
    let mut consumers = clients(&[&one, &two]).await;
    for user in 0..12 {
        let key = format!("user-{user}");
        let first = picked_id(&pick(&mut consumers[user % 2], "cart", PickOptions::rule("sticky").key(&key)).await);
        for round in 0..3 {
            let again = picked_id(
                &pick(&mut consumers[(user + round + 1) % 2], "cart", PickOptions::rule("sticky").key(&key)).await,
            );
            assert_eq!(again, first, "{key} moved between replicas");
        }
    }
    let stored: Vec<String> = redis.query(&["KEYS", "rota:{cart}:sticky:*"]).await.expect("KEYS");
    assert_eq!(stored.len(), 12, "one shared assignment per key: {stored:?}");
}

#[tokio::test]
async fn picks_go_on_while_redis_is_away_and_no_ticket_repeats_after_it_returns() {
    let mut redis = RedisServer::start().await;
    let server = replica(&redis.url(), 1).await;
    let admin = server.server.admin_addr().expect("admin listener");
    let _held = register_spread(&[&server], "outage").await;
    let mut client = server.client().await;
    let mut tickets = Vec::new();
    for _ in 0..5 {
        tickets.push(pick(&mut client, "outage", PickOptions::rule("round_robin")).await.ticket);
    }
    redis.kill();
    // No pick fails: the first waits for the command timeout at most, the rest answer locally.
    for _ in 0..5 {
        tickets.push(pick(&mut client, "outage", PickOptions::rule("round_robin")).await.ticket);
    }
    wait_link(&server, false).await;
    let (status, body) = get(admin, "/readyz").await;
    assert_eq!(status, 200, "a degraded replica stays ready");
    assert!(body.contains("degraded"), "{body}");
    let (_, metrics) = get(admin, "/metrics").await;
    assert!(metrics.contains("rota_state_backend_up{backend=\"redis\"} 0"), "{metrics}");
    // Redis comes back empty (nothing persisted): the replica finds its data lost and every
    // rotation resumes from a new generation's floor, above anything handed out before.
    redis.restart().await;
    wait_link(&server, true).await;
    for _ in 0..5 {
        tickets.push(pick(&mut client, "outage", PickOptions::rule("round_robin")).await.ticket);
    }
    assert_eq!(tickets[..10], (0..10).collect::<Vec<u64>>(), "one sequence into the outage");
    let floor = server.server.balancer().state().link().unwrap().ticket_floor();
    assert!(floor >= rota::state::redis::time_floor() - 60_000 * 1024, "a floor from the clock: {floor}");
    assert_eq!(tickets[10..], (floor..floor + 5).collect::<Vec<u64>>(), "resumed from the floor");
    let stored: Option<u64> = redis.query(&["GET", "rota:{outage}:ticket:version=:round_robin"]).await.expect("GET");
    assert_eq!(stored, Some(floor + 5), "Redis resumed past the floor");
    let (_, metrics) = get(admin, "/metrics").await;
    assert!(metrics.contains("rota_state_backend_up{backend=\"redis\"} 1"), "{metrics}");
    assert!(metrics.lines().any(|l| l == "rota_state_data_losses_total 1"), "{metrics}");
}

#[tokio::test]
async fn a_replica_follows_a_sentinel_failover() {
    let primary = RedisServer::start().await;
    let secondary = RedisServer::start_with(&["--replicaof", "127.0.0.1", &primary.port.to_string()]).await;
    let sentinel = RedisServer::sentinel("main", primary.port).await;
    let url = format!("redis+sentinel://127.0.0.1:{}/main", sentinel.port);
    let server = replica(&url, 1).await;
    let _held = register_spread(&[&server], "failover").await;
    let mut client = server.client().await;
    let mut tickets = Vec::new();
    for _ in 0..3 {
        tickets.push(pick(&mut client, "failover", PickOptions::rule("round_robin")).await.ticket);
    }
    // The replica must have caught up before the promotion, or the counter would be lost.
    tokio::time::timeout(PATIENCE, async {
        loop {
            let copied: Option<u64> =
                secondary.query(&["GET", "rota:{failover}:ticket:version=:round_robin"]).await.unwrap_or(None);
            if copied == Some(3) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the secondary copies the counter");
    let _: String = sentinel.query(&["SENTINEL", "FAILOVER", "main"]).await.expect("failover starts");
    wait_promoted(&secondary, PATIENCE).await;
    // Picks never fail; once rota has followed the promotion, they draw on the new primary.
    let mut on_new_primary = false;
    for _ in 0..200 {
        tickets.push(pick(&mut client, "failover", PickOptions::rule("round_robin")).await.ticket);
        let stored: Option<u64> =
            secondary.query(&["GET", "rota:{failover}:ticket:version=:round_robin"]).await.unwrap_or(None);
        if stored.is_some_and(|n| n > 3) {
            on_new_primary = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(on_new_primary, "rota never drew on the promoted primary");
    let mut sorted = tickets.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), tickets.len(), "no ticket repeated through the failover: {tickets:?}");
}

/// The primary dies holding draws its replica never copied (the replica was frozen meanwhile),
/// and Sentinel promotes that replica: its counter is behind tickets one rota replica handed
/// out. The other rota replica, which drew none of them, must not hand them out again: a
/// failover starts a new generation, as a loss does.
#[tokio::test]
async fn after_a_failover_that_lost_draws_no_replica_hands_out_their_tickets_again() {
    let mut primary = RedisServer::start().await;
    let secondary = RedisServer::start_with(&["--replicaof", "127.0.0.1", &primary.port.to_string()]).await;
    let sentinel = RedisServer::sentinel("main", primary.port).await;
    let url = format!("redis+sentinel://127.0.0.1:{}/main", sentinel.port);
    let (one, two) = (replica(&url, 1).await, replica(&url, 1).await);
    let _held = register_spread(&[&one, &two], "lost").await;
    let counter = "rota:{lost}:ticket:version=:round_robin";
    let mut consumers = clients(&[&one, &two]).await;
    let mut tickets = Vec::new();
    for n in 0..4 {
        tickets.push(pick(&mut consumers[n % 2], "lost", PickOptions::rule("round_robin")).await.ticket);
    }
    tokio::time::timeout(PATIENCE, async {
        while secondary.query::<Option<u64>>(&["GET", counter]).await.unwrap_or(None) != Some(4) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the secondary copies the counter");

    // Draws the secondary never sees: it is frozen and cut off (what the primary had sent it
    // before is all it will read) while replica one draws on the primary.
    secondary.freeze();
    let cut: u64 = primary.query(&["CLIENT", "KILL", "TYPE", "replica"]).await.expect("CLIENT KILL");
    assert_eq!(cut, 1, "the secondary's replication link is cut");
    for _ in 0..10 {
        tickets.push(pick(&mut consumers[0], "lost", PickOptions::rule("round_robin")).await.ticket);
    }
    let on_primary: Option<u64> = primary.query(&["GET", counter]).await.expect("GET");
    assert_eq!(on_primary, Some(14));
    let links: Vec<_> = [&one, &two]
        .iter()
        .map(|server| server.server.balancer().state().link().expect("a Redis-backed replica").clone())
        .collect();
    let recovered: Vec<u64> = links.iter().map(|link| link.recoveries()).collect();
    primary.kill();
    secondary.resume();
    // Sentinel first sees the primary down (1 s), then waits out the secondary's freeze.
    wait_promoted(&secondary, PATIENCE * 2).await;
    let copied: Option<u64> = secondary.query(&["GET", counter]).await.expect("GET");
    assert_eq!(copied, Some(4), "the promoted replica lacks the last ten draws");

    // Both rota replicas follow the promotion before they draw again (picks taken while the
    // link is down come from local counters, a documented limit of its own).
    for (link, recovered) in links.iter().zip(recovered) {
        tokio::time::timeout(PATIENCE * 2, async {
            while !(link.is_up() && link.recoveries() > recovered) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the replica's link comes back, to the promoted primary");
    }
    for n in 0..10 {
        tickets.push(pick(&mut consumers[(n + 1) % 2], "lost", PickOptions::rule("round_robin")).await.ticket);
    }
    let stored: Option<u64> = secondary.query(&["GET", counter]).await.expect("GET");
    assert!(stored.is_some_and(|n| n > 14), "the draws went to the promoted primary: {stored:?}");
    let mut sorted = tickets.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), tickets.len(), "a ticket was handed out twice: {tickets:?}");
    assert!(links.iter().all(|link| link.losses() == 1), "each replica counts the failover as a loss");
}

/// Waits until `redis` is a primary (Sentinel promoted it).
async fn wait_promoted(redis: &RedisServer, patience: Duration) {
    tokio::time::timeout(patience, async {
        loop {
            // The promotion kills the server's normal clients: a query it cut short is retried.
            let role: Vec<redis::Value> = redis.query(&["ROLE"]).await.unwrap_or_default();
            if matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the secondary is promoted");
}

/// Waits until `server`'s registry holds exactly `ids` for `service`.
pub(crate) async fn wait_instances(server: &TestServer, service: &str, ids: &[&str]) {
    let mut snapshots = server.server.balancer().registry().subscribe(service).await.expect("registry runs");
    let wanted: Vec<String> = ids.iter().map(|id| id.to_string()).collect();
    tokio::time::timeout(
        PATIENCE,
        snapshots.wait_for(|s| s.instances.iter().map(|i| i.id.to_string()).eq(wanted.iter().cloned())),
    )
    .await
    .unwrap_or_else(|_| panic!("{service} never held exactly {ids:?}"))
    .expect("registry runs");
}

#[tokio::test]
async fn registrations_on_any_replica_are_pickable_on_every_replica() {
    let redis = RedisServer::start().await;
    let (one, two, three) =
        (replica(&redis.url(), 1).await, replica(&redis.url(), 1).await, replica(&redis.url(), 1).await);
    let _a = one.register(vec![instance("merged", "a", 1), instance("merged", "b", 2)]).await;
    let c = two.register(vec![instance("merged", "c", 3)]).await;
    for server in [&one, &two, &three] {
        wait_instances(server, "merged", &["a", "b", "c"]).await;
    }
    let mut consumers = clients(&[&one, &two, &three]).await;
    let mut sequence = String::new();
    for i in 0..9 {
        sequence.push_str(&picked_id(&pick(&mut consumers[i % 3], "merged", PickOptions::rule("round_robin")).await));
    }
    assert_eq!(sequence, "abcabcabc", "three replicas, one table, one rotation");
    // The same id on another replica is refused there, as on one server.
    let refused = three.client().await.register(vec![instance("merged", "a", 9)]).await.expect("register");
    assert!(refused.require_all_accepted().is_err(), "a second owner of `a` was accepted");
    // A withdrawal on its own replica reaches the others.
    drop(c);
    for server in [&one, &two, &three] {
        wait_instances(server, "merged", &["a", "b"]).await;
    }
}

#[tokio::test]
async fn a_watch_on_one_replica_sees_registrations_updates_and_withdrawals_made_on_another() {
    use pb::watch_event::Event;
    let redis = RedisServer::start().await;
    let (one, two) = (replica(&redis.url(), 1).await, replica(&redis.url(), 1).await);
    let mut watch = two.client().await.watch("watched").await.expect("watch");
    let mut next = async || {
        tokio::time::timeout(PATIENCE, watch.message()).await.expect("an event in time").expect("watch").expect("open")
    };
    assert!(matches!(next().await.event, Some(Event::Snapshot(ref list)) if list.instances.is_empty()));
    let mut provider = one.register(vec![instance("watched", "a", 1)]).await;
    assert!(matches!(next().await.event, Some(Event::Added(ref i)) if i.id == "a"));
    let update = pb::Update {
        instance: Some(pb::InstanceRef { service: "watched".into(), id: "a".into() }),
        weight: Some(7),
        ..Default::default()
    };
    provider.send(pb::register_request::Msg::Update(update)).await.expect("update");
    assert!(matches!(next().await.event, Some(Event::Updated(ref i)) if i.weight == Some(7)));
    provider.close().await.expect("close");
    assert!(matches!(next().await.event, Some(Event::Removed(ref r)) if r.id == "a"));
}

#[tokio::test]
async fn a_stopped_replica_s_instances_leave_the_others_and_theirs_stay() {
    let redis = RedisServer::start().await;
    let (one, two) = (replica(&redis.url(), 1).await, replica(&redis.url(), 1).await);
    let _a = one.register(vec![instance("leaving", "a", 1)]).await;
    let _b = two.register(vec![instance("leaving", "b", 2)]).await;
    wait_instances(&two, "leaving", &["a", "b"]).await;
    // Dropped, its sharing stops without a word to Redis (as if killed): its key expires and
    // the others drop its instances.
    drop(one);
    wait_instances(&two, "leaving", &["b"]).await;
    let mut client = two.client().await;
    for _ in 0..3 {
        assert_eq!(picked_id(&pick(&mut client, "leaving", PickOptions::rule("round_robin")).await), "b");
    }
}

#[tokio::test]
async fn a_dead_replica_s_ids_may_be_registered_again_on_the_survivor() {
    let redis = RedisServer::start().await;
    let (one, two) = (replica(&redis.url(), 1).await, replica(&redis.url(), 1).await);
    let _a = one.register(vec![instance("again", "a", 1)]).await;
    wait_instances(&two, "again", &["a"]).await;
    let refused = two.client().await.register(vec![instance("again", "a", 2)]).await.expect("register");
    assert!(refused.require_all_accepted().is_err(), "`a` has a live owner on the other replica");
    drop(one);
    wait_instances(&two, "again", &[]).await;
    // The survivor clears the dead replica's entries from Redis.
    tokio::time::timeout(PATIENCE, async {
        while !redis.query::<Vec<String>>(&["KEYS", "rota:{again}:instances:*"]).await.expect("KEYS").is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the dead replica's hash was removed");
    let holders: Vec<String> = redis.query(&["SMEMBERS", "rota:{again}:holders"]).await.expect("SMEMBERS");
    assert!(holders.is_empty(), "the dead replica is no holder any more: {holders:?}");
    // The dead replica's entries no longer block the id.
    let _again = two.register(vec![instance("again", "a", 2)]).await;
    let mut client = two.client().await;
    assert_eq!(pick(&mut client, "again", PickOptions::rule("round_robin")).await.instance.expect("one").port, 2);
}

#[tokio::test]
async fn the_same_ids_registered_on_two_replicas_at_once_are_accepted_on_one_only() {
    let redis = RedisServer::start().await;
    let (one, two) = (replica(&redis.url(), 1).await, replica(&redis.url(), 1).await);
    race_for_ids(&one, &two, "twice", 20).await;
}

/// Announces ids `r0`.. of `service` on both replicas at once, one id at a time: each is
/// accepted through exactly one replica (the other answers `ALREADY_EXISTS`), and both
/// replicas end up holding every id as its winner registered it.
async fn race_for_ids(one: &TestServer, two: &TestServer, service: &str, count: usize) {
    let ids: Vec<String> = (0..count).map(|i| format!("r{i}")).collect();
    let (mut first, mut second) = (one.client().await, two.client().await);
    let mut held = Vec::new();
    let mut winners = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        // Both announces go out together: neither replica has seen the other's in its table.
        let (a, b) = tokio::join!(
            first.register(vec![instance(service, id, 1)]),
            second.register(vec![instance(service, id, 2)])
        );
        let (a, b) = (a.expect("register on one"), b.expect("register on two"));
        let accepted = [&a, &b].map(|r| r.ack().accepted.len());
        assert_eq!(accepted.iter().sum::<usize>(), 1, "announce {i}: {id} accepted {accepted:?} times");
        let loser = if accepted[0] == 1 { &b } else { &a };
        let refusal = &loser.ack().refused[0];
        assert_eq!(refusal.code, tonic::Code::AlreadyExists as i32, "{refusal:?}");
        assert!(refusal.message.contains("another rota replica"), "{}", refusal.message);
        winners.push(if accepted[0] == 1 { 1 } else { 2 });
        held.extend([a, b]);
    }
    // Both replicas hold every id, each from the replica whose announce won.
    let names: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    for server in [one, two] {
        wait_instances(server, service, &sorted).await;
        let snapshot = server.server.balancer().registry().service(service).expect("the service");
        for (id, winner) in names.iter().zip(&winners) {
            let port = snapshot.instances.iter().find(|i| &*i.id == *id).expect("held").port;
            assert_eq!(u32::from(port), *winner, "{id} comes from the replica that accepted it");
        }
    }
}

#[tokio::test]
async fn one_instance_s_change_in_a_large_service_writes_and_names_that_instance_alone() {
    let redis = RedisServer::start().await;
    let (one, two) = (replica(&redis.url(), 1).await, replica(&redis.url(), 1).await);
    let instances: Vec<pb::Instance> = (0..300).map(|i| instance("large", &format!("i{i:03}"), 1000 + i)).collect();
    let mut provider = one.register(instances).await;
    let all: Vec<String> = (0..300).map(|i| format!("i{i:03}")).collect();
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    wait_instances(&two, "large", &all).await;
    let update = pb::Update {
        instance: Some(pb::InstanceRef { service: "large".into(), id: "i123".into() }),
        weight: Some(7),
        ..Default::default()
    };
    let ack = provider.send(pb::register_request::Msg::Update(update)).await.expect("update");
    assert_eq!(ack.accepted.len(), 1);
    let mut snapshots = two.server.balancer().registry().subscribe("large").await.expect("registry runs");
    tokio::time::timeout(
        PATIENCE,
        snapshots.wait_for(|s| s.instances.iter().any(|i| &*i.id == "i123" && i.weight == 7)),
    )
    .await
    .expect("the new weight reached the other replica")
    .expect("registry runs");
    // The change entry names the one id; the replica's hash holds one field per instance.
    let last: redis::Value = redis
        .query(&["XREVRANGE", rota::state::redis::keys::CHANGES, "+", "-", "COUNT", "1"])
        .await
        .expect("XREVRANGE");
    let text = format!("{last:?}");
    assert!(text.contains("i123") && !text.contains("i124"), "the last change names i123 alone: {text}");
    let keys: Vec<String> = redis.query(&["KEYS", "rota:{large}:instances:*"]).await.expect("KEYS");
    assert_eq!(keys.len(), 1, "one replica holds `large`: {keys:?}");
    let fields: u64 = redis.query(&["HLEN", &keys[0]]).await.expect("HLEN");
    assert_eq!(fields, 301, "one field per instance, and the write token");
}

#[tokio::test]
async fn a_resync_reads_again_only_the_tables_that_changed() {
    let redis = RedisServer::start().await;
    let (one, two) = (replica(&redis.url(), 1).await, replica(&redis.url(), 1).await);
    let _a = one.register(vec![instance("steady", "a", 1)]).await;
    wait_instances(&two, "steady", &["a"]).await;
    // No pick is made, so no statistics are read: every HGETALL is a table read.
    let (whole_reads, token_reads) = (redis.calls("hgetall").await, redis.calls("hget").await);
    // The next resync (every 10 s) asks each table's token and finds it unchanged.
    tokio::time::timeout(RESYNC + PATIENCE, async {
        while redis.calls("hget").await == token_reads {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("a resync asked for the token");
    assert_eq!(redis.calls("hgetall").await, whole_reads, "an unchanged table was read whole");
    wait_instances(&two, "steady", &["a"]).await;
}

#[tokio::test]
async fn a_replica_whose_key_lapsed_writes_its_instances_again() {
    let redis = RedisServer::start().await;
    let server = replica(&redis.url(), 1).await;
    let _a = server.register(vec![instance("lapsed", "a", 1), instance("lapsed", "b", 2)]).await;
    let keys = || async { redis.query::<Vec<String>>(&["KEYS", "rota:{lapsed}:instances:*"]).await.expect("KEYS") };
    tokio::time::timeout(PATIENCE, async {
        while keys().await.is_empty() {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the instances were written");
    let hash = keys().await.remove(0);
    let replica_key = rota::state::redis::keys::replica(hash.rsplit(':').next().expect("a replica id"));
    // What another replica does when this one's key has expired: its entries are cleared.
    let _: () = redis.query(&["DEL", &replica_key, &hash]).await.expect("DEL");
    tokio::time::timeout(PATIENCE, async {
        while redis.query::<Vec<Option<String>>>(&["HMGET", &hash, "a", "b"]).await.expect("HMGET").contains(&None) {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the replica wrote its instances again");
}

#[tokio::test]
async fn a_new_sticky_key_picked_on_two_replicas_at_once_gets_one_instance() {
    let redis = RedisServer::start().await;
    let (one, two) = (replica(&redis.url(), 1).await, replica(&redis.url(), 1).await);
    let _held = register_spread(&[&one, &two], "race").await;
    let consumers = clients(&[&one, &two, &one, &two]).await;
    let mut tasks = Vec::new();
    for mut client in consumers {
        tasks.push(tokio::spawn(async move {
            let mut answers = Vec::new();
            for user in 0..30 {
                // Each replica's first choice for a key follows the shared ticket, so two
                // replicas choosing at once choose differently; the claim decides.
                let options = PickOptions::rule("sticky").key(format!("user-{user}"));
                answers.push((user, picked_id(&pick(&mut client, "race", options).await)));
            }
            answers
        }));
    }
    let mut assigned: HashMap<usize, String> = HashMap::new();
    for task in tasks {
        for (user, id) in task.await.expect("consumer") {
            let first = assigned.entry(user).or_insert_with(|| id.clone());
            assert_eq!(*first, id, "user-{user} got two instances");
        }
    }
}

fn failure(service: &str, id: &str) -> pb::CallOutcome {
    pb::CallOutcome {
        service: service.into(),
        instance_id: id.into(),
        latency_us: 2_000,
        result: pb::CallResult::Error as i32,
        ..Default::default()
    }
}

/// Waits until `server`'s statistics of `service`/`id` satisfy `done` (they follow the other
/// replicas' within a few exchange intervals).
async fn wait_stats(server: &TestServer, service: &str, id: &str, done: impl Fn(&rota::load::InstanceReport) -> bool) {
    let stats = server.server.balancer().stats().clone();
    tokio::time::timeout(PATIENCE, async {
        while !done(&stats.report(service, id)) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{service}/{id}: {:?}", stats.report(service, id)));
}

#[tokio::test]
async fn a_breaker_trips_on_failures_reported_through_two_replicas_and_holds_on_both() {
    let redis = RedisServer::start().await;
    let (one, two) = (replica(&redis.url(), 1).await, replica(&redis.url(), 1).await);
    let _held = register_spread(&[&one, &two], "cb").await;
    let (mut first, mut second) = (one.client().await, two.client().await);
    first.report(vec![failure("cb", "b"), failure("cb", "b")]).await.expect("report");
    wait_stats(&two, "cb", "b", |r| r.successive_failures == 2).await;
    assert!(two.server.balancer().stats().report("cb", "b").tripped_for.is_none(), "two failures trip nothing");
    // The third failure, through the other replica, trips the breaker there at once ...
    second.report(vec![failure("cb", "b")]).await.expect("report");
    assert!(two.server.balancer().stats().report("cb", "b").tripped_for.is_some(), "the fleet's third failure");
    // ... and replica one honours it.
    wait_stats(&one, "cb", "b", |r| r.tripped_for.is_some()).await;
    for _ in 0..6 {
        let picked = pick(&mut first, "cb", PickOptions::rule("best_available")).await;
        assert_ne!(picked_id(&picked), "b", "a tripped instance was picked");
    }
}

#[tokio::test]
async fn load_aware_rules_weigh_the_picks_in_flight_on_other_replicas() {
    let redis = RedisServer::start().await;
    let (one, two) = (replica(&redis.url(), 1).await, replica(&redis.url(), 1).await);
    let _held = register_spread(&[&one, &two], "load").await;
    let mut first = one.client().await;
    // Three unreported picks of `a` on replica one.
    for _ in 0..3 {
        let only_a = PickOptions::rule("round_robin").exclude(["b", "c"]);
        assert_eq!(picked_id(&pick(&mut first, "load", only_a).await), "a");
    }
    wait_stats(&two, "load", "a", |r| r.load.in_flight == 3).await;
    // Replica two's least-loaded picks go to b and c, idle fleet-wide, never to a.
    let ids = picked_sorted(&two, "load", "best_available", 4).await;
    assert_eq!(ids, ["b", "b", "c", "c"], "best_available weighed replica one's picks");
    wait_stats(&one, "load", "b", |r| r.load.in_flight == 2).await;
}

/// Waits until `server` answers GetPolicy for `service` with `rule`.
async fn wait_policy(server: &TestServer, service: &str, rule: &str) -> pb::Policy {
    let mut client = server.client().await;
    tokio::time::timeout(PATIENCE, async {
        loop {
            let policy = client.get_policy(service).await.expect("GetPolicy");
            if policy.rule == rule {
                return policy;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("{service}'s rule never became {rule}"))
}

#[tokio::test]
async fn a_policy_set_on_one_replica_applies_on_all_and_a_reset_anywhere_drops_it() {
    let redis = RedisServer::start().await;
    let (one, two) = (replica(&redis.url(), 1).await, replica(&redis.url(), 1).await);
    let _held = register_spread(&[&one, &two], "pol").await;
    let policy = pb::Policy { service: "pol".into(), rule: "repeat(n=3)".into(), ..Default::default() };
    one.client().await.set_policy(policy).await.expect("SetPolicy");
    let seen = wait_policy(&two, "pol", "repeat(n=3)").await;
    assert_eq!(seen.source, pb::PolicySource::Runtime as i32);
    // Picks without a rule follow the shared override on both replicas, in one rotation.
    let mut consumers = clients(&[&one, &two]).await;
    let mut sequence = String::new();
    for i in 0..9 {
        sequence.push_str(&picked_id(&pick(&mut consumers[i % 2], "pol", PickOptions::default()).await));
    }
    assert_eq!(sequence, "aaabbbccc");
    two.client().await.reset_policy("pol").await.expect("ResetPolicy");
    let back = wait_policy(&one, "pol", "round_robin").await;
    assert_eq!(back.source, pb::PolicySource::Default as i32);
}

#[tokio::test]
async fn gray_release_is_exact_across_replicas() {
    let redis = RedisServer::start().await;
    let (one, two) = (replica(&redis.url(), 1).await, replica(&redis.url(), 1).await);
    let _stable = one.register(vec![instance("gray", "s1", 1), instance("gray", "s2", 2)]).await;
    let _canary = two.register(vec![crate::harness::versioned("gray", "c1", 3, "v2")]).await;
    for server in [&one, &two] {
        wait_instances(server, "gray", &["c1", "s1", "s2"]).await;
    }
    let mut gray = pb::GrayRelease { unversioned: 3, ..Default::default() };
    gray.versions.insert("v2".into(), 1);
    let policy =
        pb::Policy { service: "gray".into(), rule: "round_robin".into(), gray: Some(gray), ..Default::default() };
    one.client().await.set_policy(policy).await.expect("SetPolicy");
    let mut client = two.client().await;
    tokio::time::timeout(PATIENCE, async {
        while client.get_policy("gray").await.expect("GetPolicy").gray.is_none() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the gray release reaches replica two");
    let mut consumers = clients(&[&one, &two]).await;
    let mut canary = Vec::new();
    for i in 0..40 {
        if picked_id(&pick(&mut consumers[i % 2], "gray", PickOptions::default()).await) == "c1" {
            canary.push(i);
        }
    }
    // One gray schedule for the fleet: every fourth pick, whichever replica answers it (with a
    // schedule per replica, each replica's fourth pick would be every eighth of the fleet's).
    assert_eq!(canary.len(), 10, "{canary:?}");
    assert!(canary.windows(2).all(|w| w[1] - w[0] == 4), "not every fourth pick: {canary:?}");
}

/// One pick of the shared rule script: rule, key, zone, version.
type Step = (&'static str, &'static str, &'static str, &'static str);

/// The same picks, in order, on `server`: `id@ticket` of each.
async fn run_script(server: &TestServer, service: &str, script: &[Step]) -> Vec<String> {
    let mut client = server.client().await;
    let mut answers = Vec::new();
    for (rule, key, zone, version) in script {
        let options = PickOptions::rule(*rule).key(*key).zone(*zone).version(*version);
        let picked = pick(&mut client, service, options).await;
        answers.push(format!("{rule}:{}@{}", picked_id(&picked), picked.ticket));
    }
    answers
}

#[tokio::test]
async fn every_deterministic_rule_answers_the_same_sequence_on_memory_on_redis_and_on_a_redis_cluster() {
    let (redis, cluster) = (RedisServer::start().await, RedisCluster::start(3).await);
    let memory = TestServer::start().await;
    let shared = replica(&redis.url(), 1).await;
    let clustered = replica(&cluster.url(), 1).await;
    let instances = || {
        let zoned = |id: &str, port: u32, zone: &str, weight: u32| pb::Instance {
            zone: zone.into(),
            weight: Some(weight),
            ..instance("suite", id, port)
        };
        vec![
            zoned("a", 1, "east", 100),
            zoned("b", 2, "east", 200),
            zoned("c", 3, "west", 300),
            crate::harness::versioned("suite", "z", 4, "zlt"),
        ]
    };
    let _on_memory = memory.register(instances()).await;
    let _on_redis = shared.register(instances()).await;
    let _on_cluster = clustered.register(instances()).await;
    let mut script: Vec<Step> = Vec::new();
    for rule in [
        "round_robin",
        "repeat(n=3)",
        "weighted",
        "best_available",
        "availability_filtering",
        "retry(rule=round_robin)",
    ] {
        script.extend(std::iter::repeat_n((rule, "", "", ""), 12));
    }
    script.extend(std::iter::repeat_n(("zone_avoidance", "", "west", ""), 6));
    script.extend(std::iter::repeat_n(("round_robin", "", "", "zlt"), 3));
    for key in ["u1", "u2", "u3", "u4", "u1", "u2", "u3", "u4"] {
        script.push(("consistent_hash", key, "", ""));
        script.push(("sticky", key, "", ""));
    }
    let on_memory = run_script(&memory, "suite", &script).await;
    let on_redis = run_script(&shared, "suite", &script).await;
    assert_eq!(on_memory.len(), script.len());
    assert_eq!(
        on_memory[..6],
        [
            "round_robin:a@0",
            "round_robin:b@1",
            "round_robin:c@2",
            "round_robin:a@3",
            "round_robin:b@4",
            "round_robin:c@5"
        ]
    );
    assert_eq!(on_redis, on_memory, "the Redis backend answers as the in-process one");
    let on_cluster = run_script(&clustered, "suite", &script).await;
    assert_eq!(on_cluster, on_memory, "on a Redis Cluster too");
}

#[tokio::test]
async fn replicas_on_a_redis_cluster_share_rotations_ids_policies_and_breakers() {
    let cluster = RedisCluster::start(3).await;
    let (one, two) = (replica(&cluster.url(), 1).await, replica(&cluster.url(), 1).await);
    let mut consumers = clients(&[&one, &two]).await;
    // Services whose keys hash to different slots, so to different nodes of the cluster.
    let services = ["orders", "payments", "search", "users"];
    let mut held = Vec::new();
    for service in services {
        held.extend(register_spread(&[&one, &two], service).await);
        let mut sequence = String::new();
        for i in 0..6 {
            let picked = pick(&mut consumers[i % 2], service, PickOptions::rule("repeat(n=2)")).await;
            sequence.push_str(&picked_id(&picked));
        }
        assert_eq!(sequence, "aabbcc", "{service}: one rotation across replicas on the cluster");
    }
    let mut sizes = Vec::new();
    for node in &cluster.nodes {
        sizes.push(node.query::<u64>(&["DBSIZE"]).await.expect("DBSIZE"));
    }
    assert!(sizes.iter().filter(|n| **n > 0).count() >= 2, "keys spread over the nodes: {sizes:?}");
    // Ids announced on both replicas at once get one owner.
    race_for_ids(&one, &two, "claimed", 6).await;
    // A policy set through one replica applies on the other.
    let policy = pb::Policy { service: "orders".into(), rule: "repeat(n=3)".into(), ..Default::default() };
    one.client().await.set_policy(policy).await.expect("SetPolicy");
    wait_policy(&two, "orders", "repeat(n=3)").await;
    // Failures reported through both replicas trip one breaker, honoured by both.
    consumers[0].report(vec![failure("users", "b"), failure("users", "b")]).await.expect("report");
    wait_stats(&two, "users", "b", |r| r.successive_failures == 2).await;
    consumers[1].report(vec![failure("users", "b")]).await.expect("report");
    wait_stats(&one, "users", "b", |r| r.tripped_for.is_some()).await;
}

/// The replication offset `field` (`master_repl_offset`, `slave_repl_offset`) in `INFO replication`.
async fn repl_offset(node: &RedisServer, field: &str) -> Option<u64> {
    let info: String = node.query(&["INFO", "replication"]).await.ok()?;
    info.lines().find_map(|line| line.strip_prefix(field)?.strip_prefix(':')?.trim().parse().ok())
}

#[tokio::test]
async fn a_replica_follows_a_cluster_failover_without_a_failed_pick_or_a_repeated_ticket() {
    // Three primaries with a replica each, which takes over a primary silent for a second.
    let mut cluster = RedisCluster::start_with(3, 1, 1000).await;
    let server = replica(&cluster.url(), 1).await;
    let _held = register_spread(&[&server], "failover").await;
    let counter = "rota:{failover}:ticket:version=:round_robin";
    let mut client = server.client().await;
    let mut tickets = Vec::new();
    for _ in 0..3 {
        tickets.push(pick(&mut client, "failover", PickOptions::rule("round_robin")).await.ticket);
    }
    let (primary, secondary) = cluster.primary_and_replica_of(counter).await;
    // The replica must have caught up with the counter before its primary dies.
    let written = repl_offset(&cluster.nodes[primary], "master_repl_offset").await.expect("the primary's offset");
    tokio::time::timeout(PATIENCE, async {
        while repl_offset(&cluster.nodes[secondary], "slave_repl_offset").await.is_none_or(|copied| copied < written) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the replica copies the counter");

    cluster.nodes[primary].kill();
    // Picks never fail: while the slot has no primary they draw on the replica's local floor,
    // and once the cluster has promoted the replica, on it.
    let promoted = &cluster.nodes[secondary];
    let on_new_primary = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            tickets.push(pick(&mut client, "failover", PickOptions::rule("round_robin")).await.ticket);
            let stored: Option<u64> = promoted.query(&["GET", counter]).await.unwrap_or(None);
            if stored.is_some_and(|n| n > 3) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(on_new_primary.is_ok(), "rota never drew on the promoted replica ({} picks)", tickets.len());
    let mut sorted = tickets.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), tickets.len(), "no ticket repeated through the failover: {tickets:?}");
}

/// Picks of one consumer under load: (phase when the pick started, ticket), and any failure.
struct Tally {
    picks: Vec<(u8, u64)>,
    failures: Vec<String>,
}

#[tokio::test]
async fn under_load_redis_dies_and_returns_without_a_failed_pick_or_a_ticket_drawn_twice_after() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};

    let mut redis = RedisServer::start().await;
    let (one, two) = (replica(&redis.url(), 1).await, replica(&redis.url(), 1).await);
    let _a = one.register(vec![instance("storm", "a", 1)]).await;
    let _b = two.register(vec![instance("storm", "b", 2)]).await;
    for server in [&one, &two] {
        wait_instances(server, "storm", &["a", "b"]).await;
    }
    let phase = Arc::new(AtomicU8::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let (count_tx, mut count) = tokio::sync::watch::channel(0usize);
    let count_tx = Arc::new(count_tx);
    let mut tasks = Vec::new();
    for (n, mut client) in clients(&[&one, &two, &one, &two]).await.into_iter().enumerate() {
        let (phase, stop, count_tx) = (phase.clone(), stop.clone(), count_tx.clone());
        tasks.push(tokio::spawn(async move {
            let mut tally = Tally { picks: Vec::new(), failures: Vec::new() };
            while !stop.load(Ordering::Relaxed) {
                let started = phase.load(Ordering::Relaxed);
                match client.pick("storm", PickOptions::rule("round_robin")).await {
                    Ok(picked) => tally.picks.push((started, picked.ticket)),
                    Err(error) => tally.failures.push(error.to_string()),
                }
                count_tx.send_modify(|c| *c += 1);
            }
            (n % 2, tally)
        }));
    }
    let counter = count.clone();
    let at_least = |n: usize| {
        let mut count = counter.clone();
        async move {
            tokio::time::timeout(PATIENCE, count.wait_for(|c| *c >= n)).await.expect("picks go on").expect("counting");
        }
    };
    let seen = *count.borrow_and_update();
    at_least(seen + 100).await;
    redis.kill();
    phase.store(1, Ordering::Relaxed);
    wait_link(&one, false).await;
    wait_link(&two, false).await;
    let seen = *count.borrow_and_update();
    at_least(seen + 100).await;
    redis.restart().await;
    wait_link(&one, true).await;
    wait_link(&two, true).await;
    phase.store(2, Ordering::Relaxed);
    let seen = *count.borrow_and_update();
    at_least(seen + 200).await;
    stop.store(true, Ordering::Relaxed);
    let mut by_replica: [Vec<(u8, u64)>; 2] = [Vec::new(), Vec::new()];
    for task in tasks {
        let (replica, tally) = task.await.expect("consumer");
        assert!(tally.failures.is_empty(), "failed picks: {:?}", tally.failures);
        by_replica[replica].extend(tally.picks);
    }
    let all: Vec<(u8, u64)> = by_replica.iter().flatten().copied().collect();
    let before = all.iter().filter(|(p, _)| *p == 0).map(|(_, t)| *t).max().expect("picks before the outage");
    let mut after: Vec<u64> = all.iter().filter(|(p, _)| *p == 2).map(|(_, t)| *t).collect();
    assert!(after.iter().all(|t| *t > before), "a ticket from before the outage was drawn again");
    for picks in &by_replica {
        let outage = picks.iter().filter(|(p, _)| *p == 1).map(|(_, t)| *t).max().unwrap_or(0);
        assert!(
            picks.iter().filter(|(p, _)| *p == 2).all(|(_, t)| *t > outage),
            "a replica drew again a ticket it handed out during the outage"
        );
    }
    let drawn = after.len();
    after.sort_unstable();
    after.dedup();
    assert_eq!(after.len(), drawn, "a ticket was drawn twice after recovery");
    // The table reconverges: a registration after the restart reaches the other replica.
    let _c = one.register(vec![instance("storm", "c", 3)]).await;
    wait_instances(&two, "storm", &["a", "b", "c"]).await;
}

#[tokio::test]
async fn under_load_a_replica_dies_and_the_survivor_fails_no_pick_and_drops_only_its_instances() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    let redis = RedisServer::start().await;
    let (one, two) = (replica(&redis.url(), 1).await, replica(&redis.url(), 1).await);
    let _a = one.register(vec![instance("survive", "a", 1)]).await;
    let _b = two.register(vec![instance("survive", "b", 2), instance("survive", "c", 3)]).await;
    wait_instances(&two, "survive", &["a", "b", "c"]).await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    // Three consumers on the survivor, one on the replica that dies (it stops at its first error).
    for (n, mut client) in clients(&[&two, &two, &two, &one]).await.into_iter().enumerate() {
        let (stop, doomed) = (stop.clone(), n == 3);
        tasks.push(tokio::spawn(async move {
            let (mut tickets, mut failures) = (Vec::new(), Vec::new());
            while !stop.load(Ordering::Relaxed) {
                match client.pick("survive", PickOptions::rule("round_robin")).await {
                    Ok(pick) => tickets.push(pick.into_response().ticket),
                    Err(_) if doomed => break,
                    Err(error) => failures.push(error.to_string()),
                }
            }
            (tickets, failures)
        }));
    }
    // Replica one dies: its sharing stops without a word to Redis.
    drop(one);
    wait_instances(&two, "survive", &["b", "c"]).await;
    stop.store(true, Ordering::Relaxed);
    let mut tickets = Vec::new();
    for task in tasks {
        let (theirs, failures) = task.await.expect("consumer");
        assert!(failures.is_empty(), "the survivor failed picks: {failures:?}");
        tickets.extend(theirs);
    }
    assert!(!tickets.is_empty(), "no pick was made while the replica died");
    let drawn = tickets.len();
    tickets.sort_unstable();
    tickets.dedup();
    assert_eq!(tickets.len(), drawn, "a ticket of the shared rotation was handed out twice across the replicas");
    let ids = picked_sorted(&two, "survive", "round_robin", 4).await;
    assert_eq!(ids, ["b", "b", "c", "c"], "only the dead replica's instance left");
}

/// Applies a Watch event to the instance ids it describes.
fn apply(ids: &mut BTreeSet<String>, event: &pb::WatchEvent) {
    match &event.event {
        Some(pb::watch_event::Event::Snapshot(list)) => *ids = list.instances.iter().map(|i| i.id.clone()).collect(),
        Some(pb::watch_event::Event::Added(added)) => {
            ids.insert(added.id.clone());
        }
        Some(pb::watch_event::Event::Removed(removed)) => {
            ids.remove(&removed.id);
        }
        Some(pb::watch_event::Event::Updated(_)) | None => {}
    }
}

/// Follows `events` into `ids` until they are exactly `wanted`; returns the events read. Fails
/// if that takes longer than `within`.
async fn watch_until(
    events: &mut tonic::Streaming<pb::WatchEvent>,
    ids: &mut BTreeSet<String>,
    wanted: &[&str],
    within: Duration,
) -> Vec<pb::WatchEvent> {
    let wanted: BTreeSet<String> = wanted.iter().map(|id| id.to_string()).collect();
    let mut read = Vec::new();
    let reached = tokio::time::timeout(within, async {
        while *ids != wanted {
            let event = events.message().await.expect("watch stream").expect("the watch went on");
            apply(ids, &event);
            read.push(event);
        }
    })
    .await;
    assert!(reached.is_ok(), "the watch held {ids:?}, not {wanted:?}, after {within:?}: {read:?}");
    read
}

/// A registration of `instance` through the rota at `endpoint`, all accepted.
async fn register_on(endpoint: &str, instance: pb::Instance) -> rota::client::Registration {
    let mut client = RotaClient::connect(endpoint).await.expect("client connects");
    let registration = client.register(vec![instance]).await.expect("register");
    registration.require_all_accepted().expect("accepted");
    registration
}

async fn watch_on(endpoint: &str, service: &str) -> tonic::Streaming<pb::WatchEvent> {
    RotaClient::connect(endpoint).await.expect("client connects").watch(service).await.expect("watch")
}

#[tokio::test]
async fn under_load_a_killed_replica_process_costs_the_survivor_no_pick_and_only_its_instance() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use crate::processes::serve;

    let redis = RedisServer::start().await;
    let url = redis.url();
    // A generous Redis timeout, as for the in-process replicas: a slow machine is no outage.
    let args = ["--state", url.as_str(), "--state-timeout", "5s"];
    let mut doomed = serve("127.0.0.1:0", &args);
    let survivor = serve("127.0.0.1:0", &args);
    let _a = register_on(&doomed.endpoint, instance("killed", "a", 1)).await;
    let _b = register_on(&survivor.endpoint, instance("killed", "b", 2)).await;
    // Both replicas see both instances.
    watch_until(&mut watch_on(&doomed.endpoint, "killed").await, &mut BTreeSet::new(), &["a", "b"], PATIENCE).await;
    let mut events = watch_on(&survivor.endpoint, "killed").await;
    let mut ids = BTreeSet::new();
    let mut seen = watch_until(&mut events, &mut ids, &["a", "b"], PATIENCE).await;

    // Consumers pick in a loop, three from the survivor and one from the replica about to be
    // killed (it stops at its first error); each reports its first pick before the kill.
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let (started_tx, mut started) = tokio::sync::mpsc::channel(4);
    let mut tasks = Vec::new();
    for endpoint in [&survivor.endpoint, &survivor.endpoint, &survivor.endpoint, &doomed.endpoint] {
        let mut client = RotaClient::connect(endpoint).await.expect("client connects");
        let (stop, answered, started_tx) = (stop.clone(), answered.clone(), started_tx.clone());
        let on_doomed = *endpoint == doomed.endpoint;
        tasks.push(tokio::spawn(async move {
            let (mut picked, mut tickets, mut failures) = (Vec::new(), Vec::new(), Vec::new());
            while !stop.load(Ordering::Relaxed) {
                match client.pick("killed", PickOptions::rule("round_robin")).await {
                    Ok(pick) => {
                        let response = pick.into_response();
                        tickets.push(response.ticket);
                        if !on_doomed {
                            picked.push(picked_id(&response));
                            answered.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Err(_) if on_doomed => break,
                    Err(error) => failures.push(error.to_string()),
                }
                if tickets.len() + failures.len() == 1 {
                    let _ = started_tx.send(()).await;
                }
            }
            (picked, tickets, failures)
        }));
    }
    for _ in 0..4 {
        tokio::time::timeout(PATIENCE, started.recv()).await.expect("every consumer picked").expect("consumer");
    }

    // SIGKILL: the process says nothing to Redis or to anyone.
    doomed.kill().expect("the replica process is killed");
    let at_kill = answered.load(Ordering::Relaxed);
    seen.extend(watch_until(&mut events, &mut ids, &["b"], REPLICA_LEASE + PATIENCE).await);
    stop.store(true, Ordering::Relaxed);
    assert!(answered.load(Ordering::Relaxed) > at_kill, "no pick was answered while the replica's lease ran out");
    let mut all_tickets = Vec::new();
    for task in tasks {
        let (picked, tickets, failures) =
            tokio::time::timeout(PATIENCE, task).await.expect("the consumer stops").expect("consumer");
        assert!(failures.is_empty(), "the survivor failed picks: {failures:?}");
        assert!(picked.iter().all(|id| id == "a" || id == "b"), "{picked:?}");
        all_tickets.extend(tickets);
    }
    let drawn = all_tickets.len();
    all_tickets.sort_unstable();
    all_tickets.dedup();
    assert_eq!(all_tickets.len(), drawn, "a ticket of the shared rotation was handed out twice across the replicas");
    // The survivor's own instance was never removed nor changed, and is all it answers now.
    let touched: Vec<_> = seen
        .iter()
        .filter(|event| match &event.event {
            Some(pb::watch_event::Event::Removed(removed)) => removed.id == "b",
            Some(pb::watch_event::Event::Updated(updated)) => updated.id == "b",
            _ => false,
        })
        .collect();
    assert!(touched.is_empty(), "the survivor's own instance was touched: {touched:?}");
    let mut client = RotaClient::connect(&survivor.endpoint).await.expect("client connects");
    for _ in 0..4 {
        assert_eq!(picked_id(&pick(&mut client, "killed", PickOptions::rule("round_robin")).await), "b");
    }
}

/// Redis 200 ms away, well inside the 500 ms command timeout: registrations are written and
/// picks answered through it without the link ever going down (each timeout covers one round
/// trip, never several in a row).
#[tokio::test]
async fn a_redis_slower_than_a_round_trip_but_inside_the_timeout_keeps_the_link_up() {
    let redis = RedisServer::start().await;
    let (slow, _proxy) = far_replica(&redis, Duration::from_millis(500)).await;
    let direct = replica(&redis.url(), 1).await;

    let provider = slow.register(vec![instance("far", "a", 1), instance("far", "b", 2)]).await;
    wait_instances(&direct, "far", &["a", "b"]).await;
    let mut client = slow.client().await;
    for _ in 0..20 {
        client.pick("far", PickOptions::default()).await.unwrap();
    }
    provider.close().await.unwrap();
    wait_instances(&direct, "far", &[]).await;

    let link = slow.server.balancer().state().link().expect("a Redis-backed replica");
    assert!(link.is_up(), "the link is up");
    assert_eq!(link.recoveries(), 1, "the link never went down (it came up once)");
}

/// Redis restarts empty with the fleet well into a rotation: a replica that never drew from it
/// resumes above every ticket the other handed out, and so does the other; no ticket repeats.
#[tokio::test]
async fn after_redis_loses_its_data_no_replica_hands_out_a_ticket_given_out_before() {
    let mut redis = RedisServer::start().await;
    let (drew, never) = (replica(&redis.url(), 1).await, replica(&redis.url(), 1).await);
    let _held = register_spread(&[&drew, &never], "lost").await;
    let mut drawing = drew.client().await;
    let mut before = Vec::new();
    for _ in 0..40 {
        before.push(pick(&mut drawing, "lost", PickOptions::rule("round_robin")).await.ticket);
    }
    assert_eq!(before, (0..40).collect::<Vec<u64>>());
    let links = [&drew, &never].map(|s| s.server.balancer().state().link().unwrap().clone());
    let ups = links.each_ref().map(|l| l.recoveries());
    redis.restart().await;
    for (link, up) in links.iter().zip(ups) {
        let mut watch = link.watch();
        tokio::time::timeout(PATIENCE, watch.wait_for(|now| *now && link.recoveries() > up))
            .await
            .expect("the link came back")
            .unwrap();
    }
    let mut other = never.client().await;
    let mut after = Vec::new();
    for _ in 0..10 {
        after.push(pick(&mut other, "lost", PickOptions::rule("round_robin")).await.ticket);
        after.push(pick(&mut drawing, "lost", PickOptions::rule("round_robin")).await.ticket);
    }
    assert!(after.iter().all(|t| *t >= 40), "a ticket handed out before came again: {after:?}");
    let distinct: std::collections::BTreeSet<u64> = after.iter().copied().collect();
    assert_eq!(distinct.len(), after.len(), "no ticket twice: {after:?}");
    // One replica or both (when they looked at once) found the loss; both hold a floor above it.
    assert!(links.iter().map(|l| l.losses()).sum::<u64>() >= 1, "the loss was found");
    assert!(links.iter().all(|l| l.ticket_floor() >= 40), "both follow a generation above the old tickets");
}

/// Redis restarts empty: every replica key and holders entry is gone at once, yet no replica
/// is dead. A replica's copy of another's instances stays while the other writes itself back,
/// so picks never find the service empty.
#[tokio::test]
async fn instances_held_by_another_replica_stay_pickable_when_redis_loses_its_data() {
    let mut redis = RedisServer::start().await;
    // The holder is 200 ms of round trip away, so it is back in Redis well after the reader.
    let (holder, _proxy) = far_replica(&redis, Duration::from_secs(2)).await;
    let reader = replica(&redis.url(), 1).await;
    let _provider = holder.register(vec![instance("kept", "a", 1), instance("kept", "b", 2)]).await;
    wait_instances(&reader, "kept", &["a", "b"]).await;
    let mut snapshots = reader.server.balancer().registry().subscribe("kept").await.expect("registry runs");
    snapshots.borrow_and_update();
    redis.restart().await;
    // Until the holder has written itself back and 3 s have passed (several polls past the
    // reader's return), every change the reader's registry publishes still lists both, and
    // every pick answers.
    let mut client = reader.client().await;
    let started = tokio::time::Instant::now();
    let written_back = || async {
        let holders: Vec<String> = redis.query(&["SMEMBERS", "rota:{kept}:holders"]).await.unwrap_or_default();
        match holders.first() {
            Some(h) => redis.query::<u64>(&["HLEN", &format!("rota:{{kept}}:instances:{h}")]).await.unwrap_or(0) >= 2,
            None => false,
        }
    };
    let mut picks = 0;
    while started.elapsed() < Duration::from_secs(3) || !written_back().await {
        assert!(started.elapsed() < PATIENCE, "the holder did not write its instances back");
        if snapshots.has_changed().unwrap_or(false) {
            let ids: Vec<String> = snapshots.borrow_and_update().instances.iter().map(|i| i.id.to_string()).collect();
            assert_eq!(ids, ["a", "b"], "the reader's copy changed while Redis was empty");
        }
        let picked = client.pick("kept", PickOptions::default()).await.expect("a pick answers");
        assert!(matches!(picked.into_response().instance.unwrap().id.as_str(), "a" | "b"));
        picks += 1;
    }
    assert!(picks > 10, "{picks} picks");
    let link = reader.server.balancer().state().link().unwrap();
    assert!(link.is_up() && link.recoveries() >= 2, "the reader's link came back");
}

/// A reset made on one replica while Redis is away is not undone when Redis comes back empty
/// and another replica, later to reconnect, writes its older copy of the override again.
#[tokio::test]
async fn a_reset_made_during_an_outage_survives_an_older_override_written_after_it() {
    let mut redis = RedisServer::start().await;
    // Replica one is 200 ms of round trip away: it reconnects, and writes, after replica two.
    let (one, _proxy) = far_replica(&redis, Duration::from_secs(2)).await;
    let two = replica(&redis.url(), 1).await;
    let policy = pb::Policy { service: "undo".into(), rule: "random".into(), ..Default::default() };
    one.client().await.set_policy(policy).await.expect("SetPolicy");
    wait_policy(&two, "undo", "random").await;

    redis.kill();
    wait_link(&two, false).await;
    wait_link(&one, false).await;
    two.client().await.reset_policy("undo").await.expect("ResetPolicy while Redis is away");
    let one_link = one.server.balancer().state().link().unwrap().clone();
    let ups = one_link.recoveries();
    redis.restart().await;
    wait_link(&two, true).await;
    let mut watch = one_link.watch();
    tokio::time::timeout(PATIENCE, watch.wait_for(|up| *up && one_link.recoveries() > ups))
        .await
        .expect("replica one came back")
        .unwrap();
    // Replica one writes its override again within a poll and a few round trips of coming
    // back, and reads what Redis holds: the reset reaches it, and then holds for 3 s on both
    // replicas and in Redis.
    wait_policy(&one, "undo", "round_robin").await;
    let back = tokio::time::Instant::now();
    let (mut first, mut second) = (one.client().await, two.client().await);
    while back.elapsed() < Duration::from_secs(3) {
        for client in [&mut first, &mut second] {
            let policy = client.get_policy("undo").await.expect("GetPolicy");
            assert_eq!(policy.rule, "round_robin", "the reset was undone: {policy:?}");
        }
        tokio::task::yield_now().await;
    }
    let stored: Option<String> = redis.query(&["HGET", "rota:{~fleet}:policies", "undo"]).await.unwrap();
    assert!(stored.as_deref().is_some_and(|v| v.ends_with(":-")), "a tombstone in Redis: {stored:?}");
}
