//! Policies over gRPC with a real policy file: the file's layer, runtime overrides, reloads.

use rota::client::{PickOptions, RotaClient};
use rota::pb;
use rota::policy::file::PolicyReloads;
use tokio::sync::watch;
use tonic::Code;

use crate::admin::get;
use crate::harness::{PATIENCE, TestServer, instance};

fn policy_file(name: &str, text: &str) -> std::path::PathBuf {
    // Under cargo's scratch folder for integration tests (inside target/), not the system's.
    let dir =
        std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("rota-it-{}-policy-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rota.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Replaces the file at once (a rename), so the server's poll never reads it half written.
fn rewrite(path: &std::path::Path, text: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, text).unwrap();
    std::fs::rename(&next, path).unwrap();
}

/// Waits until the reloader has looked at the file `applied` and `refused` times in all.
async fn reloaded(reloads: &mut watch::Receiver<PolicyReloads>, applied: u64, refused: u64) {
    let seen = tokio::time::timeout(PATIENCE, reloads.wait_for(|r| r.applied >= applied && r.refused >= refused))
        .await
        .expect("the reloader saw the change in time")
        .map(|r| *r)
        .expect("the reloader is running");
    assert_eq!(seen, PolicyReloads { applied, refused }, "one reload per change");
}

async fn rule_and_source(client: &mut RotaClient, service: &str) -> (String, pb::PolicySource) {
    let policy = client.get_policy(service).await.unwrap();
    assert_eq!(policy.is_default, policy.source() == pb::PolicySource::Default, "{policy:?}");
    let source = policy.source();
    (policy.rule, source)
}

async fn picked_rule(client: &mut RotaClient, service: &str) -> String {
    client.pick(service, PickOptions::default()).await.unwrap().into_response().rule
}

#[tokio::test]
async fn runtime_overrides_survive_policy_file_reloads_until_reset() {
    use pb::PolicySource::{Default, File, Runtime};
    let path =
        policy_file("layers", "[services.orders]\nrule = \"repeat(n=2)\"\n[services.payments]\nrule = \"weighted\"\n");
    let server = TestServer::start_with(|config| config.policy_file = Some(path.clone())).await;
    let mut reloads = server.server.policy_reloads().expect("a policy file is configured");
    let _provider = server.register(vec![instance("orders", "a", 1), instance("orders", "b", 2)]).await;
    let mut admin = server.client().await;

    assert_eq!(rule_and_source(&mut admin, "orders").await, ("repeat(n=2)".into(), File));
    assert_eq!(rule_and_source(&mut admin, "payments").await, ("weighted".into(), File));
    assert_eq!(rule_and_source(&mut admin, "other").await, ("round_robin".into(), Default));

    let set = pb::Policy { service: "orders".into(), rule: "random".into(), ..pb::Policy::default() };
    let stored = admin.set_policy(set).await.unwrap();
    assert_eq!((stored.rule.as_str(), stored.source(), stored.is_default), ("random", Runtime, false));
    assert_eq!(picked_rule(&mut admin, "orders").await, "random");

    // The file changes orders, drops payments and sets new defaults.
    rewrite(&path, "[defaults]\nrule = \"weighted\"\n[services.orders]\nrule = \"repeat(n=3)\"\n");
    reloaded(&mut reloads, 1, 0).await;
    assert_eq!(rule_and_source(&mut admin, "orders").await, ("random".into(), Runtime), "the override stays");
    assert_eq!(picked_rule(&mut admin, "orders").await, "random");
    assert_eq!(rule_and_source(&mut admin, "payments").await, ("weighted".into(), Default));
    let listing = admin.list_policies().await.unwrap();
    let defaults = listing.defaults.unwrap();
    assert_eq!((defaults.rule.as_str(), defaults.source()), ("weighted", Default));
    let entries: Vec<_> = listing.services.iter().map(|p| (p.service.as_str(), p.rule.as_str(), p.source())).collect();
    assert_eq!(entries, [("orders", "random", Runtime)]);
    let (_, metrics) = get(server.server.admin_addr().unwrap(), "/metrics").await;
    for series in ["rota_policy_overrides 1", "rota_policy_reloads_total{result=\"applied\"} 1"] {
        assert!(metrics.lines().any(|l| l == series), "no {series:?} in\n{metrics}");
    }

    // Dropping the override: the reloaded file's policy applies, to picks too.
    let now = admin.reset_policy("orders").await.unwrap();
    assert_eq!((now.service.as_str(), now.rule.as_str(), now.source()), ("orders", "repeat(n=3)", File));
    assert_eq!(picked_rule(&mut admin, "orders").await, "repeat(n=3)");
    let entries: Vec<_> = admin.list_policies().await.unwrap().services.into_iter().map(|p| p.source()).collect();
    assert_eq!(entries, [File]);
    let (_, metrics) = get(server.server.admin_addr().unwrap(), "/metrics").await;
    assert!(metrics.lines().any(|l| l == "rota_policy_overrides 0"), "{metrics}");
}

#[tokio::test]
async fn bad_policy_calls_get_precise_codes_and_change_nothing() {
    let path = policy_file("refusals", "[services.orders]\nrule = \"repeat(n=2)\"\n");
    let server = TestServer::start_with(|config| config.policy_file = Some(path.clone())).await;
    let mut reloads = server.server.policy_reloads().expect("a policy file is configured");
    let mut admin = server.client().await;
    let short = pb::Policy {
        service: "payments".into(),
        breaker: Some(pb::Breaker { blackout_max_ms: 20_000, ..pb::Breaker::default() }),
        ..pb::Policy::default()
    };
    admin.set_policy(short).await.unwrap();
    let before = admin.list_policies().await.unwrap();

    let error = admin.reset_policy("orders").await.unwrap_err();
    assert_eq!(error.code(), Some(Code::NotFound));
    assert_eq!(
        error.to_string(),
        "NOT_FOUND: service \"orders\" has no runtime override to reset; the config file's policy of it applies"
    );
    let error = admin.reset_policy("").await.unwrap_err();
    assert_eq!(error.code(), Some(Code::InvalidArgument));
    assert!(error.to_string().starts_with("INVALID_ARGUMENT: service "), "{error}");
    let bad_name = pb::Policy { service: "a b".into(), rule: "random".into(), ..pb::Policy::default() };
    let error = admin.set_policy(bad_name).await.unwrap_err();
    assert_eq!(error.code(), Some(Code::InvalidArgument));
    assert!(error.to_string().starts_with("INVALID_ARGUMENT: policy.service "), "{error}");

    // A version name of 1 MiB is refused in a message of a few dozen bytes, not echoed whole.
    let long = pb::GrayRelease { unversioned: 1, versions: [("v".repeat(1 << 20), 1)].into() };
    let error = admin
        .set_policy(pb::Policy { service: "orders".into(), gray: Some(long), ..pb::Policy::default() })
        .await
        .unwrap_err();
    assert_eq!(error.code(), Some(Code::InvalidArgument));
    assert!(error.to_string().len() < 200 && error.to_string().contains("is 1048576 bytes long"), "{error}");
    assert_eq!(admin.list_policies().await.unwrap(), before, "nothing changed");

    // A file whose defaults the override cannot live with is refused whole.
    rewrite(&path, "[defaults]\nrule = \"random\"\nbreaker = { blackout_base = \"25s\" }\n");
    reloaded(&mut reloads, 0, 1).await;
    assert_eq!(admin.list_policies().await.unwrap(), before, "nothing changed");
    let (_, metrics) = get(server.server.admin_addr().unwrap(), "/metrics").await;
    assert!(metrics.lines().any(|l| l == "rota_policy_reloads_total{result=\"refused\"} 1"), "{metrics}");

    // Resetting that override lets the held-back file apply.
    let now = admin.reset_policy("payments").await.unwrap();
    assert_eq!((now.rule.as_str(), now.source()), ("random", pb::PolicySource::Default));
    assert_eq!(rule_and_source(&mut admin, "orders").await, ("random".into(), pb::PolicySource::Default));
}

/// A policy file replaced by a FIFO (a file that would block a reader forever) is refused at
/// once with a message saying what it is; the reloader goes on, picks go on, and the next
/// regular file applies.
#[cfg(unix)]
#[tokio::test]
async fn a_fifo_in_place_of_the_policy_file_is_refused_and_later_files_apply() {
    let path = policy_file("fifo", "[services.orders]\nrule = \"repeat(n=2)\"\n");
    let server = TestServer::start_with(|config| config.policy_file = Some(path.clone())).await;
    let mut reloads = server.server.policy_reloads().expect("a policy file is configured");
    let _provider = server.register(vec![instance("orders", "a", 1), instance("orders", "b", 2)]).await;
    let mut admin = server.client().await;

    let fifo = path.with_extension("fifo");
    let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0, "mkfifo");
    std::fs::rename(&fifo, &path).unwrap();
    reloaded(&mut reloads, 0, 1).await;
    assert_eq!(picked_rule(&mut admin, "orders").await, "repeat(n=2)", "the policies in force stay");

    rewrite(&path, "[services.orders]\nrule = \"random\"\n");
    reloaded(&mut reloads, 1, 1).await;
    assert_eq!(picked_rule(&mut admin, "orders").await, "random");
}
