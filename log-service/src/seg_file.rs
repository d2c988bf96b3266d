//! A segment's descriptor: either a whole segment file, or a fixed-size
//! slot of a raw device (a block device, or a file standing in for one)
//! that holds one segment at a time ([`crate::device`]).
//!
//! Everything above this type addresses a segment from offset 0, as if it
//! were its own file; a slot adds its base on the device and refuses
//! anything past its end, so a bug or a lying page never writes into the
//! neighbouring segment.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// A segment's descriptor (see the module docs).
#[derive(Debug)]
pub struct SegFile {
    file: File,
    /// Device offset of the segment's byte 0 (0 for a whole file).
    base: u64,
    /// The slot's size, `None` for a whole file (which grows as written).
    size: Option<u64>,
}

impl SegFile {
    /// A whole segment file.
    pub fn whole(file: File) -> SegFile {
        SegFile {
            file,
            base: 0,
            size: None,
        }
    }

    /// `size` bytes of a device from `base`.
    pub fn slot(file: File, base: u64, size: u64) -> SegFile {
        SegFile {
            file,
            base,
            size: Some(size),
        }
    }

    /// Whether this is a slot of a device (fixed size, never cut or
    /// grown: its space beyond the data holds zeros).
    pub fn is_slot(&self) -> bool {
        self.size.is_some()
    }

    /// The underlying descriptor, for calls that act on all of it
    /// (`fdatasync`: on a device, every slot's written pages).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// The file offset of `len` bytes at segment offset `off`, or an
    /// error if they do not lie inside the slot.
    fn at(&self, off: u64, len: usize) -> io::Result<u64> {
        match self.size {
            Some(size) if off.checked_add(len as u64).is_none_or(|end| end > size) => {
                Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{len} bytes at offset {off} run past the segment's slot of {size} bytes"
                    ),
                ))
            }
            _ => Ok(self.base + off),
        }
    }

    /// Reads up to `buf.len()` bytes at `off`; a slot ends at its size as
    /// a file ends at its length.
    pub fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<usize> {
        let n = match self.size {
            Some(size) => (size.saturating_sub(off)).min(buf.len() as u64) as usize,
            None => buf.len(),
        };
        if n == 0 {
            return Ok(0);
        }
        self.file.read_at(&mut buf[..n], self.base + off)
    }

    /// Reads exactly `buf.len()` bytes at `off`.
    pub fn read_exact_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        let at = self
            .at(off, buf.len())
            .map_err(|e| io::Error::new(io::ErrorKind::UnexpectedEof, e.to_string()))?;
        self.file.read_exact_at(buf, at)
    }

    /// Writes all of `buf` at `off`.
    pub fn write_all_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        let at = self.at(off, buf.len())?;
        self.file.write_all_at(buf, at)
    }

    /// Writes `parts` one after another from `off` with one `pwritev`,
    /// returning how many bytes the system took.
    pub fn pwritev(&self, parts: &[io::IoSlice<'_>], off: u64) -> io::Result<usize> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let at = self.at(off, total)?;
        loop {
            match rustix::io::pwritev(&self.file, parts, at) {
                Ok(n) => return Ok(n),
                Err(rustix::io::Errno::INTR) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The segment's length: the file's, or the whole slot.
    pub fn size(&self) -> io::Result<u64> {
        match self.size {
            Some(size) => Ok(size),
            None => Ok(self.file.metadata()?.len()),
        }
    }

    /// Makes the written data durable (`fdatasync`).
    pub fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    /// Makes the written data and the file's size durable (`fsync`).
    pub fn sync_all(&self) -> io::Result<()> {
        self.file.sync_all()
    }

    /// Cuts the segment back to `len` bytes of which `written` were
    /// written: a file is truncated; a slot cannot shrink, so its bytes
    /// from `len` to `written` become zeros again, which is what the rest
    /// of a slot holds. Not durable until synced.
    pub fn cut(&self, len: u64, written: u64) -> io::Result<()> {
        match self.size {
            None => self.file.set_len(len),
            Some(_) if written <= len => Ok(()),
            Some(_) => {
                let at = self.at(len, (written - len) as usize)?;
                write_zeros(&self.file, at, written - len)
            }
        }
    }

    /// Writes every dirty page of the segment to the device and waits
    /// ([`crate::flush::write_back`]); for a slot, only the slot's range.
    pub fn write_back(&self) -> io::Result<()> {
        crate::flush::write_back(&self.file, self.base, self.size.unwrap_or(0))
    }

    /// Starts write-back of `len` bytes at `off` without waiting
    /// ([`crate::flush::start_write_back`]).
    pub fn start_write_back(&self, off: u64, len: u64) {
        crate::flush::start_write_back(&self.file, self.base + off, len)
    }

    /// A second descriptor of the same segment for direct writes
    /// ([`open_direct`]).
    pub(crate) fn open_direct(&self) -> io::Result<SegFile> {
        Ok(SegFile {
            file: open_direct(&self.file)?,
            base: self.base,
            size: self.size,
        })
    }
}

/// Writes `len` zeros into `file` at `at`, in 1 MiB steps (a cut may
/// cover a whole batch, a slot a whole segment).
pub(crate) fn write_zeros(file: &File, at: u64, len: u64) -> io::Result<()> {
    const STEP: u64 = 1 << 20;
    let zeros = vec![0u8; STEP.min(len) as usize];
    let mut done = 0;
    while done < len {
        let n = STEP.min(len - done);
        file.write_all_at(&zeros[..n as usize], at + done)?;
        done += n;
    }
    Ok(())
}

/// Opens a second descriptor of `file` for direct writes (Linux,
/// `O_DIRECT`, through `/proc/self/fd`, so it is the same inode even if
/// the path has been renamed over since). An error means direct writes
/// are not possible there (a file system without `O_DIRECT`, such as
/// tmpfs, or no `/proc`); the writer then writes buffered.
#[cfg(target_os = "linux")]
fn open_direct(file: &File) -> io::Result<File> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// Elsewhere the writer writes buffered.
#[cfg(not(target_os = "linux"))]
fn open_direct(_file: &File) -> io::Result<File> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "direct writes are implemented for Linux only",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(bytes: u64) -> (tempfile::TempDir, File) {
        let dir = tempfile::tempdir().expect("temp dir");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.path().join("dev"))
            .expect("create");
        f.set_len(bytes).expect("size");
        (dir, f)
    }

    #[test]
    fn a_slot_adds_its_base_and_stays_inside_its_size() {
        let (_d, f) = device(3 * 4096);
        let slot = SegFile::slot(f.try_clone().expect("clone"), 4096, 4096);
        slot.write_all_at(b"abc", 0).expect("write");
        slot.write_all_at(b"z", 4095).expect("last byte");
        let mut back = [0u8; 3];
        f.read_exact_at(&mut back, 4096).expect("read device");
        assert_eq!(&back, b"abc");
        let mut one = [0u8; 1];
        f.read_exact_at(&mut one, 8191).expect("read device");
        assert_eq!(&one, b"z");
        // Neither neighbour was touched.
        let mut rest = vec![1u8; 4096];
        f.read_exact_at(&mut rest, 0).expect("before");
        assert!(rest.iter().all(|&b| b == 0));
        f.read_exact_at(&mut rest, 8192).expect("after");
        assert!(rest.iter().all(|&b| b == 0));
        // Past the slot: refused, and a read ends there like a file.
        for (off, len) in [(4095, 2), (4096, 1), (u64::MAX, 1)] {
            let e = slot
                .write_all_at(&vec![7u8; len], off)
                .expect_err("past the slot");
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{off}+{len}");
        }
        let parts = [io::IoSlice::new(b"ab"), io::IoSlice::new(b"cd")];
        assert!(slot.pwritev(&parts, 4093).is_err());
        assert_eq!(slot.pwritev(&parts, 4092).expect("fits"), 4);
        let mut buf = [0u8; 8];
        assert_eq!(slot.read_at(&mut buf, 4092).expect("read"), 4);
        assert_eq!(&buf[..4], b"abcd");
        assert_eq!(slot.read_at(&mut buf, 4096).expect("at the end"), 0);
        assert!(slot.read_exact_at(&mut buf, 4092).is_err());
        assert_eq!(slot.size().expect("size"), 4096);
    }

    #[test]
    fn a_cut_truncates_a_file_and_zeros_a_slot() {
        let (_d, f) = device(8192);
        let whole = SegFile::whole(f.try_clone().expect("clone"));
        whole.cut(100, 8192).expect("cut");
        assert_eq!(whole.size().expect("size"), 100);
        f.set_len(3 << 20).expect("size");
        let slot = SegFile::slot(f.try_clone().expect("clone"), 0, 3 << 20);
        // Bytes past `written` too, so that zeros written beyond it show;
        // more than one 1 MiB step of zeros.
        slot.write_all_at(&vec![5u8; 3 << 20], 0).expect("fill");
        let written: usize = (2 << 20) + 10;
        slot.cut(10, written as u64).expect("cut");
        assert_eq!(slot.size().expect("size"), 3 << 20, "a slot keeps its size");
        let mut back = vec![9u8; 3 << 20];
        f.read_exact_at(&mut back, 0).expect("read");
        assert!(back[..10].iter().all(|&b| b == 5));
        assert!(back[10..written].iter().all(|&b| b == 0));
        assert!(
            back[written..].iter().all(|&b| b == 5),
            "only up to `written`"
        );
        // Nothing written past the cut: nothing to zero.
        slot.cut(written as u64 + 100, written as u64 + 50)
            .expect("cut past the data");
        f.read_exact_at(&mut back, 0).expect("read");
        assert!(back[written..].iter().all(|&b| b == 5));
        // A cut near the slot's end is checked by its own range; one
        // reaching past the end is refused before it writes, so the next
        // slot (here the rest of the file) keeps its bytes.
        f.set_len(4 << 20).expect("size");
        f.write_all_at(&vec![5u8; 1 << 20], 3 << 20)
            .expect("next slot");
        let end: u64 = 3 << 20;
        slot.cut(end - 8192, end).expect("cut up to the end");
        let e = slot.cut(end - 100, end + 100).expect_err("past the slot");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let mut back = vec![9u8; 4 << 20];
        f.read_exact_at(&mut back, 0).expect("read");
        let end = end as usize;
        assert!(back[end - 8192..end].iter().all(|&b| b == 0));
        assert!(back[end..].iter().all(|&b| b == 5), "the next slot");
    }

    /// What the durability calls leave in the page cache, which only a
    /// power loss would otherwise show: `write_back` and both syncs leave
    /// no dirty page, and `start_write_back` starts exactly its range of
    /// a slot (the slot's base added), leaving the rest dirty.
    #[test]
    #[cfg(target_os = "linux")]
    fn write_back_and_syncs_leave_no_dirty_page_and_a_start_only_its_range() {
        use crate::flush::dirty_pages;
        let (dir, f) = device(1 << 20);
        if crate::flush::write_back_device(dir.path()).is_none() {
            crate::skip("not ext4 or xfs, whose dirty pages this counts");
            return;
        }
        match dirty_pages(&f, 0, 0) {
            Err(e) if crate::flush::cachestat_missing(&e) => {
                crate::skip(&format!("no cachestat here ({e})"));
                return;
            }
            r => assert!(matches!(r, Ok((0, _))), "a fresh device: {r:?}"),
        }
        const BASE: u64 = 64 << 10;
        let slot = SegFile::slot(f.try_clone().expect("clone"), BASE, 256 << 10);
        let dirty = |off: u64, len: u64| dirty_pages(&f, off, len).expect("cachestat").0;
        let whole_file = || dirty_pages(&f, 0, 0).expect("cachestat");
        // Far apart: the page cache may hold either in folios of several
        // pages, and a rewrite dirties its whole folio.
        const OTHER: u64 = 128 << 10;
        slot.write_all_at(&[3u8; 16 << 10], 0).expect("write");
        slot.write_all_at(&[4u8; 16 << 10], OTHER).expect("write");
        assert!(dirty(BASE, 16 << 10) > 0 && dirty(BASE + OTHER, 16 << 10) > 0);
        slot.start_write_back(0, 16 << 10);
        assert_eq!(dirty(BASE, 16 << 10), 0, "its range started");
        assert!(dirty(BASE + OTHER, 16 << 10) > 0, "the rest left");
        slot.write_back().expect("write back");
        assert_eq!(whole_file(), (0, 0), "written back");
        slot.write_all_at(&[5u8; 8 << 10], 0).expect("write");
        assert!(dirty(0, 0) > 0);
        slot.sync_data().expect("fdatasync");
        assert_eq!(whole_file(), (0, 0), "fdatasync");
        slot.write_all_at(&[6u8; 8 << 10], 0).expect("write");
        assert!(dirty(0, 0) > 0);
        slot.sync_all().expect("fsync");
        assert_eq!(whole_file(), (0, 0), "fsync");
    }

    #[test]
    fn zeros_cover_exactly_their_range_across_steps() {
        let (_d, f) = device(3 << 20);
        f.write_all_at(&vec![1u8; 3 << 20], 0).expect("fill");
        let (at, len) = (100, (1 << 20) + (1 << 19) + 7);
        write_zeros(&f, at, len).expect("zeros");
        let mut back = vec![9u8; 3 << 20];
        f.read_exact_at(&mut back, 0).expect("read");
        let (at, len) = (at as usize, len as usize);
        assert!(back[..at].iter().all(|&b| b == 1));
        assert!(back[at..at + len].iter().all(|&b| b == 0));
        assert!(back[at + len..].iter().all(|&b| b == 1));
    }
}
