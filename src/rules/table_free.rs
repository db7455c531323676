//! Selection without tables, for the moments a large subset has none yet.
//!
//! The tables a rule reads (weight schedule, Maglev table, load index) are built off the pick
//! path; until the first one of a large subset is built, a pick of that rule answers from the
//! members alone, at a cost bounded whatever the subset's size, and says so in its fallback
//! note:
//!
//! - without a Maglev table, the key's hash picks a position among the accepted members: a key
//!   keeps its instance as long as the membership holds (it may move once the table is in);
//! - without a weight schedule, one of [`PROBE`] accepted members from the ticket's turn on,
//!   drawn with probability proportional to its weight (weights hold in expectation; the exact
//!   interleaving comes with the schedule);
//! - without a load index, the ticket's turn among the accepted members (round robin).
//!
//! Each costs O(excluded + [`PROBE`]) and allocates nothing.

use super::{Choice, Draw, Needs, hash_key};

/// Members a weighted draw without a schedule looks at.
pub const PROBE: usize = 16;

/// The fallback note of a pick answered without a table.
pub const NOTE: &str = "the rule's tables for these instances are still being built; picked without them";

/// A choice among `draw`'s accepted candidates for a rule that reads the tables in `needs`, of
/// which `draw`'s candidates lack at least one; `None` when they lack none (the rule's own
/// answer stands) or no candidate may be returned.
pub fn select(needs: Needs, draw: &Draw<'_>, rng: &mut fastrand::Rng) -> Option<Choice> {
    let absent = needs.absent_from(&draw.candidates.tables);
    let index = if absent.maglev {
        draw.rotate(hash_key(draw.key))?
    } else if absent.schedule {
        weighted_probe(draw, rng)?
    } else if absent.load {
        draw.rotate(draw.ticket)?
    } else {
        return None;
    };
    Some(Choice { index, fallback: Some(NOTE) })
}

/// One of the [`PROBE`] accepted candidates from the ticket's turn on, weighted; `None` when
/// they all weigh 0.
fn weighted_probe(draw: &Draw<'_>, rng: &mut fastrand::Rng) -> Option<usize> {
    let accepted = draw.accepted() as u64;
    let probed = (PROBE as u64).min(accepted);
    let turn = |step: u64| draw.rotate(draw.ticket.wrapping_add(step));
    let weight = |index: usize| u64::from(draw.members()[index].weight);
    let total: u64 = (0..probed).filter_map(turn).map(weight).sum();
    if total == 0 {
        return None;
    }
    let mut point = rng.u64(..total);
    (0..probed).filter_map(turn).find(|&index| {
        let w = weight(index);
        if point < w {
            return true;
        }
        point -= w;
        false
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Subset;
    use crate::rules::testing::{instance, instances};
    use crate::rules::{Candidates, Excluded};

    fn bare(members: Vec<std::sync::Arc<crate::registry::Instance>>) -> Candidates {
        Candidates::new(Subset::new("test", members))
    }

    #[test]
    fn without_a_load_index_turns_go_round_the_accepted_members() {
        let candidates = bare(instances(4));
        let mut rng = fastrand::Rng::with_seed(1);
        let needs = Needs { load: true, ..Needs::default() };
        let excluded = [1];
        let picks: Vec<usize> = (0..6)
            .map(|ticket| {
                let draw = Draw { excluded: Excluded::new(&excluded), ..Draw::new(&candidates, ticket) };
                select(needs, &draw, &mut rng).expect("a choice").index
            })
            .collect();
        assert_eq!(picks, [0, 2, 3, 0, 2, 3]);
    }

    #[test]
    fn without_a_maglev_table_a_key_keeps_its_instance_and_skips_the_excluded() {
        let candidates = bare(instances(50));
        let mut rng = fastrand::Rng::with_seed(1);
        let needs = Needs { maglev: true, ..Needs::default() };
        let draw = |ticket, excluded: &'static [usize]| Draw {
            key: "user-7",
            excluded: Excluded::new(excluded),
            ..Draw::new(&candidates, ticket)
        };
        let first = select(needs, &draw(0, &[]), &mut rng).unwrap();
        assert_eq!(first.fallback, Some(NOTE));
        assert!((1..20).all(|t| select(needs, &draw(t, &[]), &mut rng) == Some(first)));
        let excluded: &'static [usize] = Box::leak(Box::new([first.index]));
        assert_ne!(select(needs, &draw(0, excluded), &mut rng).unwrap().index, first.index);
    }

    #[test]
    fn without_a_schedule_weights_hold_among_the_probed_and_zero_is_never_picked() {
        let members = vec![instance("a", "", 0), instance("b", "", 1), instance("c", "", 3)];
        let candidates = bare(members);
        let mut rng = fastrand::Rng::with_seed(7);
        let needs = Needs { schedule: true, ..Needs::default() };
        let mut counts = [0usize; 3];
        for ticket in 0..4000 {
            counts[select(needs, &Draw::new(&candidates, ticket), &mut rng).unwrap().index] += 1;
        }
        assert_eq!(counts[0], 0);
        assert!((2700..3300).contains(&counts[2]), "{counts:?}");
    }

    #[test]
    fn with_every_table_there_it_leaves_the_choice_to_the_rule() {
        let candidates = crate::rules::testing::hashed(instances(3));
        let needs = Needs { schedule: true, maglev: true, load: true };
        assert_eq!(select(needs, &Draw::new(&candidates, 0), &mut fastrand::Rng::with_seed(1)), None);
    }
}
