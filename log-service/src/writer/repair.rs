//! Segment repair: a damaged or missing segment rebuilt from the other
//! pages of its stripes (parity) and the surviving end-write copies, and
//! put back in place of the damaged one.

use super::*;

impl Writer {
    /// Where each live end-write's three copies are.
    pub(super) fn end_write_copies(&self) -> Vec<EndWriteCopies> {
        let mut found: HashMap<u64, Vec<(u64, u64, Arc<SegFile>)>> = HashMap::new();
        for (&seg, st) in &self.segs {
            for &(off, seq) in &st.ew_pages {
                let in_set = self
                    .ews
                    .get(&seq)
                    .is_some_and(|l| (l.base..l.base + END_WRITE_COPIES as u64).contains(&seg));
                if in_set {
                    found
                        .entry(seq)
                        .or_default()
                        .push((seg, off, st.file.clone()));
                }
            }
        }
        self.ews
            .iter()
            .map(|(&seq, live)| {
                let here = found.remove(&seq).unwrap_or_default();
                let places = (live.base..live.base + END_WRITE_COPIES as u64)
                    .map(|seg| {
                        let at = here.iter().find(|c| c.0 == seg).map(|c| (c.1, c.2.clone()));
                        (seg, at)
                    })
                    .collect();
                EndWriteCopies {
                    seq,
                    page_crc: live.page_crc,
                    places,
                }
            })
            .collect()
    }

    /// Writes the rebuilt bytes of segment `seg` into a zeroed slot of its
    /// zone's device, makes them durable, then points the slot's header at
    /// `seg` and frees the slot that held it: a crash before the header
    /// leaves the old slot in charge, after it the newer header wins
    /// ([`crate::device`]).
    pub(super) fn replace_in_slot(
        &self,
        seg: u64,
        bytes: &[u8],
    ) -> Result<(SegFile, bool), String> {
        let zone = segment::zone(self.zones(), seg);
        let dev = self
            .shared
            .device(zone)
            .ok_or_else(|| format!("zone {zone} has no device"))?;
        let at = |e: io::Error| format!("{}: {e}", dev.path().display());
        let (slot, prepared) = dev.zeroed_slot().map_err(at)?.ok_or_else(|| {
            format!(
                "{} has no free slot to rebuild segment {seg} in; trim the log",
                dev.path().display()
            )
        })?;
        let old = dev.slot_of(seg);
        let written = dev
            .seg_file(slot)
            .and_then(|f| f.write_all_at(bytes, 0).and_then(|_| f.sync_data()));
        if let Err(e) = written {
            // Its zeros are gone: free, not spare.
            dev.give_back(slot, crate::device::Held::Free);
            return Err(at(e));
        }
        let file = dev.assign(slot, seg).map_err(|e| {
            dev.give_back(slot, crate::device::Held::Free);
            at(e)
        })?;
        dev.sync().map_err(at)?;
        if let Some(old) = old {
            dev.free(old).and_then(|_| dev.sync()).map_err(at)?;
        }
        if let Some(s) = &self.spares {
            s.wake();
        }
        Ok((file, prepared))
    }

    /// Rebuilds segment `seg` beside the old file and renames it over:
    /// every stripe page that reads intact as it is, unless its stripe is
    /// in `liars` (a page found to pass its checksum with other bytes than
    /// written), the others from parity (byte-identical); markers and
    /// end-writes where they were, pads in unaccounted gaps; if part of the
    /// file was unaccounted for, the end-writes it held are appended again
    /// (they are found in the other two copies).
    ///
    /// Intact pages are kept rather than rebuilt because a rebuild trusts
    /// every other page of the stripe: with a lying page elsewhere in it,
    /// the rebuilt page would be wrong too (sealed with a good checksum),
    /// and two faults in a one-parity stripe cannot be undone: a scrub
    /// that finds lying pages on two segments sharing stripes would
    /// repair the first segment from the second's lie.
    pub fn repair(&mut self, seg: u64, liars: &[u64]) -> Result<(), String> {
        let refs: Vec<StripeRef> = {
            let idx = self.shared.index();
            idx.stripes
                .values()
                .filter(|r| r.pages.iter().any(|p| p.0 == seg))
                .cloned()
                .collect()
        };
        let mut pieces: Vec<(u64, Vec<u8>)> = Vec::new();
        for r in &refs {
            let Some(j) = r.pages.iter().position(|p| p.0 == seg) else {
                continue;
            };
            let (k, m) = (r.k as usize, r.m as usize);
            let own = crate::shared::read_page(&self.shared, r, j);
            let body = match own {
                Some(body) if !liars.contains(&r.seq) => body,
                _ => {
                    let mut shards: Vec<Option<Vec<u8>>> = vec![None; k + m];
                    // Read every other page; parity decides.
                    for (i, slot) in shards.iter_mut().enumerate() {
                        if i != j {
                            *slot = crate::shared::read_page(&self.shared, r, i);
                        }
                    }
                    let mut all = stripe::rebuild(shards, k, m)
                        .map_err(|e| format!("stripe {}: {e}", r.seq))?;
                    all.swap_remove(j)
                }
            };
            let h = Header {
                kind: r.kind,
                shard: j as u8,
                k: r.k,
                m: r.m,
                body_len: r.shard_len,
                stripe: r.seq,
                payload_len: r.payload_len,
            };
            pieces.push((r.pages[j].1, page::encode(&h, &body)));
        }
        let (known_len, damaged, markers, ew_pages, cls) = match self.segs.get(&seg) {
            Some(s) => (
                Some(s.len),
                s.damaged_at.is_some(),
                s.markers.clone(),
                s.ew_pages.clone(),
                s.class,
            ),
            None => (None, true, Vec::new(), Vec::new(), self.target_class(seg)),
        };
        let in_era = |base: u64| base <= seg && seg < base + END_WRITE_COPIES as u64;
        let era_ews = self.ews.values().any(|live| in_era(live.base));
        // Where the surviving end-write copies are: this segment's own
        // pages first (if it is only partly damaged), then the others of
        // each copy set.
        let copies: HashMap<u64, Vec<(u64, u64)>> = {
            let mut m: HashMap<u64, Vec<(u64, u64)>> = HashMap::new();
            let lo = seg.saturating_sub(END_WRITE_COPIES as u64 - 1);
            for other in lo..seg + END_WRITE_COPIES as u64 {
                if let Some(st) = self.segs.get(&other) {
                    for &(off, seq) in &st.ew_pages {
                        m.entry(seq).or_default().push((other, off));
                    }
                }
            }
            m
        };
        let ew_copy = |seq: u64| -> Option<Vec<u8>> {
            let crc = self.ews.get(&seq)?.page_crc;
            let mut places = copies.get(&seq)?.clone();
            places.sort_by_key(|&(s, _)| s != seg);
            places.into_iter().find_map(|(s, off)| {
                read_ew_page(&self.segs.get(&s)?.file, off, seq)
                    .filter(|p| page::stored_crc(p) == crc)
            })
        };
        if known_len.is_none() && refs.is_empty() && !era_ews {
            return Err(format!("segment {seg} holds nothing live; not rebuilt"));
        }
        for (off, c) in &markers {
            pieces.push((*off, page::class_marker(*c)));
        }
        for (off, seq) in &ew_pages {
            if self.ews.contains_key(seq) {
                if let Some(page) = ew_copy(*seq) {
                    pieces.push((*off, page));
                }
            }
        }
        pieces.sort_by_key(|p| p.0);
        let mut file = Vec::new();
        for (off, bytes) in &pieces {
            let off = *off as usize;
            if off < file.len() {
                let kinds: Vec<String> = pieces
                    .iter()
                    .take(6)
                    .map(|(o, b)| {
                        format!(
                            "{o}:{:?}/{}",
                            page::header(b).map(|h| (h.kind, h.stripe)),
                            b.len()
                        )
                    })
                    .collect();
                return Err(format!(
                    "segment {seg}: overlapping pages at {off} ({})",
                    kinds.join(", ")
                ));
            }
            let gap = off - file.len();
            if gap > 0 {
                if gap < HEADER {
                    return Err(format!(
                        "segment {seg}: gap of {gap} bytes at {}",
                        file.len()
                    ));
                }
                file.extend_from_slice(&page::pad(gap));
            }
            file.extend_from_slice(bytes);
        }
        let mut new_markers = markers.clone();
        let mut new_ew = ew_pages.clone();
        if damaged {
            // Refill: the class, then every end-write of the eras in which
            // this segment was one of the three end-write segments.
            let off = file.len() as u64;
            file.extend_from_slice(&page::class_marker(cls));
            new_markers.push((off, cls));
            let have: BTreeSet<u64> = ew_pages.iter().map(|&(_, s)| s).collect();
            for (&seq, live) in &self.ews {
                if in_era(live.base) && !have.contains(&seq) {
                    if let Some(page) = ew_copy(seq) {
                        new_ew.push((file.len() as u64, seq));
                        file.extend_from_slice(&page);
                    }
                }
            }
        } else if let Some(len) = known_len {
            let len = len as usize;
            if len > file.len() {
                let gap = len - file.len();
                if gap >= HEADER {
                    file.extend_from_slice(&page::pad(gap));
                }
            }
        }
        let (f, slot_prepared) = if self
            .shared
            .device(segment::zone(self.zones(), seg))
            .is_some()
        {
            self.replace_in_slot(seg, &file)?
        } else {
            let path = segment::path(self.zones(), seg);
            let tmp = path.with_extension("repair");
            std::fs::write(&tmp, &file).map_err(|e| format!("write {}: {e}", tmp.display()))?;
            File::open(&tmp)
                .and_then(|f| f.sync_all())
                .map_err(|e| format!("fsync {}: {e}", tmp.display()))?;
            std::fs::rename(&tmp, &path).map_err(|e| format!("rename {}: {e}", path.display()))?;
            if let Some(dir) = path.parent() {
                segment::sync_dir(dir).map_err(|e| e.to_string())?;
            }
            (
                segment::open(&path, false).map_err(|e| e.to_string())?,
                false,
            )
        };
        // A slot is zeros past the data.
        let zeroed = if f.is_slot() {
            f.size().map_err(|e| e.to_string())?
        } else {
            file.len() as u64
        };
        let prepared = if slot_prepared { zeroed } else { 0 };
        let f = Arc::new(f);
        self.shared.files_mut().insert(seg, f.clone());
        let max_seq = refs
            .iter()
            .map(|r| r.seq)
            .chain(new_ew.iter().map(|e| e.1))
            .max()
            .unwrap_or(0);
        // The class the writer counts, not the highest marker: a marker
        // of a raise that failed is in the record (it is in the file) but
        // was never counted.
        let class = cls;
        self.segs.insert(
            seg,
            SegState {
                file: f,
                len: file.len() as u64,
                zeroed,
                prepared,
                class,
                markers: new_markers,
                ew_pages: new_ew,
                max_seq,
                damaged_at: None,
                pending_cut: None,
                direct: DirectFd::Unopened,
            },
        );
        self.shared
            .counters
            .segments_repaired
            .fetch_add(1, Ordering::Relaxed);
        tracing::info!(
            segment = seg,
            bytes = file.len(),
            stripes = refs.len(),
            "segment repaired"
        );
        Ok(())
    }
}

/// Reads the end-write page of stripe `seq` at `off`, if it is intact.
pub(crate) fn read_ew_page(file: &SegFile, off: u64, seq: u64) -> Option<Vec<u8>> {
    let mut head = [0u8; HEADER];
    file.read_exact_at(&mut head, off).ok()?;
    let h = page::header(&head).ok()?;
    let mut buf = vec![0u8; h.page_len() as usize];
    file.read_exact_at(&mut buf, off).ok()?;
    let (h, _) = page::decode(&buf).ok()?;
    (h.kind == Kind::EndWrite && h.stripe == seq).then_some(buf)
}

/// The page bytes of an end-write.
pub(crate) fn ew_page(ew: &EndWrite) -> Vec<u8> {
    ew_page_of(&stripe::encode_end_write(ew), ew.stripe.seq)
}

/// An end-write page of `body` whose header names stripe `seq` (tests
/// give it bodies that do not agree with it).
pub(crate) fn ew_page_of(body: &[u8], seq: u64) -> Vec<u8> {
    page::encode(
        &Header {
            kind: Kind::EndWrite,
            shard: 0,
            k: 0,
            m: 0,
            body_len: body.len() as u32,
            stripe: seq,
            payload_len: 0,
        },
        body,
    )
}
