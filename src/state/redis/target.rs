//! Where the shared state lives, as `--state` names it.
//!
//! - `redis://[[USER]:PASSWORD@]HOST:PORT[/DB]`: one Redis server.
//! - `redis+sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER[/DB]`: the primary of
//!   the master set `MASTER`, as the listed sentinels know it; the credentials are the data
//!   servers' (the sentinels are asked without them).
//! - `redis+cluster://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]`: a Redis Cluster, reached
//!   through any of the listed nodes (database 0, the only one a Cluster has).

use std::fmt;
use std::time::Duration;

use redis::{ConnectionInfo, IntoConnectionInfo};

/// How to reach the Redis primary.
#[derive(Clone, PartialEq, Eq)]
pub struct Target {
    kind: Kind,
    db: i64,
    username: Option<String>,
    password: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Direct(String),
    Sentinel { sentinels: Vec<String>, master: String },
    Cluster(Vec<String>),
}

impl fmt::Debug for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

/// Printed without the password.
impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.write(f, true)
    }
}

impl Target {
    /// The address as [`Target::parse`] takes it, password included.
    pub fn to_url(&self) -> String {
        struct Url<'a>(&'a Target);
        impl fmt::Display for Url<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                self.0.write(f, false)
            }
        }
        Url(self).to_string()
    }

    fn write(&self, f: &mut fmt::Formatter<'_>, redact: bool) -> fmt::Result {
        let auth = match (&self.username, &self.password) {
            (_, Some(password)) => {
                format!("{}:{}@", self.username.as_deref().unwrap_or(""), if redact { "***" } else { password })
            }
            (Some(user), None) => format!("{user}@"),
            (None, None) => String::new(),
        };
        match &self.kind {
            Kind::Direct(addr) => write!(f, "redis://{auth}{addr}/{}", self.db),
            Kind::Sentinel { sentinels, master } => {
                write!(f, "redis+sentinel://{auth}{}/{master}/{}", sentinels.join(","), self.db)
            }
            Kind::Cluster(nodes) => write!(f, "redis+cluster://{auth}{}", nodes.join(",")),
        }
    }
}

impl Target {
    /// Parses a `redis://`, `redis+sentinel://` or `redis+cluster://` address; the error says
    /// what is wrong.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (scheme, rest) = if let Some(rest) = text.strip_prefix("redis+sentinel://") {
            ("sentinel", rest)
        } else if let Some(rest) = text.strip_prefix("redis+cluster://") {
            ("cluster", rest)
        } else if let Some(rest) = text.strip_prefix("redis://") {
            ("direct", rest)
        } else {
            return Err(format!(
                "must be `memory`, `redis://HOST:PORT[/DB]`, `redis+sentinel://HOST:PORT[,HOST:PORT...]/MASTER[/DB]` or `redis+cluster://HOST:PORT[,HOST:PORT...]`, got {text:?}"
            ));
        };
        let (auth, rest) = match rest.rsplit_once('@') {
            Some((auth, rest)) => (Some(auth), rest),
            None => (None, rest),
        };
        let (username, password) = match auth {
            None => (None, None),
            Some(auth) => match auth.split_once(':') {
                Some((user, password)) => ((!user.is_empty()).then(|| user.to_owned()), Some(password.to_owned())),
                None => (Some(auth.to_owned()), None),
            },
        };
        let mut parts = rest.split('/');
        let hosts = parts.next().unwrap_or_default();
        let addrs: Vec<String> = hosts.split(',').map(str::to_owned).collect();
        for addr in &addrs {
            check_addr(addr)?;
        }
        let (kind, db) = match scheme {
            "sentinel" => {
                let master = parts.next().filter(|m| !m.is_empty()).ok_or_else(|| {
                    format!("a sentinel address names its master set: redis+sentinel://HOST:PORT/MASTER, got {text:?}")
                })?;
                (Kind::Sentinel { sentinels: addrs, master: master.to_owned() }, parts.next())
            }
            "cluster" => {
                if let Some(db) = parts.next().filter(|d| !d.is_empty()) {
                    return Err(format!("a Redis Cluster has database 0 only; remove {db:?} from {text:?}"));
                }
                (Kind::Cluster(addrs), None)
            }
            _ => {
                if addrs.len() != 1 {
                    return Err(format!(
                        "redis:// names one server (use redis+sentinel:// or redis+cluster:// for several), got {text:?}"
                    ));
                }
                (Kind::Direct(addrs.into_iter().next().unwrap_or_default()), parts.next())
            }
        };
        let db = match db.filter(|d| !d.is_empty()) {
            None => 0,
            Some(db) => db
                .parse::<i64>()
                .ok()
                .filter(|d| (0..=15).contains(d))
                .ok_or_else(|| format!("the database must be a number from 0 to 15, got {db:?} in {text:?}"))?,
        };
        if let Some(extra) = parts.next() {
            return Err(format!("unexpected {extra:?} after the database in {text:?}"));
        }
        Ok(Self { kind, db, username, password })
    }

    /// The nodes of a Cluster; `None` for one server (direct or through Sentinel).
    pub fn cluster_nodes(&self) -> Option<&[String]> {
        match &self.kind {
            Kind::Cluster(nodes) => Some(nodes),
            _ => None,
        }
    }

    /// The `HOST:PORT` of the server to write to: the direct address, or the primary the first
    /// answering sentinel names (for a Cluster, the first node listed: the Cluster client finds
    /// the others).
    pub async fn primary(&self) -> Result<String, String> {
        match &self.kind {
            Kind::Direct(addr) => Ok(addr.clone()),
            Kind::Cluster(nodes) => Ok(nodes.first().cloned().unwrap_or_default()),
            Kind::Sentinel { sentinels, master } => {
                let mut failures = Vec::new();
                for sentinel in sentinels {
                    match ask_sentinel(sentinel, master).await {
                        Ok(addr) => return Ok(addr),
                        Err(why) => failures.push(format!("{sentinel}: {why}")),
                    }
                }
                Err(format!("no sentinel named the primary of {master:?} ({})", failures.join("; ")))
            }
        }
    }

    /// `info` with this target's database and credentials.
    pub fn apply_credentials(&self, info: ConnectionInfo) -> ConnectionInfo {
        let mut settings = info.redis_settings().clone().set_db(self.db);
        if let Some(user) = &self.username {
            settings = settings.set_username(user.clone());
        }
        if let Some(password) = &self.password {
            settings = settings.set_password(password.clone());
        }
        info.set_redis_settings(settings)
    }
}

/// Longest wait for a sentinel to connect or answer.
const SENTINEL_TIMEOUT: Duration = Duration::from_millis(500);

fn check_addr(addr: &str) -> Result<(), String> {
    let port = addr.rsplit_once(':').map(|(host, port)| (host, port.parse::<u16>()));
    match port {
        Some((host, Ok(port))) if !host.is_empty() && port != 0 => Ok(()),
        _ => Err(format!("expected HOST:PORT, got {addr:?}")),
    }
}

async fn ask_sentinel(sentinel: &str, master: &str) -> Result<String, String> {
    let info = format!("redis://{sentinel}/").into_connection_info().map_err(|e| e.to_string())?;
    let client = redis::Client::open(info).map_err(|e| e.to_string())?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(SENTINEL_TIMEOUT))
        .set_response_timeout(Some(SENTINEL_TIMEOUT));
    let mut conn = client.get_multiplexed_async_connection_with_config(&config).await.map_err(|e| e.to_string())?;
    let answer: Option<(String, u16)> = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg(master)
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    match answer {
        Some((host, port)) if host.contains(':') => Ok(format!("[{host}]:{port}")),
        Some((host, port)) => Ok(format!("{host}:{port}")),
        None => Err(format!("does not know master set {master:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn direct_and_sentinel_addresses_parse() {
        let direct = Target::parse("redis://127.0.0.1:6379/2").unwrap();
        assert_eq!(direct.kind, Kind::Direct("127.0.0.1:6379".into()));
        assert_eq!(direct.db, 2);
        let sentinel = Target::parse("redis+sentinel://:secret@127.0.0.1:26379,127.0.0.1:26380/main").unwrap();
        assert_eq!(
            sentinel.kind,
            Kind::Sentinel {
                sentinels: vec!["127.0.0.1:26379".into(), "127.0.0.1:26380".into()],
                master: "main".into()
            }
        );
        assert_eq!((sentinel.db, sentinel.password.as_deref()), (0, Some("secret")));
        assert_eq!(sentinel.to_string(), "redis+sentinel://:***@127.0.0.1:26379,127.0.0.1:26380/main/0");
        let cluster = Target::parse("redis+cluster://u:pw@127.0.0.1:7000,127.0.0.1:7001").unwrap();
        assert_eq!(cluster.cluster_nodes(), Some(&["127.0.0.1:7000".to_owned(), "127.0.0.1:7001".to_owned()][..]));
        assert_eq!(cluster.to_string(), "redis+cluster://u:***@127.0.0.1:7000,127.0.0.1:7001");
        assert_eq!(Target::parse(&cluster.to_url()).unwrap(), cluster);
        assert_eq!(direct.cluster_nodes(), None);
    }

    #[test]
    fn bad_addresses_say_what_is_wrong() {
        for (text, expected) in [
            ("memcached://x:1", "must be `memory`"),
            ("redis://127.0.0.1", "expected HOST:PORT"),
            ("redis://127.0.0.1:0", "expected HOST:PORT"),
            ("redis://a:1,b:2", "names one server"),
            ("redis://a:1/16", "from 0 to 15"),
            ("redis://a:1/x", "from 0 to 15"),
            ("redis://a:1/1/2", "unexpected \"2\""),
            ("redis+sentinel://a:1", "names its master set"),
            ("redis+cluster://a:1,b:2/3", "database 0 only"),
            ("redis+cluster://a:1,b", "expected HOST:PORT"),
        ] {
            let error = Target::parse(text).unwrap_err();
            assert!(error.contains(expected), "{text}: {error}");
        }
    }
}
