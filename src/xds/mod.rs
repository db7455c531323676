//! xDS: rota's routing for every gRPC client that speaks the xDS protocol (gRFC A27), with no
//! rota library.
//!
//! rota serves the Aggregated Discovery Service (state of the world, v3 resources) on its gRPC
//! listener. A client dials `xds:///SERVICE` with a bootstrap naming rota, subscribes to the
//! service's Listener, RouteConfiguration, Clusters and ClusterLoadAssignments, and balances
//! locally over what rota says: [`resources`] turns a published service (version isolation,
//! gray release, instance status and ejections) into those resources, [`hub`] builds them once
//! per change for every stream, and [`stream`] is one client's subscriptions. The tonic service
//! is at the gRPC edge (`grpc::xds`); docs/xds.md says what each rule becomes.

pub mod hub;
pub mod resources;
pub mod stream;

pub use hub::{Hub, XdsCounters, XdsLimits};
pub use stream::{Session, StreamRefused};
