//! Spare segment files (`prepared_segments`): segment-sized files written
//! full of zeros before they are needed. The writer renames one into place
//! when the window needs a new segment, so that segment's pages overwrite
//! blocks the file system has already allocated and written. Appending to
//! a fresh file instead makes every fsync round allocate blocks and grow
//! the file, which the file system journals: measured, that doubles the
//! rounds' time and gives stalls of 100+ ms (docs/log-service.md, "Spare
//! segments").
//!
//! A spare is written as `spare-N.tmp`, fsynced, renamed to `spare-N.dat`
//! and its directory fsynced, so a `.dat` spare is always complete (the
//! open deletes leftover `.tmp` files and spares of the wrong size).
//! Recovery never reads spares: their names are not segment names.
//!
//! A new store's open writes the spares its first windows take (at most
//! `prepared_segments` per zone, at full speed): without them those
//! windows' segments would start as empty files and the store would run
//! its first gigabytes at the slower rounds described above. That is the
//! only wait: every other spare, and every spare of a store that has
//! segments already, is written by the refill thread, so a reopen never
//! waits for zeros; `spares_ready` in the stats says how far the pool
//! has got.
//!
//! The refill runs only while the log is quiet (no batch written for
//! [`QUIET`]): zeros written under load compete with the appends for the
//! disk, and a probe at half load with the refill running measured p99
//! latencies of 600 ms. Under sustained load the spares run out and new
//! segments start as empty files again, as without spares.
//!
//! A spare file is only made while its file system keeps
//! [`room_to_keep`] free after it: spares would otherwise take every byte
//! left (the open and the refill wrote until `ENOSPC`, and a refill retry
//! filled the disk again for a moment every 10 s), leaving no room for
//! the segments the log makes when spares run out, nor for other programs.

use std::collections::VecDeque;
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::OpenError;
use crate::segment;
use crate::shared::Shared;

/// How long no batch may have been written before the refill writes.
pub(crate) const QUIET: Duration = Duration::from_millis(250);

/// The refill fsyncs a spare every this many bytes, so the page cache
/// never holds much of it dirty when load returns.
const SYNC_EVERY: u64 = 8 << 20;

/// What a spare file must leave free on its file system: a twentieth of
/// the file system, and at least two segments.
fn room_to_keep(fs_bytes: u64, segment_bytes: u64) -> u64 {
    (fs_bytes / 20).max(segment_bytes.saturating_mul(2))
}

/// Whether the file system of `dir` has room for a spare of `bytes` and
/// [`room_to_keep`] after it; the error (`StorageFull`) says how much is
/// free and kept.
#[cfg(target_os = "linux")]
fn room_for_spare(dir: &Path, bytes: u64) -> io::Result<()> {
    let st = rustix::fs::statvfs(dir)?;
    let unit = st.f_frsize.max(1);
    let free = st.f_bavail.saturating_mul(unit);
    let keep = room_to_keep(st.f_blocks.saturating_mul(unit), bytes);
    if free >= bytes.saturating_add(keep) {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::StorageFull,
        format!(
            "{} KiB free in {}: a spare of {} KiB would leave less than the {} KiB spares keep free",
            free >> 10,
            dir.display(),
            bytes >> 10,
            keep >> 10
        ),
    ))
}

/// Elsewhere the free space is not looked at; a full disk still only
/// ends the spare being written.
#[cfg(not(target_os = "linux"))]
fn room_for_spare(_dir: &Path, _bytes: u64) -> io::Result<()> {
    Ok(())
}

/// The file name of spare `n` (complete) or of its temporary form.
fn spare_name(n: u64, tmp: bool) -> String {
    format!("spare-{n:016}.{}", if tmp { "tmp" } else { "dat" })
}

/// Parses a spare's file name: its number and whether it is temporary.
fn parse_spare(name: &str) -> Option<(u64, bool)> {
    let rest = name.strip_prefix("spare-")?;
    let (digits, tmp) = if let Some(d) = rest.strip_suffix(".dat") {
        (d, false)
    } else {
        (rest.strip_suffix(".tmp")?, true)
    };
    if digits.len() != 16 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((digits.parse().ok()?, tmp))
}

struct State {
    /// Complete spares per zone, by number.
    ready: Vec<VecDeque<u64>>,
    /// The next spare number (unique across zones).
    next: u64,
    stop: bool,
}

struct Inner {
    shared: Arc<Shared>,
    state: Mutex<State>,
    wake: Condvar,
}

/// The spare pool and its refill thread; dropping it stops the thread.
pub(crate) struct Spares {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        crate::locks::lock(&self.state)
    }

    fn want(&self) -> usize {
        self.shared.config.prepared_segments as usize
    }

    /// Batches the writer has written so far: the refill's sign of load.
    fn batches(&self) -> u64 {
        self.shared.counters.batches.load(Ordering::Relaxed)
    }

    /// Spares ready in `zone`: files in the pool, or a device's spare
    /// slots.
    fn count(&self, st: &State, zone: usize) -> usize {
        match self.shared.device(zone) {
            Some(dev) => dev.spares(),
            None => st.ready[zone].len(),
        }
    }

    /// Picks the zone with the fewest spares, if any has fewer than wanted,
    /// and a number for its next spare: a new file's, or on a device a
    /// free slot, taken (a zone whose device has none is passed over).
    fn claim(&self, st: &mut State) -> Option<(usize, u64)> {
        let mut short: Vec<(usize, usize)> = (0..st.ready.len())
            .map(|z| (self.count(st, z), z))
            .filter(|&(n, _)| n < self.want())
            .collect();
        short.sort_unstable();
        short
            .into_iter()
            .find_map(|(_, zone)| self.claim_in(st, zone))
    }

    /// A number for zone `zone`'s next spare: a new file's, or on a
    /// device a free slot, taken (`None` if the device has none).
    fn claim_in(&self, st: &mut State, zone: usize) -> Option<(usize, u64)> {
        match self.shared.device(zone) {
            Some(dev) => dev.take_free().map(|slot| (zone, slot)),
            None => {
                st.next += 1;
                Some((zone, st.next - 1))
            }
        }
    }

    /// Spare `n` of `zone` is written: it joins the pool (a device's
    /// table has it already).
    fn add(&self, zone: usize, n: u64) {
        self.shared
            .counters
            .segments_prepared
            .fetch_add(1, Ordering::Relaxed);
        let mut st = self.lock();
        if self.shared.device(zone).is_none() {
            st.ready[zone].push_back(n);
        }
        self.publish_ready(&st);
    }

    /// Writing a spare failed: counted, for the stats.
    fn failed(&self) {
        self.shared
            .counters
            .spares_failed
            .fetch_add(1, Ordering::Relaxed);
    }

    fn publish_ready(&self, st: &State) {
        let n: usize = (0..st.ready.len()).map(|z| self.count(st, z)).sum();
        self.shared
            .counters
            .spares_ready
            .store(n as u64, Ordering::Relaxed);
    }

    /// Waits until no batch has been written for [`QUIET`]; false if the
    /// pool stopped meanwhile.
    fn wait_quiet(&self) -> bool {
        let mut seen = self.batches();
        let mut since = Instant::now();
        loop {
            if self.lock().stop {
                return false;
            }
            let now = self.batches();
            if now != seen {
                seen = now;
                since = Instant::now();
            } else if since.elapsed() >= QUIET {
                return true;
            }
            std::thread::sleep(QUIET / 5);
        }
    }

    /// Writes spare `n` in zone `zone`, pausing while the log is busy and
    /// keeping to `rate` bytes/s (0: as fast as the disk goes). Gives up
    /// (and removes the temporary file) if the pool is stopped meanwhile.
    fn make(&self, zone: usize, n: u64, rate: u64) -> io::Result<bool> {
        if let Some(dev) = self.shared.device(zone) {
            let write = |at: u64, len: u64| dev.zero(n, at, len);
            let result = self
                .zero(rate, dev.slot_bytes(), write, || dev.sync())
                .and_then(|done| {
                    if done {
                        dev.make_spare(n)?;
                    }
                    Ok(done)
                });
            if !matches!(result, Ok(true)) {
                dev.give_back(n, crate::device::Held::Free);
            }
            return result;
        }
        let dir = &self.shared.config.zones[zone];
        let tmp = dir.join(spare_name(n, true));
        let done = dir.join(spare_name(n, false));
        let result = (|| {
            room_for_spare(dir, self.shared.config.segment_bytes)?;
            let f = OpenOptions::new().write(true).create_new(true).open(&tmp)?;
            let chunk = vec![0u8; 1 << 20];
            let write = |_at: u64, len: u64| (&f).write_all(&chunk[..len as usize]);
            if !self.zero(rate, self.shared.config.segment_bytes, write, || {
                f.sync_data()
            })? {
                return Ok(false);
            }
            f.sync_all()?;
            std::fs::rename(&tmp, &done)?;
            segment::sync_dir(dir)?;
            Ok(true)
        })();
        if !matches!(result, Ok(true)) {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    /// Writes `total` bytes of zeros with `write(at, len)` in 1 MiB steps:
    /// it syncs every [`SYNC_EVERY`], stands aside while the log is busy
    /// and keeps to `rate` bytes/s (0: no limit). Returns false if the
    /// pool stopped meanwhile.
    fn zero(
        &self,
        rate: u64,
        total: u64,
        mut write: impl FnMut(u64, u64) -> io::Result<()>,
        sync: impl Fn() -> io::Result<()>,
    ) -> io::Result<bool> {
        const CHUNK: u64 = 1 << 20;
        let mut t0 = Instant::now();
        let mut paced = 0u64;
        let mut written = 0u64;
        let mut seen = self.batches();
        while written < total {
            if self.lock().stop {
                return Ok(false);
            }
            if written % SYNC_EVERY == 0 {
                if written > 0 {
                    sync()?;
                }
                // Appends since the last look: stand aside until quiet.
                if self.batches() != seen {
                    if !self.wait_quiet() {
                        return Ok(false);
                    }
                    seen = self.batches();
                    t0 = Instant::now();
                    paced = written;
                }
            }
            let n = (total - written).min(CHUNK);
            write(written, n)?;
            written += n;
            if rate > 0 {
                // Stay under the rate: sleep until this many bytes are due.
                let due = Duration::from_secs_f64((written - paced) as f64 / rate as f64);
                if let Some(ahead) = due.checked_sub(t0.elapsed()) {
                    std::thread::sleep(ahead);
                }
            }
        }
        Ok(true)
    }

    fn run(&self) {
        // A file system without room for spares is said once, not at
        // every retry.
        let mut said_no_room = false;
        loop {
            let (zone, n) = {
                let mut st = self.lock();
                loop {
                    if st.stop {
                        return;
                    }
                    if let Some(c) = self.claim(&mut st) {
                        break c;
                    }
                    st = self.wake.wait(st).unwrap_or_else(PoisonError::into_inner);
                }
            };
            if !self.wait_quiet() {
                // Stopping: a device slot claimed is free again.
                if let Some(dev) = self.shared.device(zone) {
                    dev.give_back(n, crate::device::Held::Free);
                }
                return;
            }
            let rate = u64::from(self.shared.config.tuning.prepare_mib_s) << 20;
            match self.make(zone, n, rate) {
                Ok(true) => {
                    said_no_room = false;
                    self.add(zone, n)
                }
                Ok(false) => return,
                Err(e) => {
                    // A full disk, most likely: the writer falls back to
                    // empty files, and the refill tries again later.
                    if e.kind() != io::ErrorKind::StorageFull || !said_no_room {
                        tracing::warn!(zone, error = %e, "preparing a spare segment failed; retrying every 10 s");
                    }
                    said_no_room |= e.kind() == io::ErrorKind::StorageFull;
                    self.failed();
                    let st = self.lock();
                    let _ = self
                        .wake
                        .wait_timeout_while(st, Duration::from_secs(10), |s| !s.stop);
                }
            }
        }
    }
}

impl Inner {
    /// Writes, at full speed, the spares a new store's first windows take:
    /// `first[z]` for zone `z`, less those on disk already, never more
    /// than `prepared_segments`. A failure (a full disk, most likely) ends
    /// this with a warning: spares only make appends faster, and the
    /// refill tries again later.
    fn make_first(&self, first: &[usize]) {
        let missing = |st: &State, z: usize| {
            first
                .get(z)
                .copied()
                .unwrap_or(0)
                .min(self.want())
                .saturating_sub(self.count(st, z))
        };
        let total: usize = {
            let st = self.lock();
            (0..st.ready.len()).map(|z| missing(&st, z)).sum()
        };
        if total == 0 {
            return;
        }
        let bytes = self.shared.config.segment_bytes;
        tracing::info!(
            spares = total,
            mib = total as u64 * (bytes >> 20),
            "a new store: writing the spare segments its first windows take"
        );
        let t0 = Instant::now();
        for made in 1..=total {
            let claimed = {
                let mut st = self.lock();
                let short: Vec<usize> = (0..st.ready.len())
                    .filter(|&z| missing(&st, z) > 0)
                    .collect();
                short
                    .into_iter()
                    .find_map(|zone| self.claim_in(&mut st, zone))
            };
            let Some((zone, n)) = claimed else { break };
            match self.make(zone, n, 0) {
                Ok(true) => self.add(zone, n),
                Ok(false) => return,
                Err(e) => {
                    tracing::warn!(zone, error = %e, "writing a spare segment failed; going on with fewer");
                    self.failed();
                    return;
                }
            }
            tracing::info!(done = made, of = total, zone, "spare segment written");
        }
        tracing::info!(
            secs = t0.elapsed().as_secs_f64(),
            "the first windows' spare segments are ready"
        );
    }
}

impl Spares {
    /// Takes stock of the spares on disk (removing leftovers), writes
    /// those a new store's first windows take (`first[z]` per zone; empty
    /// for a store with segments) and starts the refill thread, which
    /// writes the rest (every zone up to `prepared_segments`) in the
    /// background. `None` when the configuration wants no spares; then
    /// any found are removed.
    pub(crate) fn open(shared: Arc<Shared>, first: &[usize]) -> Result<Option<Spares>, OpenError> {
        let config = &shared.config;
        let zones = config.zones.len();
        let mut ready = vec![Vec::new(); zones];
        let mut next = 0u64;
        // On devices, spares are slots (the device's table knows them);
        // the zone directories hold no spare files to take stock of.
        let dirs = if shared.devices.is_empty() {
            &config.zones[..]
        } else {
            &[]
        };
        for (zi, z) in dirs.iter().enumerate() {
            let io_err = |source| OpenError::Io {
                path: z.clone(),
                source,
            };
            for entry in std::fs::read_dir(z).map_err(io_err)? {
                let entry = entry.map_err(io_err)?;
                let Some((n, tmp)) = entry.file_name().to_str().and_then(parse_spare) else {
                    continue;
                };
                next = next.max(n + 1);
                let path = entry.path();
                let keep = !tmp
                    && config.prepared_segments > 0
                    && entry.metadata().map_err(io_err)?.len() == config.segment_bytes;
                if keep {
                    ready[zi].push(n);
                } else {
                    std::fs::remove_file(&path).map_err(|source| OpenError::Io {
                        path: path.clone(),
                        source,
                    })?;
                }
            }
        }
        if config.prepared_segments == 0 {
            return Ok(None);
        }
        let ready = ready
            .into_iter()
            .map(|mut v| {
                v.sort_unstable();
                v.into()
            })
            .collect();
        let inner = Arc::new(Inner {
            shared: shared.clone(),
            state: Mutex::new(State {
                ready,
                next,
                stop: false,
            }),
            wake: Condvar::new(),
        });
        let missing: usize = {
            let st = inner.lock();
            (0..zones)
                .map(|z| inner.want().saturating_sub(inner.count(&st, z)))
                .sum()
        };
        if missing > 0 {
            tracing::info!(
                spares = missing,
                mib = missing as u64 * (config.segment_bytes >> 20),
                mib_s = config.tuning.prepare_mib_s,
                "writing spare segments in the background"
            );
        }
        inner.publish_ready(&inner.lock());
        inner.make_first(first);
        let worker = inner.clone();
        let thread = std::thread::Builder::new()
            .name("melddb-log-spares".into())
            .spawn(move || worker.run())
            .map_err(|source| OpenError::Io {
                path: config.zones[0].clone(),
                source,
            })?;
        Ok(Some(Spares {
            inner,
            thread: Some(thread),
        }))
    }

    /// A spare was used (a device's slot): the refill may have work.
    pub(crate) fn wake(&self) {
        self.inner.publish_ready(&self.inner.lock());
        self.inner.wake.notify_one();
    }

    /// Moves a spare of `zone` to `path` (which must not exist) and returns
    /// true, or returns false if the zone has none ready or the rename
    /// fails (the caller then creates an empty file). The caller fsyncs
    /// the directory before writing, so the new name is durable first.
    pub(crate) fn take_into(&self, zone: usize, path: &Path) -> bool {
        if path.symlink_metadata().is_ok() {
            // Never replace a file.
            return false;
        }
        let n = {
            let mut st = self.inner.lock();
            let Some(n) = st.ready.get_mut(zone).and_then(VecDeque::pop_front) else {
                return false;
            };
            self.inner.publish_ready(&st);
            n
        };
        self.inner.wake.notify_one();
        let spare: PathBuf = self.inner.shared.config.zones[zone].join(spare_name(n, false));
        match std::fs::rename(&spare, path) {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(spare = %spare.display(), error = %e, "renaming a spare segment failed; creating an empty one");
                let _ = std::fs::remove_file(&spare);
                false
            }
        }
    }
}

impl Drop for Spares {
    fn drop(&mut self) {
        self.inner.lock().stop = true;
        self.inner.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spares_keep_a_twentieth_of_the_file_system_free_and_at_least_two_segments() {
        // 1 TiB with 256 MiB segments: the twentieth decides.
        assert_eq!(room_to_keep(1 << 40, 256 << 20), (1 << 40) / 20);
        // 4 MiB with 256 KiB segments: two segments decide.
        assert_eq!(room_to_keep(4 << 20, 256 << 10), 512 << 10);
        assert_eq!(room_to_keep(0, u64::MAX), u64::MAX);
    }

    #[test]
    fn spare_names_round_trip_and_strangers_are_ignored() {
        assert_eq!(parse_spare(&spare_name(7, false)), Some((7, false)));
        assert_eq!(parse_spare(&spare_name(7, true)), Some((7, true)));
        for bad in [
            "spare-7.dat",
            "seg-0000000000000007.dat",
            "spare-000000000000000x.tmp",
            "spare-0000000000000007.bak",
        ] {
            assert_eq!(parse_spare(bad), None, "{bad}");
        }
        // Never mistaken for a segment by recovery.
        assert_eq!(segment::parse_name(&spare_name(7, false)), None);
    }

    /// A pool over a store's shared state with no refill thread, so a
    /// test can drive [`Inner::zero`] itself.
    fn bare_pool(dir: &Path, edit: impl FnOnce(&mut crate::Config)) -> (crate::Store, Inner) {
        let zones: Vec<PathBuf> = (0..3).map(|z| dir.join(format!("zone{z}"))).collect();
        let mut cfg = crate::Config::with_zones(zones);
        cfg.page_bytes = 4096;
        cfg.segment_bytes = 1 << 20;
        cfg.max_record_bytes = 256 << 10;
        // No refill thread of the store's own writes spares meanwhile.
        cfg.prepared_segments = 0;
        edit(&mut cfg);
        let store = crate::Store::open(cfg).unwrap();
        let inner = Inner {
            shared: store.shared.clone(),
            state: Mutex::new(State {
                ready: vec![VecDeque::new(); 3],
                next: 0,
                stop: false,
            }),
            wake: Condvar::new(),
        };
        (store, inner)
    }

    /// What one `zero` call did: its writes `(at, len)` and, after how
    /// many writes, each sync.
    #[derive(Default)]
    struct Zeroed {
        writes: Vec<(u64, u64)>,
        syncs: Vec<usize>,
    }

    fn zero_into(inner: &Inner, rate: u64, total: u64) -> (bool, Zeroed) {
        let log = Mutex::new(Zeroed::default());
        let done = inner
            .zero(
                rate,
                total,
                |at, len| {
                    log.lock().unwrap().writes.push((at, len));
                    Ok(())
                },
                || {
                    let mut l = log.lock().unwrap();
                    let n = l.writes.len();
                    l.syncs.push(n);
                    Ok(())
                },
            )
            .unwrap();
        (done, log.into_inner().unwrap())
    }

    /// Zeros go out in 1 MiB steps that cover the file exactly, synced
    /// once every `SYNC_EVERY`, never before the first byte and never
    /// after the last (the caller syncs then).
    #[test]
    fn zeros_cover_the_file_in_steps_synced_on_the_way() {
        let dir = tempfile::tempdir().unwrap();
        let (_store, inner) = bare_pool(dir.path(), |_| {});
        let total = 2 * SYNC_EVERY + 3 * (1 << 20) + 4096;
        let steps: Vec<(u64, u64)> = (0..total.div_ceil(1 << 20))
            .map(|i| (i << 20, (total - (i << 20)).min(1 << 20)))
            .collect();
        assert_eq!(steps.last(), Some(&(total - 4096, 4096)));
        let (done, z) = zero_into(&inner, 0, total);
        assert!(done);
        assert_eq!(z.writes, steps);
        let per_sync = (SYNC_EVERY >> 20) as usize;
        assert_eq!(z.syncs, vec![per_sync, 2 * per_sync]);
        // A stopped pool writes nothing and says so.
        inner.lock().stop = true;
        let (done, z) = zero_into(&inner, 0, total);
        assert!(!done);
        assert!(z.writes.is_empty() && z.syncs.is_empty());
    }

    /// The refill keeps to its rate: the bytes written take at least as
    /// long as the rate allows (a lower bound only, which no busy host
    /// can break).
    #[test]
    fn the_refill_keeps_to_its_rate() {
        let dir = tempfile::tempdir().unwrap();
        let (_store, inner) = bare_pool(dir.path(), |_| {});
        let t0 = Instant::now();
        let (done, z) = zero_into(&inner, 16 << 20, 4 << 20);
        assert!(done);
        assert_eq!(z.writes.len(), 4);
        assert!(
            t0.elapsed() >= Duration::from_millis(250),
            "{:?}",
            t0.elapsed()
        );
    }

    /// A batch written while the refill zeros makes it stand aside at its
    /// next sync until the log has been quiet for `QUIET`.
    #[test]
    fn the_refill_stands_aside_once_it_sees_appends() {
        let dir = tempfile::tempdir().unwrap();
        let (_store, inner) = bare_pool(dir.path(), |_| {});
        let batches = &inner.shared.counters.batches;
        let mut times = Vec::new();
        let done = inner
            .zero(
                0,
                SYNC_EVERY + (1 << 20),
                |at, _| {
                    times.push(Instant::now());
                    if at == 1 << 20 {
                        // An append lands while the refill writes.
                        batches.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(())
                },
                || Ok(()),
            )
            .unwrap();
        assert!(done);
        let per_sync = (SYNC_EVERY >> 20) as usize;
        assert_eq!(times.len(), per_sync + 1);
        // The write after the sync waited out the quiet time, counted
        // from the batch.
        let waited = times[per_sync] - times[1];
        assert!(waited >= QUIET, "{waited:?}");
    }

    /// A spare made at a rate keeps to it and ends as a complete `.dat`
    /// file; one the pool stops while making leaves nothing behind.
    #[test]
    fn a_spare_keeps_to_its_rate_and_is_complete() {
        let dir = tempfile::tempdir().unwrap();
        let (store, inner) = bare_pool(dir.path(), |_| {});
        let zone0 = store.shared.config.zones[0].clone();
        let t0 = Instant::now();
        assert!(inner.make(0, 5, 4 << 20).unwrap());
        // 1 MiB at 4 MiB/s.
        assert!(
            t0.elapsed() >= Duration::from_millis(250),
            "{:?}",
            t0.elapsed()
        );
        let names = |dir: &Path| -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .filter(|n| n.starts_with("spare-"))
                .collect();
            v.sort();
            v
        };
        assert_eq!(names(&zone0), [spare_name(5, false)]);
        let len = std::fs::metadata(zone0.join(spare_name(5, false)))
            .unwrap()
            .len();
        assert_eq!(len, 1 << 20);
        inner.lock().stop = true;
        assert!(!inner.make(0, 6, 0).unwrap());
        assert_eq!(names(&zone0), [spare_name(5, false)]);
    }

    /// Dropping the pool stops its refill thread and waits for it, so
    /// nothing writes spares into a store's directories after it closed.
    #[test]
    fn dropping_the_pool_stops_and_joins_its_refill_thread() {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = bare_pool(dir.path(), |cfg| cfg.prepared_segments = 1);
        // A second pool over the same zones: it adopts the store's spares
        // and writes any missing, then waits for work.
        let pool = Spares::open(store.shared.clone(), &[]).unwrap().unwrap();
        let inner = Arc::downgrade(&pool.inner);
        drop(pool);
        assert!(
            inner.upgrade().is_none(),
            "the refill thread outlived its pool"
        );
    }
}
