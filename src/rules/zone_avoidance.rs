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
//! Where several zones remain, step 5 walks them zone after zone in name order; where all
//! remain, in position order.
//!
//! Cost: the per-zone totals are kept by the subset's [`LoadIndex`](super::LoadIndex) as picks
//! and reports change them, so a pick compares zones (O(z)) and takes the ticket's turn over the
//! untripped instances of the kept zones in O(z + log n), never reading every instance.
//!
//! With a single zone only step 3 applies. If nothing survives, it falls back to round robin
//! over all candidates and says so.

use super::availability::ALL_UNAVAILABLE;
use super::{Choice, Draw, Needs, Params, Query, RuleDef, RuleError, Select, Standard, ZoneLoad, Zones};

/// Share of tripped instances at which a zone is dropped.
pub const TRIPPED_SHARE: f64 = 0.99999;
/// Load per available instance at which the worst zone is dropped.
pub const TRIGGERING_LOAD: f64 = 0.2;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ZoneAvoidance;

/// In flight per available instance; negative when every instance is tripped.
fn load_per_instance(zone: &ZoneLoad<'_>) -> f64 {
    let available = zone.instances - zone.tripped;
    if available == 0 { -1.0 } else { zone.in_flight as f64 / available as f64 }
}

impl Select for ZoneAvoidance {
    fn select(&self, draw: &Draw<'_>, _rng: &mut fastrand::Rng) -> Option<Choice> {
        if draw.members().is_empty() {
            return None;
        }
        match draw.loads(|loads| choose(draw, loads))? {
            Some(index) => Some(Choice::at(index)),
            None => draw.rotate(draw.ticket).map(|index| Choice { index, fallback: Some(ALL_UNAVAILABLE) }),
        }
    }
}

impl RuleDef for ZoneAvoidance {
    const NAME: &'static str = "zone_avoidance";

    fn standard(&self) -> Standard {
        Standard::RoundRobin
    }

    fn parse(_: &mut Params<'_>) -> Result<Self, RuleError> {
        Ok(ZoneAvoidance)
    }

    fn needs(&self) -> Needs {
        Needs { load: true, ..Needs::default() }
    }
}

fn choose(draw: &Draw<'_>, loads: &Query<'_>) -> Option<usize> {
    if !loads.has_zones() {
        return loads.nth_available(draw.ticket);
    }
    let mut zones = loads.zones();
    zones.retain(|zone| zone.instances > 0);
    let present = zones.len();
    let allowed = available_zones(&mut zones);
    let preferred = !draw.zone.is_empty() && allowed.contains(&draw.zone) && loads.available_in(draw.zone) > 0;
    if preferred {
        loads.nth_available_in(&[draw.zone], draw.ticket)
    } else if allowed.len() == present {
        loads.nth_available(draw.ticket)
    } else {
        loads.nth_available_in(&allowed, draw.ticket)
    }
}

/// Ribbon's zone filter over the snapshot; returns the zones to keep.
fn available_zones<'a>(zones: &mut Zones<'a>) -> smallvec::SmallVec<[&'a str; 8]> {
    if zones.len() <= 1 {
        return zones.iter().map(|z| z.zone).collect();
    }
    zones.sort_by(|a, b| a.zone.cmp(b.zone));
    let mut dropped_any = false;
    zones.retain(|z| {
        let keep = (z.tripped as f64 / z.instances as f64) < TRIPPED_SHARE && load_per_instance(z) >= 0.0;
        dropped_any |= !keep;
        keep
    });
    let worst = zones
        .iter()
        .enumerate()
        .max_by(|(ia, a), (ib, b)| load_per_instance(a).total_cmp(&load_per_instance(b)).then_with(|| ib.cmp(ia)))
        .map(|(index, zone)| (index, load_per_instance(zone)));
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
    use crate::rules::Load;
    use crate::rules::testing::{instance, subset, with_loads};

    fn fleet() -> Vec<std::sync::Arc<crate::registry::Instance>> {
        vec![
            instance("a1", "east", 100),
            instance("a2", "east", 100),
            instance("b1", "west", 100),
            instance("b2", "west", 100),
            instance("c1", "north", 100),
        ]
    }

    fn ids(loads: &[(&str, Load)], zone: &str, picks: u64) -> Vec<String> {
        let candidates = with_loads(subset(fleet()), loads);
        let mut rng = fastrand::Rng::with_seed(1);
        (0..picks)
            .map(|ticket| {
                let draw = Draw { zone, ..Draw::new(&candidates, ticket) };
                candidates.members()[ZoneAvoidance.select(&draw, &mut rng).unwrap().index].id.to_string()
            })
            .collect()
    }

    fn load(in_flight: u64, tripped: bool) -> Load {
        Load { in_flight, tripped, ..Default::default() }
    }

    #[test]
    fn quiet_zones_are_all_used() {
        assert_eq!(ids(&[], "", 5), ["a1", "a2", "b1", "b2", "c1"]);
    }

    #[test]
    fn a_fully_tripped_zone_and_then_the_worst_zone_are_dropped() {
        let stats = [("c1", load(0, true)), ("b1", load(1, false))];
        // north is all tripped → dropped; then the worst remaining zone (west, 0.5/instance) too.
        assert_eq!(ids(&stats, "", 4), ["a1", "a2", "a1", "a2"]);
    }

    #[test]
    fn the_worst_zone_is_dropped_once_its_load_reaches_the_trigger() {
        let light = [("b1", load(0, false)), ("c1", load(0, false))];
        assert_eq!(ids(&light, "", 5).len(), 5);
        let heavy = [("c1", load(1, false))];
        assert_eq!(ids(&heavy, "", 4), ["a1", "a2", "b1", "b2"]);
    }

    #[test]
    fn the_request_zone_is_preferred_while_it_has_instances() {
        assert_eq!(ids(&[], "west", 3), ["b1", "b2", "b1"]);
        // West fully tripped: it is dropped, and (as in Ribbon) a dropped zone also drops the
        // worst remaining one, east first by name among the equally idle.
        let west_down = [("b1", load(0, true)), ("b2", load(0, true))];
        assert_eq!(ids(&west_down, "west", 3), ["c1", "c1", "c1"]);
    }
}
