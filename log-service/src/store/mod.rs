//! The storage engine's public face: append (through the single writer
//! thread, which batches, stripes, fsyncs and writes end-writes), read (any
//! thread, straight from the segment files, rebuilding lost pages from
//! parity; `range` reads consecutive records in one call), trim,
//! subscribe, scrub.

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::Instant;

use bytes::Bytes;
use lru::LruCache;
use melddb::Entry;
use tokio::sync::{broadcast, mpsc, oneshot};

use crate::config::Config;
use crate::error::{OpenError, StoreError};
use crate::locks;
use crate::segment::Faults;
use crate::shared::{
    parse_payload, read_range, read_stripe, read_stripe_without, Counters, Index, Loc, Parsed,
    Shared,
};
use crate::stripe::{self, StripeRef};
use crate::writer::{AppendReq, Cmd};

mod range;
pub mod scrub;
#[cfg(test)]
mod tests;

pub use crate::reports::{RecoveryReport, Stats};
pub use crate::writer::SegmentInfo;
pub use scrub::ScrubReport;

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
    /// unreadable, never returned different.
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
        scrub::run(self, &mut |_| {})
    }

    /// [`Store::scrub_blocking`], calling `progress` after every stripe
    /// (the `check` command prints it).
    pub fn scrub_with_progress(&self, progress: &mut dyn FnMut(scrub::Progress)) -> ScrubReport {
        scrub::run(self, progress)
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
