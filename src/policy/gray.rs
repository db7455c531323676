//! Gray release: per-service version weights for requests that carry no version.
//!
//! `unversioned = 90, versions = { v2 = 10 }` sends exactly 10 of every 100 version-less picks
//! to `v2`: each such pick draws a ticket from the service's gray counter and takes the version
//! at that position of an interleaved schedule. Counted, not sampled, and shared by every
//! consumer.
//!
//! The schedule is computed, never laid out: the weights are divided by their greatest common
//! divisor (90:10 is a cycle of 10), position `p` of the cycle of length `n` stands at
//! `p · step mod n` (a permutation of the cycle, since `step` is coprime with `n`), and that
//! point falls in one version's share of `0..n` (unversioned first, then versions by name).
//! Every version gets exactly its share of each cycle; with `step` the integer nearest `n / φ`
//! that is coprime with `n`, the points of a share are spread evenly over the cycle (gaps of
//! at most three lengths). A policy costs a few words per version whatever its weights, so a
//! 999,999:1 split is as cheap as 9:1.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::GraySpec;
use crate::registry::{InvalidField, truncate};

/// Largest total of gray weights.
pub const MAX_TOTAL: u64 = 1_000_000;

/// Most versions one gray release names.
pub const MAX_VERSIONS: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrayRelease {
    pub unversioned: u32,
    pub versions: BTreeMap<String, u32>,
    /// The schedule's length: the weights' total over their greatest common divisor.
    cycle: u64,
    /// Coprime with `cycle`: position `p` stands at `p · step mod cycle`.
    step: u64,
    /// Each share's end in `0..cycle` and its version (`None` = unversioned), in order; a
    /// zero weight has no share.
    shares: Vec<(u64, Option<Arc<str>>)>,
}

impl GrayRelease {
    /// `None` when the spec sends everything to unversioned instances.
    pub fn new(spec: &GraySpec, field: &str) -> Result<Option<Self>, InvalidField> {
        if spec.versions.len() > MAX_VERSIONS {
            return Err(InvalidField::new(
                format!("{field}.versions"),
                format!("names {} versions; the limit is {MAX_VERSIONS}", spec.versions.len()),
            ));
        }
        for name in spec.versions.keys() {
            crate::registry::validate_service_name(&format!("{field}.versions[{}]", truncate(name)), name)
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
        let weighted = std::iter::once((None, spec.unversioned))
            .chain(spec.versions.iter().map(|(name, weight)| (Some(Arc::<str>::from(name.as_str())), *weight)))
            .filter(|(_, weight)| *weight > 0);
        let divisor = weighted.clone().fold(0, |d, (_, w)| gcd(d, u64::from(w)));
        let mut end = 0;
        let shares = weighted
            .map(|(version, weight)| {
                end += u64::from(weight) / divisor;
                (end, version)
            })
            .collect();
        let cycle = total / divisor;
        Ok(Some(Self {
            unversioned: spec.unversioned,
            versions: spec.versions.clone(),
            cycle,
            step: golden_step(cycle),
            shares,
        }))
    }

    /// The version for the gray ticket `ticket` (`None` = unversioned).
    pub fn version_for(&self, ticket: u64) -> Option<&str> {
        // `cycle` is at most MAX_TOTAL, so the product stays far inside u64.
        let point = (ticket % self.cycle) * self.step % self.cycle;
        let share = self.shares.partition_point(|(end, _)| *end <= point);
        self.shares[share].1.as_deref()
    }
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// The integer nearest `n / φ` that is coprime with `n` (1 for the smallest cycles).
fn golden_step(n: u64) -> u64 {
    if n <= 2 {
        return 1;
    }
    let near = ((n as f64) * 0.618_033_988_749_895).round() as u64;
    // Coprimes are dense (n - 1 always is one), so the search ends within a few steps.
    (0..n)
        .flat_map(|d| [near.saturating_add(d), near.saturating_sub(d)])
        .find(|&k| (1..n).contains(&k) && gcd(k, n) == 1)
        .unwrap_or(1)
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

    #[test]
    fn a_lopsided_split_costs_no_more_than_a_small_one() {
        let spec = GraySpec { unversioned: 999_999, versions: BTreeMap::from([("v2".into(), 1)]) };
        let gray = GrayRelease::new(&spec, "gray").unwrap().unwrap();
        assert_eq!(gray.shares.len(), 2);
        let v2: Vec<u64> = (0..3_000_000).filter(|t| gray.version_for(*t) == Some("v2")).collect();
        assert_eq!(v2.len(), 3, "one in every million");
        assert_eq!((v2[1] - v2[0], v2[2] - v2[1]), (1_000_000, 1_000_000));
        // Weights with a common divisor make the same short cycle.
        let spec = GraySpec { unversioned: 900_000, versions: BTreeMap::from([("v2".into(), 100_000)]) };
        let gray = GrayRelease::new(&spec, "gray").unwrap().unwrap();
        assert_eq!(gray.cycle, 10);
    }

    #[test]
    fn a_share_is_spread_over_the_cycle_not_bunched() {
        // 30 of 100 to v2: no run of more than three unversioned picks between two of v2's.
        let spec = GraySpec { unversioned: 70, versions: BTreeMap::from([("v2".into(), 30)]) };
        let gray = GrayRelease::new(&spec, "gray").unwrap().unwrap();
        let v2: Vec<u64> = (0..200).filter(|t| gray.version_for(*t) == Some("v2")).collect();
        assert_eq!(v2.len(), 60);
        let widest = v2.windows(2).map(|w| w[1] - w[0]).max().unwrap();
        assert!(widest <= 4, "gaps up to {widest}: {v2:?}");
    }

    #[test]
    fn a_long_version_name_is_refused_with_a_short_message() {
        let name = "v".repeat(1 << 20);
        let spec = GraySpec { unversioned: 1, versions: BTreeMap::from([(name, 1)]) };
        let error = GrayRelease::new(&spec, "gray").unwrap_err().to_string();
        assert!(error.len() < 200, "{} bytes", error.len());
        assert_eq!(
            error,
            format!(
                "gray.versions[{}…] is not a valid version name: is 1048576 bytes long; the limit is 253",
                "v".repeat(32)
            )
        );
        let many = GraySpec { unversioned: 1, versions: (0..65).map(|i| (format!("v{i}"), 1)).collect() };
        assert_eq!(
            GrayRelease::new(&many, "gray").unwrap_err().to_string(),
            "gray.versions names 65 versions; the limit is 64"
        );
    }

    proptest! {
        #[test]
        fn shares_are_exact_over_every_cycle(unversioned in 0u32..50, a in 0u32..50, b in 1u32..50) {
            let spec = GraySpec { unversioned, versions: BTreeMap::from([("a".into(), a), ("b".into(), b)]) };
            let gray = GrayRelease::new(&spec, "gray").unwrap().unwrap();
            let total = u64::from(unversioned + a + b);
            prop_assert_eq!(total % gray.cycle, 0);
            let count = |v: Option<&str>| (0..total).filter(|t| gray.version_for(*t) == v).count() as u64;
            prop_assert_eq!(count(None), u64::from(unversioned));
            prop_assert_eq!(count(Some("a")), u64::from(a));
            prop_assert_eq!(count(Some("b")), u64::from(b));
        }
    }
}
