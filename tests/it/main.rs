//! Integration tests: the real server on 127.0.0.1:0, driven through real gRPC clients.

mod admin;
mod auth;
mod cli;
mod companions;
mod conformance;
mod errors;
mod harness;
mod health;
mod hostile;
mod limits;
mod operator;
mod policy;
mod processes;
mod redis_server;
mod registration;
mod replica_lag;
mod replicas;
mod rotation;
mod rules;
mod shutdown;
mod sources;
mod tls;
mod unread;
mod warmup;
mod xds;
