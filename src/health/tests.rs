//! The prober's decisions on paused time, each check answered by a script instead of the
//! network: how many failures make an instance failing and how many passes bring it back, a
//! check that changes kind or is turned off, and an address rota does not check.

use std::collections::HashMap;
use std::sync::Mutex;

use super::*;
use crate::policy::{CheckKind, HealthCheckSpec, PolicySet, PolicySpec};
use crate::registry::{InstanceSpec, RegistryConfig};

const INTERVAL: Duration = Duration::from_secs(1);
/// How long each scripted check takes: a check's result lands this long after it was asked
/// for, so a test woken by the ask sees the results before it and none after.
const CHECK_TAKES: Duration = Duration::from_millis(100);
const SERVICE: &str = "svc";

/// Answers each check from a script per kind (`tcp`, `http`, `grpc`), in order (the last
/// answer again once the script runs out), and records every check asked for.
struct Script {
    answers: Mutex<HashMap<&'static str, Vec<Verdict>>>,
    asked: tokio::sync::watch::Sender<Vec<&'static str>>,
}

impl Script {
    fn new(answers: impl IntoIterator<Item = (&'static str, Vec<Verdict>)>) -> Arc<Self> {
        Arc::new(Self {
            answers: Mutex::new(answers.into_iter().collect()),
            asked: tokio::sync::watch::Sender::new(Vec::new()),
        })
    }

    /// Waits until `n` checks were asked for; the prober has then handled every result before
    /// the `n`th, and the `n`th has not come yet.
    async fn asked(&self, n: usize) -> Vec<&'static str> {
        self.asked.subscribe().wait_for(|asked| asked.len() >= n).await.unwrap().clone()
    }
}

impl Probe for Script {
    fn check(&self, check: &HealthCheck, _host: &str, _port: u16) -> futures_util::future::BoxFuture<'static, Verdict> {
        let kind = match check.kind {
            CheckKind::Tcp => "tcp",
            CheckKind::Http { .. } => "http",
            CheckKind::Grpc { .. } => "grpc",
        };
        let asked = self.asked.borrow().iter().filter(|k| **k == kind).count();
        let verdict = {
            let answers = self.answers.lock().unwrap();
            let script = &answers[kind];
            script.get(asked).or(script.last()).cloned().expect("a script for the kind")
        };
        self.asked.send_modify(|all| all.push(kind));
        Box::pin(async move {
            tokio::time::sleep(CHECK_TAKES).await;
            verdict
        })
    }
}

fn fail(why: &str) -> Verdict {
    Verdict::Fail(why.to_owned())
}

fn checked(kind: &str, path: Option<&str>) -> PolicySpec {
    PolicySpec {
        health_check: Some(HealthCheckSpec {
            kind: kind.into(),
            path: path.map(str::to_owned),
            interval: Some(INTERVAL),
            timeout: Some(INTERVAL),
            unhealthy_after: Some(3),
            healthy_after: Some(2),
        }),
        ..Default::default()
    }
}

/// A registry with one instance of `SERVICE` checked as `policy` says, by `script`.
async fn start(policy: PolicySpec, script: Arc<Script>) -> (Registry, Arc<Policies>, crate::registry::Lease) {
    let registry = Registry::spawn(RegistryConfig::default());
    let lease = registry.open_lease();
    let instance = InstanceSpec {
        id: "a".into(),
        service: SERVICE.into(),
        host: "127.0.0.1".into(),
        port: 8080,
        ..Default::default()
    };
    assert_eq!(lease.announce(vec![instance]).await.unwrap().accepted.len(), 1);
    let policies = Arc::new(Policies::new(PolicySet::default()));
    policies.set_service(SERVICE, policy).unwrap();
    let (_counters, _task) = spawn(registry.clone(), policies.clone(), None, script);
    (registry, policies, lease)
}

/// The instance's published status and verdict, once the registry has taken in every verdict
/// sent to it.
async fn state(registry: &Registry) -> (Status, Option<Health>) {
    registry.overrides().await.unwrap();
    let snapshot = registry.service(SERVICE).unwrap();
    let instance = &snapshot.instances[0];
    (instance.status, instance.conditions.as_ref().and_then(|c| c.health.clone()))
}

const PASSING: (Status, Option<Health>) = (Status::Up, Some(Health::Passing));

fn failing(why: &str) -> (Status, Option<Health>) {
    (Status::Down, Some(Health::Failing(why.into())))
}

#[tokio::test(start_paused = true)]
async fn unhealthy_after_failures_in_a_row_fail_an_instance_and_healthy_after_passes_bring_it_back() {
    let refused = "connect: connection refused";
    let answers = [
        Verdict::Pass,
        fail(refused),
        fail(refused),
        fail(refused),
        Verdict::Pass,
        Verdict::Pass,
        fail(refused),
        fail(refused),
        Verdict::Pass,
        fail(refused),
        fail(refused),
        fail(refused),
    ];
    let script = Script::new([("tcp", answers.to_vec())]);
    let (registry, _policies, _lease) = start(checked("tcp", None), script.clone()).await;
    let expected = [
        (1, PASSING),
        (2, PASSING), // one failure of three
        (3, PASSING), // two
        (4, failing(refused)),
        (5, failing(refused)), // one pass of two
        (6, PASSING),
        (7, PASSING),
        (8, PASSING),
        (9, PASSING), // a pass ends the run of failures
        (10, PASSING),
        (11, PASSING),
        (12, failing(refused)),
    ];
    for (results, state_then) in expected {
        script.asked(results + 1).await;
        assert_eq!(state(&registry).await, state_then, "after {results} results");
    }
}

#[tokio::test(start_paused = true)]
async fn turning_a_check_off_drops_its_verdict_and_its_checks() {
    let script = Script::new([("tcp", vec![fail("connect: connection refused")])]);
    let (registry, policies, _lease) = start(checked("tcp", None), script.clone()).await;
    script.asked(4).await;
    assert_eq!(state(&registry).await, failing("connect: connection refused"));
    policies.reset_service(SERVICE).unwrap();
    let mut published = registry.subscribe(SERVICE).await.unwrap();
    let cleared = tokio::time::timeout(
        POLICY_LOOK * 3,
        published.wait_for(|s| s.instances[0].status == Status::Up && s.instances[0].conditions.is_none()),
    )
    .await
    .is_ok_and(|r| r.is_ok());
    assert!(cleared, "the verdict of a check turned off stays: {:?}", state(&registry).await);
    let asked = script.asked(0).await.len();
    tokio::time::sleep(INTERVAL * 10).await;
    assert_eq!(script.asked(0).await.len(), asked, "no check after it was turned off");
}

#[tokio::test(start_paused = true)]
async fn a_check_that_changes_kind_starts_over_without_the_old_verdict() {
    let script =
        Script::new([("http", vec![fail("answered HTTP 503")]), ("grpc", vec![fail("gRPC health NOT_SERVING")])]);
    let (registry, policies, _lease) = start(checked("http", Some("/healthz")), script.clone()).await;
    script.asked(4).await;
    assert_eq!(state(&registry).await, failing("answered HTTP 503"));
    policies.set_service(SERVICE, checked("grpc", None)).unwrap();
    // The first gRPC check: the HTTP verdict is gone, and the instance is back as a new one.
    let grpc_first = |asked: &[&str]| asked.iter().position(|k| *k == "grpc").map(|i| i + 1);
    let first = loop {
        let asked = script.asked(script.asked(0).await.len() + 1).await;
        if let Some(at) = grpc_first(&asked) {
            break at;
        }
    };
    assert_eq!(state(&registry).await, (Status::Up, None), "the HTTP check's verdict was dropped");
    // Its own failures count from none: the third fails it, with its own reason.
    script.asked(first + 2).await;
    assert_eq!(state(&registry).await, (Status::Up, None));
    script.asked(first + 3).await;
    assert_eq!(state(&registry).await, failing("gRPC health NOT_SERVING"));
    // A change of path is another check too.
    policies.set_service(SERVICE, checked("grpc", Some("orders.v1.Orders"))).unwrap();
    let mut published = registry.subscribe(SERVICE).await.unwrap();
    let dropped = tokio::time::timeout(POLICY_LOOK * 3, published.wait_for(|s| s.instances[0].conditions.is_none()))
        .await
        .is_ok_and(|r| r.is_ok());
    assert!(dropped, "a check asking another gRPC service kept the verdict: {:?}", state(&registry).await);
}

#[tokio::test(start_paused = true)]
async fn an_address_rota_does_not_check_fails_at_its_first_check() {
    let why = "not checked: 127.0.0.1:8080 is rota's own admin listener";
    let script = Script::new([("tcp", vec![Verdict::Refused(why.into())])]);
    let (registry, _policies, _lease) = start(checked("tcp", None), script.clone()).await;
    script.asked(2).await;
    assert_eq!(state(&registry).await, failing(why), "unhealthy_after does not apply");
}
