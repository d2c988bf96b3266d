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
use crate::reports::RecoveryReport;
use crate::request_ids::RequestIds;
use crate::segment::{self, SegFile};
use crate::shared::{Loc, LogIndex, Shared};
use crate::stripe::{self, EndWrite};
use crate::writer::{Cmd, LiveEndWrite, Recovered, SegState, Writer};

mod scan;
#[cfg(test)]
mod tests;

use scan::*;

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
                && crate::shared::valid_pages(&shared, &ew.stripe) < ew.stripe.k as usize
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
                // so that every later open agrees with this one: an append
                // acknowledged after this point would otherwise make the
                // next open count from the old first position and fail
                // ("jumps from position ... to ...").
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
    // Spares before the first window is made, so it can use them: a new
    // store writes those its first windows take now.
    let first: Vec<usize> = if segs.is_empty() {
        let mut per_zone = vec![0; zones.len()];
        for s in base..base + config.window_segments() {
            per_zone[crate::segment::zone(&zones, s)] += 1;
        }
        per_zone
    } else {
        Vec::new()
    };
    let spares = crate::spares::Spares::open(shared.clone(), &first)?;
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
