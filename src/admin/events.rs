//! `/api/events?service=NAME`: Server-Sent Events for the dashboard, and the recent history its
//! plots are drawn from.
//!
//! Each event is the service's JSON view (as `/api/services/{name}` returns it) with two more
//! fields: `policy`, the service's policy in force (as in `/api/policies`), and `history`, the
//! samples and markers taken since the previous event ([`HistoryUpdate`]; the first event of a
//! stream carries the whole window). Events are pushed at once, then every [`PUSH_INTERVAL`] and
//! whenever the registry publishes a new catalog that changed the service. A service not
//! registered (yet) is sent as an empty view at epoch 0, so a page can be opened before the
//! providers start. The stream ends when the server starts stopping: a browser left open does
//! not hold the shutdown.
//!
//! The history itself is [`super::history`]'s.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Extension;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::{Interval, MissedTickBehavior};

use super::AdminState;
use super::api::{ServiceView, policy_json, service_view};
use super::history::{Cursor, History, HistoryUpdate, Watching};
use super::streams::{EventSlot, EventStreams, Peer};

/// How often a snapshot is pushed when nothing changes.
pub const PUSH_INTERVAL: Duration = Duration::from_millis(500);

#[derive(Debug, Deserialize)]
pub struct EventsQuery {
    pub service: String,
}

/// One event of the stream.
#[derive(Serialize)]
struct Update {
    #[serde(flatten)]
    view: ServiceView,
    policy: serde_json::Value,
    history: HistoryUpdate,
}

struct Feed {
    state: AdminState,
    history: Arc<History>,
    service: String,
    ticker: Interval,
    changes: watch::Receiver<u64>,
    stopping: watch::Receiver<bool>,
    /// Epoch of the service in the last event sent.
    pushed_epoch: u64,
    /// What of the service's history has been sent.
    cursor: Cursor,
    /// Keeps the service's ring while the stream is open.
    watching: Option<Watching>,
    /// The stream's place among the open event streams.
    _slot: EventSlot,
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
                    let epoch = self.state.overview.service(&self.service).map_or(0, |s| s.epoch);
                    if epoch != self.pushed_epoch {
                        break;
                    }
                }
            }
        }
        // Building the view walks every instance of the service: off the runtime.
        let (state, history, service) = (self.state.clone(), self.history.clone(), self.service.clone());
        let (mut cursor, mut watching) = (self.cursor, self.watching.take());
        let (update, cursor, watching) = tokio::task::spawn_blocking(move || {
            if watching.is_none() {
                watching = history.watch(&service);
            }
            let view = service_view(&state, &service).unwrap_or_else(|| ServiceView {
                name: service.clone(),
                epoch: 0,
                instances: Vec::new(),
                picks_by_rule: Default::default(),
            });
            let policies = state.overview.policies();
            let policy = policy_json(Some(&service), policies.for_service(&service), policies.source(&service));
            let update = Update { view, policy, history: history.since(&service, &mut cursor) };
            if !update.history.kept {
                // The ring went (its service was forgotten): follow the next one from scratch.
                watching = None;
            }
            (update, cursor, watching)
        })
        .await
        .ok()?;
        self.cursor = cursor;
        self.watching = watching;
        self.pushed_epoch = update.view.epoch;
        Some(Event::default().json_data(update).unwrap_or_else(|_| Event::default().data("{}")))
    }
}

pub async fn stream(
    State(state): State<AdminState>,
    Extension(history): Extension<Arc<History>>,
    Extension(streams): Extension<Arc<EventStreams>>,
    peer: Option<Extension<Peer>>,
    Query(query): Query<EventsQuery>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, (StatusCode, String)> {
    let slot = streams.acquire(peer.map(|Extension(Peer(ip))| ip)).map_err(|e| (StatusCode::TOO_MANY_REQUESTS, e))?;
    let mut ticker = tokio::time::interval(PUSH_INTERVAL);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut changes = state.overview.changes();
    changes.borrow_and_update();
    let stopping = state.stopping.clone();
    let feed = Feed {
        state,
        history,
        service: query.service,
        ticker,
        changes,
        stopping,
        pushed_epoch: u64::MAX,
        cursor: Cursor::default(),
        watching: None,
        _slot: slot,
    };
    let events = futures_util::stream::unfold(feed, |mut feed| async move {
        let event = feed.next().await?;
        Some((Ok(event), feed))
    });
    Ok(Sse::new(events).keep_alive(KeepAlive::default()))
}
