//! `zone_avoidance`: Ribbon's `ZoneAvoidanceRule`, then zone preference, then round robin.
//!
//! From a per-zone snapshot of the candidates (instances, tripped breakers, picks in flight):
//!
//! 1. a zone whose instances are (nearly) all tripped — at least 99.999 % — is dropped;
//! 2. if a zone was dropped, or the worst zone's load per available instance
//!    (`in flight / (instances − tripped)`) reaches 0.2, the worst zone is dropped too (the
//!    first by name among equally bad ones, where Ribbon chose at random);
//! 3. tripped instances are skipped (Ribbon's composite with `AvailabilityPredicate`);
//! 4. if the request names a zone that still has instances, only that zone is used (Spring's
//!    zone preference); otherwise all remaining zones;
//! 5. round robin from the shared ticket over what is left.
//!
//! With a single zone only step 3 applies. If nothing survives, it falls back to round robin
//! over all candidates and says so.

use super::availability::ALL_UNAVAILABLE;
use super::{Choice, Draw, Select, nth_kept};
use crate::registry::Instance;

/// Share of tripped instances at which a zone is dropped.
pub const TRIPPED_SHARE: f64 = 0.99999;
/// Load per available instance at which the worst zone is dropped.
pub const TRIGGERING_LOAD: f64 = 0.2;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ZoneAvoidance;

#[derive(Debug)]
struct ZoneStats<'a> {
    zone: &'a str,
    instances: u64,
    tripped: u64,
    in_flight: u64,
}

impl ZoneStats<'_> {
    /// In flight per available instance; negative when every instance is tripped.
    fn load_per_instance(&self) -> f64 {
        let available = self.instances - self.tripped;
        if available == 0 { -1.0 } else { self.in_flight as f64 / available as f64 }
    }
}

impl Select for ZoneAvoidance {
    fn select(&self, draw: &Draw<'_>, _rng: &mut fastrand::Rng) -> Option<Choice> {
        let members = draw.members();
        if members.is_empty() {
            return None;
        }
        let mut zones: Vec<ZoneStats<'_>> = Vec::new();
        for instance in members.iter().enumerate().filter(|(index, _)| draw.accepts(*index)).map(|(_, i)| i) {
            let load = draw.stats.load(instance);
            let zone = match zones.iter_mut().find(|z| z.zone == &*instance.zone) {
                Some(zone) => zone,
                None => {
                    zones.push(ZoneStats { zone: &instance.zone, instances: 0, tripped: 0, in_flight: 0 });
                    zones.last_mut().expect("just pushed")
                }
            };
            zone.instances += 1;
            zone.tripped += u64::from(load.tripped);
            zone.in_flight += load.in_flight;
        }
        let allowed = available_zones(&mut zones);
        let tripped = |i: &Instance| draw.stats.load(i).tripped;
        let in_allowed = |i: &Instance| allowed.contains(&&*i.zone) && !tripped(i);
        let preferred = !draw.zone.is_empty()
            && members
                .iter()
                .enumerate()
                .any(|(index, i)| draw.accepts(index) && *i.zone == *draw.zone && in_allowed(i));
        let kept = |index: usize, i: &std::sync::Arc<Instance>| {
            draw.accepts(index) && in_allowed(i) && (!preferred || *i.zone == *draw.zone)
        };
        if let Some(index) = nth_kept(members, draw.ticket, kept) {
            return Some(Choice::at(index));
        }
        draw.rotate(draw.ticket).map(|index| Choice { index, fallback: Some(ALL_UNAVAILABLE) })
    }
}

/// Ribbon's zone filter over the snapshot; returns the zones to keep.
fn available_zones<'a>(zones: &mut Vec<ZoneStats<'a>>) -> Vec<&'a str> {
    if zones.len() <= 1 {
        return zones.iter().map(|z| z.zone).collect();
    }
    zones.sort_by(|a, b| a.zone.cmp(b.zone));
    let mut dropped_any = false;
    zones.retain(|z| {
        let keep = (z.tripped as f64 / z.instances as f64) < TRIPPED_SHARE && z.load_per_instance() >= 0.0;
        dropped_any |= !keep;
        keep
    });
    let worst = zones
        .iter()
        .enumerate()
        .max_by(|(ia, a), (ib, b)| a.load_per_instance().total_cmp(&b.load_per_instance()).then_with(|| ib.cmp(ia)))
        .map(|(index, zone)| (index, zone.load_per_instance()));
    if let Some((index, load)) = worst
        && (dropped_any || load >= TRIGGERING_LOAD)
        && zones.len() > 1
    {
        zones.remove(index);
    }
    zones.iter().map(|z| z.zone).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::testing::{FakeStats, instance, subset};
    use crate::state::Load;

    fn fleet() -> crate::registry::Subset {
        subset(vec![
            instance("a1", "east", 100),
            instance("a2", "east", 100),
            instance("b1", "west", 100),
            instance("b2", "west", 100),
            instance("c1", "north", 100),
        ])
    }

    fn ids(stats: &FakeStats, zone: &str, picks: u64) -> Vec<String> {
        let candidates = fleet();
        let mut rng = fastrand::Rng::with_seed(1);
        (0..picks)
            .map(|ticket| {
                let draw = Draw { stats, zone, ..Draw::new(&candidates, ticket) };
                candidates.members[ZoneAvoidance.select(&draw, &mut rng).unwrap().index].id.to_string()
            })
            .collect()
    }

    fn load(in_flight: u64, tripped: bool) -> Load {
        Load { in_flight, tripped, ..Default::default() }
    }

    #[test]
    fn quiet_zones_are_all_used() {
        assert_eq!(ids(&FakeStats::default(), "", 5), ["a1", "a2", "b1", "b2", "c1"]);
    }

    #[test]
    fn a_fully_tripped_zone_and_then_the_worst_zone_are_dropped() {
        let stats = FakeStats::default().with("c1", load(0, true)).with("b1", load(1, false));
        // north is all tripped → dropped; then the worst remaining zone (west, 0.5/instance) too.
        assert_eq!(ids(&stats, "", 4), ["a1", "a2", "a1", "a2"]);
    }

    #[test]
    fn the_worst_zone_is_dropped_once_its_load_reaches_the_trigger() {
        let light = FakeStats::default().with("b1", load(0, false)).with("c1", load(0, false));
        assert_eq!(ids(&light, "", 5).len(), 5);
        let heavy = FakeStats::default().with("c1", load(1, false));
        assert_eq!(ids(&heavy, "", 4), ["a1", "a2", "b1", "b2"]);
    }

    #[test]
    fn the_request_zone_is_preferred_while_it_has_instances() {
        assert_eq!(ids(&FakeStats::default(), "west", 3), ["b1", "b2", "b1"]);
        // West fully tripped: it is dropped, and (as in Ribbon) a dropped zone also drops the
        // worst remaining one, east first by name among the equally idle.
        let west_down = FakeStats::default().with("b1", load(0, true)).with("b2", load(0, true));
        assert_eq!(ids(&west_down, "west", 3), ["c1", "c1", "c1"]);
    }
}
