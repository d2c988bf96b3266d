//! Trim: positions below a log's new start forgotten, and sealed segments
//! nothing live refers to deleted.

use super::*;

impl Writer {
    pub(super) fn trim(&mut self, log: &str, pos: u64) -> Result<(), StoreError> {
        let (first, tail) = {
            let idx = self.shared.index();
            idx.logs
                .get(log)
                .map(|l| (l.first, l.tail()))
                .unwrap_or((0, 0))
        };
        if pos > tail {
            return Err(StoreError::TrimBeyondTail {
                log: log.into(),
                pos,
                tail,
            });
        }
        if pos <= first {
            return Ok(());
        }
        self.meta.logs.insert(
            log.to_string(),
            LogMeta {
                first: pos,
                tail_floor: tail,
            },
        );
        self.meta.stable_seq = self.next_seq.saturating_sub(1);
        let zones = self.zones().to_vec();
        self.meta
            .store(&zones)
            .map_err(|e| StoreError::from_write("metadata", &e))?;
        {
            let mut idx = self.shared.index_mut();
            // The log exists: pos > first >= 0 and pos <= tail were checked.
            if let Some(l) = idx.logs.get_mut(log) {
                let drop = (pos - l.first) as usize;
                l.locs.drop_front(drop);
                l.first = pos;
            }
        }
        self.free_segments();
        // The reserve went into the metadata write if the disk was full;
        // the segments just deleted may have made room for it again.
        self.meta.keep_reserve(&zones);
        Ok(())
    }

    /// The lowest stripe anything live may need.
    pub fn live_floor(&self) -> u64 {
        let idx = self.shared.index();
        idx.logs
            .values()
            .filter_map(|l| l.locs.front().map(|loc| loc.batch_seq))
            .min()
            .unwrap_or(self.next_seq)
    }

    /// Deletes sealed segments whose every page and end-write is below the
    /// live floor, and forgets those stripes.
    pub fn free_segments(&mut self) {
        let floor = self.live_floor();
        let victims: Vec<u64> = self
            .segs
            .range(..self.base)
            .filter(|(_, s)| s.max_seq < floor)
            .map(|(&id, _)| id)
            .collect();
        for seg in victims {
            if let Err(e) = self.remove_segment(seg) {
                tracing::warn!(segment = seg, error = %e, "could not free segment");
                continue;
            }
            self.segs.remove(&seg);
            self.shared.files_mut().remove(&seg);
            self.shared
                .counters
                .segments_freed
                .fetch_add(1, Ordering::Relaxed);
        }
        self.ews = self.ews.split_off(&floor);
        let mut idx = self.shared.index_mut();
        idx.stripes = idx.stripes.split_off(&floor);
    }

    /// Deletes segment `seg`'s file, or frees its device slot (then the
    /// spare refill zeroes it for reuse).
    pub(super) fn remove_segment(&self, seg: u64) -> io::Result<()> {
        let zone = segment::zone(self.zones(), seg);
        if let Some(dev) = self.shared.device(zone) {
            if let Some(slot) = dev.slot_of(seg) {
                dev.free(slot)?;
                dev.sync()?;
            }
            if let Some(s) = &self.spares {
                s.wake();
            }
            return Ok(());
        }
        let path = segment::path(self.zones(), seg);
        std::fs::remove_file(&path)?;
        if let Some(dir) = path.parent() {
            let _ = segment::sync_dir(dir);
        }
        Ok(())
    }
}
