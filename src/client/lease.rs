//! Picks from leased tickets: one round trip per block of K picks.
//!
//! A [`LeasedPicker`] asks rota for K consecutive tickets of a rotation together with the
//! eligible instances, then maps each ticket to an instance locally with the same rule code rota
//! runs (`round_robin`, `repeat`, `weighted`). Every ticket is used exactly once, so the
//! fleet-wide rotation stays exact while the consumer pays one round trip per K picks. When
//! [`follow_changes`](LeasedPicker::follow_changes) is on, a newer epoch seen on the service's
//! watch makes the picker fetch the current list (without reserving tickets) and map the rest of
//! its block onto it.

use std::sync::Arc;

use tokio::sync::watch;

use super::{ClientError, PickOptions, RotaClient};
use crate::grpc::convert;
use crate::pb;
use crate::registry::{Instance, Subset};
use crate::rules::Candidates;
use crate::rules::{Draw, Rule, Select};

/// One locally made pick.
#[derive(Debug, Clone)]
pub struct LocalPick {
    pub instance: Arc<Instance>,
    pub ticket: u64,
    pub rule: Arc<str>,
    pub epoch: u64,
}

struct Block {
    next: u64,
    end: u64,
    candidates: Candidates,
    rule: Rule,
    canonical: Arc<str>,
    epoch: u64,
}

pub struct LeasedPicker {
    client: RotaClient,
    service: String,
    options: PickOptions,
    block_size: u32,
    block: Option<Block>,
    epochs: Option<watch::Receiver<u64>>,
    rng: fastrand::Rng,
}

impl LeasedPicker {
    pub fn new(client: RotaClient, service: impl Into<String>, options: PickOptions, block_size: u32) -> Self {
        Self {
            client,
            service: service.into(),
            options,
            block_size: block_size.max(1),
            block: None,
            epochs: None,
            rng: fastrand::Rng::new(),
        }
    }

    /// Watches the service so that instance changes reach the current block.
    pub async fn follow_changes(&mut self) -> Result<(), ClientError> {
        let mut events = self.client.watch(&self.service).await?;
        let (tx, rx) = watch::channel(0u64);
        tokio::spawn(async move {
            while let Ok(Some(event)) = events.message().await {
                tx.send_replace(event.epoch);
            }
        });
        self.epochs = Some(rx);
        Ok(())
    }

    /// Waits until the followed watch has reported `epoch` (or later); returns false if the
    /// picker does not follow changes or its watch ended.
    pub async fn wait_for_epoch(&mut self, epoch: u64) -> bool {
        match &mut self.epochs {
            Some(epochs) => epochs.wait_for(|seen| *seen >= epoch).await.is_ok(),
            None => false,
        }
    }

    pub async fn pick(&mut self) -> Result<LocalPick, ClientError> {
        let stale = match (&self.block, &self.epochs) {
            (Some(block), Some(epochs)) => *epochs.borrow() > block.epoch,
            _ => false,
        };
        match &mut self.block {
            Some(block) if block.next < block.end => {
                if stale {
                    let fresh = self.lease(0).await?;
                    if let Some(block) = &mut self.block {
                        block.candidates = fresh.candidates;
                        block.epoch = fresh.epoch;
                    }
                }
            }
            _ => self.block = Some(self.lease(self.block_size).await?),
        }
        let block = self.block.as_mut().ok_or_else(|| ClientError::Closed("no lease".into()))?;
        let ticket = block.next;
        block.next += 1;
        let draw = Draw::new(&block.candidates, ticket);
        let choice = block
            .rule
            .select(&draw, &mut self.rng)
            .ok_or_else(|| ClientError::Closed(format!("{} chose no instance of the leased list", block.canonical)))?;
        Ok(LocalPick {
            instance: block.candidates.members()[choice.index].clone(),
            ticket,
            rule: block.canonical.clone(),
            epoch: block.epoch,
        })
    }

    async fn lease(&mut self, count: u32) -> Result<Block, ClientError> {
        let request = pb::LeaseRequest {
            service: self.service.clone(),
            rule: self.options.rule.clone(),
            version: self.options.version.clone(),
            count,
            exclude: Vec::new(),
        };
        let request = self.client.request(request);
        let leased = self.client.balancer().lease(request).await?.into_inner();
        let mut members = Vec::with_capacity(leased.instances.len());
        for (i, instance) in leased.instances.into_iter().enumerate() {
            let spec = convert::instance_spec(instance);
            let instance =
                spec.validate(&format!("lease.instances[{i}]")).map_err(|e| ClientError::Closed(e.to_string()))?;
            members.push(Arc::new(instance));
        }
        let rule = crate::rules::parse(&leased.rule).map_err(|e| ClientError::Closed(e.to_string()))?.rule;
        let candidates = Candidates::new(Subset::new("lease", members));
        candidates.build(rule.needs());
        Ok(Block {
            next: leased.first_ticket,
            end: leased.first_ticket + u64::from(leased.count),
            candidates,
            rule,
            canonical: leased.rule.into(),
            epoch: leased.epoch,
        })
    }
}
