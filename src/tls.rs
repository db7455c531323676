//! TLS for the gRPC listener, with optional client certificates (mTLS).
//!
//! rota terminates TLS itself (rustls with the ring provider) rather than through tonic, so the
//! certificate, its key and the client CA bundle can be replaced while it runs: the rustls
//! configuration in force sits behind an [`ArcSwap`], every handshake takes the current one, and
//! a task polls the files' modification times every [`POLL_INTERVAL`] (like the policy file
//! reloader) and swaps in a configuration rebuilt from them. Files that do not load are logged
//! and the configuration in force stays.
//!
//! Connections are accepted, capped and timed by the [listener](crate::listener); this module
//! supplies its TLS handshake, and says why it refused one ([`tls_refusal`]).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tracing::{error, info};

use crate::config::files::{self, OffRuntime, modified};
use crate::listener::{Guarded, Handshake};
use crate::tls_refusal::{self, Refusal, RefusalLog};

/// How often the certificate files are checked for a change.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);

/// What the reloader compares: each file's modification time and length.
type Seen =
    (Option<(std::time::SystemTime, u64)>, Option<(std::time::SystemTime, u64)>, Option<(std::time::SystemTime, u64)>);

/// Where the PEM files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// Certificate chain, the server's own certificate first.
    pub cert: PathBuf,
    pub key: PathBuf,
    /// CA bundle that client certificates must chain to; `None` means no client certificates.
    pub client_ca: Option<PathBuf>,
}

/// A PEM file that cannot be read or used; `key` is the setting that named it.
#[derive(Debug, thiserror::Error)]
#[error("{}: {problem}", path.display())]
pub struct TlsError {
    pub key: &'static str,
    pub path: PathBuf,
    pub problem: String,
}

impl TlsError {
    fn new(key: &'static str, path: &Path, problem: impl Into<String>) -> Self {
        Self { key, path: path.to_path_buf(), problem: problem.into() }
    }
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(key: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    files::read(path).map_err(|e| TlsError::new(key, path, format!("cannot read: {e}")))
}

fn certificates(key: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(key, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::new(key, path, format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(TlsError::new(key, path, "no PEM certificate (BEGIN CERTIFICATE) in the file"));
    }
    Ok(certs)
}

/// Reads a certificate chain and its private key, and checks that they belong together.
pub fn load_certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let chain = certificates("server.tls_cert", cert)?;
    let pem = read("server.tls_key", key)?;
    let private = PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| TlsError::new("server.tls_key", key, format!("no PEM private key in the file ({e})")))?;
    CertifiedKey::from_der(chain, private, &provider())
        .map_err(|e| TlsError::new("server.tls_key", key, format!("unusable with the certificate: {e}")))
}

/// Reads a CA bundle for client certificates.
pub fn load_client_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in certificates("server.tls_client_ca", path)? {
        roots
            .add(cert)
            .map_err(|e| TlsError::new("server.tls_client_ca", path, format!("not a CA certificate: {e}")))?;
    }
    Ok(roots)
}

/// Checks that every file loads, without serving anything.
pub fn check(files: &TlsFiles) -> Result<(), TlsError> {
    load_certified_key(&files.cert, &files.key)?;
    if let Some(ca) = &files.client_ca {
        load_client_roots(ca)?;
    }
    Ok(())
}

/// One loaded certificate, handed to every handshake of the configuration built with it.
#[derive(Debug)]
struct FixedCert(Arc<CertifiedKey>);

impl ResolvesServerCert for FixedCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// Loads every file and builds the rustls configuration they describe.
fn build_config(files: &TlsFiles) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let key = Arc::new(load_certified_key(&files.cert, &files.key)?);
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::new("server.tls_cert", &files.cert, e.to_string()))?;
    let builder = match &files.client_ca {
        Some(path) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(load_client_roots(path)?), provider())
                .build()
                .map_err(|e| TlsError::new("server.tls_client_ca", path, e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(Arc::new(FixedCert(key)));
    // gRPC is HTTP/2 only.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Arc::new(config))
}

/// How many times the reloader saw the files change, and what it made of them: the one way
/// to know that a change has been looked at (a refused one changes nothing else).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TlsReloads {
    /// Changes that loaded and are now in force.
    pub applied: u64,
    /// Changes that did not load; the configuration in force stayed.
    pub refused: u64,
}

/// A TLS acceptor whose configuration — certificate, key and client CA — follows the files.
pub struct ReloadingAcceptor {
    /// The configuration in force; each handshake reads it, the reloader replaces it.
    config: Arc<ArcSwap<rustls::ServerConfig>>,
    refusals: Arc<RefusalLog>,
    files: TlsFiles,
    reloads: watch::Sender<TlsReloads>,
}

impl ReloadingAcceptor {
    /// Loads every file; fails before anything is bound if one does not load.
    pub fn new(files: TlsFiles) -> Result<Self, TlsError> {
        let reloads = watch::Sender::new(TlsReloads::default());
        let config = Arc::new(ArcSwap::new(build_config(&files)?));
        Ok(Self { config, refusals: Arc::default(), files, reloads })
    }

    /// Follows the reloader's outcomes.
    pub fn reloads(&self) -> watch::Receiver<TlsReloads> {
        self.reloads.subscribe()
    }

    /// Polls the certificate, key and client CA files and swaps in a new configuration when
    /// any of them changes; connections already open keep theirs. The files are looked at off
    /// the runtime, within [`READ_TIMEOUT`](files::READ_TIMEOUT); a look that hangs is a refused reload.
    pub fn spawn_reloader(&self) -> JoinHandle<()> {
        let config = self.config.clone();
        let files = self.files.clone();
        let reloads = self.reloads.clone();
        let off_runtime = OffRuntime::default();
        tokio::spawn(async move {
            fn seen(files: &TlsFiles) -> Seen {
                (modified(&files.cert), modified(&files.key), files.client_ca.as_deref().and_then(modified))
            }
            let mut last_seen = seen(&files);
            let mut ticker = tokio::time::interval(POLL_INTERVAL);
            loop {
                ticker.tick().await;
                let (watched, read) = (files.clone(), files.clone());
                let look = off_runtime.look(&mut last_seen, false, move || seen(&watched), move || build_config(&read));
                let built = match look.await {
                    None => continue,
                    Some(Ok(built)) => built,
                    Some(Err(stalled)) => Err(TlsError::new("server.tls_cert", &files.cert, stalled.to_string())),
                };
                match built {
                    Ok(new) => {
                        config.store(new);
                        reloads.send_modify(|r| r.applied += 1);
                        info!(cert = %files.cert.display(), "TLS configuration reloaded");
                    }
                    Err(e) => {
                        reloads.send_modify(|r| r.refused += 1);
                        error!(error = %e, "TLS files refused; the configuration in force stays");
                    }
                }
            }
        })
    }

    /// The handshake for the [listener](crate::listener): a TLS handshake with the
    /// configuration in force when the connection was accepted.
    pub fn handshaker(&self) -> TlsHandshake {
        TlsHandshake { config: self.config.clone(), refusals: self.refusals.clone() }
    }
}

/// A TLS handshake on an admitted connection.
#[derive(Clone)]
pub struct TlsHandshake {
    config: Arc<ArcSwap<rustls::ServerConfig>>,
    refusals: Arc<RefusalLog>,
}

/// How long a plaintext client told off with a GOAWAY has to send its first request, and then to
/// close its side: reading what it sends lets its call fail with the GOAWAY's text, and the
/// connection end with a FIN rather than a reset that could discard the GOAWAY unread.
const PLAINTEXT_WAIT: Duration = Duration::from_secs(1);
/// The most a plaintext client's bytes are looked through for its first request.
const PLAINTEXT_READ_LIMIT: usize = 16 * 1024;

/// Tells a plaintext HTTP/2 client, in HTTP/2, that this listener serves TLS, and closes.
async fn refuse_plaintext(mut io: Guarded<TcpStream>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut received = Vec::new();
    let mut chunk = [0u8; 1024];
    let request = async {
        while !tls_refusal::holds_a_request(&received) && received.len() < PLAINTEXT_READ_LIMIT {
            match io.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => received.extend_from_slice(&chunk[..n]),
            }
        }
    };
    let _ = tokio::time::timeout(PLAINTEXT_WAIT, request).await;
    if io.write_all(&tls_refusal::plaintext_goaway()).await.is_err() || io.shutdown().await.is_err() {
        return;
    }
    let drain = async { while matches!(io.read(&mut chunk).await, Ok(n) if n > 0) {} };
    let _ = tokio::time::timeout(PLAINTEXT_WAIT, drain).await;
}

impl Handshake for TlsHandshake {
    type Conn = TlsStream<Guarded<TcpStream>>;

    async fn handshake(&self, io: Guarded<TcpStream>) -> io::Result<Self::Conn> {
        let peer = io.peer_addr();
        // Waits for the first byte (within the listener's handshake timeout) without taking it.
        let mut first = [0u8; 1];
        if matches!(io.get_ref().peek(&mut first).await, Ok(1)) && first[0] == tls_refusal::H2_PREFACE_START[0] {
            let error = io::Error::new(io::ErrorKind::InvalidData, "an HTTP/2 plaintext client on the TLS listener");
            self.refusals.record(Refusal::NotTls, peer, &error);
            refuse_plaintext(io).await;
            return Err(error);
        }
        let accepted = TlsAcceptor::from(self.config.load_full()).accept(io).await;
        if let Err(error) = &accepted {
            self.refusals.record(Refusal::of(error), peer, error);
        }
        accepted
    }

    /// The TLS handshake itself is bounded by the listener; after it, only the idle timeout
    /// applies.
    fn handshake_bytes(&self) -> u64 {
        1
    }
}
