//! Direct writes of large batches, handed to the fsync round.
//!
//! A buffered `pwrite` copies every byte into the page cache on the
//! writer thread; for 64 KiB records that copy was 43 % of the service's
//! CPU samples and held the payload rate near 1.35 GB/s on a disk that
//! takes 2.1-2.7 GB/s (docs/benchmarks.md). A direct write (`O_DIRECT`)
//! skips the page cache, but done on the writer it blocks until the
//! device has the data, which measured no faster.
//!
//! So the writer holds each large write back for the batch's round
//! ([`DeferredWrite`]): the whole 4 KiB blocks inside it are copied into a
//! block-aligned buffer, and the helper that syncs that segment writes
//! them directly, the partial blocks at either end buffered (the block
//! they share with the neighbouring write is buffered on both sides, so
//! the page cache never holds a stale copy of it), all in file order,
//! while the writer goes on with the next batch. A round ends after its
//! writes, so an append is still acknowledged only once its pages are
//! durable. Nothing on disk changes: the same bytes land at the same
//! offsets. Off by default (`tuning.direct_writes`): each direct write
//! waits for the device inside the round, which only a copy-bound writer
//! (64 KiB records) gains from (docs/log-service.md).

use crate::seg_file::SegFile;
use std::sync::{Arc, Mutex};

/// The alignment of a direct write's offset, length and memory. 4 KiB
/// covers devices with 512-byte and 4 KiB logical blocks.
pub(crate) const BLOCK: u64 = 4096;

/// Buffers the pool keeps, and the largest it keeps.
const POOL_BUFFERS: usize = 32;
const POOL_BUFFER_MAX: usize = 32 << 20;

/// The part of a write at `off` of `len` bytes that a direct write takes:
/// the whole 4 KiB blocks inside it, as (offset, start in the buffer,
/// length); `None` when there is no whole block.
pub(crate) fn middle(off: u64, len: usize) -> Option<(u64, usize, usize)> {
    let end = off.checked_add(len as u64)?;
    let start = off.div_ceil(BLOCK) * BLOCK;
    let stop = end / BLOCK * BLOCK;
    (stop > start).then(|| (start, (start - off) as usize, (stop - start) as usize))
}

/// A byte buffer whose contents start on a [`BLOCK`] boundary in memory,
/// as a direct write needs. Safe code only: the vector is given room for
/// the contents plus a block first, and the contents start at the first
/// aligned address in it; the vector never grows after that, so it never
/// moves.
pub(crate) struct AlignedBuf {
    v: Vec<u8>,
    start: usize,
}

impl AlignedBuf {
    /// The aligned contents.
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.v[self.start..]
    }

    /// Replaces the contents with `src`, reusing `v`'s allocation when it
    /// is large enough.
    fn fill(mut v: Vec<u8>, src: &[u8]) -> AlignedBuf {
        let len = src.len();
        v.clear();
        v.reserve(len + BLOCK as usize);
        let start = v.as_ptr().align_offset(BLOCK as usize);
        v.resize(start, 0);
        v.extend_from_slice(src);
        debug_assert_eq!(v[start..].as_ptr().align_offset(BLOCK as usize), 0);
        AlignedBuf { v, start }
    }
}

/// Aligned buffers for reuse: the writer fills one per direct write and
/// the helper returns it after writing. Fresh multi-MiB allocations cost
/// a page fault and a zeroed page per 4 KiB on every batch.
#[derive(Default, Clone)]
pub(crate) struct BufPool(Arc<Mutex<Vec<Vec<u8>>>>);

impl BufPool {
    /// An aligned copy of `src`.
    pub(crate) fn copy(&self, src: &[u8]) -> AlignedBuf {
        let v = crate::locks::lock(&self.0).pop().unwrap_or_default();
        AlignedBuf::fill(v, src)
    }

    fn put(&self, v: Vec<u8>) {
        if v.capacity() > POOL_BUFFER_MAX {
            return;
        }
        let mut pool = crate::locks::lock(&self.0);
        if pool.len() < POOL_BUFFERS {
            pool.push(v);
        }
    }
}

/// A write of the batch being built, held back for its round: while a
/// segment has one, every later write of that segment is held back too
/// and done after it, in order, by the same helper, so a crash (even
/// `kill -9`, which keeps what reached the page cache) never leaves
/// written bytes after bytes not yet written: what it leaves looks like
/// an ordinary torn tail. `head` and `tail` are written buffered and
/// `middle`, whole aligned blocks, directly; a small write held back
/// behind a large one is all `head`.
pub(crate) struct DeferredWrite {
    /// The segment's ordinary descriptor.
    pub buffered: Arc<SegFile>,
    /// Its `O_DIRECT` descriptor, when there is a middle.
    pub direct: Option<Arc<SegFile>>,
    /// Where `head` starts.
    pub off: u64,
    pub head: Vec<u8>,
    middle: Option<AlignedBuf>,
    pub tail: Vec<u8>,
    /// One past the last byte of the data written.
    data_end: u64,
    pool: BufPool,
}

impl DeferredWrite {
    /// Holds back the write of `buf` at `off`: split around its whole
    /// blocks when `direct` is given and there are any, else whole.
    pub(crate) fn new(
        buffered: Arc<SegFile>,
        direct: Option<Arc<SegFile>>,
        off: u64,
        buf: &[u8],
        pool: &BufPool,
    ) -> DeferredWrite {
        let split = direct.as_ref().and_then(|_| middle(off, buf.len()));
        let (head, middle, tail) = match split {
            Some((_, skip, n)) => (
                buf[..skip].to_vec(),
                Some(pool.copy(&buf[skip..skip + n])),
                buf[skip + n..].to_vec(),
            ),
            None => (buf.to_vec(), None, Vec::new()),
        };
        DeferredWrite {
            direct: direct.filter(|_| middle.is_some()),
            buffered,
            off,
            head,
            middle,
            tail,
            data_end: off + buf.len() as u64,
            pool: pool.clone(),
        }
    }

    /// Whether this write survives a roll back to `len`: it does when
    /// its data ends at or before `len`. A held-back write is one batch's
    /// write of one segment and a roll back goes back to a batch's start,
    /// so a write never straddles `len`: it is kept or dropped whole.
    pub(crate) fn kept_by_roll_back_to(&self, len: u64) -> bool {
        self.data_end <= len
    }

    /// The whole blocks written directly (empty if none).
    pub(crate) fn middle(&self) -> &[u8] {
        self.middle.as_ref().map_or(&[], |b| b.bytes())
    }
}

impl Drop for DeferredWrite {
    /// Written or dropped (a batch rolled back), the buffer goes back to
    /// the pool.
    fn drop(&mut self) {
        if let Some(b) = self.middle.take() {
            self.pool.put(b.v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The edges of [`middle`]: a range crossing one block boundary but
    /// holding no whole block has no middle (not an empty one), and a
    /// range that is exactly one block is all middle.
    #[test]
    fn the_middle_at_its_edges() {
        const B: u64 = BLOCK;
        assert_eq!(middle(0, 0), None);
        assert_eq!(middle(B - 1, 2), None, "one boundary, no whole block");
        assert_eq!(middle(B + 1, B as usize - 1), None, "ends on a boundary");
        assert_eq!(middle(B, B as usize - 1), None, "starts on a boundary");
        assert_eq!(middle(B, B as usize), Some((B, 0, B as usize)));
        assert_eq!(middle(B - 1, B as usize + 1), Some((B, 1, B as usize)));
        assert_eq!(middle(u64::MAX - 1, 2), None, "past the end of offsets");
    }

    proptest! {
        /// The middle is exactly the whole blocks of the range: aligned,
        /// inside it, and what is left at either end is less than a block
        /// and never a whole block.
        #[test]
        fn the_middle_is_the_whole_blocks_of_the_range(off in 0u64..1 << 40, len in 0usize..1 << 22) {
            let end = off + len as u64;
            match middle(off, len) {
                Some((at, skip, n)) => {
                    prop_assert_eq!(at % BLOCK, 0);
                    prop_assert_eq!(n as u64 % BLOCK, 0);
                    prop_assert!(n > 0);
                    prop_assert_eq!(at, off + skip as u64);
                    prop_assert!(at - off < BLOCK);
                    prop_assert!(end - (at + n as u64) < BLOCK);
                }
                None => {
                    // No block boundary pair inside: the range lies within
                    // two partial blocks at most.
                    prop_assert!(off.div_ceil(BLOCK) * BLOCK + BLOCK > end);
                }
            }
        }
    }

    #[test]
    fn aligned_copies_start_on_a_block_and_reuse_the_pool() {
        let pool = BufPool::default();
        for len in [1usize, 4096, 100_000, 3 << 20] {
            let src: Vec<u8> = (0..len).map(|i| (i * 7 + len) as u8).collect();
            let b = pool.copy(&src);
            assert_eq!(b.bytes().as_ptr().align_offset(BLOCK as usize), 0);
            assert_eq!(b.bytes(), &src[..]);
            pool.put(b.v);
        }
        assert_eq!(crate::locks::lock(&pool.0).len(), 1);
    }

    /// The pool keeps at most [`POOL_BUFFERS`] buffers, each of at most
    /// [`POOL_BUFFER_MAX`] bytes, and a held-back write gives its buffer
    /// back when it is dropped, written or rolled back.
    #[test]
    fn the_pool_keeps_what_it_may_and_gets_buffers_back_on_drop() {
        let kept = |pool: &BufPool| crate::locks::lock(&pool.0).len();
        let pool = BufPool::default();
        for _ in 0..POOL_BUFFERS + 1 {
            pool.put(Vec::with_capacity(64));
        }
        assert_eq!(kept(&pool), POOL_BUFFERS);
        let pool = BufPool::default();
        pool.put(Vec::with_capacity(POOL_BUFFER_MAX));
        assert_eq!(kept(&pool), 1, "the largest kept size is kept");
        pool.put(Vec::with_capacity(POOL_BUFFER_MAX + 1));
        assert_eq!(kept(&pool), 1, "one byte more is not");

        let dir = tempfile::tempdir().expect("temp dir");
        let f = Arc::new(crate::segment::open(&dir.path().join("f"), true).expect("create"));
        let pool = BufPool::default();
        let w = DeferredWrite::new(f.clone(), Some(f), 10, &[8; 3 * BLOCK as usize], &pool);
        assert!(
            !w.middle().is_empty(),
            "a write with whole blocks has a middle"
        );
        assert_eq!(kept(&pool), 0, "the write holds its buffer");
        drop(w);
        assert_eq!(kept(&pool), 1, "and gives it back");
    }

    /// On a file system that takes `O_DIRECT`, a direct write through the
    /// second descriptor is what the buffered one reads back.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_direct_write_is_read_back_through_the_buffered_descriptor() {
        let dir = tempfile::tempdir().expect("temp dir");
        let file = crate::segment::open(&dir.path().join("f"), true).expect("create");
        let Ok(direct) = file.open_direct() else {
            crate::skip("no O_DIRECT on this file system");
            return;
        };
        file.write_all_at(&[1u8; 5000], 0).expect("buffered write");
        let pool = BufPool::default();
        let src: Vec<u8> = (0..3 * BLOCK as usize).map(|i| (i % 251) as u8).collect();
        let buf = pool.copy(&src);
        direct
            .write_all_at(buf.bytes(), 2 * BLOCK)
            .expect("direct write");
        let mut back = vec![0u8; src.len()];
        file.read_exact_at(&mut back, 2 * BLOCK).expect("read");
        assert_eq!(back, src);
        let mut head = vec![0u8; 5000];
        file.read_exact_at(&mut head, 0).expect("read");
        assert!(head.iter().all(|&b| b == 1));
    }
}
