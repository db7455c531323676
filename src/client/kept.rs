//! A registration kept across lost streams: when rota restarts, shuts down (`Closing`) or ends
//! the stream, the same instances are registered again, with backoff, until the registration
//! is closed or dropped.

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tonic::transport::Channel;

use super::backoff::backoff;
use super::registration::all_accepted;
use super::{ClientError, Registration};
use crate::pb;
use crate::pb::register_request::Msg;
use crate::pb::registry_client::RegistryClient;
use crate::registry::default_id;

/// Events kept for the owner of a [`KeptRegistration`]; past this many unread, newer ones are
/// dropped (the registration itself goes on).
const EVENTS_KEPT: usize = 16;

/// What happened to a [`KeptRegistration`] after its first acknowledgement.
#[derive(Debug, Clone, PartialEq)]
pub enum RegistrationEvent {
    /// The stream ended; the instances are not registered until [`RegistrationEvent::Registered`].
    Lost { reason: String },
    /// An attempt to register again failed (rota unreachable, or it refused an instance, e.g.
    /// an id still held by a replica that has not yet expired); another follows after a wait.
    Retrying { error: String },
    /// Registered again on a new stream, every instance accepted.
    Registered { ack: pb::Ack },
}

/// Instances kept registered: heartbeats on one stream, and a new stream with the same
/// instances (and the updates accepted since) whenever one is lost (waits from 100 ms doubling
/// to 10 s, each between half and all of it). Dropping it ends the stream, which removes the
/// instances at once; [`KeptRegistration::close`] withdraws them explicitly first.
pub struct KeptRegistration {
    first_ack: pb::Ack,
    events: mpsc::Receiver<RegistrationEvent>,
    updates: mpsc::Sender<Pending>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Option<Result<pb::Ack, ClientError>>>,
}

/// An update waiting for the stream, with where its answer goes.
type Pending = (pb::Update, oneshot::Sender<Result<pb::Ack, ClientError>>);

impl KeptRegistration {
    /// Announces `instances` on a new stream; fails unless rota accepts every one of them.
    pub(super) async fn open(
        mut registry: RegistryClient<Channel>,
        token: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
        instances: Vec<pb::Instance>,
    ) -> Result<Self, ClientError> {
        let registration = open_all(&mut registry, token.clone(), instances.clone()).await?;
        let first_ack = registration.ack().clone();
        let (events_tx, events) = mpsc::channel(EVENTS_KEPT);
        let (updates, updates_rx) = mpsc::channel(1);
        let (stop, stopped) = oneshot::channel();
        let reopen = Reopen { registry, token, instances };
        let task = tokio::spawn(keep(registration, reopen, events_tx, updates_rx, stopped));
        Ok(Self { first_ack, events, updates, stop: Some(stop), task })
    }

    /// Changes one instance (weight, status, metadata) and waits for rota's acknowledgement; an
    /// accepted change is also part of every later announcement. While the registration is
    /// between streams the update fails with `UNAVAILABLE` and changes nothing.
    pub async fn update(&self, update: pb::Update) -> Result<pb::Ack, ClientError> {
        let gone = || ClientError::Closed("the registration has ended".into());
        let (reply, answer) = oneshot::channel();
        self.updates.send((update, reply)).await.map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }

    /// The acknowledgement of the first announcement.
    pub fn ack(&self) -> &pb::Ack {
        &self.first_ack
    }

    /// The next event, in order; `None` once the registration has ended.
    pub async fn next_event(&mut self) -> Option<RegistrationEvent> {
        self.events.recv().await
    }

    /// Withdraws the instances and ends the stream. Returns the withdrawal's acknowledgement,
    /// or `None` when the instances were not registered at that moment (a stream was lost and
    /// the next one not yet accepted).
    pub async fn close(mut self) -> Result<Option<pb::Ack>, ClientError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match (&mut self.task).await {
            Ok(withdrawn) => withdrawn.transpose(),
            Err(error) => Err(ClientError::Closed(format!("the registration task ended: {error}"))),
        }
    }
}

impl Drop for KeptRegistration {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a new stream needs.
struct Reopen {
    registry: RegistryClient<Channel>,
    token: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    instances: Vec<pb::Instance>,
}

/// A registration of `instances`, every one of them accepted (else none stays: the stream is
/// dropped).
async fn open_all(
    registry: &mut RegistryClient<Channel>,
    token: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    instances: Vec<pb::Instance>,
) -> Result<Registration, ClientError> {
    let registration = Registration::open(registry, token, instances).await?;
    registration.require_all_accepted()?;
    Ok(registration)
}

/// Keeps `registration` (and its successors) until `stop`, applying updates as they come;
/// returns the withdrawal's result, or `None` when stopped with no stream accepted.
async fn keep(
    mut registration: Registration,
    mut reopen: Reopen,
    events: mpsc::Sender<RegistrationEvent>,
    mut updates: mpsc::Receiver<Pending>,
    mut stop: oneshot::Receiver<()>,
) -> Option<Result<pb::Ack, ClientError>> {
    let mut rng = fastrand::Rng::new();
    loop {
        let reason = loop {
            let next = tokio::select! {
                _ = &mut stop => return Some(registration.close().await),
                reason = registration.closed() => Err(reason),
                Some(pending) = updates.recv() => Ok(pending),
            };
            match next {
                Ok((update, reply)) => {
                    let answer = apply(&mut registration, &mut reopen.instances, update).await;
                    let _ = reply.send(answer);
                }
                Err(reason) => break reason,
            }
        };
        let _ = events.try_send(RegistrationEvent::Lost { reason });
        let mut attempt = 0;
        registration = loop {
            // Updates asked for meanwhile are answered without cutting the wait short or
            // starting it again.
            let wait = tokio::time::sleep(backoff(attempt, &mut rng));
            tokio::pin!(wait);
            loop {
                tokio::select! {
                    _ = &mut stop => return None,
                    Some((_, reply)) = updates.recv() => {
                        let between = tonic::Status::unavailable("the registration is between streams; nothing was changed");
                        let _ = reply.send(Err(between.into()));
                    }
                    () = &mut wait => break,
                }
            }
            attempt = attempt.saturating_add(1);
            match open_all(&mut reopen.registry, reopen.token.clone(), reopen.instances.clone()).await {
                Ok(registration) => break registration,
                Err(error) => {
                    let _ = events.try_send(RegistrationEvent::Retrying { error: error.to_string() });
                }
            }
        };
        let _ = events.try_send(RegistrationEvent::Registered { ack: registration.ack().clone() });
    }
}

/// Sends `update` on the stream; when rota accepts it, `instances` (what later announcements
/// send) take it too. A refusal comes back as [`ClientError::Refused`].
async fn apply(
    registration: &mut Registration,
    instances: &mut [pb::Instance],
    update: pb::Update,
) -> Result<pb::Ack, ClientError> {
    let ack = registration.send(Msg::Update(update.clone())).await?;
    all_accepted(&ack)?;
    let target = update.instance.unwrap_or_default();
    let named =
        |i: &pb::Instance| if i.id.is_empty() { default_id(&i.host, i.port) == target.id } else { i.id == target.id };
    for instance in instances.iter_mut().filter(|i| i.service == target.service && named(i)) {
        if update.weight.is_some() {
            instance.weight = update.weight;
        }
        if update.status != pb::InstanceStatus::Unspecified as i32 {
            instance.status = update.status;
        }
        if let Some(metadata) = &update.metadata {
            instance.metadata = metadata.entries.clone();
        }
    }
    Ok(ack)
}
