//! Parsing rule names: `round_robin`, `repeat(n=5)`, `retry(rule=repeat(n=3), max_ms=200)`.
//!
//! The grammar is `name` or `name(key=value, ...)`, where a value may itself be a rule with
//! parameters. Each rule accepts only its own parameters, each within a stated range, and every
//! error says which part of the string was wrong. The canonical form (`repeat(n=3)` for
//! `repeat`) names the rule in responses and in counter keys, so `repeat` and `repeat(n=3)`
//! share one rotation.

use std::sync::Arc;
use std::time::Duration;

use super::availability::MAX_LIMIT;
use super::consistent_hash::BALANCE_RANGE;
use super::least_request::MAX_CHOICES;
use super::repeat::MAX_N;
use super::{
    AvailabilityFiltering, BestAvailable, ConsistentHash, LeastRequest, Random, Repeat, ResponseTime, RoundRobin, Rule,
    Weighted, ZoneAvoidance,
};

/// Longest accepted rule string, in bytes.
pub const MAX_RULE_LEN: usize = 256;

/// Rule names accepted in `PickRequest.rule`.
pub const KNOWN_RULES: &[&str] = &[
    "round_robin",
    "random",
    "repeat",
    "weighted",
    "response_time",
    "best_available",
    "least_request",
    "availability_filtering",
    "zone_avoidance",
    "consistent_hash",
    "sticky",
    "retry",
];

/// Default `sticky` time to live.
pub const DEFAULT_STICKY_TTL: Duration = Duration::from_secs(600);
/// Default `retry` time budget.
pub const DEFAULT_RETRY_BUDGET: Duration = Duration::from_millis(500);

/// A rule with its parameters, and its canonical spelling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedRule {
    pub rule: Rule,
    pub canonical: Arc<str>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("rule is {len} bytes long; the limit is {MAX_RULE_LEN}")]
    TooLong { len: usize },
    #[error("rule {rule:?} is malformed: {problem}")]
    Malformed { rule: String, problem: &'static str },
    #[error("rule {name:?} is unknown; known rules: {}", KNOWN_RULES.join(", "))]
    Unknown { name: String },
    #[error("rule {rule:?}: parameter {param:?} is unknown; {rule} accepts: {accepted}")]
    UnknownParam { rule: &'static str, param: String, accepted: &'static str },
    #[error("rule {rule:?}: parameter {param:?} {problem}, got {value:?}")]
    BadParam { rule: &'static str, param: &'static str, problem: &'static str, value: String },
    #[error("rule {rule:?} needs a request key; set `key`")]
    MissingKey { rule: Arc<str> },
}

/// Parses a non-empty rule string.
pub fn parse(text: &str) -> Result<ParsedRule, RuleError> {
    if text.len() > MAX_RULE_LEN {
        return Err(RuleError::TooLong { len: text.len() });
    }
    let rule = parse_rule(text, true)?;
    Ok(ParsedRule { canonical: canonical(&rule).into(), rule })
}

fn parse_rule(text: &str, outermost: bool) -> Result<Rule, RuleError> {
    let malformed = |problem| RuleError::Malformed { rule: text.to_owned(), problem };
    let trimmed = text.trim();
    let (name, params) = match trimmed.split_once('(') {
        None => (trimmed, Vec::new()),
        Some((name, rest)) => {
            let inner = rest.strip_suffix(')').ok_or_else(|| malformed("expected ')' at the end"))?;
            (name.trim_end(), parse_params(inner).map_err(malformed)?)
        }
    };
    if name.is_empty() {
        return Err(malformed("the rule name is missing"));
    }
    let mut params = Params { rule: "", list: params };
    let rule = match name {
        "round_robin" => params.none("round_robin", Rule::RoundRobin(RoundRobin))?,
        "random" => params.none("random", Rule::Random(Random))?,
        "weighted" => params.none("weighted", Rule::Weighted(Weighted))?,
        "response_time" => params.none("response_time", Rule::ResponseTime(ResponseTime))?,
        "best_available" => params.none("best_available", Rule::BestAvailable(BestAvailable))?,
        "zone_avoidance" => params.none("zone_avoidance", Rule::ZoneAvoidance(ZoneAvoidance))?,
        "repeat" => {
            params.rule = "repeat";
            let n = params.take_u64("n", "must be an integer from 1 to 1000000", 1, u64::from(MAX_N))?;
            params.finish("n")?;
            Rule::Repeat(Repeat { n: n.map_or(Repeat::default().n, |n| n as u32) })
        }
        "least_request" => {
            params.rule = "least_request";
            let choices = params.take_u64("choices", "must be an integer from 1 to 100", 1, u64::from(MAX_CHOICES))?;
            params.finish("choices")?;
            Rule::LeastRequest(LeastRequest { choices: choices.map_or(LeastRequest::default().choices, |c| c as u32) })
        }
        "availability_filtering" => {
            params.rule = "availability_filtering";
            let limit = params.take_u64("limit", "must be an integer from 1 to 1000000000", 1, MAX_LIMIT)?;
            params.finish("limit")?;
            Rule::AvailabilityFiltering(AvailabilityFiltering { limit })
        }
        "consistent_hash" => {
            params.rule = "consistent_hash";
            let balance = params.take_milli("balance", "must be a number from 1.0 to 100.0")?;
            params.finish("balance")?;
            Rule::ConsistentHash(ConsistentHash { balance_milli: balance })
        }
        "sticky" => {
            params.rule = "sticky";
            let ttl =
                params.take_duration("ttl", "must be a duration from 1s to 7d, like 30s or 10m", 1, 7 * 86_400_000)?;
            params.finish("ttl")?;
            Rule::Sticky { ttl: ttl.unwrap_or(DEFAULT_STICKY_TTL) }
        }
        "retry" if outermost => {
            params.rule = "retry";
            let inner = match params.take("rule") {
                None => Rule::RoundRobin(RoundRobin),
                Some(value) => {
                    let inner = parse_rule(&value, false)?;
                    if matches!(inner, Rule::Sticky { .. }) {
                        return Err(params.bad("rule", "must be a selector (not sticky or retry)", &value));
                    }
                    inner
                }
            };
            let budget = params.take_u64("max_ms", "must be an integer from 1 to 60000", 1, 60_000)?;
            params.finish("rule, max_ms")?;
            Rule::Retry { inner: Box::new(inner), budget: budget.map_or(DEFAULT_RETRY_BUDGET, Duration::from_millis) }
        }
        "retry" => return Err(malformed("retry cannot wrap retry")),
        other => return Err(RuleError::Unknown { name: other.to_owned() }),
    };
    Ok(rule)
}

/// The canonical spelling: every parameter that has a default is written out.
pub fn canonical(rule: &Rule) -> String {
    match rule {
        Rule::RoundRobin(_) => "round_robin".into(),
        Rule::Random(_) => "random".into(),
        Rule::Weighted(_) => "weighted".into(),
        Rule::ResponseTime(_) => "response_time".into(),
        Rule::BestAvailable(_) => "best_available".into(),
        Rule::ZoneAvoidance(_) => "zone_avoidance".into(),
        Rule::Repeat(repeat) => format!("repeat(n={})", repeat.n),
        Rule::LeastRequest(rule) => format!("least_request(choices={})", rule.choices),
        Rule::AvailabilityFiltering(AvailabilityFiltering { limit: None }) => "availability_filtering".into(),
        Rule::AvailabilityFiltering(AvailabilityFiltering { limit: Some(limit) }) => {
            format!("availability_filtering(limit={limit})")
        }
        Rule::ConsistentHash(ConsistentHash { balance_milli: None }) => "consistent_hash".into(),
        Rule::ConsistentHash(ConsistentHash { balance_milli: Some(milli) }) => {
            format!("consistent_hash(balance={})", f64::from(*milli) / 1000.0)
        }
        Rule::Sticky { ttl } => format!("sticky(ttl={})", humantime::format_duration(*ttl)),
        Rule::Retry { inner, budget } => format!("retry(rule={}, max_ms={})", canonical(inner), budget.as_millis()),
    }
}

struct Params<'a> {
    rule: &'static str,
    list: Vec<(&'a str, &'a str)>,
}

impl Params<'_> {
    fn none(&mut self, rule: &'static str, value: Rule) -> Result<Rule, RuleError> {
        self.rule = rule;
        self.finish("no parameters")?;
        Ok(value)
    }

    fn take(&mut self, key: &str) -> Option<String> {
        let position = self.list.iter().position(|(k, _)| *k == key)?;
        Some(self.list.remove(position).1.to_owned())
    }

    fn bad(&self, param: &'static str, problem: &'static str, value: &str) -> RuleError {
        RuleError::BadParam { rule: self.rule, param, problem, value: value.to_owned() }
    }

    fn take_u64(
        &mut self,
        key: &'static str,
        problem: &'static str,
        min: u64,
        max: u64,
    ) -> Result<Option<u64>, RuleError> {
        let Some(value) = self.take(key) else { return Ok(None) };
        match value.parse::<u64>() {
            Ok(v) if (min..=max).contains(&v) => Ok(Some(v)),
            _ => Err(self.bad(key, problem, &value)),
        }
    }

    fn take_milli(&mut self, key: &'static str, problem: &'static str) -> Result<Option<u32>, RuleError> {
        let Some(value) = self.take(key) else { return Ok(None) };
        match value.parse::<f64>() {
            Ok(v) if v.is_finite() && BALANCE_RANGE.contains(&((v * 1000.0).round() as u32)) => {
                Ok(Some((v * 1000.0).round() as u32))
            }
            _ => Err(self.bad(key, problem, &value)),
        }
    }

    fn take_duration(
        &mut self,
        key: &'static str,
        problem: &'static str,
        min_ms: u128,
        max_ms: u128,
    ) -> Result<Option<Duration>, RuleError> {
        let Some(value) = self.take(key) else { return Ok(None) };
        match humantime::parse_duration(&value) {
            Ok(d) if (min_ms..=max_ms).contains(&d.as_millis()) => Ok(Some(d)),
            _ => Err(self.bad(key, problem, &value)),
        }
    }

    /// Fails on any parameter not taken.
    fn finish(&self, accepted: &'static str) -> Result<(), RuleError> {
        match self.list.first() {
            Some((key, _)) => Err(RuleError::UnknownParam { rule: self.rule, param: (*key).to_owned(), accepted }),
            None => Ok(()),
        }
    }
}

/// Splits `k=v, k=v` at top-level commas (a value may contain a parenthesised rule).
fn parse_params(inner: &str) -> Result<Vec<(&str, &str)>, &'static str> {
    let inner = inner.trim();
    if inner.is_empty() {
        return Ok(Vec::new());
    }
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err("unbalanced parentheses");
                }
            }
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("unbalanced parentheses");
    }
    parts.push(&inner[start..]);
    let mut params: Vec<(&str, &str)> = Vec::new();
    for part in parts {
        let (key, value) = part.split_once('=').ok_or("parameters are written key=value")?;
        let (key, value) = (key.trim(), value.trim());
        if key.is_empty() || value.is_empty() {
            return Err("parameters are written key=value");
        }
        if params.iter().any(|(k, _)| *k == key) {
            return Err("a parameter is given twice");
        }
        params.push((key, value));
    }
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_parameters() {
        assert_eq!(parse("round_robin").unwrap().rule, Rule::RoundRobin(RoundRobin));
        assert_eq!(parse("random").unwrap().rule, Rule::Random(Random));
        assert_eq!(parse("repeat").unwrap().rule, Rule::Repeat(Repeat { n: 3 }));
        assert_eq!(parse(" repeat( n = 5 ) ").unwrap().rule, Rule::Repeat(Repeat { n: 5 }));
        assert_eq!(parse("repeat()").unwrap().rule, Rule::Repeat(Repeat { n: 3 }));
        assert_eq!(
            parse("consistent_hash(balance=1.25)").unwrap().rule,
            Rule::ConsistentHash(ConsistentHash { balance_milli: Some(1250) })
        );
        assert_eq!(parse("sticky(ttl=90s)").unwrap().rule, Rule::Sticky { ttl: Duration::from_secs(90) });
        assert_eq!(
            parse("retry(rule=repeat(n=2), max_ms=200)").unwrap().rule,
            Rule::Retry { inner: Box::new(Rule::Repeat(Repeat { n: 2 })), budget: Duration::from_millis(200) }
        );
    }

    #[test]
    fn every_known_rule_parses_and_its_canonical_form_round_trips() {
        for name in KNOWN_RULES {
            let parsed = parse(name).unwrap_or_else(|e| panic!("{name}: {e}"));
            let again = parse(&parsed.canonical).unwrap();
            assert_eq!(again, parsed, "{name}");
        }
    }

    #[test]
    fn canonical_form_fills_in_defaults() {
        let cases = [
            ("repeat", "repeat(n=3)"),
            ("round_robin()", "round_robin"),
            ("least_request", "least_request(choices=2)"),
            ("sticky", "sticky(ttl=10m)"),
            ("retry", "retry(rule=round_robin, max_ms=500)"),
            ("retry(rule=repeat)", "retry(rule=repeat(n=3), max_ms=500)"),
            ("consistent_hash(balance=1.250)", "consistent_hash(balance=1.25)"),
            ("availability_filtering(limit=7)", "availability_filtering(limit=7)"),
        ];
        for (text, canonical) in cases {
            assert_eq!(&*parse(text).unwrap().canonical, canonical, "{text}");
        }
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let cases = [
            (
                "nope",
                "rule \"nope\" is unknown; known rules: round_robin, random, repeat, weighted, response_time, best_available, least_request, availability_filtering, zone_avoidance, consistent_hash, sticky, retry",
            ),
            ("repeat(n=0)", "rule \"repeat\": parameter \"n\" must be an integer from 1 to 1000000, got \"0\""),
            ("repeat(n=x)", "rule \"repeat\": parameter \"n\" must be an integer from 1 to 1000000, got \"x\""),
            ("repeat(m=2)", "rule \"repeat\": parameter \"m\" is unknown; repeat accepts: n"),
            ("repeat(n=2", "rule \"repeat(n=2\" is malformed: expected ')' at the end"),
            ("repeat(n)", "rule \"repeat(n)\" is malformed: parameters are written key=value"),
            ("repeat(n=1,n=2)", "rule \"repeat(n=1,n=2)\" is malformed: a parameter is given twice"),
            ("random(n=1)", "rule \"random\": parameter \"n\" is unknown; random accepts: no parameters"),
            ("(n=1)", "rule \"(n=1)\" is malformed: the rule name is missing"),
            (
                "consistent_hash(balance=0.5)",
                "rule \"consistent_hash\": parameter \"balance\" must be a number from 1.0 to 100.0, got \"0.5\"",
            ),
            (
                "sticky(ttl=forever)",
                "rule \"sticky\": parameter \"ttl\" must be a duration from 1s to 7d, like 30s or 10m, got \"forever\"",
            ),
            (
                "least_request(choices=0)",
                "rule \"least_request\": parameter \"choices\" must be an integer from 1 to 100, got \"0\"",
            ),
            (
                "retry(rule=sticky)",
                "rule \"retry\": parameter \"rule\" must be a selector (not sticky or retry), got \"sticky\"",
            ),
            ("retry(rule=retry)", "rule \"retry\" is malformed: retry cannot wrap retry"),
            (
                "retry(rule=bogus)",
                "rule \"bogus\" is unknown; known rules: round_robin, random, repeat, weighted, response_time, best_available, least_request, availability_filtering, zone_avoidance, consistent_hash, sticky, retry",
            ),
            ("retry(rule=repeat(n=2)", "rule \"retry(rule=repeat(n=2)\" is malformed: unbalanced parentheses"),
        ];
        for (text, message) in cases {
            assert_eq!(parse(text).unwrap_err().to_string(), message, "{text}");
        }
        assert_eq!(parse(&"x".repeat(257)).unwrap_err().to_string(), "rule is 257 bytes long; the limit is 256");
    }
}
