//! Opening the store: scan every segment (headers only, except end-write
//! and class pages), cut torn tails, take the union of the three
//! end-write copies, drop any stripe above a hole (never acknowledged),
//! rebuild the index and the request-id table, slide the windows back
//! into place, and rebuild segment files that are missing or damaged.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::mpsc;

use crate::error::{ConfigError, OpenError};
use crate::meta::Meta;
use crate::page::{self, class, Kind, HEADER};
use crate::request_ids::RequestIds;
use crate::segment::{self, SegFile};
use crate::store::{Loc, LogIndex, RecoveryReport, Shared};
use crate::stripe::{self, EndWrite};
use crate::writer::{Cmd, LiveEndWrite, Recovered, SegState, Writer};

/// Batches the writer may have on disk unacknowledged at a crash: one
/// whose fsync round was running and the one written meanwhile.
const UNSYNCED_BATCHES: usize = 2;

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
    fn class(&self) -> u8 {
        self.markers
            .iter()
            .map(|m| m.1)
            .max()
            .unwrap_or(class::EMPTY)
    }
}

/// Bytes a header read fetches when pages are small, so a run of small
/// pages costs one read per window rather than one per page.
const WINDOW: usize = 64 << 10;

/// Pages at least this long are walked one header read each (the header
/// alone): a window over them would read their bodies, and the bodies of
/// pages of a few KiB and more cost more to copy than a read call.
const SMALL_PAGE: u64 = 4 << 10;

/// Positioned reads of one segment file through a small window.
struct Cursor<'a> {
    file: &'a SegFile,
    len: u64,
    buf: Vec<u8>,
    /// File offset of `buf[0]`.
    at: u64,
    read: u64,
}

impl<'a> Cursor<'a> {
    fn new(file: &'a SegFile, len: u64) -> Self {
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
    fn get(&mut self, off: u64, n: usize, want: usize) -> std::io::Result<&[u8]> {
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
/// corrupt pages. Before, the first copy found won, whatever the other two
/// said, and which one was first depended on the order a directory listed
/// its files: one copy that passed its checksum but differed (a wrong
/// record checksum or position) made a record unreadable or the open fail
/// while two good copies were on disk.
fn choose_copies(
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
struct Copy {
    /// The segment it is on.
    seg: u64,
    ew: EndWrite,
    /// Its page's stored checksum.
    page_crc: u32,
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
fn plausible(ew: &EndWrite, seg: u64, bounds: Bounds) -> bool {
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
fn data_end(file: &SegFile, to: u64, from: u64, read: &mut u64) -> std::io::Result<u64> {
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
fn last_non_zero(buf: &[u8]) -> Option<usize> {
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
type Scanned = std::io::Result<(SegFile, Scan)>;

/// Threads that scan segments at once. A scan is mostly small reads at
/// scattered offsets (page headers), which a cold start waits on one at a
/// time; several in flight let the device overlap them.
const SCANNERS: usize = 8;

/// Opens and scans every segment, on up to [`SCANNERS`] threads; results in
/// the order given.
fn scan_all(shared: &Shared, found: &[Found], near: u64) -> Vec<Scanned> {
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
struct Found {
    id: u64,
    path: std::path::PathBuf,
    slot: Option<(usize, u64)>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> OpenError + '_ {
    move |source| OpenError::Io {
        path: path.to_path_buf(),
        source,
    }
}

pub(crate) fn recover(
    shared: Arc<Shared>,
    rx: mpsc::Receiver<Cmd>,
    wake: mpsc::WeakSender<Cmd>,
) -> Result<(Writer, RecoveryReport), OpenError> {
    let t0 = Instant::now();
    let config = shared.config.clone();
    let zones = config.zones.clone();
    let nz = zones.len() as u64;
    let mut report = RecoveryReport::default();
    for z in &zones {
        std::fs::create_dir_all(z).map_err(io(z))?;
    }
    let mut meta = Meta::load(&zones)
        .map_err(OpenError::Meta)?
        .unwrap_or_default();
    let on_devices = !shared.devices.is_empty();
    if meta.version > 0 && meta.on_devices != on_devices {
        let why = if meta.on_devices {
            "this log's segments are on devices, and the configuration lists none: add its `devices` back (one per zone, in zone order)"
        } else {
            "this log's segments are files in the zone directories, and the configuration lists `devices`: remove them, or give the devices their own, empty zone directories to start a new log there"
        };
        return Err(OpenError::Config(ConfigError::Invalid(why.into())));
    }
    meta.on_devices = on_devices;

    // How far past an open data segment's data a scan looks for the rest of
    // a page torn away: the page after it, whole.
    let near = 2 * (config.page_bytes as u64 + HEADER as u64) + WINDOW as u64;
    // Segments: found first, scanned in parallel, then taken in the order
    // found.
    let mut found: Vec<Found> = Vec::new();
    for (zi, dev) in shared.devices.iter().enumerate() {
        for (id, slot) in dev.segments() {
            let path = std::path::PathBuf::from(format!("{} slot {slot}", dev.path().display()));
            if id % nz != zi as u64 {
                return Err(OpenError::Config(ConfigError::Invalid(format!(
                    "{} holds segment {id}, which belongs to zone {}, but the device is zone {zi}'s",
                    path.display(),
                    id % nz
                ))));
            }
            found.push(Found {
                id,
                path,
                slot: Some((zi, slot)),
            });
        }
    }
    // With devices, segment files in the zone directories are not read:
    // the devices hold the log.
    let dirs = if shared.devices.is_empty() {
        &zones[..]
    } else {
        &[]
    };
    for (zi, z) in dirs.iter().enumerate() {
        for entry in std::fs::read_dir(z).map_err(io(z))? {
            let entry = entry.map_err(io(z))?;
            let name = entry.file_name();
            let Some(id) = name.to_str().and_then(segment::parse_name) else {
                continue;
            };
            if id % nz != zi as u64 {
                return Err(OpenError::Config(ConfigError::Invalid(format!(
                    "segment file {} is in zone {zi} but belongs to zone {}: the zones list changed order or a file was moved",
                    entry.path().display(),
                    id % nz
                ))));
            }
            found.push(Found {
                id,
                path: entry.path(),
                slot: None,
            });
        }
    }
    let scanned = scan_all(&shared, &found, near);
    // An end-write that passes its checksum but describes a stripe this
    // store cannot have written ([`plausible`]) counts as a corrupt page;
    // what it can have written is bounded by every segment the scans saw.
    let mut bounds = Bounds {
        segment_len: config.segment_bytes,
        last_segment: 0,
    };
    for (f, r) in found.iter().zip(&scanned) {
        if let Ok((_, s)) = r {
            bounds.segment_len = bounds.segment_len.max(s.zeroed);
        }
        bounds.last_segment = bounds.last_segment.max(f.id);
    }
    let mut segs: BTreeMap<u64, SegState> = BTreeMap::new();
    // Every plausible copy of every end-write, with the segment it is on.
    let mut all_copies: BTreeMap<u64, Vec<Copy>> = BTreeMap::new();
    for (f, r) in found.iter().zip(scanned) {
        let (file, s) = r.map_err(io(&f.path))?;
        let id = f.id;
        report.bytes += s.len;
        report.bytes_read += s.read;
        report.corrupt_pages += s.corrupt;
        let class = s.class();
        let mut max_seq = 0;
        let mut ew_pages = Vec::with_capacity(s.ews.len());
        for (off, ew, page_crc) in s.ews {
            if !plausible(&ew, id, bounds) {
                report.corrupt_pages += 1;
                continue;
            }
            report.end_writes += 1;
            max_seq = max_seq.max(ew.stripe.seq);
            ew_pages.push((off, ew.stripe.seq));
            all_copies.entry(ew.stripe.seq).or_default().push(Copy {
                seg: id,
                ew,
                page_crc,
            });
        }
        // Whether a reopened file's blocks are all written and committed
        // is not known (a kill can leave allocations uncommitted): it is
        // fsynced file by file until sealed; so is a slot of a file
        // standing in for a device. A block device's slot has nothing to
        // allocate.
        let block = f
            .slot
            .is_some_and(|(zone, _)| shared.devices[zone].is_block());
        let prepared = if block { s.zeroed } else { 0 };
        let file = Arc::new(file);
        shared.files_mut().insert(id, file.clone());
        segs.insert(
            id,
            SegState {
                file,
                len: s.len,
                zeroed: s.zeroed,
                prepared,
                class,
                markers: s.markers,
                ew_pages,
                max_seq,
                damaged_at: s.damaged_at,
                pending_cut: s.cut,
                direct: Default::default(),
            },
        );
    }

    let chosen = choose_copies(all_copies, &mut report);
    // Which bytes the chosen copies are, for repair (kept by the writer).
    let page_crcs: BTreeMap<u64, u32> = chosen.iter().map(|(&s, c)| (s, c.page_crc)).collect();
    let mut copies: BTreeMap<u64, EndWrite> = chosen.into_iter().map(|(s, c)| (s, c.ew)).collect();

    // Stripes recovery or a failed batch discarded are never trusted, even
    // though their end-writes may still be on disk.
    copies.retain(|&seq, _| !meta.is_discarded(seq));
    // Stripes: everything up to the first hole above the stable point.
    let max_present = copies.keys().next_back().copied().unwrap_or(0);
    let mut hole = None;
    let mut s = meta.stable_seq + 1;
    while s <= max_present {
        if copies.contains_key(&s) {
            s += 1;
        } else if let Some(end) = meta.discarded_through(s) {
            s = end + 1;
        } else {
            hole = Some(s);
            break;
        }
    }
    if let Some(h) = hole {
        let dropped = copies.split_off(&h);
        report.dropped_stripes = dropped.len() as u64;
        if !dropped.is_empty() {
            tracing::warn!(
                from = h,
                count = dropped.len(),
                "dropping stripes above an incomplete one (never acknowledged)"
            );
            meta.discarded.push((h, max_present));
        }
    }
    // Pages and end-writes of a batch share one fsync round, and the
    // writer writes the next batch while that round runs, so the last two
    // batches' end-writes may have reached the disk without all their
    // pages. Every stripe of such a batch must still be readable (k good
    // pages), or that batch and the one after it are dropped: neither was
    // acknowledged. Only a batch's own stripes decide: the batch before the
    // last may have been acknowledged while the last one was torn.
    let batches: BTreeSet<u64> = copies.values().map(|ew| ew.batch_seq).collect();
    for &batch in batches.iter().rev().take(UNSYNCED_BATCHES).rev() {
        let broken = copies.range(batch..).any(|(_, ew)| {
            ew.batch_seq == batch
                && crate::store::valid_pages(&shared, &ew.stripe) < ew.stripe.k as usize
        });
        if broken {
            let dropped = copies.split_off(&batch);
            tracing::warn!(
                from = batch,
                count = dropped.len(),
                "dropping an unacknowledged batch (and any after it): a stripe of it is incomplete"
            );
            report.dropped_stripes += dropped.len() as u64;
            meta.discarded.push((batch, max_present));
            break;
        }
    }
    let discarded_max = meta.discarded.iter().map(|d| d.1).max().unwrap_or(0);
    let next_seq = max_present
        .max(discarded_max)
        .max(meta.next_seq_floor.saturating_sub(1))
        + 1;
    meta.next_seq_floor = next_seq;
    // Numbers the open skips, between every stripe found (and the stable
    // point) and the next stripe, must be discarded as well: the next
    // open would otherwise take the first of them for a hole and drop
    // every stripe written after it, acknowledged ones included. A
    // store's own floor and ranges never skip (they come from stripes it
    // numbered); an edited `meta.json` can.
    let skipped = max_present.max(meta.stable_seq) + 1..next_seq;
    if !skipped.is_empty() && !meta.covers(skipped.start, skipped.end - 1) {
        tracing::warn!(
            from = skipped.start,
            to = skipped.end - 1,
            "the metadata skips stripe numbers no stripe has (was it edited?): marking them discarded"
        );
        meta.discarded.push((skipped.start, skipped.end - 1));
    }

    // Data pages count toward their segment's highest stripe.
    for ew in copies.values() {
        for (seg, _) in &ew.stripe.pages {
            if let Some(st) = segs.get_mut(seg) {
                st.max_seq = st.max_seq.max(ew.stripe.seq);
            }
        }
    }

    // Index and request ids.
    let mut logs: BTreeMap<String, LogIndex> = BTreeMap::new();
    for (name, lm) in &meta.logs {
        logs.insert(name.clone(), LogIndex::starting_at(lm.first));
    }
    let mut request_ids = RequestIds::new(config.dedup_window);
    // Only the last `dedup_window` request ids stay in the table, so the
    // ones before them are never inserted (inserting and evicting every id
    // of a long log was most of a warm open's time). Trimmed records count
    // neither way, as below.
    let trimmed = |e: &stripe::EntryMeta| meta.logs.get(&e.log).is_some_and(|lm| e.pos < lm.first);
    let ids = copies
        .values()
        .flat_map(|ew| &ew.entries)
        .filter(|e| e.client != 0 && !trimmed(e))
        .count();
    let mut skip_ids = ids.saturating_sub(config.dedup_window);
    for ew in copies.values() {
        for (i, e) in ew.entries.iter().enumerate() {
            // No copy of the log's name per record (`entry` would take one).
            if !logs.contains_key(&e.log) {
                logs.insert(e.log.clone(), LogIndex::starting_at(e.pos));
            }
            let l = logs.get_mut(&e.log).expect("inserted above");
            if e.pos < l.first {
                continue; // trimmed
            }
            if e.pos != l.tail() {
                return Err(OpenError::Unrecoverable {
                    stripe: ew.stripe.seq,
                    why: format!(
                        "log {:?} jumps from position {} to {}: end-writes are missing from all three copies",
                        e.log,
                        l.tail(),
                        e.pos
                    ),
                });
            }
            l.locs.push_back(Loc {
                stripe: ew.stripe.seq,
                idx: i as u32,
                len: e.len,
                batch_seq: ew.batch_seq,
                offset: e.offset,
                crc: e.crc,
            });
            report.records += 1;
            if e.client != 0 {
                if skip_ids > 0 {
                    skip_ids -= 1;
                    continue;
                }
                // `remember` keeps the bound even if the count above were off.
                request_ids.remember((e.client, e.request), e.pos);
            }
        }
    }
    for (name, lm) in meta.logs.iter_mut() {
        let l = logs.get_mut(name).expect("inserted above");
        if l.tail() < lm.tail_floor {
            if l.locs.is_empty() && l.first >= lm.first {
                // Trimmed empty: nothing to read, but the tail must not
                // fall back. (Or every copy of the records' end-writes
                // was lost, which looks the same; see the warning.) The
                // metadata written below records the new first position,
                // so that every later open agrees with this one: before,
                // an append acknowledged after this point made the next
                // open fail ("jumps from position ... to ..."), since it
                // counted from the old first position again.
                if lm.first < lm.tail_floor {
                    tracing::warn!(
                        log = %name,
                        from = lm.first,
                        to = lm.tail_floor,
                        "no records left of positions the metadata calls live; taking them as trimmed (a later trim's metadata was lost, or every copy of their end-writes was)"
                    );
                }
                l.first = lm.tail_floor;
                lm.first = lm.tail_floor;
            } else {
                return Err(OpenError::Unrecoverable {
                    stripe: 0,
                    why: format!(
                        "log {name:?} ends at {} but positions up to {} were handed out",
                        l.tail(),
                        lm.tail_floor
                    ),
                });
            }
        }
    }
    {
        let mut idx = shared.index_mut();
        idx.stripes = copies
            .iter()
            .map(|(&s, ew)| (s, ew.stripe.clone()))
            .collect();
        idx.logs = logs;
    }
    report.stripes = copies.len() as u64;

    // Windows: the base is the lowest segment not sealed.
    let base = segs
        .iter()
        .find(|(_, s)| s.class < class::SEALED)
        .map(|(&id, _)| id)
        .or_else(|| segs.keys().next_back().map(|&m| m + 1))
        .unwrap_or(0);
    // Spares before the first window is made, so it can use them.
    let spares = crate::spares::Spares::open(shared.clone())?;
    let ews = copies
        .values()
        .map(|ew| {
            let live = LiveEndWrite {
                base: ew.ew_base,
                page_crc: page_crcs.get(&ew.stripe.seq).copied().unwrap_or(0),
            };
            (ew.stripe.seq, live)
        })
        .collect();
    let found = Recovered {
        segs,
        base,
        next_seq,
        meta,
        ews,
        request_ids,
    };
    let mut writer = Writer::new(shared.clone(), rx, wake, spares, found)?;
    // Forget what trim made unreachable before deciding what is missing.
    writer.forget_unreachable();
    writer.store_meta().map_err(io(&zones[0]))?;

    // Where the scans stopped, against where live stripes have pages. A
    // live page at or past the end of a segment's data means pages the scan
    // did not reach (a header lost in the middle, further on than the scan
    // looked): rebuild the segment rather than let new pages land on them.
    // A torn-tail candidate is cut only if it is short (at most one write's
    // last page) and no live page lies there; anything else is damage too.
    {
        let bound = 2 * config.data_shards as u64 * config.page_bytes as u64 + 4096;
        let idx = shared.index();
        let mut furthest: BTreeMap<u64, u64> = BTreeMap::new();
        for r in idx.stripes.values() {
            for &(sg, o) in &r.pages {
                let f = furthest.entry(sg).or_insert(o);
                *f = (*f).max(o);
            }
        }
        for (id, st) in writer.segments_mut() {
            if st.damaged_at.is_some() {
                continue;
            }
            // A candidate's data ends where the candidate starts.
            let live_after = furthest.get(&id).is_some_and(|&o| o >= st.len);
            let cut = st.pending_cut.take();
            let why = match cut {
                None if live_after => Some("live pages after the end of the data found"),
                Some((at, end)) if live_after || end - at > bound => {
                    Some("bad page with data after it")
                }
                _ => None,
            };
            if let Some(why) = why {
                tracing::warn!(
                    segment = id,
                    offset = st.len,
                    "{why}; segment will be rebuilt"
                );
                st.damaged_at = Some(st.len);
                st.len = st.zeroed;
                continue;
            }
            let Some((at, end)) = cut else {
                continue;
            };
            tracing::warn!(
                segment = id,
                offset = at,
                bytes = end - at,
                "zeroing torn tail"
            );
            let path = segment::path(&zones, id);
            st.file
                .write_all_at(&vec![0u8; (end - at) as usize], at)
                .and_then(|_| st.file.sync_all())
                .map_err(io(&path))?;
            report.torn_bytes += end - at;
        }
    }
    // Repair what is missing or damaged.
    let wanted = writer.segments_to_rebuild();
    for seg in wanted {
        writer
            .repair(seg, &[])
            .map_err(|why| OpenError::Unrecoverable {
                stripe: 0,
                why: format!("rebuilding segment {seg}: {why}"),
            })?;
        report.repaired_segments.push(seg);
    }
    report.segments = writer.segment_count();
    writer.ensure_window().map_err(|e| OpenError::Io {
        path: zones[0].clone(),
        source: std::io::Error::other(e.to_string()),
    })?;
    report.millis = t0.elapsed().as_millis() as u64;
    tracing::info!(?report, "log store recovered");
    Ok((writer, report))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page::Header;
    use std::io::Write;

    #[test]
    fn an_end_write_is_plausible_only_where_this_store_can_have_written_it() {
        // A record of the copy set 10..13 for a stripe on segments 1, 2, 3.
        let good = crate::samples::end_write();
        let bounds = Bounds {
            segment_len: 1 << 20,
            last_segment: 13,
        };
        for seg in 10..13 {
            assert!(plausible(&good, seg, bounds), "found on segment {seg}");
        }
        assert!(!plausible(&good, 9, bounds), "below its copy set");
        assert!(!plausible(&good, 13, bounds), "above its copy set");
        type Edit = fn(&mut EndWrite);
        let cases: [(&str, Edit); 6] = [
            ("page offset past any segment", |e| {
                e.stripe.pages[0].1 = 1 << 40
            }),
            ("shard longer than a segment", |e| {
                e.stripe.shard_len = u32::MAX
            }),
            ("two pages on one segment", |e| {
                e.stripe.pages[1].0 = e.stripe.pages[0].0
            }),
            ("pages out of order", |e| e.stripe.pages.swap(0, 1)),
            ("pages beyond a window's reach", |e| {
                for (i, p) in e.stripe.pages.iter_mut().enumerate() {
                    p.0 = 100 + i as u64;
                }
            }),
            ("a copy-set base near 2^64", |e| e.ew_base = u64::MAX - 1),
        ];
        for (what, edit) in cases {
            let mut bad = good.clone();
            edit(&mut bad);
            assert!(!plausible(&bad, 10, bounds), "{what}");
        }
    }

    /// A window reaches three end-write segments and two stripe widths
    /// past the last segment on disk, and a page must end within its
    /// segment: both bounds are inclusive, and one further is refused.
    #[test]
    fn the_plausible_reach_and_page_end_are_exact() {
        let bounds = Bounds {
            segment_len: 1 << 20,
            last_segment: 13,
        };
        // Width 3: the last page may be on segment 13 + 3 + 2 * 3 = 22.
        let on = |first: u64| {
            let mut e = crate::samples::end_write();
            for (i, p) in e.stripe.pages.iter_mut().enumerate() {
                p.0 = first + i as u64;
            }
            e
        };
        assert!(plausible(&on(20), 10, bounds), "last page on segment 22");
        assert!(!plausible(&on(21), 10, bounds), "last page on segment 23");
        // A page is its 28-byte header and a 64-byte shard.
        let ending_at = |end: u64| {
            let mut e = crate::samples::end_write();
            e.stripe.pages[2].1 = end - (HEADER as u64 + 64);
            e
        };
        assert!(
            plausible(&ending_at(1 << 20), 10, bounds),
            "ends at the segment's end"
        );
        assert!(
            !plausible(&ending_at((1 << 20) + 1), 10, bounds),
            "one byte past it"
        );
    }

    /// Of a stripe's end-write copies, the one most copies agree on is
    /// taken, a tie going to the copy on the lowest segment, and every
    /// copy that differs from it counts as one corrupt page.
    #[test]
    fn the_end_write_most_copies_agree_on_wins_and_ties_go_to_the_lowest_segment() {
        let version = |batch_seq: u64| {
            let mut e = crate::samples::end_write();
            e.batch_seq = batch_seq;
            e
        };
        let copies = |found: &[(u64, u64)]| -> Vec<Copy> {
            found
                .iter()
                .map(|&(seg, v)| Copy {
                    seg,
                    ew: version(v),
                    page_crc: v as u32,
                })
                .collect()
        };
        // (copies as (segment, version) in the order found, the winner's
        // segment and version, corrupt pages)
        type Case = (&'static [(u64, u64)], (u64, u64), u64);
        let cases: [Case; 6] = [
            (&[(11, 1)], (11, 1), 0),
            (&[(12, 1), (10, 1), (11, 1)], (10, 1), 0),
            (&[(10, 2), (11, 1), (12, 1)], (11, 1), 1),
            (&[(12, 1), (11, 1), (10, 2)], (11, 1), 1),
            (&[(12, 3), (10, 1), (11, 2)], (10, 1), 2),
            (&[(11, 2), (12, 1)], (11, 2), 1),
        ];
        for (found, (seg, v), corrupt) in cases {
            let mut report = RecoveryReport::default();
            let mut all = BTreeMap::new();
            all.insert(41, copies(found));
            all.insert(42, copies(&[(11, 7)]));
            let chosen = choose_copies(all, &mut report);
            assert_eq!(chosen.len(), 2, "{found:?}");
            let c = &chosen[&41];
            assert_eq!(
                (c.seg, c.ew.batch_seq, c.page_crc, report.corrupt_pages),
                (seg, v, v as u32, corrupt),
                "{found:?}"
            );
            assert_eq!(chosen[&42].ew.batch_seq, 7);
        }
    }

    /// How far past an open data segment's data the tests' scans look.
    const NEAR: u64 = 1 << 20;

    /// An ordered shard page with a body of `n` bytes.
    fn shard(n: usize, stripe: u64) -> Vec<u8> {
        let body: Vec<u8> = (0..n).map(|i| (i % 251) as u8 + 1).collect();
        page::encode(
            &Header {
                kind: Kind::Ordered,
                shard: 0,
                k: 4,
                m: 1,
                body_len: n as u32,
                stripe,
                payload_len: n as u32,
            },
            &body,
        )
    }

    /// A segment file of `pages` followed by `zeros` zero bytes.
    fn segment(pages: &[Vec<u8>], zeros: usize) -> (tempfile::TempDir, std::path::PathBuf, u64) {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("seg");
        let mut f = std::fs::File::create(&path).expect("create");
        let mut data = 0;
        for p in pages {
            f.write_all(p).expect("write");
            data += p.len() as u64;
        }
        f.write_all(&vec![0u8; zeros]).expect("write zeros");
        (dir, path, data)
    }

    fn scan_of(path: &Path) -> Scan {
        let file = SegFile::whole(std::fs::File::open(path).expect("open"));
        scan(path, &file, NEAR).expect("scan")
    }

    fn poke(path: &Path, at: u64, bytes: &[u8]) {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .expect("open");
        f.write_all_at(bytes, at).expect("poke");
    }

    #[test]
    fn pages_of_a_few_kib_and_more_are_walked_by_their_headers_alone() {
        for (n, size) in [(16, 256 << 10), (200, 16 << 10), (400, 5 << 10)] {
            let pages: Vec<Vec<u8>> = (1..=n).map(|s| shard(size, s)).collect();
            let (_d, path, data) = segment(&pages, 0);
            let s = scan_of(&path);
            assert_eq!(s.len, data);
            assert_eq!((s.corrupt, s.damaged_at, s.cut), (0, None, None));
            // A header per page, the first window and the last page whole:
            // well under the data (reading it all, as the scan once did,
            // or a window per page of a few KiB, fails).
            let most = n * HEADER as u64 + WINDOW as u64 + size as u64 + 4096;
            assert!(
                s.read <= most && s.read >= n * HEADER as u64 + size as u64,
                "{size} B pages: read {} of {data} bytes",
                s.read
            );
        }
    }

    #[test]
    fn small_pages_share_reads_and_every_marker_and_end_of_data_is_found() {
        let mut pages: Vec<Vec<u8>> = (1..=3000)
            .map(|s| shard(100 + s as usize % 700, s))
            .collect();
        pages.insert(1000, page::class_marker(class::ORDERED));
        let (_d, path, data) = segment(&pages, 1 << 20);
        let s = scan_of(&path);
        assert_eq!(s.len, data);
        assert_eq!(s.zeroed, data + (1 << 20));
        assert_eq!(s.markers.len(), 1);
        assert_eq!(s.markers[0].1, class::ORDERED);
        assert_eq!((s.corrupt, s.damaged_at, s.cut), (0, None, None));
        // Window reads: a few dozen for about 1.3 MiB of pages, plus the
        // zero tail of a segment still open for writing.
        assert!(
            s.read < data + data / 8 + (1 << 20) + WINDOW as u64,
            "read {}",
            s.read
        );
        // Without a tail every byte read is the walk's: windows of small
        // pages take in nearly all their bodies too (a read per header
        // instead, with no window or small pages walked header by header,
        // reads a tenth of the data).
        let (_d2, path2, data2) = segment(&pages, 0);
        let s2 = scan_of(&path2);
        assert_eq!((s2.len, s2.markers.len()), (data2, 1));
        assert!(
            s2.read >= data2 - data2 / 16 && s2.read < data2 + data2 / 8 + WINDOW as u64,
            "read {} of {data2}",
            s2.read
        );
    }

    #[test]
    fn how_much_of_a_zero_tail_is_read_depends_on_the_segments_class() {
        let shards: Vec<Vec<u8>> = (1..=8).map(|s| shard(256 << 10, s)).collect();
        let with = |marker: Option<u8>, sealed: bool| {
            let mut pages = Vec::new();
            pages.extend(marker.map(page::class_marker));
            pages.extend(shards.iter().cloned());
            if sealed {
                pages.push(page::class_marker(class::SEALED));
            }
            pages
        };
        let tail = 64 << 20;
        for (marker, sealed, most, least) in [
            // No class yet (or end-write): the whole tail.
            (None, false, u64::MAX, tail as u64),
            (Some(class::END_WRITE), false, u64::MAX, tail as u64),
            // An open data segment: `NEAR` bytes of it.
            (Some(class::ORDERED), false, NEAR + (1 << 20), NEAR),
            (Some(class::UNORDERED), false, NEAR + (1 << 20), NEAR),
            // Sealed: none of it.
            (Some(class::ORDERED), true, 1 << 20, 0),
        ] {
            let (_d, path, data) = segment(&with(marker, sealed), tail);
            let s = scan_of(&path);
            assert_eq!((s.len, s.damaged_at), (data, None), "{marker:?} {sealed}");
            assert!(
                s.read >= least && s.read <= most,
                "{marker:?} sealed {sealed}: read {}",
                s.read
            );
        }
    }

    #[test]
    fn bytes_after_a_zeroed_header_mark_a_segment_damaged_as_far_as_the_scan_looks() {
        let mut pages: Vec<Vec<u8>> = vec![page::class_marker(class::ORDERED)];
        pages.extend((1..=6).map(|s| shard(4000, s)));
        let marker = pages[0].len() as u64;
        let page_len = pages[1].len() as u64;
        let (_d, path, _) = segment(&pages, 8 << 20);
        // The fourth shard's first bytes lost (a torn write or damage):
        // pages after it still hold data.
        poke(&path, marker + 3 * page_len, &[0u8; HEADER]);
        let s = scan_of(&path);
        assert_eq!(s.damaged_at, Some(marker + 3 * page_len));
        // Stray bytes just after the data of an open data segment: damage
        // (the scan cannot tell them from a page whose header was torn).
        let (_d2, path2, data2) = segment(&pages, 8 << 20);
        poke(&path2, data2 + NEAR / 2, b"stray");
        assert_eq!(scan_of(&path2).damaged_at, Some(data2));
        // Further on than the scan looks: not data (live pages past the
        // end are found through the end-writes instead).
        let (_d3, path3, data3) = segment(&pages, 8 << 20);
        poke(&path3, data3 + 2 * NEAR, b"stray");
        assert_eq!(scan_of(&path3).damaged_at, None);
        // A segment without a class reads its whole tail.
        let (_d4, path4, data4) = segment(&pages[1..], 8 << 20);
        poke(&path4, data4 + (6 << 20), b"stray");
        assert_eq!(scan_of(&path4).damaged_at, Some(data4));
        // After the seal nothing is written, so bytes there are not data.
        let mut sealed = pages.clone();
        sealed.push(page::class_marker(class::SEALED));
        let (_d5, path5, data5) = segment(&sealed, 8 << 20);
        poke(&path5, data5 + NEAR / 2, b"stray");
        let s5 = scan_of(&path5);
        assert_eq!((s5.damaged_at, s5.len), (None, data5));
    }

    #[test]
    fn a_page_running_past_the_end_is_a_cut_candidate_up_to_the_last_data() {
        let pages: Vec<Vec<u8>> = (1..=4).map(|s| shard(4000, s)).collect();
        let page_len = pages[0].len() as u64;
        let (_d, path, data) = segment(&pages, 0);
        // Truncate inside the last page: torn.
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open");
        f.set_len(data - 100).expect("truncate");
        let s = scan_of(&path);
        assert_eq!(s.len, 3 * page_len);
        assert_eq!(s.cut, Some((3 * page_len, data - 100)));
        // A torn last page whose body was zeroed in part: kept, counted.
        let (_d2, path2, data2) = segment(&pages, 1 << 20);
        poke(&path2, data2 - 50, &[0u8; 50]);
        let s2 = scan_of(&path2);
        assert_eq!((s2.len, s2.corrupt, s2.damaged_at), (data2, 1, None));
    }

    /// A file that ends inside a page header (fewer than its 28 bytes,
    /// not all zero) ends in a torn page, like one whose body runs past
    /// the end: a cut candidate, not damage.
    #[test]
    fn a_header_cut_short_at_the_end_is_a_cut_candidate() {
        let mut pages: Vec<Vec<u8>> = (1..=3).map(|s| shard(4000, s)).collect();
        let whole = 3 * pages[0].len() as u64;
        pages.push(shard(4000, 4)[..HEADER / 2].to_vec());
        let (_d, path, data) = segment(&pages, 0);
        let s = scan_of(&path);
        assert_eq!((s.len, s.damaged_at), (whole, None));
        assert_eq!(s.cut, Some((whole, data)));
    }

    /// End-write pages are kept with their offset, record and stored
    /// checksum; one whose record names another stripe than its header,
    /// one whose body is not a record, and one failing its checksum are
    /// each counted once as corrupt and kept out.
    #[test]
    fn end_writes_are_kept_with_their_checksum_and_bad_ones_counted() {
        let ew = |seq: u64| {
            let mut e = crate::samples::end_write();
            e.stripe.seq = seq;
            e
        };
        let good = crate::writer::ew_page(&ew(41));
        let other_stripe =
            crate::writer::repair::ew_page_of(&stripe::encode_end_write(&ew(42)), 43);
        let not_a_record = crate::writer::repair::ew_page_of(b"not an end-write record", 44);
        let bad_crc = crate::writer::ew_page(&ew(45));
        let last = crate::writer::ew_page(&ew(46));
        let pages = vec![
            page::class_marker(class::END_WRITE),
            good.clone(),
            other_stripe,
            not_a_record,
            bad_crc,
            last.clone(),
        ];
        let offsets: Vec<u64> = pages
            .iter()
            .scan(0u64, |at, p| {
                let here = *at;
                *at += p.len() as u64;
                Some(here)
            })
            .collect();
        let (_d, path, data) = segment(&pages, 1 << 16);
        // One byte of the fifth page's body flipped: its checksum fails.
        poke(&path, offsets[4] + HEADER as u64 + 3, &[0xff]);
        let s = scan_of(&path);
        assert_eq!((s.len, s.damaged_at, s.cut), (data, None, None));
        assert_eq!(s.markers, vec![(0, class::END_WRITE)]);
        let kept: Vec<(u64, u64, u32)> = s
            .ews
            .iter()
            .map(|(at, e, crc)| (*at, e.stripe.seq, *crc))
            .collect();
        assert_eq!(
            kept,
            vec![
                (offsets[1], 41, page::stored_crc(&good)),
                (offsets[5], 46, page::stored_crc(&last)),
            ]
        );
        assert_eq!(s.ews[0].1, ew(41));
        assert_eq!(s.corrupt, 3, "the three bad end-write pages");
    }

    /// `data_end` over ranges longer than its 1 MiB reads: the end of the
    /// data inside the range, or the range's start when the range holds
    /// only zeros, whatever lies below it.
    #[test]
    fn the_end_of_data_is_looked_for_inside_the_range_only() {
        let (_d, path, _) = segment(&[vec![0xaa; 4096]], 3 << 20);
        let file = SegFile::whole(std::fs::File::open(&path).expect("open"));
        let len = 4096 + (3 << 20);
        let mut read = 0;
        let from = 1 << 20;
        assert_eq!(data_end(&file, len, from, &mut read).expect("read"), from);
        assert_eq!(read, len - from, "the range, once");
        poke(&path, (2 << 20) + 5, &[1]);
        let mut read = 0;
        assert_eq!(
            data_end(&file, len, from, &mut read).expect("read"),
            (2 << 20) + 6
        );
        assert_eq!(data_end(&file, 4000, 10, &mut read).expect("read"), 4000);
        assert_eq!(data_end(&file, 3000, 3000, &mut read).expect("read"), 3000);
    }

    /// Bytes past the last whole word of the lowest block are found too.
    #[test]
    fn a_last_non_zero_byte_after_the_last_whole_word_is_found() {
        for (len, from) in [(13, 8), (5, 0), (4096 + 5, 0), (4096 + 13, 8)] {
            let mut buf = vec![0u8; len];
            buf[from..len % 4096].fill(7);
            assert_eq!(last_non_zero(&buf), Some(len % 4096 - 1), "{len} {from}");
        }
    }

    #[test]
    fn the_last_non_zero_byte_matches_a_byte_by_byte_search() {
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..400 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 20_000) as usize;
            let mut buf = vec![0u8; len];
            let k = (x >> 20) % 4;
            for j in 0..k {
                if len > 0 {
                    let i = ((x >> (24 + 8 * j)) as usize) % len;
                    buf[i] = (x >> 8) as u8 | 1;
                }
            }
            assert_eq!(
                last_non_zero(&buf),
                buf.iter().rposition(|&b| b != 0),
                "len {len}"
            );
        }
    }
}
