//! Parsing rule names: `round_robin`, `repeat(n=5)`, `retry(rule=repeat(n=3), max_ms=200)`.
//!
//! The grammar is `name` or `name(key=value, ...)`, where a value may itself be a rule with
//! parameters. Each rule accepts only its own parameters, each within a stated range (declared
//! in the rule's own file, and the error text written from it), and every error says which part
//! of the string was wrong. The canonical form (`repeat(n=3)` for
//! `repeat`) names the rule in responses and in counter keys, so `repeat` and `repeat(n=3)`
//! share one rotation.

use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::Duration;

use super::{KNOWN_RULES, Rule};

/// Longest accepted rule string, in bytes.
pub const MAX_RULE_LEN: usize = 256;

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
    UnknownParam { rule: &'static str, param: String, accepted: String },
    #[error("rule {rule:?}: parameter {param:?} {problem}, got {value:?}")]
    BadParam { rule: &'static str, param: &'static str, problem: String, value: String },
    #[error("rule {rule:?} needs a request key; set `key` (`rota pick --key K`)")]
    MissingKey { rule: Arc<str> },
}

/// Parses a non-empty rule string.
pub fn parse(text: &str) -> Result<ParsedRule, RuleError> {
    if text.len() > MAX_RULE_LEN {
        return Err(RuleError::TooLong { len: text.len() });
    }
    let rule = parse_rule(text, false)?;
    Ok(ParsedRule { canonical: rule.canonical().into(), rule })
}

/// Parses one rule; `nested` when it is another rule's parameter.
pub(crate) fn parse_rule(text: &str, nested: bool) -> Result<Rule, RuleError> {
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
    let mut params = Params { rule: "", list: params, nested, text };
    match Rule::parse_named(name, &mut params) {
        Some(rule) => rule,
        None => Err(RuleError::Unknown { name: name.to_owned() }),
    }
}

/// A rule's parameters as written, taken one by one by the rule's own parser.
pub struct Params<'a> {
    rule: &'static str,
    list: Vec<(&'a str, &'a str)>,
    nested: bool,
    text: &'a str,
}

impl Params<'_> {
    /// Starts parsing the parameters of `rule`.
    pub fn of(&mut self, rule: &'static str) -> &mut Self {
        self.rule = rule;
        self
    }

    /// Whether this rule is itself another rule's parameter.
    pub fn nested(&self) -> bool {
        self.nested
    }

    /// The whole rule string is malformed.
    pub fn malformed(&self, problem: &'static str) -> RuleError {
        RuleError::Malformed { rule: self.text.to_owned(), problem }
    }

    /// The raw value of `key`, if given.
    pub fn take(&mut self, key: &str) -> Option<String> {
        let position = self.list.iter().position(|(k, _)| *k == key)?;
        Some(self.list.remove(position).1.to_owned())
    }

    pub fn bad(&self, param: &'static str, problem: impl Into<String>, value: &str) -> RuleError {
        RuleError::BadParam { rule: self.rule, param, problem: problem.into(), value: value.to_owned() }
    }

    /// An integer parameter within `range`.
    pub fn integer(&mut self, key: &'static str, range: RangeInclusive<u64>) -> Result<Option<u64>, RuleError> {
        let Some(value) = self.take(key) else { return Ok(None) };
        match value.parse::<u64>() {
            Ok(v) if range.contains(&v) => Ok(Some(v)),
            _ => Err(self.bad(key, format!("must be an integer from {} to {}", range.start(), range.end()), &value)),
        }
    }

    /// A decimal parameter within `range` (in thousandths), returned in thousandths.
    pub fn milli(&mut self, key: &'static str, range: RangeInclusive<u32>) -> Result<Option<u32>, RuleError> {
        let Some(value) = self.take(key) else { return Ok(None) };
        let problem = || {
            let (low, high) = (f64::from(*range.start()) / 1000.0, f64::from(*range.end()) / 1000.0);
            format!("must be a number from {low:.1} to {high:.1}")
        };
        match value.parse::<f64>() {
            Ok(v) if v.is_finite() && v >= 0.0 && range.contains(&((v * 1000.0).round() as u32)) => {
                Ok(Some((v * 1000.0).round() as u32))
            }
            _ => Err(self.bad(key, problem(), &value)),
        }
    }

    /// A duration parameter within `range`.
    pub fn duration(
        &mut self,
        key: &'static str,
        range: RangeInclusive<Duration>,
    ) -> Result<Option<Duration>, RuleError> {
        let Some(value) = self.take(key) else { return Ok(None) };
        match crate::duration::parse(&value) {
            Ok(d) if range.contains(&d) => Ok(Some(d)),
            _ => {
                let (low, high) = (short_duration(*range.start()), short_duration(*range.end()));
                Err(self.bad(key, format!("must be a duration from {low} to {high}, like 30s or 10m"), &value))
            }
        }
    }

    /// Fails on any parameter not taken; `accepted` lists the rule's parameters.
    pub fn finish(&self, accepted: &[&str]) -> Result<(), RuleError> {
        match self.list.first() {
            Some((key, _)) => Err(RuleError::UnknownParam {
                rule: self.rule,
                param: (*key).to_owned(),
                accepted: if accepted.is_empty() { "no parameters".to_owned() } else { accepted.join(", ") },
            }),
            None => Ok(()),
        }
    }
}

/// `1s`, `10m`, `7d`: the largest whole unit.
pub fn short_duration(duration: Duration) -> String {
    let secs = duration.as_secs();
    match secs {
        0 => format!("{}ms", duration.as_millis()),
        s if s % 86_400 == 0 => format!("{}d", s / 86_400),
        s if s % 3600 == 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
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
    use crate::rules::{ConsistentHash, Random, Repeat, Retry, RoundRobin, Sticky};

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
        assert_eq!(parse("sticky(ttl=90s)").unwrap().rule, Rule::Sticky(Sticky { ttl: Duration::from_secs(90) }));
        assert_eq!(
            parse("retry(rule=repeat(n=2), max_ms=200)").unwrap().rule,
            Rule::Retry(Retry { inner: Box::new(Rule::Repeat(Repeat { n: 2 })), budget: Duration::from_millis(200) })
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
                "rule \"nope\" is unknown; known rules: round_robin, random, repeat, weighted, slow_start, response_time, best_available, least_request, availability_filtering, zone_avoidance, consistent_hash, sticky, retry",
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
                "rule \"bogus\" is unknown; known rules: round_robin, random, repeat, weighted, slow_start, response_time, best_available, least_request, availability_filtering, zone_avoidance, consistent_hash, sticky, retry",
            ),
            ("retry(rule=repeat(n=2)", "rule \"retry(rule=repeat(n=2)\" is malformed: unbalanced parentheses"),
        ];
        for (text, message) in cases {
            assert_eq!(parse(text).unwrap_err().to_string(), message, "{text}");
        }
        assert_eq!(parse(&"x".repeat(257)).unwrap_err().to_string(), "rule is 257 bytes long; the limit is 256");
    }
}
