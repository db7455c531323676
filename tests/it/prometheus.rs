//! rota as Prometheus sees it: `promtool check metrics` on a live scrape of a replica with
//! services, instances, picks, reports, a followed registry, an xDS stream and a second replica
//! on a shared Redis; the alert rules of `deploy/prometheus` checked and unit-tested with
//! `promtool`; and every metric the Grafana dashboard `deploy/grafana/rota.json` queries found
//! in that scrape. `scripts/install-promtool.sh` (run by `scripts/test.sh`) installs promtool;
//! without it, the promtool checks say so and pass.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use rota::client::PickOptions;
use rota::pb;
use rota::state::StateConfig;

use crate::harness::{TestServer, instance};
use crate::redis_server::RedisServer;

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// `promtool`, when installed.
fn promtool() -> Option<PathBuf> {
    let found =
        std::env::var_os("PATH")?.to_str()?.split(':').map(|dir| Path::new(dir).join("promtool")).find(|p| p.is_file());
    if found.is_none() {
        eprintln!("promtool is not installed (scripts/install-promtool.sh): its checks are skipped");
    }
    found
}

/// Runs promtool with `args`, `input` on its standard input; panics with its output unless it
/// succeeds.
fn run_promtool(promtool: &Path, args: &[&str], input: &str) {
    let mut child = Command::new(promtool)
        .args(args)
        .current_dir(repo("deploy/prometheus"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool starts");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let output = child.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "promtool {args:?}: {}\n{stdout}\n{stderr}", output.status);
}

/// A replica on `redis` with an instance of `orders` that consumers picked and reported on, a
/// DNS source whose resolver does not answer, and an open xDS stream; a second replica on the
/// same Redis holds a registration of its own. Returns the first replica's `/metrics` body once
/// the source is stale and the second replica's instance has reached it. The replicas and Redis
/// stop when the scrape is taken.
async fn busy_scrape() -> String {
    let redis = RedisServer::start().await;
    let state = || StateConfig::parse(&redis.url(), 1, Duration::from_secs(5)).expect("a valid state address");
    // A resolver on a loopback port nobody listens on: the source reads, fails, and is stale.
    let closed = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let dns = crate::sources::source("dns://api.orders.test:7000", |t| {
        t.services = Some(vec!["api".into()]);
        t.resolver = Some(closed.to_string());
        t.timeout = Some("200ms".into());
    });
    let one = TestServer::start_with(|c| {
        c.state = state();
        c.sources = vec![dns];
    })
    .await;
    let two = TestServer::start_with(|c| c.state = state()).await;
    let _here = one.register(vec![instance("orders", "a", 1), instance("orders", "b", 2)]).await;
    let _there = two.register(vec![instance("orders", "c", 3)]).await;
    let mut consumer = one.client().await;
    for _ in 0..6 {
        consumer.pick("orders", PickOptions::rule("round_robin")).await.expect("pick");
    }
    let outcome = pb::CallOutcome {
        service: "orders".into(),
        instance_id: "a".into(),
        latency_us: 1_500,
        result: pb::CallResult::Ok as i32,
        ..Default::default()
    };
    consumer.report(vec![outcome]).await.expect("report");
    let _ads = crate::xds::Ads::open(&one, None).await.expect("an ADS stream");
    crate::replicas::wait_instances(&one, "orders", &["a", "b", "c"]).await;
    crate::sources::wait_source_up(&one, false).await;
    let text = crate::harness::metrics(&one).await;
    text.split_once("\r\n\r\n").expect("a complete response").1.to_owned()
}

/// The metric names an exposition declares (`# TYPE`, a histogram with its `_bucket`, `_sum`
/// and `_count`) or has samples of.
fn exposed(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines().filter(|line| !line.is_empty()) {
        match line.strip_prefix("# TYPE ") {
            Some(declared) => {
                let (name, kind) = declared.split_once(' ').unwrap();
                names.insert(name.to_owned());
                if kind == "histogram" {
                    names.extend(["_bucket", "_sum", "_count"].map(|suffix| format!("{name}{suffix}")));
                }
            }
            None if line.starts_with('#') => {}
            None => {
                names.insert(line.split(['{', ' ']).next().unwrap().to_owned());
            }
        }
    }
    names
}

#[tokio::test]
async fn promtool_accepts_a_busy_replicas_metrics() {
    let text = busy_scrape().await;
    for family in
        ["rota_build_info{", "rota_pick_duration_seconds_bucket{", "process_open_fds ", "rota_state_backend_up{"]
    {
        assert!(text.contains(family), "{family} in {text}");
    }
    assert!(text.contains("rota_instance_latency_seconds{service=\"orders\",instance_id=\"a\"} 0.0015"), "{text}");
    if let Some(promtool) = promtool() {
        run_promtool(&promtool, &["check", "metrics"], &text);
    }
}

#[test]
fn the_alert_rules_pass_promtool_check_and_their_unit_tests() {
    let Some(promtool) = promtool() else { return };
    run_promtool(&promtool, &["check", "rules", "rota-alerts.yaml"], "");
    run_promtool(&promtool, &["test", "rules", "rota-alerts.test.yaml"], "");
}

/// Every `rota_`, `grpc_` and `process_` metric name in a PromQL expression: the words outside
/// label matchers (`{...}`), strings, and the label lists of `by`, `without`, `on`, `ignoring`,
/// `group_left` and `group_right`.
fn queried(expr: &str, names: &mut BTreeSet<String>) {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut chars = expr.char_indices().peekable();
    let mut label_list = false;
    while let Some((at, c)) = chars.next() {
        let skip_to = |end: char, chars: &mut std::iter::Peekable<std::str::CharIndices>| {
            for (_, c) in chars.by_ref() {
                if c == end {
                    break;
                }
            }
        };
        match c {
            '{' => skip_to('}', &mut chars),
            '"' => skip_to('"', &mut chars),
            '(' if label_list => {
                skip_to(')', &mut chars);
                label_list = false;
            }
            c if c.is_ascii_alphabetic() || c == '_' => {
                let mut end = at + c.len_utf8();
                while let Some((i, c)) = chars.peek().copied().filter(|(_, c)| is_name(*c)) {
                    end = i + c.len_utf8();
                    chars.next();
                }
                let word = &expr[at..end];
                label_list = matches!(word, "by" | "without" | "on" | "ignoring" | "group_left" | "group_right");
                if ["rota_", "grpc_", "process_"].iter().any(|p| word.starts_with(p)) {
                    names.insert(word.to_owned());
                }
            }
            c if c.is_whitespace() => {}
            _ => label_list = false,
        }
    }
}

/// The PromQL of every panel target and template variable of a dashboard.
fn expressions(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, value) in map {
                match (key.as_str(), value) {
                    ("expr" | "query" | "definition", serde_json::Value::String(expr)) => out.push(expr.clone()),
                    _ => expressions(value, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|item| expressions(item, out)),
        _ => {}
    }
}

#[tokio::test]
async fn the_dashboard_queries_only_metrics_rota_exposes() {
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(repo("deploy/grafana/rota.json")).unwrap()).unwrap();
    let mut exprs = Vec::new();
    expressions(&dashboard, &mut exprs);
    let mut names = BTreeSet::new();
    exprs.iter().for_each(|expr| queried(expr, &mut names));
    assert!(names.len() >= 25, "the dashboard's queries name {names:?}");
    let exposed = exposed(&busy_scrape().await);
    let missing: Vec<_> = names.difference(&exposed).collect();
    assert!(missing.is_empty(), "the dashboard queries {missing:?}, which rota does not expose");
}

#[test]
fn names_are_read_from_promql_and_not_from_labels_or_functions() {
    let mut names = BTreeSet::new();
    queried(
        r#"histogram_quantile(0.9, sum by (le) (rate(rota_pick_duration_seconds_bucket{job="rota"}[5m]))) / my_rota_x + process_open_fds"#,
        &mut names,
    );
    queried(
        r#"sum by (grpc_method, grpc_code) (rate(grpc_server_handled_total{grpc_type="rota_x"}[1m])) > on (rota_label) group_left () rota:limit"#,
        &mut names,
    );
    let expected = ["grpc_server_handled_total", "process_open_fds", "rota_pick_duration_seconds_bucket"];
    assert_eq!(names, expected.map(str::to_owned).into());
}
