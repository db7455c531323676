//! The `exclude` filter: drops instances a call has already tried, so a retry goes elsewhere.

use std::borrow::Cow;
use std::sync::Arc;

use crate::registry::Instance;

/// `candidates` without the instances whose id is in `exclude`. Borrows when nothing is
/// excluded, which is the common case, so the pick path does not allocate for it.
pub fn without_excluded<'a>(candidates: &'a [Arc<Instance>], exclude: &[String]) -> Cow<'a, [Arc<Instance>]> {
    if exclude.is_empty() || !candidates.iter().any(|i| exclude.iter().any(|e| **e == *i.id)) {
        return Cow::Borrowed(candidates);
    }
    Cow::Owned(candidates.iter().filter(|i| !exclude.iter().any(|e| **e == *i.id)).cloned().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::testing::instances;

    #[test]
    fn removes_only_named_ids_and_borrows_otherwise() {
        let candidates = instances(3);
        let kept = without_excluded(&candidates, &["i1".to_owned(), "zz".to_owned()]);
        let ids: Vec<&str> = kept.iter().map(|i| &*i.id).collect();
        assert_eq!(ids, ["i0", "i2"]);
        assert!(matches!(without_excluded(&candidates, &["zz".to_owned()]), Cow::Borrowed(_)));
        assert!(without_excluded(&candidates, &["i0".into(), "i1".into(), "i2".into()]).is_empty());
    }
}
