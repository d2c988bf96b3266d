//! Scrub: reads every page of every live stripe and every copy of every
//! live end-write, checks each page against its checksum, each stripe
//! against its parity and each end-write copy against the bytes the
//! writer wrote (or recovery chose), and each class marker against the
//! marker written, and rebuilds every segment that holds something bad. A read finds damage only where it reads, and a parity
//! page or an end-write copy is read only when something else is already
//! lost: without a scrub that checks them, a second fault is the first
//! time anyone learns the redundancy was gone.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde::Serialize;
use tokio::sync::oneshot;

use super::Store;
use crate::page::{self, Kind};
use crate::shared::{parse_payload, read_page, Loc, Parsed};
use crate::stripe::{self, StripeRef};
use crate::writer::{read_ew_page, Cmd};

/// What a scrub found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ScrubReport {
    /// Stripes read.
    pub stripes: u64,
    /// Pages that failed their check: missing, failing their checksum, or
    /// (found through parity) passing it with other bytes than written.
    pub bad_pages: u64,
    /// Stripes whose pages all passed their checksums but did not agree
    /// with their parity.
    pub parity_mismatches: u64,
    /// Live end-writes whose copies were read.
    pub end_writes: u64,
    /// End-write copies missing, failing their checksum, or holding
    /// other bytes than the version written.
    pub bad_end_write_copies: u64,
    /// Class markers read (one or more per segment).
    pub markers: u64,
    /// Class markers missing or not the bytes written: a segment whose
    /// marker is damaged reads as another class, or as ending there, at
    /// the next open.
    pub bad_markers: u64,
    /// Segments rebuilt.
    pub repaired: Vec<u64>,
    /// Stripes that could not be rebuilt, or whose pages disagree with
    /// their parity in a way no single page explains.
    pub unrecoverable: Vec<u64>,
    /// Segments whose rebuild failed, and why.
    pub failed: Vec<(u64, String)>,
}

/// How far a scrub has got, for a caller that shows progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Stripes checked so far.
    pub stripes_done: u64,
    /// Live stripes when the scrub started.
    pub stripes: u64,
    /// Page bytes of the stripes checked so far.
    pub bytes_done: u64,
    /// Page bytes of every live stripe.
    pub bytes: u64,
}

/// Runs a scrub of `store` (blocking; see [`Store::scrub_blocking`]),
/// calling `progress` after every stripe.
pub(crate) fn run(store: &Store, progress: &mut dyn FnMut(Progress)) -> ScrubReport {
    let refs: Vec<StripeRef> = store.shared.index().stripes.values().cloned().collect();
    let page_bytes =
        |r: &StripeRef| r.pages.len() as u64 * (page::HEADER as u64 + r.shard_len as u64);
    let mut at = Progress {
        stripes_done: 0,
        stripes: refs.len() as u64,
        bytes_done: 0,
        bytes: refs.iter().map(page_bytes).sum(),
    };
    let mut report = ScrubReport::default();
    let mut bad_segs = BadSegments::new();
    for r in &refs {
        check_stripe(store, r, &mut report, &mut bad_segs);
        at.stripes_done += 1;
        at.bytes_done += page_bytes(r);
        progress(at);
    }
    report.stripes = at.stripes_done;
    check_end_writes(store, &mut report, &mut bad_segs);
    check_markers(store, &mut report, &mut bad_segs);
    for (seg, liars) in bad_segs {
        let (reply, rx) = oneshot::channel();
        if store
            .tx
            .blocking_send(Cmd::RepairNow { seg, liars, reply })
            .is_err()
        {
            report.failed.push((seg, "the writer has stopped".into()));
            continue;
        }
        match rx.blocking_recv() {
            Ok(Ok(())) => report.repaired.push(seg),
            Ok(Err(why)) => report.failed.push((seg, why)),
            Err(_) => report.failed.push((seg, "the writer has stopped".into())),
        }
    }
    report
}

/// Segments to rebuild, each with the stripes whose page there lies under
/// a valid checksum (every other intact page is kept as it is).
type BadSegments = BTreeMap<u64, Vec<u64>>;

/// Reads all of `r`'s pages; a missing or bad page marks its segment, and
/// a full set that disagrees with its parity is resolved to the one page
/// whose replacement makes every record on the stripe match its checksum.
fn check_stripe(
    store: &Store,
    r: &StripeRef,
    report: &mut ScrubReport,
    bad_segs: &mut BadSegments,
) {
    let (k, m) = (r.k as usize, r.m as usize);
    let shards: Vec<Option<Vec<u8>>> = (0..r.pages.len())
        .map(|i| read_page(&store.shared, r, i))
        .collect();
    let lost: Vec<u64> = (0..r.pages.len())
        .filter(|&i| shards[i].is_none())
        .map(|i| r.pages[i].0)
        .collect();
    if !lost.is_empty() {
        report.bad_pages += lost.len() as u64;
        store
            .shared
            .counters
            .pages_rebuilt
            .fetch_add(lost.len() as u64, Ordering::Relaxed);
        for seg in lost {
            bad_segs.entry(seg).or_default();
        }
        if stripe::payload(shards, k, m, r.payload_len as usize).is_err() {
            report.unrecoverable.push(r.seq);
        }
        return;
    }
    let full: Vec<Vec<u8>> = shards.into_iter().flatten().collect();
    match stripe::parity_agrees(&full, k, m) {
        Ok(true) => return,
        Ok(false) => {}
        Err(why) => {
            tracing::error!(stripe = r.seq, %why, "scrub: cannot check the stripe's parity");
            report.unrecoverable.push(r.seq);
            return;
        }
    }
    report.parity_mismatches += 1;
    // A copy decoded before the scrub may hold the lie.
    if let Some(c) = store.shared.cache().as_mut() {
        c.pop(&r.seq);
    }
    match lying_page(store, r, &full) {
        Some(j) => {
            let seg = r.pages[j].0;
            tracing::warn!(
                stripe = r.seq,
                shard = j,
                segment = seg,
                "scrub: a page passed its checksum but disagreed with its stripe's parity; segment will be rebuilt"
            );
            report.bad_pages += 1;
            store
                .shared
                .counters
                .pages_rebuilt
                .fetch_add(1, Ordering::Relaxed);
            bad_segs.entry(seg).or_default().push(r.seq);
        }
        None => {
            tracing::error!(
                stripe = r.seq,
                "scrub: the stripe's pages disagree with its parity and no single page explains it"
            );
            report.unrecoverable.push(r.seq);
        }
    }
}

/// The page of `r` that, rebuilt from the others, makes every record
/// stored on the stripe match its checksum. Parity pages are tried first:
/// when the data pages as they are already satisfy every record, the data
/// is what reads have been serving, and rebuilding parity from it can
/// only restore the redundancy. (With one parity page a mismatch says
/// that a page is wrong, not which; the records' checksums say which.)
fn lying_page(store: &Store, r: &StripeRef, full: &[Vec<u8>]) -> Option<usize> {
    let (k, m) = (r.k as usize, r.m as usize);
    let records = records_on(store, r);
    (k..k + m).chain(0..k).find(|&skip| {
        let shards: Vec<Option<Vec<u8>>> = full
            .iter()
            .enumerate()
            .map(|(i, s)| (i != skip).then(|| s.clone()))
            .collect();
        let Ok(payload) = stripe::payload(shards, k, m, r.payload_len as usize) else {
            return false;
        };
        let Ok(alt) = parse_payload(r, payload).map(Arc::new) else {
            return false;
        };
        records.iter().all(|rec| {
            let Some(root) = &rec.root else {
                return false;
            };
            let (log, pos, loc) = (&rec.log, rec.pos, &rec.loc);
            let got = store.record_from(root, loc, log, pos, &mut |s| {
                if s.seq == r.seq {
                    Ok(alt.clone())
                } else {
                    store.stripe(s)
                }
            });
            got.is_ok_and(|b| crc32fast::hash(&b) == loc.crc)
        })
    })
}

/// A live record with bytes on a stripe being checked.
struct Record {
    log: String,
    pos: u64,
    loc: Loc,
    /// Its root stripe (`None`: not in the index, so it cannot be read).
    root: Option<StripeRef>,
}

/// Every live record with bytes on stripe `r`: for a root stripe, the
/// records it roots; for a fragment stripe, the records whose root lists
/// it. A log's positions take increasing stripes, and a record's
/// fragments lie between its batch's first stripe and its root, so each
/// log is searched by bisection.
fn records_on(store: &Store, r: &StripeRef) -> Vec<Record> {
    let mut out = Vec::new();
    {
        let idx = store.shared.index();
        for (log, l) in &idx.logs {
            let (from, to) = if r.kind == Kind::Ordered {
                (
                    l.locs.partition_point(|loc| loc.stripe < r.seq),
                    l.locs.partition_point(|loc| loc.stripe <= r.seq),
                )
            } else {
                (
                    l.locs.partition_point(|loc| loc.stripe <= r.seq),
                    l.locs.partition_point(|loc| loc.batch_seq <= r.seq),
                )
            };
            for i in from..to.max(from) {
                let Some(&loc) = l.locs.get(i) else { break };
                if r.kind == Kind::Ordered || loc.offset == stripe::FRAGMENTED {
                    out.push(Record {
                        log: log.clone(),
                        pos: l.first + i as u64,
                        loc,
                        root: idx.stripes.get(&loc.stripe).cloned(),
                    });
                }
            }
        }
    }
    if r.kind != Kind::Ordered {
        // Keep the records whose root entry names this fragment.
        out.retain(|rec| {
            let Some(root) = &rec.root else {
                return false;
            };
            match store.stripe(root).as_deref() {
                Ok(Parsed::Root(entries)) => entries
                    .get(rec.loc.idx as usize)
                    .is_some_and(|e| e.fragments.contains(&r.seq)),
                _ => true,
            }
        });
    }
    out
}

/// Reads every copy of every live end-write; a copy that is missing,
/// fails its checksum or holds another version marks its segment.
fn check_end_writes(store: &Store, report: &mut ScrubReport, bad_segs: &mut BadSegments) {
    let Some(all) = ask_writer(store, Cmd::EndWriteCopies) else {
        return;
    };
    for c in all {
        report.end_writes += 1;
        for (seg, at) in c.places {
            let good = at.is_some_and(|(off, file)| {
                read_ew_page(&file, off, c.seq).is_some_and(|p| page::stored_crc(&p) == c.page_crc)
            });
            if !good {
                tracing::warn!(
                    stripe = c.seq,
                    segment = seg,
                    "scrub: an end-write copy is missing or not the version written; segment will be rebuilt"
                );
                report.bad_end_write_copies += 1;
                bad_segs.entry(seg).or_default();
            }
        }
    }
}

/// Reads every class marker the writer recorded; one that is missing or
/// holds other bytes than the marker written marks its segment.
fn check_markers(store: &Store, report: &mut ScrubReport, bad_segs: &mut BadSegments) {
    let Some(all) = ask_writer(store, Cmd::Markers) else {
        return;
    };
    for (seg, file, markers) in all {
        for (off, class) in markers {
            report.markers += 1;
            let want = page::class_marker(class);
            let mut got = vec![0u8; want.len()];
            if file.read_exact_at(&mut got, off).is_ok() && got == want {
                continue;
            }
            tracing::warn!(
                segment = seg,
                offset = off,
                "scrub: a class marker is missing or damaged; segment will be rebuilt"
            );
            report.bad_markers += 1;
            bad_segs.entry(seg).or_default();
        }
    }
}

/// Sends the writer a question and waits for its answer; `None` when the
/// writer has stopped (the scrub then checks nothing more of that kind).
fn ask_writer<T>(store: &Store, cmd: impl FnOnce(oneshot::Sender<T>) -> Cmd) -> Option<T> {
    let (reply, rx) = oneshot::channel();
    store.tx.blocking_send(cmd(reply)).ok()?;
    rx.blocking_recv().ok()
}
