//! rota — a central load-balancing decision service.
//!
//! Providers register their instances over a long-lived gRPC stream; consumers in any language
//! call `Pick(service, rule, version, key)` and get one instance back. The rule state (rotation
//! counters) lives here rather than in each consumer, so every consumer shares one rotation.
//!
//! # Layout
//!
//! - [`registry`] — the live instance table: one task owns the index, streams send it changes
//!   through [`registry::Lease`]s, and it publishes immutable per-service snapshots.
//! - [`rules`] — filters (version isolation, exclude) and selectors (`round_robin`, `random`,
//!   `repeat`), one file each, as pure functions over a snapshot and a ticket.
//! - [`state`] — rule state shared by all consumers (rotation counters), behind a backend enum.
//! - [`balancer`] — the pick path that ties the three together.
//! - [`grpc`] — the only layer that knows tonic: protobuf ⇄ domain conversion, errors ⇄
//!   `Status`, the `rota.v1` services, health and reflection.
//! - [`server`] — builds all of the above and serves it on a socket until told to stop.
//! - [`client`] — a Rust client for the same API, used by the CLI and the tests.
//! - [`cli`] — the `rota` command (`serve`, `pick`, `register`, `ls`, `watch`, `demo`).
//!
//! No layer below [`grpc`] depends on tonic, and each has one error enum of its own.

pub mod balancer;
pub mod cli;
pub mod client;
pub mod grpc;
pub mod registry;
pub mod rules;
pub mod server;
pub mod state;

/// Generated protobuf types and gRPC stubs for package `rota.v1`.
pub mod pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("rota.v1");

    /// Encoded descriptors of `rota.v1`, served by reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("rota_descriptor");
}
