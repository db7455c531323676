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
//! - [`rules`] — filters (version isolation, exclude) and selectors (round robin, repeat,
//!   weighted, response time, least request, consistent hash, ...), one file each, as pure
//!   functions over a snapshot subset, a ticket and a read-only view of instance load.
//! - [`load`] — what rota knows of each instance's load (picks in flight, latency, outcomes,
//!   breaker, ejection), merged with the other replicas', and the per-subset index
//!   load-aware rules read.
//! - [`state`] — rule state shared by all consumers: rotation counters and sticky
//!   assignments; in this process, or in Redis for several replicas.
//! - [`replicas`] — several rota servers acting as one through Redis: each shares its
//!   registration streams' instances, its statistics and its runtime policies with the others.
//! - [`policy`] — per-service policies (default rule, isolation fallback, gray release,
//!   breaker settings): the config file's layer and runtime overrides from the `Policies` RPCs,
//!   kept by one writer and published merged, swapped atomically.
//! - [`balancer`] — the pick path that ties them together, and call-outcome reports.
//! - [`budget`] — memory held for outside parties, charged to a per-address share and a
//!   server-wide limit before it is allocated.
//! - [`overload`] — what rota stops doing when its resident memory nears a configured limit.
//! - [`grpc`] — the only layer that knows tonic: protobuf ⇄ domain conversion, errors ⇄
//!   `Status`, the `rota.v1` services, health and reflection.
//! - [`admin`] — the operators' HTTP listener: Prometheus metrics, health, a JSON API and a
//!   live dashboard (axum; reads what the layers above publish, changes nothing).
//! - [`config`] — the server's settings: file < environment < flags, validated before binding.
//! - [`duration`] — the one parser of durations (`500ms`, `1h 30m`) for settings, policies,
//!   rule parameters and flags.
//! - [`listener`] — the gRPC listener's front door: connection caps per peer and in total,
//!   handshake and idle timeouts, `TCP_NODELAY` on every socket.
//! - [`http1`] — one HTTP/1.1 connection to an address rota was given, for the sources and
//!   the health checks.
//! - [`tls`] — TLS and mTLS on the gRPC listener (rustls), certificates reloaded on change.
//! - [`tls_refusal`] — why the TLS listener refused a connection: rate-limited log lines, and a
//!   GOAWAY that tells a plaintext HTTP/2 client to use `https://`.
//! - [`xds`] — the xDS resources (listeners, routes, clusters, endpoints) of every service, for
//!   the standard xDS clients of gRPC; served over ADS at the gRPC edge.
//! - [`server`] — builds all of the above and serves it on a socket until told to stop.
//! - [`loadgen`] — the load generator behind `rota bench`.
//! - [`client`] — a Rust client for the same API, used by the CLI and the tests.
//! - [`cli`] — the `rota` command (`serve`, `pick`, `register`, `ls`, `watch`, `demo`).
//!
//! No layer below [`grpc`] depends on tonic, and each has one error enum of its own.

pub mod admin;
pub mod auth;
pub mod balancer;
pub mod budget;
pub mod cli;
pub mod client;
pub mod config;
pub mod duration;
pub mod grpc;
pub mod hash;
pub mod health;
pub mod http1;
pub mod listener;
pub mod load;
pub mod loadgen;
pub mod overload;
pub mod policy;
pub mod registry;
pub mod replicas;
pub mod rules;
pub mod server;
pub mod soak;
pub mod sources;
pub mod state;
pub mod tls;
pub mod tls_refusal;
pub mod xds;

/// Generated protobuf types and gRPC stubs for package `rota.v1`.
pub mod pb {
    #![allow(clippy::all, missing_docs)]
    tonic::include_proto!("rota.v1");

    /// Encoded descriptors of `rota.v1`, served by reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("rota_descriptor");
}
