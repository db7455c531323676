//! The churn scenario's history and the checker that judges it.
//!
//! A history is what the soak clients saw, on one monotonic clock (nanoseconds since the run
//! began): every successful pick with the moment its request was sent (`start`) and its answer
//! arrived (`end`), and every registration change of one instance with the moment it was sent
//! (`send`) and acknowledged (`ack`). rota acknowledges a change only once picks can see it, so
//! an instance is *possibly live* from the send of the change that made it live (an accepted
//! Announce or an Update to UP) until the ack of the change that ended it (Withdraw, Update to
//! DRAINING or DOWN, or its stream closing — for a closed stream, "ack" is the moment a
//! listing first showed the instance gone). A refused change keeps the instance as it was, but
//! counts as possibly live between its send and its ack, so a refusal never makes a false alarm.
//!
//! A violation of each check:
//!
//! - **live** — a pick returned an instance that was not possibly live at any moment between
//!   the pick's start and end (or one the run never registered);
//! - **stale** — such a pick, started after the acknowledgement of a change that removed the
//!   instance (withdrawn, drained, closed) and with no later change making it live again sent
//!   before the pick ended: rota picked an instance after saying it would not;
//! - **tickets** — two picks of one rotation (service, canonical rule, version subset, the
//!   subset named by the version of the returned instance) were handed the same ticket;
//! - **shares** — in a *quiet window* of a service (no registration change of the service in
//!   flight between a pick's start and end), with n instances eligible in the subset, the
//!   rotation is not exact: two tickets in the same position (`t mod n` for round robin,
//!   `(t / k) mod n` for `repeat(n=k)`) went to different instances, one instance took two
//!   positions, or an instance outside the eligible set was picked. This is the "ticket t and
//!   t + n go to the same instance" and "runs of k" property, checked without assuming how
//!   rota orders the eligible list.

use std::collections::{BTreeMap, HashMap};

/// Nanoseconds since the start of the run, from one monotonic clock.
pub type Nanos = u64;

/// Stands for an instance id or version the run never registered.
pub const UNKNOWN: u32 = u32::MAX;

/// Evidence kept per check; the count goes on past it.
const EXAMPLES: usize = 5;

/// The rules whose ticket → position mapping the checker knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PickRule {
    RoundRobin,
    /// `repeat(n=K)`.
    Repeat(u32),
}

impl PickRule {
    /// The canonical name rota answers with.
    pub fn canonical(self) -> String {
        match self {
            PickRule::RoundRobin => "round_robin".into(),
            PickRule::Repeat(k) => format!("repeat(n={k})"),
        }
    }

    pub fn parse(canonical: &str) -> Option<Self> {
        if canonical == "round_robin" {
            return Some(PickRule::RoundRobin);
        }
        let k = canonical.strip_prefix("repeat(n=")?.strip_suffix(')')?.parse().ok()?;
        Some(PickRule::Repeat(k))
    }

    /// The position of the eligible list that `ticket` maps to when `n` are eligible.
    pub(super) fn position(self, ticket: u64, n: u64) -> u64 {
        match self {
            PickRule::RoundRobin => ticket % n,
            PickRule::Repeat(k) => (ticket / u64::from(k.max(1))) % n,
        }
    }
}

/// Every name the run uses, numbered, so a history of millions of picks stays compact.
#[derive(Debug, Default, Clone)]
pub struct Universe {
    services: Vec<String>,
    versions: Vec<String>,
    /// (service, id) of each instance.
    instances: Vec<(u32, String)>,
    by_service: HashMap<String, u32>,
    by_version: HashMap<String, u32>,
    by_id: HashMap<String, HashMap<String, u32>>,
}

impl Universe {
    pub fn service(&mut self, name: &str) -> u32 {
        intern(&mut self.services, &mut self.by_service, name)
    }

    pub fn version(&mut self, name: &str) -> u32 {
        intern(&mut self.versions, &mut self.by_version, name)
    }

    pub fn instance(&mut self, service: &str, id: &str) -> u32 {
        if let Some(found) = self.find_instance(service, id) {
            return found;
        }
        let s = self.service(service);
        let index = self.instances.len() as u32;
        self.instances.push((s, id.to_owned()));
        self.by_id.entry(service.to_owned()).or_default().insert(id.to_owned(), index);
        index
    }

    pub fn find_service(&self, name: &str) -> u32 {
        self.by_service.get(name).copied().unwrap_or(UNKNOWN)
    }

    pub fn find_version(&self, name: &str) -> u32 {
        self.by_version.get(name).copied().unwrap_or(UNKNOWN)
    }

    pub fn find_instance(&self, service: &str, id: &str) -> Option<u32> {
        self.by_id.get(service)?.get(id).copied()
    }

    fn service_of(&self, instance: u32) -> u32 {
        self.instances[instance as usize].0
    }

    /// `service/id`, for evidence.
    pub fn describe(&self, instance: u32) -> String {
        match self.instances.get(instance as usize) {
            Some((service, id)) => format!("{}/{id}", self.services[*service as usize]),
            None => "an instance never registered".into(),
        }
    }

    fn version_name(&self, version: u32) -> &str {
        self.versions.get(version as usize).map_or("?", String::as_str)
    }
}

fn intern(names: &mut Vec<String>, index: &mut HashMap<String, u32>, name: &str) -> u32 {
    *index.entry(name.to_owned()).or_insert_with(|| {
        names.push(name.to_owned());
        names.len() as u32 - 1
    })
}

/// One successful pick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pick {
    pub start: Nanos,
    pub end: Nanos,
    pub service: u32,
    /// [`UNKNOWN`] when rota answered with an id the run never registered.
    pub instance: u32,
    /// The returned instance's version: it names the subset the ticket was drawn from.
    pub version: u32,
    /// The rule rota answered with.
    pub rule: PickRule,
    pub ticket: u64,
    /// What the pick asked for: the rule and the version.
    pub asked_rule: PickRule,
    pub asked_version: u32,
    /// Whether the answer carried a fallback note.
    pub fallback: bool,
}

/// What one registration change did to one instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// Announced (or re-announced) with this version, UP or not.
    Announce {
        version: u32,
        up: bool,
    },
    /// An Update: `Some(true)` to UP, `Some(false)` to DRAINING or DOWN, `None` weight only.
    Update {
        up: Option<bool>,
    },
    Withdraw,
    /// Its stream closed; `ack` is when a listing first showed it gone.
    Close,
}

/// One change of one instance, as sent and acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub send: Nanos,
    pub ack: Nanos,
    pub instance: u32,
    pub change: Change,
    /// The ack listed the instance as accepted (a close is always "accepted").
    pub accepted: bool,
}

/// Violations of one check: how many, and the first few described.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    pub count: u64,
    pub examples: Vec<String>,
}

impl Tally {
    pub(super) fn add(&mut self, evidence: impl FnOnce() -> String) {
        self.count += 1;
        if self.examples.len() < EXAMPLES {
            self.examples.push(evidence());
        }
    }
}

/// The checker's verdict on a history.
#[derive(Debug, Clone, Default)]
pub struct Findings {
    pub picks: usize,
    pub events: usize,
    /// Picks that fell inside a quiet window and were checked for exact shares.
    pub quiet_picks: usize,
    /// Quiet windows (per service) that held at least one checked pick.
    pub quiet_windows: usize,
    pub live: Tally,
    pub stale: Tally,
    pub tickets: Tally,
    pub shares: Tally,
    pub answers: Tally,
}

/// A complete history: the names, then what was seen.
#[derive(Debug, Clone, Default)]
pub struct History {
    pub universe: Universe,
    pub picks: Vec<Pick>,
    pub events: Vec<Event>,
}

/// Seconds with millisecond precision, for evidence.
pub(crate) fn secs(at: Nanos) -> String {
    format!("{:.3}s", at as f64 / 1e9)
}

impl History {
    fn describe_pick(&self, pick: &Pick) -> String {
        format!(
            "pick of {} (ticket {}, {}, version {:?}) sent {} answered {}",
            self.universe.describe(pick.instance),
            pick.ticket,
            pick.rule.canonical(),
            self.universe.version_name(pick.version),
            secs(pick.start),
            secs(pick.end)
        )
    }

    /// Every pick was answered as asked: under the rule it named, from the version it named
    /// (every subset has an eligible instance throughout, so none falls back).
    pub(super) fn check_answers(&self, findings: &mut Findings) {
        for pick in &self.picks {
            let wrong = pick.rule != pick.asked_rule || pick.version != pick.asked_version || pick.fallback;
            if wrong {
                findings.answers.add(|| {
                    format!(
                        "{}: asked {} of version {:?}{}",
                        self.describe_pick(pick),
                        pick.asked_rule.canonical(),
                        self.universe.version_name(pick.asked_version),
                        if pick.fallback { ", answered with a fallback" } else { "" }
                    )
                });
            }
        }
    }

    /// Checks `live` and `stale`.
    pub(super) fn check_liveness(&self, findings: &mut Findings) {
        let timelines = self.timelines();
        for pick in &self.picks {
            let Some(timeline) = timelines.get(&pick.instance) else {
                findings.live.add(|| format!("{}: never registered", self.describe_pick(pick)));
                continue;
            };
            // The last possibly-live interval starting no later than the pick's end.
            let before_end = timeline.live.partition_point(|&(from, _)| from <= pick.end);
            let overlaps = before_end > 0 && timeline.live[before_end - 1].1 >= pick.start;
            if overlaps {
                continue;
            }
            findings.live.add(|| format!("{}: not live at any moment in between", self.describe_pick(pick)));
            let acked_before = timeline.removals.partition_point(|&ack| ack <= pick.start);
            if acked_before > 0 {
                let ack = timeline.removals[acked_before - 1];
                findings.stale.add(|| {
                    format!(
                        "{}: its removal was acknowledged at {}, {:.1} ms before the pick was sent",
                        self.describe_pick(pick),
                        secs(ack),
                        (pick.start - ack) as f64 / 1e6
                    )
                });
            }
        }
    }

    /// Each instance's possibly-live intervals (merged, sorted) and removal acks (sorted).
    fn timelines(&self) -> HashMap<u32, Timeline> {
        let mut by_instance: HashMap<u32, Vec<&Event>> = HashMap::new();
        for event in &self.events {
            by_instance.entry(event.instance).or_default().push(event);
        }
        by_instance
            .into_iter()
            .map(|(instance, mut events)| {
                // One owner sends an instance's changes one at a time, so send order is the
                // order they were applied in.
                events.sort_by_key(|e| (e.send, e.ack));
                (instance, Timeline::build(&events))
            })
            .collect()
    }

    /// Checks `tickets`: sorts the picks by rotation and ticket, so a repeat sits next to its
    /// first.
    pub(super) fn check_tickets(&self, findings: &mut Findings) {
        let key = |p: &Pick| (p.service, p.rule, p.version, p.ticket);
        let mut order: Vec<u32> = (0..self.picks.len() as u32).collect();
        order.sort_unstable_by_key(|&i| key(&self.picks[i as usize]));
        for pair in order.windows(2) {
            let (first, second) = (&self.picks[pair[0] as usize], &self.picks[pair[1] as usize]);
            if key(first) == key(second) {
                findings.tickets.add(|| {
                    format!("ticket handed out twice: {} and {}", self.describe_pick(first), self.describe_pick(second))
                });
            }
        }
    }

    /// Quiet-window bookkeeping shared with the shares check: the events of each service,
    /// and the service of each event.
    pub(super) fn events_by_service(&self) -> BTreeMap<u32, Vec<&Event>> {
        let mut by_service: BTreeMap<u32, Vec<&Event>> = BTreeMap::new();
        for event in &self.events {
            by_service.entry(self.universe.service_of(event.instance)).or_default().push(event);
        }
        by_service
    }

    pub(super) fn describe(&self, pick: &Pick) -> String {
        self.describe_pick(pick)
    }
}

/// One instance's life as the clients saw it.
struct Timeline {
    /// Possibly-live intervals (inclusive), merged and sorted.
    live: Vec<(Nanos, Nanos)>,
    /// Acks of accepted changes that took the instance out of the eligible set.
    removals: Vec<Nanos>,
}

impl Timeline {
    fn build(events: &[&Event]) -> Self {
        let mut intervals = Vec::new();
        let mut removals = Vec::new();
        let (mut present, mut up) = (false, false);
        let mut live_since = None;
        for event in events {
            if !event.accepted {
                intervals.push((event.send, event.ack));
                continue;
            }
            match event.change {
                Change::Announce { up: now_up, .. } => (present, up) = (true, now_up),
                Change::Update { up: Some(now_up) } if present => up = now_up,
                Change::Update { .. } => {}
                Change::Withdraw | Change::Close => present = false,
            }
            match (live_since, present && up) {
                (None, true) => live_since = Some(event.send),
                (Some(since), false) => {
                    intervals.push((since, event.ack));
                    removals.push(event.ack);
                    live_since = None;
                }
                _ => {}
            }
        }
        if let Some(since) = live_since {
            intervals.push((since, Nanos::MAX));
        }
        removals.sort_unstable();
        Self { live: merge(intervals), removals }
    }
}

/// Sorts inclusive intervals and merges the overlapping ones.
pub(super) fn merge(mut intervals: Vec<(Nanos, Nanos)>) -> Vec<(Nanos, Nanos)> {
    intervals.sort_unstable();
    let mut merged: Vec<(Nanos, Nanos)> = Vec::with_capacity(intervals.len());
    for (from, to) in intervals {
        match merged.last_mut() {
            Some(last) if from <= last.1 => last.1 = last.1.max(to),
            _ => merged.push((from, to)),
        }
    }
    merged
}

#[cfg(test)]
mod tests;
