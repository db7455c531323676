//! Why the TLS listener refused a connection, said once in a while rather than per connection.
//!
//! A client misconfigured against a TLS listener fails in ways its own library words poorly
//! (`h2 protocol error`, `transport error`), and rota used to say nothing at all. The handshake
//! sorts its failures into a few [`Refusal`]s; each has one constant log line, written at most
//! once per [`LOG_INTERVAL`] with the number of refusals of that kind since the last line, so a
//! client retrying in a loop (or a scanner) cannot fill the log.
//!
//! A plaintext HTTP/2 client is also told in its own protocol: before its connection is closed
//! it gets an HTTP/2 SETTINGS frame and a GOAWAY frame whose debug data is [`PLAINTEXT_GOAWAY`],
//! which gRPC clients show in their error (grpc-go, tonic and grpc-java print a GOAWAY's debug
//! data), instead of a TLS alert that they would read as a malformed HTTP/2 frame.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{debug, warn};

/// Least time between two log lines of one kind of refusal.
pub const LOG_INTERVAL: Duration = Duration::from_secs(60);

/// The debug data of the GOAWAY a plaintext HTTP/2 client gets from a TLS listener.
pub const PLAINTEXT_GOAWAY: &str = "rota: this listener serves TLS only; connect with https://";

/// The first bytes of a plaintext HTTP/2 connection (RFC 9113 §3.4); no TLS record starts with `P`.
pub const H2_PREFACE_START: &[u8] = b"PRI ";

/// An empty SETTINGS frame (the server's connection preface), then a GOAWAY (last stream 0,
/// PROTOCOL_ERROR) carrying [`PLAINTEXT_GOAWAY`].
pub fn plaintext_goaway() -> Vec<u8> {
    let mut frames = vec![0, 0, 0, 0x4, 0, 0, 0, 0, 0];
    let payload_len = 8 + PLAINTEXT_GOAWAY.len();
    frames.extend_from_slice(&(payload_len as u32).to_be_bytes()[1..]);
    frames.extend_from_slice(&[0x7, 0, 0, 0, 0, 0]);
    frames.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0x1]);
    frames.extend_from_slice(PLAINTEXT_GOAWAY.as_bytes());
    frames
}

/// Whether a plaintext HTTP/2 client's bytes (its preface, then frames) hold its first request
/// (a HEADERS frame): told off before that, a client has no call in flight to fail with the
/// GOAWAY's text, and reports the connection closing instead.
pub fn holds_a_request(received: &[u8]) -> bool {
    const PREFACE_LEN: usize = 24;
    const HEADERS: u8 = 0x1;
    let mut at = PREFACE_LEN;
    while let Some(header) = received.get(at..at + 9) {
        if header[3] == HEADERS {
            return true;
        }
        at += 9 + u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
    }
    false
}

/// What went wrong in a refused TLS handshake, as far as rota can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The client did not speak TLS: a plaintext (`http://`) client on the TLS listener.
    NotTls,
    /// The listener requires a client certificate (mTLS) and the client sent none.
    NoClientCertificate,
    /// The client certificate is X.509 v1, which the certificate verifier does not accept.
    ClientCertificateV1,
    /// The client certificate did not verify (another CA, expired, wrong purpose, ...).
    ClientCertificateRefused,
    /// Anything else (the client gave up, a cipher mismatch, ...): logged at debug only.
    Other,
}

impl Refusal {
    /// Sorts the error of a failed handshake.
    pub fn of(error: &std::io::Error) -> Self {
        use rustls::{CertificateError, Error, InvalidMessage};
        let Some(tls) = error.get_ref().and_then(|inner| inner.downcast_ref::<Error>()) else {
            return Refusal::Other;
        };
        match tls {
            Error::InvalidMessage(InvalidMessage::InvalidContentType | InvalidMessage::UnknownProtocolVersion) => {
                Refusal::NotTls
            }
            Error::NoCertificatesPresented => Refusal::NoClientCertificate,
            Error::InvalidCertificate(CertificateError::Other(other))
                if matches!(other.0.downcast_ref::<webpki::Error>(), Some(webpki::Error::UnsupportedCertVersion)) =>
            {
                Refusal::ClientCertificateV1
            }
            Error::InvalidCertificate(_) => Refusal::ClientCertificateRefused,
            _ => Refusal::Other,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Lets one line through per [`LOG_INTERVAL`], counting those held back.
#[derive(Debug, Default)]
struct Throttle {
    /// When the next line may be written (`None`: at once), and the refusals since the last line.
    state: Mutex<(Option<Instant>, u64)>,
}

impl Throttle {
    /// `Some(refusals held back since the last line)` when a line may be written now.
    fn admit(&self, now: Instant) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let (next, held_back) = &mut *state;
        if next.is_some_and(|next| now < next) {
            *held_back += 1;
            return None;
        }
        *next = Some(now + LOG_INTERVAL);
        Some(std::mem::take(held_back))
    }
}

/// The log of refused handshakes, one throttle per kind, shared by every handshake.
#[derive(Debug, Default)]
pub struct RefusalLog {
    throttles: [Throttle; 4],
}

impl RefusalLog {
    /// Logs `refusal` of the connection from `peer`, unless a line of its kind was written in
    /// the last [`LOG_INTERVAL`]. Returns whether a line was written.
    pub fn record(&self, refusal: Refusal, peer: Option<std::net::SocketAddr>, error: &std::io::Error) -> bool {
        let peer = peer.map(|p| p.to_string()).unwrap_or_default();
        if refusal == Refusal::Other {
            debug!(peer = %peer, error = %error, "TLS handshake failed");
            return false;
        }
        let Some(held_back) = self.throttles[refusal.index()].admit(Instant::now()) else {
            return false;
        };
        match refusal {
            Refusal::NotTls => warn!(
                peer = %peer,
                held_back,
                "a client that does not speak TLS connected to the TLS listener; it must use https://"
            ),
            Refusal::NoClientCertificate => warn!(
                peer = %peer,
                held_back,
                "TLS handshake refused: the client presented no certificate and the listener requires one (tls_client_ca)"
            ),
            Refusal::ClientCertificateV1 => warn!(
                peer = %peer,
                held_back,
                "TLS handshake refused: the client certificate is X.509 v1; only v3 certificates are accepted"
            ),
            Refusal::ClientCertificateRefused => warn!(
                peer = %peer,
                held_back,
                error = %error,
                "TLS handshake refused: the client certificate did not verify against tls_client_ca"
            ),
            Refusal::Other => {}
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_line_per_interval_and_kind_counting_the_rest() {
        let log = RefusalLog::default();
        let error = std::io::Error::other("refused");
        assert!(log.record(Refusal::NotTls, None, &error));
        assert!(!log.record(Refusal::NotTls, None, &error));
        assert!(!log.record(Refusal::NotTls, None, &error));
        assert!(log.record(Refusal::NoClientCertificate, None, &error), "another kind has its own interval");
        tokio::time::advance(LOG_INTERVAL - Duration::from_millis(1)).await;
        assert!(!log.record(Refusal::NotTls, None, &error));
        tokio::time::advance(Duration::from_millis(1)).await;
        let throttle = &log.throttles[Refusal::NotTls.index()];
        assert_eq!(throttle.admit(Instant::now()), Some(3), "the next line counts the three held back");
        assert!(!log.record(Refusal::Other, None, &error), "other failures stay at debug");
    }

    #[test]
    fn handshake_errors_are_sorted_by_cause() {
        use rustls::{CertificateError, Error, InvalidMessage, OtherError};
        let of = |e: Error| Refusal::of(&std::io::Error::new(std::io::ErrorKind::InvalidData, e));
        assert_eq!(of(Error::InvalidMessage(InvalidMessage::InvalidContentType)), Refusal::NotTls);
        assert_eq!(of(Error::NoCertificatesPresented), Refusal::NoClientCertificate);
        let v1 = CertificateError::Other(OtherError(std::sync::Arc::new(webpki::Error::UnsupportedCertVersion)));
        assert_eq!(of(Error::InvalidCertificate(v1)), Refusal::ClientCertificateV1);
        assert_eq!(of(Error::InvalidCertificate(CertificateError::UnknownIssuer)), Refusal::ClientCertificateRefused);
        assert_eq!(of(Error::HandshakeNotComplete), Refusal::Other);
        assert_eq!(Refusal::of(&std::io::Error::other("reset")), Refusal::Other);
    }

    #[test]
    fn a_request_is_found_after_the_preface_and_other_frames() {
        let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        let settings = [0, 0, 6, 0x4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 100];
        let headers = [0, 0, 1, 0x1, 0x4, 0, 0, 0, 1, 0x82];
        let mut received = preface.clone();
        assert!(!holds_a_request(&received));
        received.extend_from_slice(&settings);
        assert!(!holds_a_request(&received), "SETTINGS is no request");
        received.extend_from_slice(&headers[..5]);
        assert!(!holds_a_request(&received), "half a frame header");
        received.extend_from_slice(&headers[5..]);
        assert!(holds_a_request(&received));
    }

    #[test]
    fn the_goaway_is_a_settings_frame_and_a_goaway_frame() {
        let frames = plaintext_goaway();
        assert_eq!(&frames[..9], &[0, 0, 0, 4, 0, 0, 0, 0, 0]);
        let goaway = &frames[9..];
        let length = u32::from_be_bytes([0, goaway[0], goaway[1], goaway[2]]) as usize;
        assert_eq!((goaway[3], length), (7, goaway.len() - 9));
        assert_eq!(&goaway[17..], PLAINTEXT_GOAWAY.as_bytes());
    }
}
