//! A provider's registration stream, kept alive by heartbeats.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

use super::ClientError;
use crate::pb::registry_client::RegistryClient;
use crate::pb::{self, register_request::Msg, register_response};

/// Heartbeats go out at this fraction of the server's timeout, so two may be lost in a row.
const HEARTBEATS_PER_TIMEOUT: u32 = 3;

/// An open registration. Dropping it ends the stream, which removes its instances at once;
/// [`Registration::close`] withdraws explicitly first and waits for the acknowledgement.
pub struct Registration {
    outbound: mpsc::Sender<pb::RegisterRequest>,
    inbound: tonic::Streaming<pb::RegisterResponse>,
    first_ack: pb::Ack,
    heartbeat: JoinHandle<()>,
}

impl Registration {
    pub(super) async fn open(
        client: &mut RegistryClient<Channel>,
        token: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
        instances: Vec<pb::Instance>,
    ) -> Result<Self, ClientError> {
        let (outbound, rx) = mpsc::channel(16);
        let announce = pb::RegisterRequest { msg: Some(Msg::Announce(pb::Announce { instances })) };
        outbound.send(announce).await.map_err(|_| ClientError::Closed("before announcing".into()))?;
        let mut request = tonic::Request::new(ReceiverStream::new(rx));
        if let Some(token) = token {
            request.metadata_mut().insert("authorization", token);
        }
        let mut inbound = client.register(request).await?.into_inner();
        let first_ack = next_ack(&mut inbound).await?;
        let interval = Duration::from_millis(first_ack.heartbeat_timeout_ms.max(300)) / HEARTBEATS_PER_TIMEOUT;
        let heartbeat = tokio::spawn(heartbeats(outbound.clone(), interval));
        Ok(Self { outbound, inbound, first_ack, heartbeat })
    }

    /// The acknowledgement of the initial announcement: accepted and refused instances.
    pub fn ack(&self) -> &pb::Ack {
        &self.first_ack
    }

    /// Fails unless every announced instance was accepted.
    pub fn require_all_accepted(&self) -> Result<(), ClientError> {
        all_accepted(&self.first_ack)
    }

    /// Sends one message and waits for its acknowledgement.
    pub async fn send(&mut self, msg: Msg) -> Result<pb::Ack, ClientError> {
        self.outbound
            .send(pb::RegisterRequest { msg: Some(msg) })
            .await
            .map_err(|_| ClientError::Closed("stream already ended".into()))?;
        next_ack(&mut self.inbound).await
    }

    /// Resolves when the server ends the stream, with its reason (for example a `Closing`
    /// sent when rota shuts down). Acks arriving meanwhile are discarded.
    pub async fn closed(&mut self) -> String {
        loop {
            match self.inbound.message().await {
                Ok(Some(pb::RegisterResponse { msg: Some(register_response::Msg::Closing(closing)) })) => {
                    return closing.reason;
                }
                Ok(Some(_)) => continue,
                Ok(None) => return "stream ended".into(),
                Err(status) => return status.message().to_owned(),
            }
        }
    }

    /// Withdraws every instance of this registration and closes the stream.
    pub async fn close(mut self) -> Result<pb::Ack, ClientError> {
        let ack = self.send(Msg::Withdraw(pb::Withdraw { instances: Vec::new() })).await;
        self.heartbeat.abort();
        ack
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.heartbeat.abort();
    }
}

/// The first refusal in `ack` as an error; `Ok` when it refused nothing.
pub(super) fn all_accepted(ack: &pb::Ack) -> Result<(), ClientError> {
    match ack.refused.first() {
        None => Ok(()),
        Some(refusal) => {
            Err(ClientError::Refused { code: tonic::Code::from_i32(refusal.code), message: refusal.message.clone() })
        }
    }
}

async fn next_ack(inbound: &mut tonic::Streaming<pb::RegisterResponse>) -> Result<pb::Ack, ClientError> {
    match inbound.message().await? {
        Some(pb::RegisterResponse { msg: Some(register_response::Msg::Ack(ack)) }) => Ok(ack),
        Some(pb::RegisterResponse { msg: Some(register_response::Msg::Closing(closing)) }) => {
            Err(ClientError::Closed(closing.reason))
        }
        Some(pb::RegisterResponse { msg: None }) => Err(ClientError::Closed("empty response".into())),
        None => Err(ClientError::Closed("stream ended".into())),
    }
}

async fn heartbeats(outbound: mpsc::Sender<pb::RegisterRequest>, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let heartbeat = pb::RegisterRequest { msg: Some(Msg::Heartbeat(pb::Heartbeat {})) };
        if outbound.send(heartbeat).await.is_err() {
            return;
        }
    }
}
