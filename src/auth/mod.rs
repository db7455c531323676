//! Who may do what: bearer tokens with scopes.
//!
//! A token grants any of four scopes: `pick` (picks, leases, reports, listings and watches),
//! `register:PATTERN` (register, update and withdraw instances of services whose names match
//! the glob `PATTERN`, e.g. `orders-*`), `admin` (policies and the admin HTTP API, `/metrics`
//! included) and `metrics` (`/metrics` and nothing else, for a Prometheus scraper). Tokens
//! are read from files or environment variables named in the config, never written in it, and
//! a presented token is compared with every configured one in constant time.
//!
//! With no token configured, rota runs without authentication (and then only on loopback unless
//! told otherwise, see `crate::config`).

use std::sync::Arc;

/// One scope a token may grant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Pick,
    Admin,
    Metrics,
    Register(String),
}

impl Scope {
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "pick" => Ok(Scope::Pick),
            "admin" => Ok(Scope::Admin),
            "metrics" => Ok(Scope::Metrics),
            other => match other.strip_prefix("register:") {
                Some(pattern) if !pattern.is_empty() => Ok(Scope::Register(pattern.to_owned())),
                _ => Err(format!("{other:?} is not a scope; scopes: pick, admin, metrics, register:PATTERN")),
            },
        }
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub name: String,
    pub scopes: Vec<Scope>,
}

impl Principal {
    pub fn may_pick(&self) -> bool {
        self.scopes.contains(&Scope::Pick)
    }

    pub fn is_admin(&self) -> bool {
        self.scopes.contains(&Scope::Admin)
    }

    /// Whether this caller may read `/metrics`: the `metrics` scope, or `admin`.
    pub fn may_scrape(&self) -> bool {
        self.scopes.iter().any(|s| matches!(s, Scope::Metrics | Scope::Admin))
    }

    /// Whether this caller may register at least some service.
    pub fn may_register_any(&self) -> bool {
        self.scopes.iter().any(|s| matches!(s, Scope::Register(_)))
    }

    pub fn may_register(&self, service: &str) -> bool {
        self.scopes.iter().any(|s| matches!(s, Scope::Register(pattern) if glob(pattern, service)))
    }
}

/// The configured tokens.
#[derive(Debug, Default)]
pub struct Authenticator {
    tokens: Vec<(Vec<u8>, Arc<Principal>)>,
}

impl Authenticator {
    pub fn new(tokens: Vec<(String, Principal)>) -> Self {
        Self { tokens: tokens.into_iter().map(|(token, p)| (token.into_bytes(), Arc::new(p))).collect() }
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The principal of `presented`, checking every token in constant time so the answer's
    /// timing says nothing about how close a guess was.
    pub fn authenticate(&self, presented: &str) -> Option<Arc<Principal>> {
        let mut found = None;
        for (token, principal) in &self.tokens {
            if constant_time_eq(token, presented.as_bytes()) {
                found = Some(principal.clone());
            }
        }
        found
    }

    /// The principal of an `authorization: Bearer TOKEN` header value.
    pub fn authenticate_header(&self, header: Option<&str>) -> Result<Arc<Principal>, AuthError> {
        let header = header.ok_or(AuthError::Missing)?;
        // The scheme name is case-insensitive (RFC 7235 §2.1): `bearer` and `BEARER` are fine.
        let (scheme, token) = header.trim_start().split_once(' ').ok_or(AuthError::Invalid)?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(AuthError::Invalid);
        }
        self.authenticate(token.trim()).ok_or(AuthError::Invalid)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("no token: send `authorization: Bearer TOKEN`")]
    Missing,
    #[error("the token is not valid")]
    Invalid,
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut difference = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        difference |= usize::from(x ^ y);
    }
    difference == 0
}

/// `*` matches any run of characters; everything else matches itself.
pub fn glob(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((prefix, rest)) => {
            let Some(tail) = text.strip_prefix(prefix) else { return false };
            if rest.is_empty() {
                return true;
            }
            (0..=tail.len()).filter(|i| tail.is_char_boundary(*i)).any(|i| glob(rest, &tail[i..]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob("orders-*", "orders-eu"));
        assert!(glob("orders-*", "orders-"));
        assert!(!glob("orders-*", "payments"));
        assert!(glob("*-eu", "orders-eu"));
        assert!(glob("a*b*c", "axxbyyc"));
        assert!(!glob("a*b*c", "axxbyy"));
        assert!(glob("exact", "exact") && !glob("exact", "exactly"));
    }

    #[test]
    fn tokens_map_to_principals_and_nothing_else() {
        let auth = Authenticator::new(vec![(
            "s3cret".into(),
            Principal { name: "ci".into(), scopes: vec![Scope::Pick, Scope::parse("register:orders-*").unwrap()] },
        )]);
        let ci = auth.authenticate_header(Some("Bearer s3cret")).unwrap();
        assert!(ci.may_pick() && !ci.is_admin() && ci.may_register("orders-1") && !ci.may_register("payments"));
        assert_eq!(auth.authenticate_header(None), Err(AuthError::Missing));
        assert_eq!(auth.authenticate_header(Some("Bearer s3cre")), Err(AuthError::Invalid));
        assert_eq!(auth.authenticate_header(Some("s3cret")), Err(AuthError::Invalid));
        for scheme in ["bearer", "BEARER", "bEaReR"] {
            assert_eq!(auth.authenticate_header(Some(&format!("{scheme} s3cret"))).unwrap().name, "ci");
        }
        assert_eq!(auth.authenticate_header(Some("Basic s3cret")), Err(AuthError::Invalid));
        assert!(Scope::parse("root").is_err() && Scope::parse("register:").is_err());
    }

    #[test]
    fn the_metrics_scope_reads_metrics_and_grants_nothing_else() {
        let scraper = Principal { name: "prometheus".into(), scopes: vec![Scope::parse("metrics").unwrap()] };
        assert!(scraper.may_scrape());
        assert!(!scraper.is_admin() && !scraper.may_pick() && !scraper.may_register_any());
        let admin = Principal { name: "ops".into(), scopes: vec![Scope::Admin] };
        assert!(admin.may_scrape());
        let picker = Principal { name: "app".into(), scopes: vec![Scope::Pick] };
        assert!(!picker.may_scrape());
    }
}
