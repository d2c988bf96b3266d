//! Segment files and the I/O the store does on them, with a fault injector
//! in the write path so tests can make writes fail, tear or crawl.
//!
//! Segment `s` is the file `seg-<s as 16 digits>.dat` in zone directory
//! `s % zones`. Pages are appended; nothing is overwritten in place except
//! by repair, which rebuilds a whole file beside it and renames it over.

use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

pub use crate::seg_file::SegFile;

/// The file name of segment `id`.
pub fn file_name(id: u64) -> String {
    format!("seg-{id:016}.dat")
}

/// Parses a segment file name.
pub fn parse_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("seg-")?.strip_suffix(".dat")?;
    if digits.len() != 16 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The zone (index into the configured zones) segment `id` lives in.
pub fn zone(zones: &[PathBuf], id: u64) -> usize {
    (id % zones.len() as u64) as usize
}

/// The path of segment `id` under the configured zones.
pub fn path(zones: &[PathBuf], id: u64) -> PathBuf {
    zones[zone(zones, id)].join(file_name(id))
}

/// Opens (creating if asked) a segment file for reading and writing.
pub fn open(path: &Path, create: bool) -> io::Result<SegFile> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(create)
        .truncate(false)
        .open(path)
        .map(SegFile::whole)
}

/// Faults to inject into segment writes. All counters are shared, so a
/// test can arm them while the service runs.
#[derive(Debug, Default)]
pub struct Faults {
    /// Writes left before the next one fails (negative: never).
    fail_after: AtomicI64,
    /// Once the armed failure fires: writes left before a second one
    /// (negative: none; see [`Faults::fail_two_writes`]).
    then_after: AtomicI64,
    /// The failing write first writes half of its bytes (a torn page).
    tear: AtomicBool,
    /// Delay added to every write, in microseconds.
    delay_us: AtomicU64,
    /// Fail every fsync while set.
    fail_sync: AtomicBool,
    /// Fail every write with "no space" (`ENOSPC`) while set.
    full: AtomicBool,
    /// Delay added to every fsync, in microseconds.
    sync_delay_us: AtomicU64,
    /// Unit tests: every fsync and write-back, in order, with the file's
    /// inode and the name of the thread that made it, and an inode whose
    /// fsync fails.
    #[cfg(test)]
    pub(crate) trace: std::sync::Mutex<Vec<(&'static str, u64, String)>>,
    #[cfg(test)]
    pub(crate) fail_sync_of: AtomicU64,
    /// Unit tests: every padded write, as the file's inode and the byte
    /// range it covered, zeros included.
    #[cfg(test)]
    pub(crate) writes: std::sync::Mutex<Vec<(u64, u64, u64)>>,
}

/// The most zeros a padded write adds, and the block size the writer pads
/// to: 4 KiB, the block of ext4 and XFS as usually made (and the page of
/// most machines). On a file system with larger blocks the padding only
/// shortens the partial block, so its read remains; nothing else changes.
pub(crate) const PAD_MAX: usize = 4096;

/// Zeros for padding.
static ZEROS: [u8; PAD_MAX] = [0; PAD_MAX];

/// Writes `buf` at `off` and then `pad` zeros (at most [`PAD_MAX`]), as
/// one `pwritev` unless the system takes part of it (then the rest follows
/// in further calls).
fn write_all_padded(file: &SegFile, buf: &[u8], pad: usize, off: u64) -> io::Result<()> {
    let zeros = ZEROS.get(..pad).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("padding of {pad} bytes is over a block ({PAD_MAX})"),
        )
    })?;
    if pad == 0 {
        return file.write_all_at(buf, off);
    }
    let done = file.pwritev(&[io::IoSlice::new(buf), io::IoSlice::new(zeros)], off)?;
    finish_padded(file, buf, zeros, off, done)
}

/// Writes what a `pwritev` of `buf` and then `zeros` at `off` left undone
/// after its first `done` bytes. Short writes are rare (a full disk, a
/// signal), so this finishes piecewise.
fn finish_padded(
    file: &SegFile,
    buf: &[u8],
    zeros: &[u8],
    off: u64,
    done: usize,
) -> io::Result<()> {
    if done < buf.len() {
        file.write_all_at(&buf[done..], off + done as u64)?;
        file.write_all_at(zeros, off + buf.len() as u64)
    } else {
        let z = done - buf.len();
        file.write_all_at(&zeros[z.min(zeros.len())..], off + done as u64)
    }
}

impl Faults {
    /// No faults.
    pub fn none() -> Faults {
        let f = Faults::default();
        f.fail_after.store(-1, Ordering::SeqCst);
        f.then_after.store(-1, Ordering::SeqCst);
        f
    }
    /// The write after `n` more succeed fails; if `tear`, it writes half
    /// its bytes first.
    pub fn fail_write_after(&self, n: i64, tear: bool) {
        self.fail_two_writes(n, -1, tear);
    }
    /// The write after `n` more succeed fails, and then the write after
    /// `m` more (none if `m` is negative): a batch's write and then one of
    /// its roll back's own; if `tear`, each writes half its bytes first.
    pub fn fail_two_writes(&self, n: i64, m: i64, tear: bool) {
        self.tear.store(tear, Ordering::SeqCst);
        self.then_after.store(m, Ordering::SeqCst);
        self.fail_after.store(n, Ordering::SeqCst);
    }
    /// Every write sleeps this long first.
    pub fn slow_writes(&self, delay: Duration) {
        self.delay_us
            .store(delay.as_micros() as u64, Ordering::SeqCst);
    }
    /// Every fsync and write-back sleeps this long first (a slow device:
    /// the next batch is written while it runs).
    pub fn slow_syncs(&self, delay: Duration) {
        self.sync_delay_us
            .store(delay.as_micros() as u64, Ordering::SeqCst);
    }
    /// Make fsync and write-back fail (or stop failing).
    pub fn fail_syncs(&self, on: bool) {
        self.fail_sync.store(on, Ordering::SeqCst);
    }
    /// While `on`, every page write fails as on a full file system
    /// (`io::ErrorKind::StorageFull`, nothing written), until space is
    /// "freed" by calling this again with `false`.
    pub fn fill_disk(&self, on: bool) {
        self.full.store(on, Ordering::SeqCst);
    }
    /// The injected full file system's error, if it is full.
    fn no_space(&self) -> io::Result<()> {
        if self.full.load(Ordering::SeqCst) {
            return Err(io::Error::from(io::ErrorKind::StorageFull));
        }
        Ok(())
    }

    /// A held-back write of the batch's round ([`crate::direct`]), with
    /// the armed faults: it counts as one write, and a torn one leaves its
    /// first half, written buffered. If the direct descriptor refuses the
    /// middle (`EINVAL`: the file system changed its mind about
    /// alignment), the buffered one takes it; the round's sync makes it
    /// durable either way.
    pub(crate) fn write_deferred(&self, w: &crate::direct::DeferredWrite) -> io::Result<()> {
        let file = &*w.buffered;
        let file: &SegFile = file;
        let mid = w.middle();
        if self.armed_failure() {
            if self.tear.load(Ordering::SeqCst) {
                let whole = [&w.head[..], mid, &w.tail[..]].concat();
                file.write_all_at(&whole[..whole.len() / 2], w.off)?;
            }
            return Err(io::Error::other("injected write fault"));
        }
        self.no_space()?;
        #[cfg(test)]
        self.traced("deferred-write", file);
        file.write_all_at(&w.head, w.off)?;
        let at = w.off + w.head.len() as u64;
        match &w.direct {
            Some(d) if !mid.is_empty() => match d.write_all_at(mid, at) {
                Err(e) if e.kind() == io::ErrorKind::InvalidInput => file.write_all_at(mid, at),
                r => r,
            }?,
            _ => file.write_all_at(mid, at)?,
        }
        file.write_all_at(&w.tail, at + mid.len() as u64)
    }

    /// Writes `buf` at `off` followed by `pad` zero bytes, in one system
    /// call, applying the armed faults (to `buf`: a torn write leaves half
    /// of it and no zeros).
    ///
    /// The writer pads a write whose end falls inside a file block with
    /// the zeros already on disk after it, so the write covers that block
    /// whole: a partial block the page cache does not hold makes the file
    /// system read it from the device first, on the writer, between two
    /// appends. Segments made from spares are zeros whose pages the cache
    /// has often dropped (a probe counted one such 4 KiB read per three
    /// writes), so the zeros go in the same call as the bytes before them.
    pub(crate) fn write_padded_at(
        &self,
        file: &SegFile,
        buf: &[u8],
        pad: usize,
        off: u64,
    ) -> io::Result<()> {
        self.before_write(file, buf, off)?;
        #[cfg(test)]
        crate::locks::lock(&self.writes).push((inode(file), off, off + (buf.len() + pad) as u64));
        write_all_padded(file, buf, pad, off)
    }

    /// The armed delay and failure of a write; a torn failure writes the
    /// first half of `buf` to `file` first.
    fn before_write(&self, file: &SegFile, buf: &[u8], off: u64) -> io::Result<()> {
        if self.armed_failure() {
            if self.tear.load(Ordering::SeqCst) {
                file.write_all_at(&buf[..buf.len() / 2], off)?;
            }
            return Err(io::Error::other("injected write fault"));
        }
        self.no_space()
    }

    /// Sleeps the armed delay; whether this write is the one set to fail.
    fn armed_failure(&self) -> bool {
        let d = self.delay_us.load(Ordering::Relaxed);
        if d > 0 {
            std::thread::sleep(Duration::from_micros(d));
        }
        let left = self.fail_after.load(Ordering::SeqCst);
        if left >= 0 {
            if left == 0 {
                let next = self.then_after.swap(-1, Ordering::SeqCst);
                self.fail_after.store(next, Ordering::SeqCst);
                return true;
            }
            self.fail_after.store(left - 1, Ordering::SeqCst);
        }
        false
    }

    /// fsyncs `file` unless syncs are set to fail.
    pub fn sync(&self, file: &SegFile) -> io::Result<()> {
        self.before_sync()?;
        #[cfg(test)]
        if self.traced("fsync", file) {
            return Err(io::Error::other("injected fsync fault"));
        }
        file.sync_data()
    }

    /// The armed delay and failure of every fsync and write-back.
    fn before_sync(&self) -> io::Result<()> {
        let d = self.sync_delay_us.load(Ordering::Relaxed);
        if d > 0 {
            std::thread::sleep(Duration::from_micros(d));
        }
        if self.fail_sync.load(Ordering::SeqCst) {
            return Err(io::Error::other("injected fsync fault"));
        }
        Ok(())
    }

    /// Records the call; whether the file's fsync is set to fail.
    #[cfg(test)]
    fn traced(&self, what: &'static str, file: &SegFile) -> bool {
        let ino = inode(file);
        let thread = std::thread::current().name().unwrap_or("").to_string();
        crate::locks::lock(&self.trace).push((what, ino, thread));
        what == "fsync" && ino != 0 && self.fail_sync_of.load(Ordering::SeqCst) == ino
    }

    /// Writes `file`'s dirty pages to the device and waits for them,
    /// without a device cache flush or metadata (`sync_file_range`),
    /// unless syncs are set to fail; the armed delay applies as to
    /// [`Faults::sync`].
    pub(crate) fn write_back(&self, file: &SegFile) -> io::Result<()> {
        self.before_sync()?;
        #[cfg(test)]
        self.traced("write-back", file);
        file.write_back()
    }
}

/// Unit tests: `file`'s inode number, which the traces record (0 if
/// unknown).
#[cfg(test)]
fn inode(file: &SegFile) -> u64 {
    use std::os::unix::fs::MetadataExt;
    file.file().metadata().map(|m| m.ino()).unwrap_or(0)
}

/// fsyncs a directory so a create, rename or unlink in it is durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_strangers_are_ignored() {
        assert_eq!(parse_name(&file_name(42)), Some(42));
        for bad in [
            "seg-42.dat",
            "seg-000000000000004x.dat",
            "meta.json",
            "seg-0000000000000042.tmp",
        ] {
            assert_eq!(parse_name(bad), None, "{bad}");
        }
    }

    /// Bytes this thread made the system read from storage
    /// (`/proc/thread-self/io`); `None` where that is not kept.
    #[cfg(target_os = "linux")]
    fn thread_read_bytes() -> Option<u64> {
        let io = std::fs::read_to_string("/proc/thread-self/io").ok()?;
        io.lines()
            .find_map(|l| l.strip_prefix("read_bytes: "))?
            .trim()
            .parse()
            .ok()
    }

    /// Drops `file`'s pages from the page cache (they must be clean).
    #[cfg(target_os = "linux")]
    fn evict(file: &SegFile) {
        use std::os::fd::AsRawFd;
        let file = file.file();
        file.sync_all().expect("sync");
        // SAFETY: the descriptor is open; the call takes no pointers.
        let r = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(r, 0, "posix_fadvise");
    }

    /// The reason for padding: a write ending inside a block the cache
    /// does not hold reads that block from the device first; the same
    /// write padded to the block's end reads nothing, and leaves the same
    /// bytes (the zeros that were there).
    #[test]
    #[cfg(target_os = "linux")]
    fn a_padded_write_reads_nothing_where_an_unpadded_one_reads_its_last_block() {
        let dir = tempfile::tempdir().expect("temp dir");
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("zeros"))
            .map(SegFile::whole)
            .expect("create");
        f.write_all_at(&[0u8; 64 << 10], 0).expect("zeros");
        evict(&f);
        let Some(before) = thread_read_bytes() else {
            crate::skip("no per-thread I/O accounting");
            return;
        };
        f.write_all_at(&[1u8; 1000], 0).expect("unpadded write");
        let unpadded = thread_read_bytes().expect("read_bytes") - before;
        if unpadded == 0 {
            // tmpfs and the like keep every page: nothing to observe.
            crate::skip("the unpadded write read nothing (the file system keeps every page)");
            return;
        }
        evict(&f);
        let before = thread_read_bytes().expect("read_bytes");
        Faults::none()
            .write_padded_at(&f, &[2u8; 1000], PAD_MAX - 1000, 8192)
            .expect("padded write");
        let padded = thread_read_bytes().expect("read_bytes") - before;
        assert_eq!(padded, 0, "the unpadded write read {unpadded} bytes");
        let mut back = vec![9u8; 3 * PAD_MAX];
        f.read_exact_at(&mut back, 0).expect("read back");
        assert!(back[..1000].iter().all(|&b| b == 1));
        assert!(back[1000..8192].iter().all(|&b| b == 0));
        assert!(back[8192..9192].iter().all(|&b| b == 2));
        assert!(back[9192..].iter().all(|&b| b == 0));
        assert_eq!(f.size().expect("size"), 64 << 10);
    }

    /// A directory's sync reports what stops it.
    #[test]
    fn syncing_a_missing_directory_is_an_error() {
        let dir = tempfile::tempdir().expect("temp dir");
        sync_dir(dir.path()).expect("a directory syncs");
        let e = sync_dir(&dir.path().join("gone")).expect_err("missing");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    /// Segments go round-robin over the zones, each file in its zone's
    /// directory under its own name.
    #[test]
    fn segments_go_round_robin_over_the_zones() {
        let zones: Vec<PathBuf> = ["a", "b", "c"].iter().map(PathBuf::from).collect();
        for id in 0..12u64 {
            let z = (id % 3) as usize;
            assert_eq!(zone(&zones, id), z, "segment {id}");
            assert_eq!(path(&zones, id), zones[z].join(file_name(id)));
        }
        assert_eq!(zone(&zones, u64::MAX), (u64::MAX % 3) as usize);
    }

    /// A short `pwritev` is finished from wherever it stopped, inside the
    /// bytes or inside the zeros: the file ends up the same, and nothing
    /// outside the range is touched.
    #[test]
    fn a_short_padded_write_is_finished_from_any_point() {
        let dir = tempfile::tempdir().expect("temp dir");
        let f = open(&dir.path().join("f"), true).expect("create");
        let buf: Vec<u8> = (1..=10).collect();
        let zeros = [0u8; 6];
        let off = 5u64;
        let whole = [&buf[..], &zeros[..]].concat();
        for done in 0..=whole.len() {
            // Old bytes everywhere, so every byte the finish writes shows.
            f.write_all_at(&[0xEE; 32], 0).expect("old bytes");
            f.write_all_at(&whole[..done], off).expect("the short part");
            finish_padded(&f, &buf, &zeros, off, done).expect("finish");
            let mut back = [0u8; 32];
            f.read_exact_at(&mut back, 0).expect("read");
            let end = off as usize + whole.len();
            assert!(back[..off as usize].iter().all(|&b| b == 0xEE), "{done}");
            assert_eq!(&back[off as usize..end], &whole[..], "after {done} bytes");
            assert!(back[end..].iter().all(|&b| b == 0xEE), "{done}");
        }
    }

    /// The injector does what the fault tests take it to do: the armed
    /// write fails after the given number succeed, only once, and a torn
    /// one leaves exactly the first half of its bytes, whether written at
    /// once or held back for the round.
    #[test]
    fn an_armed_write_fails_once_and_a_torn_one_leaves_its_first_half() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file =
            |name: &str| std::sync::Arc::new(open(&dir.path().join(name), true).expect("create"));
        let bytes = |name: &str| std::fs::read(dir.path().join(name)).expect("read");
        let buf: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8 + 1).collect();
        let faults = Faults::none();

        let a = file("a");
        faults.fail_write_after(1, true);
        faults
            .write_padded_at(&a, &buf, 0, 0)
            .expect("the one before");
        faults
            .write_padded_at(&a, &buf, 0, 20_000)
            .expect_err("the armed write");
        faults
            .write_padded_at(&a, &buf, 0, 40_000)
            .expect("only one fails");
        let back = bytes("a");
        assert_eq!(back.len(), 50_000);
        assert_eq!(&back[..10_000], &buf[..]);
        assert!(back[10_000..20_000].iter().all(|&b| b == 0));
        assert_eq!(&back[20_000..25_000], &buf[..5_000], "the torn half");
        assert!(back[25_000..40_000].iter().all(|&b| b == 0));
        assert_eq!(&back[40_000..], &buf[..]);

        let b = file("b");
        let pool = crate::direct::BufPool::default();
        faults.fail_write_after(0, true);
        let w = crate::direct::DeferredWrite::new(b.clone(), None, 100, &buf, &pool);
        faults.write_deferred(&w).expect_err("the armed write");
        let back = bytes("b");
        assert_eq!(back.len(), 5_100);
        assert_eq!(&back[100..], &buf[..5_000], "the torn half");
        faults.write_deferred(&w).expect("only one fails");
        assert_eq!(&bytes("b")[100..], &buf[..]);

        // Not torn: nothing written.
        let c = file("c");
        faults.fail_write_after(0, false);
        faults.write_padded_at(&c, &buf, 0, 0).expect_err("armed");
        assert!(bytes("c").is_empty());

        // Two failures: the next write, then the second after it; then
        // none.
        faults.fail_two_writes(0, 1, false);
        let failed: Vec<bool> = (0..8u64)
            .map(|i| faults.write_padded_at(&c, b"x", 0, i).is_err())
            .collect();
        let want = [true, false, true, false, false, false, false, false];
        assert_eq!(failed, want);
    }

    /// A held-back write with a direct descriptor writes its whole
    /// blocks through it (they bypass the page cache, so none is left
    /// dirty), its ends buffered; and a direct descriptor that fails for
    /// another reason than alignment fails the write instead of falling
    /// back to the buffered one.
    #[test]
    #[cfg(target_os = "linux")]
    fn a_held_back_write_takes_its_whole_blocks_directly() {
        use std::sync::Arc;
        let dir = tempfile::tempdir().expect("temp dir");
        let f = Arc::new(open(&dir.path().join("d"), true).expect("create"));
        let Ok(direct) = f.open_direct() else {
            crate::skip("no O_DIRECT on this file system");
            return;
        };
        let direct = Arc::new(direct);
        const B: usize = crate::direct::BLOCK as usize;
        let buf: Vec<u8> = (0..4 * B as u32).map(|i| (i % 253) as u8 + 1).collect();
        let off = (B / 2) as u64;
        let pool = crate::direct::BufPool::default();
        let w = crate::direct::DeferredWrite::new(f.clone(), Some(direct), off, &buf, &pool);
        assert_eq!(w.middle().len(), 3 * B, "three whole blocks");
        let faults = Faults::none();
        faults.write_deferred(&w).expect("write");
        let back = std::fs::read(dir.path().join("d")).expect("read");
        assert_eq!(&back[off as usize..], &buf[..]);
        match crate::flush::dirty_pages(f.file(), B as u64, 3 * B as u64) {
            Err(e) if crate::flush::cachestat_missing(&e) => {
                eprintln!("skipped the page-cache check: no cachestat ({e})")
            }
            r => assert!(
                matches!(r, Ok((0, 0))),
                "the whole blocks went through the page cache: {r:?}"
            ),
        }

        // A read-only direct descriptor refuses with EBADF, not EINVAL.
        let ro = {
            use std::os::unix::fs::OpenOptionsExt;
            OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_DIRECT)
                .open(dir.path().join("d"))
                .expect("read-only direct descriptor")
        };
        let w = crate::direct::DeferredWrite::new(
            f.clone(),
            Some(Arc::new(SegFile::whole(ro))),
            off,
            &buf,
            &pool,
        );
        let e = faults
            .write_deferred(&w)
            .expect_err("the direct write's own error");
        assert_ne!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    }

    #[test]
    fn padding_over_a_block_is_refused_and_none_is_a_plain_write() {
        let dir = tempfile::tempdir().expect("temp dir");
        let f = SegFile::whole(File::create(dir.path().join("f")).expect("create"));
        let e = write_all_padded(&f, b"abc", PAD_MAX + 1, 0).expect_err("too much padding");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(f.size().expect("size"), 0, "nothing written");
        write_all_padded(&f, b"abc", 0, 5).expect("no padding");
        assert_eq!(f.size().expect("size"), 8);
        write_all_padded(&f, b"de", 3, 8).expect("padding");
        assert_eq!(f.size().expect("size"), 13);
        let back = std::fs::read(dir.path().join("f")).expect("read");
        assert_eq!(back, b"\0\0\0\0\0abcde\0\0\0");
    }
}
