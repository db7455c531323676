//! The server under test: a `rota serve` this process spawns on free loopback ports (the same
//! binary), or one given with `--server URL --server-pid PID`.
//!
//! A spawned server prints `listening on ADDR` and `admin on ADDR` first; a thread reads them
//! and then keeps draining its stdout, so the server never blocks on a full pipe. Its logs go
//! to the soak's stderr at `warn` (`RUST_LOG` overrides), so a server-side complaint shows up
//! next to the check it explains.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use super::SoakError;

/// The longest a spawned server may take to print its addresses.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// Where the scenario's server is.
pub struct Target {
    /// `http://127.0.0.1:PORT` (`https://` for a TLS server).
    pub endpoint: String,
    /// The bound gRPC address, `127.0.0.1:PORT`.
    pub addr: String,
    /// The admin listener (`/metrics`), `127.0.0.1:PORT`, when the server printed it.
    pub admin: Option<String>,
    pub pid: Option<u32>,
    child: Option<Child>,
}

impl Target {
    /// A server someone else runs; it is never stopped by the soak.
    pub fn external(endpoint: &str, pid: Option<u32>) -> Self {
        let addr = endpoint.split("://").nth(1).unwrap_or(endpoint).trim_end_matches('/').to_owned();
        Self { endpoint: endpoint.to_owned(), addr, admin: None, pid, child: None }
    }

    /// Spawns `rota serve` on 127.0.0.1:0 with `extra` flags, and waits for its addresses.
    pub fn spawn(extra: &[String], scheme: &str) -> Result<Self, SoakError> {
        Self::spawn_with_env(extra, scheme, &[])
    }

    /// [`Target::spawn`] with `env` set for the server (e.g. `TOKIO_WORKER_THREADS`).
    pub fn spawn_with_env(extra: &[String], scheme: &str, env: &[(&str, &str)]) -> Result<Self, SoakError> {
        let exe = std::env::current_exe().map_err(|e| SoakError::Server(format!("cannot find this binary: {e}")))?;
        let mut child = Command::new(exe)
            .args(["serve", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
            .args(extra)
            .envs(env.iter().copied())
            // Services are registered before they are picked; `extra` may still ask for a warm-up.
            .env("ROTA_WARMUP", "0s")
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .map_err(|e| SoakError::Server(format!("cannot start rota serve: {e}")))?;
        let stdout = child.stdout.take().expect("stdout is piped");
        let pid = child.id();
        // From here on, dropping the target stops the child.
        let mut target =
            Self { endpoint: String::new(), addr: String::new(), admin: None, pid: Some(pid), child: Some(child) };
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // The receiver is gone after the first line; the rest is drained.
                let _ = tx.send(line);
            }
        });
        let first = rx
            .recv_timeout(START_TIMEOUT)
            .map_err(|_| SoakError::Server("rota serve printed no address (did it start?)".into()))?;
        let addr = first
            .strip_prefix("listening on ")
            .ok_or_else(|| SoakError::Server(format!("unexpected first line from rota serve: {first:?}")))?
            .to_owned();
        target.endpoint = format!("{scheme}://{addr}");
        target.addr = addr;
        // Written together with the first line, so it is already there when the server has one.
        target.admin = rx
            .recv_timeout(Duration::from_secs(1))
            .ok()
            .and_then(|line| line.strip_prefix("admin on ").map(str::to_owned));
        Ok(target)
    }

    /// Whether the server is still running: `None` when it is not ours to know.
    pub fn alive(&mut self) -> Option<bool> {
        match &mut self.child {
            Some(child) => Some(matches!(child.try_wait(), Ok(None))),
            None => self.pid.map(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists()),
        }
    }

    /// Resident memory of the server (VmRSS), in bytes, when its pid is known (Linux).
    pub fn rss(&self) -> Option<u64> {
        resident_bytes(self.pid?)
    }

    /// A check that the server outlived the scenario (a spawned or pid-known server only).
    pub fn alive_check(&mut self) -> Option<super::Check> {
        let alive = self.alive()?;
        let evidence = if alive { "still running".to_owned() } else { "the server process exited".to_owned() };
        Some(super::Check::new("server alive", alive, evidence))
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// VmRSS of a process from /proc/PID/status, in bytes.
pub fn resident_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// `[flag, value]` when this build's `rota serve` has `flag`; otherwise nothing, and a notice
/// on the report saying what running without it means (`otherwise`).
pub fn flag_if_supported(report: &mut super::ScenarioReport, flag: &str, value: &str, otherwise: &str) -> Vec<String> {
    if serve_supports(flag) {
        vec![flag.to_owned(), value.to_owned()]
    } else {
        report.notice(format!("rota serve has no {flag} yet: {otherwise}"));
        Vec::new()
    }
}

/// Whether `rota serve --help` lists `flag`: lets a scenario use a flag the server may not
/// have yet, and say so when it does not.
pub fn serve_supports(flag: &str) -> bool {
    let Ok(exe) = std::env::current_exe() else { return false };
    match Command::new(exe).args(["serve", "--help"]).stderr(Stdio::null()).output() {
        Ok(output) => String::from_utf8_lossy(&output.stdout).split_whitespace().any(|word| word == flag),
        Err(_) => false,
    }
}
