//! Version isolation: requests carrying version V reach only instances of version V.
//!
//! This is the rule teams wrote as a custom Ribbon `IRule` so a developer could register a local
//! instance (version `zlt`) in the shared registry without it stealing anyone else's traffic:
//!
//! - version V requested → UP instances with version V;
//! - none of those → UP instances with no version, and the pick says it fell back;
//! - no version requested → only UP instances with no version.
//!
//! If that leaves nothing, the service's policy decides: fail (`UNAVAILABLE`, the default), or
//! pick from any UP instance as Ribbon's `super.choose` did, saying so.

use crate::registry::{ServiceSnapshot, Subset};

/// Which fallback, if any, isolation took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// The requested version had no UP instance; unversioned instances were used.
    Unversioned,
    /// Neither the version nor unversioned instances were available; any UP instance was used.
    Any,
}

/// A service's UP instances grouped for isolation: a registry snapshot, or a view of one.
pub trait Versions {
    type Subset;
    /// UP instances with no version.
    fn unversioned(&self) -> &Self::Subset;
    /// UP instances with this (non-empty) version.
    fn version(&self, version: &str) -> Option<&Self::Subset>;
    /// Every UP instance.
    fn up(&self) -> &Self::Subset;
    fn is_empty(subset: &Self::Subset) -> bool;
}

impl Versions for ServiceSnapshot {
    type Subset = Subset;

    fn unversioned(&self) -> &Subset {
        &self.unversioned
    }

    fn version(&self, version: &str) -> Option<&Subset> {
        self.versions.get(version)
    }

    fn up(&self) -> &Subset {
        &self.up
    }

    fn is_empty(subset: &Subset) -> bool {
        subset.is_empty()
    }
}

/// The subset a request may pick from.
#[derive(Debug, PartialEq, Eq)]
pub struct Isolated<'s, S> {
    pub subset: &'s S,
    pub fallback: Option<Fallback>,
}

impl<S> Clone for Isolated<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S> Copy for Isolated<'_, S> {}

/// Chooses the subset for `version` (empty = no version). Never allocates.
pub fn isolate<'s, V: Versions>(service: &'s V, version: &str, fall_back_to_any: bool) -> Isolated<'s, V::Subset> {
    let mut isolated = Isolated { subset: service.unversioned(), fallback: None };
    if !version.is_empty() {
        match service.version(version).filter(|s| !V::is_empty(s)) {
            Some(subset) => return Isolated { subset, fallback: None },
            None => isolated.fallback = Some(Fallback::Unversioned),
        }
    }
    if V::is_empty(isolated.subset) && fall_back_to_any && !V::is_empty(service.up()) {
        return Isolated { subset: service.up(), fallback: Some(Fallback::Any) };
    }
    isolated
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Status;
    use crate::registry::snapshot_tests::instance;

    fn snapshot() -> ServiceSnapshot {
        ServiceSnapshot::build(
            "svc".into(),
            1,
            vec![
                instance("plain-1", "", Status::Up),
                instance("plain-2", "", Status::Up),
                instance("zlt-1", "zlt", Status::Up),
                instance("bob-1", "bob", Status::Up),
                instance("gone-1", "gone", Status::Draining),
            ],
        )
    }

    fn ids(isolated: Isolated<'_, Subset>) -> Vec<String> {
        isolated.subset.members.iter().map(|i| i.id.to_string()).collect()
    }

    #[test]
    fn seed_scenario() {
        let snapshot = snapshot();
        assert_eq!(ids(isolate(&snapshot, "", false)), ["plain-1", "plain-2"]);
        assert_eq!(isolate(&snapshot, "", false).fallback, None);
        assert_eq!(ids(isolate(&snapshot, "zlt", false)), ["zlt-1"]);
        assert_eq!(isolate(&snapshot, "zlt", false).fallback, None);
        assert_eq!(ids(isolate(&snapshot, "nobody", false)), ["plain-1", "plain-2"]);
        assert_eq!(isolate(&snapshot, "nobody", false).fallback, Some(Fallback::Unversioned));
        // A version whose only instance drains counts as absent.
        assert_eq!(isolate(&snapshot, "gone", false).fallback, Some(Fallback::Unversioned));
    }

    #[test]
    fn any_instance_fallback_is_a_policy_choice() {
        let snapshot = ServiceSnapshot::build("svc".into(), 1, vec![instance("zlt-1", "zlt", Status::Up)]);
        assert!(isolate(&snapshot, "", false).subset.is_empty());
        let any = isolate(&snapshot, "", true);
        assert_eq!((ids(any), any.fallback), (vec!["zlt-1".to_owned()], Some(Fallback::Any)));
        assert_eq!(isolate(&snapshot, "bob", true).fallback, Some(Fallback::Any));
    }
}
