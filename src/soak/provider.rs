//! One churning provider of the churn scenario: a registration stream on its own connection
//! that announces, re-weighs, drains, revives and withdraws the instances it owns, and now and
//! then drops the whole connection without a word and comes back on a new one.
//!
//! Every change is recorded per instance with its send and ack times. An abrupt close has no
//! ack, so the provider lists the services from a second connection until the closed
//! instances are gone, and records that moment as the close's "ack"; it announces them again
//! only then, because rota refuses an id another (even dying) stream still owns.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::history::{Change, Event, Universe};
use super::{Clock, SoakError, bounded};
use crate::client::{Registration, RotaClient};
use crate::pb::{self, register_request::Msg};

/// The longest a closed stream's instances may take to leave the listing.
const CLOSE_PATIENCE: Duration = Duration::from_secs(10);

/// One instance this provider owns.
#[derive(Debug, Clone)]
pub struct Owned {
    pub service: String,
    pub id: String,
    pub version: String,
    present: bool,
    up: bool,
}

impl Owned {
    pub fn new(service: &str, id: &str, version: &str) -> Self {
        Self { service: service.into(), id: id.into(), version: version.into(), present: false, up: false }
    }

    fn instance(&self, up: bool) -> pb::Instance {
        let status = if up { pb::InstanceStatus::Up } else { pb::InstanceStatus::Draining };
        pb::Instance {
            id: self.id.clone(),
            service: self.service.clone(),
            host: "127.0.0.1".into(),
            port: 20_000,
            version: self.version.clone(),
            status: status as i32,
            ..Default::default()
        }
    }

    fn reference(&self) -> pb::InstanceRef {
        pb::InstanceRef { service: self.service.clone(), id: self.id.clone() }
    }
}

/// What a provider did.
#[derive(Debug, Default)]
pub struct ProviderLog {
    pub events: Vec<Event>,
    pub closes: u64,
    /// Refused changes, described.
    pub refusals: Vec<String>,
    /// Closed stream whose instances were still listed after [`CLOSE_PATIENCE`].
    pub slow_closes: Vec<String>,
}

pub struct Provider {
    pub endpoint: String,
    pub universe: Arc<Universe>,
    pub owned: Vec<Owned>,
    pub clock: Clock,
    pub seed: u64,
    /// Pause between changes, drawn uniformly in this range of milliseconds.
    pub pace_ms: (u64, u64),
    pub until: Instant,
    pub max_changes: u64,
}

impl Provider {
    pub async fn run(mut self) -> Result<ProviderLog, SoakError> {
        let mut rng = fastrand::Rng::with_seed(self.seed);
        let mut log = ProviderLog::default();
        let mut observer = bounded("connect", RotaClient::connect(&self.endpoint)).await?;
        let mut stream = self.open(&mut rng, &mut log).await?;
        let mut changes = 0;
        while Instant::now() < self.until && changes < self.max_changes {
            tokio::time::sleep(Duration::from_millis(rng.u64(self.pace_ms.0..=self.pace_ms.1))).await;
            changes += 1;
            let Some(registration) = stream.as_mut() else { break };
            match rng.u32(0..100) {
                0..40 => self.announce(registration, &mut rng, &mut log).await?,
                40..55 => self.update(registration, &mut rng, &mut log, false).await?,
                55..75 => self.update(registration, &mut rng, &mut log, true).await?,
                75..97 => self.withdraw(registration, &mut rng, &mut log).await?,
                _ => {
                    let closed = stream.take().expect("open");
                    self.close(closed, &mut observer, &mut log).await?;
                    stream = self.open(&mut rng, &mut log).await?;
                }
            }
        }
        if let Some(registration) = stream {
            // The run's end: the stream closes like any other, and its close is recorded the
            // same way, so picks racing the end are judged fairly.
            self.close(registration, &mut observer, &mut log).await?;
        }
        Ok(log)
    }

    /// A new connection and stream, announcing a random part of what this provider owns (at
    /// least one instance: a stream is opened by an announcement); `None` once it owns none.
    async fn open(
        &mut self,
        rng: &mut fastrand::Rng,
        log: &mut ProviderLog,
    ) -> Result<Option<Registration>, SoakError> {
        if self.owned.is_empty() {
            return Ok(None);
        }
        let first = rng.usize(0..self.owned.len());
        let chosen: Vec<usize> =
            (0..self.owned.len()).filter(|&i| i == first || (!self.owned[i].present && rng.bool())).collect();
        let instances = chosen.iter().map(|&i| self.owned[i].instance(true)).collect();
        let mut client = bounded("connect", RotaClient::connect(&self.endpoint)).await?;
        let send = self.clock.now();
        let registration = bounded("open a registration stream", client.register(instances)).await?;
        let ack = self.clock.now();
        let accepted = registration.ack().clone();
        for i in chosen {
            self.record(i, Change::Announce { version: 0, up: true }, send, ack, &accepted, log);
        }
        Ok(Some(registration))
    }

    async fn announce(
        &mut self,
        registration: &mut Registration,
        rng: &mut fastrand::Rng,
        log: &mut ProviderLog,
    ) -> Result<(), SoakError> {
        let absent: Vec<usize> = (0..self.owned.len()).filter(|&i| !self.owned[i].present).collect();
        if absent.is_empty() {
            return Ok(());
        }
        let mut chosen: Vec<usize> = (0..rng.usize(1..=2)).map(|_| absent[rng.usize(0..absent.len())]).collect();
        chosen.sort_unstable();
        chosen.dedup();
        // One in ten arrives already draining.
        let up = rng.u32(0..10) != 0;
        let instances = chosen.iter().map(|&i| self.owned[i].instance(up)).collect();
        let send = self.clock.now();
        let ack = bounded("announce", registration.send(Msg::Announce(pb::Announce { instances }))).await?;
        let at = self.clock.now();
        for i in chosen {
            self.record(i, Change::Announce { version: 0, up }, send, at, &ack, log);
        }
        Ok(())
    }

    /// An Update of one present instance: its status flipped (UP ⇄ DRAINING, sometimes DOWN)
    /// when `status`, else its weight.
    async fn update(
        &mut self,
        registration: &mut Registration,
        rng: &mut fastrand::Rng,
        log: &mut ProviderLog,
        status: bool,
    ) -> Result<(), SoakError> {
        let present: Vec<usize> = (0..self.owned.len()).filter(|&i| self.owned[i].present).collect();
        if present.is_empty() {
            return Ok(());
        }
        let i = present[rng.usize(0..present.len())];
        let mut update = pb::Update { instance: Some(self.owned[i].reference()), ..Default::default() };
        let up = if status {
            let up = !self.owned[i].up;
            let down = if rng.u32(0..4) == 0 { pb::InstanceStatus::Down } else { pb::InstanceStatus::Draining };
            update.status = if up { pb::InstanceStatus::Up } else { down } as i32;
            Some(up)
        } else {
            update.weight = Some(rng.u32(1..=200));
            None
        };
        let send = self.clock.now();
        let ack = bounded("update", registration.send(Msg::Update(update))).await?;
        let at = self.clock.now();
        self.record(i, Change::Update { up }, send, at, &ack, log);
        Ok(())
    }

    async fn withdraw(
        &mut self,
        registration: &mut Registration,
        rng: &mut fastrand::Rng,
        log: &mut ProviderLog,
    ) -> Result<(), SoakError> {
        let mut present: Vec<usize> = (0..self.owned.len()).filter(|&i| self.owned[i].present).collect();
        // One or two at a time, at random; a stream left holding nothing stays open and
        // announces again later.
        rng.shuffle(&mut present);
        present.truncate(rng.usize(1..=2));
        if present.is_empty() {
            return Ok(());
        }
        let refs = present.iter().map(|&i| self.owned[i].reference()).collect();
        let send = self.clock.now();
        let ack = bounded("withdraw", registration.send(Msg::Withdraw(pb::Withdraw { instances: refs }))).await?;
        let at = self.clock.now();
        for i in present {
            self.record(i, Change::Withdraw, send, at, &ack, log);
        }
        Ok(())
    }

    /// Drops the stream and its connection unannounced, then waits until a listing shows
    /// every instance it held gone.
    async fn close(
        &mut self,
        registration: Registration,
        observer: &mut RotaClient,
        log: &mut ProviderLog,
    ) -> Result<(), SoakError> {
        let held: Vec<usize> = (0..self.owned.len()).filter(|&i| self.owned[i].present).collect();
        let send = self.clock.now();
        drop(registration);
        log.closes += 1;
        let deadline = Instant::now() + CLOSE_PATIENCE;
        let mut services: Vec<&str> = held.iter().map(|&i| self.owned[i].service.as_str()).collect();
        services.sort_unstable();
        services.dedup();
        loop {
            let mut still = Vec::new();
            for service in &services {
                let listed = bounded("list instances", observer.list_instances(service)).await?.instances;
                still.extend(listed.into_iter().filter(|l| held.iter().any(|&i| self.owned[i].id == l.id)));
            }
            let at = self.clock.now();
            if still.is_empty() || Instant::now() >= deadline {
                if !still.is_empty() {
                    let ids: Vec<&str> = still.iter().map(|s| s.id.as_str()).collect();
                    log.slow_closes.push(format!("{ids:?} still listed 10 s after their stream closed"));
                }
                for &i in &held {
                    let owned = &mut self.owned[i];
                    let lingering = still.iter().any(|s| s.id == owned.id);
                    // One not seen gone stays possibly live for the rest of the run.
                    let ack = if lingering { super::history::Nanos::MAX } else { at };
                    let instance = self.universe.find_instance(&owned.service, &owned.id);
                    let instance = instance.expect("owned instances are in the universe");
                    log.events.push(Event { send, ack, instance, change: Change::Close, accepted: true });
                    (owned.present, owned.up) = (false, false);
                }
                // A lingering id would be refused to a new stream: it is not used again.
                self.owned.retain(|o| !still.iter().any(|s| s.id == o.id && s.service == o.service));
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// Records one change of owned instance `i` and applies it when the ack accepted it.
    fn record(&mut self, i: usize, change: Change, send: u64, ack: u64, answer: &pb::Ack, log: &mut ProviderLog) {
        let owned = &mut self.owned[i];
        let accepted = answer.accepted.iter().any(|r| r.service == owned.service && r.id == owned.id);
        if !accepted {
            let why = answer.refused.first().map_or("not in the ack", |r| r.message.as_str());
            log.refusals.push(format!("{change:?} of {}/{}: {why}", owned.service, owned.id));
        }
        let change = match change {
            Change::Announce { up, .. } => Change::Announce { version: self.universe.find_version(&owned.version), up },
            other => other,
        };
        if accepted {
            match change {
                Change::Announce { up, .. } => (owned.present, owned.up) = (true, up),
                Change::Update { up: Some(up) } => owned.up = up,
                Change::Update { up: None } => {}
                Change::Withdraw | Change::Close => (owned.present, owned.up) = (false, false),
            }
        }
        let instance = self.universe.find_instance(&owned.service, &owned.id).expect("owned instances are known");
        log.events.push(Event { send, ack, instance, change, accepted });
    }
}
