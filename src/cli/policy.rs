//! `rota policy`: the policies in force, and their runtime overrides.
//!
//! `get` and `ls` print one row per policy with its source (`default`, `file` or `runtime`);
//! `set` sets a service's runtime override (it wins over the config file's policy of the
//! service and survives reloads of the file): the policy in force with the fields the options
//! name changed, so a health check or gray split the file sets stays unless an option changes
//! it (`--replace`: the options alone, the rest the defaults). `reset` drops the override, so
//! the file's policy or the defaults apply again. Resetting a service that has no override
//! fails with `NOT_FOUND`.

use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};

use super::{CliError, ServerArgs, parse_duration};
use crate::pb;

#[derive(Debug, Args)]
pub struct PolicyArgs {
    #[command(subcommand)]
    pub command: PolicyCommand,
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Print the policy in force for a service, and where it comes from.
    Get(ServiceArgs),
    /// Print the defaults and every service's own policy.
    Ls(ServerOnly),
    /// Set a runtime override of a service's policy: the policy in force, with the fields the
    /// options name changed (with --replace, options left out take the defaults).
    Set(Box<SetArgs>),
    /// Drop a service's runtime override, so the config file's policy (or the defaults) applies again.
    Reset(ServiceArgs),
}

#[derive(Debug, Args)]
pub struct ServiceArgs {
    pub service: String,
    #[command(flatten)]
    pub server: ServerArgs,
}

#[derive(Debug, Args)]
pub struct ServerOnly {
    #[command(flatten)]
    pub server: ServerArgs,
}

#[derive(Debug, Args)]
pub struct SetArgs {
    pub service: String,
    /// Rule for picks that name none: round_robin, repeat(n=5), weighted, ...
    #[arg(long)]
    pub rule: Option<String>,
    /// What version isolation does when neither the version nor unversioned instances are left.
    #[arg(long, value_enum)]
    pub isolation_fallback: Option<Fallback>,
    /// Successive failures that trip an instance's breaker.
    #[arg(long)]
    pub failure_threshold: Option<u32>,
    /// Blackout once the breaker trips, doubled per further failure (e.g. 10s).
    #[arg(long, value_parser = parse_duration)]
    pub blackout_base: Option<Duration>,
    /// Longest blackout (e.g. 30s).
    #[arg(long, value_parser = parse_duration)]
    pub blackout_max: Option<Duration>,
    /// Gray release for picks without a version: `unversioned=90,v2=10` (exact shares);
    /// `unversioned=1` turns it off.
    #[arg(long, value_parser = parse_gray)]
    pub gray: Option<pb::GrayRelease>,
    /// Outlier ejection (every rule skips instances the fleet has seen failing): on or off.
    #[arg(long, value_enum)]
    pub ejection: Option<Switch>,
    /// The most of a subset's instances ejection may skip at once, in percent (one always may).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub max_ejected_percent: Option<u32>,
    /// Failure rate over the statistics window that ejects an instance, in percent (101 = off).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=101))]
    pub failure_rate_percent: Option<u32>,
    /// Calls the window must hold before its failure rate counts.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub failure_rate_min_calls: Option<u32>,
    /// Active health check of every instance: grpc, http, tcp, or off.
    #[arg(long, value_enum)]
    pub health_check: Option<CheckKind>,
    /// The health check's path (http) or service (grpc).
    #[arg(long)]
    pub health_check_path: Option<String>,
    /// Between two checks of one instance (e.g. 5s).
    #[arg(long, value_parser = parse_duration)]
    pub health_check_interval: Option<Duration>,
    /// One check, whole (e.g. 1s).
    #[arg(long, value_parser = parse_duration)]
    pub health_check_timeout: Option<Duration>,
    /// Failed checks in a row that take an instance out of picks.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub unhealthy_after: Option<u32>,
    /// Passed checks in a row that bring it back.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub healthy_after: Option<u32>,
    /// Set the options given and nothing else: every other field takes the defaults, instead of
    /// keeping its value in force.
    #[arg(long)]
    pub replace: bool,
    #[command(flatten)]
    pub server: ServerArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CheckKind {
    Grpc,
    Http,
    Tcp,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Switch {
    On,
    Off,
}

/// `unversioned=90,v2=10` → a gray release; the weights are checked by rota.
fn parse_gray(text: &str) -> Result<pb::GrayRelease, String> {
    let mut gray = pb::GrayRelease::default();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (name, weight) =
            part.split_once('=').ok_or_else(|| format!("{part:?} is not NAME=WEIGHT (e.g. unversioned=90,v2=10)"))?;
        let weight: u32 = weight.trim().parse().map_err(|_| format!("{part:?}: the weight must be a whole number"))?;
        match name.trim() {
            "unversioned" => gray.unversioned = weight,
            "" => return Err(format!("{part:?}: a version name is missing")),
            version => {
                if gray.versions.insert(version.to_owned(), weight).is_some() {
                    return Err(format!("version {version:?} is given twice"));
                }
            }
        }
    }
    if gray.unversioned == 0 && gray.versions.is_empty() {
        return Err("give at least one NAME=WEIGHT, e.g. unversioned=90,v2=10".to_owned());
    }
    Ok(gray)
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Fallback {
    /// UNAVAILABLE.
    Fail,
    /// Pick from any UP instance.
    Any,
}

pub async fn run(args: PolicyArgs) -> Result<(), CliError> {
    match args.command {
        PolicyCommand::Get(args) => {
            let policy = args.server.connect().await?.get_policy(&args.service).await?;
            print_rows(&[policy]);
        }
        PolicyCommand::Ls(args) => {
            let listing = args.server.connect().await?.list_policies().await?;
            let mut rows: Vec<pb::Policy> = listing.defaults.into_iter().collect();
            rows.extend(listing.services);
            print_rows(&rows);
        }
        PolicyCommand::Set(args) => {
            let mut client = args.server.connect().await?;
            let base = if args.replace {
                pb::Policy { service: args.service.clone(), ..Default::default() }
            } else {
                client.get_policy(&args.service).await?
            };
            print_rows(&[client.set_policy(changed(base, &args)).await?]);
        }
        PolicyCommand::Reset(args) => {
            let policy = args.server.connect().await?.reset_policy(&args.service).await?;
            println!("dropped the runtime override of {}; in force now:", args.service);
            print_rows(&[policy]);
        }
    }
    Ok(())
}

/// `base` with the fields `args` name set; an option left out keeps `base`'s value.
fn changed(base: pb::Policy, args: &SetArgs) -> pb::Policy {
    let millis = |d: Duration| d.as_millis().try_into().unwrap_or(u64::MAX);
    let mut policy = pb::Policy { service: args.service.clone(), source: 0, is_default: false, ..base };
    if let Some(rule) = &args.rule {
        policy.rule = rule.clone();
    }
    if let Some(fallback) = args.isolation_fallback {
        policy.isolation_fallback = match fallback {
            Fallback::Fail => pb::IsolationFallback::Fail,
            Fallback::Any => pb::IsolationFallback::Any,
        }
        .into();
    }
    let breaker = policy.breaker.get_or_insert_default();
    if let Some(threshold) = args.failure_threshold {
        breaker.failure_threshold = threshold;
    }
    if let Some(base) = args.blackout_base {
        breaker.blackout_base_ms = millis(base);
    }
    if let Some(max) = args.blackout_max {
        breaker.blackout_max_ms = millis(max);
    }
    if let Some(gray) = &args.gray {
        policy.gray = Some(gray.clone());
    }
    let ejection = policy.ejection.get_or_insert_default();
    if let Some(switch) = args.ejection {
        ejection.disabled = switch == Switch::Off;
    }
    if let Some(percent) = args.max_ejected_percent {
        ejection.max_ejected_percent = percent;
    }
    if let Some(percent) = args.failure_rate_percent {
        ejection.failure_rate_percent = percent;
    }
    if let Some(calls) = args.failure_rate_min_calls {
        ejection.failure_rate_min_calls = calls;
    }
    let check_named = args.health_check.is_some()
        || args.health_check_path.is_some()
        || args.health_check_interval.is_some()
        || args.health_check_timeout.is_some()
        || args.unhealthy_after.is_some()
        || args.healthy_after.is_some();
    if check_named {
        let check = policy.health_check.get_or_insert_default();
        if let Some(kind) = args.health_check {
            let kind = match kind {
                CheckKind::Grpc => "grpc",
                CheckKind::Http => "http",
                CheckKind::Tcp => "tcp",
                CheckKind::Off => "off",
            };
            if check.kind != kind {
                // Another kind of check: its path means something else.
                check.path.clear();
            }
            check.kind = kind.to_owned();
        }
        if let Some(path) = &args.health_check_path {
            check.path = path.clone();
        }
        if let Some(interval) = args.health_check_interval {
            check.interval_ms = millis(interval);
        }
        if let Some(timeout) = args.health_check_timeout {
            check.timeout_ms = millis(timeout);
        }
        if let Some(n) = args.unhealthy_after {
            check.unhealthy_after = n;
        }
        if let Some(n) = args.healthy_after {
            check.healthy_after = n;
        }
    }
    policy
}

fn print_rows(policies: &[pb::Policy]) {
    println!(
        "{:<24} {:<8} {:<24} {:<8} {:<20} {:<24} {:<24} GRAY",
        "SERVICE", "SOURCE", "RULE", "FALLBACK", "BREAKER", "EJECTION", "HEALTH_CHECK"
    );
    for policy in policies {
        println!("{}", row(policy));
    }
}

fn row(policy: &pb::Policy) -> String {
    let source = match pb::PolicySource::try_from(policy.source) {
        Ok(pb::PolicySource::Default) => "default",
        Ok(pb::PolicySource::File) => "file",
        Ok(pb::PolicySource::Runtime) => "runtime",
        _ => "?",
    };
    let fallback = match pb::IsolationFallback::try_from(policy.isolation_fallback) {
        Ok(pb::IsolationFallback::Fail) => "fail",
        Ok(pb::IsolationFallback::Any) => "any",
        _ => "?",
    };
    let breaker = policy.breaker.map_or_else(
        || "-".to_owned(),
        |b| {
            let ms = |ms: u64| crate::duration::format(Duration::from_millis(ms));
            format!("{}x {}..{}", b.failure_threshold, ms(b.blackout_base_ms), ms(b.blackout_max_ms))
        },
    );
    let gray = policy.gray.as_ref().map_or_else(
        || "-".to_owned(),
        |g| {
            let mut versions: Vec<_> = g.versions.iter().collect();
            versions.sort();
            let mut parts = vec![format!("unversioned={}", g.unversioned)];
            parts.extend(versions.into_iter().map(|(v, w)| format!("{v}={w}")));
            parts.join(",")
        },
    );
    let ejection = policy.ejection.map_or_else(
        || "-".to_owned(),
        |e| match (e.disabled, e.failure_rate_percent > 100) {
            (true, _) => "off".to_owned(),
            (false, true) => format!("max={}%,rate=off", e.max_ejected_percent),
            (false, false) => {
                format!("max={}%,rate={}%/{}", e.max_ejected_percent, e.failure_rate_percent, e.failure_rate_min_calls)
            }
        },
    );
    let check = policy.health_check.as_ref().map_or_else(
        || "-".to_owned(),
        |c| {
            let ms = |ms: u64| crate::duration::format(Duration::from_millis(ms));
            let path = if c.path.is_empty() { String::new() } else { format!(" {}", c.path) };
            format!(
                "{}{path} {}/{} {}/{}",
                c.kind,
                ms(c.interval_ms),
                ms(c.timeout_ms),
                c.unhealthy_after,
                c.healthy_after
            )
        },
    );
    let service = if policy.service.is_empty() { "(defaults)" } else { &policy.service };
    format!(
        "{service:<24} {source:<8} {:<24} {fallback:<8} {breaker:<20} {ejection:<24} {check:<24} {gray}",
        policy.rule
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_row_shows_the_source_and_every_setting() {
        let policy = pb::Policy {
            service: "orders".into(),
            rule: "repeat(n=2)".into(),
            isolation_fallback: pb::IsolationFallback::Any.into(),
            gray: Some(pb::GrayRelease { unversioned: 9, versions: [("v2".to_owned(), 1)].into() }),
            breaker: Some(pb::Breaker { failure_threshold: 3, blackout_base_ms: 10_000, blackout_max_ms: 30_000 }),
            is_default: false,
            source: pb::PolicySource::Runtime.into(),
            ejection: Some(pb::Ejection {
                disabled: false,
                max_ejected_percent: 50,
                failure_rate_percent: 50,
                failure_rate_min_calls: 20,
            }),
            health_check: None,
        };
        let row = row(&policy);
        let columns: Vec<&str> = row.split_whitespace().collect();
        assert_eq!(
            columns,
            [
                "orders",
                "runtime",
                "repeat(n=2)",
                "any",
                "3x",
                "10s..30s",
                "max=50%,rate=50%/20",
                "-",
                "unversioned=9,v2=1"
            ]
        );
    }

    fn set(args: &[&str]) -> SetArgs {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            set: SetArgs,
        }
        <Cli as clap::Parser>::parse_from([&["rota"], args].concat()).set
    }

    /// `policy set` starts from the policy in force and changes only what its options name.
    #[test]
    fn set_changes_only_the_fields_named() {
        let check = pb::HealthCheck {
            kind: "http".into(),
            path: "/ready".into(),
            interval_ms: 5000,
            timeout_ms: 1000,
            unhealthy_after: 3,
            healthy_after: 2,
        };
        let gray = pb::GrayRelease { unversioned: 9, versions: [("v2".to_owned(), 1)].into() };
        let in_force = pb::Policy {
            service: "orders".into(),
            rule: "repeat(n=3)".into(),
            gray: Some(gray.clone()),
            health_check: Some(check.clone()),
            source: pb::PolicySource::File.into(),
            ..Default::default()
        };
        let same_rule = changed(in_force.clone(), &set(&["orders", "--rule", "repeat(n=3)"]));
        assert_eq!((same_rule.health_check.as_ref(), same_rule.gray.as_ref()), (Some(&check), Some(&gray)));
        assert_eq!(same_rule.rule, "repeat(n=3)");
        let tcp = changed(in_force.clone(), &set(&["orders", "--health-check", "tcp", "--healthy-after", "4"]));
        let tcp_check = tcp.health_check.unwrap();
        assert_eq!((tcp_check.kind.as_str(), tcp_check.path.as_str(), tcp_check.healthy_after), ("tcp", "", 4));
        assert_eq!(tcp.rule, "repeat(n=3)", "the rule in force stays");
        let off = changed(in_force, &set(&["orders", "--health-check", "off"]));
        assert_eq!(off.health_check.unwrap().kind, "off");
    }

    #[test]
    fn gray_flags_parse_and_bad_ones_say_why() {
        let gray = parse_gray("unversioned=90, v2=10").unwrap();
        assert_eq!((gray.unversioned, gray.versions.get("v2").copied()), (90, Some(10)));
        assert!(parse_gray("v2").unwrap_err().contains("NAME=WEIGHT"));
        assert!(parse_gray("v2=ten").unwrap_err().contains("whole number"));
        assert!(parse_gray("v2=1,v2=2").unwrap_err().contains("twice"));
        assert!(parse_gray("").is_err());
    }
}
