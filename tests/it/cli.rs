//! The `rota` binary as a user runs it.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};

use crate::processes::{BIN, Serving, serve, serve_logged};

/// `rota register ARGS...` in the background, once it has printed its first line.
fn register_in_background(server: &Serving, args: &[&str]) -> (Child, String) {
    let mut child = Command::new(BIN)
        .arg("register")
        .args(args)
        .env("ROTA_SERVER", &server.endpoint)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    (child, line)
}

fn rota(server: &Serving, args: &[&str]) -> Output {
    Command::new(BIN).args(args).env("ROTA_SERVER", &server.endpoint).output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn register_pick_ls_and_withdraw_on_ctrl_c() {
    let server = serve("127.0.0.1:0", &[]);
    let (mut register, line) =
        register_in_background(&server, &["cli-svc", "127.0.0.1:7001", "--version", "zlt", "--meta", "team=pay"]);
    assert!(line.starts_with("registered 127.0.0.1:7001 in cli-svc"), "{line}");

    let picked = rota(&server, &["pick", "cli-svc", "--version", "zlt", "-n", "2"]);
    assert!(picked.status.success(), "{}", text(&picked.stderr));
    let out = text(&picked.stdout);
    assert_eq!(out.lines().count(), 3, "a header and two picks: {out}");
    assert!(out.lines().next().unwrap().starts_with("TICKET  INSTANCE"), "{out}");
    assert!(out.lines().skip(1).all(|l| l.contains("127.0.0.1:7001") && l.contains("version=zlt")), "{out}");

    let listed = rota(&server, &["ls", "cli-svc"]);
    let out = text(&listed.stdout);
    assert!(out.contains("127.0.0.1:7001") && out.contains("zlt") && out.contains("UP"), "{out}");
    assert!(out.lines().next().unwrap().ends_with("SOURCE       METADATA"), "{out}");
    // Registered over gRPC: no source; the metadata as announced.
    assert!(out.lines().nth(1).unwrap().ends_with(" -            team=pay"), "{out}");

    // Ctrl-C withdraws: the instance is gone and the service answers UNAVAILABLE.
    let interrupted = Command::new("kill").args(["-INT", &register.id().to_string()]).status().unwrap();
    assert!(interrupted.success());
    let status = register.wait().unwrap();
    assert!(status.success(), "register exits 0 after withdrawing");
    let unavailable = rota(&server, &["pick", "cli-svc", "--version", "zlt"]);
    assert!(!unavailable.status.success());
    assert!(text(&unavailable.stderr).starts_with("rota: UNAVAILABLE: "), "{}", text(&unavailable.stderr));
}

#[test]
fn errors_are_one_clear_line_and_a_failing_exit() {
    let server = serve("127.0.0.1:0", &[]);
    let output = rota(&server, &["pick", "never-seen"]);
    assert!(!output.status.success());
    assert_eq!(text(&output.stderr), "rota: NOT_FOUND: service \"never-seen\" has never been registered\n");

    let output = rota(&server, &["pick", "never-seen", "--rule", "zigzag"]);
    assert_eq!(
        text(&output.stderr),
        "rota: INVALID_ARGUMENT: rule \"zigzag\" is unknown; known rules: round_robin, random, repeat, weighted, slow_start, response_time, best_available, least_request, availability_filtering, zone_avoidance, consistent_hash, sticky, retry\n"
    );

    // A malformed version is refused, not quietly treated as unknown.
    let output = rota(&server, &["pick", "never-seen", "--version", "a b"]);
    assert_eq!(
        text(&output.stderr),
        "rota: INVALID_ARGUMENT: version contains ' '; only [A-Za-z0-9._:-] are allowed\n"
    );
    // `watch` answers a service never seen like `ls` does, instead of waiting silently.
    for command in ["ls", "watch"] {
        let output = rota(&server, &[command, "never-seen"]);
        assert!(!output.status.success());
        assert_eq!(text(&output.stderr), "rota: NOT_FOUND: service \"never-seen\" has never been registered\n");
    }
    let output = rota(&server, &["pick", "never-seen", "-n", "0"]);
    assert!(!output.status.success());
    assert!(text(&output.stderr).contains("0 is not in 1.."), "{}", text(&output.stderr));

    let output = rota(&server, &["register", "svc", "no-port-here"]);
    assert_eq!(text(&output.stderr), "rota: \"no-port-here\" is not HOST:PORT\n");

    let output = rota(&server, &["register", "svc", "127.0.0.1:0"]);
    assert_eq!(
        text(&output.stderr),
        "rota: INVALID_ARGUMENT: registration refused: announce.instances[0].port must be between 1 and 65535, got 0\n"
    );
}

#[test]
fn unreachable_server_is_reported_not_hung() {
    // A port that was just free: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let output =
        Command::new(BIN).args(["ls"]).env("ROTA_SERVER", format!("http://127.0.0.1:{port}")).output().unwrap();
    assert!(!output.status.success());
    // The message names the address and the cause, not just "transport error".
    let said = text(&output.stderr);
    assert!(said.starts_with(&format!("rota: cannot connect to rota at http://127.0.0.1:{port}: ")), "{said}");
    assert!(said.contains("Connection refused"), "{said}");
}

#[test]
fn invalid_settings_exit_64_before_binding() {
    let output =
        Command::new(BIN).args(["serve", "--listen", "127.0.0.1:0", "--heartbeat-timeout", "0s"]).output().unwrap();
    assert_eq!(output.status.code(), Some(64));
    assert!(text(&output.stdout).is_empty(), "nothing was bound");
    assert_eq!(
        text(&output.stderr),
        "rota: command line / environment: server.heartbeat_timeout: must be longer than zero\n"
    );
    let output = Command::new(BIN).args(["serve"]).env("ROTA_LISTEN", "127.0.0.1").output().unwrap();
    assert_eq!(output.status.code(), Some(64));
    assert!(
        text(&output.stderr).contains("server.listen: \"127.0.0.1\" is not an address"),
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn print_config_shows_file_then_environment_then_flags() {
    let path = temp_config(
        "print",
        "[server]\nlisten = \"127.0.0.1:6000\"\nheartbeat_timeout = \"20s\"\nshutdown_grace = \"4s\"\n[services.orders]\nrule = \"repeat\"\n",
    );
    let output = Command::new(BIN)
        .args(["serve", "--print-config", "--shutdown-grace", "3s", "--config"])
        .arg(&path)
        .env("ROTA_HEARTBEAT_TIMEOUT", "7s")
        .env("ROTA_SHUTDOWN_GRACE", "9s")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    let printed = text(&output.stdout);
    for line in [
        "listen = \"127.0.0.1:6000\"",
        "heartbeat_timeout = \"7s\"",
        // The warm-up defaults to the heartbeat timeout in force.
        "warmup = \"7s\"",
        "shutdown_grace = \"3s\"",
        "max_instances_per_stream = 1000",
        "[services.\"orders\"]",
        "rule = \"repeat(n=3)\"",
    ] {
        assert!(printed.lines().any(|l| l == line), "{line:?} missing from:\n{printed}");
    }
}

/// What `--print-config` writes, `[[source]]` tables and policies included, is a config file
/// rota reads back to the same settings.
#[test]
fn print_config_output_reads_back() {
    let path = temp_config("print-sources", "[services.orders]\nrule = \"repeat\"\n");
    let print = |config: &std::path::Path, extra: &[&str]| {
        let output = Command::new(BIN)
            .args(["serve", "--print-config"])
            .args(extra)
            .arg("--config")
            .arg(config)
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", text(&output.stderr));
        text(&output.stdout)
    };
    let first = print(&path, &["--source", "dns://api.test:9000?name=api&services=api"]);
    assert!(first.lines().any(|l| l == "[[source]]"), "{first}");
    let again = temp_config("print-sources-again", &first);
    assert_eq!(print(&again, &[]), first);
}

/// During the warm-up a service never seen is "not back yet" (UNAVAILABLE `warming_up`), not
/// NOT_FOUND; a bad warm-up value stops rota before it binds.
#[test]
fn a_warming_up_server_answers_unseen_services_unavailable() {
    let server = serve("127.0.0.1:0", &["--warmup", "1h"]);
    let output = rota(&server, &["pick", "not-back-yet"]);
    assert!(!output.status.success());
    let stderr = text(&output.stderr);
    assert!(stderr.starts_with("rota: UNAVAILABLE: rota started less than "), "{stderr}");
    assert!(stderr.contains("\"not-back-yet\""), "{stderr}");
    assert_eq!(text(&output.stdout), "", "a refused pick prints no table header");

    let output = Command::new(BIN).args(["serve", "--listen", "127.0.0.1:0", "--warmup", "soon"]).output().unwrap();
    assert_eq!(output.status.code(), Some(64));
    assert!(
        text(&output.stderr).starts_with("rota: command line / environment: server.warmup: \"soon\" is not a duration"),
        "{}",
        text(&output.stderr)
    );
}

/// The rows of the table `rota demo` prints: the lines that start with a pick number, split
/// into columns.
fn table_rows(out: &str) -> Vec<Vec<&str>> {
    out.lines()
        .filter(|l| l.split_whitespace().next().is_some_and(|w| w.parse::<u32>().is_ok()))
        .map(|l| l.split_whitespace().collect())
        .collect()
}

#[test]
fn demo_shows_shared_rotations() {
    let output = Command::new(BIN).arg("demo").output().unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    let out = text(&output.stdout);
    let rows = table_rows(&out);
    assert_eq!(rows.len(), 12, "{out}");
    let column = |c: usize| rows.iter().map(|r| r[c].trim_start_matches("orders-")).collect::<Vec<_>>().join("");
    assert_eq!(column(2), "abcabcabcabc");
    assert_eq!(column(3), "aaabbbcccaaa");
    assert_eq!(column(4), "zltzltzltzltzltzltzltzltzltzltzltzlt");
    assert!(out.contains("no instance with version \"nobody\""), "{out}");
}

/// Runs `rota ARGS...` to its end; asks it to stop (SIGTERM, then SIGKILL) and fails if it runs
/// longer than `within`.
fn output_within(args: &[&str], within: std::time::Duration) -> Output {
    let child = Command::new(BIN).args(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    // Not reaped until `wait_with_output` returns, so the pid stays this process's meanwhile.
    let pid = child.id().to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(child.wait_with_output()));
    if let Ok(output) = rx.recv_timeout(within) {
        return output.unwrap();
    }
    let _ = Command::new("kill").args(["-TERM", &pid]).status();
    if rx.recv_timeout(std::time::Duration::from_secs(5)).is_err() {
        let _ = Command::new("kill").args(["-KILL", &pid]).status();
    }
    panic!("rota {} did not finish within {within:?}", args.join(" "));
}

#[test]
fn demo_replicas_share_one_rotation_across_replicas() {
    let output = output_within(&["demo", "--replicas", "3"], std::time::Duration::from_secs(60));
    let out = text(&output.stdout);
    assert!(output.status.success(), "{}{out}", text(&output.stderr));
    for replica in 1..=3 {
        assert!(out.contains(&format!("replica {replica} on 127.0.0.1:")), "{out}");
    }
    // The providers registered through different replicas.
    let through: std::collections::BTreeSet<&str> =
        out.lines().filter(|l| l.starts_with("registered ")).filter_map(|l| l.split(" through ").nth(1)).collect();
    assert!(through.len() > 1, "providers all on one replica: {out}");
    let rows = table_rows(&out);
    assert_eq!(rows.len(), 12, "{out}");
    // Columns: pick, consumer, replica, round_robin, repeat(n=3), version=zlt, version=nobody.
    let replicas: Vec<&str> = rows.iter().map(|r| r[2]).collect();
    assert!(replicas.windows(2).all(|w| w[0] != w[1]), "consecutive picks on one replica: {replicas:?}");
    let mut distinct = replicas.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(distinct, ["1", "2", "3"], "every replica took picks");
    let column = |c: usize| rows.iter().map(|r| r[c].trim_start_matches("orders-")).collect::<Vec<_>>().join("");
    // A rotation per replica would give "aaabbbcccaaa" here (each replica's own a, b, c, a).
    assert_eq!(column(3), "abcabcabcabc", "{out}");
    // Per replica, "abcabcabcabc" (a, b, c, a on each of the three).
    assert_eq!(column(4), "aaabbbcccaaa", "{out}");
    assert_eq!(column(5), "zlt".repeat(12));
    // One counter per rule, whichever replica drew from it.
    let tickets = |rule: &str| {
        let line =
            out.lines().find(|l| l.split_whitespace().take(2).eq(["tickets", rule])).unwrap_or_else(|| panic!("{out}"));
        line.split_whitespace().skip(2).map(|t| t.parse::<u64>().unwrap()).collect::<Vec<_>>()
    };
    assert_eq!(tickets("round_robin"), (0..12).collect::<Vec<u64>>(), "{out}");
    assert_eq!(tickets("repeat(n=3)"), (0..12).collect::<Vec<u64>>(), "{out}");
    // The fallback draws from round_robin's rotation of the unversioned instances, and says so.
    assert_eq!(tickets("version=nobody"), (12..24).collect::<Vec<u64>>(), "{out}");
    assert!(out.contains("so it drew from that same rotation"), "{out}");
}

#[test]
fn demo_refuses_a_replica_count_outside_2_to_9() {
    for count in ["1", "10", "0", "three"] {
        let output = output_within(&["demo", "--replicas", count], std::time::Duration::from_secs(20));
        assert_eq!(output.status.code(), Some(2), "--replicas {count}");
        let stderr = text(&output.stderr);
        assert!(stderr.contains(&format!("invalid value '{count}' for '--replicas <N>'")), "{stderr}");
        assert!(text(&output.stdout).is_empty(), "nothing started for --replicas {count}");
    }
}

#[test]
fn demo_replicas_without_redis_server_says_to_install_it() {
    let output = Command::new(BIN).args(["demo", "--replicas", "2"]).env("PATH", "/nonexistent").output().unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("redis-server is not installed") && stderr.contains("install"), "{stderr}");
    assert!(text(&output.stdout).is_empty(), "no replica started");
}

fn temp_config(name: &str, text: &str) -> std::path::PathBuf {
    // Under cargo's scratch folder for integration tests (inside target/), not the system's.
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("rota-it-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rota.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn an_invalid_config_file_stops_serve_before_binding() {
    let path = temp_config("invalid", "[services.orders]\nrule = \"zigzag\"\n");
    let output = Command::new(BIN).args(["serve", "--listen", "127.0.0.1:0", "--config"]).arg(&path).output().unwrap();
    assert_eq!(output.status.code(), Some(64));
    assert!(text(&output.stdout).is_empty(), "nothing was bound");
    let stderr = text(&output.stderr);
    assert!(stderr.contains("rota.toml: services.orders.rule is invalid: rule \"zigzag\" is unknown"), "{stderr}");
}

/// `rota serve --config PATH` with its log (at info: each reload says whether it applied or
/// refused the file) read line by line.
fn serve_config(path: &std::path::Path) -> (Serving, std::sync::mpsc::Receiver<String>) {
    let (serving, stderr) = serve_logged("127.0.0.1:0", &["--config", path.to_str().unwrap()]);
    (serving, log_lines(stderr))
}

/// Replaces the file at once (a rename), so the server's poll never reads it half written.
fn rewrite(path: &std::path::Path, text: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, text).unwrap();
    std::fs::rename(&next, path).unwrap();
}

fn hangup(server: &Serving) {
    let pid = server.child.id().to_string();
    assert!(Command::new("kill").args(["-HUP", &pid]).status().unwrap().success());
}

#[test]
fn the_config_file_sets_policies_and_reloads_on_sighup() {
    let path = temp_config("reload", "[services.cfg]\nrule = \"repeat(n=2)\"\n");
    let (server, log) = serve_config(&path);
    let (register, _) = register_in_background(&server, &["cfg", "127.0.0.1:7101", "--id", "a"]);
    let mut register = Serving { child: register, endpoint: String::new() };
    let picked = text(&rota(&server, &["pick", "cfg"]).stdout);
    assert!(picked.contains("repeat(n=2)"), "{picked}");

    // A bad edit is refused (the log says so) and the policy in force stays...
    rewrite(&path, "[services.cfg]\nrule = \"nope\"\n");
    hangup(&server);
    wait_for_line(&log, "policy file refused");
    let picked = text(&rota(&server, &["pick", "cfg"]).stdout);
    assert!(picked.contains("repeat(n=2)"), "the old policy stays after a refused edit: {picked}");
    // ...then a good one applies once the log says it was reloaded.
    rewrite(&path, "[services.cfg]\nrule = \"random\"\n");
    hangup(&server);
    wait_for_line(&log, "policies reloaded");
    let picked = text(&rota(&server, &["pick", "cfg"]).stdout);
    assert!(picked.contains("random"), "the new policy applies: {picked}");
    let _ = register.child.kill();
}

#[test]
fn policy_set_survives_a_reload_and_policy_reset_drops_it() {
    let path = temp_config(
        "override",
        "[services.cfg]\nrule = \"repeat(n=2)\"\nhealth_check = { kind = \"tcp\", interval = \"7s\" }\n",
    );
    let (server, log) = serve_config(&path);
    // Columns: SERVICE SOURCE RULE ...; the first line is the header.
    let policy = |args: &[&str]| {
        let output = rota(&server, &[&["policy"], args].concat());
        assert!(output.status.success(), "rota policy {args:?}: {}", text(&output.stderr));
        text(&output.stdout)
    };
    let row = |out: &str, service: &str| -> Vec<String> {
        let line = out.lines().find(|l| l.split_whitespace().next() == Some(service));
        line.unwrap_or_else(|| panic!("no row for {service}: {out}")).split_whitespace().map(str::to_owned).collect()
    };
    assert_eq!(row(&policy(&["get", "cfg"]), "cfg")[1..3], ["file", "repeat(n=2)"]);

    assert_eq!(row(&policy(&["get", "cfg"]), "cfg")[7..9], ["tcp", "7s/1s"]);
    let set = policy(&["set", "cfg", "--rule", "weighted", "--isolation-fallback", "any"]);
    assert_eq!(row(&set, "cfg")[1..4], ["runtime", "weighted", "any"]);
    // Only the fields named change: the file's health check stays in force.
    assert_eq!(row(&set, "cfg")[7..10], ["tcp", "7s/1s", "3/2"]);
    let check =
        policy(&["set", "cfg", "--health-check", "http", "--health-check-path", "/ready", "--unhealthy-after", "5"]);
    assert_eq!(row(&check, "cfg")[2..4], ["weighted", "any"]);
    assert_eq!(row(&check, "cfg")[7..11], ["http", "/ready", "7s/1s", "5/2"]);
    // --replace sets the options given and nothing else.
    let replaced = policy(&["set", "cfg", "--replace", "--rule", "weighted", "--isolation-fallback", "any"]);
    assert_eq!(row(&replaced, "cfg")[7], "-");
    // Every policy field has a flag: gray release and ejection too.
    let gray =
        policy(&["set", "cfg", "--rule", "weighted", "--isolation-fallback", "any", "--gray", "unversioned=9,v2=1"]);
    assert_eq!(row(&gray, "cfg").last().map(String::as_str), Some("unversioned=9,v2=1"));
    let off = policy(&["set", "cfg", "--rule", "weighted", "--isolation-fallback", "any", "--ejection", "off"]);
    assert_eq!(row(&off, "cfg")[6], "off");
    // The gray split set before stays; ejection stays off until turned on.
    assert_eq!(row(&off, "cfg").last().map(String::as_str), Some("unversioned=9,v2=1"));
    assert_eq!(row(&policy(&["set", "cfg", "--max-ejected-percent", "80"]), "cfg")[6], "off");
    let wide = policy(&["set", "cfg", "--ejection", "on"]);
    assert_eq!(row(&wide, "cfg")[6], "max=80%,rate=50%/20");
    let bad_gray = rota(&server, &["policy", "set", "cfg", "--gray", "v2"]);
    assert_eq!(bad_gray.status.code(), Some(2), "a usage error");
    assert!(text(&bad_gray.stderr).contains("NAME=WEIGHT"), "{}", text(&bad_gray.stderr));
    let bad_share = rota(&server, &["policy", "set", "cfg", "--max-ejected-percent", "0"]);
    assert_eq!(bad_share.status.code(), Some(2), "a usage error");
    assert!(text(&bad_share.stderr).contains("0 is not in 1..=100"), "{}", text(&bad_share.stderr));
    // The file changes and is reloaded: the override stays in force.
    rewrite(&path, "[services.cfg]\nrule = \"repeat(n=3)\"\n[services.other]\nrule = \"random\"\n");
    hangup(&server);
    wait_for_line(&log, "policies reloaded");
    let listing = policy(&["ls"]);
    assert_eq!(row(&listing, "(defaults)")[1..3], ["default", "round_robin"]);
    assert_eq!(row(&listing, "cfg")[1..3], ["runtime", "weighted"]);
    assert_eq!(row(&listing, "other")[1..3], ["file", "random"]);

    // Reset drops the override: the reloaded file's policy applies.
    let reset = policy(&["reset", "cfg"]);
    assert!(reset.starts_with("dropped the runtime override of cfg"), "{reset}");
    assert_eq!(row(&reset, "cfg")[1..3], ["file", "repeat(n=3)"]);
    assert_eq!(row(&policy(&["get", "cfg"]), "cfg")[1..3], ["file", "repeat(n=3)"]);

    // Nothing left to reset, or a name that cannot be a service: a precise error, exit status 1.
    let again = rota(&server, &["policy", "reset", "cfg"]);
    assert_eq!(again.status.code(), Some(1));
    assert_eq!(
        text(&again.stderr).trim(),
        "rota: NOT_FOUND: service \"cfg\" has no runtime override to reset; the config file's policy of it applies"
    );
    let bad = rota(&server, &["policy", "reset", "a b"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(text(&bad.stderr).starts_with("rota: INVALID_ARGUMENT: service "), "{}", text(&bad.stderr));
    assert_eq!(row(&policy(&["get", "cfg"]), "cfg")[1..3], ["file", "repeat(n=3)"]);
}

/// The lines of a child's output, read on a thread of their own.
fn log_lines(stream: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Waits (at most 10 s) for a line containing `needle`.
fn wait_for_line(log: &std::sync::mpsc::Receiver<String>, needle: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match log.recv_timeout(left) {
            Ok(line) if line.contains(needle) => return,
            Ok(_) => {}
            Err(e) => panic!("no log line with {needle:?} within 10 s: {e}"),
        }
    }
}

#[test]
fn sigterm_drains_then_exits_zero() {
    let mut server = serve("127.0.0.1:0", &["--shutdown-grace", "5s"]);
    let (register, line) = register_in_background(&server, &["term", "127.0.0.1:7201", "--id", "a"]);
    assert!(line.starts_with("registered a in term"), "{line}");

    assert!(Command::new("kill").args(["-TERM", &server.child.id().to_string()]).status().unwrap().success());
    // The provider is told to go elsewhere, says so, and tries to register again.
    let mut register = register;
    let mut told = String::new();
    BufReader::new(register.stderr.take().unwrap()).read_line(&mut told).unwrap();
    assert_eq!(
        told,
        "registration lost (rota is shutting down; reconnect to another replica and announce again); registering again\n"
    );
    let _ = register.kill();
    let _ = register.wait();
    // During the grace period, a load of picks is answered without one failure.
    let picked = rota(&server, &["pick", "term", "-n", "300"]);
    assert!(picked.status.success(), "{}", text(&picked.stderr));
    let answers = text(&picked.stdout);
    assert_eq!(answers.lines().filter(|l| l.contains("127.0.0.1:7201")).count(), 300, "{answers}");
    // Then the server exits 0 (bounded wait: grace 5 s plus margin).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let status = loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "rota serve did not exit after its grace period");
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert!(status.success(), "{status:?}");
}

/// `rota register` survives a server restart: it registers again on the new server, on the
/// same address, without being told.
#[test]
fn register_registers_again_after_the_server_restarts() {
    let server = serve("127.0.0.1:0", &[]);
    let (mut register, line) = register_in_background(&server, &["again", "127.0.0.1:7301", "--id", "a"]);
    assert!(line.starts_with("registered a in again"), "{line}");
    let listen = server.endpoint.trim_start_matches("http://").to_owned();
    drop(server); // SIGKILL: no Closing, the stream just breaks.
    let server = serve(&listen, &[]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let listed = rota(&server, &["ls", "again"]);
        if text(&listed.stdout).contains("127.0.0.1:7301") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not registered again: {}", text(&listed.stderr));
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let mut line = String::new();
    let mut stdout = BufReader::new(register.stdout.take().unwrap());
    stdout.read_line(&mut line).unwrap();
    assert!(line.starts_with("registered again (lease "), "{line}");
    assert!(Command::new("kill").args(["-INT", &register.id().to_string()]).status().unwrap().success());
    assert!(register.wait().unwrap().success(), "register exits 0 after withdrawing");
    assert!(!text(&rota(&server, &["ls", "again"]).stdout).contains("127.0.0.1:7301"), "withdrawn on Ctrl-C");
}

/// `rota serve` prints the admin address second, and that listener answers; `off` (here from
/// the environment) prints nothing more than the first line.
#[test]
fn serve_prints_the_admin_address_second() {
    use std::io::{Read, Write};

    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let serving = Serving { child, endpoint: String::new() };
    let (mut first, mut second) = (String::new(), String::new());
    stdout.read_line(&mut first).unwrap();
    stdout.read_line(&mut second).unwrap();
    assert!(first.starts_with("listening on 127.0.0.1:"), "{first}");
    let admin = second.trim().strip_prefix("admin on ").unwrap_or_else(|| panic!("second line was {second:?}"));
    let mut http = std::net::TcpStream::connect(admin).unwrap();
    http.write_all(b"GET /healthz HTTP/1.0\r\n\r\n").unwrap();
    let mut response = String::new();
    http.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.0 200 ") && response.ends_with("\r\n\r\nok"), "{response}");
    drop(serving);

    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("ROTA_ADMIN_LISTEN", "off")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first).unwrap();
    assert!(first.starts_with("listening on 127.0.0.1:"), "{first}");
    drop(Serving { child, endpoint: String::new() });
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "", "nothing after the first line");
}

#[test]
fn bench_alternates_rounds_and_reports_ratios() {
    let output = Command::new(BIN)
        .args(["bench", "--modes", "health,pick", "--rounds", "2", "--duration", "300ms", "--warmup", "100ms"])
        .args(["--callers", "4", "--connections", "1"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    let out = text(&output.stdout);
    let windows: Vec<serde_json::Value> =
        out.lines().filter(|l| l.starts_with('{')).map(|l| serde_json::from_str(l).unwrap()).collect();
    let modes: Vec<&str> = windows.iter().map(|w| w["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["health", "pick", "pick", "health"], "the second round runs in reverse");
    for window in &windows {
        assert_eq!(window["errors"], 0, "{window}");
        assert!(window["requests"].as_u64().unwrap() > 0, "{window}");
        assert!(window["server_cpu_us_per_request"].as_f64().is_some(), "a spawned server's CPU is known: {window}");
    }
    let table: Vec<Vec<&str>> = out
        .lines()
        .filter(|l| l.starts_with("health ") || l.starts_with("pick "))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(table.iter().map(|row| (row[0], row[1])).collect::<Vec<_>>(), [("health", "2"), ("pick", "2")]);
    assert!(out.contains("Pick / baseline throughput: ") && out.contains("per round over 2 rounds"), "{out}");
    assert!(out.contains("Server CPU per request, Pick / baseline: "), "{out}");
}

#[test]
fn bench_scale_registers_over_more_streams_than_one_peer_may_open_by_default() {
    let output = Command::new(BIN)
        .args(["bench", "--scale", "--scale-instances", "1300", "--scale-services", "13", "--scale-streams", "65"])
        .args(["--duration", "300ms", "--warmup", "100ms", "--callers", "4", "--connections", "1"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    let out = text(&output.stdout);
    assert!(out.contains("registered 1300 instances in 13 services over 65 streams"), "{out}");
    let picks: Vec<serde_json::Value> =
        out.lines().filter(|l| l.starts_with("{\"mode\"")).map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(picks.len(), 2, "picks without and with churn: {out}");
    assert!(picks.iter().all(|p| p["errors"] == 0 && p["requests"].as_u64().unwrap() > 0), "{out}");
}

#[test]
fn bench_refuses_bad_rounds_and_a_pid_without_a_server() {
    let output = Command::new(BIN).args(["bench", "--rounds", "0"]).output().unwrap();
    assert!(!output.status.success());
    assert!(text(&output.stderr).contains("invalid value '0' for '--rounds <ROUNDS>': 0 is not in 1..=1000"));
    let output = Command::new(BIN).args(["bench", "--server-pid", "5"]).output().unwrap();
    assert!(!output.status.success());
    assert!(text(&output.stderr).contains("--server <SERVER>"), "{}", text(&output.stderr));
}

/// Logs written to a pipe or a file carry no terminal colour codes.
#[test]
fn serve_logs_have_no_colour_codes_off_a_terminal() {
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--admin-listen", "off"])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stderr.take().unwrap()).read_line(&mut line).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(line.contains("serving"), "{line:?}");
    assert!(!line.contains('\u{1b}'), "{line:?}");
}
