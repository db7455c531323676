//! Scenario `connections`: idle and slowloris connections against a probe client, over
//! plaintext and over TLS.
//!
//! Each phase starts a server (plaintext, then TLS with a certificate made here by rcgen),
//! registers one instance for the probe to pick, and opens the attack from 127.0.0.2 (see
//! `slowloris`): connections that send nothing, and connections that send the start of
//! an HTTP/2 preface or a TLS ClientHello a byte a second. Once they are open, a probe from
//! 127.0.0.1 opens a *new* connection every few hundred milliseconds (TLS handshake included),
//! picks once and records how long it took. The check: every probe picks within 5 s. A server
//! that lets one peer's stalled connections use up its accept or handshake capacity fails it.
//!
//! Three probes run before the attack, so a probe that fails for another reason is told apart.
//! The server runs with its default limits.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use tokio::time::Instant;

use super::slowloris::{Attack, Tallies, hold};
use super::{CALL_TIMEOUT, Check, ScenarioReport, SoakError, SoakOptions, Target, bounded, ms};
use crate::client::{PickOptions, RotaClient, TlsOptions};
use crate::pb;

/// Each probe must connect and pick within this.
/// Locked out means no answer at all while the attack lasts (a silent connection used to hold
/// its place for good); 5 s leaves room for two cores shared with the attackers themselves,
/// whose connection churn alone delayed a probe past 2 s on a loaded machine.
const PROBE_BOUND: Duration = Duration::from_secs(5);
const PROBE_EVERY: Duration = Duration::from_millis(300);
const SERVICE: &str = "probe-target";

struct Sizing {
    /// Attacker connections of each of the two kinds.
    per_kind: usize,
    /// How long the probes run once the attack is in place.
    window: Duration,
}

pub async fn run(options: &SoakOptions, report: &mut ScenarioReport) -> Result<(), SoakError> {
    let sizing = Sizing {
        per_kind: options.pick(300, 1000),
        window: options.pick(Duration::from_secs(10), Duration::from_secs(60)),
    };
    let target = options.target(&[])?;
    phase(report, target, None, [Attack::Idle, Attack::SlowPreface], &sizing).await?;
    if options.server.is_some() {
        report.notice("TLS phase skipped: it needs a server started with a certificate made here");
        return Ok(());
    }
    let pki = Pki::write()?;
    let flags =
        ["--tls-cert".to_owned(), pki.cert.display().to_string(), "--tls-key".into(), pki.key.display().to_string()];
    let target = Target::spawn(&flags, "https")?;
    let tls = TlsOptions { ca_pem: Some(pki.ca_pem.clone().into_bytes()), client_identity: None, domain: None };
    phase(report, target, Some(tls), [Attack::Idle, Attack::SlowClientHello], &sizing).await
}

/// One transport: attack, probe, report.
async fn phase(
    report: &mut ScenarioReport,
    mut target: Target,
    tls: Option<TlsOptions>,
    attacks: [Attack; 2],
    sizing: &Sizing,
) -> Result<(), SoakError> {
    let label = if tls.is_some() { "tls" } else { "plaintext" };
    let server: SocketAddr = target
        .addr
        .parse()
        .map_err(|_| SoakError::Setup(format!("server address {:?} is not IP:PORT", target.addr)))?;
    let mut provider = bounded("connect", connect(&target.endpoint, &tls)).await?;
    let instance = pb::Instance {
        id: "probe-0".into(),
        service: SERVICE.into(),
        host: "127.0.0.1".into(),
        port: 20_000,
        ..Default::default()
    };
    let registration = bounded("register the probe's instance", provider.register(vec![instance])).await?;
    registration.require_all_accepted()?;

    let baseline = probes(&target.endpoint, &tls, 3, Instant::now() + Duration::from_secs(10)).await;

    let tallies = Arc::new(Tallies::default());
    let ramp = Duration::from_secs(5);
    let until = Instant::now() + ramp + sizing.window;
    let mut attackers = Vec::new();
    for attack in attacks {
        for _ in 0..sizing.per_kind {
            attackers.push(tokio::spawn(hold(server, attack, until, tallies.clone())));
        }
    }
    // Give the attack its ramp (pacing, not synchronisation: the probes judge the server
    // whatever the attackers managed to open).
    tokio::time::sleep(ramp).await;
    let held_at_start = tallies.open.load(Ordering::Relaxed);
    let under_attack = probes(&target.endpoint, &tls, usize::MAX, until).await;
    let held_at_end = tallies.open.load(Ordering::Relaxed);
    for attacker in attackers {
        let _ = attacker.await;
    }
    drop(registration);

    report.figure(
        &format!("{label} attackers"),
        format!(
            "{} planned ({:?} + {:?}), held {held_at_start} when probing began, {held_at_end} at the end, peak {}",
            2 * sizing.per_kind,
            attacks[0],
            attacks[1],
            tallies.peak.load(Ordering::Relaxed)
        ),
    );
    report.figure(
        &format!("{label} attacker churn"),
        format!(
            "{} connects, {} closed by the server, {} refused or timed out",
            tallies.connected.load(Ordering::Relaxed),
            tallies.closed_by_server.load(Ordering::Relaxed),
            tallies.refused.load(Ordering::Relaxed)
        ),
    );
    report
        .figure(&format!("{label} probes ok / failed"), format!("{} / {}", under_attack.ok, under_attack.failed.len()));
    report.figure(
        &format!("{label} probe p50 / max"),
        match under_attack.ok {
            0 => "no probe succeeded".to_owned(),
            _ => format!("{} / {}", ms(under_attack.quantile(0.5)), ms(under_attack.worst())),
        },
    );
    let key = format!("{label}: {}/{} probes ok", under_attack.ok, under_attack.ok + under_attack.failed.len());
    report.key = if report.key.is_empty() { key } else { format!("{}; {key}", report.key) };
    report.check(Check::new(
        format!("{label}: probe picks before the attack"),
        baseline.failed.is_empty() && baseline.ok > 0,
        format!("{} ok, {} failed{}", baseline.ok, baseline.failed.len(), baseline.first_failure()),
    ));
    report.check(Check::new(
        format!("{label}: every probe picks within {} s under attack", PROBE_BOUND.as_secs()),
        under_attack.failed.is_empty() && under_attack.ok > 0,
        format!(
            "{} ok, {} failed, slowest ok {}{}",
            under_attack.ok,
            under_attack.failed.len(),
            if under_attack.ok == 0 { "none".to_owned() } else { ms(under_attack.worst()) },
            under_attack.first_failure()
        ),
    ));
    if let Some(check) = target.alive_check() {
        report.check(Check { name: format!("{label}: {}", check.name), ..check });
    }
    Ok(())
}

async fn connect(endpoint: &str, tls: &Option<TlsOptions>) -> Result<RotaClient, SoakError> {
    let client = match tls {
        Some(tls) => RotaClient::connect_tls(endpoint, tls.clone()).await?,
        None => RotaClient::connect(endpoint).await?,
    };
    // The soak judges a slow pick against its own CALL_TIMEOUT (a stall); the client deadline lies beyond it.
    Ok(client.with_pick_timeout(2 * CALL_TIMEOUT))
}

#[derive(Debug, Default)]
struct Probes {
    ok: usize,
    latencies: Vec<Duration>,
    /// When (seconds into the probing) and why.
    failed: Vec<(f64, String)>,
}

impl Probes {
    fn quantile(&self, q: f64) -> Duration {
        let mut sorted = self.latencies.clone();
        sorted.sort_unstable();
        sorted.get(((sorted.len() as f64 - 1.0) * q).round() as usize).copied().unwrap_or_default()
    }

    fn worst(&self) -> Duration {
        self.latencies.iter().copied().max().unwrap_or_default()
    }

    fn first_failure(&self) -> String {
        match self.failed.first() {
            Some((at, why)) => format!("; first failure {at:.1} s in: {why}"),
            None => String::new(),
        }
    }
}

/// Up to `count` probes until `until`, one every [`PROBE_EVERY`]: each a new connection and
/// one pick, within [`PROBE_BOUND`].
async fn probes(endpoint: &str, tls: &Option<TlsOptions>, count: usize, until: Instant) -> Probes {
    let mut probes = Probes::default();
    let started = Instant::now();
    let mut next = started;
    for _ in 0..count {
        tokio::time::sleep_until(next).await;
        if Instant::now() >= until {
            break;
        }
        next = Instant::now() + PROBE_EVERY;
        let sent = Instant::now();
        let attempt = async {
            let mut client = connect(endpoint, tls).await?;
            client.pick(SERVICE, PickOptions::default()).await.map_err(SoakError::from)
        };
        match tokio::time::timeout(PROBE_BOUND, attempt).await {
            Ok(Ok(_)) => {
                probes.ok += 1;
                probes.latencies.push(sent.elapsed());
            }
            Ok(Err(error)) => probes.failed.push(((sent - started).as_secs_f64(), error.to_string())),
            Err(_) => probes
                .failed
                .push(((sent - started).as_secs_f64(), format!("no answer within {} s", PROBE_BOUND.as_secs()))),
        }
    }
    probes
}

/// A CA and a server certificate for 127.0.0.1 and localhost, written to a directory of their
/// own that is removed afterwards.
struct Pki {
    dir: std::path::PathBuf,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
    ca_pem: String,
}

impl Pki {
    fn write() -> Result<Self, SoakError> {
        let failed = |e: rcgen::Error| SoakError::Setup(format!("cannot make a test certificate: {e}"));
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(failed)?;
        ca.distinguished_name.push(DnType::CommonName, "rota soak CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let ca_key = KeyPair::generate().map_err(failed)?;
        let ca_pem = ca.self_signed(&ca_key).map_err(failed)?.pem();
        let issuer = Issuer::new(ca, ca_key);
        let leaf = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()]).map_err(failed)?;
        let leaf_key = KeyPair::generate().map_err(failed)?;
        let leaf_pem = leaf.signed_by(&leaf_key, &issuer).map_err(failed)?.pem();

        let dir = std::env::temp_dir().join(format!("rota-soak-tls-{}", std::process::id()));
        let io = |e: std::io::Error| SoakError::Setup(format!("cannot write the test certificate: {e}"));
        std::fs::create_dir_all(&dir).map_err(io)?;
        let (cert, key) = (dir.join("server.pem"), dir.join("server.key"));
        std::fs::write(&cert, leaf_pem).map_err(io)?;
        std::fs::write(&key, leaf_key.serialize_pem()).map_err(io)?;
        Ok(Self { dir, cert, key, ca_pem })
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
