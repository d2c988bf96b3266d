//! The storage engine's public face: append (through the single writer
//! thread, which batches, stripes, fsyncs and writes end-writes), read (any
//! thread, straight from the segment files, rebuilding lost pages from
//! parity), trim, subscribe, scrub.

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::JoinHandle;
use std::time::Instant;

use bytes::Bytes;
use lru::LruCache;
use melddb::Entry;
use serde::Serialize;
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::chunked::Chunked;
use crate::config::Config;
use crate::error::{OpenError, StoreError};
use crate::locks;
use crate::page::{self, Kind};
pub use crate::scrub::ScrubReport;
use crate::segment::{Faults, SegFile};
use crate::stripe::{self, RootEntry, StripeRef};
pub use crate::writer::SegmentInfo;
use crate::writer::{AppendReq, Cmd};

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
    /// [`Store::shutdown`] once the writer (the only thread that writes)
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

/// How a store opened: what recovery found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RecoveryReport {
    /// Segment files found.
    pub segments: usize,
    /// Bytes of data in them (pages, not the zero-filled space after).
    pub bytes: u64,
    /// Bytes recovery read from them: page headers, end-write and marker
    /// pages, each segment's last page, and the zero-filled tails of
    /// segments still open for writing. Page bodies are not read, so this
    /// grows with the number of pages and the window, not the log's size.
    pub bytes_read: u64,
    /// End-write records read (all copies).
    pub end_writes: u64,
    /// Complete stripes indexed.
    pub stripes: u64,
    /// Records indexed.
    pub records: u64,
    /// Torn tails cut off (bytes).
    pub torn_bytes: u64,
    /// Pages whose CRC failed during the scan (other copies or parity used).
    pub corrupt_pages: u64,
    /// Stripes dropped because an earlier stripe of their batch never
    /// completed (none of them had been acknowledged).
    pub dropped_stripes: u64,
    /// Segment files rebuilt from parity and the other end-write copies.
    pub repaired_segments: Vec<u64>,
    /// Wall time in milliseconds.
    pub millis: u64,
}

/// Counters at one moment.
#[derive(Debug, Clone, Serialize)]
pub struct Stats {
    /// Acknowledged appends since open.
    pub appends: u64,
    /// Their bytes.
    pub append_bytes: u64,
    /// Writer batches.
    pub batches: u64,
    /// Stripes written.
    pub stripes: u64,
    /// Bytes written to segments (pages, parity, end-writes).
    pub bytes_written: u64,
    /// fsync calls (`fdatasync` of segment files, the round-ending
    /// flushes included).
    pub fsyncs: u64,
    /// Segment files a round wrote back without an fsync of their own,
    /// made durable by the round's device flush instead
    /// (`flush_once_per_device`).
    pub write_backs: u64,
    /// Device cache flushes that ended rounds with write-back files (one
    /// per device per such round; also counted in `fsyncs`).
    pub flushes: u64,
    /// fsync rounds the writer ran itself instead of the helpers (rounds
    /// of batches within `writer_round_max_bytes`).
    pub rounds_on_writer: u64,
    /// Bytes of `bytes_written` written with `O_DIRECT` by the fsync
    /// helpers (`direct_writes`), not copied into the page cache.
    pub direct_write_bytes: u64,
    /// Microseconds the writer spent building and writing batches (stripes,
    /// parity, pages, end-writes), without the fsyncs: the total of the
    /// write stage.
    pub write_us: u64,
    /// Microseconds the writer was blocked on fsync rounds: the total of
    /// the round-wait stage.
    pub sync_us: u64,
    /// Record reads.
    pub reads: u64,
    /// Reads answered from whole stripes (page checksums, parity) rather
    /// than from the record's bytes alone: every read of a record that
    /// spans several stripes, and any read whose record bytes failed the
    /// record's checksum. Growing on records that fit one stripe means
    /// damaged pages: run a scrub.
    pub reads_whole_stripe: u64,
    /// Pages rebuilt from parity on read.
    pub pages_rebuilt: u64,
    /// Segment files rebuilt.
    pub segments_repaired: u64,
    /// Batches whose writes failed (not acknowledged).
    pub write_failures: u64,
    /// Segment files freed by trim.
    pub segments_freed: u64,
    /// Spare segment files written (`prepared_segments`) since open.
    pub segments_prepared: u64,
    /// Spare segment files ready now, all zones together.
    pub spares_ready: u64,
    /// Spares whose writing failed since open (a full disk, most likely,
    /// or one under the spares' free-space rule); the refill tries again
    /// every 10 s. A count that keeps growing means the pool will not
    /// fill: free space, or lower `prepared_segments`.
    pub spares_failed: u64,
    /// Whether acknowledged appends were synced to the disk first
    /// (`fsync`); `false` means they survive a crash of the process, not
    /// of the machine.
    pub durable: bool,
    /// Whether transparent huge pages are off for this process
    /// (`disable_transparent_huge_pages`, or whoever started it).
    pub thp_disabled: bool,
    /// The I/O scheduler of each block device under the zones and
    /// devices, read at open (empty where the OS does not show one).
    pub io_schedulers: Vec<crate::blockdev::DeviceScheduler>,
    /// Segment files now.
    pub segments: u64,
    /// Where appends spent their time since open (see
    /// [`crate::latency::Stages`]).
    pub stages: crate::latency::StagesSummary,
    /// The logs: name, first, tail.
    pub logs: Vec<(String, u64, u64)>,
}

/// Validates a log name.
pub fn check_log_name(name: &str) -> Result<(), StoreError> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(StoreError::BadLogName(name.chars().take(80).collect()))
    }
}

/// The striped, parity-protected log store. Cheap to share behind an `Arc`.
pub struct Store {
    pub(crate) shared: Arc<Shared>,
    pub(crate) tx: mpsc::Sender<Cmd>,
    writer: Mutex<Option<JoinHandle<()>>>,
    report: RecoveryReport,
    io_schedulers: Vec<crate::blockdev::DeviceScheduler>,
}

impl Store {
    /// Opens (creating or recovering) the store.
    pub fn open(config: Config) -> Result<Store, OpenError> {
        Store::open_with_faults(config, Arc::new(Faults::none()))
    }

    /// Opens with a fault injector in the write path (tests).
    pub fn open_with_faults(config: Config, faults: Arc<Faults>) -> Result<Store, OpenError> {
        config.validate()?;
        if config.tuning.disable_transparent_huge_pages {
            // Before recovery builds the index, so that it too is in
            // ordinary pages.
            crate::thp::disable();
        }
        // Zones first: a second service on them is the likeliest mistake,
        // and its message names the holder.
        let zone_locks = crate::zone_lock::ZoneLocks::take(&config.zones)?;
        let cache = NonZeroUsize::new(config.read_cache_stripes).map(LruCache::new);
        let devices = config
            .devices
            .iter()
            .enumerate()
            .map(|(z, path)| {
                crate::device::Device::open(path, z, config.zones.len(), config.segment_bytes)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let shared = Arc::new(Shared {
            config: config.clone(),
            faults,
            files: RwLock::new(BTreeMap::new()),
            devices,
            zone_locks: Mutex::new(Some(zone_locks)),
            refusing: Mutex::new(None),
            index: RwLock::new(Index::default()),
            cache: Mutex::new(cache),
            subs: Mutex::new(HashMap::new()),
            counters: Counters::default(),
            stages: Default::default(),
            stopping: Default::default(),
        });
        let (tx, rx) = mpsc::channel(config.limits.append_queue);
        let (writer, report) = crate::recovery::recover(shared.clone(), rx, tx.downgrade())?;
        let handle = std::thread::Builder::new()
            .name("melddb-log-writer".into())
            .spawn(move || writer.run())
            .map_err(|e| OpenError::Io {
                path: config.zones[0].clone(),
                source: e,
            })?;
        // Read once: the queue a latency figure was measured on belongs in
        // the log and the stats, and sysfs need not be read per request.
        let io_schedulers = crate::blockdev::schedulers(
            config
                .zones
                .iter()
                .chain(config.devices.iter())
                .map(|p| p.as_path()),
        );
        for d in &io_schedulers {
            tracing::info!(device = %d.device, scheduler = %d.scheduler, "I/O scheduler of a device under the zones");
        }
        if !config.fsync {
            // A setting that gives up durability should not go unnoticed
            // in a log that someone reads after a power loss.
            tracing::warn!("fsync = false: appends are acknowledged before they reach the disk; they survive a crash of this process, not of the machine (set fsync = true for durable appends)");
        }
        Ok(Store {
            shared,
            tx,
            writer: Mutex::new(Some(handle)),
            report,
            io_schedulers,
        })
    }

    /// What recovery found when this store opened.
    pub fn recovery(&self) -> &RecoveryReport {
        &self.report
    }

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// Checks an append's arguments and builds its request, with the
    /// receiver its answer comes to.
    fn request(
        &self,
        log: &str,
        client: u64,
        request: u64,
        bytes: Bytes,
        at: Instant,
    ) -> Result<(AppendReq, oneshot::Receiver<Result<u64, StoreError>>), StoreError> {
        check_log_name(log)?;
        let limit = self.shared.config.max_record_bytes as usize;
        if bytes.len() > limit {
            return Err(StoreError::TooLarge {
                len: bytes.len(),
                limit,
            });
        }
        let (reply, rx) = oneshot::channel();
        Ok((
            AppendReq {
                log: log.to_string(),
                client,
                request,
                bytes,
                reply,
                at,
            },
            rx,
        ))
    }

    /// Appends a record and waits until it is durable; returns its
    /// position. A non-zero `(client, request)` pair makes the append
    /// idempotent: repeating it returns the first position.
    pub async fn append(
        &self,
        log: &str,
        client: u64,
        request: u64,
        bytes: impl Into<Bytes>,
    ) -> Result<u64, StoreError> {
        let (req, rx) = self.request(log, client, request, bytes.into(), Instant::now())?;
        self.tx
            .send(Cmd::Append(req))
            .await
            .map_err(|_| StoreError::ShuttingDown)?;
        rx.await.map_err(|_| StoreError::ShuttingDown)?
    }

    /// Appends several records to one log at consecutive positions, in one
    /// batch; request ids are `first_request, first_request + 1, ...`.
    /// Returns the positions.
    pub async fn append_many(
        &self,
        log: &str,
        client: u64,
        first_request: u64,
        records: Vec<Bytes>,
    ) -> Result<Vec<u64>, StoreError> {
        let mut reqs = Vec::with_capacity(records.len());
        let mut rxs = Vec::with_capacity(records.len());
        // One arrival time for the whole batch: its records arrive together.
        let at = Instant::now();
        for (i, bytes) in records.into_iter().enumerate() {
            let request = if client == 0 {
                0
            } else {
                first_request.wrapping_add(i as u64)
            };
            let (req, rx) = self.request(log, client, request, bytes, at)?;
            reqs.push(req);
            rxs.push(rx);
        }
        if reqs.is_empty() {
            return Ok(Vec::new());
        }
        self.tx
            .send(Cmd::AppendMany(reqs))
            .await
            .map_err(|_| StoreError::ShuttingDown)?;
        let mut out = Vec::with_capacity(rxs.len());
        for rx in rxs {
            out.push(rx.await.map_err(|_| StoreError::ShuttingDown)??);
        }
        Ok(out)
    }

    /// [`Store::append`] for threads outside a Tokio runtime.
    pub fn append_blocking(
        &self,
        log: &str,
        client: u64,
        request: u64,
        bytes: impl Into<Bytes>,
    ) -> Result<u64, StoreError> {
        let (req, rx) = self.request(log, client, request, bytes.into(), Instant::now())?;
        self.tx
            .blocking_send(Cmd::Append(req))
            .map_err(|_| StoreError::ShuttingDown)?;
        rx.blocking_recv().map_err(|_| StoreError::ShuttingDown)?
    }

    /// `(first, tail)` of a log; `(0, 0)` for a log never written.
    pub fn bounds(&self, log: &str) -> (u64, u64) {
        let idx = self.shared.index();
        idx.logs
            .get(log)
            .map(|l| (l.first, l.tail()))
            .unwrap_or((0, 0))
    }

    /// Reads the record at `pos` of `log`.
    pub fn read(&self, log: &str, pos: u64) -> Result<Entry, StoreError> {
        check_log_name(log)?;
        self.shared.counters.reads.fetch_add(1, Ordering::Relaxed);
        let (loc, root) = {
            let idx = self.shared.index();
            let Some(l) = idx.logs.get(log) else {
                return Err(StoreError::NotYetWritten {
                    log: log.into(),
                    pos,
                    tail: 0,
                });
            };
            if pos < l.first {
                return Err(StoreError::Trimmed {
                    log: log.into(),
                    pos,
                    first: l.first,
                });
            }
            let Some(loc) = l.locs.get((pos - l.first) as usize).copied() else {
                return Err(StoreError::NotYetWritten {
                    log: log.into(),
                    pos,
                    tail: l.tail(),
                });
            };
            let root = idx.stripes.get(&loc.stripe).cloned();
            (loc, root)
        };
        let root = root.ok_or_else(|| StoreError::Unrecoverable {
            stripe: loc.stripe,
            why: "indexed stripe has no end-write (trimmed concurrently?)".into(),
        })?;
        // Fast path: read just the record's bytes and check its CRC; any
        // doubt falls through to the whole-stripe path (page CRCs, parity,
        // repair).
        if loc.offset != stripe::FRAGMENTED {
            if let Some(bytes) = read_range(&self.shared, &root, loc.offset, loc.len) {
                if crc32fast::hash(&bytes) == loc.crc {
                    return Ok(Arc::from(bytes));
                }
            }
        }
        self.shared
            .counters
            .reads_whole_stripe
            .fetch_add(1, Ordering::Relaxed);
        let bytes = self.record_from(&root, &loc, log, pos, &mut |r| self.stripe(r))?;
        if crc32fast::hash(&bytes) == loc.crc {
            return Ok(Arc::from(bytes));
        }
        self.record_past_a_lying_page(&root, &loc, log, pos)
    }

    /// The record at `loc` assembled from the payloads of its root stripe
    /// and, for a record that spans several, its fragment stripes, each
    /// read through `stripe_of`. Checks the structure, not the record's
    /// checksum.
    pub(crate) fn record_from(
        &self,
        root: &StripeRef,
        loc: &Loc,
        log: &str,
        pos: u64,
        stripe_of: &mut dyn FnMut(&StripeRef) -> Result<Arc<Parsed>, StoreError>,
    ) -> Result<Vec<u8>, StoreError> {
        let parsed = stripe_of(root)?;
        let Parsed::Root(entries) = &*parsed else {
            return Err(StoreError::Unrecoverable {
                stripe: loc.stripe,
                why: "expected a root stripe".into(),
            });
        };
        let e = entries
            .get(loc.idx as usize)
            .filter(|e| e.meta.pos == pos && e.meta.log == log)
            .ok_or_else(|| StoreError::Unrecoverable {
                stripe: loc.stripe,
                why: format!("entry {} does not hold {log}@{pos}", loc.idx),
            })?;
        if e.fragments.is_empty() {
            return Ok(e.tail.clone());
        }
        let mut out = Vec::with_capacity(loc.len as usize);
        for f in &e.fragments {
            let fref = self.fragment_ref(*f)?;
            match &*stripe_of(&fref)? {
                Parsed::Fragment(b) => out.extend_from_slice(b),
                Parsed::Root(_) => {
                    return Err(StoreError::Unrecoverable {
                        stripe: *f,
                        why: "expected a fragment stripe".into(),
                    })
                }
            }
        }
        out.extend_from_slice(&e.tail);
        if out.len() != loc.len as usize {
            return Err(StoreError::Unrecoverable {
                stripe: loc.stripe,
                why: format!("record is {} bytes, end-write says {}", out.len(), loc.len),
            });
        }
        Ok(out)
    }

    fn fragment_ref(&self, seq: u64) -> Result<StripeRef, StoreError> {
        self.shared
            .index()
            .stripes
            .get(&seq)
            .cloned()
            .ok_or_else(|| StoreError::Unrecoverable {
                stripe: seq,
                why: "fragment stripe has no end-write".into(),
            })
    }

    /// The record's bytes failed its checksum although every page they
    /// came from passed its own: one page holds other bytes than were
    /// written, under a valid checksum (rewritten, or written wrong before
    /// it was sealed). Parity tells which: each stripe of the record is
    /// rebuilt without one of its pages in turn, until the record matches
    /// its checksum; that page's segment is then repaired and the stripe's
    /// cached copy replaced. With no such page the record is reported
    /// unreadable, never returned different. (Found by the `log_recover`
    /// fuzz target: this path used to return whatever the pages said.)
    fn record_past_a_lying_page(
        &self,
        root: &StripeRef,
        loc: &Loc,
        log: &str,
        pos: u64,
    ) -> Result<Entry, StoreError> {
        let mut stripes = vec![root.clone()];
        if let Ok(Parsed::Root(entries)) = self.stripe(root).as_deref() {
            if let Some(e) = entries.get(loc.idx as usize) {
                for f in &e.fragments {
                    stripes.push(self.fragment_ref(*f)?);
                }
            }
        }
        for s in &stripes {
            for skip in 0..s.pages.len() {
                let Ok(payload) = read_stripe_without(&self.shared, s, skip) else {
                    continue;
                };
                let Ok(alt) = parse_payload(s, payload).map(Arc::new) else {
                    continue;
                };
                let got = self.record_from(root, loc, log, pos, &mut |r| {
                    if r.seq == s.seq {
                        Ok(alt.clone())
                    } else {
                        self.stripe(r)
                    }
                });
                if let Ok(bytes) = got.as_ref() {
                    if crc32fast::hash(bytes) == loc.crc {
                        let seg = s.pages[skip].0;
                        tracing::warn!(
                            stripe = s.seq,
                            segment = seg,
                            "a page passed its checksum but not its record's; rebuilt from parity, segment will be repaired"
                        );
                        self.shared
                            .counters
                            .pages_rebuilt
                            .fetch_add(1, Ordering::Relaxed);
                        if let Some(c) = self.shared.cache().as_mut() {
                            c.put(s.seq, alt);
                        }
                        // Best effort, as for a page that fails its own
                        // checksum: a full queue leaves it to a scrub.
                        let _ = self.tx.try_send(Cmd::Repair {
                            seg,
                            liars: vec![s.seq],
                        });
                        return got.map(Arc::from);
                    }
                }
            }
        }
        Err(StoreError::Unrecoverable {
            stripe: loc.stripe,
            why: format!(
                "{log}@{pos} fails its checksum, and no stripe rebuilt without one of its pages matches it"
            ),
        })
    }

    pub(crate) fn stripe(&self, r: &StripeRef) -> Result<Arc<Parsed>, StoreError> {
        if let Some(c) = self.shared.cache().as_mut() {
            if let Some(p) = c.get(&r.seq) {
                return Ok(p.clone());
            }
        }
        let (payload, bad) = read_stripe(&self.shared, r)?;
        for seg in bad {
            // Best effort: a full queue means a scrub will find it later.
            let _ = self.tx.try_send(Cmd::Repair {
                seg,
                liars: Vec::new(),
            });
        }
        let parsed = Arc::new(parse_payload(r, payload)?);
        if let Some(c) = self.shared.cache().as_mut() {
            c.put(r.seq, parsed.clone());
        }
        Ok(parsed)
    }

    /// Trims `log` below `pos` and frees every sealed segment nothing live
    /// refers to any more.
    pub async fn trim(&self, log: &str, pos: u64) -> Result<(), StoreError> {
        check_log_name(log)?;
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Cmd::Trim {
                log: log.into(),
                pos,
                reply,
            })
            .await
            .map_err(|_| StoreError::ShuttingDown)?;
        rx.await.map_err(|_| StoreError::ShuttingDown)?
    }

    /// [`Store::trim`] for threads outside a Tokio runtime.
    pub fn trim_blocking(&self, log: &str, pos: u64) -> Result<(), StoreError> {
        check_log_name(log)?;
        let (reply, rx) = oneshot::channel();
        self.tx
            .blocking_send(Cmd::Trim {
                log: log.into(),
                pos,
                reply,
            })
            .map_err(|_| StoreError::ShuttingDown)?;
        rx.blocking_recv().map_err(|_| StoreError::ShuttingDown)?
    }

    /// New entries of `log`, pushed in order as they become durable. A
    /// receiver that lags gets `Lagged` and should read the gap.
    pub fn subscribe(&self, log: &str) -> broadcast::Receiver<(u64, Entry)> {
        self.shared
            .subs()
            .entry(log.to_string())
            .or_insert_with(|| broadcast::channel(4096).0)
            .subscribe()
    }

    /// Reads every page of every live stripe and every copy of every
    /// live end-write, checks pages against their checksums, stripes
    /// against their parity and end-write copies against the version
    /// written, and rebuilds every segment holding something bad
    /// ([`crate::scrub`]). Blocking; run it off the async threads.
    pub fn scrub_blocking(&self) -> ScrubReport {
        crate::scrub::run(self, &mut |_| {})
    }

    /// [`Store::scrub_blocking`], calling `progress` after every stripe
    /// (the `check` command prints it).
    pub fn scrub_with_progress(
        &self,
        progress: &mut dyn FnMut(crate::scrub::Progress),
    ) -> ScrubReport {
        crate::scrub::run(self, progress)
    }

    /// Waits until every command sent before it has been handled.
    pub fn barrier_blocking(&self) {
        let (reply, rx) = oneshot::channel();
        if self.tx.blocking_send(Cmd::Barrier(reply)).is_ok() {
            let _ = rx.blocking_recv();
        }
    }

    /// The segment files, their zones, classes and lengths.
    pub fn segments_blocking(&self) -> Vec<SegmentInfo> {
        let (reply, rx) = oneshot::channel();
        if self.tx.blocking_send(Cmd::Segments(reply)).is_err() {
            return Vec::new();
        }
        rx.blocking_recv().unwrap_or_default()
    }

    /// [`Store::segments_blocking`] from async code.
    pub async fn segments(&self) -> Vec<SegmentInfo> {
        let (reply, rx) = oneshot::channel();
        if self.tx.send(Cmd::Segments(reply)).await.is_err() {
            return Vec::new();
        }
        rx.await.unwrap_or_default()
    }

    /// Why every append is refused for now, if it is: a failed batch's
    /// roll back that is waiting for room (or for its metadata write to
    /// work) and is retried by each append, or one that could not be undone
    /// (until a restart). `None` while appends are taken. `/health`
    /// answers 503 with this reason.
    pub fn appends_refused(&self) -> Option<String> {
        locks::lock(&self.shared.refusing).clone()
    }

    /// Counters and bounds now.
    pub fn stats(&self) -> Stats {
        let c = &self.shared.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let stages = self.shared.stages.snapshot();
        let logs = self
            .shared
            .index()
            .logs
            .iter()
            .map(|(n, l)| (n.clone(), l.first, l.tail()))
            .collect();
        Stats {
            appends: g(&c.appends),
            append_bytes: g(&c.append_bytes),
            batches: g(&c.batches),
            stripes: g(&c.stripes),
            bytes_written: g(&c.bytes_written),
            fsyncs: g(&c.fsyncs),
            write_backs: g(&c.write_backs),
            flushes: g(&c.flushes),
            rounds_on_writer: g(&c.rounds_on_writer),
            direct_write_bytes: g(&c.direct_write_bytes),
            write_us: stages.write.total_us(),
            sync_us: stages.round_wait.total_us(),
            reads: g(&c.reads),
            reads_whole_stripe: g(&c.reads_whole_stripe),
            pages_rebuilt: g(&c.pages_rebuilt),
            segments_repaired: g(&c.segments_repaired),
            write_failures: g(&c.write_failures),
            segments_freed: g(&c.segments_freed),
            segments_prepared: g(&c.segments_prepared),
            spares_ready: g(&c.spares_ready),
            spares_failed: g(&c.spares_failed),
            durable: self.shared.config.fsync,
            thp_disabled: crate::thp::disabled(),
            io_schedulers: self.io_schedulers.clone(),
            segments: self.shared.files().len() as u64,
            stages: stages.summary(),
            logs,
        }
    }

    /// The stage histograms as they are now; subtract an earlier snapshot
    /// ([`crate::latency::StagesSnapshot::since`]) for an interval.
    pub fn stages(&self) -> crate::latency::StagesSnapshot {
        self.shared.stages.snapshot()
    }

    /// Stops the writer once the commands already queued are handled,
    /// waits for it, and gives back the zone directories' locks, so that
    /// another open of the same zones can proceed. Reads still work.
    /// Safe to call twice.
    pub fn shutdown(&self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // Wakes an idle writer; a busy one sees the flag after its batch.
        let _ = self.tx.try_send(Cmd::Shutdown);
        if let Some(h) = locks::lock(&self.writer).take() {
            let _ = h.join();
        }
        // Nothing writes any more: another open of these zones may go on.
        // (Devices stay claimed until the store is dropped: reads still
        // use them.)
        locks::lock(&self.shared.zone_locks).take();
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Reads `len` payload bytes at `offset` straight from the data pages
/// (no page CRC: the caller checks the record's own CRC).
fn read_range(shared: &Shared, r: &StripeRef, offset: u32, len: u32) -> Option<Vec<u8>> {
    let shard_len = r.shard_len as u64;
    let (start, end) = (offset as u64, offset as u64 + len as u64);
    if end > r.payload_len as u64 || shard_len == 0 {
        return None;
    }
    let mut out = vec![0u8; len as usize];
    let files = shared.files();
    let mut at = start;
    while at < end {
        let i = (at / shard_len) as usize;
        let within = at % shard_len;
        let n = (shard_len - within).min(end - at);
        let (seg, poff) = *r.pages.get(i)?;
        let file = files.get(&seg)?;
        let dst = &mut out[(at - start) as usize..(at - start + n) as usize];
        file.read_exact_at(dst, poff + page::HEADER as u64 + within)
            .ok()?;
        at += n;
    }
    Some(out)
}

/// A stripe's payload as what it carries: a root stripe's entries, or a
/// fragment's bytes.
pub(crate) fn parse_payload(r: &StripeRef, payload: Vec<u8>) -> Result<Parsed, StoreError> {
    Ok(match r.kind {
        Kind::Ordered => {
            Parsed::Root(
                stripe::decode_root(&payload).map_err(|e| StoreError::Unrecoverable {
                    stripe: r.seq,
                    why: e.to_string(),
                })?,
            )
        }
        _ => Parsed::Fragment(payload),
    })
}

/// A stripe's payload rebuilt from all its pages but page `skip`, which
/// is treated as lost (parity stands in for it).
fn read_stripe_without(shared: &Shared, r: &StripeRef, skip: usize) -> Result<Vec<u8>, String> {
    let (k, m) = (r.k as usize, r.m as usize);
    let shards: Vec<Option<Vec<u8>>> = (0..r.pages.len())
        .map(|i| (i != skip).then(|| read_page(shared, r, i)).flatten())
        .collect();
    stripe::payload(shards, k, m, r.payload_len as usize)
}

/// How many of a stripe's pages read back intact.
pub(crate) fn valid_pages(shared: &Shared, r: &StripeRef) -> usize {
    (0..r.pages.len())
        .filter(|&i| read_page(shared, r, i).is_some())
        .count()
}

/// Reads one page and checks it belongs to stripe `r` as shard `i`.
pub(crate) fn read_page(shared: &Shared, r: &StripeRef, i: usize) -> Option<Vec<u8>> {
    let (seg, off) = r.pages[i];
    let file = shared.files().get(&seg).cloned()?;
    let mut buf = vec![0u8; page::HEADER + r.shard_len as usize];
    file.read_exact_at(&mut buf, off).ok()?;
    let (h, body) = page::decode(&buf).ok()?;
    let ok = h.kind == r.kind
        && h.stripe == r.seq
        && h.shard as usize == i
        && h.k == r.k
        && h.m == r.m
        && h.payload_len == r.payload_len
        && body.len() == r.shard_len as usize;
    ok.then(|| body.to_vec())
}

/// Reads a stripe: the data pages, and parity only if a data page is bad.
/// Returns the payload and the segments that held bad or missing pages.
/// (A scrub reads every page itself: [`crate::scrub`].)
pub(crate) fn read_stripe(
    shared: &Shared,
    r: &StripeRef,
) -> Result<(Vec<u8>, Vec<u64>), StoreError> {
    let (k, m) = (r.k as usize, r.m as usize);
    let mut shards: Vec<Option<Vec<u8>>> = vec![None; k + m];
    let mut bad = Vec::new();
    let mut missing_data = false;
    for (i, slot) in shards.iter_mut().enumerate() {
        let wanted = i < k || missing_data;
        if !wanted {
            continue;
        }
        match read_page(shared, r, i) {
            Some(s) => *slot = Some(s),
            None => {
                bad.push(r.pages[i].0);
                // From here on every page is wanted. A parity page is only
                // read once this is already set; no parity page comes
                // before the data pages end, so none was skipped.
                missing_data = true;
            }
        }
    }
    if !bad.is_empty() {
        shared
            .counters
            .pages_rebuilt
            .fetch_add(bad.len() as u64, Ordering::Relaxed);
    }
    let payload = stripe::payload(shards, k, m, r.payload_len as usize)
        .map_err(|why| StoreError::Unrecoverable { stripe: r.seq, why })?;
    Ok((payload, bad))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    /// Three zones under `dir`, 4 KiB pages, segments of `segment_bytes`.
    fn small_config(dir: &Path, segment_bytes: u64) -> Config {
        let zones: Vec<PathBuf> = (0..3).map(|z| dir.join(format!("zone{z}"))).collect();
        let mut cfg = Config::with_zones(zones);
        cfg.page_bytes = 4096;
        cfg.segment_bytes = segment_bytes;
        cfg.max_record_bytes = 256 << 10;
        cfg
    }

    /// A panic while a lock is held (a bug elsewhere) poisons it; readers
    /// go on with the data as it was rather than panicking in their turn
    /// on every request, as the writer already does.
    #[test]
    fn readers_carry_on_past_poisoned_locks() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = small_config(dir.path(), 64 << 10);
        let store = Arc::new(Store::open(cfg).unwrap());
        assert_eq!(store.append_blocking("a", 0, 0, b"x".to_vec()).unwrap(), 0);
        let s = store.clone();
        let poisoned = std::thread::spawn(move || {
            // Only a writer's panic poisons an RwLock.
            let _index = s.shared.index.write().unwrap();
            let _files = s.shared.files.write().unwrap();
            let _cache = s.shared.cache.lock().unwrap();
            let _subs = s.shared.subs.lock().unwrap();
            panic!("poisoning the store's locks on purpose");
        })
        .join();
        assert!(poisoned.is_err());
        assert!(store.shared.index.is_poisoned() && store.shared.files.is_poisoned());
        assert!(store.shared.cache.is_poisoned() && store.shared.subs.is_poisoned());
        assert_eq!(store.bounds("a"), (0, 1));
        assert_eq!(&store.read("a", 0).unwrap()[..], b"x");
        assert_eq!(store.stats().segments, 9);
        assert_eq!(store.append_blocking("a", 0, 0, b"y".to_vec()).unwrap(), 1);
        assert_eq!(&store.read("a", 1).unwrap()[..], b"y");
    }

    /// Every buffered write of pages and end-writes into segments made
    /// from spares ends on a file block boundary (padded with the zeros
    /// already there), so none makes the file system read a block first
    /// (`segment::Faults::write_padded_at`); and the records read back.
    #[test]
    fn writes_into_spare_segments_end_on_block_boundaries() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = small_config(dir.path(), 1 << 20);
        cfg.prepared_segments = 4;
        // Spares on disk before the open, which adopts them, so the first
        // window's segments are made from them (the refill would write
        // them only after the open).
        for z in &cfg.zones {
            std::fs::create_dir_all(z).unwrap();
            for n in 0..4u64 {
                let spare = z.join(format!("spare-{n:016}.dat"));
                std::fs::write(spare, vec![0u8; cfg.segment_bytes as usize]).unwrap();
            }
        }
        let faults = Arc::new(Faults::none());
        let store = Store::open_with_faults(cfg, faults.clone()).unwrap();
        // Odd sizes, so that almost no write ends on a boundary by itself.
        let records: Vec<Vec<u8>> = (0..40u8)
            .map(|i| vec![i; 1 + 97 * usize::from(i)])
            .collect();
        for (pos, r) in records.iter().enumerate() {
            assert_eq!(
                store.append_blocking("a", 0, 0, r.clone()).unwrap(),
                pos as u64
            );
        }
        let writes = crate::locks::lock(&faults.writes).clone();
        // Pages and three end-write copies for every append.
        assert!(writes.len() >= 4 * records.len(), "{} writes", writes.len());
        for &(ino, start, end) in &writes {
            assert_eq!(
                end % crate::segment::PAD_MAX as u64,
                0,
                "inode {ino}: a write of {start}..{end} ends inside a block"
            );
        }
        for (pos, r) in records.iter().enumerate() {
            assert_eq!(&store.read("a", pos as u64).unwrap()[..], &r[..]);
        }
    }

    /// With pages written directly in the round, a batch's end-writes are
    /// held back too and start only once every page file of the round is
    /// written and synced: an end-write in the page cache before its pages
    /// were even issued is what a kill -9 could keep, and recovery would
    /// take the pages for damage. Page syncs are slowed, so an end-write
    /// started alongside the pages would show first in the trace.
    #[cfg(target_os = "linux")]
    #[test]
    fn end_writes_behind_direct_pages_start_after_the_pages_are_synced() {
        use std::os::unix::fs::MetadataExt;
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = small_config(dir.path(), 1 << 20);
        cfg.tuning.direct_writes = true;
        cfg.tuning.direct_write_min_bytes = 4096;
        let faults = Arc::new(Faults::none());
        let store = Store::open_with_faults(cfg.clone(), faults.clone()).unwrap();
        // Which segment files hold end-writes and which pages, by inode.
        let class_of: BTreeMap<u64, u8> = store
            .segments_blocking()
            .iter()
            .map(|s| (s.id, s.class))
            .collect();
        let mut kind_of_inode = BTreeMap::new();
        for (&id, &class) in &class_of {
            let zone = &cfg.zones[crate::segment::zone(&cfg.zones, id)];
            let Ok(meta) = std::fs::metadata(zone.join(crate::segment::file_name(id))) else {
                continue;
            };
            kind_of_inode.insert(meta.ino(), class == crate::page::class::END_WRITE);
        }
        faults.slow_syncs(std::time::Duration::from_millis(30));
        crate::locks::lock(&faults.trace).clear();
        let record = vec![7u8; 40 << 10];
        assert_eq!(store.append_blocking("a", 0, 0, record.clone()).unwrap(), 0);
        faults.slow_syncs(std::time::Duration::ZERO);
        if store.stats().direct_write_bytes == 0 {
            eprintln!("no O_DIRECT under {}: not tested", dir.path().display());
            return;
        }
        let trace = crate::locks::lock(&faults.trace).clone();
        let is_sync = |what: &str| what == "fsync" || what == "write-back";
        // Each page file's own sync (the first after its write).
        let page_syncs: Vec<usize> = kind_of_inode
            .iter()
            .filter(|(_, &ew)| !ew)
            .filter_map(|(ino, _)| {
                let wrote = trace
                    .iter()
                    .position(|t| t.0 == "deferred-write" && t.1 == *ino)?;
                (wrote..trace.len()).find(|&i| is_sync(trace[i].0) && trace[i].1 == *ino)
            })
            .collect();
        let ew_writes: Vec<usize> = (0..trace.len())
            .filter(|&i| {
                trace[i].0 == "deferred-write" && kind_of_inode.get(&trace[i].1) == Some(&true)
            })
            .collect();
        assert_eq!(page_syncs.len(), 3, "three page files synced: {trace:?}");
        let ew_files: std::collections::BTreeSet<u64> =
            ew_writes.iter().map(|&i| trace[i].1).collect();
        assert_eq!(
            ew_files.len(),
            3,
            "three end-write copies held back: {trace:?}"
        );
        let last_page_sync = page_syncs.iter().max().copied().unwrap_or(0);
        assert!(
            ew_writes.iter().all(|&i| i > last_page_sync),
            "an end-write started before the pages were synced: {trace:?}"
        );
        assert_eq!(&store.read("a", 0).unwrap()[..], &record[..]);
    }
}
