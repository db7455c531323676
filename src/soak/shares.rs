//! The exact-shares check of a churn history (the definitions are in [`super::history`]).
//!
//! Per service, the send→ack spans of all its registration changes are merged into busy
//! spans; the gaps between them are the quiet windows. A pick whose start..end lies inside a
//! gap saw exactly the instance table left by every change acknowledged before the gap, so the
//! checker replays those changes to know which instances were eligible, and then checks that
//! the rotation mapped tickets to them exactly.

use std::collections::{BTreeMap, HashMap};

use super::history::{Change, Event, Findings, History, Nanos, Pick, PickRule, merge, secs};

/// An instance as the replay leaves it.
#[derive(Debug, Clone, Copy, Default)]
struct Replayed {
    present: bool,
    up: bool,
    version: u32,
}

pub(super) fn check(history: &History, findings: &mut Findings) {
    let events = history.events_by_service();
    let mut picks_by_service: BTreeMap<u32, Vec<&Pick>> = BTreeMap::new();
    for pick in &history.picks {
        picks_by_service.entry(pick.service).or_default().push(pick);
    }
    for (service, picks) in picks_by_service {
        let mut service_events = events.get(&service).cloned().unwrap_or_default();
        check_service(history, &picks, &mut service_events, findings);
    }
}

fn check_service(history: &History, picks: &[&Pick], events: &mut [&Event], findings: &mut Findings) {
    let busy = merge(events.iter().map(|e| (e.send, e.ack)).collect());
    // Quiet picks by the gap they fell in: gap g lies after busy span g - 1 and before span g.
    let mut gaps: BTreeMap<usize, Vec<&Pick>> = BTreeMap::new();
    for &pick in picks {
        let after = busy.partition_point(|&(from, _)| from <= pick.end);
        if after == 0 || busy[after - 1].1 < pick.start {
            gaps.entry(after).or_default().push(pick);
        }
    }
    // Per instance, acks come in send order (one change in flight at a time), so replaying in
    // ack order applies each instance's changes in the order rota did.
    events.sort_by_key(|e| (e.ack, e.send));
    let mut replayed: HashMap<u32, Replayed> = HashMap::new();
    let mut next = 0;
    for (gap, quiet) in gaps {
        let from = if gap == 0 { 0 } else { busy[gap - 1].1 };
        let until = busy.get(gap).map_or(Nanos::MAX, |span| span.0);
        while next < events.len() && events[next].ack <= from {
            apply(&mut replayed, events[next]);
            next += 1;
        }
        let mut eligible: HashMap<u32, Vec<u32>> = HashMap::new();
        for (&instance, state) in &replayed {
            if state.present && state.up {
                eligible.entry(state.version).or_default().push(instance);
            }
        }
        let mut rotations: BTreeMap<(PickRule, u32), Vec<&Pick>> = BTreeMap::new();
        for pick in &quiet {
            rotations.entry((pick.rule, pick.version)).or_default().push(pick);
        }
        let window = Window { history, from, until };
        for ((rule, version), rotation) in rotations {
            let members = eligible.get(&version).map_or(&[][..], Vec::as_slice);
            window.check_rotation(rule, members, &rotation, findings);
        }
        findings.quiet_windows += 1;
        findings.quiet_picks += quiet.len();
    }
}

fn apply(replayed: &mut HashMap<u32, Replayed>, event: &Event) {
    if !event.accepted {
        return;
    }
    let state = replayed.entry(event.instance).or_default();
    match event.change {
        Change::Announce { version, up } => *state = Replayed { present: true, up, version },
        Change::Update { up: Some(up) } => state.up = up,
        Change::Update { up: None } => {}
        Change::Withdraw | Change::Close => state.present = false,
    }
}

/// One quiet window of one service.
struct Window<'h> {
    history: &'h History,
    from: Nanos,
    until: Nanos,
}

impl Window<'_> {
    fn span(&self) -> String {
        let until = if self.until == Nanos::MAX { "the end".into() } else { secs(self.until) };
        format!("quiet window {}..{}", secs(self.from), until)
    }

    /// The picks of one rotation in this window: every position of the eligible list goes to
    /// one instance, and every eligible instance holds one position.
    fn check_rotation(&self, rule: PickRule, members: &[u32], picks: &[&Pick], findings: &mut Findings) {
        let n = members.len() as u64;
        let mut by_position: HashMap<u64, &Pick> = HashMap::new();
        let mut position_of: HashMap<u32, (u64, &Pick)> = HashMap::new();
        for &pick in picks {
            if !members.contains(&pick.instance) {
                findings.shares.add(|| {
                    format!(
                        "{} in the {}: not among the {n} eligible instances",
                        self.history.describe(pick),
                        self.span()
                    )
                });
                continue;
            }
            let position = rule.position(pick.ticket, n);
            if let Some(first) = by_position.get(&position)
                && first.instance != pick.instance
            {
                findings.shares.add(|| {
                    format!(
                        "{} in the {}: position {position} of {n} went to another instance before: {}",
                        self.history.describe(pick),
                        self.span(),
                        self.history.describe(first)
                    )
                });
                continue;
            }
            by_position.entry(position).or_insert(pick);
            match position_of.get(&pick.instance) {
                Some(&(other, first)) if other != position => findings.shares.add(|| {
                    format!(
                        "{} in the {}: the instance holds positions {other} and {position} of {n} (first: {})",
                        self.history.describe(pick),
                        self.span(),
                        self.history.describe(first)
                    )
                }),
                Some(_) => {}
                None => {
                    position_of.insert(pick.instance, (position, pick));
                }
            }
        }
    }
}
