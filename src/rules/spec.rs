//! Parsing rule names: `round_robin`, `random`, `repeat`, `repeat(n=5)`.
//!
//! The grammar is `name` or `name(key=value, ...)`. Each rule accepts only its own parameters,
//! each within a stated range, and every error says which part of the string was wrong. The
//! canonical form (`repeat(n=3)` for `repeat`) names the rule in responses and in counter keys,
//! so `repeat` and `repeat(n=3)` share one rotation.

use std::sync::Arc;

use super::repeat::{MAX_N, Repeat};
use super::{Random, RoundRobin, Rule};

/// Longest accepted rule string, in bytes.
pub const MAX_RULE_LEN: usize = 256;

/// Rule names accepted in `PickRequest.rule`.
pub const KNOWN_RULES: &[&str] = &["round_robin", "random", "repeat"];

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
}

/// Parses a non-empty rule string.
pub fn parse(text: &str) -> Result<ParsedRule, RuleError> {
    if text.len() > MAX_RULE_LEN {
        return Err(RuleError::TooLong { len: text.len() });
    }
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
    let rule = match name {
        "round_robin" => {
            no_params("round_robin", &params)?;
            Rule::RoundRobin(RoundRobin)
        }
        "random" => {
            no_params("random", &params)?;
            Rule::Random(Random)
        }
        "repeat" => {
            let mut repeat = Repeat::default();
            for (key, value) in params {
                match key {
                    "n" => {
                        repeat.n = parse_u32("repeat", "n", value, 1, MAX_N, "must be an integer from 1 to 1000000")?
                    }
                    other => return Err(unknown_param("repeat", other, "n")),
                }
            }
            Rule::Repeat(repeat)
        }
        other => return Err(RuleError::Unknown { name: other.to_owned() }),
    };
    Ok(ParsedRule { rule, canonical: canonical(&rule).into() })
}

fn canonical(rule: &Rule) -> String {
    match rule {
        Rule::RoundRobin(_) => "round_robin".to_owned(),
        Rule::Random(_) => "random".to_owned(),
        Rule::Repeat(repeat) => format!("repeat(n={})", repeat.n),
    }
}

fn parse_params(inner: &str) -> Result<Vec<(&str, &str)>, &'static str> {
    let inner = inner.trim();
    if inner.is_empty() {
        return Ok(Vec::new());
    }
    let mut params: Vec<(&str, &str)> = Vec::new();
    for part in inner.split(',') {
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

fn no_params(rule: &'static str, params: &[(&str, &str)]) -> Result<(), RuleError> {
    match params.first() {
        Some((key, _)) => Err(unknown_param(rule, key, "no parameters")),
        None => Ok(()),
    }
}

fn unknown_param(rule: &'static str, param: &str, accepted: &'static str) -> RuleError {
    RuleError::UnknownParam { rule, param: param.to_owned(), accepted }
}

fn parse_u32(
    rule: &'static str,
    param: &'static str,
    value: &str,
    min: u32,
    max: u32,
    problem: &'static str,
) -> Result<u32, RuleError> {
    value.parse::<u32>().ok().filter(|v| (min..=max).contains(v)).ok_or_else(|| RuleError::BadParam {
        rule,
        param,
        problem,
        value: value.to_owned(),
    })
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
    }

    #[test]
    fn canonical_form_fills_in_defaults() {
        assert_eq!(&*parse("repeat").unwrap().canonical, "repeat(n=3)");
        assert_eq!(&*parse("repeat(n=3)").unwrap().canonical, "repeat(n=3)");
        assert_eq!(&*parse("round_robin()").unwrap().canonical, "round_robin");
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let cases = [
            ("nope", "rule \"nope\" is unknown; known rules: round_robin, random, repeat"),
            ("repeat(n=0)", "rule \"repeat\": parameter \"n\" must be an integer from 1 to 1000000, got \"0\""),
            ("repeat(n=x)", "rule \"repeat\": parameter \"n\" must be an integer from 1 to 1000000, got \"x\""),
            ("repeat(m=2)", "rule \"repeat\": parameter \"m\" is unknown; repeat accepts: n"),
            ("repeat(n=2", "rule \"repeat(n=2\" is malformed: expected ')' at the end"),
            ("repeat(n)", "rule \"repeat(n)\" is malformed: parameters are written key=value"),
            ("repeat(n=1,n=2)", "rule \"repeat(n=1,n=2)\" is malformed: a parameter is given twice"),
            ("random(n=1)", "rule \"random\": parameter \"n\" is unknown; random accepts: no parameters"),
            ("(n=1)", "rule \"(n=1)\" is malformed: the rule name is missing"),
        ];
        for (text, message) in cases {
            assert_eq!(parse(text).unwrap_err().to_string(), message, "{text}");
        }
        assert_eq!(parse(&"x".repeat(257)).unwrap_err().to_string(), "rule is 257 bytes long; the limit is 256");
    }
}
