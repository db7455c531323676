use tonic::Code;

use super::*;

fn status(code: Code, reason: Option<&'static str>) -> ClientError {
    match reason {
        Some(reason) => ClientError::Status(status_with_reason(code, "rota says no".into(), reason)),
        None => ClientError::Status(tonic::Status::new(code, "made up on the way")),
    }
}

#[test]
fn unreachable_is_unavailable_or_deadline_exceeded_without_rota_s_reason() {
    assert!(status(Code::Unavailable, None).is_unreachable());
    assert!(status(Code::DeadlineExceeded, None).is_unreachable());
    // rota's own answers carry their reason.
    assert!(!status(Code::Unavailable, Some("no_eligible_instance")).is_unreachable());
    assert!(!status(Code::NotFound, Some("unknown_service")).is_unreachable());
    assert!(!status(Code::InvalidArgument, Some("invalid_rule")).is_unreachable());
    // Other codes are answers, with or without a reason.
    for code in [Code::NotFound, Code::Unknown, Code::Internal, Code::Cancelled, Code::PermissionDenied] {
        assert!(!status(code, None).is_unreachable(), "{code:?}");
    }
    // Warming up is rota's answer, not an outage; it falls back all the same.
    let warming_up = status(Code::Unavailable, Some(WARMING_UP));
    assert!(!warming_up.is_unreachable());
    assert_eq!(warming_up.reason(), Some(WARMING_UP));
    assert!(warming_up.falls_back());
    assert!(!status(Code::Unavailable, Some("no_eligible_instance")).falls_back());
    assert!(status(Code::DeadlineExceeded, None).falls_back());
}

/// A loopback port nothing listens on.
fn closed_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    format!("http://{addr}")
}

fn up(id: &str) -> pb::Instance {
    pb::Instance {
        id: id.into(),
        service: "svc".into(),
        host: "127.0.0.1".into(),
        port: 9000,
        status: pb::InstanceStatus::Up.into(),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_service_not_followed_gets_the_unreachable_error() {
    let mut client = RotaClient::connect_lazy(&closed_port()).unwrap();
    let error = client.pick("svc", PickOptions::default()).await.unwrap_err();
    assert_eq!(error.code(), Some(Code::Unavailable), "{error}");
    assert!(error.is_unreachable(), "{error}");
    assert!(client.followed("svc").is_none());
}

#[tokio::test]
async fn with_rota_unreachable_a_followed_service_is_picked_locally_and_marked() {
    let mut client = RotaClient::connect_lazy(&closed_port()).unwrap();
    let snapshot = pb::watch_event::Event::Snapshot(pb::InstanceList { instances: vec![up("b"), up("a")] });
    client.fallback.shared.apply("svc", pb::WatchEvent { epoch: 2, event: Some(snapshot) });
    let mut picked = Vec::new();
    for _ in 0..5 {
        let pick = client.pick("svc", PickOptions::rule("repeat(n=3)")).await.unwrap();
        assert!(pick.local_fallback);
        assert_eq!((pick.rule.as_str(), pick.fallback.as_str(), pick.epoch), ("round_robin", "", 2));
        picked.push((pick.instance.as_ref().unwrap().id.clone(), pick.ticket));
    }
    let expected = [("a", 0), ("b", 1), ("a", 2), ("b", 3), ("a", 4)].map(|(id, t)| (id.to_owned(), t));
    assert_eq!(picked, expected);
    assert!(client.fallback.shared.shortcut(), "three failures in a row short-cut to the fallback");
    // Nothing eligible locally is rota's kind of answer, not "unreachable".
    let error = client.pick("svc", PickOptions::default().exclude(["a", "b"])).await.unwrap_err();
    assert_eq!((error.code(), error.reason()), (Some(Code::Unavailable), Some(fallback::NO_ELIGIBLE_INSTANCE)));
    assert!(!error.is_unreachable());
}

#[tokio::test]
async fn a_pick_that_rota_does_not_answer_in_time_is_unreachable() {
    // A listener that accepts connections and never answers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let _silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let mut client =
        RotaClient::connect_lazy(&format!("http://{addr}")).unwrap().with_pick_timeout(Duration::from_millis(200));
    let error = client.pick("svc", PickOptions::default()).await.unwrap_err();
    assert_eq!(error.code(), Some(Code::DeadlineExceeded), "{error}");
    assert!(error.is_unreachable());
}
