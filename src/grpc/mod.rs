//! The gRPC edge: the only module that knows tonic.
//!
//! [`convert`] turns protobuf messages into domain values and back, [`status`] maps every domain
//! error to its `tonic::Status` code, and the service modules implement `rota.v1.Balancer`,
//! `rota.v1.Registry` and `rota.v1.Policies` on top of [`crate::balancer`] and
//! [`crate::registry`], and xDS ADS on top of [`crate::xds`]. [`metrics`] is the tower layer
//! that counts every call for the admin listener, and [`answers`] the one that counts the bytes of
//! answers clients have not read yet. [`pick_wire`] serves the unary Pick without protobuf's
//! per-field work: the request read in place, the answer copied from bytes encoded at publish; and
//! [`watch_wire`] serves `Watch` with its first event encoded once per change, shared by every
//! watch. [`routes`] is how each of them takes its one path from the generated server.

pub mod answers;
pub mod auth;
mod balancer;
pub mod convert;
pub mod metrics;
pub mod peers;
pub mod pick_wire;
mod policies;
mod register;
mod registry;
pub mod routes;
pub mod status;
pub mod streams;
pub mod warmup;
pub mod watch_wire;
mod xds;

pub use balancer::BalancerService;
pub use pick_wire::BalancerRoutes;
pub use policies::PoliciesService;
pub use registry::RegistryService;
pub use warmup::Warmup;
pub use watch_wire::RegistryRoutes;
pub use xds::XdsService;
