//! Answers a client has not read yet: large listings (`ListInstances`, `Lease`) and `Watch`
//! events sit in memory until the client's flow-control window lets them go, so a client that
//! never reads could make rota hold one answer per call without bound. Their bytes are counted
//! against a budget per client address and one for the whole server:
//!
//! - an answer reserves its encoded size before it is built. A unary answer is refused with
//!   `RESOURCE_EXHAUSTED` at once when its client's address has no room left (its own unread
//!   answers), and after waiting up to [`ANSWER_WAIT`] when the server has none (others'); a
//!   `Watch` or xDS stream waits as long as it takes (it is its own client's backlog), holding
//!   no built event meanwhile;
//! - the reservation is given back as the client takes the bytes. [`AnswerBody`] hands an
//!   answer to the HTTP/2 layer in pieces and ends each answer with a one-byte piece: hyper
//!   asks for the next piece only once the stream's window has room for the one it holds, so
//!   a request for piece *k* + 2 shows that piece *k* has been granted, and the one-byte end
//!   leaves nothing but that byte counted once a read answer is done (frames of up to 1 KiB go
//!   whole: an idle watch keeps at most that counted).
//!
//! An answer larger than the per-address budget reserves the whole budget: it is sent alone,
//! never refused for its size.

use std::collections::HashMap;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http_body::{Body, Frame, SizeHint};
use prost::Message;
use tokio::sync::Semaphore;
use tower_layer::Layer;
use tower_service::Service;

use crate::registry::ServiceSnapshot;

/// Default budget of unread answer bytes for the whole server.
pub const DEFAULT_MAX_UNREAD_BYTES: usize = 256 << 20;
/// Default budget of unread answer bytes per client address.
pub const DEFAULT_MAX_UNREAD_BYTES_PER_PEER: usize = 32 << 20;
/// How long a unary answer waits for room in the budgets before it is refused.
pub const ANSWER_WAIT: Duration = Duration::from_secs(2);
/// Largest piece an answer is handed to the HTTP/2 layer in: its default frame size.
const PIECE: usize = 16 << 10;
/// Data frames up to this size go whole, without the one-byte end: what they leave counted
/// is small, and a client's HTTP/2 layer may count many small frames against it.
const WHOLE: usize = 1 << 10;

/// The budgets, shared by every connection.
#[derive(Debug)]
pub struct UnreadAnswers {
    total: Semaphore,
    total_limit: usize,
    per_peer: usize,
    /// Entries only for addresses with a [`Meter`] alive: at most as many as open calls.
    peers: Mutex<HashMap<IpAddr, PeerBudget>>,
    refused: AtomicU64,
}

#[derive(Debug)]
struct PeerBudget {
    room: Arc<Semaphore>,
    meters: usize,
}

/// No room for a unary answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoRoom {
    #[error(
        "answers peer {ip} has not read yet hold {held} bytes; an answer of {bytes} bytes does not fit in its {limit} (server.max_unread_bytes_per_peer)"
    )]
    Peer { ip: IpAddr, held: usize, bytes: usize, limit: usize },
    #[error(
        "answers clients have not read yet hold {held} bytes; an answer of {bytes} bytes does not fit in the server's {limit} (server.max_unread_bytes)"
    )]
    Total { held: usize, bytes: usize, limit: usize },
}

impl UnreadAnswers {
    /// `per_peer` is at most `total` (the configuration checks it); a larger one is lowered.
    pub fn new(total: usize, per_peer: usize) -> Arc<Self> {
        let total = total.clamp(1, Semaphore::MAX_PERMITS);
        Arc::new(Self {
            total: Semaphore::new(total),
            total_limit: total,
            per_peer: per_peer.clamp(1, total),
            peers: Mutex::new(HashMap::new()),
            refused: AtomicU64::new(0),
        })
    }

    /// The budgets at their defaults.
    pub fn with_default_budgets() -> Arc<Self> {
        Self::new(DEFAULT_MAX_UNREAD_BYTES, DEFAULT_MAX_UNREAD_BYTES_PER_PEER)
    }

    /// A meter for one answer (or one stream's answers) to `peer`.
    pub fn meter(self: &Arc<Self>, peer: Option<IpAddr>) -> Arc<Meter> {
        let peer = peer.map(|ip| {
            let mut peers = self.peers.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            let budget = peers
                .entry(ip)
                .or_insert_with(|| PeerBudget { room: Arc::new(Semaphore::new(self.per_peer)), meters: 0 });
            budget.meters += 1;
            (ip, budget.room.clone())
        });
        Arc::new(Meter { answers: self.clone(), peer, outstanding: AtomicUsize::new(0) })
    }

    /// Unread bytes counted now, in total.
    pub fn held(&self) -> usize {
        self.total_limit - self.total.available_permits()
    }

    pub fn limit(&self) -> usize {
        self.total_limit
    }

    pub fn per_peer_limit(&self) -> usize {
        self.per_peer
    }

    /// Unary answers refused for want of room so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    fn forget_meter(&self, ip: IpAddr) {
        let mut peers = self.peers.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(budget) = peers.get_mut(&ip) {
            budget.meters -= 1;
            if budget.meters == 0 {
                peers.remove(&ip);
            }
        }
    }
}

/// Counts the unread bytes of one answer, or of one stream's answers; dropping it gives back
/// what it still holds.
#[derive(Debug)]
pub struct Meter {
    answers: Arc<UnreadAnswers>,
    peer: Option<(IpAddr, Arc<Semaphore>)>,
    /// Bytes reserved and not given back yet.
    outstanding: AtomicUsize,
}

impl Meter {
    /// Reserves room for `bytes`, waiting as long as it takes.
    pub async fn reserve(&self, bytes: usize) {
        let Ok(n) = u32::try_from(bytes.min(self.answers.per_peer)) else { return };
        if n == 0 {
            return;
        }
        // Both permits are held before either is forgotten: a reservation cancelled while it
        // waits for the second gives the first back.
        let peer = match &self.peer {
            Some((_, room)) => match room.acquire_many(n).await {
                Ok(permit) => Some(permit),
                Err(_) => return,
            },
            None => None,
        };
        let Ok(total) = self.answers.total.acquire_many(n).await else { return };
        if let Some(permit) = peer {
            permit.forget();
        }
        total.forget();
        self.outstanding.fetch_add(n as usize, Ordering::AcqRel);
    }

    /// Reserves room for `bytes` for a unary answer: refused at once when the client's own
    /// unread answers fill its address's budget (waiting would only hold the call), after
    /// [`ANSWER_WAIT`] when other clients' fill the server's.
    pub async fn reserve_within(&self, bytes: usize) -> Result<(), NoRoom> {
        let limit = self.answers.per_peer;
        let Ok(n) = u32::try_from(bytes.min(limit)) else { return Ok(()) };
        if n == 0 {
            return Ok(());
        }
        let peer = match &self.peer {
            Some((ip, room)) => match room.try_acquire_many(n) {
                Ok(permit) => Some(permit),
                Err(_) => {
                    self.answers.refused.fetch_add(1, Ordering::Relaxed);
                    return Err(NoRoom::Peer { ip: *ip, held: limit - room.available_permits(), bytes, limit });
                }
            },
            None => None,
        };
        let total = match tokio::time::timeout(ANSWER_WAIT, self.answers.total.acquire_many(n)).await {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) => return Ok(()),
            Err(_) => {
                self.answers.refused.fetch_add(1, Ordering::Relaxed);
                return Err(NoRoom::Total { held: self.answers.held(), bytes, limit: self.answers.total_limit });
            }
        };
        if let Some(permit) = peer {
            permit.forget();
        }
        total.forget();
        self.outstanding.fetch_add(n as usize, Ordering::AcqRel);
        Ok(())
    }

    /// Gives back up to `bytes` of what is reserved: the client has taken them, or the answer
    /// came out smaller than reserved.
    pub fn release(&self, bytes: usize) {
        let taken = self.outstanding.fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
            (held > 0 && bytes > 0).then(|| held - held.min(bytes))
        });
        if let Ok(held) = taken {
            self.give_back(held.min(bytes));
        }
    }

    /// Keeps at most `bytes` reserved.
    pub fn trim_to(&self, bytes: usize) {
        let held = self.outstanding.load(Ordering::Acquire);
        self.release(held.saturating_sub(bytes));
    }

    fn give_back(&self, n: usize) {
        if n == 0 {
            return;
        }
        if let Some((_, room)) = &self.peer {
            room.add_permits(n);
        }
        self.answers.total.add_permits(n);
    }

    #[cfg(test)]
    fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Acquire)
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        let held = *self.outstanding.get_mut();
        self.give_back(held);
        if let Some((ip, _)) = &self.peer {
            self.answers.forget_meter(*ip);
        }
    }
}

/// The bytes a gRPC message makes on the wire: its 5-byte prefix and its encoding.
pub fn message_bytes(encoded_len: usize) -> usize {
    encoded_len + 5
}

/// The bytes a `repeated` message field of `tag` under 16 adds for an element of `len` bytes.
pub fn field_bytes(len: usize) -> usize {
    1 + prost::encoding::encoded_len_varint(len as u64) + len
}

/// The bytes `snapshot`'s instances take as a `repeated Instance` field of tag 1 (a listing, a
/// lease, a watch snapshot): counted one transient conversion at a time, once per snapshot.
pub fn listing_bytes(snapshot: &ServiceSnapshot) -> usize {
    snapshot.listing_bytes_with(|instances| {
        instances.iter().map(|i| field_bytes(super::convert::instance(i).encoded_len())).sum()
    })
}

/// Puts the response's [`Meter`] (in its extensions) on its body.
#[derive(Debug, Clone, Copy, Default)]
pub struct AnswersLayer;

impl<S> Layer<S> for AnswersLayer {
    type Service = AnswersService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AnswersService { inner }
    }
}

#[derive(Debug, Clone)]
pub struct AnswersService<S> {
    inner: S,
}

impl<S, ReqBody, ResBody> Service<http::Request<ReqBody>> for AnswersService<S>
where
    S: Service<http::Request<ReqBody>, Response = http::Response<ResBody>>,
{
    type Response = http::Response<AnswerBody<ResBody>>;
    type Error = S::Error;
    type Future = AnswersFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<ReqBody>) -> Self::Future {
        AnswersFuture { inner: self.inner.call(request) }
    }
}

pin_project_lite::pin_project! {
    pub struct AnswersFuture<F> {
        #[pin]
        inner: F,
    }
}

impl<F, ResBody, E> Future for AnswersFuture<F>
where
    F: Future<Output = Result<http::Response<ResBody>, E>>,
{
    type Output = Result<http::Response<AnswerBody<ResBody>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut response = ready!(self.project().inner.poll(cx))?;
        let meter = response.extensions_mut().remove::<Arc<Meter>>();
        Poll::Ready(Ok(response.map(|inner| AnswerBody::new(inner, meter))))
    }
}

pin_project_lite::pin_project! {
    /// A response body whose data, when it has a [`Meter`], goes out in pieces that give their
    /// bytes back as the client's window takes them.
    pub struct AnswerBody<B> {
        #[pin]
        inner: B,
        meter: Option<Arc<Meter>>,
        // The rest of the data frame being handed out.
        rest: Bytes,
        // The sizes of the last two pieces handed out, the older first.
        pending: [usize; 2],
    }
}

impl<B> AnswerBody<B> {
    pub fn new(inner: B, meter: Option<Arc<Meter>>) -> Self {
        Self { inner, meter, rest: Bytes::new(), pending: [0, 0] }
    }
}

impl<B> Body for AnswerBody<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = self.project();
        let Some(meter) = this.meter else { return this.inner.poll_frame(cx) };
        // Asked again: the piece before the last one handed out has been granted.
        meter.release(this.pending[0]);
        this.pending[0] = std::mem::take(&mut this.pending[1]);
        if this.rest.is_empty() {
            match ready!(this.inner.poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) if data.remaining() > WHOLE => *this.rest = data,
                    Ok(data) => {
                        this.pending[1] = data.remaining();
                        return Poll::Ready(Some(Ok(Frame::data(data))));
                    }
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                other => return Poll::Ready(other),
            }
        }
        // A piece of at most PIECE bytes; the frame's last byte goes alone.
        let len = this.rest.len();
        let take = if len == 1 { 1 } else { (len - 1).min(PIECE) };
        this.pending[1] = take;
        Poll::Ready(Some(Ok(Frame::data(this.rest.split_to(take)))))
    }

    fn is_end_stream(&self) -> bool {
        self.rest.is_empty() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        let mut hint = self.inner.size_hint();
        let rest = self.rest.len() as u64;
        hint.set_lower(hint.lower() + rest);
        if let Some(upper) = hint.upper() {
            hint.set_upper(upper + rest);
        }
        hint
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    fn localhost() -> Option<IpAddr> {
        Some(IpAddr::from([127, 0, 0, 1]))
    }

    #[tokio::test(start_paused = true)]
    async fn reservations_wait_for_room_and_peers_have_their_own_budgets() {
        let answers = UnreadAnswers::new(1000, 600);
        let a = answers.meter(localhost());
        a.reserve(500).await;
        assert_eq!(answers.held(), 500);
        // The same address has 100 left: a unary answer of 200 is refused at once.
        let b = answers.meter(localhost());
        let refused = b.reserve_within(200).await.unwrap_err();
        assert_eq!(refused, NoRoom::Peer { ip: IpAddr::from([127, 0, 0, 1]), held: 500, bytes: 200, limit: 600 });
        assert_eq!(answers.refused(), 1);
        assert_eq!(b.outstanding(), 0, "a refused reservation holds nothing");
        // Another address fits until the total is full.
        let c = answers.meter(Some(IpAddr::from([127, 0, 0, 2])));
        c.reserve_within(450).await.unwrap();
        let refused = c.reserve_within(100).await.unwrap_err();
        assert_eq!(refused, NoRoom::Total { held: 950, bytes: 100, limit: 1000 });
        // Room given back lets a waiting reservation through.
        let waiting = tokio::spawn({
            let b = b.clone();
            async move { b.reserve(200).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        a.release(300);
        waiting.await.unwrap();
        assert_eq!(b.outstanding(), 200);
        assert_eq!(answers.held(), 200 + 200 + 450);
        // Dropping meters gives back the rest and forgets the addresses.
        drop((a, b, c));
        assert_eq!(answers.held(), 0);
        assert!(answers.peers.lock().unwrap().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn an_answer_larger_than_the_budget_takes_all_of_it_and_goes_alone() {
        let answers = UnreadAnswers::new(1000, 100);
        let meter = answers.meter(localhost());
        meter.reserve_within(5000).await.unwrap();
        assert_eq!(meter.outstanding(), 100);
        let other = answers.meter(localhost());
        assert!(other.reserve_within(1).await.is_err());
        meter.trim_to(40);
        assert_eq!(meter.outstanding(), 40);
        other.reserve_within(60).await.unwrap();
    }

    #[tokio::test]
    async fn a_body_gives_back_each_piece_once_the_one_after_it_was_asked_for() {
        let answers = UnreadAnswers::new(1 << 20, 1 << 20);
        let meter = answers.meter(localhost());
        let data = Bytes::from(vec![7u8; 2 * PIECE + 10]);
        meter.reserve(data.len()).await;
        let inner = http_body_util::Full::new(data.clone());
        let mut body = AnswerBody::new(inner, Some(meter.clone()));
        let mut pieces = Vec::new();
        let mut outstanding = Vec::new();
        while let Some(frame) = body.frame().await {
            outstanding.push(meter.outstanding());
            pieces.push(frame.unwrap().into_data().unwrap());
        }
        // Two full pieces, the rest less one byte, and that byte alone.
        assert_eq!(pieces.iter().map(Bytes::len).collect::<Vec<_>>(), [PIECE, PIECE, 9, 1]);
        assert_eq!(pieces.concat(), data.to_vec());
        // When piece k + 2 is handed out, piece k has been given back.
        let total = data.len();
        assert_eq!(outstanding, [total, total, total - PIECE, total - 2 * PIECE]);
        // Asked once more (the end): only the last byte is still counted.
        assert_eq!(meter.outstanding(), 1);
        drop(body);
        drop(meter);
        assert_eq!(answers.held(), 0);
    }

    #[tokio::test]
    async fn small_frames_go_whole_and_are_given_back_on_the_next_ask() {
        let answers = UnreadAnswers::new(1 << 20, 1 << 20);
        let meter = answers.meter(localhost());
        meter.reserve(WHOLE).await;
        let data = Bytes::from(vec![3u8; WHOLE]);
        let mut body = AnswerBody::new(http_body_util::Full::new(data.clone()), Some(meter.clone()));
        assert_eq!(body.frame().await.unwrap().unwrap().into_data().unwrap(), data);
        assert_eq!(meter.outstanding(), WHOLE);
        assert!(body.frame().await.is_none());
        assert_eq!(meter.outstanding(), WHOLE, "given back only once asked again after the next piece");
        drop((body, meter));
        assert_eq!(answers.held(), 0);
    }

    #[tokio::test]
    async fn a_body_without_a_meter_is_passed_through() {
        let data = Bytes::from(vec![1u8; 3 * PIECE]);
        let mut body = AnswerBody::new(http_body_util::Full::new(data.clone()), None);
        let frame = body.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), data);
        assert!(body.frame().await.is_none());
    }
}
