//! Ending an fsync round with one device cache flush per device
//! ([`crate::config::Tuning::flush_once_per_device`]): writing a file's
//! dirty pages back without a flush, and deciding where that is sound.
//!
//! Pages written over blocks that are already allocated, written and
//! committed need no metadata to be read back after a power loss, so what
//! makes them durable is only the device cache flush that follows their
//! write-back. That flush comes from an `fdatasync` of any file on the same
//! device, issued once every file of the round is written back. Two things
//! must hold on the file system, and both are checked by type:
//! - an `fdatasync` of a file with nothing dirty still flushes the device
//!   (ext4 and XFS do; btrfs skips a clean file);
//! - a write over written blocks stays in place (not on a copy-on-write
//!   file system such as btrfs or ZFS, where it allocates new blocks).

use std::fs::File;
use std::io;
use std::path::Path;

/// `statfs` magic numbers of the file systems where write-back plus one
/// flush per device is sound (see the module comment).
#[cfg(target_os = "linux")]
const IN_PLACE_FILE_SYSTEMS: [(i64, &str); 2] = [(0xEF53, "ext4"), (0x5846_5342, "xfs")];

/// The device (`st_dev`) whose cache one flush covers for the files in
/// `dir`, if write-back is sound on its file system; `None` if it is not
/// (or the system cannot tell, or this is not Linux): those files are
/// fsynced one by one.
pub(crate) fn write_back_device(dir: &Path) -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    in_place_file_system(dir)?;
    std::fs::metadata(dir).ok().map(|m| m.dev())
}

/// The name of `dir`'s file system if it is one of
/// [`IN_PLACE_FILE_SYSTEMS`].
#[cfg(target_os = "linux")]
fn in_place_file_system(dir: &Path) -> Option<&'static str> {
    let st = rustix::fs::statfs(dir).ok()?;
    // The field's integer type differs between targets.
    #[allow(clippy::unnecessary_cast)]
    let magic = st.f_type as i64;
    IN_PLACE_FILE_SYSTEMS
        .iter()
        .find(|(m, _)| *m == magic)
        .map(|(_, name)| *name)
}

#[cfg(not(target_os = "linux"))]
fn in_place_file_system(_dir: &Path) -> Option<&'static str> {
    None
}

/// Starts write-back of every dirty page of `file` in the `len` bytes at
/// `off` (`len` 0: to its end) and waits for it to complete
/// (`sync_file_range` with WAIT_BEFORE, WRITE and WAIT_AFTER): the pages
/// are on the device, perhaps only in its volatile cache.
#[cfg(target_os = "linux")]
pub fn write_back(file: &File, off: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let (Ok(off), Ok(len)) = (i64::try_from(off), i64::try_from(len)) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "write-back range past the largest file offset",
        ));
    };
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: the descriptor stays open while `file` is borrowed, and the
    // call takes no pointers.
    let r = unsafe { libc::sync_file_range(file.as_raw_fd(), off, len, flags) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Starts write-back of the `len` bytes of `file` at `off` and returns
/// without waiting for it (`sync_file_range` with WRITE alone).
///
/// The writer calls this right after writing a batch's pages, so their I/O
/// is under way while the round before is still flushing; when this batch's
/// own round starts, its write-backs find the pages written or in flight,
/// and the round is mostly the device flush. It is only a head start: the
/// round still waits for every page and flushes, and an I/O error here is
/// reported again by the round's own write-back or `fdatasync`, so the
/// result is ignored.
#[cfg(target_os = "linux")]
pub fn start_write_back(file: &File, off: u64, len: u64) {
    use std::os::fd::AsRawFd;
    let (Ok(off), Ok(len)) = (i64::try_from(off), i64::try_from(len)) else {
        return;
    };
    // SAFETY: the descriptor stays open while `file` is borrowed, and the
    // call takes no pointers.
    let _ =
        unsafe { libc::sync_file_range(file.as_raw_fd(), off, len, libc::SYNC_FILE_RANGE_WRITE) };
}

/// Elsewhere there is no way to start write-back without waiting; the
/// round's sync does all of it.
#[cfg(not(target_os = "linux"))]
pub fn start_write_back(_file: &File, _off: u64, _len: u64) {}

/// Elsewhere nothing uses write-back ([`write_back_device`] says `None`);
/// a full data sync keeps it correct anyway.
#[cfg(not(target_os = "linux"))]
pub fn write_back(file: &File, _off: u64, _len: u64) -> io::Result<()> {
    file.sync_data()
}

/// Dirty and under-write-back page counts of `len` bytes of `file` at
/// `off` (0: to the end of the file), from the `cachestat` system call
/// (Linux 6.5). For tests: what a write-back or sync left in the page
/// cache, which otherwise only a power loss shows.
///
/// Errors are the system's; only [`cachestat_missing`] ones mean the
/// tests have nothing to observe, so a wrong call cannot pass for an old
/// kernel.
#[cfg(all(test, target_os = "linux"))]
pub(crate) fn dirty_pages(file: &File, off: u64, len: u64) -> io::Result<(u64, u64)> {
    use std::os::fd::AsRawFd;
    // The same number on every architecture (the unified table).
    const SYS_CACHESTAT: libc::c_long = 451;
    // struct cachestat_range: offset, length.
    let range = [off, len];
    // struct cachestat: nr_cache, nr_dirty, nr_writeback, nr_evicted,
    // nr_recently_evicted.
    let mut stat = [0u64; 5];
    // SAFETY: both pointers are to live arrays of the layout the call
    // expects, and the descriptor is open.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            file.as_raw_fd(),
            range.as_ptr(),
            stat.as_mut_ptr(),
            0,
        )
    };
    if r == 0 {
        Ok((stat[1], stat[2]))
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether `e`, from [`dirty_pages`], says the call is not there: a kernel
/// before 6.5 (`ENOSYS`), or a sandbox's system-call filter (`ENOSYS` or
/// `EPERM`).
#[cfg(all(test, target_os = "linux"))]
pub(crate) fn cachestat_missing(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_os = "linux")]
    fn only_ext4_and_xfs_take_write_back() {
        let dir = tempfile::tempdir().expect("temp dir");
        let st = rustix::fs::statfs(dir.path()).expect("statfs");
        #[allow(clippy::unnecessary_cast)]
        let magic = st.f_type as i64;
        let expect = [0xEF53, 0x5846_5342].contains(&magic);
        assert_eq!(in_place_file_system(dir.path()).is_some(), expect);
        assert_eq!(write_back_device(dir.path()).is_some(), expect);
        // btrfs (0x9123683E) and tmpfs (0x01021994) are not in the list.
        assert!(!IN_PLACE_FILE_SYSTEMS
            .iter()
            .any(|(m, _)| [0x9123_683E, 0x0102_1994].contains(m)));
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn write_back_reports_what_the_system_refuses() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().expect("temp dir");
        let f = File::create(dir.path().join("f")).expect("create");
        f.write_all_at(b"pages", 0).expect("write");
        write_back(&f, 0, 0).expect("a regular file is written back");
        // A character device has no pages to write back: ESPIPE, not a
        // silent success.
        let null = File::open("/dev/null").expect("open /dev/null");
        assert!(write_back(&null, 0, 0).is_err());
        assert!(write_back(&f, u64::MAX, 1).is_err(), "offset past i64");
    }

    /// Only a missing call lets the cache tests skip; any other error
    /// of `cachestat` is a failure of theirs.
    #[test]
    #[cfg(target_os = "linux")]
    fn only_a_missing_cachestat_lets_the_cache_tests_skip() {
        let missing = |n| cachestat_missing(&io::Error::from_raw_os_error(n));
        assert!(missing(libc::ENOSYS) && missing(libc::EPERM));
        assert!(![libc::EBADF, libc::EINVAL, libc::EFAULT]
            .into_iter()
            .any(missing));
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn start_write_back_gets_the_pages_going_without_a_sync() {
        use std::os::unix::fs::FileExt;
        let dir = tempfile::tempdir().expect("temp dir");
        if write_back_device(dir.path()).is_none() {
            // tmpfs and the like: no write-back to observe.
            crate::skip("not ext4 or xfs");
            return;
        }
        let f = File::create(dir.path().join("f")).expect("create");
        f.write_all_at(&vec![7u8; 1 << 20], 0).expect("write");
        match dirty_pages(&f, 0, 0) {
            Err(e) if cachestat_missing(&e) => {
                crate::skip(&format!("no cachestat here ({e})"));
                return;
            }
            // Fresh pages are dirty, or already under write-back if the
            // kernel's flusher was busy with other files.
            r => assert!(
                matches!(r, Ok((d, w)) if d + w > 0),
                "a fresh megabyte left nothing dirty: {r:?}"
            ),
        }
        start_write_back(&f, 0, 1 << 20);
        // The kernel's own flusher would leave them dirty for about 30 s
        // (dirty_expire_centisecs), so clean pages within 10 s are this
        // call's doing.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let (dirty, writeback) = dirty_pages(&f, 0, 0).expect("cachestat");
            if dirty == 0 && writeback == 0 {
                break;
            }
            assert!(
                std::time::Instant::now() < until,
                "still {dirty} dirty and {writeback} under write-back pages"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        // Out-of-range arguments are ignored, not a panic.
        start_write_back(&f, u64::MAX, 1);
    }
}
