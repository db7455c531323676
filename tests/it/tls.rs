//! TLS and mTLS on the gRPC listener, with certificates made here by rcgen, and the
//! certificate reloaded when its files change.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use rota::client::{RotaClient, TlsOptions};
use rota::config::{Overrides, resolve};
use rota::tls::TlsFiles;

use crate::harness::{PATIENCE, TestServer, instance, picked_id};

/// A certificate authority made for one test.
struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

/// A PEM certificate and its PEM private key.
struct Leaf {
    cert: String,
    key: String,
}

impl TestCa {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        Self { issuer: Issuer::new(params, key), pem }
    }

    fn issue(&self, name: &str, sans: &[&str], usage: ExtendedKeyUsagePurpose) -> Leaf {
        let mut params = CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap().pem();
        Leaf { cert, key: key.serialize_pem() }
    }

    fn server(&self) -> Leaf {
        self.issue("rota", &["localhost", "127.0.0.1"], ExtendedKeyUsagePurpose::ServerAuth)
    }

    fn client(&self) -> Leaf {
        self.issue("consumer", &[], ExtendedKeyUsagePurpose::ClientAuth)
    }
}

/// A directory removed at the end of the test.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let path = std::env::temp_dir().join(format!("rota-tls-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap();
        Self(path)
    }

    /// Writes `text` to `name` atomically: a temporary file renamed over the old one.
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.join(name);
        let temporary = self.0.join(format!(".{name}.new"));
        std::fs::write(&temporary, text).unwrap();
        std::fs::rename(&temporary, &path).unwrap();
        path
    }

    fn files(&self, leaf: &Leaf, client_ca: Option<&TestCa>) -> TlsFiles {
        TlsFiles {
            cert: self.write("server.pem", &leaf.cert),
            key: self.write("server.key", &leaf.key),
            client_ca: client_ca.map(|ca| self.write("client-ca.pem", &ca.pem)),
        }
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn options(ca: &TestCa, identity: Option<&Leaf>) -> TlsOptions {
    TlsOptions {
        ca_pem: Some(ca.pem.clone().into_bytes()),
        client_identity: identity.map(|leaf| (leaf.cert.clone().into_bytes(), leaf.key.clone().into_bytes())),
        domain: Some("localhost".into()),
    }
}

/// Connects and makes one call; an error at either step is the answer.
async fn call(server: &TestServer, tls: Option<TlsOptions>) -> Result<(), String> {
    let attempt = async {
        let mut client = match tls {
            Some(tls) => RotaClient::connect_tls(&server.server.endpoint(), tls).await,
            None => RotaClient::connect(&format!("http://{}", server.server.local_addr())).await,
        }
        .map_err(|e| e.to_string())?;
        client.list_services().await.map(drop).map_err(|e| e.to_string())
    };
    tokio::time::timeout(PATIENCE, attempt).await.unwrap_or_else(|_| Err("timed out".into()))
}

#[tokio::test]
async fn tls_serves_clients_that_trust_its_ca_only() {
    let ca = TestCa::new("rota test CA");
    let dir = TempDir::new("plain");
    let server = TestServer::start_with(|config| config.tls = Some(dir.files(&ca.server(), None))).await;
    assert!(server.server.endpoint().starts_with("https://127.0.0.1:"));

    let mut provider = RotaClient::connect_tls(&server.server.endpoint(), options(&ca, None)).await.unwrap();
    let _registration = provider.register(vec![instance("orders", "o1", 8001)]).await.unwrap();
    let mut consumer = RotaClient::connect_tls(&server.server.endpoint(), options(&ca, None)).await.unwrap();
    let picked = consumer.pick("orders", Default::default()).await.unwrap();
    assert_eq!(picked_id(&picked), "o1");

    assert!(call(&server, None).await.is_err(), "a plaintext client is refused");
    let other = TestCa::new("another CA");
    assert!(call(&server, Some(options(&other, None))).await.is_err(), "a client trusting another CA refuses");
    // A peer that connects and never says a word holds its handshake open; others go on.
    // A peer that connects and never says a word holds its handshake open (up to 10 s); others
    // are answered meanwhile.
    let _silent = tokio::net::TcpStream::connect(server.server.local_addr()).await.unwrap();
    let answered = tokio::time::timeout(Duration::from_secs(5), call(&server, Some(options(&ca, None)))).await;
    assert_eq!(answered, Ok(Ok(())), "failed or stalled handshakes block nobody");
}

#[tokio::test]
async fn mtls_requires_a_client_certificate_from_the_client_ca() {
    let ca = TestCa::new("rota test CA");
    let other = TestCa::new("another CA");
    let dir = TempDir::new("mutual");
    let server = TestServer::start_with(|config| config.tls = Some(dir.files(&ca.server(), Some(&ca)))).await;

    assert!(call(&server, Some(options(&ca, None))).await.is_err(), "no client certificate");
    assert!(call(&server, Some(options(&ca, Some(&other.client())))).await.is_err(), "a certificate from another CA");
    assert_eq!(call(&server, Some(options(&ca, Some(&ca.client())))).await, Ok(()));
}

#[tokio::test]
async fn a_replaced_certificate_is_served_to_new_connections() {
    let first = TestCa::new("first CA");
    let second = TestCa::new("second CA");
    let dir = TempDir::new("reload");
    let server = TestServer::start_with(|config| config.tls = Some(dir.files(&first.server(), None))).await;
    assert_eq!(call(&server, Some(options(&first, None))).await, Ok(()));
    assert!(call(&server, Some(options(&second, None))).await.is_err());

    let mut reloads = server.server.tls_reloads().expect("TLS is on");
    // A file that is not a certificate is refused (the reloader says so), and the certificate
    // in force stays.
    dir.write("server.pem", "not a certificate");
    wait_for_reload(&mut reloads, |r| r.refused >= 1).await;
    assert_eq!(reloads.borrow().applied, 0);
    assert_eq!(call(&server, Some(options(&first, None))).await, Ok(()), "the old certificate stays");

    let replacement = second.server();
    dir.write("server.key", &replacement.key);
    dir.write("server.pem", &replacement.cert);
    // The reloader may see the key before the certificate (a refused pair), then both.
    wait_for_reload(&mut reloads, |r| r.applied >= 1).await;
    assert_eq!(call(&server, Some(options(&second, None))).await, Ok(()), "the new certificate is served");
    assert!(call(&server, Some(options(&first, None))).await.is_err(), "the old certificate is gone");
}

#[tokio::test]
async fn a_replaced_client_ca_decides_for_new_connections() {
    let server_ca = TestCa::new("server CA");
    let (old_clients, new_clients) = (TestCa::new("old client CA"), TestCa::new("new client CA"));
    let (old_client, new_client) = (old_clients.client(), new_clients.client());
    let dir = TempDir::new("reload-ca");
    let files = dir.files(&server_ca.server(), Some(&old_clients));
    let server = TestServer::start_with(|config| config.tls = Some(files)).await;
    assert_eq!(call(&server, Some(options(&server_ca, Some(&old_client)))).await, Ok(()));
    assert!(call(&server, Some(options(&server_ca, Some(&new_client)))).await.is_err());

    let mut reloads = server.server.tls_reloads().expect("TLS is on");
    dir.write("client-ca.pem", &new_clients.pem);
    wait_for_reload(&mut reloads, |r| r.applied >= 1).await;
    assert_eq!(call(&server, Some(options(&server_ca, Some(&new_client)))).await, Ok(()), "the new CA decides");
    assert!(call(&server, Some(options(&server_ca, Some(&old_client)))).await.is_err(), "the old CA is gone");
}

/// Waits (bounded) until the TLS reloader's outcomes satisfy `done`.
async fn wait_for_reload(
    reloads: &mut tokio::sync::watch::Receiver<rota::tls::TlsReloads>,
    done: impl FnMut(&rota::tls::TlsReloads) -> bool,
) {
    tokio::time::timeout(crate::harness::PATIENCE, reloads.wait_for(done))
        .await
        .expect("the reloader saw the change in time")
        .expect("the reloader runs");
}

fn cert_and_key(dir: &TempDir) -> (PathBuf, PathBuf) {
    let leaf = TestCa::new("rota test CA").server();
    (dir.write("server.pem", &leaf.cert), dir.write("server.key", &leaf.key))
}

fn path(p: &Path) -> Option<String> {
    Some(p.display().to_string())
}

#[test]
fn tls_settings_are_checked_before_binding() {
    let dir = TempDir::new("config");
    let (cert, key) = cert_and_key(&dir);
    let error = resolve(None, &Overrides { tls_cert: path(&cert), ..Default::default() }).unwrap_err();
    assert_eq!(error.key, "server.tls_key");
    assert_eq!(error.source_name, "command line / environment");

    let not_pem = dir.write("not.key", "this is not a key\n");
    let overrides = Overrides { tls_cert: path(&cert), tls_key: path(&not_pem), ..Default::default() };
    let error = resolve(None, &overrides).unwrap_err();
    assert_eq!(error.key, "server.tls_key");
    assert!(error.problem.contains("no PEM private key"), "{error}");

    let overrides = Overrides { tls_cert: path(&cert), tls_key: path(&key), ..Default::default() };
    let settings = resolve(None, &overrides).unwrap();
    let tls = settings.serve.tls.as_ref().expect("TLS is on");
    assert_eq!((&tls.cert, &tls.key, &tls.client_ca), (&cert, &key, &None));
    assert!(settings.to_toml().contains(&format!("tls_key = {:?}", key.display().to_string())));

    let output = Command::new(env!("CARGO_BIN_EXE_rota"))
        .args(["serve", "--listen", "127.0.0.1:0", "--admin-listen", "off"])
        .env("ROTA_TLS_CERT", &cert)
        .env_remove("ROTA_TLS_KEY")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(64));
    assert!(output.stdout.is_empty(), "nothing was bound");
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        "rota: command line / environment: server.tls_key: is required when server.tls_cert is set\n"
    );
}

/// `rota serve` with mTLS from flags, and `rota ls` over `https://` with its client certificate.
#[test]
fn the_command_line_serves_and_calls_over_mtls() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;

    let ca = TestCa::new("rota test CA");
    let dir = TempDir::new("cli");
    let files = dir.files(&ca.server(), Some(&ca));
    let ca_path = dir.write("ca.pem", &ca.pem);
    let client = ca.client();
    let client_cert = dir.write("client.pem", &client.cert);
    let client_key = dir.write("client.key", &client.key);

    let mut serve = Command::new(env!("CARGO_BIN_EXE_rota"))
        .args(["serve", "--listen", "127.0.0.1:0", "--admin-listen", "off"])
        .arg("--tls-cert")
        .arg(&files.cert)
        .arg("--tls-key")
        .arg(&files.key)
        .arg("--tls-client-ca")
        .arg(files.client_ca.as_ref().unwrap())
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut line = String::new();
    BufReader::new(serve.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let _serve = Kill(serve);
    let port = line.trim().rsplit(':').next().unwrap().to_owned();
    let server = format!("https://localhost:{port}");

    let ls = |with_identity: bool| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rota"));
        command.args(["ls", "--server", &server]).env("ROTA_TLS_CA", &ca_path);
        if with_identity {
            command.env("ROTA_TLS_CERT", &client_cert).env("ROTA_TLS_KEY", &client_key);
        } else {
            command.env_remove("ROTA_TLS_CERT").env_remove("ROTA_TLS_KEY");
        }
        command.output().unwrap()
    };
    let output = ls(true);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(!ls(false).status.success(), "no client certificate, no answer");
}

#[tokio::test]
async fn the_server_refuses_a_bad_key_at_start() {
    let dir = TempDir::new("start");
    let (cert, _) = cert_and_key(&dir);
    let key = dir.write("not.key", "-----BEGIN PRIVATE KEY-----\nbroken\n-----END PRIVATE KEY-----\n");
    let tls = Some(TlsFiles { cert, key, client_ca: None });
    let config =
        rota::server::ServeConfig { listen: ([127, 0, 0, 1], 0).into(), admin_listen: None, tls, ..Default::default() };
    match rota::server::Server::start(config).await {
        Ok(_) => panic!("a server started with a broken key"),
        Err(e) => assert!(e.to_string().starts_with("server.tls_key: "), "{e}"),
    }
}

/// A TLS slowloris: 300 connections from one address that never finish (or start) a
/// handshake. They fill that address's share of connections only; a client from another
/// address gets in at once, and the silent ones are closed at the handshake timeout.
#[tokio::test]
async fn silent_handshakes_from_one_address_lock_out_no_one_else() {
    let ca = TestCa::new("rota test CA");
    let dir = TempDir::new("slowloris");
    let server = TestServer::start_with(|config| {
        config.tls = Some(dir.files(&ca.server(), None));
        config.limits.connections.handshake_timeout = Duration::from_secs(2);
    })
    .await;
    let addr = server.server.local_addr();
    let mut silent = Vec::new();
    for _ in 0..300 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind(([127, 0, 0, 2], 0).into()).unwrap();
        silent.push(socket.connect(addr).await.unwrap());
    }
    for _ in 0..5 {
        let answered = tokio::time::timeout(Duration::from_secs(5), call(&server, Some(options(&ca, None)))).await;
        assert_eq!(answered, Ok(Ok(())), "a TLS client from another address is served");
    }
    let closed = silent.into_iter().map(|mut stream| async move {
        use tokio::io::AsyncReadExt;
        let mut buf = [0u8; 16];
        matches!(stream.read(&mut buf).await, Ok(0) | Err(_))
    });
    let closed = tokio::time::timeout(PATIENCE, futures_util::future::join_all(closed)).await.expect("closed in time");
    assert!(closed.into_iter().all(|c| c), "every silent connection is closed");
}

/// `rota serve` with mTLS and its log in a file, for the tests of what is said on either side.
struct LoggedServer {
    process: std::process::Child,
    port: String,
    log: PathBuf,
}

impl LoggedServer {
    fn start(dir: &TempDir, files: &TlsFiles) -> Self {
        use std::io::{BufRead, BufReader};
        let log = dir.0.join("serve.log");
        let mut command = Command::new(env!("CARGO_BIN_EXE_rota"));
        command.args(["serve", "--listen", "127.0.0.1:0", "--admin-listen", "off"]);
        command.arg("--tls-cert").arg(&files.cert).arg("--tls-key").arg(&files.key);
        if let Some(ca) = &files.client_ca {
            command.arg("--tls-client-ca").arg(ca);
        }
        let mut process = command
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(process.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let port = line.trim().rsplit(':').next().unwrap().to_owned();
        Self { process, port, log }
    }

    /// `rota ls` against this server at `scheme://host:port`, with `env`; its exit and stderr.
    fn ls(&self, address: &str, env: &[(&str, &Path)]) -> (bool, String) {
        let mut command = Command::new(env!("CARGO_BIN_EXE_rota"));
        command.args(["ls", "--server", &format!("{address}:{}", self.port)]);
        for name in ["ROTA_TLS_CA", "ROTA_TLS_CERT", "ROTA_TLS_KEY", "ROTA_TOKEN", "SSL_CERT_FILE", "SSL_CERT_DIR"] {
            command.env_remove(name);
        }
        command.envs(env.iter().copied());
        let output = command.output().unwrap();
        (output.status.success(), String::from_utf8_lossy(&output.stderr).into_owned())
    }

    /// Stops the server and returns its log.
    fn stop(mut self) -> String {
        let _ = self.process.kill();
        let _ = self.process.wait();
        std::fs::read_to_string(&self.log).unwrap()
    }
}

impl Drop for LoggedServer {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// A plaintext client is told to use https://; the server logs each kind of refusal (plaintext,
/// no client certificate) once, however many times it happens.
#[test]
fn refused_tls_clients_are_told_why_and_the_server_says_so_once() {
    let ca = TestCa::new("rota test CA");
    let dir = TempDir::new("refusals");
    let server = LoggedServer::start(&dir, &dir.files(&ca.server(), Some(&ca)));
    let ca_path = dir.write("ca.pem", &ca.pem);

    for _ in 0..3 {
        let (ok, stderr) = server.ls("http://127.0.0.1", &[]);
        assert!(!ok);
        assert!(stderr.contains(rota::client::transport::SERVER_SPEAKS_TLS), "{stderr}");
    }
    for _ in 0..3 {
        // The client's words depend on whether rota's alert meets the call in flight or the call
        // still queued (then `CANCELLED`); see client::transport's tests for the former.
        let (ok, _) = server.ls("https://localhost", &[("ROTA_TLS_CA", &ca_path)]);
        assert!(!ok);
    }
    let log = server.stop();
    let lines = |needle: &str| log.lines().filter(|line| line.contains(needle)).count();
    assert_eq!(lines("does not speak TLS connected to the TLS listener"), 1, "{log}");
    assert_eq!(lines("the client presented no certificate"), 1, "{log}");
}

/// Without --tls-ca, an https:// server's certificate is checked against the CAs the system
/// trusts (here the test CA, named by SSL_CERT_FILE as an OpenSSL-style store would be).
#[test]
fn https_without_a_ca_trusts_the_system_store() {
    let ca = TestCa::new("rota test CA");
    let dir = TempDir::new("system-store");
    let server = LoggedServer::start(&dir, &dir.files(&ca.server(), None));
    let ca_path = dir.write("ca.pem", &ca.pem);

    let (ok, stderr) = server.ls("https://localhost", &[("SSL_CERT_FILE", &ca_path)]);
    assert!(ok, "{stderr}");
    let other = dir.write("other.pem", &TestCa::new("another CA").pem);
    let (ok, stderr) = server.ls("https://localhost", &[("SSL_CERT_FILE", &other)]);
    assert!(!ok && stderr.contains("UnknownIssuer"), "{stderr}");
}

/// An X.509 v1 client certificate is refused by the client before connecting, saying so.
#[tokio::test]
async fn an_x509_v1_client_certificate_is_refused_by_name() {
    let ca = TestCa::new("rota test CA");
    let dir = TempDir::new("v1");
    let server = TestServer::start_with(|config| config.tls = Some(dir.files(&ca.server(), Some(&ca)))).await;
    let client = ca.client();
    let v1 = Leaf { cert: as_x509_v1(&client.cert), key: client.key.clone() };

    let error = call(&server, Some(options(&ca, Some(&v1)))).await.unwrap_err();
    assert!(error.contains("the client certificate is X.509 v1; rota accepts only v3 certificates"), "{error}");
    assert_eq!(call(&server, Some(options(&ca, Some(&client)))).await, Ok(()), "the v3 original is accepted");
}

/// The certificate of `pem` with its version and extensions taken out: the shape of an X.509
/// v1 certificate (its signature no longer matches, which the version check comes before).
fn as_x509_v1(pem: &str) -> String {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let der = CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
    let certificate = der_children(der_contents(&der));
    let tbs: Vec<u8> = der_children(der_contents(certificate[0]))
        .into_iter()
        .filter(|element| element[0] != 0xa0 && element[0] != 0xa3)
        .flatten()
        .copied()
        .collect();
    let mut contents = der_encode(0x30, &tbs);
    contents.extend(certificate[1..].iter().flat_map(|element| element.iter().copied()));
    let encoded = der_encode(0x30, &contents);
    pem::encode(&pem::Pem::new("CERTIFICATE", encoded))
}

/// The header length and contents length of the DER element at the start of `input`.
fn der_header(input: &[u8]) -> (usize, usize) {
    match input[1] {
        short @ 0..0x80 => (2, usize::from(short)),
        long => {
            let octets = usize::from(long & 0x7f);
            (2 + octets, input[2..2 + octets].iter().fold(0, |n, &b| (n << 8) | usize::from(b)))
        }
    }
}

fn der_contents(element: &[u8]) -> &[u8] {
    let (header, length) = der_header(element);
    &element[header..header + length]
}

/// The elements, header included, that `contents` is made of.
fn der_children(mut contents: &[u8]) -> Vec<&[u8]> {
    let mut children = Vec::new();
    while !contents.is_empty() {
        let (header, length) = der_header(contents);
        let (element, rest) = contents.split_at(header + length);
        children.push(element);
        contents = rest;
    }
    children
}

fn der_encode(tag: u8, contents: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    match contents.len() {
        short @ 0..0x80 => out.push(short as u8),
        long => {
            let bytes = (long as u32).to_be_bytes();
            let skip = bytes.iter().take_while(|&&b| b == 0).count();
            out.push(0x80 | (4 - skip) as u8);
            out.extend_from_slice(&bytes[skip..]);
        }
    }
    out.extend_from_slice(contents);
    out
}
