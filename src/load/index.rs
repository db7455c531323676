//! What load-aware rules read about a subset's candidates, kept so that no pick scans them.
//!
//! A [`LoadIndex`] belongs to one subset of one published snapshot and holds, by position, each
//! candidate's fleet-wide in-flight count, latency and breaker state. The statistics store
//! pushes every change into it (on pick, on report, when unreported picks expire), so a pick
//! only reads. Beside the per-position values it keeps a segment tree over the positions whose
//! nodes hold, for the candidates that are not tripped, the least in-flight count, how many
//! candidates have it, and how many candidates there are; and the same per zone when the subset
//! spans several zones. That answers, in O(log n):
//!
//! - the `k`-th untripped candidate in position order (availability rotation);
//! - the `k`-th among the least loaded untripped candidates (best available, ties rotated);
//! - the first untripped candidate at or after a position whose in-flight count is under a limit;
//! - per zone: candidates, tripped, in flight (zone avoidance), and the `k`-th untripped
//!   candidate of a set of zones;
//! - the candidate at a given point of the cumulative `response_time` weights
//!   (`Σ latency − latencyᵢ`, see that rule), from per-node sums of the known latencies.
//!
//! An update costs O(log n) per tree it touches (two with several zones). A pick's excluded
//! candidates are masked out of the trees for the duration of one query and put back, under the
//! index's lock: O(e log n) for e excluded, no copy. Breakers close by time: each trip is queued
//! by its end, and the queries first untrip what has expired (amortised O(log n)).
//!
//! An index is built for one member list, in O(n). When a publication changes a large subset,
//! its new snapshot reads the index built for an earlier (or, for a view already replaced, a
//! later) member list through a [`LoadTable`] until its own is built: the members that left are
//! masked like excluded ones, positions are translated by id (O(log n) each), and members that
//! arrived are not offered until then. A pick never waits for such a build.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::time::Instant;

use crate::registry::{Instance, Subset};

/// Members of a borrowed index that may be missing from the subset reading it; beyond, the
/// subset waits for an index of its own (masking them would make every pick slow).
pub const MAX_DEPARTED: usize = 1024;

/// What load-aware rules read about one candidate.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Load {
    pub in_flight: u64,
    /// Recent latency; `None` until the instance has a reported call.
    pub latency_ms: Option<f64>,
    pub tripped: bool,
}

/// One candidate's statistics as the statistics store last pushed them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LoadSample {
    pub in_flight: u64,
    pub latency_ms: Option<f64>,
    /// The breaker is open until then.
    pub tripped_until: Option<Instant>,
}

/// A subset's candidate loads, by position; see the module documentation.
#[derive(Debug)]
pub struct LoadIndex {
    /// The members it was built for, in position order.
    members: Arc<[Arc<Instance>]>,
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    leaves: Vec<LoadSample>,
    /// Picks in flight over every leaf, kept as leaves change.
    in_flight: u64,
    /// Whether each leaf counts as tripped in the trees (its breaker was open when last looked at).
    tripped: Vec<bool>,
    all: Tree,
    /// Zone number of each position (index into `zones`).
    zone_of: Vec<u32>,
    /// Each position's place among its zone's positions.
    local_of: Vec<u32>,
    /// Zones sorted by name; empty when every candidate is in one zone.
    zones: Vec<Zone>,
    /// (breaker end, position) of tripped leaves, soonest first.
    untrip: BinaryHeap<Reverse<(Instant, u32)>>,
}

#[derive(Debug)]
struct Zone {
    name: Arc<str>,
    /// Positions of the zone's candidates, ascending.
    positions: Vec<u32>,
    tree: Tree,
    in_flight: u64,
    tripped: u64,
}

/// Per-zone totals, on the stack for up to 8 zones: no allocation per pick.
pub type Zones<'a> = smallvec::SmallVec<[ZoneLoad<'a>; 8]>;

/// The per-zone totals zone avoidance compares.
#[derive(Debug, Clone, PartialEq)]
pub struct ZoneLoad<'a> {
    pub zone: &'a str,
    pub instances: u64,
    pub tripped: u64,
    pub in_flight: u64,
}

impl LoadIndex {
    /// An index for `members` (a subset's candidates, in position order), every one idle.
    pub fn new(members: Arc<[Arc<Instance>]>) -> Self {
        let n = members.len();
        let mut names: Vec<Arc<str>> = members.iter().map(|i| i.zone.clone()).collect();
        names.sort();
        names.dedup();
        let zone_of: Vec<u32> =
            members.iter().map(|i| names.binary_search(&i.zone).unwrap_or_else(|at| at) as u32).collect();
        let mut local_of = vec![0u32; n];
        let mut seen = vec![0u32; names.len()];
        for (position, &zone) in zone_of.iter().enumerate() {
            local_of[position] = seen[zone as usize];
            seen[zone as usize] += 1;
        }
        let zones = if names.len() > 1 {
            names
                .into_iter()
                .enumerate()
                .map(|(number, name)| {
                    let positions: Vec<u32> = (0..n as u32).filter(|&p| zone_of[p as usize] == number as u32).collect();
                    Zone { name, tree: Tree::new(positions.len()), positions, in_flight: 0, tripped: 0 }
                })
                .collect()
        } else {
            Vec::new()
        };
        Self {
            members,
            inner: Mutex::new(Inner {
                leaves: vec![LoadSample::default(); n],
                in_flight: 0,
                tripped: vec![false; n],
                all: Tree::new(n),
                zone_of,
                local_of,
                zones,
                untrip: BinaryHeap::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Every update leaves the trees consistent before it can panic; keep serving.
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// The members it was built for, in position order.
    pub fn members(&self) -> &Arc<[Arc<Instance>]> {
        &self.members
    }

    /// Whether it was built for `subset`'s members.
    pub fn is_for(&self, subset: &Subset) -> bool {
        Arc::ptr_eq(&self.members, &subset.members)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Replaces what is known of the candidate at `position`.
    pub fn set(&self, position: usize, sample: LoadSample, now: Instant) {
        let mut inner = self.lock();
        if position >= inner.leaves.len() {
            return;
        }
        let previous = std::mem::replace(&mut inner.leaves[position], sample);
        inner.in_flight = inner.in_flight - previous.in_flight + sample.in_flight;
        let zone_number = inner.zone_of[position] as usize;
        if let Some(zone) = inner.zones.get_mut(zone_number) {
            zone.in_flight = zone.in_flight - previous.in_flight + sample.in_flight;
        }
        if let Some(until) = sample.tripped_until.filter(|until| *until > now) {
            inner.untrip.push(Reverse((until, position as u32)));
        }
        inner.refresh(position, now);
    }

    /// The load of the candidate at `position`.
    pub fn load(&self, position: usize, now: Instant) -> Load {
        self.lock().load(position, now)
    }

    /// Runs `query` on the index as it is at `now`, with the `excluded` candidates (positions,
    /// ascending) masked out.
    pub fn query<T>(&self, now: Instant, excluded: &[usize], query: impl FnOnce(&Query<'_>) -> T) -> T {
        self.masked_query(now, excluded, None, query)
    }

    /// Runs `query` with the positions in `masked` (sorted) masked out; positions go in and out
    /// through `remap` when the reader's members are not the index's.
    fn masked_query<T>(
        &self,
        now: Instant,
        masked: &[usize],
        remap: Option<Remap<'_>>,
        query: impl FnOnce(&Query<'_>) -> T,
    ) -> T {
        let mut inner = self.lock();
        inner.expire_trips(now);
        let n = inner.leaves.len();
        let masked_here = masked.iter().copied().filter(move |&p| p < n);
        for position in masked_here.clone() {
            inner.put(position, None, None);
        }
        let answer = query(&Query { inner: &inner, now, remap, masked });
        for position in masked_here {
            inner.refresh(position, now);
        }
        answer
    }
}

/// A subset's load index as its picks read it: its own, or one built for another snapshot's
/// members of the same subset (see the module documentation).
#[derive(Debug)]
pub struct LoadTable {
    index: Arc<LoadIndex>,
    /// Positions of the index's members that are not among the reader's, ascending; empty for
    /// its own.
    departed: Box<[usize]>,
}

impl LoadTable {
    /// `subset`'s own index.
    pub fn own(index: Arc<LoadIndex>) -> Self {
        Self { index, departed: Box::default() }
    }

    /// `index` (built for any members) read for `subset`; `None` when more than
    /// [`MAX_DEPARTED`] of its members are not among `subset`'s. O(n) for another snapshot's.
    pub fn borrow(index: Arc<LoadIndex>, subset: &Subset) -> Option<Self> {
        if index.is_for(subset) {
            return Some(Self::own(index));
        }
        let (built, current) = (&index.members, &subset.members);
        let mut departed = Vec::new();
        let mut j = 0;
        for (position, member) in built.iter().enumerate() {
            while j < current.len() && !Arc::ptr_eq(&current[j], member) && current[j].id < member.id {
                j += 1;
            }
            if j < current.len() && (Arc::ptr_eq(&current[j], member) || current[j].id == member.id) {
                j += 1;
            } else {
                departed.push(position);
                if departed.len() > MAX_DEPARTED {
                    return None;
                }
            }
        }
        Some(Self { index, departed: departed.into() })
    }

    pub fn index(&self) -> &Arc<LoadIndex> {
        &self.index
    }

    /// Whether the index is `subset`'s own.
    pub fn is_for(&self, subset: &Subset) -> bool {
        self.index.is_for(subset)
    }

    /// Runs `query` for `subset` (the reader) at `now`, with its `excluded` candidates
    /// (positions, ascending) masked.
    pub fn query<T>(
        &self,
        subset: &Subset,
        now: Instant,
        excluded: &[usize],
        query: impl FnOnce(&Query<'_>) -> T,
    ) -> T {
        if self.is_for(subset) {
            return self.index.query(now, excluded, query);
        }
        let remap = Remap { built: &self.index.members, current: &subset.members };
        let mut masked: smallvec::SmallVec<[usize; 32]> = self.departed.iter().copied().collect();
        masked.extend(excluded.iter().filter_map(|&position| remap.in_built(position)));
        masked.sort_unstable();
        masked.dedup();
        self.index.masked_query(now, &masked, Some(remap), query)
    }
}

/// How the positions of an index built for other members map onto the reader's (both sorted
/// by id).
#[derive(Clone, Copy)]
struct Remap<'a> {
    built: &'a [Arc<Instance>],
    current: &'a [Arc<Instance>],
}

impl Remap<'_> {
    /// The reader's position of the index's member at `position`.
    fn in_current(&self, position: usize) -> Option<usize> {
        let id = &self.built.get(position)?.id;
        self.current.binary_search_by(|i| i.id.cmp(id)).ok()
    }

    /// The index's position of the reader's member at `position`.
    fn in_built(&self, position: usize) -> Option<usize> {
        let id = &self.current.get(position)?.id;
        self.built.binary_search_by(|i| i.id.cmp(id)).ok()
    }

    /// The first of the index's positions whose member's id is at least that of the reader's
    /// member at `position`.
    fn built_from(&self, position: usize) -> usize {
        match self.current.get(position) {
            Some(member) => self.built.partition_point(|i| i.id < member.id),
            None => self.built.len(),
        }
    }
}

impl Inner {
    fn load(&self, position: usize, now: Instant) -> Load {
        let Some(leaf) = self.leaves.get(position) else { return Load::default() };
        Load {
            in_flight: leaf.in_flight,
            latency_ms: leaf.latency_ms,
            tripped: leaf.tripped_until.is_some_and(|until| until > now),
        }
    }

    /// Closes the breakers whose time is up.
    fn expire_trips(&mut self, now: Instant) {
        while let Some(&Reverse((until, position))) = self.untrip.peek() {
            if until > now {
                break;
            }
            self.untrip.pop();
            self.refresh(position as usize, now);
        }
    }

    /// Puts the leaf's current value into the trees.
    fn refresh(&mut self, position: usize, now: Instant) {
        let leaf = self.leaves[position];
        let tripped = leaf.tripped_until.is_some_and(|until| until > now);
        if let Some(zone) = self.zones.get_mut(self.zone_of[position] as usize) {
            let was = self.tripped[position];
            zone.tripped = zone.tripped + u64::from(tripped) - u64::from(was);
        }
        self.tripped[position] = tripped;
        self.put(position, (!tripped).then_some(leaf.in_flight), Some(leaf.latency_ms));
    }

    /// Sets a leaf in the trees: `Some(in flight)` when it may be chosen by the load-reading
    /// rules (not tripped, not masked), `None` when not; `latency` is `Some(latest latency)`
    /// while the candidate takes part at all (not masked), `None` when masked.
    fn put(&mut self, position: usize, value: Option<u64>, latency: Option<Option<f64>>) {
        let leaf = Node::leaf(value, latency);
        self.all.set(position, leaf);
        if let Some(zone) = self.zones.get_mut(self.zone_of[position] as usize) {
            zone.tree.set(self.local_of[position] as usize, leaf);
        }
    }
}

/// The index under one lock, excluded candidates masked: what a selector asks. Positions in
/// and out are the reader's.
pub struct Query<'a> {
    inner: &'a Inner,
    now: Instant,
    /// Set when the index was built for other members than the reader's.
    remap: Option<Remap<'a>>,
    /// The index's masked positions.
    masked: &'a [usize],
}

impl Query<'_> {
    /// The index's position of the reader's `position`.
    fn inward(&self, position: usize) -> Option<usize> {
        match self.remap {
            None => Some(position),
            Some(remap) => remap.in_built(position),
        }
    }

    /// The reader's position of the index's `position`.
    fn outward(&self, position: usize) -> Option<usize> {
        match self.remap {
            None => Some(position),
            Some(remap) => remap.in_current(position),
        }
    }

    /// The load of the candidate at `position` (masking does not change it); a candidate the
    /// index does not know yet counts as idle.
    pub fn load(&self, position: usize) -> Load {
        self.inward(position).map_or_else(Load::default, |position| self.inner.load(position, self.now))
    }

    /// Candidates that are neither tripped nor excluded.
    pub fn available(&self) -> usize {
        self.inner.all.free()
    }

    /// Position `ticket mod available` among the available candidates, in position order.
    pub fn nth_available(&self, ticket: u64) -> Option<usize> {
        let available = self.available() as u64;
        (available > 0).then(|| self.inner.all.kth_free((ticket % available) as usize)).and_then(|p| self.outward(p))
    }

    /// Among the available candidates with the fewest picks in flight, the one at
    /// `ticket mod (their count)`, in position order.
    pub fn least_loaded(&self, ticket: u64) -> Option<usize> {
        let tied = self.inner.all.min_count() as u64;
        (tied > 0).then(|| self.inner.all.kth_min((ticket % tied) as usize)).and_then(|p| self.outward(p))
    }

    /// The first available candidate at or after `from` (wrapping around) with fewer than
    /// `limit` picks in flight.
    pub fn next_under(&self, from: usize, limit: u64) -> Option<usize> {
        let tree = &self.inner.all;
        let from = self.remap.map_or(from, |remap| remap.built_from(from));
        tree.first_under(from, limit).or_else(|| tree.first_under(0, limit)).and_then(|p| self.outward(p))
    }

    /// Picks in flight on every candidate (excluded ones too).
    pub fn total_in_flight(&self) -> u64 {
        self.inner.in_flight
    }

    /// Zones sorted by name with their totals; empty when all candidates share one zone.
    /// The candidates the query masks (the excluded ones and, in an index built for other
    /// members, those the reader does not have) are left out of the counts.
    pub fn zones(&self) -> Zones<'_> {
        let inner = self.inner;
        let mut zones: Zones<'_> = inner
            .zones
            .iter()
            .map(|zone| ZoneLoad {
                zone: &zone.name,
                instances: zone.positions.len() as u64,
                tripped: zone.tripped,
                in_flight: zone.in_flight,
            })
            .collect();
        for &position in self.masked {
            let Some(zone) = zones.get_mut(inner.zone_of.get(position).copied().unwrap_or(u32::MAX) as usize) else {
                continue;
            };
            zone.instances -= 1;
            zone.tripped -= u64::from(inner.tripped[position]);
            zone.in_flight -= inner.leaves[position].in_flight;
        }
        zones
    }

    /// Available candidates in the zone named `zone`.
    pub fn available_in(&self, zone: &str) -> usize {
        self.zone(zone).map_or(0, |zone| zone.tree.free())
    }

    /// Position `ticket mod available` among the available candidates of `zones` (names, in
    /// the order given), zone after zone.
    pub fn nth_available_in(&self, zones: &[&str], ticket: u64) -> Option<usize> {
        let total: usize = zones.iter().map(|zone| self.available_in(zone)).sum();
        if total == 0 {
            return None;
        }
        let mut k = (ticket % total as u64) as usize;
        for zone in zones.iter().filter_map(|name| self.zone(name)) {
            let free = zone.tree.free();
            if k < free {
                return self.outward(zone.positions[zone.tree.kth_free(k)] as usize);
            }
            k -= free;
        }
        None
    }

    fn zone(&self, name: &str) -> Option<&Zone> {
        let zones = &self.inner.zones;
        zones.binary_search_by(|zone| (*zone.name).cmp(name)).ok().map(|at| &zones[at])
    }

    /// Whether candidates are spread over several zones.
    pub fn has_zones(&self) -> bool {
        !self.inner.zones.is_empty()
    }

    /// `response_time`'s weights over the candidates that are not excluded: `Σ L − Lᵢ`, where
    /// Lᵢ is a candidate's latency (the mean of the known ones when it has none) and Σ L their
    /// sum. `None` when no latency is known or every weight is zero; otherwise the candidate
    /// at `point` ∈ [0, 1) of the cumulative weights, in position order. O(log n).
    pub fn by_latency_weight(&self, point: f64) -> Option<usize> {
        let tree = &self.inner.all;
        let root = tree.root();
        if root.known == 0 {
            return None;
        }
        let mean = root.sum / f64::from(root.known);
        let latencies = |node: Node| node.sum + f64::from(node.present - node.known) * mean;
        let total = latencies(root);
        let weight = |node: Node| (f64::from(node.present) * total - latencies(node)).max(0.0);
        let all = weight(root);
        if all <= f64::EPSILON {
            return None;
        }
        let mut target = point * all;
        let mut i = 1;
        while i < tree.size {
            let (left, right) = (tree.nodes[2 * i], tree.nodes[2 * i + 1]);
            let on_left = weight(left);
            if left.present > 0 && (target < on_left || right.present == 0) {
                i *= 2;
            } else {
                target -= on_left;
                i = 2 * i + 1;
            }
        }
        self.outward(i - tree.size)
    }
}

/// A segment tree over leaves that are either free (with an in-flight count) or not.
#[derive(Debug)]
struct Tree {
    /// Leaves are at `size..size + n`; node `i` covers its children `2i`, `2i + 1`.
    nodes: Vec<Node>,
    size: usize,
}

#[derive(Debug, Clone, Copy)]
struct Node {
    /// Least in-flight count among free leaves (`u64::MAX` when none).
    min: u64,
    /// Free leaves with that count.
    min_count: u32,
    /// Free leaves.
    free: u32,
    /// Leaves taking part (not masked), tripped or not.
    present: u32,
    /// Present leaves with a known latency, and the sum of those latencies (ms).
    known: u32,
    sum: f64,
}

const EMPTY: Node = Node { min: u64::MAX, min_count: 0, free: 0, present: 0, known: 0, sum: 0.0 };

impl Node {
    fn leaf(value: Option<u64>, latency: Option<Option<f64>>) -> Self {
        let mut node = match value {
            Some(in_flight) => Node { min: in_flight, min_count: 1, free: 1, ..EMPTY },
            None => EMPTY,
        };
        if let Some(latency) = latency {
            node.present = 1;
            node.known = u32::from(latency.is_some());
            node.sum = latency.unwrap_or(0.0);
        }
        node
    }

    fn join(a: Node, b: Node) -> Node {
        let min = a.min.min(b.min);
        let count = |n: Node| if n.min == min && n.free > 0 { n.min_count } else { 0 };
        Node {
            min,
            min_count: count(a) + count(b),
            free: a.free + b.free,
            present: a.present + b.present,
            known: a.known + b.known,
            sum: a.sum + b.sum,
        }
    }
}

impl Tree {
    /// `n` free leaves, each with nothing in flight.
    fn new(n: usize) -> Self {
        let size = n.next_power_of_two().max(1);
        let mut nodes = vec![EMPTY; 2 * size];
        for leaf in &mut nodes[size..size + n] {
            *leaf = Node::leaf(Some(0), Some(None));
        }
        for i in (1..size).rev() {
            nodes[i] = Node::join(nodes[2 * i], nodes[2 * i + 1]);
        }
        Self { nodes, size }
    }

    fn set(&mut self, position: usize, leaf: Node) {
        let mut i = self.size + position;
        self.nodes[i] = leaf;
        while i > 1 {
            i /= 2;
            self.nodes[i] = Node::join(self.nodes[2 * i], self.nodes[2 * i + 1]);
        }
    }

    fn root(&self) -> Node {
        self.nodes[1]
    }

    fn free(&self) -> usize {
        self.root().free as usize
    }

    fn min_count(&self) -> usize {
        let root = self.root();
        if root.free == 0 { 0 } else { root.min_count as usize }
    }

    /// The `k`-th free leaf; `k < free()`.
    fn kth_free(&self, mut k: usize) -> usize {
        let mut i = 1;
        while i < self.size {
            let left = self.nodes[2 * i].free as usize;
            if k < left {
                i *= 2;
            } else {
                k -= left;
                i = 2 * i + 1;
            }
        }
        i - self.size
    }

    /// The `k`-th free leaf holding the least count; `k < min_count()`.
    fn kth_min(&self, mut k: usize) -> usize {
        let min = self.root().min;
        let mut i = 1;
        while i < self.size {
            let left = self.nodes[2 * i];
            let here = if left.min == min && left.free > 0 { left.min_count as usize } else { 0 };
            if k < here {
                i *= 2;
            } else {
                k -= here;
                i = 2 * i + 1;
            }
        }
        i - self.size
    }

    /// The first free leaf at or after `from` with a count under `limit`.
    fn first_under(&self, from: usize, limit: u64) -> Option<usize> {
        if from >= self.size {
            return None;
        }
        self.first_under_in(1, 0, self.size, from, limit)
    }

    fn first_under_in(&self, node: usize, lo: usize, hi: usize, from: usize, limit: u64) -> Option<usize> {
        if hi <= from || self.nodes[node].free == 0 || self.nodes[node].min >= limit {
            return None;
        }
        if hi - lo == 1 {
            return Some(lo);
        }
        let mid = (lo + hi) / 2;
        self.first_under_in(2 * node, lo, mid, from, limit)
            .or_else(|| self.first_under_in(2 * node + 1, mid, hi, from, limit))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::rules::testing::{instance, instances};

    fn sample(in_flight: u64) -> LoadSample {
        LoadSample { in_flight, ..Default::default() }
    }

    proptest! {
        /// The index answers what a scan of the same values answers.
        #[test]
        fn queries_match_a_scan(
            loads in proptest::collection::vec((0u64..4, any::<bool>()), 1..40),
            excluded in proptest::collection::btree_set(0usize..40, 0..5),
            ticket in 0u64..1000,
            limit in 1u64..5,
        ) {
            let now = Instant::now();
            let n = loads.len();
            let index = LoadIndex::new(instances(n).into());
            for (position, &(in_flight, tripped)) in loads.iter().enumerate() {
                let tripped_until = tripped.then(|| now + Duration::from_secs(5));
                index.set(position, LoadSample { in_flight, tripped_until, ..Default::default() }, now);
            }
            let excluded: Vec<usize> = excluded.into_iter().filter(|&e| e < n).collect();
            let usable: Vec<usize> =
                (0..n).filter(|p| !loads[*p].1 && !excluded.contains(p)).collect();
            let least = usable.iter().map(|&p| loads[p].0).min();
            let tied: Vec<usize> = usable.iter().copied().filter(|&p| Some(loads[p].0) == least).collect();
            let expect_nth = (!usable.is_empty()).then(|| usable[(ticket % usable.len() as u64) as usize]);
            let expect_least = (!tied.is_empty()).then(|| tied[(ticket % tied.len() as u64) as usize]);
            let from = (ticket as usize) % n;
            let expect_under = usable.iter().copied().filter(|&p| p >= from).find(|&p| loads[p].0 < limit)
                .or_else(|| usable.iter().copied().find(|&p| loads[p].0 < limit));
            let (nth, least, under, total) = index.query(now, &excluded, |q| {
                (q.nth_available(ticket), q.least_loaded(ticket), q.next_under(from, limit), q.total_in_flight())
            });
            prop_assert_eq!(total, loads.iter().map(|l| l.0).sum::<u64>(), "every leaf, excluded ones too");
            prop_assert_eq!(nth, expect_nth);
            prop_assert_eq!(least, expect_least);
            prop_assert_eq!(under, expect_under);
            // The mask is lifted after the query.
            let all_untripped = loads.iter().filter(|l| !l.1).count();
            prop_assert_eq!(index.query(now, &[], |q| q.available()), all_untripped);
        }
    }

    proptest! {
        /// The candidate found by one descent is the one whose share of the cumulative
        /// `response_time` weights holds the point (checked against a scan, up to rounding).
        #[test]
        fn latency_weights_match_a_scan(
            latencies in proptest::collection::vec(proptest::option::of(1.0f64..100.0), 1..30),
            excluded in proptest::collection::btree_set(0usize..30, 0..4),
            point in 0.0f64..1.0,
        ) {
            let now = Instant::now();
            let n = latencies.len();
            let index = LoadIndex::new(instances(n).into());
            for (position, latency) in latencies.iter().enumerate() {
                index.set(position, LoadSample { latency_ms: *latency, ..Default::default() }, now);
            }
            let excluded: Vec<usize> = excluded.into_iter().filter(|&e| e < n).collect();
            let accepted: Vec<usize> = (0..n).filter(|p| !excluded.contains(p)).collect();
            let known: Vec<f64> = accepted.iter().filter_map(|&p| latencies[p]).collect();
            let found = index.query(now, &excluded, |q| q.by_latency_weight(point));
            if known.is_empty() {
                prop_assert_eq!(found, None);
                return Ok(());
            }
            let mean = known.iter().sum::<f64>() / known.len() as f64;
            let latency = |p: usize| latencies[p].unwrap_or(mean);
            let total: f64 = accepted.iter().map(|&p| latency(p)).sum();
            let weight = |p: usize| if excluded.contains(&p) { 0.0 } else { total - latency(p) };
            let all: f64 = (0..n).map(weight).sum();
            if all <= f64::EPSILON {
                prop_assert_eq!(found, None);
                return Ok(());
            }
            let chosen = found.expect("weights exist");
            prop_assert!(!excluded.contains(&chosen), "an excluded candidate was chosen");
            let before: f64 = (0..chosen).map(weight).sum();
            let target = point * all;
            let slack = 1e-9 * all;
            prop_assert!(before <= target + slack && target <= before + weight(chosen) + slack);
        }
    }

    proptest! {
        /// An index read for other members (some left, some arrived) answers what an index of
        /// the members both have answers, instance for instance.
        #[test]
        fn a_borrowed_index_answers_as_one_of_the_members_both_have(
            fleet in proptest::collection::vec(
                (any::<bool>(), any::<bool>(), 0u64..4, any::<bool>(), proptest::option::of(1.0f64..50.0), any::<bool>()),
                1..40,
            ),
            excluded in proptest::collection::btree_set(0usize..40, 0..5),
            ticket in 0u64..1000,
            limit in 1u64..5,
            point in 0.0f64..1.0,
        ) {
            let now = Instant::now();
            let members: Vec<_> = fleet
                .iter()
                .enumerate()
                .map(|(n, f)| (instance(&format!("i{n:02}"), if f.5 { "east" } else { "west" }, 100), f))
                .collect();
            let pick = |built: bool, current: bool| -> Vec<Arc<Instance>> {
                members.iter().filter(|(_, f)| (!built || f.0) && (!current || f.1)).map(|(i, _)| i.clone()).collect()
            };
            let (built, current, common) = (pick(true, false), pick(false, true), pick(true, true));
            let sample_of = |id: &str| {
                let f = members.iter().find(|(i, _)| &*i.id == id).expect("a member").1;
                let tripped_until = f.3.then(|| now + Duration::from_secs(5));
                LoadSample { in_flight: f.2, latency_ms: f.4, tripped_until }
            };
            let fill = |index: &LoadIndex| {
                for (position, member) in index.members().iter().enumerate() {
                    index.set(position, sample_of(&member.id), now);
                }
            };
            let borrowed = Arc::new(LoadIndex::new(built.clone().into()));
            fill(&borrowed);
            let reference = LoadIndex::new(common.clone().into());
            fill(&reference);
            let subset = Subset::new("test", current.clone());
            let table = LoadTable::borrow(borrowed, &subset).expect("few left");
            prop_assert!(!table.is_for(&subset), "built for another member list");

            let excluded: Vec<usize> = excluded.into_iter().filter(|&e| e < current.len()).collect();
            let common_at = |id: &Arc<str>| common.binary_search_by(|i| i.id.cmp(id)).ok();
            let reference_excluded: Vec<usize> = excluded.iter().filter_map(|&p| common_at(&current[p].id)).collect();
            let from = (ticket as usize) % current.len().max(1);
            let reference_from = current.get(from).map_or(0, |m| common.partition_point(|i| i.id < m.id));
            let by_id = |found: Option<usize>, list: &[Arc<Instance>]| found.map(|p| list[p].id.clone());
            type Answers = (Option<usize>, Option<usize>, Option<usize>, Option<usize>, Option<usize>, Vec<(String, u64, u64, u64)>);
            let ask = |q: &Query<'_>, from: usize| -> Answers {
                let zones = if q.has_zones() {
                    q.zones()
                        .iter()
                        .filter(|z| z.instances > 0)
                        .map(|z| (z.zone.to_owned(), z.instances, z.tripped, z.in_flight))
                        .collect()
                } else {
                    Vec::new()
                };
                (
                    q.nth_available(ticket),
                    q.least_loaded(ticket),
                    q.next_under(from, limit),
                    q.by_latency_weight(point),
                    q.nth_available_in(&["west", "east"], ticket),
                    zones,
                )
            };
            let got = table.query(&subset, now, &excluded, |q| ask(q, from));
            let want = reference.query(now, &reference_excluded, |q| ask(q, reference_from));
            prop_assert_eq!(by_id(got.0, &current), by_id(want.0, &common), "nth_available");
            prop_assert_eq!(by_id(got.1, &current), by_id(want.1, &common), "least_loaded");
            prop_assert_eq!(by_id(got.2, &current), by_id(want.2, &common), "next_under");
            prop_assert_eq!(by_id(got.3, &current), by_id(want.3, &common), "by_latency_weight");
            // Zones the members that left took with them are not compared.
            if reference.query(now, &[], |q| q.has_zones()) {
                prop_assert_eq!(by_id(got.4, &current), by_id(want.4, &common), "nth_available_in");
                prop_assert_eq!(got.5, want.5, "zones");
            }
            for (position, member) in current.iter().enumerate() {
                let load = table.query(&subset, now, &[], |q| q.load(position));
                let expected = common_at(&member.id).map_or_else(Load::default, |p| reference.load(p, now));
                prop_assert_eq!(load, expected, "load of {}", member.id);
            }
        }
    }

    #[test]
    fn an_index_most_of_whose_members_left_is_not_borrowed() {
        let all = instances(MAX_DEPARTED + 2);
        let index = Arc::new(LoadIndex::new(all.clone().into()));
        assert!(LoadTable::borrow(index.clone(), &Subset::new("test", all[..2].to_vec())).is_some());
        assert!(LoadTable::borrow(index, &Subset::new("test", all[..1].to_vec())).is_none());
    }

    #[test]
    fn a_breaker_closes_when_its_time_is_up() {
        let now = Instant::now();
        let index = LoadIndex::new(instances(3).into());
        index.set(1, LoadSample { tripped_until: Some(now + Duration::from_secs(10)), ..sample(0) }, now);
        assert_eq!(index.query(now, &[], |q| q.available()), 2);
        assert!(index.load(1, now).tripped);
        let later = now + Duration::from_secs(10);
        assert_eq!(index.query(later, &[], |q| q.available()), 3);
        assert!(!index.load(1, later).tripped);
    }

    #[test]
    fn zones_are_counted_apart_and_rotated_zone_after_zone() {
        let members = vec![
            instance("a1", "east", 100),
            instance("b1", "west", 100),
            instance("a2", "east", 100),
            instance("c1", "north", 100),
        ];
        let now = Instant::now();
        let index = LoadIndex::new(members.into());
        index.set(1, sample(4), now);
        index.set(3, LoadSample { tripped_until: Some(now + Duration::from_secs(1)), ..sample(1) }, now);
        let excluded = [2];
        index.query(now, &excluded, |q| {
            let zones = q.zones();
            let totals: Vec<_> = zones.iter().map(|z| (z.zone, z.instances, z.tripped, z.in_flight)).collect();
            assert_eq!(totals, [("east", 1, 0, 0), ("north", 1, 1, 1), ("west", 1, 0, 4)]);
            assert_eq!(q.available_in("east"), 1);
            let picks: Vec<_> = (0..4).map(|t| q.nth_available_in(&["west", "east"], t).unwrap()).collect();
            assert_eq!(picks, [1, 0, 1, 0]);
        });
    }
}
