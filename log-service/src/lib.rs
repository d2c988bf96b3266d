//! MeldDB's log service: the shared log every node appends intentions to
//! and reads back in order.
//!
//! The storage engine follows §2 of the Hyder shared-flash-log paper: a
//! record is a stripe of pages on segments in different failure zones with
//! Reed-Solomon parity; an end-write record on three segments says a stripe
//! is complete; segment classes and sliding windows decide which segment
//! takes what. One service instance sequences appends into positions of
//! several independent logs, pushes new entries to subscribers, and serves
//! a binary protocol over TCP and WebSocket plus HTTP/JSON for tools.
//! See `docs/log-service.md` for the on-disk layout and the protocol.

#![deny(missing_docs)]

pub mod blockdev;
mod chunked;
pub mod client;
pub mod config;
pub mod device;
mod direct;
pub mod error;
pub mod flush;
pub mod latency;
mod locks;
pub mod meta;
pub mod page;
pub mod protocol;
mod recovery;
mod reports;
pub mod request_ids;
pub mod samples;
mod seg_file;
pub mod segment;
pub mod server;
mod shared;
mod spares;
pub mod store;
pub mod stripe;
mod syncpool;
mod tcp_frames;
mod thp;
mod writer;
pub mod zone_lock;

pub use store::scrub;

pub use client::{
    BatchSubscription, BlockingLog, Client, ClientError, ClientOptions, Subscription,
};
pub use config::{Config, Limits, Listen, Rights, Tuning};
pub use error::{ConfigError, OpenError, StoreError};
pub use segment::Faults;
pub use server::{start, start_on, Running};
pub use store::{RecoveryReport, ScrubReport, SegmentInfo, Stats, Store};

#[cfg(test)]
use melddb_testkit::skip;
