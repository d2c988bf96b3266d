//! # MeldDB core
//!
//! A platform-neutral, sans-IO transactional key-value engine after the
//! Hyder architecture: transactions run optimistically on immutable
//! snapshots of a copy-on-write binary search tree, each appends one
//! *intention* to a shared log, and every node rolls the log forward with
//! the deterministic *meld* algorithm, which decides commit or abort and
//! merges committed work into its last committed state.
//!
//! ```
//! use melddb::{Database, Isolation, Outcome, Settings};
//!
//! let mut db = Database::create(Settings::default()).unwrap();
//! let mut tx = db.begin(Isolation::Serializable);
//! tx.put(b"k", b"v").unwrap();
//! assert!(matches!(db.commit(tx).unwrap(), Outcome::Committed { .. }));
//! assert_eq!(db.get(b"k").unwrap().as_deref(), Some(&b"v"[..]));
//! ```
//!
//! The crate has no threads, clocks, randomness, files or sockets; hosts
//! drive it (see [`Melder`] and [`Transaction`]). It builds for
//! `wasm32-unknown-unknown` unchanged.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod bytes;
pub mod cache;
pub mod checkpoint;
pub mod codec;
mod db;
mod engine;
pub mod error;
mod garbage;
mod genesis;
mod isolation;
mod log;
mod meld;
mod node;
pub mod pipeline;
mod range;
mod range_iter;
mod snapshot;
mod txn;
pub mod validate;

pub use codec::{parse, Intention, ParsedIntention};
pub use db::Database;
pub use engine::{decode_with, Melder, Outcome};
pub use error::{CheckpointError, CommitError, DecodeError, Error, LogError, OpenError, TxnError};
pub use garbage::Garbage;
pub use genesis::{Settings, DEFAULT_MAX_CONFLICT_ZONE, MAX_CONFLICT_ZONE_LIMIT};
pub use isolation::Isolation;
pub use log::{Entry, Log, MemLog};
pub use meld::{AbortReason, MeldStats};
pub use node::{Bytes, LogPos, Node, NodeAddr, NodeStore, StoreError, Vn, NO_LOGGED_NODE};
pub use pipeline::MeldState;
pub use range::KeyRange;
pub use range_iter::Range;
pub use snapshot::{Digest, Order, Snapshot};
pub use txn::{Finished, LocalIntention, Transaction, TxnRange};
