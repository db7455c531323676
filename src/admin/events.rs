//! `/api/events?service=NAME`: Server-Sent Events for the dashboard.
//!
//! Each event is the service's JSON view (as `/api/services/{name}` returns it), pushed at once,
//! then every [`PUSH_INTERVAL`] and whenever the registry publishes a new catalog. A service
//! not registered (yet) is sent as an empty view at epoch 0, so a page can be opened before the
//! providers start. The stream ends when the server starts stopping: a browser left open does
//! not hold the shutdown.

use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use serde::Deserialize;
use tokio::sync::watch;
use tokio::time::{Interval, MissedTickBehavior};

use super::AdminState;
use super::api::{ServiceView, service_view};

/// How often a snapshot is pushed when nothing changes.
pub const PUSH_INTERVAL: Duration = Duration::from_millis(500);

#[derive(Debug, Deserialize)]
pub struct EventsQuery {
    pub service: String,
}

struct Feed {
    state: AdminState,
    service: String,
    ticker: Interval,
    changes: watch::Receiver<u64>,
    stopping: watch::Receiver<bool>,
}

impl Feed {
    /// The next snapshot, or `None` once the server is stopping.
    async fn next(&mut self) -> Option<Event> {
        if self.state.is_stopping() {
            return None;
        }
        tokio::select! {
            biased;
            _ = self.stopping.wait_for(|stopping| *stopping) => return None,
            _ = self.ticker.tick() => {}
            changed = self.changes.changed() => {
                if changed.is_err() {
                    return None;
                }
            }
        }
        let view = service_view(&self.state, &self.service).unwrap_or_else(|| ServiceView {
            name: self.service.clone(),
            epoch: 0,
            instances: Vec::new(),
            picks_by_rule: Default::default(),
        });
        Some(Event::default().json_data(view).unwrap_or_else(|_| Event::default().data("{}")))
    }
}

pub async fn stream(
    State(state): State<AdminState>,
    Query(query): Query<EventsQuery>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let mut ticker = tokio::time::interval(PUSH_INTERVAL);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut changes = state.balancer.registry().changes();
    changes.borrow_and_update();
    let stopping = state.stopping.clone();
    let feed = Feed { state, service: query.service, ticker, changes, stopping };
    let events = futures_util::stream::unfold(feed, |mut feed| async move {
        let event = feed.next().await?;
        Some((Ok(event), feed))
    });
    Sse::new(events).keep_alive(KeepAlive::default())
}
