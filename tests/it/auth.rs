//! Tokens and scopes: every scope × every kind of call × {no token, wrong token, each token},
//! over gRPC and the admin HTTP API.

use std::sync::Arc;

use rota::auth::{Authenticator, Principal, Scope};
use rota::client::{ClientError, PickOptions, RotaClient};
use rota::pb::{self, register_request::Msg};
use tonic::Code;

use crate::harness::{TestServer, instance};

const PICK: &str = "pick-token-0123456789";
const ORDERS: &str = "orders-token-0123456789";
const PAYMENTS: &str = "payments-token-0123456789";
const ADMIN: &str = "admin-token-0123456789";
const METRICS: &str = "metrics-token-0123456789";

async fn server() -> TestServer {
    let token = |secret: &str, name: &str, scopes: &[&str]| {
        let scopes = scopes.iter().map(|s| Scope::parse(s).unwrap()).collect();
        (secret.to_owned(), Principal { name: name.to_owned(), scopes })
    };
    let auth = Authenticator::new(vec![
        token(PICK, "consumer", &["pick"]),
        token(ORDERS, "orders-team", &["register:orders-*"]),
        token(PAYMENTS, "payments-team", &["register:payments"]),
        token(ADMIN, "operator", &["admin"]),
        token(METRICS, "prometheus", &["metrics"]),
    ]);
    TestServer::start_with(|config| config.auth = Some(Arc::new(auth))).await
}

async fn client(server: &TestServer, token: Option<&str>) -> RotaClient {
    let client = server.client().await;
    match token {
        Some(token) => client.with_token(token).unwrap(),
        None => client,
    }
}

fn code<T>(result: Result<T, ClientError>) -> Code {
    match result {
        Ok(_) => Code::Ok,
        Err(error) => error.code().unwrap_or(Code::Unknown),
    }
}

/// The rota RPCs, in the order of the matrix's columns.
const RPCS: [&str; 12] = [
    "Pick",
    "PickStream",
    "Lease",
    "Report",
    "Register",
    "ListServices",
    "ListInstances",
    "Watch",
    "GetPolicy",
    "SetPolicy",
    "ListPolicies",
    "ResetPolicy",
];

/// Calls every rota RPC once and returns each call's status code.
async fn call_everything(c: &mut RotaClient) -> Vec<Code> {
    let pick = code(c.pick("orders-1", PickOptions::default()).await);
    let stream = {
        let request = c.request(tokio_stream::iter(vec![PickOptions::default().request("orders-1")]));
        code(c.balancer().pick_stream(request).await.map_err(ClientError::from))
    };
    let lease = {
        let request = c.request(pb::LeaseRequest { service: "orders-1".into(), count: 2, ..Default::default() });
        code(c.balancer().lease(request).await.map_err(ClientError::from))
    };
    let report = code(c.report(Vec::new()).await);
    // A registration stream opens for any register scope; each instance is then checked.
    let register = match c.register(vec![instance("orders-2", "b", 2)]).await {
        Ok(registration) => registration.ack().refused.first().map_or(Code::Ok, |r| Code::from(r.code)),
        Err(error) => code::<()>(Err(error)),
    };
    let list_services = code(c.list_services().await);
    let list_instances = code(c.list_instances("orders-1").await);
    let watch = code(c.watch("orders-1").await);
    let get_policy = code(c.get_policy("orders-1").await);
    let policy = pb::Policy { service: "orders-1".into(), rule: "round_robin".into(), ..Default::default() };
    let set_policy = code(c.set_policy(policy).await);
    let list_policies = code(c.list_policies().await);
    // Drops the override SetPolicy just set, where SetPolicy was allowed.
    let reset_policy = code(c.reset_policy("orders-1").await);
    vec![
        pick,
        stream,
        lease,
        report,
        register,
        list_services,
        list_instances,
        watch,
        get_policy,
        set_policy,
        list_policies,
        reset_policy,
    ]
}

#[tokio::test]
async fn each_scope_opens_exactly_its_calls() {
    use Code::{Ok as OK, PermissionDenied as PD, Unauthenticated as UA};
    let server = server().await;
    let _orders = client(&server, Some(ORDERS)).await.register(vec![instance("orders-1", "a", 1)]).await.unwrap();

    let matrix: [(Option<&str>, [Code; 12]); 7] = [
        (None, [UA; 12]),
        (Some("not-a-token-at-all-000"), [UA; 12]),
        (Some(PICK), [OK, OK, OK, OK, PD, OK, OK, OK, PD, PD, PD, PD]),
        (Some(ORDERS), [PD, PD, PD, PD, OK, PD, PD, PD, PD, PD, PD, PD]),
        (Some(PAYMENTS), [PD; 12]),
        (Some(ADMIN), [PD, PD, PD, PD, PD, PD, PD, PD, OK, OK, OK, OK]),
        (Some(METRICS), [PD; 12]),
    ];
    for (token, expected) in matrix {
        let mut c = client(&server, token).await;
        let codes = call_everything(&mut c).await;
        for (i, rpc) in RPCS.iter().enumerate() {
            assert_eq!(codes[i], expected[i], "{rpc} with token {token:?}");
        }
    }
}

#[tokio::test]
async fn a_register_scope_only_touches_its_services() {
    let server = server().await;
    let _payments = client(&server, Some(PAYMENTS)).await.register(vec![instance("payments", "p", 1)]).await.unwrap();
    let mut orders = client(&server, Some(ORDERS)).await.register(vec![instance("orders-1", "a", 1)]).await.unwrap();

    // Neither announce (take over) nor withdraw nor update a payments instance.
    let ack = orders.send(Msg::Announce(pb::Announce { instances: vec![instance("payments", "p", 9)] })).await.unwrap();
    assert!(ack.accepted.is_empty());
    assert_eq!(ack.refused[0].code, Code::PermissionDenied as i32);
    assert_eq!(ack.refused[0].message, "token \"orders-team\" may not register service \"payments\"");
    let target = pb::InstanceRef { service: "payments".into(), id: "p".into() };
    let ack = orders.send(Msg::Withdraw(pb::Withdraw { instances: vec![target.clone()] })).await.unwrap();
    assert_eq!(ack.refused[0].code, Code::PermissionDenied as i32);
    let update = pb::Update { instance: Some(target), weight: Some(1), ..Default::default() };
    let ack = orders.send(Msg::Update(update)).await.unwrap();
    assert_eq!(ack.refused[0].code, Code::PermissionDenied as i32);

    let listing = client(&server, Some(PICK)).await.list_instances("payments").await.unwrap();
    assert_eq!(listing.instances.len(), 1);
    assert_eq!((listing.instances[0].port, listing.instances[0].weight), (1, Some(100)), "untouched");
}

#[tokio::test]
async fn the_admin_api_uses_the_same_tokens() {
    let server = server().await;
    let admin = server.server.admin_addr().unwrap();
    let get = |path: &'static str, token: Option<&'static str>| async move {
        let path = match token {
            Some(token) => format!("{path}?token={token}"),
            None => path.to_owned(),
        };
        crate::admin::get(admin, &path).await.0
    };
    for open in ["/healthz", "/readyz", "/"] {
        assert_eq!(get(open, None).await, 200, "{open} stays open");
    }
    // The event stream answers 200 and then streams; its refusals are checked here.
    let guarded = ["/metrics", "/api/services", "/api/services/orders-1", "/api/policies", "/api/events"];
    let _orders = client(&server, Some(ORDERS)).await.register(vec![instance("orders-1", "a", 1)]).await.unwrap();
    for path in guarded {
        assert_eq!(get(path, None).await, 401, "{path} without a token");
        assert_eq!(get(path, Some("not-a-token-at-all-000")).await, 401, "{path} with a wrong token");
        for token in [PICK, ORDERS, PAYMENTS] {
            assert_eq!(get(path, Some(token)).await, 403, "{path} with {token}");
        }
        if path != "/api/events" {
            assert_eq!(get(path, Some(ADMIN)).await, 200, "{path} with the admin token");
        }
        // The metrics scope scrapes and reads nothing else.
        let scraped = if path == "/metrics" { 200 } else { 403 };
        assert_eq!(get(path, Some(METRICS)).await, scraped, "{path} with the metrics token");
    }
}
