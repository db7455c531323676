//! A `redis-server` for a command that needs one of its own: no persistence, a free loopback
//! port, killed when dropped.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::CliError;

/// How long a fresh `redis-server` has to answer `PING`.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// A `redis-server` this command started; killed (and reaped) when dropped, also on an error
/// path or a panic.
pub(super) struct RedisProcess(Child);

impl Drop for RedisProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `redis-server` without persistence on a free loopback port; returns it and its
/// address (`redis://127.0.0.1:PORT`, no database) once it answers `PING`.
pub(super) async fn start_redis() -> Result<(RedisProcess, String), CliError> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
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
    let mut process = RedisProcess(child);
    let url = format!("redis://127.0.0.1:{port}");
    let deadline = Instant::now() + START_TIMEOUT;
    while query::<String>(&url, &["PING"]).await.is_err() {
        if let Some(status) = process.0.try_wait()? {
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
pub(super) async fn query<T: redis::FromRedisValue>(url: &str, args: &[&str]) -> redis::RedisResult<T> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let mut command = redis::cmd(args[0]);
    for arg in &args[1..] {
        command.arg(*arg);
    }
    command.query_async(&mut conn).await
}
