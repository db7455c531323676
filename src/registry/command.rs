//! What a registration stream's [`Lease`](super::Lease) asks of the registry task, and what it
//! answers: the messages between the two sides, kept apart from both.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::{oneshot, watch};

use super::error::Refused;
use super::instance::{Instance, RequestedStatus, Status};
use super::snapshot::ServiceSnapshot;

/// Names one lease (one registration stream, or one copy of another replica's instances).
pub(crate) type LeaseId = u64;

/// One request to the registry task.
pub(crate) enum Command {
    /// `expires`: the lease is dropped after a heartbeat timeout without a message.
    Open {
        lease: LeaseId,
        token: Option<Arc<str>>,
        limit: usize,
        expires: bool,
        expired: oneshot::Sender<()>,
    },
    Announce {
        lease: LeaseId,
        instances: Vec<Instance>,
        reply: oneshot::Sender<Outcome>,
    },
    Update {
        lease: LeaseId,
        update: ValidUpdate,
        reply: oneshot::Sender<Outcome>,
    },
    Withdraw {
        lease: LeaseId,
        refs: Vec<InstanceRef>,
        reply: oneshot::Sender<Outcome>,
    },
    Touch {
        lease: LeaseId,
    },
    Close {
        lease: LeaseId,
    },
    Subscribe {
        service: Arc<str>,
        reply: oneshot::Sender<watch::Receiver<Arc<ServiceSnapshot>>>,
    },
    /// An operator's change to an instance's override: the override now, and whether the
    /// instance is registered.
    ChangeOverride {
        service: Arc<str>,
        id: Arc<str>,
        change: super::layers::OverrideChange,
        reply: oneshot::Sender<Result<(super::layers::Override, bool), super::layers::OverrideRefused>>,
    },
    /// Replaces every operator override (the replicas' shared layer); not told to the feed.
    ReplaceOverrides {
        all: super::layers::OverrideList,
    },
    /// Every operator override.
    ListOverrides {
        reply: oneshot::Sender<super::layers::OverrideList>,
    },
    /// The active health check's verdict on a registered instance (`None`: no verdict).
    SetHealth {
        service: Arc<str>,
        id: Arc<str>,
        health: Option<super::layers::Health>,
    },
}

/// Names one instance of one service, as the provider sent it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstanceRef {
    pub service: String,
    pub id: String,
}

/// A change to one owned instance; `None` keeps the current value.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InstanceUpdate {
    pub service: String,
    pub id: String,
    pub weight: Option<u32>,
    pub status: RequestedStatus,
    pub metadata: Option<BTreeMap<String, String>>,
}

/// An update after validation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ValidUpdate {
    pub service: String,
    pub id: String,
    pub weight: Option<u32>,
    pub status: Option<Status>,
    pub metadata: Option<BTreeMap<String, String>>,
}

/// What happened to each instance a message named. A refused instance is left untouched.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    pub accepted: Vec<InstanceRef>,
    pub refused: Vec<(InstanceRef, Refused)>,
}
