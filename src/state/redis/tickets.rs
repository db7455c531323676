//! Rotation counters shared through Redis.
//!
//! Each rotation has one Redis counter (its value is the number of tickets drawn) and, on each
//! replica, one drawer task. Picks hand their request to the drawer; the drawer takes every
//! request waiting at that moment (up to [`MAX_BATCH`]), draws their tickets with one atomic
//! script call (`INCRBY` by the batch's size), and hands out the consecutive range in arrival
//! order. So the sequence stays exact fleet-wide — each ticket drawn once, in one global order
//! per batch — while Redis sees one command per batch, not per pick: under load, the picks that
//! arrive during one round trip share the next.
//!
//! With `ticket_block = K > 1` a drawer also reserves K spare tickets with each call and hands
//! them to later single picks without asking Redis. Redis then sees about one command per K
//! picks, at the cost of interleaving: replicas consume their blocks at their own pace, so the
//! fleet-wide order is exact per block, not per pick (shares stay exact over every K × replicas
//! tickets in a steady state, but a short burst on one replica is served from one block).
//!
//! **While Redis is unreachable** a replica draws from its local counter, which always stands
//! one past the highest ticket the replica handed out or learned from Redis. When the link
//! returns, every draw passes that counter as a floor: Redis raises its counter to at least the
//! floor before drawing, so no replica is handed a ticket it already gave out locally. Tickets
//! other replicas handed out locally during the same outage may repeat — at most once per
//! outage.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::link::{Link, LinkScript};

/// Most draw requests answered by one Redis call.
pub const MAX_BATCH: usize = 1024;
/// Requests a drawer queues; a pick beyond this waits for room (back-pressure, not memory).
const QUEUE: usize = 4096;
/// A counter unused this long is dropped by Redis (the rotation starts again from 0), as the
/// in-process counters are after ten idle minutes.
pub const COUNTER_TTL: Duration = Duration::from_secs(600);

/// Draws `ARGV[1]` tickets from the counter `KEYS[1]`, first raising it to the floor `ARGV[2]`,
/// and refreshes its expiry (`ARGV[3]` ms). Returns the counter after the draw: the tickets are
/// the `ARGV[1]` numbers below it.
const DRAW_SCRIPT: &str = r"
local value = tonumber(redis.call('GET', KEYS[1]) or '0')
local floor = tonumber(ARGV[2])
if value < floor then value = floor end
value = value + tonumber(ARGV[1])
redis.call('SET', KEYS[1], value, 'PX', ARGV[3])
return value
";

struct Request {
    count: u32,
    reply: oneshot::Sender<u64>,
}

/// One rotation's shared counter on this replica.
pub struct SharedCounter {
    link: Arc<Link>,
    /// One past the highest ticket this replica handed out or saw drawn.
    local: Arc<AtomicU64>,
    requests: mpsc::Sender<Request>,
    /// Drawn from since housekeeping last looked.
    used: AtomicBool,
}

impl std::fmt::Debug for SharedCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedCounter").field("local", &self.local).finish()
    }
}

impl crate::state::RemoteCounter for SharedCounter {
    fn draw(&self, count: u32) -> futures_util::future::BoxFuture<'_, u64> {
        Box::pin(SharedCounter::draw(self, count))
    }
}

impl SharedCounter {
    /// The counter stored at `key`, with its drawer running on the current runtime. `local`
    /// is the rotation's in-process counter, used while Redis is unreachable.
    pub fn spawn(key: String, local: Arc<AtomicU64>, link: Arc<Link>, block: u32) -> Arc<Self> {
        let (requests, rx) = mpsc::channel(QUEUE);
        let drawer =
            Drawer { key, local: local.clone(), link: link.clone(), block: u64::from(block.max(1)), spare: 0..0 };
        tokio::spawn(drawer.run(rx));
        Arc::new(Self { link, local, requests, used: AtomicBool::new(true) })
    }

    /// Draws `count` consecutive tickets and returns the first.
    pub async fn draw(&self, count: u32) -> u64 {
        self.used.store(true, Ordering::Relaxed);
        if self.link.is_up() {
            let _waiting = self.link.draw_waiting();
            let (reply, answer) = oneshot::channel();
            if self.requests.send(Request { count, reply }).await.is_ok()
                && let Ok(first) = answer.await
            {
                return first;
            }
        }
        self.local.fetch_add(u64::from(count), Ordering::Relaxed)
    }

    /// Whether the counter was drawn from since the last call.
    pub fn take_used(&self) -> bool {
        self.used.swap(false, Ordering::Relaxed)
    }
}

struct Drawer {
    key: String,
    local: Arc<AtomicU64>,
    link: Arc<Link>,
    block: u64,
    /// Tickets reserved with an earlier call and not yet handed out (ticket blocks only).
    spare: std::ops::Range<u64>,
}

impl Drawer {
    async fn run(mut self, mut rx: mpsc::Receiver<Request>) {
        let script = LinkScript::new(DRAW_SCRIPT);
        let mut batch = Vec::with_capacity(16);
        while let Some(first) = rx.recv().await {
            batch.push(first);
            while batch.len() < MAX_BATCH {
                match rx.try_recv() {
                    Ok(request) => batch.push(request),
                    Err(_) => break,
                }
            }
            self.answer(&script, &mut batch).await;
        }
    }

    /// Answers every request of `batch` (and empties it).
    async fn answer(&mut self, script: &LinkScript, batch: &mut Vec<Request>) {
        let mut needed = 0u64;
        let mut waiting = Vec::new();
        for request in batch.drain(..) {
            if request.count == 1 && !self.spare.is_empty() {
                let ticket = self.spare.start;
                self.spare.start += 1;
                let _ = request.reply.send(ticket);
            } else {
                needed += u64::from(request.count);
                waiting.push(request);
            }
        }
        if waiting.is_empty() {
            return;
        }
        let refill = if self.block > 1 && self.spare.is_empty() { self.block } else { 0 };
        let total = needed + refill;
        let floor = self.local.load(Ordering::Relaxed).max(self.link.ticket_floor());
        let ttl = COUNTER_TTL.as_millis() as u64;
        let loaded = script.ensure_loaded(&self.link).await;
        let drawn = if !loaded {
            None
        } else {
            self.link.count_draw_call();
            self.link
                .run(|mut conn| {
                    let mut invocation = script.script().key(&self.key);
                    invocation.arg(total).arg(floor).arg(ttl);
                    async move { invocation.invoke_async::<u64>(&mut conn).await }
                })
                .await
        };
        match drawn {
            Some(end) => {
                self.local.fetch_max(end, Ordering::Relaxed);
                let mut next = end - total;
                for request in waiting {
                    let _ = request.reply.send(next);
                    next += u64::from(request.count);
                }
                if refill > 0 {
                    self.spare = next..end;
                }
            }
            None => {
                for request in waiting {
                    let _ = request.reply.send(self.local.fetch_add(u64::from(request.count), Ordering::Relaxed));
                }
            }
        }
    }
}
