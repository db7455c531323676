//! A `redis-server` for a command that needs one of its own: no persistence, a free loopback
//! port (or a given one, to stand in for a Redis that restarted), killed when dropped. Used by
//! `rota demo`, `rota bench` and the soak's `redis` scenario.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::CliError;

/// How long a fresh `redis-server` has to answer `PING`.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A `redis-server` this command started; killed (and reaped) when dropped, also on an error
/// path or a panic.
pub(crate) struct RedisProcess {
    /// `None` once killed.
    child: Option<Child>,
    port: u16,
}

impl RedisProcess {
    /// The loopback port it listens on.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }

    /// Kills it with SIGKILL (nothing is saved, its data is gone) and reaps it, off the async
    /// runtime. The port is free again when this returns.
    pub(crate) async fn kill(mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = tokio::task::spawn_blocking(move || {
                let _ = child.kill();
                let _ = child.wait();
            })
            .await;
        }
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Starts `redis-server` without persistence on a free loopback port; returns it and its
/// address (`redis://127.0.0.1:PORT`, no database) once it answers `PING`.
pub(crate) async fn start_redis() -> Result<(RedisProcess, String), CliError> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    start_redis_on(port).await
}

/// Starts `redis-server` without persistence on loopback port `port` (a Redis that restarted
/// empty where the old one was); returns it and its address once it answers `PING`.
pub(crate) async fn start_redis_on(port: u16) -> Result<(RedisProcess, String), CliError> {
    let child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string(), "--save", "", "--appendonly", "no"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .map_err(|e| {
            let hint = if e.kind() == std::io::ErrorKind::NotFound {
                "redis-server is not installed (or not on PATH): install Redis, e.g. `apt-get install redis-server` \
                 or scripts/install-redis.sh"
                    .to_owned()
            } else {
                format!("cannot start redis-server: {e}")
            };
            CliError::Usage(hint)
        })?;
    let mut process = RedisProcess { child: Some(child), port };
    let url = format!("redis://127.0.0.1:{port}");
    let deadline = Instant::now() + START_TIMEOUT;
    while query::<String>(&url, &["PING"]).await.is_err() {
        if let Some(status) = process.child.as_mut().and_then(|c| c.try_wait().transpose()).transpose()? {
            return Err(CliError::Usage(format!("redis-server on 127.0.0.1:{port} exited at start ({status})")));
        }
        if Instant::now() > deadline {
            return Err(CliError::Usage(format!("redis-server did not answer PING within {START_TIMEOUT:?}")));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((process, url))
}

/// Runs one command on a fresh connection to `url`.
pub(crate) async fn query<T: redis::FromRedisValue>(url: &str, args: &[&str]) -> redis::RedisResult<T> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let mut command = redis::cmd(args[0]);
    for arg in &args[1..] {
        command.arg(*arg);
    }
    command.query_async(&mut conn).await
}
