//! The candidates a rule selects from, with the tables derived from them.
//!
//! [`Candidates`] pairs one subset of a published snapshot (plain registry data) with the
//! [`Tables`] rules read: a weight schedule, a Maglev table and a [`LoadIndex`]. Each table is
//! built once per subset, by the balancer when the subset is published (or, the first time a
//! rule asks for it on a subset, before that pick selects), never by a selector. A table may
//! have been built for an earlier snapshot's members while the current one's is still being
//! built; [`Built::position`] (and, for the load index, [`LoadTable`]) then maps its positions
//! onto the current members by id, so picks go on with the new membership until the new table
//! is swapped in.

use std::sync::Arc;

use arc_swap::ArcSwapOption;

use super::{LoadTable, Maglev, WeightSchedule};
use crate::registry::{Instance, Subset};

/// A table and the members (in position order) it was built for.
#[derive(Debug)]
pub struct Built<T> {
    pub table: T,
    pub members: Arc<[Arc<Instance>]>,
}

impl<T> Built<T> {
    pub fn new(table: T, subset: &Subset) -> Self {
        Self { table, members: subset.members.clone() }
    }

    /// Where the instance at `position` of the table's members sits among `current`'s members:
    /// the same position when the table was built for them, else found by id (`None` when the
    /// instance has left).
    pub fn position(&self, position: usize, current: &Subset) -> Option<usize> {
        if Arc::ptr_eq(&self.members, &current.members) {
            return Some(position);
        }
        let id = &self.members.get(position)?.id;
        current.members.binary_search_by(|i| i.id.cmp(id)).ok()
    }

    /// Whether the table was built for `current`'s members.
    pub fn is_for(&self, current: &Subset) -> bool {
        Arc::ptr_eq(&self.members, &current.members)
    }
}

/// Tables derived from one subset's members.
#[derive(Debug, Default)]
pub struct Tables {
    pub schedule: ArcSwapOption<Built<WeightSchedule>>,
    pub maglev: ArcSwapOption<Built<Maglev>>,
    pub load: ArcSwapOption<LoadTable>,
}

/// Which tables a rule reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Needs {
    pub schedule: bool,
    pub maglev: bool,
    pub load: bool,
}

impl Needs {
    pub fn any(self) -> bool {
        self.schedule || self.maglev || self.load
    }

    /// One bit per table, to keep in an atomic.
    pub fn bits(self) -> u8 {
        u8::from(self.schedule) | u8::from(self.maglev) << 1 | u8::from(self.load) << 2
    }

    pub fn from_bits(bits: u8) -> Needs {
        Needs { schedule: bits & 1 != 0, maglev: bits & 2 != 0, load: bits & 4 != 0 }
    }

    /// Which of these tables `tables` lacks.
    pub fn absent_from(self, tables: &Tables) -> Needs {
        Needs {
            schedule: self.schedule && tables.schedule.load().is_none(),
            maglev: self.maglev && tables.maglev.load().is_none(),
            load: self.load && tables.load.load().is_none(),
        }
    }

    pub fn union(self, other: Needs) -> Needs {
        Needs {
            schedule: self.schedule || other.schedule,
            maglev: self.maglev || other.maglev,
            load: self.load || other.load,
        }
    }
}

/// One subset with its tables: what a selector picks from.
#[derive(Debug)]
pub struct Candidates {
    pub subset: Subset,
    pub tables: Tables,
}

impl Candidates {
    /// Candidates with no table built yet.
    pub fn new(subset: Subset) -> Self {
        Self { subset, tables: Tables::default() }
    }

    pub fn members(&self) -> &[Arc<Instance>] {
        &self.subset.members
    }

    pub fn len(&self) -> usize {
        self.subset.len()
    }

    pub fn is_empty(&self) -> bool {
        self.subset.is_empty()
    }

    /// Builds the weight schedule and Maglev table named in `needs` (the load index is the
    /// statistics store's to build: it feeds it).
    pub fn build(&self, needs: Needs) {
        if needs.schedule {
            let weights: Vec<u64> = self.members().iter().map(|i| u64::from(i.weight)).collect();
            let schedule = WeightSchedule::build(&weights);
            self.tables.schedule.store(Some(Arc::new(Built::new(schedule, &self.subset))));
        }
        if needs.maglev {
            let maglev = Maglev::build(self.members().iter().map(|i| &*i.id));
            self.tables.maglev.store(Some(Arc::new(Built::new(maglev, &self.subset))));
        }
    }

    /// Takes, of the tables named in `needs`, those `other` (another snapshot's subset with the
    /// same label, older or newer) has and this one lacks; they map onto this subset's members
    /// by id until its own are built. Returns which it took.
    pub fn adopt(&self, other: &Candidates, needs: Needs) -> Needs {
        let mut took = Needs::default();
        if needs.schedule
            && self.tables.schedule.load().is_none()
            && let Some(schedule) = other.tables.schedule.load_full()
        {
            self.tables.schedule.store(Some(schedule));
            took.schedule = true;
        }
        if needs.maglev
            && self.tables.maglev.load().is_none()
            && let Some(maglev) = other.tables.maglev.load_full()
        {
            self.tables.maglev.store(Some(maglev));
            took.maglev = true;
        }
        if needs.load && self.tables.load.load().is_none() {
            took.load = self.borrow_load(other);
        }
        took
    }

    /// Reads `other`'s load index from now on, if it has one that fits; whether it did.
    fn borrow_load(&self, other: &Candidates) -> bool {
        let Some(index) = other.tables.load.load().as_ref().map(|table| table.index().clone()) else { return false };
        let Some(table) = LoadTable::borrow(index, &self.subset) else { return false };
        self.tables.load.store(Some(Arc::new(table)));
        true
    }

    /// Takes `fresh`'s tables (named in `needs`) in place of the ones this subset lacks or took
    /// over from another snapshot: after a build for a newer snapshot than the one it took them
    /// from.
    pub fn refresh_from(&self, fresh: &Candidates, needs: Needs) {
        let borrowed = self.borrowed();
        if needs.schedule
            && (borrowed.schedule || self.tables.schedule.load().is_none())
            && let Some(schedule) = fresh.tables.schedule.load_full()
        {
            self.tables.schedule.store(Some(schedule));
        }
        if needs.maglev
            && (borrowed.maglev || self.tables.maglev.load().is_none())
            && let Some(maglev) = fresh.tables.maglev.load_full()
        {
            self.tables.maglev.store(Some(maglev));
        }
        if needs.load && (borrowed.load || self.tables.load.load().is_none()) {
            self.borrow_load(fresh);
        }
    }

    /// Which of its tables were built for other members (taken over from another snapshot), so
    /// that a build for these members would replace them.
    pub fn borrowed(&self) -> Needs {
        Needs {
            schedule: self.tables.schedule.load().as_ref().is_some_and(|t| !t.is_for(&self.subset)),
            maglev: self.tables.maglev.load().as_ref().is_some_and(|t| !t.is_for(&self.subset)),
            load: self.tables.load.load().as_ref().is_some_and(|t| !t.is_for(&self.subset)),
        }
    }

    /// Takes over `previous`'s tables (an earlier snapshot's subset with the same label) until
    /// this subset's own are built; returns which tables `previous` had (a load index too many
    /// of whose members left is not taken over, but still wanted).
    pub fn inherit(&self, previous: &Candidates) -> Needs {
        let schedule = previous.tables.schedule.load_full();
        let maglev = previous.tables.maglev.load_full();
        let needs = Needs {
            schedule: schedule.is_some(),
            maglev: maglev.is_some(),
            load: previous.tables.load.load().is_some(),
        };
        self.tables.schedule.store(schedule);
        self.tables.maglev.store(maglev);
        if needs.load {
            self.borrow_load(previous);
        }
        needs
    }
}
