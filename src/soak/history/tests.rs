//! Synthetic histories: a clean one passes, and each check catches the violation it is for.

use super::*;

const RR: PickRule = PickRule::RoundRobin;
const REPEAT3: PickRule = PickRule::Repeat(3);

/// A history of one service, `svc`, with times in plain numbers.
struct Script(History);

impl Script {
    fn new() -> Self {
        let mut history = History::default();
        history.universe.version("");
        history.universe.version("v2");
        Self(history)
    }

    fn change(&mut self, id: &str, change: Change, send: Nanos, ack: Nanos, accepted: bool) -> &mut Self {
        let instance = self.0.universe.instance("svc", id);
        self.0.events.push(Event { send, ack, instance, change, accepted });
        self
    }

    fn announce(&mut self, id: &str, send: Nanos, ack: Nanos) -> &mut Self {
        self.change(id, Change::Announce { version: 0, up: true }, send, ack, true)
    }

    fn pick(&mut self, id: &str, rule: PickRule, ticket: u64, start: Nanos, end: Nanos) -> &mut Self {
        let service = self.0.universe.service("svc");
        let instance = self.0.universe.find_instance("svc", id).unwrap_or(UNKNOWN);
        let (asked_rule, asked_version, fallback) = (rule, 0, false);
        self.0.picks.push(Pick {
            start,
            end,
            service,
            instance,
            version: 0,
            rule,
            ticket,
            asked_rule,
            asked_version,
            fallback,
        });
        self
    }

    /// Three instances a, b, c announced at 0..=3, then `picks` round-robin picks from 100 on.
    fn three_in_rotation(picks: u64) -> Self {
        let mut script = Self::new();
        script.announce("a", 0, 1).announce("b", 1, 2).announce("c", 2, 3);
        for ticket in 0..picks {
            let id = ["a", "b", "c"][(ticket % 3) as usize];
            script.pick(id, RR, ticket, 100 + ticket * 10, 105 + ticket * 10);
        }
        script
    }

    fn check(&self) -> Findings {
        crate::soak::judge::check(&self.0)
    }
}

fn clean(findings: &Findings) -> bool {
    [&findings.live, &findings.stale, &findings.tickets, &findings.shares, &findings.answers]
        .iter()
        .all(|t| t.count == 0)
}

#[test]
fn a_clean_history_passes_every_check() {
    let mut script = Script::three_in_rotation(9);
    for ticket in 0..9 {
        let id = ["a", "b", "c"][(ticket / 3 % 3) as usize];
        script.pick(id, REPEAT3, ticket, 300 + ticket, 301 + ticket);
    }
    let findings = script.check();
    assert!(clean(&findings), "{findings:?}");
    assert_eq!(findings.picks, 18);
    assert_eq!(findings.quiet_picks, 18);
    assert_eq!(findings.quiet_windows, 1);
}

/// A server that answered another rule, another version, or fell back where it needed not,
/// fails the history, whatever else it got right.
#[test]
fn a_pick_answered_otherwise_than_asked_is_reported() {
    type Spoil = fn(&mut Pick);
    let cases: [(&str, Spoil); 3] = [
        ("asked repeat(n=3) of version \"\"", |pick| pick.asked_rule = REPEAT3),
        ("asked round_robin of version \"v2\"", |pick| pick.asked_version = 1),
        ("answered with a fallback", |pick| pick.fallback = true),
    ];
    for (expected, spoil) in cases {
        let mut script = Script::three_in_rotation(3);
        spoil(&mut script.0.picks[1]);
        let findings = script.check();
        assert_eq!(findings.answers.count, 1, "{expected}: {findings:?}");
        assert!(findings.answers.examples[0].contains(expected), "{:?}", findings.answers.examples);
    }
    assert_eq!(Script::three_in_rotation(3).check().answers.count, 0);
}

#[test]
fn a_pick_of_an_instance_never_registered_is_not_live() {
    let mut script = Script::three_in_rotation(3);
    script.pick("ghost", RR, 3, 500, 501);
    let findings = script.check();
    assert_eq!(findings.live.count, 1, "{findings:?}");
    assert!(findings.live.examples[0].contains("never registered"));
    assert_eq!(findings.stale.count, 0);
}

#[test]
fn a_pick_before_the_announce_was_sent_is_not_live() {
    let mut script = Script::new();
    script.announce("a", 50, 60).pick("a", RR, 0, 10, 20);
    let findings = script.check();
    assert_eq!((findings.live.count, findings.stale.count), (1, 0), "{findings:?}");
}

#[test]
fn a_pick_after_an_acknowledged_withdrawal_is_stale() {
    let mut script = Script::three_in_rotation(3);
    script.change("b", Change::Withdraw, 200, 210, true);
    script.pick("b", RR, 3, 220, 230);
    let findings = script.check();
    assert_eq!((findings.live.count, findings.stale.count), (1, 1), "{findings:?}");
    assert!(findings.stale.examples[0].contains("svc/b"), "{:?}", findings.stale.examples);
}

#[test]
fn a_pick_overlapping_the_withdrawal_is_not_a_violation() {
    let mut script = Script::three_in_rotation(3);
    script.change("b", Change::Withdraw, 200, 210, true);
    // Sent before the ack: rota may have read the old table.
    script.pick("b", RR, 3, 205, 230);
    assert!(clean(&script.check()));
}

#[test]
fn draining_and_closing_end_the_instance_like_a_withdrawal() {
    let mut script = Script::three_in_rotation(3);
    script.change("a", Change::Update { up: Some(false) }, 200, 210, true);
    script.change("c", Change::Close, 200, 260, true);
    script.pick("a", RR, 3, 215, 220).pick("c", RR, 4, 270, 280);
    // c sent before its close was seen to apply: possibly live, not a violation.
    script.pick("c", RR, 5, 250, 255);
    let findings = script.check();
    assert_eq!((findings.live.count, findings.stale.count), (2, 2), "{findings:?}");
}

#[test]
fn an_instance_back_up_may_be_picked_from_the_send_of_its_update() {
    let mut script = Script::three_in_rotation(3);
    script.change("a", Change::Update { up: Some(false) }, 200, 210, true);
    script.change("a", Change::Update { up: Some(true) }, 300, 310, true);
    script.pick("a", RR, 3, 299, 301);
    let findings = script.check();
    assert_eq!((findings.live.count, findings.stale.count), (0, 0), "{findings:?}");
}

#[test]
fn a_refused_announce_is_live_only_until_its_ack() {
    let mut script = Script::new();
    script.change("a", Change::Announce { version: 0, up: true }, 10, 20, false);
    script.pick("a", RR, 0, 15, 16).pick("a", RR, 1, 30, 31);
    let findings = script.check();
    assert_eq!((findings.live.count, findings.stale.count), (1, 0), "{findings:?}");
}

#[test]
fn a_ticket_handed_out_twice_is_reported() {
    let mut script = Script::three_in_rotation(6);
    script.pick("a", RR, 3, 400, 401);
    let findings = script.check();
    assert_eq!(findings.tickets.count, 1, "{findings:?}");
    assert!(findings.tickets.examples[0].contains("ticket 3"));
}

#[test]
fn tickets_of_different_rotations_may_repeat() {
    let mut script = Script::three_in_rotation(3);
    script.pick("a", REPEAT3, 0, 400, 401);
    let service = script.0.universe.service("svc");
    script.change("v", Change::Announce { version: 1, up: true }, 3, 4, true);
    let v = script.0.universe.find_instance("svc", "v").unwrap();
    let (asked_rule, asked_version, fallback) = (RR, 1, false);
    script.0.picks.push(Pick {
        start: 500,
        end: 501,
        service,
        instance: v,
        version: 1,
        rule: RR,
        ticket: 0,
        asked_rule,
        asked_version,
        fallback,
    });
    let findings = script.check();
    assert!(clean(&findings), "{findings:?}");
}

#[test]
fn a_broken_round_robin_cycle_in_a_quiet_window_is_reported() {
    let mut script = Script::three_in_rotation(3);
    // Ticket 4 is position 1 of 3, which b holds.
    script.pick("c", RR, 4, 500, 501);
    let findings = script.check();
    assert_eq!(findings.shares.count, 1, "{findings:?}");
    assert!(findings.shares.examples[0].contains("position 1 of 3"), "{:?}", findings.shares.examples);
    assert_eq!(findings.live.count, 0);
}

#[test]
fn one_instance_in_two_positions_is_reported() {
    let mut script = Script::new();
    script.announce("a", 0, 1).announce("b", 1, 2).announce("c", 2, 3);
    script.pick("a", RR, 0, 100, 101).pick("a", RR, 1, 110, 111);
    let findings = script.check();
    assert_eq!(findings.shares.count, 1, "{findings:?}");
    assert!(findings.shares.examples[0].contains("positions 0 and 1"));
}

#[test]
fn a_repeat_run_cut_short_is_reported() {
    let mut script = Script::new();
    script.announce("a", 0, 1).announce("b", 1, 2);
    for (ticket, id) in ["a", "a", "b", "b", "b", "b"].iter().enumerate() {
        script.pick(id, REPEAT3, ticket as u64, 100 + ticket as u64, 101 + ticket as u64);
    }
    let findings = script.check();
    assert_eq!(findings.shares.count, 1, "{findings:?}");
}

#[test]
fn a_pick_of_a_drained_instance_in_a_quiet_window_breaks_the_shares() {
    let mut script = Script::three_in_rotation(3);
    script.change("c", Change::Update { up: Some(false) }, 200, 210, true);
    script.pick("a", RR, 4, 300, 301).pick("b", RR, 5, 310, 311).pick("c", RR, 6, 320, 321);
    let findings = script.check();
    // Two eligible, so ticket 4 → position 0 and ticket 6 → position 0 too: a and c clash, and
    // c is not eligible at all.
    assert!(findings.shares.count >= 1, "{findings:?}");
    assert!(findings.shares.examples.iter().any(|e| e.contains("not among the 2 eligible")));
    assert_eq!(findings.stale.count, 1);
}

#[test]
fn picks_during_a_change_are_not_held_to_exact_shares() {
    let mut script = Script::three_in_rotation(3);
    script.announce("d", 200, 240);
    // The rotation is mid-change (3 or 4 eligible): anything goes for the shares check.
    script.pick("a", RR, 3, 210, 220).pick("a", RR, 4, 230, 235).pick("d", RR, 5, 230, 238);
    let findings = script.check();
    assert!(clean(&findings), "{findings:?}");
    assert_eq!(findings.quiet_picks, 3);
}

#[test]
fn rule_names_round_trip() {
    for rule in [RR, REPEAT3, PickRule::Repeat(7)] {
        assert_eq!(PickRule::parse(&rule.canonical()), Some(rule));
    }
    assert_eq!(PickRule::parse("random"), None);
}
