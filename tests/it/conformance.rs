//! Runs every scenario in `clients/conformance/scenarios/` through the Rust client, as every
//! other client's suite does: against one live in-process server, except the scenarios that stop
//! their server (the local fallback ones), which each get a `rota serve` process of their own,
//! killed and started again on the same address as the scenario says.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use rota::client::{ClientError, PickOptions, Registration, RotaClient, code_name};
use rota::pb::{self, register_request::Msg};
use serde::Deserialize;

use crate::harness::{PATIENCE, TestServer, picked_id};
use crate::processes::{Serving, serve};

/// The rota a scenario talks to: the shared in-process server, or a process of its own.
struct Target {
    endpoint: String,
    process: Option<Serving>,
}

impl Target {
    fn shared(server: &TestServer) -> Self {
        Self { endpoint: server.server.endpoint(), process: None }
    }

    /// `rota serve` on a free loopback port, with no warm-up.
    fn own() -> Self {
        let process = serve("127.0.0.1:0", &[]);
        Self { endpoint: process.endpoint.clone(), process: Some(process) }
    }

    /// Kills the process and reaps it: its port is closed.
    fn stop(&mut self) -> Result<(), String> {
        let mut process = self.process.take().ok_or("stop_server needs a server of the scenario's own")?;
        process.kill().map_err(|e| e.to_string())?;
        Ok(())
    }

    /// Starts the process again on the same address.
    fn start(&mut self, warmup: &str) -> Result<(), String> {
        if self.process.is_some() {
            return Err("start_server while the server runs".into());
        }
        let listen = self.endpoint.trim_start_matches("http://").to_owned();
        let process = serve(&listen, &["--warmup", warmup]);
        if process.endpoint != self.endpoint {
            return Err(format!("restarted on {}, expected {}", process.endpoint, self.endpoint));
        }
        self.process = Some(process);
        Ok(())
    }
}

async fn connect(target: &Target) -> RotaClient {
    RotaClient::connect(&target.endpoint).await.expect("client connects")
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Scenario {
    name: String,
    #[serde(default = "one")]
    connections: usize,
    steps: Vec<Step>,
}

fn one() -> usize {
    1
}

#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum Step {
    Register {
        stream: String,
        instances: Vec<InstanceJson>,
        expect_accepted: Option<Vec<String>>,
        #[serde(default)]
        expect_refused: Vec<RefusedJson>,
    },
    Withdraw {
        stream: String,
    },
    Pick {
        #[serde(default)]
        connection: usize,
        request: RequestJson,
        expect: PickExpectation,
    },
    PickSequence {
        connections: Vec<usize>,
        request: RequestJson,
        count: usize,
        expect_ids: Vec<String>,
        expect_fallback: Option<bool>,
        expect_tickets: Option<Vec<u64>>,
        expect_rule: Option<String>,
        expect_local: Option<bool>,
    },
    List {
        service: String,
        expect_ids: Vec<String>,
    },
    Update {
        stream: String,
        service: String,
        id: String,
        status: Option<String>,
        weight: Option<u32>,
    },
    Report {
        #[serde(default)]
        connection: usize,
        outcomes: Vec<OutcomeJson>,
        expect_accepted: Option<u32>,
        expect_ignored: Option<u32>,
    },
    Lease {
        #[serde(default)]
        connection: usize,
        request: LeaseRequestJson,
        expect: LeaseExpectation,
    },
    Watch {
        watch: String,
        #[serde(default)]
        connection: usize,
        service: String,
    },
    WatchExpect {
        watch: String,
        events: Vec<EventJson>,
    },
    Follow {
        #[serde(default)]
        connection: usize,
        service: String,
        expect_ids: Vec<String>,
    },
    StopServer {},
    StartServer {
        warmup: String,
    },
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct OutcomeJson {
    service: String,
    instance_id: String,
    ticket: u64,
    rule: String,
    latency_us: u64,
    result: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct LeaseRequestJson {
    service: String,
    rule: String,
    version: String,
    count: u32,
    exclude: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LeaseExpectation {
    first_ticket: u64,
    count: u32,
    ids: Vec<String>,
    positions: Option<Vec<u32>>,
    rule: Option<String>,
    fallback: Option<bool>,
}

/// One expected watch event: exactly one of `snapshot`, `added`, `updated`, `removed`.
#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct EventJson {
    snapshot: Option<Vec<String>>,
    added: Option<String>,
    updated: Option<String>,
    removed: Option<String>,
    status: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct InstanceJson {
    service: String,
    id: String,
    host: String,
    port: u32,
    version: String,
    zone: String,
    weight: Option<u32>,
    metadata: BTreeMap<String, String>,
    status: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RefusedJson {
    id: String,
    code: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RequestJson {
    service: String,
    rule: String,
    version: String,
    key: String,
    zone: String,
    exclude: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PickExpectation {
    id: Option<String>,
    fallback: Option<bool>,
    ticket: Option<u64>,
    rule: Option<String>,
    local: Option<bool>,
    error: Option<String>,
    message_contains: Option<String>,
    unreachable: Option<bool>,
}

impl InstanceJson {
    fn to_pb(&self) -> pb::Instance {
        let status = match self.status.as_deref() {
            None => pb::InstanceStatus::Unspecified,
            Some(name) => pb::InstanceStatus::from_str_name(name).expect("status name in scenario"),
        };
        pb::Instance {
            id: self.id.clone(),
            service: self.service.clone(),
            host: self.host.clone(),
            port: self.port,
            version: self.version.clone(),
            zone: self.zone.clone(),
            weight: self.weight,
            metadata: self.metadata.clone().into_iter().collect(),
            status: status.into(),
            ..Default::default()
        }
    }
}

impl RequestJson {
    fn options(&self) -> PickOptions {
        PickOptions {
            rule: self.rule.clone(),
            version: self.version.clone(),
            key: self.key.clone(),
            zone: self.zone.clone(),
            exclude: self.exclude.clone(),
        }
    }
}

fn scenario_files() -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients/conformance/scenarios");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("scenario folder")
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
}

fn code_of(error: &ClientError) -> String {
    error.code().map(code_name).unwrap_or("(no status)").to_owned()
}

async fn run(target: &mut Target, scenario: &Scenario) -> Result<(), String> {
    let mut connections = Vec::new();
    for _ in 0..scenario.connections {
        connections.push(connect(target).await);
    }
    let mut streams: HashMap<String, Registration> = HashMap::new();
    let mut watches: HashMap<String, tonic::Streaming<pb::WatchEvent>> = HashMap::new();
    for (index, step) in scenario.steps.iter().enumerate() {
        let fail = |what: String| format!("step {index}: {what}");
        match step {
            Step::Register { stream, instances, expect_accepted, expect_refused } => {
                let instances: Vec<pb::Instance> = instances.iter().map(InstanceJson::to_pb).collect();
                let ack = match streams.get_mut(stream) {
                    Some(registration) => registration
                        .send(Msg::Announce(pb::Announce { instances: instances.clone() }))
                        .await
                        .map_err(|e| fail(e.to_string()))?,
                    None => {
                        let mut client: RotaClient = connect(target).await;
                        let registration = client.register(instances.clone()).await.map_err(|e| fail(e.to_string()))?;
                        let ack = registration.ack().clone();
                        streams.insert(stream.clone(), registration);
                        ack
                    }
                };
                let accepted: Vec<String> = ack.accepted.iter().map(|r| r.id.clone()).collect();
                let expected_accepted = match expect_accepted {
                    Some(ids) => ids.clone(),
                    None => instances.iter().map(|i| i.id.clone()).collect(),
                };
                if accepted != expected_accepted {
                    return Err(fail(format!("accepted {accepted:?}, expected {expected_accepted:?}")));
                }
                let mut refused: Vec<(String, String)> = ack
                    .refused
                    .iter()
                    .map(|r| {
                        let id = r.instance.as_ref().map(|i| i.id.clone()).unwrap_or_default();
                        (id, code_name(tonic::Code::from(r.code)).to_owned())
                    })
                    .collect();
                let mut expected: Vec<(String, String)> =
                    expect_refused.iter().map(|r| (r.id.clone(), r.code.clone())).collect();
                refused.sort();
                expected.sort();
                if refused != expected {
                    return Err(fail(format!("refused {refused:?}, expected {expected:?}")));
                }
            }
            Step::Withdraw { stream } => {
                let registration = streams.remove(stream).ok_or_else(|| fail(format!("no stream {stream:?}")))?;
                registration.close().await.map_err(|e| fail(e.to_string()))?;
            }
            Step::Pick { connection, request, expect } => {
                let client = &mut connections[*connection];
                match (client.pick(&request.service, request.options()).await, &expect.error) {
                    (Ok(picked), None) => {
                        if let Some(id) = &expect.id
                            && picked_id(&picked) != *id
                        {
                            return Err(fail(format!("picked {:?}, expected {id:?}", picked_id(&picked))));
                        }
                        if let Some(ticket) = expect.ticket
                            && picked.ticket != ticket
                        {
                            return Err(fail(format!("ticket {}, expected {ticket}", picked.ticket)));
                        }
                        if let Some(fallback) = expect.fallback
                            && picked.fallback.is_empty() == fallback
                        {
                            return Err(fail(format!("fallback {:?}, expected {fallback}", picked.fallback)));
                        }
                        if let Some(rule) = &expect.rule
                            && picked.rule != *rule
                        {
                            return Err(fail(format!("rule {:?}, expected {rule:?}", picked.rule)));
                        }
                        if picked.local_fallback != expect.local.unwrap_or(false) {
                            return Err(fail(format!(
                                "local_fallback {}, expected {:?}",
                                picked.local_fallback, expect.local
                            )));
                        }
                    }
                    (Ok(picked), Some(code)) => {
                        return Err(fail(format!("picked {:?}, expected {code}", picked_id(&picked))));
                    }
                    (Err(error), Some(code)) => {
                        if code_of(&error) != *code {
                            return Err(fail(format!("got {error}, expected {code}")));
                        }
                        if let Some(text) = &expect.message_contains
                            && !error.to_string().contains(text.as_str())
                        {
                            return Err(fail(format!("{error:?} does not mention {text:?}")));
                        }
                        if let Some(unreachable) = expect.unreachable
                            && error.is_unreachable() != unreachable
                        {
                            return Err(fail(format!("{error}: unreachable is not {unreachable}")));
                        }
                    }
                    (Err(error), None) => return Err(fail(format!("pick failed: {error}"))),
                }
            }
            Step::PickSequence {
                connections: which,
                request,
                count,
                expect_ids,
                expect_fallback,
                expect_tickets,
                expect_rule,
                expect_local,
            } => {
                let local = expect_local.unwrap_or(false);
                let mut ids = Vec::new();
                let mut tickets = Vec::new();
                for i in 0..*count {
                    let client = &mut connections[which[i % which.len()]];
                    let picked =
                        client.pick(&request.service, request.options()).await.map_err(|e| fail(e.to_string()))?;
                    if let Some(fallback) = expect_fallback
                        && picked.fallback.is_empty() == *fallback
                    {
                        return Err(fail(format!("pick {i}: fallback {:?}, expected {fallback}", picked.fallback)));
                    }
                    if let Some(rule) = expect_rule
                        && picked.rule != *rule
                    {
                        return Err(fail(format!("pick {i}: rule {:?}, expected {rule:?}", picked.rule)));
                    }
                    if picked.local_fallback != local {
                        return Err(fail(format!(
                            "pick {i}: local_fallback {}, expected {local}",
                            picked.local_fallback
                        )));
                    }
                    ids.push(picked_id(&picked));
                    tickets.push(picked.ticket);
                }
                if ids != *expect_ids {
                    return Err(fail(format!("picked {ids:?}, expected {expect_ids:?}")));
                }
                if let Some(expected) = expect_tickets
                    && tickets != *expected
                {
                    return Err(fail(format!("tickets {tickets:?}, expected {expected:?}")));
                }
            }
            Step::List { service, expect_ids } => {
                let listing = connections[0].list_instances(service).await.map_err(|e| fail(e.to_string()))?;
                let ids: Vec<String> = listing.instances.into_iter().map(|i| i.id).collect();
                if ids != *expect_ids {
                    return Err(fail(format!("listed {ids:?}, expected {expect_ids:?}")));
                }
            }
            Step::Update { stream, service, id, status, weight } => {
                let registration = streams.get_mut(stream).ok_or_else(|| fail(format!("no stream {stream:?}")))?;
                let status = match status.as_deref() {
                    None => pb::InstanceStatus::Unspecified,
                    Some(name) => pb::InstanceStatus::from_str_name(name)
                        .ok_or_else(|| fail(format!("unknown status {name:?}")))?,
                };
                let update = pb::Update {
                    instance: Some(pb::InstanceRef { service: service.clone(), id: id.clone() }),
                    weight: *weight,
                    status: status.into(),
                    metadata: None,
                };
                let ack = registration.send(Msg::Update(update)).await.map_err(|e| fail(e.to_string()))?;
                let accepted: Vec<&str> = ack.accepted.iter().map(|r| r.id.as_str()).collect();
                if accepted != [id.as_str()] || !ack.refused.is_empty() {
                    return Err(fail(format!("update acked {ack:?}, expected {id:?} accepted")));
                }
            }
            Step::Report { connection, outcomes, expect_accepted, expect_ignored } => {
                let outcomes = outcomes
                    .iter()
                    .map(|o| {
                        let result = pb::CallResult::from_str_name(&format!("CALL_RESULT_{}", o.result))
                            .ok_or_else(|| fail(format!("unknown result {:?}", o.result)))?;
                        Ok(pb::CallOutcome {
                            service: o.service.clone(),
                            instance_id: o.instance_id.clone(),
                            ticket: o.ticket,
                            rule: o.rule.clone(),
                            latency_us: o.latency_us,
                            result: result.into(),
                            leased: false,
                        })
                    })
                    .collect::<Result<Vec<_>, String>>()?;
                let sent = outcomes.len() as u32;
                let answer = connections[*connection].report(outcomes).await.map_err(|e| fail(e.to_string()))?;
                let (accepted, ignored) = (expect_accepted.unwrap_or(sent), expect_ignored.unwrap_or(0));
                if (answer.accepted, answer.ignored) != (accepted, ignored) {
                    return Err(fail(format!(
                        "report accepted {} ignored {}, expected {accepted} and {ignored}",
                        answer.accepted, answer.ignored
                    )));
                }
            }
            Step::Lease { connection, request, expect } => {
                let lease = pb::LeaseRequest {
                    service: request.service.clone(),
                    rule: request.rule.clone(),
                    version: request.version.clone(),
                    count: request.count,
                    exclude: request.exclude.clone(),
                };
                let client = &mut connections[*connection];
                let lease = client.request(lease);
                let leased = client.balancer().lease(lease).await.map_err(|e| fail(e.to_string()))?.into_inner();
                let ids: Vec<String> = leased.instances.iter().map(|i| i.id.clone()).collect();
                if (leased.first_ticket, leased.count, &ids) != (expect.first_ticket, expect.count, &expect.ids) {
                    return Err(fail(format!(
                        "leased tickets {}+{} over {ids:?}, expected {}+{} over {:?}",
                        leased.first_ticket, leased.count, expect.first_ticket, expect.count, expect.ids
                    )));
                }
                if let Some(positions) = &expect.positions
                    && leased.positions != *positions
                {
                    return Err(fail(format!("lease positions {:?}, expected {positions:?}", leased.positions)));
                }
                if let Some(rule) = &expect.rule
                    && leased.rule != *rule
                {
                    return Err(fail(format!("lease rule {:?}, expected {rule:?}", leased.rule)));
                }
                if let Some(fallback) = expect.fallback
                    && leased.fallback.is_empty() == fallback
                {
                    return Err(fail(format!("lease fallback {:?}, expected {fallback}", leased.fallback)));
                }
            }
            Step::Watch { watch, connection, service } => {
                let stream = connections[*connection].watch(service).await.map_err(|e| fail(e.to_string()))?;
                watches.insert(watch.clone(), stream);
            }
            Step::WatchExpect { watch, events } => {
                let stream = watches.get_mut(watch).ok_or_else(|| fail(format!("no watch {watch:?}")))?;
                for (n, expected) in events.iter().enumerate() {
                    let event = tokio::time::timeout(PATIENCE, stream.message())
                        .await
                        .map_err(|_| fail(format!("event {n}: none within {PATIENCE:?}")))?
                        .map_err(|e| fail(format!("event {n}: {e}")))?
                        .ok_or_else(|| fail(format!("event {n}: the watch ended")))?;
                    let got = describe(&event);
                    let want = expected.describe().map_err(|e| fail(format!("event {n}: {e}")))?;
                    if got != want {
                        return Err(fail(format!("event {n}: got {got}, expected {want}")));
                    }
                }
            }
            Step::Follow { connection, service, expect_ids } => {
                let client = &connections[*connection];
                let followed = async {
                    client.follow(service).await;
                    client
                        .wait_followed(service, |instances| instances.iter().map(|i| &i.id).eq(expect_ids.iter()))
                        .await
                };
                if tokio::time::timeout(PATIENCE, followed).await.is_err() {
                    let kept: Option<Vec<String>> =
                        client.followed(service).map(|list| list.into_iter().map(|i| i.id).collect());
                    return Err(fail(format!("kept {kept:?} after {PATIENCE:?}, expected {expect_ids:?}")));
                }
            }
            Step::StopServer {} => {
                target.stop().map_err(fail)?;
                // The providers are gone with the server: end their streams without withdrawing.
                streams.clear();
            }
            Step::StartServer { warmup } => target.start(warmup).map_err(fail)?,
        }
    }
    Ok(())
}

fn status_name(value: i32) -> &'static str {
    pb::InstanceStatus::try_from(value).map(|s| s.as_str_name()).unwrap_or("?")
}

/// A watch event as `kind ids` (with `status` for updates), comparable with [`EventJson`].
fn describe(event: &pb::WatchEvent) -> String {
    use pb::watch_event::Event;
    match &event.event {
        Some(Event::Snapshot(list)) => {
            format!("snapshot {:?}", list.instances.iter().map(|i| i.id.as_str()).collect::<Vec<_>>())
        }
        Some(Event::Added(i)) => format!("added {:?}", i.id),
        Some(Event::Updated(i)) => format!("updated {:?} {}", i.id, status_name(i.status)),
        Some(Event::Removed(r)) => format!("removed {:?}", r.id),
        None => "nothing".into(),
    }
}

impl EventJson {
    fn describe(&self) -> Result<String, String> {
        let described = match (&self.snapshot, &self.added, &self.updated, &self.removed) {
            (Some(ids), None, None, None) => {
                format!("snapshot {:?}", ids.iter().map(String::as_str).collect::<Vec<_>>())
            }
            (None, Some(id), None, None) => format!("added {id:?}"),
            (None, None, Some(id), None) => {
                format!("updated {id:?} {}", self.status.as_deref().unwrap_or("UP"))
            }
            (None, None, None, Some(id)) => format!("removed {id:?}"),
            _ => return Err("an event names exactly one of snapshot, added, updated, removed".into()),
        };
        Ok(described)
    }
}

/// Whether a scenario needs a server of its own (it stops the server).
fn needs_own_server(scenario: &Scenario) -> bool {
    scenario.steps.iter().any(|step| matches!(step, Step::StopServer {}))
}

/// Runs `scenario` against the shared server, or a server of its own when it needs one.
async fn run_on(server: &TestServer, scenario: &Scenario) -> Result<(), String> {
    let mut target = if needs_own_server(scenario) { Target::own() } else { Target::shared(server) };
    run(&mut target, scenario).await
}

fn parse(file: &std::path::Path) -> Scenario {
    let text = std::fs::read_to_string(file).unwrap();
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

#[tokio::test]
async fn every_conformance_scenario_passes() {
    let server = TestServer::start().await;
    let files = scenario_files();
    assert!(files.len() >= 14, "scenarios found: {files:?}");
    let mut failures = Vec::new();
    let mut own_server = Vec::new();
    for file in &files {
        let scenario = parse(file);
        if needs_own_server(&scenario) {
            own_server.push(file.file_stem().unwrap().to_string_lossy().into_owned());
        }
        if let Err(failure) = run_on(&server, &scenario).await {
            failures.push(format!("{} ({}): {failure}", scenario.name, file.display()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // The local fallback scenarios ran too, each on a server of its own.
    assert!(own_server.iter().any(|name| name.starts_with("fallback")), "own servers for {own_server:?}");
}

/// The runner is not a rubber stamp: a wrong expectation in any kind of step fails the scenario
/// at that step.
#[tokio::test]
async fn the_runner_fails_a_wrong_expectation() {
    let server = TestServer::start().await;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients/conformance/scenarios");
    // (scenario, the JSON text to replace, its wrong replacement, the failing step)
    let cases = [
        ("shared_round_robin.json", r#""ticket": 9"#, r#""ticket": 8"#, "step 2"),
        ("withdraw_mid_rotation.json", "[2, 3, 4, 5]", "[2, 3, 4, 6]", "step 6"),
        ("lease.json", r#""first_ticket": 0"#, r#""first_ticket": 1"#, "step 1"),
        ("watch.json", r#"{"removed": "a"}"#, r#"{"removed": "b"}"#, "step"),
        ("fallback.json", r#""ticket": 4, "local": true"#, r#""ticket": 3, "local": true"#, "step 9"),
        ("fallback.json", r#""expect_local": true,"#, r#""expect_local": false,"#, "step 7"),
        ("fallback.json", r#""unreachable": true"#, r#""unreachable": false"#, "step 14"),
        ("fallback_restart.json", r#""ticket": 0, "local": false"#, r#""ticket": 0, "local": true"#, "step 8"),
    ];
    for (name, right, wrong, step) in cases {
        let text = std::fs::read_to_string(dir.join(name)).unwrap();
        assert!(text.contains(right), "{name} no longer contains {right}");
        // Service names get a suffix so the broken copy does not share rotations with others.
        let broken = text.replacen(right, wrong, 1).replace("\"service\": \"conf-", "\"service\": \"broken-conf-");
        let scenario: Scenario = serde_json::from_str(&broken).unwrap();
        let failure = run_on(&server, &scenario).await.expect_err(name);
        assert!(failure.starts_with(step), "{name}: {failure}");
    }
}

#[test]
fn scenario_files_with_unknown_keys_are_refused() {
    for (text, misspelt) in [
        (r#"{"name": "x", "steps": [], "conections": 2}"#, "conections"),
        (
            r#"{"name": "x", "steps": [{"op": "pick", "request": {"service": "s"}, "expect": {"id": "a", "tiket": 1}}]}"#,
            "tiket",
        ),
        (
            r#"{"name": "x", "steps": [{"op": "pick_sequence", "connections": [0], "count": 1, "request": {"service": "s"}, "expect_ids": ["a"], "expect_ticket": [0]}]}"#,
            "expect_ticket",
        ),
        (
            r#"{"name": "x", "steps": [{"op": "pick", "request": {"service": "s", "zones": "z"}, "expect": {"id": "a"}}]}"#,
            "zones",
        ),
        (r#"{"name": "x", "steps": [{"op": "stop_server", "now": true}]}"#, "now"),
    ] {
        let error = serde_json::from_str::<Scenario>(text).expect_err(misspelt).to_string();
        assert!(error.contains(misspelt), "{error}");
    }
}
