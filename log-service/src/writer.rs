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
use crate::spares::Spares;
use crate::store::{Loc, LogIndex, Shared};
use crate::stripe::{self, EndWrite, EntryMeta, RootRef, StripeRef};
use crate::syncpool::{How, OnDone, Round, RoundFile, SyncPool};
use reed_solomon_erasure::galois_8::ReedSolomon;

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
    pub shared: Arc<Shared>,
    pub rx: mpsc::Receiver<Cmd>,
    pub segs: BTreeMap<u64, SegState>,
    pub base: u64,
    pub next_seq: u64,
    pub meta: Meta,
    /// Live stripes' end-writes: stripe number to where the three copies
    /// are and which bytes they hold (repair re-reads a surviving copy;
    /// the records themselves are not kept in memory).
    pub ews: BTreeMap<u64, LiveEndWrite>,
    /// The last `dedup_window` request ids, for idempotent appends.
    pub request_ids: RequestIds,
    /// Set when a failed batch could not be rolled back: the store then
    /// refuses appends until it is reopened (recovery sorts it out).
    pub failed: Option<String>,
    /// A roll back could not record its discarded stripe numbers in the
    /// metadata or make its windows whole again (no space, most likely):
    /// nothing more is written until that is done
    /// ([`Writer::finish_roll_back`]). A full disk then refuses appends
    /// until there is room, instead of stopping the store until a restart.
    pub unfinished_roll_back: bool,
    /// Segments written since the last fsync round.
    pub dirty: BTreeSet<u64>,
    /// The threads that fsync a round's segments in parallel.
    pub syncer: SyncPool,
    /// The stripe codec (`k` data + `m` parity shards).
    pub rs: ReedSolomon,
    /// One page buffer per window segment, reused by every group.
    pub page_bufs: Vec<Vec<u8>>,
    /// The root payload being encoded, reused.
    pub payload_buf: Vec<u8>,
    /// The batch whose fsync round is under way, if any.
    pub inflight: Option<InFlight>,
    /// The batch being written while that round runs (not syncing yet):
    /// appends that arrive during a round are written at once, into this
    /// one batch, and the next round syncs them all.
    pub next: Option<InFlight>,
    /// The writer's own queue, for the fsync helpers' wake-ups (weak: the
    /// queue still closes when the store is dropped).
    pub wake: mpsc::WeakSender<Cmd>,
    /// Spare segment files and their refill thread (`prepared_segments`).
    pub spares: Option<Spares>,
    /// Writes of the batch being written held back for its round's
    /// helpers, by segment, in order ([`crate::direct`]).
    pub deferred: BTreeMap<u64, Vec<DeferredWrite>>,
    /// Their aligned buffers, reused.
    pub direct_bufs: BufPool,
    /// Segments whose held-back writes are end-writes: their round writes
    /// them only after every data write of the round, so no end-write
    /// reaches a file before the pages it describes.
    pub late: BTreeSet<u64>,
    /// Segments where a failed write may have left bytes past the end of
    /// the data, with where that write would have ended: the roll back
    /// cuts them off (or zeroes them over a spare's zeros).
    pub torn: BTreeMap<u64, u64>,
    /// Segments with held-back writes in the round started last: until
    /// it is over, their new writes are held back too (behind them).
    pub round_held: BTreeSet<u64>,
    /// Per zone, the device whose cache one flush covers, where a round
    /// may write that zone's prepared segments back and flush once
    /// (`flush_once_per_device` on an ext4 or XFS zone); `None`: fsync
    /// each file.
    pub flush_devs: Vec<Option<u64>>,
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
/// thread, the one that limits throughput there, cost batches of 64
/// records 1-4%. The measurements are in docs/benchmarks-log-history.md
/// (eighteenth session).
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

impl Writer {
    fn zones(&self) -> &[PathBuf] {
        &self.shared.config.zones
    }

    fn width(&self) -> usize {
        self.shared.config.stripe_width()
    }

    /// The segments of a window.
    fn window(&self, kind: Kind) -> Vec<u64> {
        self.window_at(kind, self.base).collect()
    }

    /// The segments of a window if the base were at `base`.
    fn window_at(&self, kind: Kind, base: u64) -> std::ops::Range<u64> {
        let n = self.width() as u64;
        let ew = END_WRITE_COPIES as u64;
        let (start, len) = match kind {
            Kind::EndWrite => (base, ew),
            Kind::Ordered => (base + ew, n),
            _ => (base + ew + n, n),
        };
        start..start + len
    }

    /// The lowest base at which segment `seg` may hold class `class`
    /// (its target class there is at least that); classes rise as the
    /// base does.
    fn lowest_base_for(&self, seg: u64, class: u8) -> u64 {
        // `seg` must lie below the end of the window of its class.
        let end = match class {
            class::EMPTY => return 0,
            class::UNORDERED => self.window_at(Kind::Unordered, 0).end,
            class::ORDERED => self.window_at(Kind::Ordered, 0).end,
            class::END_WRITE => self.window_at(Kind::EndWrite, 0).end,
            _ => 0,
        };
        (seg + 1).saturating_sub(end)
    }

    fn target_class(&self, seg: u64) -> u8 {
        let n = self.width() as u64;
        let ew = END_WRITE_COPIES as u64;
        if seg < self.base {
            class::SEALED
        } else if seg < self.base + ew {
            class::END_WRITE
        } else if seg < self.base + ew + n {
            class::ORDERED
        } else if seg < self.base + ew + 2 * n {
            class::UNORDERED
        } else {
            class::EMPTY
        }
    }

    /// Appends a class marker to `seg`, not yet durable (see
    /// [`Writer::raise_classes`]); returns its offset.
    fn append_marker(&mut self, seg: u64, to: u8) -> Result<u64, StoreError> {
        let bytes = page::class_marker(to);
        let s = self
            .segs
            .get_mut(&seg)
            .ok_or_else(|| vanished(&format!("segment {seg}")))?;
        let off = s.len;
        let pad = block_pad(s, bytes.len());
        if let Err(e) = self
            .shared
            .faults
            .write_padded_at(&s.file, &bytes, pad, off)
        {
            self.torn.insert(seg, off + bytes.len() as u64);
            return Err(StoreError::from_write(format!("segment {seg}"), &e));
        }
        s.len += bytes.len() as u64;
        s.zeroed = s.zeroed.max(s.len);
        Ok(off)
    }

    /// Raises each segment of `changes` to its class, all in one step:
    /// every marker is written (after the segment's held-back writes, so
    /// no marker ever follows bytes not yet written), then one round on
    /// the helpers makes them all durable, and only then does the writer
    /// count the new classes. A segment appears at most once, so it never
    /// holds two markers that one crash could keep out of order.
    ///
    /// One round instead of one fsync per marker: a window slide when the
    /// data segments fill moves the base once per data segment, four
    /// markers and a new segment each, and raised one by one with an
    /// fsync each those took about 1 ms per move, 7–8 ms in a row during
    /// which no append was acknowledged (measured at 150K appends/s).
    /// Their order among themselves does not matter to recovery: it takes
    /// the base as the lowest segment not sealed and moves it past any
    /// segment already above its class, so whichever subset of
    /// the markers a crash keeps, it slides to a base at or before the
    /// one written here, and nothing was written under the new base yet.
    fn raise_classes(&mut self, changes: &[(u64, u8)]) -> Result<(), StoreError> {
        let marker_len = page::class_marker(0).len() as u64;
        for &(seg, to) in changes {
            self.settle(seg)?;
            // The marker of a raise that failed (its round, or a later
            // marker), with nothing written after it: synced again below,
            // not written again, so retries while a disk fails do not pile
            // markers up (a device slot has room for a few thousand past
            // its segment).
            let written = self.segs.get(&seg).is_some_and(|s| {
                s.markers
                    .last()
                    .is_some_and(|&(off, c)| c == to && off + marker_len == s.len)
            });
            if written {
                continue;
            }
            // A sealed segment keeps the zeros after its seal marker:
            // recovery reads nothing past a seal marker that ends the
            // data, and cutting them made the seal a change of size (the
            // round's fdatasync journals it, about half a millisecond of
            // the slide, against a write-back) and freed blocks, which
            // costs about 0.8 ms per MiB on the benchmark disk.
            let off = self.append_marker(seg, to)?;
            // Recorded at once, counted only once durable (below): if a
            // later marker or the round fails, this one is in the file all
            // the same, and a repair rebuilds the segment from this record.
            if let Some(s) = self.segs.get_mut(&seg) {
                s.markers.push((off, to));
            }
        }
        if !self.shared.config.fsync {
            // Nothing is made durable without fsync, markers no more than
            // pages: they are in the page cache, which a process crash
            // keeps. Syncing them anyway made every slide wait for the
            // write-back of every page written since the last one (seconds
            // at 150 MiB/s, when nothing else flushes them).
            self.set_classes(changes)?;
            return Ok(());
        }
        // Markers over a prepared prefix are only written back, with one
        // device flush per device after all of them (as a batch's pages).
        let files: Vec<RoundFile> = changes
            .iter()
            .map(|&(seg, _)| {
                let st = self
                    .segs
                    .get(&seg)
                    .ok_or_else(|| vanished(&format!("segment {seg}")))?;
                Ok(RoundFile::sync(st.file.clone(), self.how_durable(seg, st)))
            })
            .collect::<Result<_, StoreError>>()?;
        let round = self.syncer.start(files, Arc::new(|| {}));
        let (write_backs, flushes) = (round.write_backs(), round.flushes());
        let c = &self.shared.counters;
        c.fsyncs.fetch_add(
            changes.len() as u64 - write_backs + flushes,
            Ordering::Relaxed,
        );
        c.write_backs.fetch_add(write_backs, Ordering::Relaxed);
        c.flushes.fetch_add(flushes, Ordering::Relaxed);
        for (r, &(seg, _)) in round.wait().into_iter().zip(changes) {
            r.map_err(|e| StoreError::from_write(format!("segment {seg}"), &e))?;
        }
        self.set_classes(changes)
    }

    /// Records the classes of `changes` once their markers are as durable
    /// as the configuration makes anything.
    fn set_classes(&mut self, changes: &[(u64, u8)]) -> Result<(), StoreError> {
        for &(seg, to) in changes {
            let s = self
                .segs
                .get_mut(&seg)
                .ok_or_else(|| vanished(&format!("segment {seg}")))?;
            s.class = to;
        }
        Ok(())
    }

    /// How a round makes `seg`'s new pages durable: pages written only
    /// over a prepared prefix (blocks allocated, written and committed)
    /// have no metadata to journal, so written back they are durable once
    /// their device's cache is flushed; any other needs an `fdatasync`.
    fn how_durable(&self, seg: u64, st: &SegState) -> How {
        let dev = self
            .flush_devs
            .get(segment::zone(self.zones(), seg))
            .copied()
            .flatten();
        match dev {
            Some(dev) if st.len <= st.prepared => How::WriteBack(dev),
            _ => How::Sync,
        }
    }

    /// Finishes every write of `seg` not yet done: the round in flight's
    /// (waited for) and the held-back ones of the batch being written
    /// (done here, directly where they can be; for end-writes, every
    /// held-back page first). A failed write stays held back, so the round
    /// retries it, or fails the batch if it fails again.
    fn settle(&mut self, seg: u64) -> Result<(), StoreError> {
        let late = self.late.contains(&seg);
        if let Some((segs, round)) = self.inflight.as_mut().and_then(|f| f.round.as_mut()) {
            if late || segs.contains(&seg) {
                round.wait_done();
            }
        }
        let mut order: Vec<u64> = Vec::new();
        if late {
            order.extend(self.deferred.keys().filter(|s| !self.late.contains(s)));
        }
        order.push(seg);
        for s in order {
            let Some(mut ws) = self.deferred.remove(&s) else {
                continue;
            };
            for i in 0..ws.len() {
                if let Err(e) = self.shared.faults.write_deferred(&ws[i]) {
                    // The failed write and those behind it stay held back.
                    ws.drain(..i);
                    self.deferred.insert(s, ws);
                    return Err(StoreError::from_write(format!("segment {s}"), &e));
                }
            }
        }
        self.late.remove(&seg);
        Ok(())
    }

    /// Creates segment `seg`'s file, from a spare when one is ready. Its
    /// name is not durable yet: the caller syncs its directory before any
    /// page of it is written ([`Writer::ensure_window`]).
    fn create_segment(&mut self, seg: u64) -> Result<(), StoreError> {
        if self.segs.len() as u64 >= self.shared.config.max_segments {
            return Err(StoreError::Full(self.segs.len() as u64));
        }
        let zone = segment::zone(self.zones(), seg);
        if self.shared.device(zone).is_some() {
            return self.create_slot_segment(seg, zone);
        }
        let path = segment::path(self.zones(), seg);
        // Every new segment is made from a spare when one is ready, a new
        // store's first three end-write segments too: an end-write segment
        // that starts as an empty file grows with every round, so each
        // round must fdatasync it (the file system journals the new size)
        // instead of writing it back and flushing the device once, which
        // measured about a third more latency at 150K appends/s until the
        // window first slid. The price: an open reads an open end-write
        // segment's whole zero tail (see `recovery::scan`), as it already
        // did for later end-write segments, which are former data segments.
        let spare = self
            .spares
            .as_ref()
            .is_some_and(|s| s.take_into(zone, &path));
        let file = segment::open(&path, true)
            .map_err(|e| StoreError::from_write(format!("create {}", path.display()), &e))?;
        // A spare's pages are written in place over its zeros (spares are
        // exactly `segment_bytes` long: the pool keeps no other size).
        let zeroed = if spare {
            self.shared.config.segment_bytes
        } else {
            0
        };
        self.add_new_segment(seg, file, zeroed);
        Ok(())
    }

    /// Records new, empty segment `seg` whose first `zeroed` bytes are
    /// zeros already written and committed.
    fn add_new_segment(&mut self, seg: u64, file: SegFile, zeroed: u64) {
        let file = Arc::new(file);
        self.shared.files_mut().insert(seg, file.clone());
        self.segs.insert(
            seg,
            SegState {
                file,
                len: 0,
                zeroed,
                prepared: zeroed,
                class: class::EMPTY,
                markers: Vec::new(),
                ew_pages: Vec::new(),
                max_seq: 0,
                damaged_at: None,
                pending_cut: None,
                direct: DirectFd::Unopened,
            },
        );
    }

    /// Creates segment `seg` in a zeroed slot of zone `zone`'s device (a
    /// spare, or a free slot zeroed now), its header written but not
    /// durable yet: the caller syncs the device before any page of it is
    /// written ([`Writer::ensure_window`]).
    fn create_slot_segment(&mut self, seg: u64, zone: usize) -> Result<(), StoreError> {
        let dev = self
            .shared
            .device(zone)
            .ok_or_else(|| StoreError::WriteFailed(format!("zone {zone} has no device")))?;
        let failed = |e: io::Error| {
            StoreError::from_write(format!("segment {seg} on {}", dev.path().display()), &e)
        };
        let Some((slot, written)) = dev.zeroed_slot().map_err(failed)? else {
            tracing::warn!(device = %dev.path().display(), slots = dev.slots(), "every slot of the device holds a segment; trim the log");
            return Err(StoreError::Full(self.segs.len() as u64));
        };
        let file = match dev.assign(slot, seg) {
            Ok(f) => f,
            Err(e) => {
                dev.give_back(slot, crate::device::Held::Free);
                return Err(failed(e));
            }
        };
        if let Some(s) = &self.spares {
            s.wake();
        }
        let size = file.size().map_err(failed)?;
        self.add_new_segment(seg, file, size);
        if !written {
            // Zeros as unwritten extents of a file standing in for a
            // device: not prepared (see `Device::zeroed_slot`).
            if let Some(st) = self.segs.get_mut(&seg) {
                st.prepared = 0;
            }
        }
        Ok(())
    }

    /// Segments in the three windows together.
    fn span(&self) -> u64 {
        END_WRITE_COPIES as u64 + 2 * self.width() as u64
    }

    /// Makes the segments' classes match the windows: moves the base past
    /// any segment already above its target class, creates the
    /// window segments missing (their directories synced before any page
    /// of them is written: a spare that came back under its old name
    /// after a crash would hide the pages), then seals what is below the
    /// base and raises the window segments, all in one durable step
    /// ([`Writer::raise_classes`]).
    pub fn ensure_window(&mut self) -> Result<(), StoreError> {
        // Past the windows too: a crash during a slide can keep the
        // marker of a segment the slide brought into the windows and lose
        // those of the segments before it. Computed, not stepped: a stray
        // classed file far past the windows must not make an open count
        // up to it.
        let floor = self
            .segs
            .range(self.base..)
            .map(|(&s, st)| self.lowest_base_for(s, st.class))
            .max()
            .unwrap_or(0);
        self.base = self.base.max(floor);
        let span = self.span();
        let new: Vec<u64> = (self.base..self.base + span)
            .filter(|s| !self.segs.contains_key(s))
            .collect();
        self.check_capacity(&new)?;
        let mut zones: BTreeSet<usize> = BTreeSet::new();
        for seg in self.base..self.base + span {
            if !self.segs.contains_key(&seg) {
                self.create_segment(seg)?;
                zones.insert(segment::zone(self.zones(), seg));
            }
        }
        for zone in zones {
            match self.shared.device(zone) {
                // The new slots' headers (the device's counterpart of the
                // directory entries).
                Some(dev) => dev.sync().map_err(|e| {
                    StoreError::from_write(format!("sync device {}", dev.path().display()), &e)
                })?,
                None => {
                    let dir = &self.zones()[zone];
                    segment::sync_dir(dir).map_err(|e| {
                        StoreError::from_write(format!("sync directory {}", dir.display()), &e)
                    })?
                }
            }
        }
        let mut changes: Vec<(u64, u8)> = self
            .segs
            .range(..self.base)
            .filter(|(_, s)| s.class < class::SEALED)
            .map(|(&id, _)| (id, class::SEALED))
            .collect();
        for seg in self.base..self.base + span {
            let target = self.target_class(seg);
            if self.segs.get(&seg).is_some_and(|st| st.class < target) {
                changes.push((seg, target));
            }
        }
        if changes.is_empty() {
            return Ok(());
        }
        self.raise_classes(&changes)
    }

    /// Refuses, before anything changes, a slide that needs segments
    /// `new` when `max_segments` or a zone's device has no room for them,
    /// so a full log answers appends with [`StoreError::Full`] and takes
    /// them again once a trim frees segments (rather than failing the
    /// store half-way through a slide).
    fn check_capacity(&self, new: &[u64]) -> Result<(), StoreError> {
        let in_use = self.segs.len() as u64;
        if in_use + new.len() as u64 > self.shared.config.max_segments {
            return Err(StoreError::Full(in_use));
        }
        for (zone, dev) in self.shared.devices.iter().enumerate() {
            let need = new
                .iter()
                .filter(|&&s| segment::zone(self.zones(), s) == zone)
                .count();
            if need > dev.available() {
                tracing::warn!(device = %dev.path().display(), slots = dev.slots(), need, "every slot of the device holds a segment; trim the log");
                return Err(StoreError::Full(in_use));
            }
        }
        Ok(())
    }

    /// Whether every segment of `kind`'s window would have `bytes` of room
    /// with the base at `base`: a segment not made yet will be empty, and
    /// one still to be raised to the window's class will hold a marker
    /// more.
    fn would_have_room(&self, kind: Kind, bytes: u64, base: u64) -> bool {
        let limit = self.shared.config.segment_bytes;
        let marker = page::class_marker(class::SEALED).len() as u64;
        // A data kind's number is its window's class (`page::Kind`).
        let target = kind as u8;
        self.window_at(kind, base).all(|s| {
            let (len, class) = self
                .segs
                .get(&s)
                .map_or((0, class::EMPTY), |st| (st.len, st.class));
            let len = if class < target { len + marker } else { len };
            len + bytes <= limit
        })
    }

    /// Whether every segment of `kind`'s window exists and has `bytes` of
    /// room.
    fn has_room(&self, kind: Kind, bytes: u64) -> bool {
        let limit = self.shared.config.segment_bytes;
        self.window_at(kind, self.base)
            .all(|s| self.segs.get(&s).is_some_and(|st| st.len + bytes <= limit))
    }

    /// Slides the windows until every segment of `kind`'s window has
    /// `bytes` of room. The data segments fill in step, so a slide usually
    /// moves the base once per segment of the window: the new base is
    /// found first and reached in one [`Writer::ensure_window`], so all
    /// the markers of the slide become durable together.
    fn make_room(&mut self, kind: Kind, bytes: u64) -> Result<(), StoreError> {
        if self.has_room(kind, bytes) {
            return Ok(());
        }
        let t = Instant::now();
        // A base a whole span on puts every window past the segments the
        // windows hold now: new and empty (the search never goes further).
        let last = self.base + self.span();
        // A data window that fills moves its full segments into the
        // end-write window, which then has to slide on too: the base found
        // makes room there as well, as much as the data needs, so one step
        // usually does both. (A group whose end-writes take more, such as
        // many tiny records, slides the end-write window once more.)
        let fits = |base| {
            self.would_have_room(kind, bytes, base)
                && (kind == Kind::EndWrite || self.would_have_room(Kind::EndWrite, bytes, base))
        };
        let mut base = self.base + 1;
        while base < last && !fits(base) {
            base += 1;
        }
        let mut r = self.slide_to(base);
        self.shared.stages.slide.record(t.elapsed());
        // The estimate is a shortcut, not a promise: should the window
        // still lack room, slide on one segment at a time (each step is
        // counted as a slide of its own).
        while r.is_ok() && !self.has_room(kind, bytes) {
            let t = Instant::now();
            r = self.slide_to(self.base + 1);
            self.shared.stages.slide.record(t.elapsed());
        }
        r
    }

    /// Moves the base to `base` and makes the windows match; a slide the
    /// segments have no room for ([`Writer::check_capacity`]) changes
    /// nothing, and the base stays.
    fn slide_to(&mut self, base: u64) -> Result<(), StoreError> {
        let before = self.base;
        self.base = base;
        let r = self.ensure_window();
        if matches!(r, Err(StoreError::Full(_))) {
            self.base = before;
        }
        r
    }

    pub fn run(mut self) {
        let mut queue: VecDeque<Cmd> = VecDeque::new();
        loop {
            let cmd = match queue.pop_front() {
                Some(c) => c,
                // While a batch syncs, the next command is either appends
                // (written at once, next to the round) or the round's end.
                None => match self.rx.blocking_recv() {
                    Some(c) => c,
                    None => {
                        self.finish_all();
                        return;
                    }
                },
            };
            if !matches!(cmd, Cmd::Append(_) | Cmd::AppendMany(_) | Cmd::Synced(_)) {
                // Everything but an append sees every written batch done:
                // trim records the stable point, repair rewrites segments,
                // a barrier promises that earlier appends are answered.
                self.finish_all();
            }
            match cmd {
                Cmd::Append(a) => self.gather_and_append(vec![a], &mut queue),
                Cmd::AppendMany(v) => self.gather_and_append(v, &mut queue),
                Cmd::Trim { log, pos, reply } => {
                    let _ = reply.send(self.trim(&log, pos));
                }
                Cmd::Repair { seg, liars } => {
                    if let Err(e) = self.repair(seg, &liars) {
                        tracing::error!(segment = seg, error = %e, "segment repair failed");
                    }
                }
                Cmd::RepairNow { seg, liars, reply } => {
                    let _ = reply.send(self.repair(seg, &liars));
                }
                Cmd::Barrier(reply) => {
                    let _ = reply.send(());
                }
                Cmd::Segments(reply) => {
                    let nz = self.zones().len() as u64;
                    let _ = reply.send(
                        self.segs
                            .iter()
                            .map(|(&id, s)| SegmentInfo {
                                id,
                                zone: id % nz,
                                class: s.class,
                                len: s.len,
                            })
                            .collect(),
                    );
                }
                Cmd::EndWriteCopies(reply) => {
                    let _ = reply.send(self.end_write_copies());
                }
                Cmd::Markers(reply) => {
                    let _ = reply.send(
                        self.segs
                            .iter()
                            .filter(|(_, st)| !st.markers.is_empty())
                            .map(|(&seg, st)| (seg, st.file.clone(), st.markers.clone()))
                            .collect(),
                    );
                }
                Cmd::Synced(seq) => {
                    if self.inflight.as_ref().is_some_and(|f| f.first_seq == seq) {
                        self.finish_inflight();
                    }
                }
                Cmd::Shutdown => {}
            }
            // A round that ended while the writer was busy (its wake-up is
            // dropped when the queue is full, or taken while gathering a
            // batch) is answered here, and so is the next if it has ended
            // too.
            while self.inflight.as_mut().is_some_and(|f| f.round_done()) {
                self.finish_inflight();
            }
            if self.shared.stopping.load(Ordering::SeqCst) && queue.is_empty() {
                // Finish what is queued, then stop.
                while let Ok(c) = self.rx.try_recv() {
                    queue.push_back(c);
                }
                if queue.is_empty() {
                    self.finish_all();
                    return;
                }
            }
        }
    }

    /// Takes every append already queued (up to the batch limits; an
    /// `AppendMany` is never split) and writes them as one batch. Other
    /// commands met on the way wait in `queue`, in order.
    fn gather_and_append(&mut self, first: Vec<AppendReq>, queue: &mut VecDeque<Cmd>) {
        let mut batch = first;
        let mut bytes: usize = batch.iter().map(|a| a.bytes.len()).sum();
        while bytes < BATCH_BYTES && batch.len() < BATCH_COUNT && queue.is_empty() {
            match self.rx.try_recv() {
                Ok(Cmd::Append(a)) => {
                    bytes += a.bytes.len();
                    batch.push(a);
                }
                Ok(Cmd::AppendMany(v)) => {
                    bytes += v.iter().map(|a| a.bytes.len()).sum::<usize>();
                    batch.extend(v);
                }
                // This batch finishes the in-flight one after it is written
                // anyway.
                Ok(Cmd::Synced(_)) => {}
                Ok(other) => queue.push_back(other),
                Err(_) => break,
            }
        }
        self.append_batch(batch);
    }

    fn tail_of(&self, log: &str) -> u64 {
        let idx = self.shared.index();
        idx.logs.get(log).map(|l| l.tail()).unwrap_or(0)
    }

    fn append_batch(&mut self, reqs: Vec<AppendReq>) {
        if let Some(why) = &self.failed {
            for r in reqs {
                let _ = r.reply.send(Err(StoreError::WriteFailed(format!(
                    "the store stopped accepting appends after an unrecoverable write error ({why}); restart the service to recover"
                ))));
            }
            return;
        }
        if self.unfinished_roll_back {
            if let Err(e) = self.finish_roll_back() {
                for r in reqs {
                    let _ = r.reply.send(Err(e.clone()));
                }
                return;
            }
        }
        let taken = Instant::now();
        self.shared
            .stages
            .queued
            .record_runs(reqs.iter().map(|r| taken.saturating_duration_since(r.at)));
        let mut pending: Vec<Pending> = Vec::with_capacity(reqs.len());
        let mut in_batch: IdMap<usize> =
            IdMap::with_capacity_and_hasher(reqs.len(), Default::default());
        let mut tails: HashMap<String, u64> = HashMap::new();
        for r in reqs {
            let key = (r.client, r.request);
            if r.client != 0 {
                if let Some(pos) = self.request_ids.get(key) {
                    let _ = r.reply.send(Ok(pos));
                    continue;
                }
                // A retry of an append written but not yet answered (in the
                // batch syncing or the one written meanwhile): answered
                // with it.
                let unanswered = [&mut self.inflight, &mut self.next]
                    .into_iter()
                    .flatten()
                    .find_map(|f| Some((*f.keys.get(&key)?, f)));
                if let Some((i, f)) = unanswered {
                    f.pending[i].replies.push(r.reply);
                    continue;
                }
                if let Some(&i) = in_batch.get(&key) {
                    pending[i].replies.push(r.reply);
                    continue;
                }
                in_batch.insert(key, pending.len());
            }
            self.queue_record(&mut pending, &mut tails, r.log, key, r.bytes, r.at, r.reply);
        }
        if pending.is_empty() {
            return;
        }
        if let Err(e) = self.check_counts(&pending, &tails) {
            for p in pending {
                for r in p.replies {
                    let _ = r.send(Err(e.clone()));
                }
            }
            return;
        }
        // While a round runs, this write joins the batch written during it
        // (same batch number: recovery treats it as one batch, so at most
        // two batches are ever unacknowledged); otherwise it starts one.
        let batch_seq = self.next.as_ref().map_or(self.next_seq, |n| n.first_seq);
        let write_seq = self.next_seq;
        let lens_before: BTreeMap<u64, u64> =
            self.segs.iter().map(|(&s, st)| (s, st.len)).collect();
        let t0 = Instant::now();
        let written = self.write_batch(&pending, batch_seq);
        self.shared.stages.write.record(t0.elapsed());
        let ews = match written {
            Ok(ews) => ews,
            Err(e) => {
                // Only this write's pages are rolled back: what was written
                // before it (the batch syncing, the batch joined) stands,
                // and the segments the joined batch dirtied still need
                // their round.
                let dirty = self.dirty.clone();
                self.roll_back(&lens_before, write_seq);
                self.dirty.extend(dirty);
                self.fail(pending, e);
                return;
            }
        };
        let batch = InFlight {
            payload: pending.iter().map(|p| p.bytes.len()).sum(),
            pending,
            ews,
            first_seq: batch_seq,
            lens_before,
            round: None,
            keys: in_batch,
            tails,
        };
        match &mut self.next {
            Some(n) => n.absorb(batch),
            None => self.next = Some(batch),
        }
        if self.inflight.is_none() {
            if self.promote() {
                self.finish_inflight();
            }
        } else if self
            .next
            .as_ref()
            .is_some_and(|n| n.payload > MAX_NEXT_BYTES)
        {
            // Bounded memory: a batch that grew this large waits for the
            // round ahead instead of growing further.
            self.finish_inflight();
        }
        // A round that has ended meanwhile is answered by the run loop.
    }

    /// Refuses a batch whose positions or stripe numbers would reach
    /// [`crate::meta::LIMIT`]: the metadata written after it (a trim's,
    /// the next open's) would carry a count its own check refuses, and
    /// the store would not open again. Stripe numbers are counted high
    /// (every record split into fragments and given a root of its own).
    fn check_counts(
        &self,
        pending: &[Pending],
        tails: &HashMap<String, u64>,
    ) -> Result<(), StoreError> {
        let limit = crate::meta::LIMIT;
        if let Some((log, _)) = tails.iter().find(|(_, &t)| t >= limit) {
            return Err(StoreError::Exhausted(format!(
                "log {log:?}'s next position; append to another log"
            )));
        }
        let cap = (self.shared.config.data_shards
            * (self.shared.config.page_bytes as usize - HEADER)) as u64;
        let stripes = pending
            .iter()
            .map(|p| p.bytes.len() as u64 / cap + 2)
            .sum::<u64>()
            + 1;
        if self.next_seq.saturating_add(stripes) >= limit {
            return Err(StoreError::Exhausted(
                "the store's next stripe number; move the logs to a new store".into(),
            ));
        }
        Ok(())
    }

    /// Adds one record to the batch being built: its position follows the
    /// log's tail after everything already written.
    #[allow(clippy::too_many_arguments)]
    fn queue_record(
        &self,
        pending: &mut Vec<Pending>,
        tails: &mut HashMap<String, u64>,
        log: String,
        (client, request): (u64, u64),
        bytes: bytes::Bytes,
        at: Instant,
        reply: Reply,
    ) {
        let tail = match tails.get_mut(&log) {
            Some(t) => t,
            None => {
                // After the records already written and not yet published:
                // the batch written during the round first, then the one
                // syncing.
                let t = match [&self.next, &self.inflight]
                    .into_iter()
                    .flatten()
                    .find_map(|f| f.tails.get(&log))
                {
                    Some(&t) => t,
                    None => self.tail_of(&log),
                };
                tails.entry(log.clone()).or_insert(t)
            }
        };
        let pos = *tail;
        *tail += 1;
        pending.push(Pending {
            meta: EntryMeta {
                log,
                pos,
                client,
                request,
                len: bytes.len() as u32,
                offset: stripe::FRAGMENTED,
                crc: crc32fast::hash(&bytes),
            },
            bytes,
            at,
            replies: vec![reply],
        });
    }

    /// Starts the fsync round of the batch written meanwhile, which becomes
    /// the one in flight; without fsync it is answered at once. Returns
    /// whether the writer ran the round itself: it is over, and the caller
    /// answers it ([`Writer::finish_inflight`]), as no helper will send a
    /// wake-up for it.
    #[must_use = "a round the writer ran itself must be answered by the caller"]
    fn promote(&mut self) -> bool {
        debug_assert!(self.inflight.is_none());
        let Some(mut n) = self.next.take() else {
            return false;
        };
        // A small round runs here. Handing it to the helpers costs a
        // wake-up per file and one back to the writer, which on two shared
        // cores took more CPU than the round's I/O; appends that arrive
        // meanwhile wait for the round's end instead of being written
        // beside it, and measured less than that (docs/log-service.md,
        // "Small rounds on the writer"). A large round goes to the
        // helpers: its files' write-backs overlap, and the writer writes
        // the next batch meanwhile. ([`Writer::start_sync`] sends more
        // to the helpers.)
        let limit = self.shared.config.tuning.writer_round_max_bytes;
        let small = limit > 0 && (n.payload as u64) <= limit;
        match self.start_sync(Some(n.first_seq), small) {
            None => {
                let answered = self.publish(n.pending, n.ews, n.first_seq);
                self.remember_ids(&answered);
                false
            }
            Some(round) => {
                let here = round.1.ran_here();
                n.round = Some(round);
                self.inflight = Some(n);
                here
            }
        }
    }

    /// Answers every written batch: waits for the round in flight, then
    /// syncs and answers the batch written meanwhile.
    fn finish_all(&mut self) {
        while self.inflight.is_some() || self.next.is_some() {
            // A round promote ran here is answered on the next turn.
            if self.inflight.is_none() {
                let _ = self.promote();
            } else {
                self.finish_inflight();
            }
        }
    }

    /// Waits for the in-flight batch's fsync round, then answers its
    /// appends and starts the round of the batch written meanwhile; or, if
    /// the round failed, rolls back that batch and everything written after
    /// it and fails them all.
    fn finish_inflight(&mut self) {
        let Some(f) = self.inflight.take() else {
            return;
        };
        let t = Instant::now();
        let had_round = f.round.is_some();
        let synced = f.round.map_or(Ok(()), wait_round);
        self.round_held.clear();
        if had_round {
            self.shared.stages.round_wait.record(t.elapsed());
        }
        match synced {
            Ok(()) => {
                let answered = self.publish(f.pending, f.ews, f.first_seq);
                let ran_here = self.promote();
                // In answer order, so the table's window holds the latest.
                self.remember_ids(&answered);
                if ran_here {
                    self.finish_inflight();
                }
            }
            Err(e) => {
                self.roll_back(&f.lens_before, f.first_seq);
                // The batch behind it shares its fate and, on a full disk,
                // its remedy.
                let why = "the batch before this one failed to reach the disk; this one was rolled back with it".to_string();
                let behind = if matches!(e, StoreError::NoSpace(_)) {
                    StoreError::NoSpace(why)
                } else {
                    StoreError::WriteFailed(why)
                };
                self.fail(f.pending, e);
                if let Some(n) = self.next.take() {
                    self.fail(n.pending, behind);
                }
            }
        }
    }

    /// Answers a batch that did not reach the disk (its writes are rolled
    /// back) with the error.
    fn fail(&mut self, pending: Vec<Pending>, e: StoreError) {
        self.shared
            .counters
            .write_failures
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(error = %e, "append batch failed; rolled back");
        let err = match e {
            StoreError::Full(_) | StoreError::WriteFailed(_) | StoreError::NoSpace(_) => e,
            other => StoreError::WriteFailed(other.to_string()),
        };
        for p in pending {
            for r in p.replies {
                let _ = r.send(Err(err.clone()));
            }
        }
    }

    /// Cuts every segment back to its length before the failed batch and
    /// records the batch's stripe numbers as discarded, so recovery never
    /// takes a half-written stripe for a complete one.
    fn roll_back(&mut self, lens_before: &BTreeMap<u64, u64>, first_seq: u64) {
        self.dirty.clear();
        // Held-back writes belong to the batch written last:
        // those of the part being rolled back go; an earlier part's stay.
        for (seg, ws) in &mut self.deferred {
            let before = lens_before.get(seg).copied().unwrap_or(0);
            ws.retain(|w| w.kept_by_roll_back_to(before));
        }
        self.deferred.retain(|_, ws| !ws.is_empty());
        self.late.retain(|s| self.deferred.contains_key(s));
        let mut trouble = Vec::new();
        for (&seg, st) in self.segs.iter_mut() {
            let before = lens_before.get(&seg).copied().unwrap_or(0);
            // A torn end at or below `before` is stale: a marker write that
            // failed outside a batch (the roll back's own slide, or the
            // next append finishing it), written over since.
            let torn = self.torn.remove(&seg).filter(|&end| end > before);
            if st.len == before && lens_before.contains_key(&seg) {
                // Only a failed write's bytes to undo: over zeros written
                // earlier (a spare, or zero-filled space), zeros again keep
                // the blocks written and the segment prepared.
                match torn {
                    None => continue,
                    Some(end) if end <= st.zeroed => {
                        let zeros = vec![0u8; (end - before) as usize];
                        if let Err(e) = st
                            .file
                            .write_all_at(&zeros, before)
                            .and_then(|_| st.file.sync_data())
                        {
                            trouble.push(format!("segment {seg}: {e}"));
                        }
                        continue;
                    }
                    Some(_) => {}
                }
            }
            let written = st.len.max(torn.unwrap_or(0));
            if let Err(e) = st
                .file
                .cut(before, written)
                .and_then(|_| st.file.sync_all())
            {
                trouble.push(format!("segment {seg}: {e}"));
            }
            st.len = before;
            // A device slot keeps its size and its zeros (the cut wrote
            // zeros back), so it stays prepared; a file cut is shorter,
            // and its next pages extend it.
            if !st.file.is_slot() {
                st.zeroed = before;
                st.prepared = st.prepared.min(before);
            }
            st.markers.retain(|&(o, _)| o < before);
            st.ew_pages.retain(|&(o, _)| o < before);
            // A cut only lowers the class. A marker kept may never have
            // been counted (a raise that failed after writing it) and so
            // may not be durable: it raises nothing.
            st.class = st
                .markers
                .iter()
                .map(|&(_, c)| c)
                .max()
                .unwrap_or(class::EMPTY)
                .min(st.class);
        }
        self.torn.clear();
        if self.next_seq > first_seq {
            self.meta.discarded.push((first_seq, self.next_seq - 1));
            let zones = self.zones().to_vec();
            if let Err(e) = self.meta.store(&zones) {
                self.roll_back_waits(StoreError::from_write("metadata", &e));
            }
        }
        if let Err(e) = self.ensure_window() {
            self.roll_back_waits(e);
        }
        if !trouble.is_empty() {
            let why = trouble.join("; ");
            *crate::locks::lock(&self.shared.refusing) = Some(format!(
                "a failed batch could not be rolled back ({why}); restart the service"
            ));
            self.failed = Some(why);
        }
    }

    /// Marks the roll back unfinished because of `e`, for appends and
    /// `/health` to see.
    fn roll_back_waits(&mut self, e: StoreError) {
        self.unfinished_roll_back = true;
        *crate::locks::lock(&self.shared.refusing) = Some(format!(
            "a failed batch's roll back is waiting to be finished: {e}"
        ));
    }

    /// Finishes a roll back that could not ([`Writer::unfinished_roll_back`]):
    /// the metadata with its discarded stripe numbers, then the windows.
    /// Until it succeeds no stripe is written, so a crash meanwhile finds
    /// the rolled-back numbers at the log's end, where they hide nothing.
    fn finish_roll_back(&mut self) -> Result<(), StoreError> {
        let zones = self.zones().to_vec();
        let r = self
            .meta
            .store(&zones)
            .map_err(|e| StoreError::from_write("metadata", &e))
            .and_then(|()| self.ensure_window());
        match r {
            Ok(()) => {
                self.unfinished_roll_back = false;
                *crate::locks::lock(&self.shared.refusing) = None;
                Ok(())
            }
            Err(e) => {
                self.roll_back_waits(e.clone());
                Err(e)
            }
        }
    }

    fn alloc_seq(&mut self) -> u64 {
        let s = self.next_seq;
        self.next_seq += 1;
        s
    }

    /// Writes the batch: fragment stripes and their end-writes first, then
    /// root stripes and theirs (a root never points at an incomplete
    /// stripe). Returns every end-write, fragments first.
    fn write_batch(
        &mut self,
        pending: &[Pending],
        first_seq: u64,
    ) -> Result<Vec<Written>, StoreError> {
        let cap =
            self.shared.config.data_shards * (self.shared.config.page_bytes as usize - HEADER);
        let mut fragments: Vec<(u64, &[u8])> = Vec::new();
        let mut roots: Vec<(u64, Vec<RootRef<'_>>)> = Vec::new();
        let mut cur: Vec<RootRef<'_>> = Vec::new();
        let mut cur_size = stripe::ROOT_COUNT_BYTES;
        for p in pending {
            let len = p.bytes.len();
            // Whole in a root stripe of its own, count included; one
            // byte more and its head goes to a fragment stripe (a record
            // that fit without the count was refused as too large).
            let small =
                stripe::ROOT_COUNT_BYTES + stripe::root_entry_overhead(&p.meta.log, 0) + len <= cap;
            let tail_len = if small { len } else { len.min(cap / 4) };
            let mut frag_ids = Vec::new();
            for chunk in p.bytes[..len - tail_len].chunks(cap) {
                let seq = self.alloc_seq();
                fragments.push((seq, chunk));
                frag_ids.push(seq);
            }
            let size = stripe::root_entry_overhead(&p.meta.log, frag_ids.len()) + tail_len;
            if size + stripe::ROOT_COUNT_BYTES > cap {
                return Err(StoreError::TooLarge {
                    len,
                    limit: self.shared.config.max_record_bytes as usize,
                });
            }
            if cur_size + size > cap && !cur.is_empty() {
                let seq = self.alloc_seq();
                roots.push((seq, std::mem::take(&mut cur)));
                cur_size = stripe::ROOT_COUNT_BYTES;
            }
            cur_size += size;
            cur.push(RootRef {
                meta: &p.meta,
                fragments: frag_ids,
                tail: &p.bytes[len - tail_len..],
            });
        }
        if !cur.is_empty() {
            let seq = self.alloc_seq();
            roots.push((seq, cur));
        }
        let mut all = Vec::new();
        if !fragments.is_empty() {
            let bodies = fragments
                .into_iter()
                .map(|(seq, b)| (seq, Body::Fragment(b)))
                .collect();
            all = self.write_stripes(Kind::Unordered, bodies, first_seq)?;
        }
        let bodies = roots
            .into_iter()
            .map(|(seq, entries)| (seq, Body::Root(entries)))
            .collect();
        all.extend(self.write_stripes(Kind::Ordered, bodies, first_seq)?);
        Ok(all)
    }

    /// Writes stripes in groups that fit a segment, each group: pages,
    /// fsync, end-writes, fsync.
    fn write_stripes(
        &mut self,
        kind: Kind,
        stripes: Vec<(u64, Body<'_>)>,
        batch_seq: u64,
    ) -> Result<Vec<Written>, StoreError> {
        let k = self.shared.config.data_shards;
        let half = self.shared.config.segment_bytes / 2;
        let mut out = Vec::new();
        let mut group = Vec::new();
        let mut group_bytes = 0u64;
        for (seq, body) in stripes {
            let page_len = (HEADER + body.len().div_ceil(k).max(1)) as u64;
            if group_bytes + page_len > half && !group.is_empty() {
                out.extend(self.write_group(kind, std::mem::take(&mut group), batch_seq)?);
                group_bytes = 0;
            }
            group_bytes += page_len;
            group.push((seq, body));
        }
        if !group.is_empty() {
            out.extend(self.write_group(kind, group, batch_seq)?);
        }
        Ok(out)
    }

    fn write_group(
        &mut self,
        kind: Kind,
        group: Vec<(u64, Body<'_>)>,
        batch_seq: u64,
    ) -> Result<Vec<Written>, StoreError> {
        let (k, m) = (
            self.shared.config.data_shards,
            self.shared.config.parity_shards,
        );
        let per_seg: u64 = group
            .iter()
            .map(|(_, b)| (HEADER + b.len().div_ceil(k).max(1)) as u64)
            .sum();
        self.make_room(kind, per_seg)?;
        let window = self.window(kind);
        // The page and payload buffers are the writer's, reused from group
        // to group: fresh multi-MiB buffers cost a page fault and a zeroed
        // page per 4 KiB, which was a fifth of the writer's time.
        let mut bufs = std::mem::take(&mut self.page_bufs);
        bufs.resize_with(window.len(), Vec::new);
        for b in &mut bufs {
            b.clear();
            b.reserve(per_seg as usize);
        }
        let mut payload = std::mem::take(&mut self.payload_buf);
        let mut refs = Vec::with_capacity(group.len());
        for (seq, body) in group {
            let pages: Vec<(u64, u64)> = window
                .iter()
                .zip(&bufs)
                .map(|(&seg, b)| (seg, self.segs[&seg].len + b.len() as u64))
                .collect();
            let (bytes, metas): (&[u8], Vec<EntryMeta>) = match &body {
                Body::Fragment(b) => (b, Vec::new()),
                Body::Root(entries) => {
                    let offsets = stripe::encode_root_refs_into(&mut payload, entries);
                    let metas = entries
                        .iter()
                        .zip(offsets)
                        .map(|(e, off)| EntryMeta {
                            offset: if e.fragments.is_empty() {
                                off
                            } else {
                                stripe::FRAGMENTED
                            },
                            ..(*e.meta).clone()
                        })
                        .collect();
                    (&payload, metas)
                }
            };
            let shard_len = stripe::encode_pages_into(&mut bufs, &self.rs, kind, seq, bytes)
                .map_err(StoreError::WriteFailed)?;
            refs.push((
                StripeRef {
                    seq,
                    kind,
                    k: k as u8,
                    m: m as u8,
                    shard_len,
                    payload_len: bytes.len() as u32,
                    pages,
                },
                metas,
            ));
        }
        let written: Vec<(u64, &[u8])> = window
            .iter()
            .copied()
            .zip(bufs.iter().map(|b| &b[..]))
            .collect();
        let result = self.write_and_sync(&written, true);
        drop(written);
        self.keep_buffers(bufs, payload);
        result?;
        let max_seq = refs.iter().map(|(r, _)| r.seq).max().unwrap_or(0);
        for &s in &window {
            let st = self
                .segs
                .get_mut(&s)
                .ok_or_else(|| vanished("window segment"))?;
            st.max_seq = st.max_seq.max(max_seq);
        }
        // End-writes: one page per stripe, the same bytes on three segments.
        let mut ew_total = 0u64;
        let mut ews = Vec::with_capacity(refs.len());
        let mut bodies = Vec::with_capacity(refs.len());
        // Room first: sliding changes the base recorded in the end-write.
        let approx: u64 = refs
            .iter()
            .map(|(r, metas)| {
                (HEADER
                    + 64
                    + 16 * r.pages.len()
                    + metas.iter().map(|m| 37 + m.log.len()).sum::<usize>()) as u64
            })
            .sum();
        self.make_room(Kind::EndWrite, approx)?;
        for (r, metas) in refs {
            let ew = EndWrite {
                ew_base: self.base,
                batch_seq,
                stripe: r,
                entries: metas,
            };
            let p = ew_page(&ew);
            ew_total += p.len() as u64;
            let page_crc = page::stored_crc(&p);
            bodies.push(p);
            ews.push(Written { ew, page_crc });
        }
        debug_assert!(ew_total <= approx);
        let ew_window = self.window(Kind::EndWrite);
        let mut written = Vec::with_capacity(ew_window.len());
        for &seg in &ew_window {
            let st = self
                .segs
                .get_mut(&seg)
                .ok_or_else(|| vanished("end-write segment"))?;
            let mut off = st.len;
            let mut buf = Vec::with_capacity(ew_total as usize);
            for (p, w) in bodies.iter().zip(&ews) {
                st.ew_pages.push((off, w.ew.stripe.seq));
                off += p.len() as u64;
                buf.extend_from_slice(p);
            }
            st.max_seq = st.max_seq.max(max_seq);
            written.push((seg, buf));
        }
        let written: Vec<(u64, &[u8])> = written.iter().map(|(s, b)| (*s, &b[..])).collect();
        self.write_and_sync(&written, false)?;
        self.shared
            .counters
            .stripes
            .fetch_add(ews.len() as u64, Ordering::Relaxed);
        Ok(ews)
    }

    /// Puts the group buffers back for the next group, dropping any that
    /// one huge group grew past [`KEEP_BUFFER_BYTES`].
    fn keep_buffers(&mut self, mut bufs: Vec<Vec<u8>>, mut payload: Vec<u8>) {
        for b in &mut bufs {
            if b.capacity() > KEEP_BUFFER_BYTES {
                *b = Vec::new();
            }
        }
        if payload.capacity() > KEEP_BUFFER_BYTES {
            payload = Vec::new();
        }
        self.page_bufs = bufs;
        self.payload_buf = payload;
    }

    /// Appends each buffer to its segment; in strict end-write order the
    /// segments are fsynced at once, otherwise they join the batch's single
    /// fsync round. `data`: the buffers are data pages, which may be
    /// written directly ([`crate::direct`]); end-writes never are.
    fn write_and_sync(&mut self, bufs: &[(u64, &[u8])], data: bool) -> Result<(), StoreError> {
        // End-writes wait behind the batch's held-back pages.
        let pages_held = !data && self.deferred.keys().any(|s| !self.late.contains(s));
        for (seg, buf) in bufs {
            let st = self.segs.get_mut(seg).ok_or_else(|| vanished("segment"))?;
            let fsync = self.shared.config.fsync;
            // A large write of data pages is held back for the round and
            // its whole blocks written directly; so is any write behind a
            // held-back one, to keep the segment's writes in order.
            let direct = if fsync
                && data
                && self.shared.config.tuning.direct_writes
                && buf.len() >= self.shared.config.tuning.direct_write_min_bytes as usize
                && direct::middle(st.len, buf.len()).is_some()
            {
                direct_fd(*seg, st)
            } else {
                None
            };
            let held =
                pages_held || self.deferred.contains_key(seg) || self.round_held.contains(seg);
            let now = direct.is_none() && !held;
            if !now {
                let w = DeferredWrite::new(st.file.clone(), direct, st.len, buf, &self.direct_bufs);
                self.shared
                    .counters
                    .direct_write_bytes
                    .fetch_add(w.middle().len() as u64, Ordering::Relaxed);
                self.deferred.entry(*seg).or_default().push(w);
                if !data {
                    self.late.insert(*seg);
                }
            } else if let Err(e) =
                self.shared
                    .faults
                    .write_padded_at(&st.file, buf, block_pad(st, buf.len()), st.len)
            {
                // Part of it may be there: the roll back cuts it off.
                self.torn.insert(*seg, st.len + buf.len() as u64);
                return Err(StoreError::from_write(format!("segment {seg}"), &e));
            }
            if now && fsync && buf.len() <= EARLY_WRITE_BACK_MAX {
                // Its I/O overlaps the round in flight (see the function).
                st.file.start_write_back(st.len, buf.len() as u64);
            }
            st.len += buf.len() as u64;
            st.zeroed = st.zeroed.max(st.len);
            self.shared
                .counters
                .bytes_written
                .fetch_add(buf.len() as u64, Ordering::Relaxed);
            self.dirty.insert(*seg);
        }
        if self.shared.config.tuning.strict_end_writes {
            self.sync_dirty()?;
        }
        Ok(())
    }

    /// fsyncs every segment written since the last round, in parallel
    /// (they are independent devices in a real deployment).
    fn sync_dirty(&mut self) -> Result<(), StoreError> {
        let r = self.start_sync(None, false).map_or(Ok(()), wait_round);
        self.round_held.clear();
        r
    }

    /// Starts the fsync round of every segment written since the last one,
    /// on the helpers; `None` when there is nothing to sync (or fsync is
    /// off). With `wake`, the round's end is sent to the writer's own queue
    /// as `Cmd::Synced(wake)`, so an idle writer answers the batch at once.
    /// With `small` the writer runs the round itself if every file of it
    /// is only written back, with no writes held back for it, and it is
    /// over when this returns ([`Round::ran_here`]; no wake-up needed).
    /// An fsync of its own per file (a device flush each, and perhaps a
    /// journal commit) is left to the helpers, which overlap them, and so
    /// are held-back device writes (`direct_writes`), which the helpers
    /// issue in parallel.
    fn start_sync(&mut self, wake: Option<u64>, small: bool) -> Option<(Vec<u64>, Round)> {
        let dirty = std::mem::take(&mut self.dirty);
        if !self.shared.config.fsync || dirty.is_empty() {
            return None;
        }
        let (segs, files): (Vec<u64>, Vec<(Arc<SegFile>, How)>) = dirty
            .iter()
            .filter_map(|&s| {
                let st = self.segs.get(&s)?;
                Some((s, (st.file.clone(), self.how_durable(s, st))))
            })
            .unzip();
        let here = small
            && files
                .iter()
                .all(|(_, how)| matches!(how, How::WriteBack(_)))
            && segs.iter().all(|s| !self.deferred.contains_key(s));
        let started = Instant::now();
        let shared = self.shared.clone();
        let tx = wake.filter(|_| !here).map(|seq| (seq, self.wake.clone()));
        let on_done: OnDone = Arc::new(move || {
            shared.stages.round.record(started.elapsed());
            // Full means commands are queued: handling any of them
            // finishes the round, so the wake-up is not needed.
            if let Some((seq, tx)) = &tx {
                if let Some(tx) = tx.upgrade() {
                    let _ = tx.try_send(Cmd::Synced(*seq));
                }
            }
        });
        let n = files.len() as u64;
        let files: Vec<RoundFile> = segs
            .iter()
            .zip(files)
            .map(|(s, (file, how))| RoundFile {
                writes: self.deferred.remove(s).unwrap_or_default(),
                late: self.late.contains(s),
                ..RoundFile::sync(file, how)
            })
            .collect();
        self.round_held = segs
            .iter()
            .zip(&files)
            .filter(|(_, f)| !f.writes.is_empty())
            .map(|(&s, _)| s)
            .collect();
        // Writes of segments that are gone (none expected) are dropped.
        self.deferred.clear();
        self.late.clear();
        let round = if here {
            self.shared
                .counters
                .rounds_on_writer
                .fetch_add(1, Ordering::Relaxed);
            self.syncer.run_here(files, on_done)
        } else {
            self.syncer.start(files, on_done)
        };
        let (write_backs, flushes) = (round.write_backs(), round.flushes());
        let c = &self.shared.counters;
        c.fsyncs
            .fetch_add(n - write_backs + flushes, Ordering::Relaxed);
        c.write_backs.fetch_add(write_backs, Ordering::Relaxed);
        c.flushes.fetch_add(flushes, Ordering::Relaxed);
        Some((segs, round))
    }

    /// The batch is durable: index it, answer, and push it to
    /// subscribers. Returns its appends, whose request ids the caller
    /// records ([`Writer::remember_ids`]) once the next round is started.
    #[must_use = "the answered appends' request ids must be remembered"]
    fn publish(
        &mut self,
        mut pending: Vec<Pending>,
        ews: Vec<Written>,
        batch_seq: u64,
    ) -> Vec<Pending> {
        let started = Instant::now();
        {
            let mut idx = self.shared.index_mut();
            for Written { ew, .. } in &ews {
                for (i, e) in ew.entries.iter().enumerate() {
                    let l = idx
                        .logs
                        .entry(e.log.clone())
                        .or_insert_with(|| LogIndex::starting_at(e.pos));
                    debug_assert_eq!(l.tail(), e.pos);
                    l.locs.push_back(Loc {
                        stripe: ew.stripe.seq,
                        idx: i as u32,
                        len: e.len,
                        batch_seq,
                        offset: e.offset,
                        crc: e.crc,
                    });
                }
                idx.stripes.insert(ew.stripe.seq, ew.stripe.clone());
            }
        }
        for w in ews {
            let live = LiveEndWrite {
                base: w.ew.ew_base,
                page_crc: w.page_crc,
            };
            self.ews.insert(w.ew.stripe.seq, live);
        }
        let c = &self.shared.counters;
        c.batches.fetch_add(1, Ordering::Relaxed);
        let subs = self.shared.subs().clone();
        let acked = Instant::now();
        // Counted before any answer goes out, so whoever gets one sees
        // its append in the figures.
        self.shared.stages.acked.record_runs(
            pending
                .iter()
                .map(|p| acked.saturating_duration_since(p.at)),
        );
        c.appends.fetch_add(pending.len() as u64, Ordering::Relaxed);
        c.append_bytes.fetch_add(
            pending.iter().map(|p| p.bytes.len() as u64).sum(),
            Ordering::Relaxed,
        );
        for p in &mut pending {
            for r in p.replies.drain(..) {
                let _ = r.send(Ok(p.meta.pos));
            }
            if let Some(tx) = subs.get(&p.meta.log) {
                if tx.receiver_count() > 0 {
                    let e: Entry = Arc::from(&p.bytes[..]);
                    let _ = tx.send((p.meta.pos, e));
                }
            }
        }
        self.shared.stages.answer.record(started.elapsed());
        pending
    }

    /// Records the request ids of answered appends, so that a retry gets
    /// the same position. Called after the answers went out and the next
    /// round started. The table is large (a million ids by default) and
    /// its inserts and removals miss the cache: done before the answers,
    /// they held the last answer of a round until 29–32 µs after the
    /// round's end at the median (11–12 µs without) and 121–153 µs at the
    /// p99 (54–125), and the client's p99 at 150K appends/s was higher in
    /// seven of eight paired probes (docs/benchmarks-log-history.md). A
    /// retry reaches this thread only after this returns, so it finds its id
    /// either way.
    fn remember_ids(&mut self, answered: &[Pending]) {
        for p in answered {
            if p.meta.client != 0 {
                self.request_ids
                    .remember((p.meta.client, p.meta.request), p.meta.pos);
            }
        }
    }

    fn trim(&mut self, log: &str, pos: u64) -> Result<(), StoreError> {
        let (first, tail) = {
            let idx = self.shared.index();
            idx.logs
                .get(log)
                .map(|l| (l.first, l.tail()))
                .unwrap_or((0, 0))
        };
        if pos > tail {
            return Err(StoreError::TrimBeyondTail {
                log: log.into(),
                pos,
                tail,
            });
        }
        if pos <= first {
            return Ok(());
        }
        self.meta.logs.insert(
            log.to_string(),
            LogMeta {
                first: pos,
                tail_floor: tail,
            },
        );
        self.meta.stable_seq = self.next_seq.saturating_sub(1);
        let zones = self.zones().to_vec();
        self.meta
            .store(&zones)
            .map_err(|e| StoreError::from_write("metadata", &e))?;
        {
            let mut idx = self.shared.index_mut();
            // The log exists: pos > first >= 0 and pos <= tail were checked.
            if let Some(l) = idx.logs.get_mut(log) {
                let drop = (pos - l.first) as usize;
                l.locs.drop_front(drop);
                l.first = pos;
            }
        }
        self.free_segments();
        // The reserve went into the metadata write if the disk was full;
        // the segments just deleted may have made room for it again.
        self.meta.keep_reserve(&zones);
        Ok(())
    }

    /// The lowest stripe anything live may need.
    pub fn live_floor(&self) -> u64 {
        let idx = self.shared.index();
        idx.logs
            .values()
            .filter_map(|l| l.locs.front().map(|loc| loc.batch_seq))
            .min()
            .unwrap_or(self.next_seq)
    }

    /// Deletes sealed segments whose every page and end-write is below the
    /// live floor, and forgets those stripes.
    pub fn free_segments(&mut self) {
        let floor = self.live_floor();
        let victims: Vec<u64> = self
            .segs
            .range(..self.base)
            .filter(|(_, s)| s.max_seq < floor)
            .map(|(&id, _)| id)
            .collect();
        for seg in victims {
            if let Err(e) = self.remove_segment(seg) {
                tracing::warn!(segment = seg, error = %e, "could not free segment");
                continue;
            }
            self.segs.remove(&seg);
            self.shared.files_mut().remove(&seg);
            self.shared
                .counters
                .segments_freed
                .fetch_add(1, Ordering::Relaxed);
        }
        self.ews = self.ews.split_off(&floor);
        let mut idx = self.shared.index_mut();
        idx.stripes = idx.stripes.split_off(&floor);
    }

    /// Where each live end-write's three copies are.
    fn end_write_copies(&self) -> Vec<EndWriteCopies> {
        let mut found: HashMap<u64, Vec<(u64, u64, Arc<SegFile>)>> = HashMap::new();
        for (&seg, st) in &self.segs {
            for &(off, seq) in &st.ew_pages {
                let in_set = self
                    .ews
                    .get(&seq)
                    .is_some_and(|l| (l.base..l.base + END_WRITE_COPIES as u64).contains(&seg));
                if in_set {
                    found
                        .entry(seq)
                        .or_default()
                        .push((seg, off, st.file.clone()));
                }
            }
        }
        self.ews
            .iter()
            .map(|(&seq, live)| {
                let here = found.remove(&seq).unwrap_or_default();
                let places = (live.base..live.base + END_WRITE_COPIES as u64)
                    .map(|seg| {
                        let at = here.iter().find(|c| c.0 == seg).map(|c| (c.1, c.2.clone()));
                        (seg, at)
                    })
                    .collect();
                EndWriteCopies {
                    seq,
                    page_crc: live.page_crc,
                    places,
                }
            })
            .collect()
    }

    /// Deletes segment `seg`'s file, or frees its device slot (then the
    /// spare refill zeroes it for reuse).
    fn remove_segment(&self, seg: u64) -> io::Result<()> {
        let zone = segment::zone(self.zones(), seg);
        if let Some(dev) = self.shared.device(zone) {
            if let Some(slot) = dev.slot_of(seg) {
                dev.free(slot)?;
                dev.sync()?;
            }
            if let Some(s) = &self.spares {
                s.wake();
            }
            return Ok(());
        }
        let path = segment::path(self.zones(), seg);
        std::fs::remove_file(&path)?;
        if let Some(dir) = path.parent() {
            let _ = segment::sync_dir(dir);
        }
        Ok(())
    }

    /// Writes the rebuilt bytes of segment `seg` into a zeroed slot of its
    /// zone's device, makes them durable, then points the slot's header at
    /// `seg` and frees the slot that held it: a crash before the header
    /// leaves the old slot in charge, after it the newer header wins
    /// ([`crate::device`]).
    fn replace_in_slot(&self, seg: u64, bytes: &[u8]) -> Result<(SegFile, bool), String> {
        let zone = segment::zone(self.zones(), seg);
        let dev = self
            .shared
            .device(zone)
            .ok_or_else(|| format!("zone {zone} has no device"))?;
        let at = |e: io::Error| format!("{}: {e}", dev.path().display());
        let (slot, prepared) = dev.zeroed_slot().map_err(at)?.ok_or_else(|| {
            format!(
                "{} has no free slot to rebuild segment {seg} in; trim the log",
                dev.path().display()
            )
        })?;
        let old = dev.slot_of(seg);
        let written = dev
            .seg_file(slot)
            .and_then(|f| f.write_all_at(bytes, 0).and_then(|_| f.sync_data()));
        if let Err(e) = written {
            // Its zeros are gone: free, not spare.
            dev.give_back(slot, crate::device::Held::Free);
            return Err(at(e));
        }
        let file = dev.assign(slot, seg).map_err(|e| {
            dev.give_back(slot, crate::device::Held::Free);
            at(e)
        })?;
        dev.sync().map_err(at)?;
        if let Some(old) = old {
            dev.free(old).and_then(|_| dev.sync()).map_err(at)?;
        }
        if let Some(s) = &self.spares {
            s.wake();
        }
        Ok((file, prepared))
    }

    /// Rebuilds segment `seg` beside the old file and renames it over:
    /// every stripe page that reads intact as it is, unless its stripe is
    /// in `liars` (a page found to pass its checksum with other bytes than
    /// written), the others from parity (byte-identical); markers and
    /// end-writes where they were, pads in unaccounted gaps; if part of the
    /// file was unaccounted for, the end-writes it held are appended again
    /// (they are found in the other two copies).
    ///
    /// Intact pages are kept rather than rebuilt because a rebuild trusts
    /// every other page of the stripe: with a lying page elsewhere in it,
    /// the rebuilt page would be wrong too (sealed with a good checksum),
    /// and two faults in a one-parity stripe cannot be undone. A scrub
    /// that found lying pages on two segments sharing stripes used to
    /// repair the first segment from the second's lie.
    pub fn repair(&mut self, seg: u64, liars: &[u64]) -> Result<(), String> {
        let refs: Vec<StripeRef> = {
            let idx = self.shared.index();
            idx.stripes
                .values()
                .filter(|r| r.pages.iter().any(|p| p.0 == seg))
                .cloned()
                .collect()
        };
        let mut pieces: Vec<(u64, Vec<u8>)> = Vec::new();
        for r in &refs {
            let Some(j) = r.pages.iter().position(|p| p.0 == seg) else {
                continue;
            };
            let (k, m) = (r.k as usize, r.m as usize);
            let own = crate::store::read_page(&self.shared, r, j);
            let body = match own {
                Some(body) if !liars.contains(&r.seq) => body,
                _ => {
                    let mut shards: Vec<Option<Vec<u8>>> = vec![None; k + m];
                    // Read every other page; parity decides.
                    for (i, slot) in shards.iter_mut().enumerate() {
                        if i != j {
                            *slot = crate::store::read_page(&self.shared, r, i);
                        }
                    }
                    let mut all = stripe::rebuild(shards, k, m)
                        .map_err(|e| format!("stripe {}: {e}", r.seq))?;
                    all.swap_remove(j)
                }
            };
            let h = Header {
                kind: r.kind,
                shard: j as u8,
                k: r.k,
                m: r.m,
                body_len: r.shard_len,
                stripe: r.seq,
                payload_len: r.payload_len,
            };
            pieces.push((r.pages[j].1, page::encode(&h, &body)));
        }
        let (known_len, damaged, markers, ew_pages, cls) = match self.segs.get(&seg) {
            Some(s) => (
                Some(s.len),
                s.damaged_at.is_some(),
                s.markers.clone(),
                s.ew_pages.clone(),
                s.class,
            ),
            None => (None, true, Vec::new(), Vec::new(), self.target_class(seg)),
        };
        let in_era = |base: u64| base <= seg && seg < base + END_WRITE_COPIES as u64;
        let era_ews = self.ews.values().any(|live| in_era(live.base));
        // Where the surviving end-write copies are: this segment's own
        // pages first (if it is only partly damaged), then the others of
        // each copy set.
        let copies: HashMap<u64, Vec<(u64, u64)>> = {
            let mut m: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
            let lo = seg.saturating_sub(END_WRITE_COPIES as u64 - 1);
            for other in lo..seg + END_WRITE_COPIES as u64 {
                if let Some(st) = self.segs.get(&other) {
                    for &(off, seq) in &st.ew_pages {
                        m.entry(seq).or_default().push((other, off));
                    }
                }
            }
            m
        };
        let ew_copy = |seq: u64| -> Option<Vec<u8>> {
            let crc = self.ews.get(&seq)?.page_crc;
            let mut places = copies.get(&seq)?.clone();
            places.sort_by_key(|&(s, _)| s != seg);
            places.into_iter().find_map(|(s, off)| {
                read_ew_page(&self.segs.get(&s)?.file, off, seq)
                    .filter(|p| page::stored_crc(p) == crc)
            })
        };
        if known_len.is_none() && refs.is_empty() && !era_ews {
            return Err(format!("segment {seg} holds nothing live; not rebuilt"));
        }
        for (off, c) in &markers {
            pieces.push((*off, page::class_marker(*c)));
        }
        for (off, seq) in &ew_pages {
            if self.ews.contains_key(seq) {
                if let Some(page) = ew_copy(*seq) {
                    pieces.push((*off, page));
                }
            }
        }
        pieces.sort_by_key(|p| p.0);
        let mut file = Vec::new();
        for (off, bytes) in &pieces {
            let off = *off as usize;
            if off < file.len() {
                let kinds: Vec<String> = pieces
                    .iter()
                    .take(6)
                    .map(|(o, b)| {
                        format!(
                            "{o}:{:?}/{}",
                            page::header(b).map(|h| (h.kind, h.stripe)),
                            b.len()
                        )
                    })
                    .collect();
                return Err(format!(
                    "segment {seg}: overlapping pages at {off} ({})",
                    kinds.join(", ")
                ));
            }
            let gap = off - file.len();
            if gap > 0 {
                if gap < HEADER {
                    return Err(format!(
                        "segment {seg}: gap of {gap} bytes at {}",
                        file.len()
                    ));
                }
                file.extend_from_slice(&page::pad(gap));
            }
            file.extend_from_slice(bytes);
        }
        let mut new_markers = markers.clone();
        let mut new_ew = ew_pages.clone();
        if damaged {
            // Refill: the class, then every end-write of the eras in which
            // this segment was one of the three end-write segments.
            let off = file.len() as u64;
            file.extend_from_slice(&page::class_marker(cls));
            new_markers.push((off, cls));
            let have: BTreeSet<u64> = ew_pages.iter().map(|&(_, s)| s).collect();
            for (&seq, live) in &self.ews {
                if in_era(live.base) && !have.contains(&seq) {
                    if let Some(page) = ew_copy(seq) {
                        new_ew.push((file.len() as u64, seq));
                        file.extend_from_slice(&page);
                    }
                }
            }
        } else if let Some(len) = known_len {
            let len = len as usize;
            if len > file.len() {
                let gap = len - file.len();
                if gap >= HEADER {
                    file.extend_from_slice(&page::pad(gap));
                }
            }
        }
        let (f, slot_prepared) = if self
            .shared
            .device(segment::zone(self.zones(), seg))
            .is_some()
        {
            self.replace_in_slot(seg, &file)?
        } else {
            let path = segment::path(self.zones(), seg);
            let tmp = path.with_extension("repair");
            std::fs::write(&tmp, &file).map_err(|e| format!("write {}: {e}", tmp.display()))?;
            File::open(&tmp)
                .and_then(|f| f.sync_all())
                .map_err(|e| format!("fsync {}: {e}", tmp.display()))?;
            std::fs::rename(&tmp, &path).map_err(|e| format!("rename {}: {e}", path.display()))?;
            if let Some(dir) = path.parent() {
                segment::sync_dir(dir).map_err(|e| e.to_string())?;
            }
            (
                segment::open(&path, false).map_err(|e| e.to_string())?,
                false,
            )
        };
        // A slot is zeros past the data.
        let zeroed = if f.is_slot() {
            f.size().map_err(|e| e.to_string())?
        } else {
            file.len() as u64
        };
        let prepared = if slot_prepared { zeroed } else { 0 };
        let f = Arc::new(f);
        self.shared.files_mut().insert(seg, f.clone());
        let max_seq = refs
            .iter()
            .map(|r| r.seq)
            .chain(new_ew.iter().map(|e| e.1))
            .max()
            .unwrap_or(0);
        // The class the writer counts, not the highest marker: a marker
        // of a raise that failed is in the record (it is in the file) but
        // was never counted.
        let class = cls;
        self.segs.insert(
            seg,
            SegState {
                file: f,
                len: file.len() as u64,
                zeroed,
                prepared,
                class,
                markers: new_markers,
                ew_pages: new_ew,
                max_seq,
                damaged_at: None,
                pending_cut: None,
                direct: DirectFd::Unopened,
            },
        );
        self.shared
            .counters
            .segments_repaired
            .fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            segment = seg,
            bytes = file.len(),
            stripes = refs.len(),
            "segment repaired"
        );
        Ok(())
    }
}

/// Reads the end-write page of stripe `seq` at `off`, if it is intact.
pub(crate) fn read_ew_page(file: &SegFile, off: u64, seq: u64) -> Option<Vec<u8>> {
    let mut head = [0u8; HEADER];
    file.read_exact_at(&mut head, off).ok()?;
    let h = page::header(&head).ok()?;
    let mut buf = vec![0u8; h.page_len() as usize];
    file.read_exact_at(&mut buf, off).ok()?;
    let (h, _) = page::decode(&buf).ok()?;
    (h.kind == Kind::EndWrite && h.stripe == seq).then_some(buf)
}

/// The page bytes of an end-write.
pub(crate) fn ew_page(ew: &EndWrite) -> Vec<u8> {
    ew_page_of(&stripe::encode_end_write(ew), ew.stripe.seq)
}

/// An end-write page of `body` whose header names stripe `seq` (tests
/// give it bodies that do not agree with it).
pub(crate) fn ew_page_of(body: &[u8], seq: u64) -> Vec<u8> {
    page::encode(
        &Header {
            kind: Kind::EndWrite,
            shard: 0,
            k: 0,
            m: 0,
            body_len: body.len() as u32,
            stripe: seq,
            payload_len: 0,
        },
        body,
    )
}
