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

/// The subset a request may pick from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Isolated<'s> {
    pub subset: &'s Subset,
    pub fallback: Option<Fallback>,
}

/// Chooses the subset for `version` (empty = no version). Never allocates.
pub fn isolate<'s>(snapshot: &'s ServiceSnapshot, version: &str, fall_back_to_any: bool) -> Isolated<'s> {
    let mut isolated = Isolated { subset: &snapshot.unversioned, fallback: None };
    if !version.is_empty() {
        match snapshot.versions.get(version).filter(|s| !s.is_empty()) {
            Some(subset) => return Isolated { subset, fallback: None },
            None => isolated.fallback = Some(Fallback::Unversioned),
        }
    }
    if isolated.subset.is_empty() && fall_back_to_any && !snapshot.up.is_empty() {
        return Isolated { subset: &snapshot.up, fallback: Some(Fallback::Any) };
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

    fn ids(isolated: Isolated<'_>) -> Vec<String> {
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
