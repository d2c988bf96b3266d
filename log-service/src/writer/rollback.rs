//! Rolling back a failed batch: its writes cut off the segments they
//! reached, its stripe numbers recorded as discarded, and the windows made
//! whole again, or the store refusing appends until that is done.

use super::*;

impl Writer {
    /// Answers a batch that did not reach the disk (its writes are rolled
    /// back) with the error.
    pub(super) fn fail(&mut self, pending: Vec<Pending>, e: StoreError) {
        self.shared
            .counters
            .write_failures
            .fetch_add(1, Ordering::Relaxed);
        tracing::warn!(error = %e, "append batch failed; rolled back");
        let err = match e {
            StoreError::Full(_) | StoreError::WriteFailed(_) | StoreError::NoSpace(_) => e,
            other => StoreError::WriteFailed(other.to_string()),
        };
        for p in pending {
            for r in p.replies {
                let _ = r.send(Err(err.clone()));
            }
        }
    }

    /// Cuts every segment back to its length before the failed batch and
    /// records the batch's stripe numbers as discarded, so recovery never
    /// takes a half-written stripe for a complete one.
    pub(super) fn roll_back(&mut self, lens_before: &BTreeMap<u64, u64>, first_seq: u64) {
        self.dirty.clear();
        // Held-back writes belong to the batch written last:
        // those of the part being rolled back go; an earlier part's stay.
        for (seg, ws) in &mut self.deferred {
            let before = lens_before.get(seg).copied().unwrap_or(0);
            ws.retain(|w| w.kept_by_roll_back_to(before));
        }
        self.deferred.retain(|_, ws| !ws.is_empty());
        self.late.retain(|s| self.deferred.contains_key(s));
        let mut trouble = Vec::new();
        for (&seg, st) in self.segs.iter_mut() {
            let before = lens_before.get(&seg).copied().unwrap_or(0);
            // A torn end at or below `before` is stale: a marker write that
            // failed outside a batch (the roll back's own slide, or the
            // next append finishing it), written over since.
            let torn = self.torn.remove(&seg).filter(|&end| end > before);
            if st.len == before && lens_before.contains_key(&seg) {
                // Only a failed write's bytes to undo: over zeros written
                // earlier (a spare, or zero-filled space), zeros again keep
                // the blocks written and the segment prepared.
                match torn {
                    None => continue,
                    Some(end) if end <= st.zeroed => {
                        let zeros = vec![0u8; (end - before) as usize];
                        if let Err(e) = st
                            .file
                            .write_all_at(&zeros, before)
                            .and_then(|_| st.file.sync_data())
                        {
                            trouble.push(format!("segment {seg}: {e}"));
                        }
                        continue;
                    }
                    Some(_) => {}
                }
            }
            let written = st.len.max(torn.unwrap_or(0));
            if let Err(e) = st
                .file
                .cut(before, written)
                .and_then(|_| st.file.sync_all())
            {
                trouble.push(format!("segment {seg}: {e}"));
            }
            st.len = before;
            // A device slot keeps its size and its zeros (the cut wrote
            // zeros back), so it stays prepared; a file cut is shorter,
            // and its next pages extend it.
            if !st.file.is_slot() {
                st.zeroed = before;
                st.prepared = st.prepared.min(before);
            }
            st.markers.retain(|&(o, _)| o < before);
            st.ew_pages.retain(|&(o, _)| o < before);
            // A cut only lowers the class. A marker kept may never have
            // been counted (a raise that failed after writing it) and so
            // may not be durable: it raises nothing.
            st.class = st
                .markers
                .iter()
                .map(|&(_, c)| c)
                .max()
                .unwrap_or(class::EMPTY)
                .min(st.class);
        }
        self.torn.clear();
        if self.next_seq > first_seq {
            self.meta.discarded.push((first_seq, self.next_seq - 1));
            let zones = self.zones().to_vec();
            if let Err(e) = self.meta.store(&zones) {
                self.roll_back_waits(StoreError::from_write("metadata", &e));
            }
        }
        if let Err(e) = self.ensure_window() {
            self.roll_back_waits(e);
        }
        if !trouble.is_empty() {
            let why = trouble.join("; ");
            *crate::locks::lock(&self.shared.refusing) = Some(format!(
                "a failed batch could not be rolled back ({why}); restart the service"
            ));
            self.failed = Some(why);
        }
    }

    /// Marks the roll back unfinished because of `e`, for appends and
    /// `/health` to see.
    pub(super) fn roll_back_waits(&mut self, e: StoreError) {
        self.unfinished_roll_back = true;
        *crate::locks::lock(&self.shared.refusing) = Some(format!(
            "a failed batch's roll back is waiting to be finished: {e}"
        ));
    }

    /// Finishes a roll back that could not ([`Writer::unfinished_roll_back`]):
    /// the metadata with its discarded stripe numbers, then the windows.
    /// Until it succeeds no stripe is written, so a crash meanwhile finds
    /// the rolled-back numbers at the log's end, where they hide nothing.
    pub(super) fn finish_roll_back(&mut self) -> Result<(), StoreError> {
        let zones = self.zones().to_vec();
        let r = self
            .meta
            .store(&zones)
            .map_err(|e| StoreError::from_write("metadata", &e))
            .and_then(|()| self.ensure_window());
        match r {
            Ok(()) => {
                self.unfinished_roll_back = false;
                *crate::locks::lock(&self.shared.refusing) = None;
                Ok(())
            }
            Err(e) => {
                self.roll_back_waits(e.clone());
                Err(e)
            }
        }
    }
}
