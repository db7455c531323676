//! Rule strings, as a `PickRequest.rule` or a policy's `rule` carries them.
//!
//! Any UTF-8 text goes to `rota::rules::parse`. It must never panic, its error must render, and
//! an accepted rule's canonical spelling (the name rota answers with and keys counters by) must
//! parse back to the very same rule and spelling: `repeat` and `repeat(n=3)` share one rotation
//! only if the canonical form is a fixed point.

#![no_main]

use libfuzzer_sys::fuzz_target;
use rota::rules::{self, MAX_RULE_LEN};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match rules::parse(text) {
        Err(error) => {
            let _ = error.to_string();
        }
        Ok(parsed) => {
            let canonical: &str = &parsed.canonical;
            assert!(
                canonical.len() <= MAX_RULE_LEN,
                "canonical form {canonical:?} of {text:?} is longer than the {MAX_RULE_LEN}-byte limit"
            );
            let again = rules::parse(canonical).unwrap_or_else(|e| {
                panic!("{text:?} parsed, but its canonical form {canonical:?} does not: {e}")
            });
            assert_eq!(again, parsed, "{text:?} → {canonical:?} parses to a different rule");
        }
    }
});
