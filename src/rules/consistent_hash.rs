//! `consistent_hash(balance=B)`: request key → instance, with minimal disruption when instances
//! come and go, using a Maglev lookup table (Eisenbud et al., NSDI 2016).
//!
//! Each instance fills table slots following its own permutation of the table (offset and skip
//! from two hashes of its id), in turns, until the table is full; a key maps to
//! `table[hash(key) mod M]`. Lookups are O(1), and when one of n instances leaves only about 1/n
//! of keys move. M is a prime at least 100 × n (65,537 at minimum) so shares stay within about
//! 1 % of each other.
//!
//! With `balance` set, loads are bounded (Mirrokni, Thorup and Zadimoghaddam, "Consistent
//! Hashing with Bounded Loads", 2018): no instance may hold more than
//! `⌈balance × (total in flight + 1) / n⌉` picks in flight; a key whose instance is full walks
//! the table from its slot to the next instance under the cap. In-flight counts are the central,
//! fleet-wide ones.
//!
//! Hashes are XXH3-64 with fixed seeds, so the mapping is identical on every replica and every
//! release; `tests/golden/consistent_hash.txt` pins it.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::{Choice, Draw, Needs, Params, RuleDef, RuleError, Select, Standard};

const KEY_SEED: u64 = 0x726f_7461_6b65_7973; // "rotakeys"
const OFFSET_SEED: u64 = 0x726f_7461_6f66_6673; // "rotaoffs"
const SKIP_SEED: u64 = 0x726f_7461_736b_6970; // "rotaskip"
const MIN_TABLE: u64 = 65_537;

/// Accepted range of `balance`, in thousandths (1.0 to 100.0).
pub const BALANCE_RANGE: std::ops::RangeInclusive<u32> = 1_000..=100_000;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ConsistentHash {
    /// Bounded-load factor in thousandths (1250 = 1.25); `None` = unbounded.
    pub balance_milli: Option<u32>,
}

/// The hash of a request key, as the table is indexed by it.
pub fn hash_key(key: &str) -> u64 {
    xxh3_64_with_seed(key.as_bytes(), KEY_SEED)
}

impl Select for ConsistentHash {
    fn select(&self, draw: &Draw<'_>, _rng: &mut fastrand::Rng) -> Option<Choice> {
        let members = draw.members();
        let built = draw.candidates.tables.maglev.load();
        let built = built.as_ref()?;
        let table = &built.table.table;
        if table.is_empty() {
            return None;
        }
        let start = (hash_key(draw.key) % table.len() as u64) as usize;
        // A table built for an earlier snapshot's members is read through their ids.
        let slots = (0..table.len())
            .filter_map(|step| built.position(table[(start + step) % table.len()] as usize, &draw.candidates.subset));
        // An excluded instance's slots are walked past, so only keys that lived on it move.
        let Some(balance_milli) = self.balance_milli else {
            return slots.clone().find(|&i| draw.accepts(i)).map(Choice::at);
        };
        let bounded = draw.loads_by_position(|loads| {
            let total = loads.total_in_flight();
            let cap = (u128::from(balance_milli) * u128::from(total + 1)).div_ceil(1000 * members.len() as u128);
            let cap = u64::try_from(cap).unwrap_or(u64::MAX).max(1);
            slots.clone().find(|&index| draw.accepts(index) && loads.load(index).in_flight < cap)
        });
        // Without a load index yet, loads are not bounded.
        let bounded = bounded.flatten();
        bounded.or_else(|| slots.clone().find(|&i| draw.accepts(i))).map(Choice::at)
    }
}

impl RuleDef for ConsistentHash {
    const NAME: &'static str = "consistent_hash";
    const PARAMS: &'static [&'static str] = &["balance"];

    fn standard(&self) -> Standard {
        Standard::RingHash
    }

    fn parse(params: &mut Params<'_>) -> Result<Self, RuleError> {
        Ok(ConsistentHash { balance_milli: params.milli("balance", BALANCE_RANGE)? })
    }

    fn canonical(&self) -> String {
        match self.balance_milli {
            None => Self::NAME.to_owned(),
            Some(milli) => format!("consistent_hash(balance={})", f64::from(milli) / 1000.0),
        }
    }

    fn needs(&self) -> Needs {
        Needs { maglev: true, load: self.balance_milli.is_some(), ..Needs::default() }
    }

    fn needs_key(&self) -> bool {
        true
    }
}

/// A Maglev lookup table: slot → position in the subset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Maglev {
    pub table: Vec<u32>,
}

impl Maglev {
    pub fn build<'a>(ids: impl ExactSizeIterator<Item = &'a str>) -> Self {
        let n = ids.len() as u64;
        if n == 0 {
            return Self { table: Vec::new() };
        }
        let size = next_prime((100 * n).max(MIN_TABLE));
        let permutations: Vec<(u64, u64)> = ids
            .map(|id| {
                let offset = xxh3_64_with_seed(id.as_bytes(), OFFSET_SEED) % size;
                let skip = xxh3_64_with_seed(id.as_bytes(), SKIP_SEED) % (size - 1) + 1;
                (offset, skip)
            })
            .collect();
        let mut next = vec![0u64; permutations.len()];
        let mut table = vec![u32::MAX; size as usize];
        let mut filled = 0u64;
        'fill: loop {
            for (index, &(offset, skip)) in permutations.iter().enumerate() {
                let mut slot = (offset + next[index] * skip) % size;
                while table[slot as usize] != u32::MAX {
                    next[index] += 1;
                    slot = (offset + next[index] * skip) % size;
                }
                table[slot as usize] = index as u32;
                next[index] += 1;
                filled += 1;
                if filled == size {
                    break 'fill;
                }
            }
        }
        Self { table }
    }
}

fn next_prime(mut n: u64) -> u64 {
    while !is_prime(n) {
        n += 1;
    }
    n
}

fn is_prime(n: u64) -> bool {
    if n < 2 {
        return false;
    }
    let mut d = 2;
    while d * d <= n {
        if n.is_multiple_of(d) {
            return false;
        }
        d += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;

    use super::*;
    use crate::rules::Load;
    use crate::rules::testing::{hashed, instances, set_load};

    fn mapping(ids: &[String], keys: usize) -> Vec<String> {
        let maglev = Maglev::build(ids.iter().map(String::as_str));
        (0..keys)
            .map(|k| {
                let slot = hash_key(&format!("key-{k}")) % maglev.table.len() as u64;
                ids[maglev.table[slot as usize] as usize].clone()
            })
            .collect()
    }

    #[test]
    fn one_leaving_instance_moves_about_one_nth_of_keys() {
        const KEYS: usize = 20_000;
        for n in [3usize, 10, 50] {
            let ids: Vec<String> = (0..n).map(|i| format!("10.0.0.{i}:8080")).collect();
            let before = mapping(&ids, KEYS);
            let leaving = ids[n / 2].clone();
            let remaining: Vec<String> = ids.iter().filter(|id| **id != leaving).cloned().collect();
            let after = mapping(&remaining, KEYS);
            let moved = before.iter().zip(&after).filter(|(b, a)| b != a).count();
            let orphaned = before.iter().filter(|b| **b == leaving).count();
            // Every key of the leaving instance must move; Maglev moves only a little more.
            assert!(moved >= orphaned);
            let share = moved as f64 / KEYS as f64;
            assert!(share <= 1.0 / n as f64 * 1.25 + 0.005, "n={n}: moved {share:.4}");
        }
    }

    #[test]
    fn table_shares_are_even() {
        let ids: Vec<String> = (0..7).map(|i| format!("node-{i}")).collect();
        let maglev = Maglev::build(ids.iter().map(String::as_str));
        let mut counts = vec![0usize; 7];
        for &slot in &maglev.table {
            counts[slot as usize] += 1;
        }
        let expected = maglev.table.len() / 7;
        assert!(counts.iter().all(|&c| c.abs_diff(expected) <= expected / 100 + 1), "{counts:?}");
    }

    #[test]
    fn bounded_load_keeps_every_instance_under_its_cap() {
        // Keys all land somewhere; as picks accumulate, no instance passes ⌈1.25 (total + 1) / n⌉.
        let candidates = hashed(instances(5));
        let rule = ConsistentHash { balance_milli: Some(1250) };
        let mut in_flight: HashMap<String, u64> = HashMap::new();
        let mut rng = fastrand::Rng::with_seed(1);
        for k in 0..500 {
            for (id, n) in &in_flight {
                set_load(&candidates, id, Load { in_flight: *n, ..Default::default() });
            }
            let key = format!("hot-{}", k % 3); // three hot keys would pile onto ≤ 3 instances
            let draw = Draw { key: &key, ..Draw::new(&candidates, k) };
            let index = rule.select(&draw, &mut rng).unwrap().index;
            let total: u64 = in_flight.values().sum();
            let cap = (1.25 * (total + 1) as f64 / 5.0).ceil() as u64;
            let entry = in_flight.entry(candidates.members()[index].id.to_string()).or_default();
            assert!(*entry < cap, "pick {k}: {entry} ≥ cap {cap}");
            *entry += 1;
        }
        assert_eq!(in_flight.len(), 5, "the load spread over every instance");
    }

    #[test]
    fn a_table_of_earlier_members_is_read_through_their_ids_until_rebuilt() {
        let before = hashed(instances(6));
        let key = |k: usize| format!("key-{k}");
        let pick = |candidates: &crate::rules::Candidates, k: usize| {
            let key = key(k);
            let draw = Draw { key: &key, ..Draw::new(candidates, 0) };
            let index = ConsistentHash::default().select(&draw, &mut fastrand::Rng::with_seed(1)).unwrap().index;
            candidates.members()[index].id.to_string()
        };
        // i03 leaves; the new subset still reads the old table.
        let remaining: Vec<_> = before.members().iter().filter(|i| &*i.id != "i03").cloned().collect();
        let after = crate::rules::Candidates::new(crate::registry::Subset::new("test", remaining));
        after.inherit(&before);
        for k in 0..300 {
            let (old, new) = (pick(&before, k), pick(&after, k));
            if old != "i03" {
                assert_eq!(old, new, "key {k} kept its instance");
            } else {
                assert_ne!(new, "i03");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        #[test]
        fn excluding_an_instance_moves_only_the_keys_that_lived_on_it(
            n in 2usize..30,
            excluded in proptest::collection::btree_set(0usize..30, 1..4),
            bounded in any::<bool>(),
        ) {
            let candidates = hashed(instances(n));
            let excluded: Vec<usize> = excluded.into_iter().filter(|&e| e < n).collect();
            prop_assume!(!excluded.is_empty() && excluded.len() < n);
            let rule = ConsistentHash { balance_milli: bounded.then_some(1250) };
            let mut rng = fastrand::Rng::with_seed(1);
            for k in 0..300 {
                let key = format!("key-{k}");
                let draw = Draw { key: &key, ..Draw::new(&candidates, 0) };
                let before = rule.select(&draw, &mut rng).unwrap().index;
                let retry = Draw { excluded: crate::rules::Excluded::new(&excluded), ..draw };
                let after = rule.select(&retry, &mut rng).unwrap().index;
                prop_assert!(!excluded.contains(&after), "an excluded instance is never returned");
                if !excluded.contains(&before) {
                    prop_assert_eq!(before, after, "key {} lived elsewhere and must stay", key);
                }
            }
        }

        #[test]
        fn same_key_same_instance(key in "[a-z0-9]{1,20}", n in 1usize..20) {
            let candidates = hashed(instances(n));
            let mut rng = fastrand::Rng::with_seed(1);
            let first = ConsistentHash::default().select(&Draw { key: &key, ..Draw::new(&candidates, 0) }, &mut rng);
            let again = ConsistentHash::default().select(&Draw { key: &key, ..Draw::new(&candidates, 99) }, &mut rng);
            prop_assert_eq!(first, again);
            prop_assert!(first.unwrap().index < n);
        }
    }
}

#[cfg(test)]
mod golden {
    use std::fmt::Write;

    use super::*;

    /// Fixed instance set and keys whose mapping must never change silently between releases.
    /// Regenerate (after a deliberate change, with a release note) with `ROTA_UPDATE_GOLDEN=1`.
    #[test]
    fn mapping_matches_the_golden_file() {
        let ids: Vec<String> = (1..=5).map(|i| format!("10.0.0.{i}:8080")).collect();
        let maglev = Maglev::build(ids.iter().map(String::as_str));
        let mut actual = String::new();
        for k in 0..64 {
            let key = format!("user-{k}");
            let slot = hash_key(&key) % maglev.table.len() as u64;
            writeln!(actual, "{key} {}", ids[maglev.table[slot as usize] as usize]).unwrap();
        }
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/consistent_hash.txt");
        if std::env::var_os("ROTA_UPDATE_GOLDEN").is_some() {
            std::fs::write(path, &actual).unwrap();
        }
        let expected = std::fs::read_to_string(path).expect("golden file exists");
        assert_eq!(actual, expected, "consistent_hash mapping changed");
    }
}
