//! The `exclude` filter: drops instances a call has already tried, so a retry goes elsewhere.

use std::borrow::Cow;

use crate::registry::Subset;

/// `subset` without the instances whose id is in `exclude`. Borrows when nothing is excluded,
/// the common case, so the pick path does not allocate for it. The result keeps the subset's
/// label: a retry draws from the same rotation as the first attempt.
pub fn without_excluded<'a>(subset: &'a Subset, exclude: &[String]) -> Cow<'a, Subset> {
    let excluded = |id: &str| exclude.iter().any(|e| e == id);
    if exclude.is_empty() || !subset.members.iter().any(|i| excluded(&i.id)) {
        return Cow::Borrowed(subset);
    }
    let kept = subset.members.iter().filter(|i| !excluded(&i.id)).cloned().collect();
    Cow::Owned(Subset::new(subset.label.clone(), kept))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::testing::{instances, subset};

    #[test]
    fn removes_only_named_ids_and_borrows_otherwise() {
        let candidates = subset(instances(3));
        let kept = without_excluded(&candidates, &["i01".to_owned(), "zz".to_owned()]);
        let ids: Vec<&str> = kept.members.iter().map(|i| &*i.id).collect();
        assert_eq!(ids, ["i00", "i02"]);
        assert_eq!(kept.label, candidates.label);
        assert!(matches!(without_excluded(&candidates, &["zz".to_owned()]), Cow::Borrowed(_)));
        assert!(without_excluded(&candidates, &["i00".into(), "i01".into(), "i02".into()]).is_empty());
    }
}
