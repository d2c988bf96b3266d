//! The single writer thread: it sequences appends into positions, packs
//! them into stripes, writes the pages to the current window of segments
//! and the end-write records to three segments, fsyncs all of them in one
//! round, and only then acknowledges. The round runs on helper threads
//! while the writer writes the next batch, so at most two batches are
//! unacknowledged at once (recovery checks the last two). It also owns the
//! sliding windows (§2.3), trim, and segment repair, so nothing else ever
//! writes a segment.
//!
//! Windows: with base `b` and `n = k + m` pages per stripe, segments
//! `b..b+3` take end-writes (class 3), the next `n` root stripes (class 2)
//! and the next `n` non-root stripes (class 1). Segments below `b` are
//! sealed (class 4). When a segment lacks room, `b` advances by one: the
//! edge of each class is captured by the class above it.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use melddb::Entry;
use tokio::sync::{mpsc, oneshot};

use crate::config::END_WRITE_COPIES;
use crate::direct::{self, BufPool, DeferredWrite};
use crate::error::StoreError;
use crate::meta::{LogMeta, Meta};
use crate::page::{self, class, Header, Kind, HEADER};
use crate::request_ids::RequestIds;
use crate::segment::{self, SegFile};
use crate::shared::{Loc, LogIndex, Shared};
use crate::spares::Spares;
use crate::stripe::{self, EndWrite, EntryMeta, RootRef, StripeRef};
use crate::syncpool::{How, OnDone, Round, RoundFile, SyncPool};
use reed_solomon_erasure::galois_8::ReedSolomon;

mod batching;
mod build;
pub(crate) mod repair;
mod rollback;
mod rounds;
mod trim;
mod window;

pub(crate) use build::Recovered;
pub(crate) use repair::{ew_page, read_ew_page};

/// One append waiting for the writer.
pub(crate) struct AppendReq {
    pub log: String,
    pub client: u64,
    pub request: u64,
    pub bytes: bytes::Bytes,
    pub reply: oneshot::Sender<Result<u64, StoreError>>,
    /// When the store accepted it (for the stage histograms).
    pub at: Instant,
}

/// What the writer is asked to do.
pub(crate) enum Cmd {
    Append(AppendReq),
    /// Appends that take consecutive positions in one batch.
    AppendMany(Vec<AppendReq>),
    Trim {
        log: String,
        pos: u64,
        reply: oneshot::Sender<Result<(), StoreError>>,
    },
    /// A reader found a bad page in this segment.
    Repair {
        seg: u64,
        /// Stripes whose page here passes its checksum but lies.
        liars: Vec<u64>,
    },
    /// Repair and report.
    RepairNow {
        seg: u64,
        liars: Vec<u64>,
        reply: oneshot::Sender<Result<(), String>>,
    },
    Barrier(oneshot::Sender<()>),
    /// The fsync round of the in-flight batch starting at this stripe
    /// ended (sent by the fsync helpers; stale ones are ignored).
    Synced(u64),
    Segments(oneshot::Sender<Vec<SegmentInfo>>),
    /// Where every copy of every live end-write should be (scrub).
    EndWriteCopies(oneshot::Sender<Vec<EndWriteCopies>>),
    /// Every segment's class markers as the writer recorded them (scrub).
    Markers(oneshot::Sender<Vec<SegmentMarkers>>),
    Shutdown,
}

/// One segment's class markers, for a scrub to read off the writer
/// thread: the segment, its file, and each marker's offset and class.
pub(crate) type SegmentMarkers = (u64, Arc<SegFile>, Vec<(u64, u8)>);

/// The copies of one live end-write, for a scrub to read off the writer
/// thread.
pub(crate) struct EndWriteCopies {
    /// The stripe.
    pub seq: u64,
    /// The stored checksum every good copy has ([`LiveEndWrite`]).
    pub page_crc: u32,
    /// Each segment of the copy set, with the copy when the writer knows
    /// of one there (`None`: the copy is lost, say behind damage the scan
    /// stopped at).
    pub places: Vec<(u64, Option<CopyAt>)>,
}

/// Where one end-write copy is: its offset, and the segment's file.
pub(crate) type CopyAt = (u64, Arc<SegFile>);

/// One segment file as the writer sees it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SegmentInfo {
    /// Segment id.
    pub id: u64,
    /// Failure zone.
    pub zone: u64,
    /// Class (0 empty, 1 unordered, 2 ordered, 3 end-write, 4 sealed).
    pub class: u8,
    /// Bytes.
    pub len: u64,
}

/// The writer's view of one segment file.
pub(crate) struct SegState {
    pub file: Arc<SegFile>,
    /// End of the data.
    pub len: u64,
    /// File length: the data plus zero-filled space ahead of it. Pages
    /// written below it overwrite allocated, written blocks, so an fsync
    /// has no size change to journal.
    pub zeroed: u64,
    /// Bytes from the start whose blocks are allocated, written and
    /// committed: all of a segment made from a spare, else 0. Pages
    /// written below it need no metadata, so a round may write them back
    /// and flush the device once (`flush_once_per_device`). Cutting the
    /// file lowers it.
    pub prepared: u64,
    pub class: u8,
    /// Class markers: offset and class.
    pub markers: Vec<(u64, u8)>,
    /// End-write pages: offset and stripe.
    pub ew_pages: Vec<(u64, u64)>,
    /// Highest stripe with a page or end-write here.
    pub max_seq: u64,
    /// Bytes beyond this offset are not accounted for (the scan stopped at
    /// damage, or the file was missing): repair refills end-writes by era.
    pub damaged_at: Option<u64>,
    /// Recovery only: a torn-tail candidate (start, end of data).
    pub pending_cut: Option<(u64, u64)>,
    /// The descriptor for direct writes of this file, opened at the first
    /// large write ([`crate::direct`]).
    pub direct: DirectFd,
}

/// A segment's descriptor for direct writes.
#[derive(Default)]
pub(crate) enum DirectFd {
    /// Not needed yet.
    #[default]
    Unopened,
    Open(Arc<SegFile>),
    /// The file system refused `O_DIRECT`: this file is written buffered.
    Refused,
}

/// Appends accepted into a batch, one per distinct request.
struct Pending {
    meta: EntryMeta,
    bytes: bytes::Bytes,
    /// When the store accepted the first request for it.
    at: Instant,
    replies: Vec<oneshot::Sender<Result<u64, StoreError>>>,
}

/// What a stripe carries: a fragment of a large record, or root entries
/// (whole records, or the tails of fragmented ones).
enum Body<'a> {
    Fragment(&'a [u8]),
    Root(Vec<RootRef<'a>>),
}

impl Body<'_> {
    /// Payload bytes.
    fn len(&self) -> usize {
        match self {
            Body::Fragment(b) => b.len(),
            Body::Root(entries) => stripe::root_payload_len(entries),
        }
    }
}

/// A batch written to its segments whose fsync round is under way. The
/// writer writes the next batch meanwhile; this one is answered when its
/// round ends (recovery therefore checks the last two batches).
pub(crate) struct InFlight {
    pending: Vec<Pending>,
    /// Payload bytes of `pending`.
    payload: usize,
    ews: Vec<Written>,
    first_seq: u64,
    /// Segment lengths before the batch, for a roll back.
    lens_before: BTreeMap<u64, u64>,
    /// The segments being synced and the round; `None` without fsync.
    round: Option<(Vec<u64>, Round)>,
    /// Request ids in the batch, to their index in `pending`.
    keys: IdMap<usize>,
    /// Each log's tail after the batch.
    tails: HashMap<String, u64>,
}

impl InFlight {
    /// Whether this batch's fsync round has ended (true without one).
    fn round_done(&mut self) -> bool {
        self.round.as_mut().is_none_or(|(_, r)| r.is_done())
    }

    /// Joins a later write of the same batch (not syncing yet) to this one.
    fn absorb(&mut self, later: InFlight) {
        let shift = self.pending.len();
        self.payload += later.payload;
        self.keys
            .extend(later.keys.into_iter().map(|(k, i)| (k, i + shift)));
        self.pending.extend(later.pending);
        self.ews.extend(later.ews);
        // The later write started from these tails, so its own are newer.
        self.tails.extend(later.tails);
    }
}

/// An end-write the writer has written, with its page's checksum.
pub(crate) struct Written {
    ew: EndWrite,
    page_crc: u32,
}

/// What the writer keeps of a live stripe's end-write.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LiveEndWrite {
    /// The first of the three segments holding a copy.
    pub base: u64,
    /// The checksum stored in the page every good copy is (the one
    /// written, or the one recovery's vote chose). It names those exact
    /// bytes, so repair copies no other version: a copy recovery outvoted
    /// still passes its own checksum, and copied into a rebuilt segment
    /// it would win the next open's vote.
    pub page_crc: u32,
}

/// The reply channel of one append.
type Reply = oneshot::Sender<Result<u64, StoreError>>;

/// Payload bytes the batch written during a round may reach before the
/// writer waits for the round instead of writing more.
const MAX_NEXT_BYTES: usize = BATCH_BYTES / 4;

/// A table keyed by request id (client id, request id). Hashed with
/// foldhash, seeded per process: the writer looks every append's id up
/// and inserts it, and SipHash, the standard library's default, was about
/// 5% of the writer's time. The ids come from authenticated clients only,
/// and the random seed keeps collisions from being chosen in advance.
pub(crate) type IdMap<V> = HashMap<(u64, u64), V, foldhash::fast::RandomState>;

/// Page buffers larger than this are not kept between groups.
const KEEP_BUFFER_BYTES: usize = 32 << 20;

/// Largest batch of appends written together.
const BATCH_BYTES: usize = 8 << 20;
const BATCH_COUNT: usize = 16384;

pub(crate) struct Writer {
    shared: Arc<Shared>,
    rx: mpsc::Receiver<Cmd>,
    segs: BTreeMap<u64, SegState>,
    base: u64,
    next_seq: u64,
    meta: Meta,
    /// Live stripes' end-writes: stripe number to where the three copies
    /// are and which bytes they hold (repair re-reads a surviving copy;
    /// the records themselves are not kept in memory).
    ews: BTreeMap<u64, LiveEndWrite>,
    /// The last `dedup_window` request ids, for idempotent appends.
    request_ids: RequestIds,
    /// Set when a failed batch could not be rolled back: the store then
    /// refuses appends until it is reopened (recovery sorts it out).
    failed: Option<String>,
    /// A roll back could not record its discarded stripe numbers in the
    /// metadata or make its windows whole again (no space, most likely):
    /// nothing more is written until that is done
    /// ([`Writer::finish_roll_back`]). A full disk then refuses appends
    /// until there is room, instead of stopping the store until a restart.
    unfinished_roll_back: bool,
    /// Segments written since the last fsync round.
    dirty: BTreeSet<u64>,
    /// The threads that fsync a round's segments in parallel.
    syncer: SyncPool,
    /// The stripe codec (`k` data + `m` parity shards).
    rs: ReedSolomon,
    /// One page buffer per window segment, reused by every group.
    page_bufs: Vec<Vec<u8>>,
    /// The root payload being encoded, reused.
    payload_buf: Vec<u8>,
    /// The batch whose fsync round is under way, if any.
    inflight: Option<InFlight>,
    /// The batch being written while that round runs (not syncing yet):
    /// appends that arrive during a round are written at once, into this
    /// one batch, and the next round syncs them all.
    next: Option<InFlight>,
    /// The writer's own queue, for the fsync helpers' wake-ups (weak: the
    /// queue still closes when the store is dropped).
    wake: mpsc::WeakSender<Cmd>,
    /// Spare segment files and their refill thread (`prepared_segments`).
    spares: Option<Spares>,
    /// Writes of the batch being written held back for its round's
    /// helpers, by segment, in order ([`crate::direct`]).
    deferred: BTreeMap<u64, Vec<DeferredWrite>>,
    /// Their aligned buffers, reused.
    direct_bufs: BufPool,
    /// Segments whose held-back writes are end-writes: their round writes
    /// them only after every data write of the round, so no end-write
    /// reaches a file before the pages it describes.
    late: BTreeSet<u64>,
    /// Segments where a failed write may have left bytes past the end of
    /// the data, with where that write would have ended: the roll back
    /// cuts them off (or zeroes them over a spare's zeros).
    torn: BTreeMap<u64, u64>,
    /// Segments with held-back writes in the round started last: until
    /// it is over, their new writes are held back too (behind them).
    round_held: BTreeSet<u64>,
    /// Per zone, the device whose cache one flush covers, where a round
    /// may write that zone's prepared segments back and flush once
    /// (`flush_once_per_device` on an ext4 or XFS zone); `None`: fsync
    /// each file.
    flush_devs: Vec<Option<u64>>,
}

/// A segment the writer's own bookkeeping says is open is not: a bug, but
/// reported as a failed write rather than a panic.
fn vanished(what: &str) -> StoreError {
    StoreError::WriteFailed(format!("{what} is not open in the writer"))
}

/// Waits for an fsync round over `segs`; the first failure, by segment.
fn wait_round((segs, round): (Vec<u64>, Round)) -> Result<(), StoreError> {
    segs.into_iter().zip(round.wait()).try_for_each(|(seg, r)| {
        r.map_err(|e| StoreError::from_write(format!("fsync segment {seg}"), &e))
    })
}

/// The largest write whose write-back the writer starts at once
/// ([`crate::flush::start_write_back`]). Small batches gain: their round
/// shrinks to about the device flush. Large ones do not: the device is
/// busy anyway, and submitting megabytes of write-back on the writer
/// thread, the one that limits throughput there, costs batches of 64
/// records 1-4%.
const EARLY_WRITE_BACK_MAX: usize = 256 << 10;

/// Zeros to write after `len` bytes at the end of `st`'s data so that the
/// write ends on a file block boundary (see
/// [`crate::segment::Faults::write_padded_at`]): only inside the space
/// known to hold zeros already (`len .. zeroed`), so the padding rewrites
/// what is on disk and never grows the file. A write past the file's end
/// needs none: the file system reads nothing for a block it allocates.
fn block_pad(st: &SegState, len: usize) -> usize {
    let end = st.len.saturating_add(len as u64);
    let block_end = end.next_multiple_of(crate::segment::PAD_MAX as u64);
    block_end.min(st.zeroed).saturating_sub(end) as usize
}

/// `st`'s descriptor for direct writes, opened on first use; `None` where
/// the file system refuses `O_DIRECT` (then asked once per file).
fn direct_fd(seg: u64, st: &mut SegState) -> Option<Arc<SegFile>> {
    match &st.direct {
        DirectFd::Open(f) => Some(f.clone()),
        DirectFd::Refused => None,
        DirectFd::Unopened => match st.file.open_direct() {
            Ok(f) => {
                let f = Arc::new(f);
                st.direct = DirectFd::Open(f.clone());
                Some(f)
            }
            Err(e) => {
                tracing::info!(segment = seg, error = %e, "no direct writes for this segment file; writing it buffered");
                st.direct = DirectFd::Refused;
                None
            }
        },
    }
}
