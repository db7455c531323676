//! `sticky`: a key keeps its instance while that instance is eligible here (in the subset, not
//! excluded, not tripped); otherwise the rule's rotation chooses one and the assignment is
//! claimed in the state backend, where the consumer that claimed a key first (on another
//! replica, say) wins when its choice is eligible here.

use std::time::Duration;

use super::select::Selection;
use super::view::SubsetView;
use super::{Balancer, PickError};
use crate::rules::Draw;
use crate::state::StickyKey;

/// An assignment to write (set or refresh) once the chosen instance is known to be taken.
pub(super) struct Refresh {
    pub key: StickyKey,
    pub ttl: Duration,
}

impl Balancer {
    /// The position `sticky` returns on `draw`, and the assignment to write when it is taken.
    pub(super) async fn stick(
        &self,
        selection: &Selection<'_>,
        subset: &SubsetView,
        draw: &Draw<'_>,
        ttl: Duration,
        fallback: &mut Option<String>,
    ) -> Result<(usize, Option<Refresh>), PickError> {
        let snapshot = &selection.view.snapshot;
        let key = StickyKey {
            service: snapshot.name.clone(),
            subset: subset.label().clone(),
            key: selection.query.key.into(),
        };
        let candidates = &subset.candidates;
        let tripped = |index: usize| draw.loads(|loads| loads.load(index).tripped).unwrap_or(false);
        // Members are sorted by id; an excluded or tripped instance is not kept.
        let eligible = |id: &str| {
            candidates
                .members()
                .binary_search_by(|i| (*i.id).cmp(id))
                .ok()
                .filter(|&index| draw.accepts(index) && !tripped(index))
        };
        let choose = |fallback: &mut Option<String>| self.choose(selection.selector, draw, fallback, selection.rule);
        match self.state.sticky_get(&key).await {
            Some(id) => match eligible(&id) {
                // Still UP, not drained, not tripped: keep the assignment (refreshed once taken).
                Some(index) => Ok((index, Some(Refresh { key, ttl }))),
                // Gone, excluded or tripped: reassign.
                None => Ok((choose(fallback)?, Some(Refresh { key, ttl }))),
            },
            // No assignment yet: claim one. When the claim's winner is eligible here, the claim
            // set or read the assignment and there is nothing to refresh.
            None => {
                let chosen = choose(fallback)?;
                let id = candidates.members()[chosen].id.clone();
                let winner = self.state.sticky_claim(key.clone(), id, ttl).await;
                match eligible(&winner) {
                    Some(index) => Ok((index, None)),
                    None => Ok((chosen, Some(Refresh { key, ttl }))),
                }
            }
        }
    }
}
