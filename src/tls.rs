//! TLS for the gRPC listener, with optional client certificates (mTLS).
//!
//! rota terminates TLS itself (rustls with the ring provider) rather than through tonic, so the
//! certificate, its key and the client CA bundle can be replaced while it runs: the rustls
//! configuration in force sits behind an [`ArcSwap`], every handshake takes the current one, and
//! a task polls the files' modification times every [`POLL_INTERVAL`] (like the policy file
//! reloader) and swaps in a configuration rebuilt from them. Files that do not load are logged
//! and the configuration in force stays.
//!
//! Accepting: one task accepts TCP connections and hands each to a handshake task of its own,
//! so a slow or stalled handshake never holds up the next connection; finished handshakes go
//! through a bounded channel to the server. A failed handshake is logged at debug and dropped.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tracing::{debug, error, info, warn};

/// How often the certificate files are checked for a change.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);
/// A handshake not finished in this time is dropped, so a silent peer holds nothing for long.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most handshakes in progress at once; further connections wait to be accepted.
const MAX_HANDSHAKES: usize = 256;
/// Finished handshakes waiting for the server to take them.
const READY_QUEUE: usize = 64;

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
    std::fs::read(path).map_err(|e| TlsError::new(key, path, format!("cannot read: {e}")))
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

/// A TLS acceptor whose configuration — certificate, key and client CA — follows the files.
pub struct ReloadingAcceptor {
    /// The configuration in force; each handshake reads it, the reloader replaces it.
    config: Arc<ArcSwap<rustls::ServerConfig>>,
    files: TlsFiles,
}

impl ReloadingAcceptor {
    /// Loads every file; fails before anything is bound if one does not load.
    pub fn new(files: TlsFiles) -> Result<Self, TlsError> {
        Ok(Self { config: Arc::new(ArcSwap::new(build_config(&files)?)), files })
    }

    /// Polls the certificate, key and client CA files and swaps in a new configuration when
    /// any of them changes; connections already open keep theirs.
    pub fn spawn_reloader(&self) -> JoinHandle<()> {
        let config = self.config.clone();
        let files = self.files.clone();
        tokio::spawn(async move {
            let seen = |files: &TlsFiles| {
                (modified(&files.cert), modified(&files.key), files.client_ca.as_deref().and_then(modified))
            };
            let mut last_seen = seen(&files);
            let mut ticker = tokio::time::interval(POLL_INTERVAL);
            loop {
                ticker.tick().await;
                let now_seen = seen(&files);
                if now_seen == last_seen {
                    continue;
                }
                last_seen = now_seen;
                match build_config(&files) {
                    Ok(new) => {
                        config.store(new);
                        info!(cert = %files.cert.display(), "TLS configuration reloaded");
                    }
                    Err(e) => error!(error = %e, "TLS files refused; the configuration in force stays"),
                }
            }
        })
    }

    /// Accepts connections on `listener` and yields those whose handshake succeeded. The accept
    /// task ends when the returned stream is dropped.
    pub fn incoming(&self, listener: TcpListener) -> TlsIncoming {
        let (ready, queue) = mpsc::channel(READY_QUEUE);
        let config = self.config.clone();
        tokio::spawn(async move {
            let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
            loop {
                let permit = tokio::select! {
                    permit = handshakes.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
                    () = ready.closed() => return,
                };
                let (tcp, peer) = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => accepted,
                        Err(e) => {
                            // Usually out of file descriptors: back off instead of spinning.
                            warn!(error = %e, "accept failed");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            continue;
                        }
                    },
                    () = ready.closed() => return,
                };
                let _ = tcp.set_nodelay(true);
                let acceptor = TlsAcceptor::from(config.load_full());
                let ready = ready.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(tls)) => {
                            drop(permit);
                            let _ = ready.send(tls).await;
                        }
                        Ok(Err(e)) => debug!(peer = %peer, error = %e, "TLS handshake failed"),
                        Err(_) => debug!(peer = %peer, "TLS handshake timed out"),
                    }
                });
            }
        });
        TlsIncoming { queue }
    }
}

/// Connections with a finished handshake, for `serve_with_incoming`.
pub struct TlsIncoming {
    queue: mpsc::Receiver<TlsStream<TcpStream>>,
}

impl futures_util::Stream for TlsIncoming {
    type Item = io::Result<TlsStream<TcpStream>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.queue.poll_recv(cx).map(|tls| tls.map(Ok))
    }
}

fn modified(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}
