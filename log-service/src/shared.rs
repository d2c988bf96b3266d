//! The state the store's threads share: the segment files, the index of
//! every log, the read cache, subscriptions and counters. The writer,
//! recovery, the spares refill and readers all work on it; the [`Store`]
//! handle owns it. Below every one of them, so none depends on another
//! through it.
//!
//! [`Store`]: crate::Store

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use lru::LruCache;
use melddb::Entry;
use tokio::sync::broadcast;

use crate::chunked::Chunked;
use crate::config::Config;
use crate::locks;
use crate::segment::{Faults, SegFile};
use crate::stripe::{RootEntry, StripeRef};

mod read;

pub(crate) use read::{
    parse_payload, read_page, read_range, read_stripe, read_stripe_without, valid_pages,
};

/// Where one record is: its root stripe and index in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Loc {
    /// Root stripe.
    pub stripe: u64,
    /// Entry index in the root stripe.
    pub idx: u32,
    /// Record length.
    pub len: u32,
    /// First stripe of the batch (all its fragments are at or above).
    pub batch_seq: u64,
    /// Where the bytes start in the root payload, or `FRAGMENTED`.
    pub offset: u32,
    /// CRC32 of the record.
    pub crc: u32,
}

/// One log's index.
#[derive(Debug, Default)]
pub(crate) struct LogIndex {
    /// First readable position.
    pub first: u64,
    /// `locs[i]` is position `first + i`.
    pub locs: Chunked<Loc>,
}

impl LogIndex {
    /// An empty index whose first position is `first`.
    pub fn starting_at(first: u64) -> LogIndex {
        LogIndex {
            first,
            locs: Chunked::default(),
        }
    }

    /// Next position.
    pub fn tail(&self) -> u64 {
        self.first + self.locs.len() as u64
    }
}

/// Everything readers need to find a record.
#[derive(Debug, Default)]
pub(crate) struct Index {
    /// Complete (end-written) stripes.
    pub stripes: BTreeMap<u64, StripeRef>,
    /// The logs.
    pub logs: BTreeMap<String, LogIndex>,
}

/// A decoded stripe payload.
pub(crate) enum Parsed {
    Root(Vec<RootEntry>),
    Fragment(Vec<u8>),
}

/// Counters, exported as Prometheus metrics and in `stats()`.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub appends: AtomicU64,
    pub append_bytes: AtomicU64,
    pub batches: AtomicU64,
    pub stripes: AtomicU64,
    pub bytes_written: AtomicU64,
    pub fsyncs: AtomicU64,
    pub write_backs: AtomicU64,
    pub flushes: AtomicU64,
    pub rounds_on_writer: AtomicU64,
    pub direct_write_bytes: AtomicU64,
    pub reads: AtomicU64,
    pub reads_whole_stripe: AtomicU64,
    pub pages_rebuilt: AtomicU64,
    pub segments_repaired: AtomicU64,
    pub write_failures: AtomicU64,
    pub segments_freed: AtomicU64,
    pub segments_prepared: AtomicU64,
    pub spares_ready: AtomicU64,
    pub spares_failed: AtomicU64,
}

/// State shared by the writer and readers.
pub(crate) struct Shared {
    pub config: Config,
    pub faults: Arc<Faults>,
    pub files: RwLock<BTreeMap<u64, Arc<SegFile>>>,
    /// The zones' raw devices (`devices`), in zone order; empty when
    /// segments are files.
    pub devices: Vec<crate::device::Device>,
    /// The zone directories' locks: taken before recovery, given back by
    /// [`Store::shutdown`](crate::Store::shutdown) once the writer (the only thread that writes)
    /// is gone.
    pub zone_locks: Mutex<Option<crate::zone_lock::ZoneLocks>>,
    pub index: RwLock<Index>,
    pub cache: Mutex<Option<LruCache<u64, Arc<Parsed>>>>,
    pub subs: Mutex<HashMap<String, broadcast::Sender<(u64, Entry)>>>,
    pub counters: Counters,
    /// Where appends spend their time (exported with the counters).
    pub stages: crate::latency::Stages,
    pub stopping: std::sync::atomic::AtomicBool,
    /// Why the writer refuses every append for now, if it does: a roll
    /// back it could not finish (until one succeeds) or not undo (until a
    /// restart). `/health` reports it.
    pub refusing: Mutex<Option<String>>,
}

/// The locks of [`Shared`], taken past poisoning ([`crate::locks`]).
impl Shared {
    /// Zone `zone`'s device, when segments live on devices.
    pub(crate) fn device(&self, zone: usize) -> Option<&crate::device::Device> {
        self.devices.get(zone)
    }

    pub(crate) fn index(&self) -> RwLockReadGuard<'_, Index> {
        locks::read(&self.index)
    }
    pub(crate) fn index_mut(&self) -> RwLockWriteGuard<'_, Index> {
        locks::write(&self.index)
    }
    pub(crate) fn files(&self) -> RwLockReadGuard<'_, BTreeMap<u64, Arc<SegFile>>> {
        locks::read(&self.files)
    }
    pub(crate) fn files_mut(&self) -> RwLockWriteGuard<'_, BTreeMap<u64, Arc<SegFile>>> {
        locks::write(&self.files)
    }
    pub(crate) fn cache(&self) -> MutexGuard<'_, Option<LruCache<u64, Arc<Parsed>>>> {
        locks::lock(&self.cache)
    }
    pub(crate) fn subs(&self) -> MutexGuard<'_, HashMap<String, broadcast::Sender<(u64, Entry)>>> {
        locks::lock(&self.subs)
    }
}
