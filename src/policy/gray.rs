//! Gray release: per-service version weights for requests that carry no version.
//!
//! `unversioned = 90, versions = { v2 = 10 }` sends exactly 10 of every 100 version-less picks
//! to `v2`: each such pick draws a ticket from the service's gray counter and takes the version
//! at that position of an interleaved weight schedule (the same earliest-deadline-first
//! schedule as `weighted`). Counted, not sampled, and shared by every consumer.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::GraySpec;
use crate::registry::InvalidField;
use crate::rules::WeightSchedule;

/// Largest total of gray weights.
pub const MAX_TOTAL: u64 = 1_000_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrayRelease {
    pub unversioned: u32,
    pub versions: BTreeMap<String, u32>,
    /// Position → version (`None` = unversioned).
    slots: Vec<Option<Arc<str>>>,
}

impl GrayRelease {
    /// `None` when the spec sends everything to unversioned instances.
    pub fn new(spec: &GraySpec, field: &str) -> Result<Option<Self>, InvalidField> {
        for name in spec.versions.keys() {
            crate::registry::validate_service_name(&format!("{field}.versions[{name}]"), name)
                .map_err(|e| InvalidField::new(e.field, format!("is not a valid version name: {}", e.problem)))?;
        }
        let total: u64 = u64::from(spec.unversioned) + spec.versions.values().map(|w| u64::from(*w)).sum::<u64>();
        if total == 0 {
            return Err(InvalidField::new(field, "weights must not all be zero"));
        }
        if total > MAX_TOTAL {
            return Err(InvalidField::new(field, format!("weights add up to {total}; the limit is {MAX_TOTAL}")));
        }
        if spec.versions.values().all(|w| *w == 0) {
            return Ok(None);
        }
        let mut labels: Vec<Option<Arc<str>>> = vec![None];
        let mut weights = vec![u64::from(spec.unversioned)];
        for (name, weight) in &spec.versions {
            labels.push(Some(name.as_str().into()));
            weights.push(u64::from(*weight));
        }
        let schedule = WeightSchedule::build(&weights);
        let slots = schedule.slots.iter().map(|&i| labels[i as usize].clone()).collect();
        Ok(Some(Self { unversioned: spec.unversioned, versions: spec.versions.clone(), slots }))
    }

    /// The version for the gray ticket `ticket` (`None` = unversioned).
    pub fn version_for(&self, ticket: u64) -> Option<&str> {
        self.slots[(ticket % self.slots.len() as u64) as usize].as_deref()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn ten_of_every_hundred_go_to_v2() {
        let spec = GraySpec { unversioned: 90, versions: BTreeMap::from([("v2".into(), 10)]) };
        let gray = GrayRelease::new(&spec, "gray").unwrap().unwrap();
        for start in [0u64, 7, 1000] {
            let v2 = (start..start + 100).filter(|t| gray.version_for(*t) == Some("v2")).count();
            assert_eq!(v2, 10);
        }
    }

    #[test]
    fn refuses_nonsense() {
        let zero = GraySpec { unversioned: 0, versions: BTreeMap::new() };
        assert_eq!(GrayRelease::new(&zero, "gray").unwrap_err().to_string(), "gray weights must not all be zero");
        let bad_name = GraySpec { unversioned: 1, versions: BTreeMap::from([("v 2".into(), 1)]) };
        assert!(
            GrayRelease::new(&bad_name, "gray")
                .unwrap_err()
                .to_string()
                .starts_with("gray.versions[v 2] is not a valid version name")
        );
    }

    proptest! {
        #[test]
        fn shares_are_exact_over_every_cycle(unversioned in 0u32..50, a in 0u32..50, b in 1u32..50) {
            let spec = GraySpec { unversioned, versions: BTreeMap::from([("a".into(), a), ("b".into(), b)]) };
            let gray = GrayRelease::new(&spec, "gray").unwrap().unwrap();
            let total = u64::from(unversioned + a + b);
            let count = |v: Option<&str>| (0..total).filter(|t| gray.version_for(*t) == v).count() as u64;
            prop_assert_eq!(count(None), u64::from(unversioned));
            prop_assert_eq!(count(Some("a")), u64::from(a));
            prop_assert_eq!(count(Some("b")), u64::from(b));
        }
    }
}
