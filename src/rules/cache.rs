//! A cache of parsed rule strings, so a pick costs one hash lookup instead of a parse.
//!
//! Reads are lock-free: the cache is an immutable map behind an `ArcSwap`, replaced whole when
//! a new rule string arrives (rare: consumers use a handful of rules). Only valid rules are
//! cached, and the cache is bounded: a client sending ever-new rule strings cannot grow it
//! without limit; past the bound, strings are parsed on every use instead.

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::hash::Map;

use super::spec::{ParsedRule, RuleError, parse};

/// Distinct rule strings remembered at most.
const CAPACITY: usize = 1024;

#[derive(Debug, Default)]
pub struct RuleCache {
    parsed: ArcSwap<Map<Arc<str>, Arc<ParsedRule>>>,
}

impl RuleCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// The parsed form of `text` (which must not be empty).
    pub fn get(&self, text: &str) -> Result<Arc<ParsedRule>, RuleError> {
        if let Some(parsed) = self.parsed.load().get(text) {
            return Ok(parsed.clone());
        }
        let parsed = Arc::new(parse(text)?);
        if self.len() < CAPACITY {
            self.parsed.rcu(|current| {
                let mut next = Map::clone(current);
                if next.len() < CAPACITY {
                    next.entry(text.into()).or_insert_with(|| parsed.clone());
                }
                next
            });
        }
        Ok(parsed)
    }

    pub fn len(&self) -> usize {
        self.parsed.load().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caches_valid_rules_only_and_stays_bounded() {
        let cache = RuleCache::new();
        let first = cache.get("repeat(n=4)").unwrap();
        let second = cache.get("repeat(n=4)").unwrap();
        assert!(Arc::ptr_eq(&first, &second), "second lookup is served from the cache");
        assert!(cache.get("bogus").is_err());
        assert_eq!(cache.len(), 1);
        for n in 1..=(CAPACITY as u32 + 10) {
            cache.get(&format!("repeat(n={n})")).unwrap();
        }
        assert_eq!(cache.len(), CAPACITY);
    }
}
