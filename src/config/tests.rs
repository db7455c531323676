//! Settings from the file, the environment and flags.

use super::*;

fn file(text: &str) -> tempfile_path::TempPath {
    tempfile_path::write(text)
}

mod tempfile_path {
    use std::path::PathBuf;
    use std::sync::atomic::{AtomicU32, Ordering};

    pub struct TempPath(pub PathBuf);

    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    pub fn write(text: &str) -> TempPath {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("rota-config-{}-{n}.toml", std::process::id()));
        std::fs::write(&path, text).unwrap();
        TempPath(path)
    }
}

#[test]
fn file_then_overrides_then_defaults() {
    let f =
        file("[server]\nlisten = \"127.0.0.1:7000\"\nheartbeat_timeout = \"20s\"\n[services.a]\nrule = \"random\"\n");
    let settings = resolve(Some(&f.0), &Overrides::default()).unwrap();
    assert_eq!(settings.serve.listen.to_string(), "127.0.0.1:7000");
    assert_eq!(settings.serve.registry.heartbeat_timeout, Duration::from_secs(20));
    assert_eq!(settings.shutdown_grace, DEFAULT_SHUTDOWN_GRACE);
    let overrides = Overrides { heartbeat_timeout: Some("5s".into()), ..Default::default() };
    let settings = resolve(Some(&f.0), &overrides).unwrap();
    assert_eq!(settings.serve.registry.heartbeat_timeout, Duration::from_secs(5));
    assert_eq!(settings.serve.listen.to_string(), "127.0.0.1:7000", "the file still sets what flags leave");
}

#[test]
fn errors_name_the_source_and_the_key() {
    let f = file("[server]\nheartbeat_timeout = \"soon\"\n");
    let error = resolve(Some(&f.0), &Overrides::default()).unwrap_err();
    assert_eq!(error.key, "server.heartbeat_timeout");
    assert!(
        error
            .to_string()
            .starts_with(&format!("{}: server.heartbeat_timeout: \"soon\" is not a duration", f.0.display()))
    );
    let error = resolve(None, &Overrides { listen: Some("nowhere".into()), ..Default::default() }).unwrap_err();
    assert_eq!(
        error.to_string(),
        "command line / environment: server.listen: \"nowhere\" is not an address like 127.0.0.1:50051"
    );
    let f = file("[server]\nlisten = \"127.0.0.1:1\"\nport = 3\n");
    let error = resolve(Some(&f.0), &Overrides::default()).unwrap_err();
    assert!(error.problem.contains("unknown field `port`"), "{error}");
    let error =
        resolve(None, &Overrides { max_instances_per_stream: Some("0".into()), ..Default::default() }).unwrap_err();
    assert_eq!(error.problem, "must be an integer from 1 to 100000, got \"0\"");
}

#[test]
fn tokens_come_from_files_or_the_environment_and_lift_the_loopback_guard() {
    let secret = file("  a-long-enough-secret-token\n");
    let config = file(&format!(
        "[server]\nlisten = \"0.0.0.0:50051\"\n[[auth.tokens]]\nname = \"ci\"\ntoken_file = {:?}\nscopes = [\"pick\", \"register:orders-*\"]\n",
        secret.0.display().to_string()
    ));
    let settings = resolve(Some(&config.0), &Overrides::default()).expect("auth allows a public address");
    let auth = settings.serve.auth.expect("auth is on");
    let ci = auth.authenticate("a-long-enough-secret-token").expect("the file's token, trimmed");
    assert!(ci.may_pick() && ci.may_register("orders-eu") && !ci.is_admin());

    let bad = |text: &str| resolve(Some(&file(text).0), &Overrides::default()).unwrap_err();
    let error = bad("[[auth.tokens]]\nname = \"x\"\ntoken_env = \"ROTA_TEST_UNSET_TOKEN_VAR\"\nscopes = [\"pick\"]\n");
    assert_eq!(
        (error.key.as_str(), error.problem.as_str()),
        ("auth.tokens[0].token_env", "ROTA_TEST_UNSET_TOKEN_VAR is not set")
    );
    let short = file("short");
    let error = bad(&format!(
        "[[auth.tokens]]\nname = \"x\"\ntoken_file = {:?}\nscopes = [\"pick\"]\n",
        short.0.display().to_string()
    ));
    assert_eq!(error.problem, "is 5 characters long; the minimum is 16");
    let error = bad(&format!(
        "[[auth.tokens]]\nname = \"x\"\ntoken_file = {:?}\nscopes = [\"root\"]\n",
        secret.0.display().to_string()
    ));
    assert_eq!(error.key, "auth.tokens[0].scopes");
}

#[test]
fn non_loopback_addresses_need_insecure() {
    let public = Overrides { listen: Some("0.0.0.0:50051".into()), ..Default::default() };
    let error = resolve(None, &public).unwrap_err();
    assert_eq!(error.key, "server.listen");
    assert!(error.problem.starts_with("0.0.0.0:50051 is not a loopback address and no authentication is configured"));
    let allowed = Overrides { insecure: true, ..public };
    assert!(resolve(None, &allowed).unwrap().insecure);
    let admin = Overrides { admin_listen: Some("10.1.2.3:9090".into()), ..Default::default() };
    assert_eq!(resolve(None, &admin).unwrap_err().key, "server.admin_listen");
    let ipv6 = Overrides { listen: Some("[::1]:50051".into()), ..Default::default() };
    assert!(resolve(None, &ipv6).is_ok(), "::1 is loopback");
}

#[test]
fn printed_settings_read_back_the_same() {
    let f = file("[server]\nshutdown_grace = \"3s\"\nlatency_decay = \"1m\"\n");
    let settings = resolve(Some(&f.0), &Overrides::default()).unwrap();
    let printed = settings.to_toml();
    let again = file(&printed);
    let reread = resolve(Some(&again.0), &Overrides::default()).unwrap();
    assert_eq!(reread.to_toml(), printed);
    assert!(printed.contains("shutdown_grace = \"3s\"") && printed.contains("latency_decay = \"1m\""), "{printed}");
}

#[test]
fn the_warmup_defaults_to_the_heartbeat_timeout_and_may_be_zero() {
    let f = file("[server]\nheartbeat_timeout = \"20s\"\n");
    let settings = resolve(Some(&f.0), &Overrides::default()).unwrap();
    assert_eq!(settings.serve.warmup, Some(Duration::from_secs(20)));
    let f = file("[server]\nwarmup = \"3s\"\n");
    assert_eq!(resolve(Some(&f.0), &Overrides::default()).unwrap().serve.warmup, Some(Duration::from_secs(3)));
    let zero = Overrides { warmup: Some("0s".into()), ..Default::default() };
    assert_eq!(resolve(Some(&f.0), &zero).unwrap().serve.warmup, Some(Duration::ZERO));
    let bad = Overrides { warmup: Some("soon".into()), ..Default::default() };
    let error = resolve(None, &bad).unwrap_err();
    assert_eq!((error.source_name.as_str(), error.key.as_str()), (FLAGS, "server.warmup"));
    assert!(error.problem.starts_with("\"soon\" is not a duration"), "{}", error.problem);
}

#[test]
fn the_warmup_settle_defaults_to_a_fifth_of_the_warmup_at_most_3s_and_round_trips() {
    let settle = |toml: &str, overrides: &Overrides| {
        let f = file(toml);
        resolve(Some(&f.0), overrides).map(|s| s.serve.warmup_settle)
    };
    let none = Overrides::default();
    assert_eq!(settle("[server]\nwarmup = \"10s\"\n", &none).unwrap(), Some(Duration::from_secs(2)));
    assert_eq!(settle("[server]\n", &none).unwrap(), Some(Duration::from_secs(3)), "15 s warm-up");
    assert_eq!(settle("[server]\nwarmup = \"1h\"\n", &none).unwrap(), Some(Duration::from_secs(3)));
    assert_eq!(settle("[server]\nwarmup = \"0s\"\n", &none).unwrap(), Some(Duration::ZERO));
    let file_set = "[server]\nwarmup_settle = \"750ms\"\n";
    assert_eq!(settle(file_set, &none).unwrap(), Some(Duration::from_millis(750)));
    let zero = Overrides { warmup_settle: Some("0s".into()), ..Default::default() };
    assert_eq!(settle(file_set, &zero).unwrap(), Some(Duration::ZERO), "the flag wins");
    let bad = Overrides { warmup_settle: Some("later".into()), ..Default::default() };
    let error = resolve(None, &bad).unwrap_err();
    assert_eq!((error.source_name.as_str(), error.key.as_str()), (FLAGS, "server.warmup_settle"));
    assert!(error.problem.starts_with("\"later\" is not a duration"), "{}", error.problem);

    let f = file(file_set);
    let printed = resolve(Some(&f.0), &none).unwrap().to_toml();
    assert!(printed.contains("warmup_settle = \"750ms\""), "{printed}");
    let again = file(&printed);
    assert_eq!(resolve(Some(&again.0), &none).unwrap().serve.warmup_settle, Some(Duration::from_millis(750)));
}

#[test]
fn the_state_backend_settings_are_checked_and_round_trip() {
    let over = |state: &str, block: &str, timeout: &str| Overrides {
        state: Some(state.into()),
        ticket_block: Some(block.into()),
        state_timeout: Some(timeout.into()),
        ..Default::default()
    };
    let error = resolve(None, &over("redis://127.0.0.1", "1", "500ms")).unwrap_err();
    assert_eq!(error.key, "server.state");
    assert!(error.problem.contains("expected HOST:PORT"), "{error}");
    let error = resolve(None, &over("redis://127.0.0.1:6379", "0", "500ms")).unwrap_err();
    assert_eq!(
        (error.key.as_str(), error.problem.as_str()),
        ("server.ticket_block", "must be an integer from 1 to 65536, got \"0\"")
    );
    let error = resolve(None, &over("redis://127.0.0.1:6379", "1", "soon")).unwrap_err();
    assert_eq!(error.key, "server.state_timeout");
    let settings = resolve(None, &over("redis://:pw@127.0.0.1:6379/3", "16", "2s")).expect("valid state settings");
    let printed = file(&settings.to_toml());
    let again = resolve(Some(&printed.0), &Overrides::default()).expect("the printout reads back");
    assert_eq!(again.serve.state, settings.serve.state, "state, block and timeout survive --print-config");
}

#[test]
fn unread_budgets_are_bounded_the_address_one_inside_the_total_and_round_trip() {
    let over = |total: Option<&str>, peer: Option<&str>| Overrides {
        max_unread_bytes: total.map(Into::into),
        max_unread_bytes_per_peer: peer.map(Into::into),
        ..Default::default()
    };
    let error = resolve(None, &over(Some("1000"), None)).unwrap_err();
    assert_eq!(error.key, "server.max_unread_bytes");
    let error = resolve(None, &over(Some("1048576"), None)).unwrap_err();
    assert_eq!(error.key, "server.max_unread_bytes_per_peer", "the default 32 MiB does not fit in 1 MiB");
    assert_eq!(
        error.problem,
        "is 33554432, more than server.max_unread_bytes (1048576); one client address cannot hold more than the whole server"
    );
    let settings = resolve(None, &over(Some("1048576"), Some("262144"))).expect("valid budgets");
    assert_eq!(
        (settings.serve.limits.max_unread_bytes, settings.serve.limits.max_unread_bytes_per_peer),
        (1 << 20, 1 << 18)
    );
    let printed = file(&settings.to_toml());
    let again = resolve(Some(&printed.0), &Overrides::default()).expect("the printout reads back");
    assert_eq!(again.serve.limits.max_unread_bytes_per_peer, 1 << 18);
    assert_eq!(again.serve.limits.max_unread_bytes, 1 << 20);
}

#[test]
fn consumer_streams_per_peer_is_bounded_and_round_trips() {
    let over = |n: &str| Overrides { max_consumer_streams_per_peer: Some(n.into()), ..Default::default() };
    for bad in ["0", "1000001", "many"] {
        let error = resolve(None, &over(bad)).unwrap_err();
        assert_eq!(error.key, "server.max_consumer_streams_per_peer", "{bad}");
    }
    let error = resolve(None, &over("0")).unwrap_err();
    assert_eq!(error.problem, "must be an integer from 1 to 1000000, got \"0\"");
    let settings = resolve(None, &over("32")).expect("a valid cap");
    assert_eq!(settings.serve.limits.consumer_streams_per_peer, 32);
    let printed = file(&settings.to_toml());
    let again = resolve(Some(&printed.0), &Overrides::default()).expect("the printout reads back");
    assert_eq!(again.serve.limits.consumer_streams_per_peer, 32);
}

#[test]
fn health_check_networks_default_by_the_listeners_are_checked_and_round_trip() {
    use std::net::IpAddr;
    let loopback: IpAddr = "127.0.0.1".parse().unwrap();
    // On loopback only (the default listeners): loopback is checked, link-local is not.
    let local = resolve(None, &Overrides::default()).unwrap();
    assert!(local.serve.health_check_networks.is_none(), "not given: the default for the listeners");
    assert!(local.serve.health_check_networks().allows(loopback));
    assert!(local.to_toml().contains("health_check_networks = \"0.0.0.0/0, ::/0, !169.254.0.0/16, !fe80::/10\"\n"));
    // Reachable from elsewhere: loopback is not checked either.
    let exposed = Overrides { admin_listen: Some("0.0.0.0:9090".into()), insecure: true, ..Default::default() };
    let exposed = resolve(None, &exposed).unwrap();
    assert!(!exposed.serve.health_check_networks().allows(loopback));
    assert!(exposed.to_toml().contains("!127.0.0.0/8, !::1/128"), "{}", exposed.to_toml());
    // Given: checked, named in the error, and printed back the same.
    let over = |text: &str| Overrides { health_check_networks: Some(text.into()), ..Default::default() };
    let error = resolve(None, &over("10.0.0.1/8")).unwrap_err();
    assert_eq!(error.key, "server.health_check_networks");
    assert_eq!(error.source_name, "command line / environment");
    assert_eq!(error.problem, "\"10.0.0.1/8\" has bits set past its prefix; the network is 10.0.0.0/8");
    let f = file("[server]\nhealth_check_networks = \"10.0.0.0/8,,fd00::/8\"\n");
    let error = resolve(Some(&f.0), &Overrides::default()).unwrap_err();
    assert_eq!(
        (error.key.as_str(), error.source_name.as_str()),
        ("server.health_check_networks", f.0.to_str().unwrap())
    );
    assert!(error.problem.starts_with("entry 2 is empty"), "{error}");
    let settings = resolve(None, &over("10.0.0.0/8,!10.0.5.0/24 , fd00::/8")).unwrap();
    let networks = settings.serve.health_check_networks();
    assert!(!networks.allows(loopback) && networks.allows("10.1.0.1".parse().unwrap()));
    let printed = file(&settings.to_toml());
    let again = resolve(Some(&printed.0), &Overrides::default()).expect("the printout reads back");
    assert_eq!(again.serve.health_check_networks, Some(networks));
    assert!(settings.to_toml().contains("health_check_networks = \"10.0.0.0/8, !10.0.5.0/24, fd00::/8\"\n"));
}

#[test]
fn xds_bounds_are_bounded_and_round_trip() {
    let names = |n: &str| Overrides { max_xds_names_per_stream: Some(n.into()), ..Default::default() };
    let total = |n: &str| Overrides { max_xds_subscriptions: Some(n.into()), ..Default::default() };
    for bad in ["0", "100001", "many"] {
        assert_eq!(resolve(None, &names(bad)).unwrap_err().key, "server.max_xds_names_per_stream", "{bad}");
    }
    for bad in ["0", "10000001", "-1"] {
        assert_eq!(resolve(None, &total(bad)).unwrap_err().key, "server.max_xds_subscriptions", "{bad}");
    }
    let settings = resolve(None, &Overrides { max_xds_subscriptions: Some("500".into()), ..names("7") }).unwrap();
    assert_eq!(
        settings.serve.limits.xds,
        crate::xds::XdsLimits { max_names_per_stream: 7, max_subscriptions: 500, ..Default::default() }
    );
    let printed = file(&settings.to_toml());
    let again = resolve(Some(&printed.0), &Overrides::default()).expect("the printout reads back");
    assert_eq!(again.serve.limits.xds, settings.serve.limits.xds);

    let bytes = |n: &str| Overrides { max_xds_bytes: Some(n.into()), ..Default::default() };
    for bad in ["1048575", "68719476737", "lots"] {
        assert_eq!(resolve(None, &bytes(bad)).unwrap_err().key, "server.max_xds_bytes", "{bad}");
    }
    let settings = resolve(None, &bytes("2097152")).unwrap();
    assert_eq!(settings.serve.limits.xds.max_bytes, 2 << 20);
    let printed = file(&settings.to_toml());
    assert_eq!(resolve(Some(&printed.0), &Overrides::default()).unwrap().serve.limits.xds.max_bytes, 2 << 20);
}

#[test]
fn the_memory_limit_is_off_or_at_least_its_minimum_and_reads_back() {
    assert_eq!(resolve(None, &Overrides::default()).unwrap().serve.limits.max_rss_bytes, 0);
    let rss = |n: &str| Overrides { max_rss_bytes: Some(n.into()), ..Default::default() };
    for bad in ["1", "16777215", "1099511627777", "-1", "lots"] {
        let error = resolve(None, &rss(bad)).unwrap_err();
        assert_eq!(error.key, "server.max_rss_bytes", "{bad}");
        assert_eq!(error.source_name, FLAGS, "{bad}");
    }
    assert!(resolve(None, &rss("1")).unwrap_err().problem.contains("0 (no limit) or at least 16777216 bytes"));
    let settings = resolve(None, &rss("536870912")).unwrap();
    assert_eq!(settings.serve.limits.max_rss_bytes, 512 << 20);
    let printed = file(&settings.to_toml());
    assert_eq!(resolve(Some(&printed.0), &Overrides::default()).unwrap().serve.limits.max_rss_bytes, 512 << 20);
}

/// The rows of docs/config.md's `[server]` table: (key, variable, flag).
fn documented_settings() -> Vec<(String, String, String)> {
    let docs = include_str!("../../docs/config.md");
    docs.lines()
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let unquote = |cell: &str| cell.strip_prefix('`')?.strip_suffix('`').map(str::to_owned);
            if cells.len() < 5 || !cells[2].starts_with("`ROTA_") {
                return None;
            }
            Some((unquote(cells[1])?, unquote(cells[2])?, unquote(cells[3])?))
        })
        .collect()
}

/// Every declared setting has its row in docs/config.md (key, variable, flag), and every row
/// names a declared setting: the page and the code cannot drift apart.
#[test]
fn docs_config_md_documents_exactly_the_declared_settings() {
    let declared: Vec<(String, String, String)> =
        SETTINGS.iter().map(|s| (s.key.to_owned(), s.env.to_owned(), s.flag())).collect();
    let documented = documented_settings();
    for setting in &declared {
        assert!(documented.contains(setting), "docs/config.md has no row {setting:?}");
    }
    for row in &documented {
        assert!(declared.contains(row), "docs/config.md documents {row:?}, which is not a setting");
    }
    assert_eq!(documented.len(), declared.len(), "a setting documented twice");
}

/// `--print-config` writes every setting (the TLS files when they are given), so a file it
/// printed sets everything explicitly.
#[test]
fn print_config_writes_every_declared_setting() {
    let printed = resolve(None, &Overrides::default()).expect("the defaults resolve").to_toml();
    let keys: Vec<&str> = printed.lines().filter_map(|line| line.split(" = ").next()).collect();
    for setting in SETTINGS.iter().filter(|s| !s.key.starts_with("tls_")) {
        assert!(keys.contains(&setting.key), "--print-config lacks {}:\n{printed}", setting.key);
    }
}

/// Each declared setting is a flag of `rota serve` with its variable, and a key of the file.
#[test]
fn every_declared_setting_is_a_flag_a_variable_and_a_file_key() {
    use clap::CommandFactory;
    #[derive(clap::Parser)]
    struct Serve {
        #[command(flatten)]
        settings: Overrides,
    }
    let command = Serve::command();
    for setting in SETTINGS {
        let arg = command.get_arguments().find(|a| a.get_long() == Some(&setting.flag()[2..]));
        let arg = arg.unwrap_or_else(|| panic!("no flag {}", setting.flag()));
        assert_eq!(arg.get_env().and_then(|e| e.to_str()), Some(setting.env), "{}", setting.key);
        let value = if setting.key == "insecure" { "true" } else { "\"x\"" };
        let file = format!("[server]\n{} = {value}\n", setting.key);
        let parsed: Result<FileConfigProbe, _> = toml::from_str(&file);
        assert!(
            parsed.is_ok() || !format!("{:?}", parsed.as_ref().err()).contains("unknown field"),
            "[server] {} is not a key of the file: {parsed:?}",
            setting.key
        );
    }
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct FileConfigProbe {
    server: settings::ServerTable,
}

#[test]
fn sources_come_from_the_file_and_the_flags_and_survive_print_config() {
    let config = file(
        "[[source]]\nurl = \"eureka+http://127.0.0.1:8761/eureka\"\nservices = [\"orders\"]\ninterval = \"2s\"\n\n\
         [[source]]\nname = \"orders-dns\"\nurl = \"dns+srv://_grpc._tcp.orders.test\"\nservices = [\"orders\"]\nresolver = \"127.0.0.1:5353\"\n",
    );
    let mut settings = resolve(Some(&config.0), &Overrides::default()).expect("valid sources");
    settings.add_source_flags(&["dns://api.test:9000?name=api&services=api".to_owned()]).expect("a valid flag");
    let names: Vec<&str> = settings.serve.sources.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["eureka", "orders-dns", "api"]);
    let printed = file(&settings.to_toml());
    let again = resolve(Some(&printed.0), &Overrides::default()).expect("the printout reads back");
    assert_eq!(again.serve.sources, settings.serve.sources);

    let bad = file("[[source]]\nurl = \"eureka+http://127.0.0.1:8761/eureka\"\ninterval = \"1ms\"\n");
    let error = resolve(Some(&bad.0), &Overrides::default()).unwrap_err();
    assert_eq!(error.key, "source[0].interval");
    let unknown = file("[[source]]\nurl = \"eureka+http://127.0.0.1:8761/eureka\"\ncolour = \"red\"\n");
    assert!(resolve(Some(&unknown.0), &Overrides::default()).is_err());
    let error = settings.add_source_flags(&["dns://api.test:9000?name=api&services=api".to_owned()]).unwrap_err();
    assert_eq!(error.key, "--source[0] name");
    assert!(error.problem.contains("source[2]"), "{error}");
}
