//! `rota policy`: the policies in force, and their runtime overrides.
//!
//! `get` and `ls` print one row per policy with its source (`default`, `file` or `runtime`);
//! `set` sets a service's runtime override (it wins over the config file's policy of the
//! service and survives reloads of the file); `reset` drops it, so the file's policy or the
//! defaults apply again. Resetting a service that has no override fails with `NOT_FOUND`.

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
    /// Set a runtime override of a service's policy; options left out take the defaults.
    Set(SetArgs),
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
    #[command(flatten)]
    pub server: ServerArgs,
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
            let millis = |d: Option<Duration>| d.map_or(0, |d| d.as_millis().try_into().unwrap_or(u64::MAX));
            let policy = pb::Policy {
                service: args.service,
                rule: args.rule.unwrap_or_default(),
                isolation_fallback: match args.isolation_fallback {
                    None => pb::IsolationFallback::Unspecified,
                    Some(Fallback::Fail) => pb::IsolationFallback::Fail,
                    Some(Fallback::Any) => pb::IsolationFallback::Any,
                }
                .into(),
                breaker: Some(pb::Breaker {
                    failure_threshold: args.failure_threshold.unwrap_or(0),
                    blackout_base_ms: millis(args.blackout_base),
                    blackout_max_ms: millis(args.blackout_max),
                }),
                gray: args.gray,
                ejection: Some(pb::Ejection {
                    disabled: args.ejection == Some(Switch::Off),
                    max_ejected_percent: args.max_ejected_percent.unwrap_or(0),
                    failure_rate_percent: args.failure_rate_percent.unwrap_or(0),
                    failure_rate_min_calls: args.failure_rate_min_calls.unwrap_or(0),
                }),
                ..Default::default()
            };
            print_rows(&[client.set_policy(policy).await?]);
        }
        PolicyCommand::Reset(args) => {
            let policy = args.server.connect().await?.reset_policy(&args.service).await?;
            println!("dropped the runtime override of {}; in force now:", args.service);
            print_rows(&[policy]);
        }
    }
    Ok(())
}

fn print_rows(policies: &[pb::Policy]) {
    println!(
        "{:<24} {:<8} {:<24} {:<8} {:<20} {:<24} GRAY",
        "SERVICE", "SOURCE", "RULE", "FALLBACK", "BREAKER", "EJECTION"
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
    let service = if policy.service.is_empty() { "(defaults)" } else { &policy.service };
    format!("{service:<24} {source:<8} {:<24} {fallback:<8} {breaker:<20} {ejection:<24} {gray}", policy.rule)
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
            ["orders", "runtime", "repeat(n=2)", "any", "3x", "10s..30s", "max=50%,rate=50%/20", "unversioned=9,v2=1"]
        );
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
