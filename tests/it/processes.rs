//! `rota serve` as a process of its own on a free loopback port, for the tests that run the
//! binary as a user does or kill a server outright.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStderr, Command, ExitStatus, Stdio};

pub const BIN: &str = env!("CARGO_BIN_EXE_rota");

/// A `rota` process; killed (SIGKILL) and reaped when dropped.
pub struct Serving {
    pub child: Child,
    /// `http://ADDR` of its gRPC listener (empty for a process that is not a server).
    pub endpoint: String,
}

impl Serving {
    /// Kills the process (SIGKILL: no drain, no goodbye to anyone) and reaps it.
    pub fn kill(&mut self) -> std::io::Result<ExitStatus> {
        self.child.kill()?;
        self.child.wait()
    }
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.kill();
    }
}

/// `rota serve --listen LISTEN EXTRA...`, its log discarded, once it has printed its address.
/// No warm-up and no admin listener unless `extra` asks for them (a flag wins over the
/// environment).
pub fn serve(listen: &str, extra: &[&str]) -> Serving {
    start(listen, extra, "warn", Stdio::null())
}

/// As [`serve`], logging at info level to the returned stderr.
pub fn serve_logged(listen: &str, extra: &[&str]) -> (Serving, ChildStderr) {
    let mut serving = start(listen, extra, "info", Stdio::piped());
    let stderr = serving.child.stderr.take().expect("stderr is piped");
    (serving, stderr)
}

fn start(listen: &str, extra: &[&str], log: &str, stderr: Stdio) -> Serving {
    let child = Command::new(BIN)
        .args(["serve", "--listen", listen])
        .args(extra)
        .env("ROTA_WARMUP", "0s")
        .env("ROTA_ADMIN_LISTEN", "off")
        .env("RUST_LOG", log)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("rota serve starts");
    let mut serving = Serving { child, endpoint: String::new() };
    let mut first = String::new();
    BufReader::new(serving.child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    let addr = first.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("first line was {first:?}"));
    assert!(addr.starts_with("127.0.0.1:") && !addr.ends_with(":0"), "{addr}");
    serving.endpoint = format!("http://{addr}");
    serving
}
