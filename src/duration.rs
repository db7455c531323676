//! Durations as rota's settings, policies, rule parameters and flags spell them: `500ms`, `15s`,
//! `1h 30m`, `1.5s`.
//!
//! One parser for every place that reads a duration, total over any text: it never panics,
//! whatever the numbers (the text reaches it from rule strings in requests). The units and their
//! spellings are the ones `humantime` formats and reads, so what rota prints (`print-config`,
//! `rota policy get`) parses back; a month is 30.44 days and a year 365.25 days.

use std::fmt;
use std::time::Duration;

/// Why a text is not a duration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DurationError {
    /// Nothing but whitespace.
    Empty,
    /// A character that is neither a digit, a `.`, a unit letter nor whitespace.
    Unexpected { offset: usize, found: char },
    /// A number with no unit after it.
    MissingUnit { offset: usize },
    /// A unit no duration has.
    UnknownUnit { unit: String },
    /// A `.` with no digit on one side.
    BadFraction { offset: usize },
    /// Longer than [`Duration::MAX`].
    TooLong,
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DurationError::Empty => write!(f, "empty"),
            DurationError::Unexpected { offset, found } => write!(f, "unexpected {found:?} at byte {offset}"),
            DurationError::MissingUnit { offset } => {
                write!(f, "the number ending at byte {offset} has no unit (ms, s, m, h, d, ...)")
            }
            DurationError::UnknownUnit { unit } => {
                write!(f, "unknown unit {unit:?}; use ns, us, ms, s, m, h, d, w, M or y")
            }
            DurationError::BadFraction { offset } => {
                write!(f, "the fraction at byte {offset} needs digits on both sides")
            }
            DurationError::TooLong => write!(f, "too long"),
        }
    }
}

impl std::error::Error for DurationError {}

const NANOS_PER_SEC: u128 = 1_000_000_000;

/// The length of one unit in nanoseconds.
fn unit_nanos(unit: &str) -> Option<u128> {
    let secs = |s: u128| Some(s * NANOS_PER_SEC);
    match unit {
        "nanos" | "nsec" | "ns" => Some(1),
        "usec" | "us" | "µs" => Some(1_000),
        "millis" | "msec" | "ms" => Some(1_000_000),
        "seconds" | "second" | "secs" | "sec" | "s" => secs(1),
        "minutes" | "minute" | "min" | "mins" | "m" => secs(60),
        "hours" | "hour" | "hr" | "hrs" | "h" => secs(3_600),
        "days" | "day" | "d" => secs(86_400),
        "weeks" | "week" | "wk" | "wks" | "w" => secs(7 * 86_400),
        "months" | "month" | "M" => secs(2_630_016),
        "years" | "year" | "yr" | "yrs" | "y" => secs(31_557_600),
        _ => None,
    }
}

/// The most significant digits a whole number may have (past leading zeros): more cannot fit in
/// [`Duration::MAX`] in any unit, and fewer keep the arithmetic inside `u128`.
const MAX_DIGITS: usize = 30;

/// The fraction digits read; the rest are dropped.
const MAX_FRACTION_DIGITS: usize = 18;

/// Parses a sum of terms, each a number (with an optional fraction) and a unit, optionally
/// separated by whitespace: `90s`, `1m30s`, `1h 30m`, `1.5s`, `250 ms`.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    let bytes = text.as_bytes();
    let mut at = 0;
    let mut total: u128 = 0;
    let mut terms = 0;
    let skip_space = |at: &mut usize| {
        while let Some(c) = text[*at..].chars().next().filter(|c| c.is_whitespace()) {
            *at += c.len_utf8();
        }
    };
    loop {
        skip_space(&mut at);
        if at == text.len() {
            break;
        }
        // The number: digits, then optionally `.` and digits.
        let start = at;
        while at < bytes.len() && bytes[at].is_ascii_digit() {
            at += 1;
        }
        let whole = &text[start..at];
        let mut fraction = "";
        if at < bytes.len() && bytes[at] == b'.' {
            let dot = at;
            at += 1;
            let from = at;
            while at < bytes.len() && bytes[at].is_ascii_digit() {
                at += 1;
            }
            fraction = &text[from..at];
            if whole.is_empty() || fraction.is_empty() {
                return Err(DurationError::BadFraction { offset: dot });
            }
        }
        if whole.is_empty() {
            let found = text[start..].chars().next().unwrap_or(' ');
            return Err(DurationError::Unexpected { offset: start, found });
        }
        let number_end = at;
        skip_space(&mut at);
        // The unit: letters (and `µ`).
        let unit_start = at;
        while let Some(c) = text[at..].chars().next().filter(|c| c.is_ascii_alphabetic() || *c == 'µ') {
            at += c.len_utf8();
        }
        let unit = &text[unit_start..at];
        if unit.is_empty() {
            return match text[at..].chars().next() {
                None => Err(DurationError::MissingUnit { offset: number_end }),
                Some(c) if c.is_ascii_digit() => Err(DurationError::MissingUnit { offset: number_end }),
                Some(found) => Err(DurationError::Unexpected { offset: at, found }),
            };
        }
        let nanos = unit_nanos(unit).ok_or_else(|| DurationError::UnknownUnit { unit: unit.to_owned() })?;
        total = total.checked_add(term_nanos(whole, fraction, nanos)?).ok_or(DurationError::TooLong)?;
        terms += 1;
    }
    if terms == 0 {
        return Err(DurationError::Empty);
    }
    let secs = u64::try_from(total / NANOS_PER_SEC).map_err(|_| DurationError::TooLong)?;
    Ok(Duration::new(secs, (total % NANOS_PER_SEC) as u32))
}

/// `whole.fraction` units of `nanos` nanoseconds each, rounded down to a nanosecond.
fn term_nanos(whole: &str, fraction: &str, nanos: u128) -> Result<u128, DurationError> {
    let whole = whole.trim_start_matches('0');
    if whole.len() > MAX_DIGITS {
        return Err(DurationError::TooLong);
    }
    let digits = |s: &str| s.bytes().fold(0u128, |n, d| n * 10 + u128::from(d - b'0'));
    let integer = digits(whole).checked_mul(nanos).ok_or(DurationError::TooLong)?;
    // Digits past the 18th of a fraction are worth less than a nanosecond of any unit here
    // (a year is 3.2e16 ns), and 18 digits times a year stay inside u128.
    let fraction = &fraction[..fraction.len().min(MAX_FRACTION_DIGITS)];
    let part = digits(fraction) * nanos / 10u128.pow(fraction.len() as u32);
    integer.checked_add(part).ok_or(DurationError::TooLong)
}

/// Formats a duration so that [`parse`] reads it back: `1h 30m`, `500ms`.
pub fn format(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reads_what_rota_writes() {
        let cases = [
            ("500ms", Duration::from_millis(500)),
            ("15s", Duration::from_secs(15)),
            ("1m30s", Duration::from_secs(90)),
            ("1h 30m", Duration::from_secs(5400)),
            ("1.5s", Duration::from_millis(1500)),
            ("250 ms", Duration::from_millis(250)),
            ("0s", Duration::ZERO),
            ("7d", Duration::from_secs(7 * 86_400)),
            ("2us 3ns", Duration::from_nanos(2003)),
            ("163µs", Duration::from_micros(163)),
            ("1M", Duration::from_secs(2_630_016)),
            ("0.5h", Duration::from_secs(1800)),
        ];
        for (text, want) in cases {
            assert_eq!(parse(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn refuses_what_is_not_a_duration() {
        assert_eq!(parse(""), Err(DurationError::Empty));
        assert_eq!(parse("   "), Err(DurationError::Empty));
        assert_eq!(parse("15"), Err(DurationError::MissingUnit { offset: 2 }));
        assert_eq!(parse("15x"), Err(DurationError::UnknownUnit { unit: "x".into() }));
        assert_eq!(parse("s"), Err(DurationError::Unexpected { offset: 0, found: 's' }));
        assert_eq!(parse("-1s"), Err(DurationError::Unexpected { offset: 0, found: '-' }));
        assert_eq!(parse("1.s"), Err(DurationError::BadFraction { offset: 1 }));
        assert_eq!(parse(".5s"), Err(DurationError::BadFraction { offset: 0 }));
        assert_eq!(parse("1s,2s"), Err(DurationError::Unexpected { offset: 2, found: ',' }));
        for error in [parse("15"), parse("15x"), parse("-1s")] {
            assert!(!error.unwrap_err().to_string().is_empty());
        }
    }

    #[test]
    fn a_sum_at_the_very_end_of_the_range_is_an_error_not_a_panic() {
        // u64::MAX seconds and a whole second more in nanoseconds: one nanosecond past the end.
        assert_eq!(parse("18446744073709551615s 1000000000ns"), Err(DurationError::TooLong));
        assert_eq!(parse("18446744073709551615s 999999999ns"), Ok(Duration::MAX));
        assert_eq!(parse("18446744073709551616s"), Err(DurationError::TooLong));
        assert_eq!(parse(&format!("{}y", "9".repeat(200))), Err(DurationError::TooLong));
        assert_eq!(parse(&format!("1.{}s", "9".repeat(200))), Ok(Duration::new(1, 999_999_999)));
        assert_eq!(parse(&format!("{}1s", "0".repeat(200))), Ok(Duration::from_secs(1)));
        assert_eq!(parse("0.0001h"), Ok(Duration::from_millis(360)));
    }

    proptest! {
        /// Below the end of the range, rota reads every duration as `humantime` does.
        #[test]
        fn agrees_with_humantime(terms in proptest::collection::vec(
            (0u64..1_000_000, proptest::option::of(0u64..1000),
             proptest::sample::select(vec!["ns", "us", "ms", "s", "sec", "m", "min", "h", "d", "w", "M", "y"]),
             any::<bool>()),
            1..4,
        )) {
            let text: String = terms
                .iter()
                .map(|(n, frac, unit, space)| {
                    // humantime reads no fraction of a nanosecond, and drops the sub-second part of a
                    // fraction of an hour or longer; rota keeps it, so fractions are compared on
                    // the units where both are exact.
                    let exact = ["us", "ms", "s", "sec", "m", "min"].contains(unit);
                    let number = match frac { Some(f) if exact => format!("{n}.{f:03}"), _ => n.to_string() };
                    format!("{number}{}{unit} ", if *space { " " } else { "" })
                })
                .collect();
            prop_assert_eq!(parse(&text).ok(), humantime::parse_duration(&text).ok(), "{:?}", text);
        }

        /// What [`format`] writes, [`parse`] reads back exactly.
        #[test]
        fn format_round_trips(secs in 0u64..10_000_000_000, nanos in 0u32..1_000_000_000) {
            let d = Duration::new(secs, nanos);
            prop_assert_eq!(parse(&format(d)), Ok(d));
        }

        /// No text makes it panic.
        #[test]
        fn total(text in "[0-9 .a-zµM]{0,40}") {
            let _ = parse(&text);
        }
    }
}
