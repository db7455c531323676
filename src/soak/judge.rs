//! The verdict on a churn history: every check of [`super::history`] (answers, live, stale,
//! tickets) and the exact-shares check of `shares`, into one set of findings.

use super::history::{Findings, History};

pub fn check(history: &History) -> Findings {
    let mut findings = Findings { picks: history.picks.len(), events: history.events.len(), ..Default::default() };
    history.check_answers(&mut findings);
    history.check_liveness(&mut findings);
    history.check_tickets(&mut findings);
    super::shares::check(history, &mut findings);
    findings
}
