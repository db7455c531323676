//! The hash maps on the pick path.
//!
//! A pick hashes a few short strings (service, rule, instance id); SipHash, the standard
//! library's default, costs several times more than foldhash's fast hasher for them. The seed is
//! random per process. Keys that arrive from the network unvalidated (rule strings) go into
//! bounded maps only.

/// A `HashMap` with the fast hasher.
pub type Map<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A `DashMap` with the fast hasher.
pub type ConcurrentMap<K, V> = dashmap::DashMap<K, V, foldhash::fast::RandomState>;
