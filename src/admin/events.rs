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
    /// Epoch of the service in the last event sent.
    pushed_epoch: u64,
}

impl Feed {
    /// The next snapshot, or `None` once the server is stopping.
    async fn next(&mut self) -> Option<Event> {
        loop {
            if self.state.is_stopping() {
                return None;
            }
            tokio::select! {
                biased;
                _ = self.stopping.wait_for(|stopping| *stopping) => return None,
                _ = self.ticker.tick() => break,
                changed = self.changes.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                    // Another service's change is not this page's news: wait for the tick.
                    let epoch = self.state.balancer.registry().service(&self.service).map_or(0, |s| s.epoch);
                    if epoch != self.pushed_epoch {
                        break;
                    }
                }
            }
        }
        // Building the view walks every instance of the service: off the runtime.
        let (state, service) = (self.state.clone(), self.service.clone());
        let view = tokio::task::spawn_blocking(move || {
            service_view(&state, &service).unwrap_or_else(|| ServiceView {
                name: service.clone(),
                epoch: 0,
                instances: Vec::new(),
                picks_by_rule: Default::default(),
            })
        })
        .await
        .ok()?;
        self.pushed_epoch = view.epoch;
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
    let feed = Feed { state, service: query.service, ticker, changes, stopping, pushed_epoch: u64::MAX };
    let events = futures_util::stream::unfold(feed, |mut feed| async move {
        let event = feed.next().await?;
        Some((Ok(event), feed))
    });
    Sse::new(events).keep_alive(KeepAlive::default())
}
