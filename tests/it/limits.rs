//! Limits: overload is refused with RESOURCE_EXHAUSTED instead of queued without bound.

use std::time::{Duration, Instant};

use rota::client::PickOptions;
use rota::pb;

use crate::harness::{PATIENCE, TestServer, instance};

#[tokio::test]
async fn one_peer_may_hold_only_so_many_registration_streams() {
    let server = TestServer::start_with(|config| config.limits.registrations_per_peer = 2).await;
    let first = server.register(vec![instance("peer", "a", 1)]).await;
    let _second = server.register(vec![instance("peer", "b", 2)]).await;
    let error = server.client().await.register(vec![instance("peer", "c", 3)]).await.err().expect("refused");
    assert_eq!(error.code(), Some(tonic::Code::ResourceExhausted));
    assert!(
        error.to_string().contains("peer 127.0.0.1 already holds 2 registration streams; the limit is 2"),
        "{error}"
    );

    // A stream that ends frees its slot (the server notices the end a moment later).
    first.close().await.unwrap();
    let deadline = Instant::now() + PATIENCE;
    loop {
        match server.client().await.register(vec![instance("peer", "c", 3)]).await {
            Ok(registration) => {
                registration.require_all_accepted().unwrap();
                break;
            }
            Err(error) => {
                assert_eq!(error.code(), Some(tonic::Code::ResourceExhausted));
                assert!(Instant::now() < deadline, "the slot was never freed");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

#[tokio::test]
async fn oversized_requests_are_refused_and_change_nothing() {
    let server = TestServer::start_with(|config| config.limits.max_message_bytes = 2048).await;
    let _provider = server.register(vec![instance("big", "a", 1)]).await;
    let mut client = server.client().await;
    let exclude: Vec<String> = (0..400).map(|i| format!("instance-{i:04}")).collect();
    let error = client.pick("big", PickOptions::default().exclude(exclude)).await.unwrap_err();
    assert_eq!(error.code(), Some(tonic::Code::OutOfRange), "{error}");
    let picked = client.pick("big", PickOptions::default()).await.unwrap();
    assert_eq!(picked.ticket, 0, "the refused pick drew no ticket");
}

#[tokio::test]
async fn requests_beyond_the_per_connection_limit_are_shed() {
    let server = TestServer::start_with(|config| config.limits.concurrent_requests_per_connection = 1).await;
    let _provider = server.register(vec![instance("shed", "only", 1)]).await;
    let mut client = server.client().await;
    // Trip the only instance's breaker for long enough that a retrying pick waits.
    let failure = pb::CallOutcome {
        service: "shed".into(),
        instance_id: "only".into(),
        result: pb::CallResult::ConnectFailure.into(),
        ..Default::default()
    };
    client.report(vec![failure.clone(), failure.clone(), failure]).await.unwrap();
    // The pick asks rota to wait up to 3 s, longer than the client's default pick deadline.
    let mut waiting = client.clone().with_pick_timeout(Duration::from_secs(10));
    let slow = tokio::spawn(async move { waiting.pick("shed", PickOptions::rule("retry(max_ms=3000)")).await });
    // While the slow pick holds the connection's only slot, another request on the same
    // connection is shed at once.
    let deadline = Instant::now() + Duration::from_secs(2);
    let shed = loop {
        match client.list_services().await {
            Err(error) => break error,
            Ok(_) => {
                assert!(Instant::now() < deadline && !slow.is_finished(), "no request was ever shed");
                tokio::task::yield_now().await;
            }
        }
    };
    assert_eq!(shed.code(), Some(tonic::Code::ResourceExhausted), "{shed}");
    let error = slow.await.unwrap().unwrap_err();
    assert_eq!(error.code(), Some(tonic::Code::Unavailable), "the retry gave up within its budget");
}

/// `rota serve` started with a low soft limit of open files raises it to the hard limit.
#[cfg(target_os = "linux")]
#[test]
fn rota_serve_raises_its_open_files_limit_to_the_hard_limit() {
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};

    let mut command = Command::new(crate::processes::BIN);
    command
        .args(["serve", "--listen", "127.0.0.1:0"])
        .env("ROTA_WARMUP", "0s")
        .env("ROTA_ADMIN_LISTEN", "off")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    // SAFETY: only async-signal-safe calls (getrlimit, setrlimit) between fork and exec.
    unsafe {
        command.pre_exec(|| {
            let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
            if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            limit.rlim_cur = (limit.rlim_max / 2).min(256);
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = command.spawn().expect("rota serve starts");
    let mut serving = crate::processes::Serving { child, endpoint: String::new() };
    let mut first = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(serving.child.stdout.take().unwrap()), &mut first)
        .unwrap();
    assert!(first.starts_with("listening on "), "{first:?}");
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", serving.child.id())).unwrap();
    let line = limits.lines().find(|l| l.starts_with("Max open files")).expect("a Max open files line");
    let numbers: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    assert_eq!(numbers[0], numbers[1], "soft limit raised to the hard limit: {line}");
}
