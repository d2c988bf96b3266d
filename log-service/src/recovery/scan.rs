//! Scanning what is on disk at an open: each segment's pages (headers
//! only, except end-write and class pages) and where its data ends, on
//! several threads; and which end-write copies are plausible and which
//! copy of a stripe's end-write wins.

use super::*;

/// Batches the writer may have on disk unacknowledged at a crash: one
/// whose fsync round was running and the one written meanwhile.
pub(super) const UNSYNCED_BATCHES: usize = 2;

/// What a segment scan found.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    /// End of the data.
    pub len: u64,
    /// File length (the data plus its zero-filled space).
    pub zeroed: u64,
    pub markers: Vec<(u64, u8)>,
    /// End-writes: offset, record, and the page's stored checksum.
    pub ews: Vec<(u64, EndWrite, u32)>,
    pub corrupt: u64,
    pub damaged_at: Option<u64>,
    /// A torn-tail candidate: where it starts and where the data ends.
    pub cut: Option<(u64, u64)>,
    /// Bytes read from the file.
    pub read: u64,
}

impl Scan {
    /// The segment's class: the highest marker found.
    pub(super) fn class(&self) -> u8 {
        self.markers
            .iter()
            .map(|m| m.1)
            .max()
            .unwrap_or(class::EMPTY)
    }
}

/// Bytes a header read fetches when pages are small, so a run of small
/// pages costs one read per window rather than one per page.
pub(super) const WINDOW: usize = 64 << 10;

/// Pages at least this long are walked one header read each (the header
/// alone): a window over them would read their bodies, and the bodies of
/// pages of a few KiB and more cost more to copy than a read call.
pub(super) const SMALL_PAGE: u64 = 4 << 10;

/// Positioned reads of one segment file through a small window.
pub(super) struct Cursor<'a> {
    pub(super) file: &'a SegFile,
    pub(super) len: u64,
    pub(super) buf: Vec<u8>,
    /// File offset of `buf[0]`.
    pub(super) at: u64,
    pub(super) read: u64,
}

impl<'a> Cursor<'a> {
    pub(super) fn new(file: &'a SegFile, len: u64) -> Self {
        Cursor {
            file,
            len,
            buf: Vec::with_capacity(WINDOW),
            at: 0,
            read: 0,
        }
    }

    /// The `n` bytes at `off` (fewer at the end of the file), from the
    /// window when it holds them, else from a new read of at least `want`.
    pub(super) fn get(&mut self, off: u64, n: usize, want: usize) -> std::io::Result<&[u8]> {
        let n = n.min(self.len.saturating_sub(off) as usize);
        let held = off >= self.at && off + n as u64 <= self.at + self.buf.len() as u64;
        if !held {
            let m = n.max(want).min(self.len.saturating_sub(off) as usize);
            self.buf.resize(m, 0);
            self.file.read_exact_at(&mut self.buf, off)?;
            self.at = off;
            self.read += m as u64;
        }
        let i = (off - self.at) as usize;
        Ok(&self.buf[i..i + n])
    }
}

/// Walks a segment's pages by their headers, reading bodies only where the
/// scan needs them (end-writes, class markers, the last page), so recovery
/// reads a few KiB per page rather than the whole log.
///
/// The walk ends at the first all-zero header: window segments are
/// zero-filled ahead of their data, and a page header is never all zeros.
/// Non-zero bytes after that point mean a page whose header was lost (torn
/// by a crash, or damaged): the segment is marked for repair. How far the
/// scan looks for them:
/// - a segment whose last page is its seal marker takes no more writes, so
///   nothing after that can be data: its zero tail (a spare sealed early
///   keeps one) is not read;
/// - a data segment still open looks `near` bytes on (two pages and more):
///   a page torn away hides at most the page after it there. Its tail can
///   be a whole spare's zeros, and reading those at every start made
///   recovery cost the window's size. Stray bytes further on can only be
///   an unacknowledged batch's torn pages or damage to unused space, which
///   the segment's next pages overwrite; acknowledged pages are found by
///   their end-writes instead ([`recover`] rebuilds a segment when a live
///   stripe has a page at or past the end of its data);
/// - any other segment (end-write, or without a class yet) reads its
///   whole tail. Nothing cross-checks end-writes the way end-writes check
///   data pages, and two batches' end-writes can be longer than `near`
///   (a batch holds up to 16K records), so a crash can leave an
///   unacknowledged end-write page beyond any fixed stretch; left there,
///   it would be read as live once new pages reached exactly its offset.
///   Any stray bytes rebuild the segment instead. With spares its tail
///   is a spare's zeros (every segment is made from one when one is
///   ready), so an open reads up to a segment per end-write copy.
///
/// A page that runs past the end of the file is a torn-tail candidate; a
/// page that fails its checksum is counted and kept; an unreadable header
/// is damage: the scan stops there and the segment is marked for repair.
pub(crate) fn scan(path: &Path, file: &SegFile, near: u64) -> std::io::Result<Scan> {
    let len = file.size()?;
    let mut cur = Cursor::new(file, len);
    let mut s = Scan::default();
    let mut off = 0u64;
    let mut want = WINDOW;
    let mut cut: Option<u64> = None;
    // The last page walked, and whether its body was checked.
    let mut last: Option<(u64, u64, bool)> = None;
    let mut sealed = false;
    while off < len {
        let hdr = cur.get(off, HEADER, want)?;
        if hdr.iter().all(|&b| b == 0) {
            break;
        }
        if hdr.len() < HEADER {
            cut = Some(off);
            break;
        }
        let h = match page::header(hdr) {
            Ok(h) => h,
            Err(_) => {
                tracing::warn!(path = %path.display(), offset = off, "unreadable page header; segment will be rebuilt");
                s.damaged_at = Some(off);
                break;
            }
        };
        let end = off + h.page_len();
        if end > len {
            cut = Some(off);
            break;
        }
        let needs_body = matches!(h.kind, Kind::EndWrite | Kind::Class);
        sealed = false;
        if needs_body {
            let page = cur.get(off, h.page_len() as usize, want)?;
            match page::decode(page) {
                Ok((h, body)) => match h.kind {
                    Kind::EndWrite => match stripe::decode_end_write(body) {
                        Ok(ew) if ew.stripe.seq == h.stripe => {
                            s.ews.push((off, ew, page::stored_crc(page)))
                        }
                        _ => s.corrupt += 1,
                    },
                    Kind::Class => {
                        if let Some(&c) = body.first() {
                            s.markers.push((off, c));
                            sealed = c >= class::SEALED;
                        }
                    }
                    _ => {}
                },
                // A page whose header reads and which fits the file is
                // kept even if its checksum fails: a torn write leaves an
                // unreferenced page (its batch was never acknowledged; the
                // last-batch check decides), while cutting a corrupt page
                // that an end-write references would let new pages land
                // on its offset.
                Err(_) => {
                    tracing::warn!(path = %path.display(), offset = off, "page fails its checksum");
                    s.corrupt += 1;
                }
            }
        }
        last = Some((off, h.page_len(), needs_body));
        want = if h.page_len() >= SMALL_PAGE {
            HEADER
        } else {
            WINDOW
        };
        off = end;
    }
    // The last page is the one a crash may have torn: check its body too.
    if let Some((at, n, false)) = last {
        if page::decode(cur.get(at, n as usize, want)?).is_err() {
            tracing::warn!(path = %path.display(), offset = at, "page fails its checksum");
            s.corrupt += 1;
        }
    }
    s.zeroed = len;
    s.len = off.min(len);
    if s.damaged_at.is_some() {
        s.len = len;
    } else if let Some(at) = cut {
        // Looks like a torn tail; whether it is one is decided once the
        // end-writes are known (a flipped length byte in a header also
        // "runs past the end", and live pages may follow it).
        s.cut = Some((at, data_end(file, len, at, &mut s.read)?));
        s.len = at;
    } else if off < len && !sealed && {
        let data = matches!(s.class(), class::UNORDERED | class::ORDERED);
        let end = if data { len.min(off + near) } else { len };
        data_end(file, end, off, &mut s.read)? > off
    } {
        tracing::warn!(path = %path.display(), offset = off, "data after a zeroed page header; segment will be rebuilt");
        s.damaged_at = Some(off);
        s.len = len;
    }
    s.read += cur.read;
    Ok(s)
}

/// One end-write per stripe from the copies found (up to three, the same
/// bytes when written): the version most copies agree on, ties going to
/// the copy on the lowest segment. Copies that disagree with it count as
/// corrupt pages. Taking the first copy found instead would depend on the
/// order a directory lists its files, and one copy that passed its
/// checksum but differed (a wrong record checksum or position) would make
/// a record unreadable or the open fail while two good copies are on disk.
pub(super) fn choose_copies(
    all: BTreeMap<u64, Vec<Copy>>,
    report: &mut RecoveryReport,
) -> BTreeMap<u64, Copy> {
    let mut out = BTreeMap::new();
    for (seq, mut found) in all {
        found.sort_by_key(|c| c.seg);
        let votes = |ew: &EndWrite| found.iter().filter(|o| &o.ew == ew).count();
        let mut best = 0;
        let mut best_votes = 0;
        for (i, c) in found.iter().enumerate() {
            let v = votes(&c.ew);
            if v > best_votes {
                (best, best_votes) = (i, v);
            }
        }
        let outvoted = found.len() - best_votes;
        if outvoted > 0 {
            tracing::warn!(
                stripe = seq,
                copies = found.len(),
                agreeing = best_votes,
                "end-write copies disagree; taking the one most copies agree on"
            );
            report.corrupt_pages += outvoted as u64;
        }
        out.insert(seq, found.swap_remove(best));
    }
    out
}

/// One copy of an end-write found on disk.
pub(super) struct Copy {
    /// The segment it is on.
    pub(super) seg: u64,
    pub(super) ew: EndWrite,
    /// Its page's stored checksum.
    pub(super) page_crc: u32,
}

/// What the scans found that bounds every true stripe reference.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// No page ends further into its segment than this: the configured
    /// segment size, or a longer file's (written under a larger one).
    pub(crate) segment_len: u64,
    /// The highest segment id with a file.
    pub(crate) last_segment: u64,
}

/// Whether an end-write found in segment `seg` that passed its checksum
/// describes a stripe this store can have written:
/// - `seg` is in the record's own copy set (the end-write segments from
///   its `ew_base` on);
/// - the stripe's k + m pages are on consecutive segments in shard order,
///   as a window places them, the last no further past the highest
///   segment on disk than a window reaches (three end-write segments and
///   two stripe widths; a segment above the last file is one whose file
///   was lost);
/// - every page lies inside a segment of `bounds.segment_len` bytes.
///
/// A checksum does not make a record true (a bug, or a disk that returns
/// another block's bytes, can produce one that passes), and everything
/// after recovery trusts these references: repair builds a segment's
/// image in memory up to the furthest page offset (the `log_recover` fuzz
/// target found an offset 159 GB in), and a page on a segment that never
/// existed made the open fail for want of a rebuild. A record that fails
/// counts as damage, like a checksum failure, and another copy is used.
pub(super) fn plausible(ew: &EndWrite, seg: u64, bounds: Bounds) -> bool {
    let copies = crate::config::END_WRITE_COPIES as u64;
    let own_set = seg.checked_sub(ew.ew_base).is_some_and(|d| d < copies);
    let r = &ew.stripe;
    let Some(&(first, _)) = r.pages.first() else {
        return false;
    };
    let in_order = r
        .pages
        .iter()
        .enumerate()
        .all(|(i, p)| first.checked_add(i as u64) == Some(p.0));
    let width = r.pages.len() as u64;
    let reach = bounds.last_segment.saturating_add(copies + 2 * width);
    let near_disk = first.saturating_add(width - 1) <= reach;
    let page = HEADER as u64 + r.shard_len as u64;
    let fits = r.pages.iter().all(|&(_, off)| {
        off.checked_add(page)
            .is_some_and(|end| end <= bounds.segment_len)
    });
    own_set && in_order && near_disk && fits
}

/// One past the last non-zero byte of the file in `from..to` (`from`
/// itself when there is none), read backwards in blocks.
pub(super) fn data_end(file: &SegFile, to: u64, from: u64, read: &mut u64) -> std::io::Result<u64> {
    let mut end = to;
    // No bigger than the range: most calls look at a tail of a few pages.
    let mut buf = vec![0u8; to.saturating_sub(from).min(1 << 20) as usize];
    while end > from {
        let n = (end - from).min(buf.len() as u64) as usize;
        let start = end - n as u64;
        file.read_exact_at(&mut buf[..n], start)?;
        *read += n as u64;
        if let Some(i) = last_non_zero(&buf[..n]) {
            return Ok(start + i as u64 + 1);
        }
        end = start;
    }
    Ok(from)
}

/// Index of the last non-zero byte. Whole 4 KiB blocks are tested with
/// word ORs (which vectorise) before any byte is looked at.
pub(super) fn last_non_zero(buf: &[u8]) -> Option<usize> {
    const BLOCK: usize = 4096;
    let mut end = buf.len();
    while end > 0 {
        let start = end.saturating_sub(BLOCK);
        let block = &buf[start..end];
        let words = block.chunks_exact(8);
        let tail_nz = words.remainder().iter().any(|&b| b != 0);
        let or = words.fold(0u64, |a, w| {
            a | u64::from_ne_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]])
        });
        if or != 0 || tail_nz {
            return block.iter().rposition(|&b| b != 0).map(|i| start + i);
        }
        end = start;
    }
    None
}

/// A segment file opened and scanned.
pub(super) type Scanned = std::io::Result<(SegFile, Scan)>;

/// Threads that scan segments at once. A scan is mostly small reads at
/// scattered offsets (page headers), which a cold start waits on one at a
/// time; several in flight let the device overlap them.
pub(super) const SCANNERS: usize = 8;

/// Opens and scans every segment, on up to [`SCANNERS`] threads; results in
/// the order given.
pub(super) fn scan_all(shared: &Shared, found: &[Found], near: u64) -> Vec<Scanned> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Mutex;
    let one = |f: &Found| -> Scanned {
        let file = match f.slot {
            Some((zone, slot)) => shared.devices[zone].seg_file(slot)?,
            None => segment::open(&f.path, false)?,
        };
        let s = scan(&f.path, &file, near)?;
        Ok((file, s))
    };
    let threads = SCANNERS.min(found.len());
    if threads <= 1 {
        return found.iter().map(one).collect();
    }
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Scanned>>> = Mutex::new(found.iter().map(|_| None).collect());
    let work = || loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        let Some(f) = found.get(i) else {
            break;
        };
        let r = one(f);
        results.lock().unwrap_or_else(|e| e.into_inner())[i] = Some(r);
    };
    std::thread::scope(|sc| {
        // This thread scans too, so the open goes on (slower) if the
        // system refuses more threads.
        for n in 1..threads {
            let spawned = std::thread::Builder::new()
                .name(format!("melddb-log-scan-{n}"))
                .spawn_scoped(sc, work);
            if let Err(e) = spawned {
                tracing::warn!(error = %e, "could not start a segment scan thread; scanning on fewer");
                break;
            }
        }
        work();
    });
    results
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .into_iter()
        .map(|r| r.unwrap_or_else(|| Err(std::io::Error::other("a segment scan thread stopped"))))
        .collect()
}

/// A segment recovery found: a file, or a slot of a zone's device (then
/// `path` names the device and slot, for messages).
pub(super) struct Found {
    pub(super) id: u64,
    pub(super) path: std::path::PathBuf,
    pub(super) slot: Option<(usize, u64)>,
}
