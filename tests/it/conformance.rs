//! Runs every scenario in `clients/conformance/scenarios/` through the Rust client, against one
//! live server, as every other client's suite does.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

use rota::client::{ClientError, PickOptions, Registration, RotaClient, code_name};
use rota::pb::{self, register_request::Msg};
use serde::Deserialize;

use crate::harness::{TestServer, picked_id};

#[derive(Debug, Deserialize)]
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
#[serde(tag = "op", rename_all = "snake_case")]
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
    },
    List {
        service: String,
        expect_ids: Vec<String>,
    },
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
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
struct RefusedJson {
    id: String,
    code: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RequestJson {
    service: String,
    rule: String,
    version: String,
    key: String,
    zone: String,
    exclude: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct PickExpectation {
    id: Option<String>,
    fallback: Option<bool>,
    ticket: Option<u64>,
    error: Option<String>,
    message_contains: Option<String>,
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

async fn run(server: &TestServer, scenario: &Scenario) -> Result<(), String> {
    let mut connections = Vec::new();
    for _ in 0..scenario.connections {
        connections.push(server.client().await);
    }
    let mut streams: HashMap<String, Registration> = HashMap::new();
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
                        let mut client: RotaClient = server.client().await;
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
                    }
                    (Err(error), None) => return Err(fail(format!("pick failed: {error}"))),
                }
            }
            Step::PickSequence { connections: which, request, count, expect_ids, expect_fallback } => {
                let mut ids = Vec::new();
                for i in 0..*count {
                    let client = &mut connections[which[i % which.len()]];
                    let picked =
                        client.pick(&request.service, request.options()).await.map_err(|e| fail(e.to_string()))?;
                    if let Some(fallback) = expect_fallback
                        && picked.fallback.is_empty() == *fallback
                    {
                        return Err(fail(format!("pick {i}: fallback {:?}, expected {fallback}", picked.fallback)));
                    }
                    ids.push(picked_id(&picked));
                }
                if ids != *expect_ids {
                    return Err(fail(format!("picked {ids:?}, expected {expect_ids:?}")));
                }
            }
            Step::List { service, expect_ids } => {
                let listing = connections[0].list_instances(service).await.map_err(|e| fail(e.to_string()))?;
                let ids: Vec<String> = listing.instances.into_iter().map(|i| i.id).collect();
                if ids != *expect_ids {
                    return Err(fail(format!("listed {ids:?}, expected {expect_ids:?}")));
                }
            }
        }
    }
    Ok(())
}

#[tokio::test]
async fn every_conformance_scenario_passes() {
    let server = TestServer::start().await;
    let files = scenario_files();
    assert!(files.len() >= 5, "scenarios found: {files:?}");
    let mut failures = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let scenario: Scenario = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        if let Err(failure) = run(&server, &scenario).await {
            failures.push(format!("{} ({}): {failure}", scenario.name, file.display()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
