//! Plain words for the transport failures a client misconfigured against a TLS rota runs into,
//! and the checks of its TLS settings that can be made before connecting.
//!
//! tonic reports them as `UNKNOWN: transport error` or `INTERNAL: h2 protocol error`; the cause
//! is further down the error's sources: a TLS alert from rota (it requires a client
//! certificate), or the GOAWAY with which rota's TLS listener answers a plaintext HTTP/2 client
//! ([`PLAINTEXT_GOAWAY`]). [`explain`] finds it and says what to change.

use rustls::AlertDescription;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::tls_refusal::PLAINTEXT_GOAWAY;

/// What the client is told when rota requires a client certificate and it presented none.
pub const CLIENT_CERTIFICATE_REQUIRED: &str = "rota requires a client certificate (mTLS) and this client presented none: \
     give one (rota --tls-cert/--tls-key, ROTA_TLS_CERT/ROTA_TLS_KEY)";

/// What the client is told when it spoke plaintext to rota's TLS listener.
pub const SERVER_SPEAKS_TLS: &str = "rota at this address serves TLS: use https:// (with --tls-ca or ROTA_TLS_CA \
     unless its certificate is signed by a CA the system trusts)";

/// A plain explanation of `error` when one of its sources is a failure this module knows.
pub fn explain(error: &(dyn std::error::Error + 'static)) -> Option<&'static str> {
    let mut source = Some(error);
    while let Some(cause) = source {
        // tokio-rustls wraps rustls's error in an io::Error, whose source() skips it.
        let wrapped = cause.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref());
        let tls = cause.downcast_ref::<rustls::Error>().or_else(|| wrapped.and_then(|e| e.downcast_ref()));
        if let Some(rustls::Error::AlertReceived(AlertDescription::CertificateRequired)) = tls {
            return Some(CLIENT_CERTIFICATE_REQUIRED);
        }
        if cause.to_string().contains(PLAINTEXT_GOAWAY) {
            return Some(SERVER_SPEAKS_TLS);
        }
        source = cause.source();
    }
    None
}

/// The status a call ends with, in plain words when [`explain`] knows its transport failure:
/// then `UNAVAILABLE` (rota cannot be used as configured) with the explanation and the causes.
pub fn explained(status: tonic::Status) -> tonic::Status {
    match explain(&status) {
        Some(explanation) => tonic::Status::unavailable(format!("{explanation} ({})", status.message())),
        None => status,
    }
}

/// Checks a PEM client certificate before it is offered: rota (webpki) accepts X.509 v3 only,
/// and would refuse a v1 or v2 certificate with a bare `BadCertificate` alert.
pub fn check_client_certificate(pem: &[u8]) -> Result<(), String> {
    let first = CertificateDer::pem_slice_iter(pem)
        .next()
        .ok_or("the client certificate file holds no PEM certificate (BEGIN CERTIFICATE)")?
        .map_err(|e| format!("the client certificate is not PEM: {e}"))?;
    match x509_version(&first) {
        Some(3) => Ok(()),
        Some(version) => Err(format!(
            "the client certificate is X.509 v{version}; rota accepts only v3 certificates \
             (issue it with extensions, e.g. `openssl x509 -req -extfile` with extendedKeyUsage = clientAuth)"
        )),
        None => Err("the client certificate is not a DER X.509 certificate".into()),
    }
}

/// The X.509 version of a DER certificate (RFC 5280 §4.1): `[0] EXPLICIT INTEGER` at the start of
/// the TBSCertificate, absent for v1.
pub fn x509_version(der: &[u8]) -> Option<u8> {
    let (certificate, _) = der_element(der, 0x30)?;
    let (tbs, _) = der_element(certificate, 0x30)?;
    if tbs.first() != Some(&0xa0) {
        return Some(1);
    }
    let (explicit, _) = der_element(tbs, 0xa0)?;
    let (version, _) = der_element(explicit, 0x02)?;
    match version {
        [v @ 0..=2] => Some(v + 1),
        _ => None,
    }
}

/// The contents of the DER element of tag `tag` at the start of `input`, and what follows it.
fn der_element(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (&first, rest) = input.split_first()?;
    if first != tag {
        return None;
    }
    let (&length, rest) = rest.split_first()?;
    let (length, rest) = if length < 0x80 {
        (usize::from(length), rest)
    } else {
        let octets = usize::from(length & 0x7f);
        if octets == 0 || octets > 4 || rest.len() < octets {
            return None;
        }
        let value = rest[..octets].iter().fold(0usize, |n, &b| (n << 8) | usize::from(b));
        (value, &rest[octets..])
    };
    (rest.len() >= length).then(|| rest.split_at(length))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_field_is_read_and_absent_means_v1() {
        // SEQUENCE { SEQUENCE { [0] { INTEGER 2 }, INTEGER 1 } }: a v3 TBSCertificate's start.
        assert_eq!(x509_version(&[0x30, 0x0a, 0x30, 0x08, 0xa0, 0x03, 0x02, 0x01, 0x02, 0x02, 0x01, 0x01]), Some(3));
        // SEQUENCE { SEQUENCE { INTEGER 1 } }: no version field, v1.
        assert_eq!(x509_version(&[0x30, 0x05, 0x30, 0x03, 0x02, 0x01, 0x01]), Some(1));
        assert_eq!(x509_version(&[0x30, 0x05, 0x30, 0x09]), None, "a length past the end");
        assert_eq!(x509_version(b"not der"), None);
    }

    #[test]
    fn a_certificate_required_alert_under_a_transport_error_is_named() {
        let alert = rustls::Error::AlertReceived(AlertDescription::CertificateRequired);
        let status = tonic::Status::from_error(Box::new(std::io::Error::other(alert)));
        let explained = explained(status);
        assert_eq!(explained.code(), tonic::Code::Unavailable);
        assert!(explained.message().starts_with(CLIENT_CERTIFICATE_REQUIRED), "{}", explained.message());

        let other = tonic::Status::from_error(Box::new(rustls::Error::AlertReceived(AlertDescription::BadCertificate)));
        assert_eq!(explained_code(other), tonic::Code::Unknown, "an alert it cannot explain stays as it was");
    }

    fn explained_code(status: tonic::Status) -> tonic::Code {
        explained(status).code()
    }
}
