//! A registration stream's handle on the registry.
//!
//! A [`Lease`] owns the instances its stream announced. Every message sent through it counts as
//! a heartbeat; dropping it (the stream ended, cleanly or not) removes its instances at once.
//! Input is validated here, in the stream's own task, so the single registry task only applies
//! changes that are already known to be well-formed.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::command::{Command, InstanceRef, InstanceUpdate, LeaseId, Outcome, ValidUpdate};
use super::error::{InvalidField, Refused, RegistryClosed};
use super::instance::{Instance, InstanceSpec, default_id, validate_metadata, validate_service_name};

/// Where ids are claimed across rota replicas, so that one id has one owner fleet-wide: a
/// registration stream's announce asks it before the registry applies the instances.
pub trait Claims: Send + Sync {
    /// Claims `instances` (all of `service`) for this replica: one answer each, in order.
    fn claim<'a>(
        &'a self,
        service: &'a str,
        instances: &'a [&'a Instance],
    ) -> Pin<Box<dyn Future<Output = Vec<Claim>> + Send + 'a>>;
    /// Gives back ids [`Claim::New`] answered for that the registry then refused.
    fn release(&self, service: &str, ids: Vec<Arc<str>>);
}

/// One id's claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Now held by this replica.
    New,
    /// Already held by this replica.
    Held,
    /// Not checked (the shared state is unreachable): this replica decides alone.
    Unchecked,
    /// Held by the named replica.
    Elsewhere(String),
}

/// The claims a lease asks, set once the replicas share their table.
pub(crate) type ClaimsSlot = Arc<OnceLock<Arc<dyn Claims>>>;

/// The id prefixes kept for the sources rota follows (`NAME:` for each), which a registration
/// stream may not announce.
pub(crate) type ReservedPrefixes = Arc<std::sync::RwLock<Vec<Arc<str>>>>;

/// Who holds a lease, and so what its announcements may do.
#[derive(Clone)]
pub(crate) enum Holder {
    /// A registration stream: claims its ids across replicas, may not use a source's prefix.
    Stream { claims: ClaimsSlot, reserved: ReservedPrefixes },
    /// The registry's copy of another replica's instances.
    Mirror,
    /// A source rota follows: its instances are marked with its name.
    Source(Arc<str>),
}

pub struct Lease {
    id: LeaseId,
    holder: Holder,
    tx: mpsc::UnboundedSender<Command>,
    expired: Option<oneshot::Receiver<()>>,
    heartbeat_timeout: Duration,
    max_instances: usize,
    /// The registry's count of open leases, decremented on drop.
    open_leases: Arc<AtomicUsize>,
}

impl Lease {
    pub(crate) fn open(
        id: LeaseId,
        holder: Holder,
        token: Option<Arc<str>>,
        tx: mpsc::UnboundedSender<Command>,
        heartbeat_timeout: Duration,
        max_instances: usize,
        open_leases: Arc<AtomicUsize>,
    ) -> Self {
        let (expired_tx, expired) = oneshot::channel();
        // A source's lease lives as long as its task, which drops it on stopping.
        let expires = !matches!(holder, Holder::Source(_));
        // If the registry has stopped, `expired` resolves at once and the stream ends.
        let _ = tx.send(Command::Open { lease: id, token, limit: max_instances, expires, expired: expired_tx });
        open_leases.fetch_add(1, Ordering::Relaxed);
        Self { id, holder, tx, expired: Some(expired), heartbeat_timeout, max_instances, open_leases }
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn heartbeat_timeout(&self) -> Duration {
        self.heartbeat_timeout
    }

    /// Adds (or, for ids this lease owns, replaces) instances.
    pub async fn announce(&self, specs: Vec<InstanceSpec>) -> Result<Outcome, RegistryClosed> {
        let mut outcome = Outcome::default();
        if specs.is_empty() {
            let problem = InvalidField::new("announce.instances", "must name at least one instance");
            outcome.refused.push((InstanceRef::default(), problem.into()));
            self.touch();
            return Ok(outcome);
        }
        if specs.len() > self.max_instances {
            let why = Refused::TooManyInstances { count: specs.len(), limit: self.max_instances };
            outcome.refused = specs.iter().map(|s| (raw_ref(s), why.clone())).collect();
            self.touch();
            return Ok(outcome);
        }
        let mut valid = Vec::with_capacity(specs.len());
        for (i, spec) in specs.into_iter().enumerate() {
            let reference = raw_ref(&spec);
            let field = format!("announce.instances[{i}]");
            match spec.validate(&field).and_then(|instance| self.stamp(instance, &field)) {
                Ok(instance) => valid.push(instance),
                Err(problem) => outcome.refused.push((reference, problem.into())),
            }
        }
        let claims = match &self.holder {
            Holder::Stream { claims, .. } => claims.get().cloned(),
            Holder::Mirror | Holder::Source(_) => None,
        };
        let mut claimed = Vec::new();
        if let Some(claims) = &claims {
            (valid, claimed) = claim(&**claims, valid, &mut outcome).await;
        }
        if valid.is_empty() {
            self.touch();
            return Ok(outcome);
        }
        let applied = self.call(|reply| Command::Announce { lease: self.id, instances: valid, reply }).await?;
        if let Some(claims) = &claims {
            // Ids claimed for this announce but refused here are given back.
            let mut given_back: BTreeMap<Arc<str>, Vec<Arc<str>>> = BTreeMap::new();
            for (instance, _) in &applied.refused {
                if let Some(i) =
                    claimed.iter().position(|c: &Instance| *c.service == instance.service && *c.id == instance.id)
                {
                    let c = claimed.swap_remove(i);
                    given_back.entry(c.service).or_default().push(c.id);
                }
            }
            for (service, ids) in given_back {
                claims.release(&service, ids);
            }
        }
        outcome.accepted = applied.accepted;
        outcome.refused.extend(applied.refused);
        Ok(outcome)
    }

    /// Marks a source's instance with its name; refuses a stream's id in a source's namespace.
    fn stamp(&self, mut instance: Instance, field: &str) -> Result<Instance, InvalidField> {
        match &self.holder {
            Holder::Source(name) => instance.source = Some(name.clone()),
            Holder::Stream { reserved, .. } => {
                let reserved = reserved.read().unwrap_or_else(|poisoned| poisoned.into_inner());
                if let Some(prefix) = reserved.iter().find(|prefix| instance.id.starts_with(&***prefix)) {
                    let source = &prefix[..prefix.len() - 1];
                    return Err(InvalidField::new(
                        format!("{field}.id"),
                        format!("starts with {prefix:?}, which is kept for the instances of source {source:?}"),
                    ));
                }
            }
            Holder::Mirror => {}
        }
        Ok(instance)
    }

    pub async fn update(&self, update: InstanceUpdate) -> Result<Outcome, RegistryClosed> {
        let target = InstanceRef { service: update.service.clone(), id: update.id.clone() };
        let update = match validate_update(update) {
            Ok(update) => update,
            Err(problem) => {
                self.touch();
                return Ok(Outcome { accepted: Vec::new(), refused: vec![(target, problem.into())] });
            }
        };
        self.call(|reply| Command::Update { lease: self.id, update, reply }).await
    }

    /// Removes the named instances, or every instance of this lease when `refs` is empty.
    pub async fn withdraw(&self, refs: Vec<InstanceRef>) -> Result<Outcome, RegistryClosed> {
        self.call(|reply| Command::Withdraw { lease: self.id, refs, reply }).await
    }

    /// Records that the stream is alive.
    pub fn touch(&self) {
        let _ = self.tx.send(Command::Touch { lease: self.id });
    }

    /// A future that resolves when the registry expires this lease (no message within the
    /// heartbeat timeout) or stops. Taken once; later calls return a future that never resolves.
    pub fn take_expiry(&mut self) -> impl Future<Output = ()> + Send + 'static {
        let expired = self.expired.take();
        async move {
            match expired {
                Some(expired) => {
                    let _ = expired.await;
                }
                None => std::future::pending().await,
            }
        }
    }

    async fn call(&self, command: impl FnOnce(oneshot::Sender<Outcome>) -> Command) -> Result<Outcome, RegistryClosed> {
        let (reply, answer) = oneshot::channel();
        self.tx.send(command(reply)).map_err(|_| RegistryClosed)?;
        answer.await.map_err(|_| RegistryClosed)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let _ = self.tx.send(Command::Close { lease: self.id });
        self.open_leases.fetch_sub(1, Ordering::Relaxed);
    }
}

fn validate_update(update: InstanceUpdate) -> Result<ValidUpdate, InvalidField> {
    validate_service_name("update.instance.service", &update.service)?;
    if update.id.is_empty() {
        return Err(InvalidField::new("update.instance.id", "must not be empty"));
    }
    if let Some(metadata) = &update.metadata {
        validate_metadata("update.metadata", metadata)?;
    }
    let status = update.status.validate("update.status")?;
    Ok(ValidUpdate { service: update.service, id: update.id, weight: update.weight, status, metadata: update.metadata })
}

/// Asks `claims` for the ids of `valid`, per service: those another replica holds are refused
/// into `outcome`. Returns the instances left, and those newly claimed.
async fn claim(claims: &dyn Claims, valid: Vec<Instance>, outcome: &mut Outcome) -> (Vec<Instance>, Vec<Instance>) {
    let mut answers = vec![Claim::Unchecked; valid.len()];
    let mut groups: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, instance) in valid.iter().enumerate() {
        groups.entry(&instance.service).or_default().push(i);
    }
    for (service, positions) in groups {
        let members: Vec<&Instance> = positions.iter().map(|&i| &valid[i]).collect();
        let got = claims.claim(service, &members).await;
        for (answer, &i) in got.into_iter().zip(&positions) {
            answers[i] = answer;
        }
    }
    let (mut kept, mut new) = (Vec::with_capacity(valid.len()), Vec::new());
    for (instance, answer) in valid.into_iter().zip(answers) {
        match answer {
            Claim::Elsewhere(replica) => {
                let reference = InstanceRef { service: instance.service.to_string(), id: instance.id.to_string() };
                let why = Refused::HeldByReplica { service: instance.service, id: instance.id, replica };
                outcome.refused.push((reference, why));
            }
            Claim::New => {
                new.push(instance.clone());
                kept.push(instance);
            }
            Claim::Held | Claim::Unchecked => kept.push(instance),
        }
    }
    (kept, new)
}

fn raw_ref(spec: &InstanceSpec) -> InstanceRef {
    let id =
        if spec.id.is_empty() && !spec.host.is_empty() { default_id(&spec.host, spec.port) } else { spec.id.clone() };
    InstanceRef { service: spec.service.clone(), id }
}
