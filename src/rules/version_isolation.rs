//! Version isolation: requests carrying version V reach only instances of version V.
//!
//! This is the rule teams wrote as a custom Ribbon `IRule` so a developer could register a local
//! instance (version `zlt`) in the shared registry without it stealing anyone else's traffic:
//!
//! - version V requested → UP instances with version V;
//! - none of those → UP instances with no version, and the pick says it fell back;
//! - no version requested → only UP instances with no version.
//!
//! If that leaves nothing, the pick fails with "unavailable".

use crate::registry::{ServiceSnapshot, Subset};

/// The subset a request may pick from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Isolated<'s> {
    pub subset: &'s Subset,
    /// True when the requested version had no UP instance and the unversioned ones were used.
    pub fell_back: bool,
}

/// Chooses the subset for `version` (empty = no version). Never allocates.
pub fn isolate<'s>(snapshot: &'s ServiceSnapshot, version: &str) -> Isolated<'s> {
    if !version.is_empty() {
        if let Some(subset) = snapshot.versions.get(version).filter(|s| !s.is_empty()) {
            return Isolated { subset, fell_back: false };
        }
        return Isolated { subset: &snapshot.unversioned, fell_back: true };
    }
    Isolated { subset: &snapshot.unversioned, fell_back: false }
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
        assert_eq!(ids(isolate(&snapshot, "")), ["plain-1", "plain-2"]);
        assert!(!isolate(&snapshot, "").fell_back);
        assert_eq!(ids(isolate(&snapshot, "zlt")), ["zlt-1"]);
        assert!(!isolate(&snapshot, "zlt").fell_back);
        assert_eq!(ids(isolate(&snapshot, "nobody")), ["plain-1", "plain-2"]);
        assert!(isolate(&snapshot, "nobody").fell_back);
        // A version whose only instance drains counts as absent.
        assert!(isolate(&snapshot, "gone").fell_back);
    }
}
