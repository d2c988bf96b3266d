//! The sliding windows (§2.3) and segment classes: which segments take
//! what, the class markers that make a slide durable, and the creation
//! of new window segments (from spares, device slots or empty files).

use super::*;

impl Writer {
    pub(super) fn zones(&self) -> &[PathBuf] {
        &self.shared.config.zones
    }

    pub(super) fn width(&self) -> usize {
        self.shared.config.stripe_width()
    }

    /// The segments of a window.
    pub(super) fn window(&self, kind: Kind) -> Vec<u64> {
        self.window_at(kind, self.base).collect()
    }

    /// The segments of a window if the base were at `base`.
    pub(super) fn window_at(&self, kind: Kind, base: u64) -> std::ops::Range<u64> {
        let n = self.width() as u64;
        let ew = END_WRITE_COPIES as u64;
        let (start, len) = match kind {
            Kind::EndWrite => (base, ew),
            Kind::Ordered => (base + ew, n),
            _ => (base + ew + n, n),
        };
        start..start + len
    }

    /// The lowest base at which segment `seg` may hold class `class`
    /// (its target class there is at least that); classes rise as the
    /// base does.
    pub(super) fn lowest_base_for(&self, seg: u64, class: u8) -> u64 {
        // `seg` must lie below the end of the window of its class.
        let end = match class {
            class::EMPTY => return 0,
            class::UNORDERED => self.window_at(Kind::Unordered, 0).end,
            class::ORDERED => self.window_at(Kind::Ordered, 0).end,
            class::END_WRITE => self.window_at(Kind::EndWrite, 0).end,
            _ => 0,
        };
        (seg + 1).saturating_sub(end)
    }

    pub(super) fn target_class(&self, seg: u64) -> u8 {
        let n = self.width() as u64;
        let ew = END_WRITE_COPIES as u64;
        if seg < self.base {
            class::SEALED
        } else if seg < self.base + ew {
            class::END_WRITE
        } else if seg < self.base + ew + n {
            class::ORDERED
        } else if seg < self.base + ew + 2 * n {
            class::UNORDERED
        } else {
            class::EMPTY
        }
    }

    /// Appends a class marker to `seg`, not yet durable (see
    /// [`Writer::raise_classes`]); returns its offset.
    pub(super) fn append_marker(&mut self, seg: u64, to: u8) -> Result<u64, StoreError> {
        let bytes = page::class_marker(to);
        let s = self
            .segs
            .get_mut(&seg)
            .ok_or_else(|| vanished(&format!("segment {seg}")))?;
        let off = s.len;
        let pad = block_pad(s, bytes.len());
        if let Err(e) = self
            .shared
            .faults
            .write_padded_at(&s.file, &bytes, pad, off)
        {
            self.torn.insert(seg, off + bytes.len() as u64);
            return Err(StoreError::from_write(format!("segment {seg}"), &e));
        }
        s.len += bytes.len() as u64;
        s.zeroed = s.zeroed.max(s.len);
        Ok(off)
    }

    /// Raises each segment of `changes` to its class, all in one step:
    /// every marker is written (after the segment's held-back writes, so
    /// no marker ever follows bytes not yet written), then one round on
    /// the helpers makes them all durable, and only then does the writer
    /// count the new classes. A segment appears at most once, so it never
    /// holds two markers that one crash could keep out of order.
    ///
    /// One round instead of one fsync per marker: a window slide when the
    /// data segments fill moves the base once per data segment, four
    /// markers and a new segment each, and raised one by one with an
    /// fsync each those took about 1 ms per move, 7–8 ms in a row during
    /// which no append was acknowledged (measured at 150K appends/s).
    /// Their order among themselves does not matter to recovery: it takes
    /// the base as the lowest segment not sealed and moves it past any
    /// segment already above its class, so whichever subset of
    /// the markers a crash keeps, it slides to a base at or before the
    /// one written here, and nothing was written under the new base yet.
    pub(super) fn raise_classes(&mut self, changes: &[(u64, u8)]) -> Result<(), StoreError> {
        let marker_len = page::class_marker(0).len() as u64;
        for &(seg, to) in changes {
            self.settle(seg)?;
            // The marker of a raise that failed (its round, or a later
            // marker), with nothing written after it: synced again below,
            // not written again, so retries while a disk fails do not pile
            // markers up (a device slot has room for a few thousand past
            // its segment).
            let written = self.segs.get(&seg).is_some_and(|s| {
                s.markers
                    .last()
                    .is_some_and(|&(off, c)| c == to && off + marker_len == s.len)
            });
            if written {
                continue;
            }
            // A sealed segment keeps the zeros after its seal marker:
            // recovery reads nothing past a seal marker that ends the
            // data, and cutting them would make the seal a change of size
            // (the round's fdatasync journals it, about half a millisecond
            // of the slide, against a write-back) and free blocks, which
            // costs about 0.8 ms per MiB on a disk mounted with `discard`.
            let off = self.append_marker(seg, to)?;
            // Recorded at once, counted only once durable (below): if a
            // later marker or the round fails, this one is in the file all
            // the same, and a repair rebuilds the segment from this record.
            if let Some(s) = self.segs.get_mut(&seg) {
                s.markers.push((off, to));
            }
        }
        if !self.shared.config.fsync {
            // Nothing is made durable without fsync, markers no more than
            // pages: they are in the page cache, which a process crash
            // keeps. Syncing them anyway made every slide wait for the
            // write-back of every page written since the last one (seconds
            // at 150 MiB/s, when nothing else flushes them).
            self.set_classes(changes)?;
            return Ok(());
        }
        // Markers over a prepared prefix are only written back, with one
        // device flush per device after all of them (as a batch's pages).
        let files: Vec<RoundFile> = changes
            .iter()
            .map(|&(seg, _)| {
                let st = self
                    .segs
                    .get(&seg)
                    .ok_or_else(|| vanished(&format!("segment {seg}")))?;
                Ok(RoundFile::sync(st.file.clone(), self.how_durable(seg, st)))
            })
            .collect::<Result<_, StoreError>>()?;
        let round = self.syncer.start(files, Arc::new(|| {}));
        let (write_backs, flushes) = (round.write_backs(), round.flushes());
        let c = &self.shared.counters;
        c.fsyncs.fetch_add(
            changes.len() as u64 - write_backs + flushes,
            Ordering::Relaxed,
        );
        c.write_backs.fetch_add(write_backs, Ordering::Relaxed);
        c.flushes.fetch_add(flushes, Ordering::Relaxed);
        for (r, &(seg, _)) in round.wait().into_iter().zip(changes) {
            r.map_err(|e| StoreError::from_write(format!("segment {seg}"), &e))?;
        }
        self.set_classes(changes)
    }

    /// Records the classes of `changes` once their markers are as durable
    /// as the configuration makes anything.
    pub(super) fn set_classes(&mut self, changes: &[(u64, u8)]) -> Result<(), StoreError> {
        for &(seg, to) in changes {
            let s = self
                .segs
                .get_mut(&seg)
                .ok_or_else(|| vanished(&format!("segment {seg}")))?;
            s.class = to;
        }
        Ok(())
    }

    /// How a round makes `seg`'s new pages durable: pages written only
    /// over a prepared prefix (blocks allocated, written and committed)
    /// have no metadata to journal, so written back they are durable once
    /// their device's cache is flushed; any other needs an `fdatasync`.
    pub(super) fn how_durable(&self, seg: u64, st: &SegState) -> How {
        let dev = self
            .flush_devs
            .get(segment::zone(self.zones(), seg))
            .copied()
            .flatten();
        match dev {
            Some(dev) if st.len <= st.prepared => How::WriteBack(dev),
            _ => How::Sync,
        }
    }

    /// Finishes every write of `seg` not yet done: the round in flight's
    /// (waited for) and the held-back ones of the batch being written
    /// (done here, directly where they can be; for end-writes, every
    /// held-back page first). A failed write stays held back, so the round
    /// retries it, or fails the batch if it fails again.
    pub(super) fn settle(&mut self, seg: u64) -> Result<(), StoreError> {
        let late = self.late.contains(&seg);
        if let Some((segs, round)) = self.inflight.as_mut().and_then(|f| f.round.as_mut()) {
            if late || segs.contains(&seg) {
                round.wait_done();
            }
        }
        let mut order: Vec<u64> = Vec::new();
        if late {
            order.extend(self.deferred.keys().filter(|s| !self.late.contains(s)));
        }
        order.push(seg);
        for s in order {
            let Some(mut ws) = self.deferred.remove(&s) else {
                continue;
            };
            for i in 0..ws.len() {
                if let Err(e) = self.shared.faults.write_deferred(&ws[i]) {
                    // The failed write and those behind it stay held back.
                    ws.drain(..i);
                    self.deferred.insert(s, ws);
                    return Err(StoreError::from_write(format!("segment {s}"), &e));
                }
            }
        }
        self.late.remove(&seg);
        Ok(())
    }

    /// Creates segment `seg`'s file, from a spare when one is ready. Its
    /// name is not durable yet: the caller syncs its directory before any
    /// page of it is written ([`Writer::ensure_window`]).
    pub(super) fn create_segment(&mut self, seg: u64) -> Result<(), StoreError> {
        if self.segs.len() as u64 >= self.shared.config.max_segments {
            return Err(StoreError::Full(self.segs.len() as u64));
        }
        let zone = segment::zone(self.zones(), seg);
        if self.shared.device(zone).is_some() {
            return self.create_slot_segment(seg, zone);
        }
        let path = segment::path(self.zones(), seg);
        // Every new segment is made from a spare when one is ready,
        // end-write segments too: an end-write segment that starts as an
        // empty file grows with every round, so each round must fdatasync
        // it (the file system journals the new size) instead of writing it
        // back and flushing the device once, about a third more latency at
        // 150K appends/s. (A new store's open writes its first windows'
        // spares before they are made, see `spares`.)
        // The price: an open reads an open end-write segment's whole zero
        // tail (see `recovery::scan`), as for later end-write segments,
        // which are former data segments.
        let spare = self
            .spares
            .as_ref()
            .is_some_and(|s| s.take_into(zone, &path));
        let file = segment::open(&path, true)
            .map_err(|e| StoreError::from_write(format!("create {}", path.display()), &e))?;
        // A spare's pages are written in place over its zeros (spares are
        // exactly `segment_bytes` long: the pool keeps no other size).
        let zeroed = if spare {
            self.shared.config.segment_bytes
        } else {
            0
        };
        self.add_new_segment(seg, file, zeroed);
        Ok(())
    }

    /// Records new, empty segment `seg` whose first `zeroed` bytes are
    /// zeros already written and committed.
    pub(super) fn add_new_segment(&mut self, seg: u64, file: SegFile, zeroed: u64) {
        let file = Arc::new(file);
        self.shared.files_mut().insert(seg, file.clone());
        self.segs.insert(
            seg,
            SegState {
                file,
                len: 0,
                zeroed,
                prepared: zeroed,
                class: class::EMPTY,
                markers: Vec::new(),
                ew_pages: Vec::new(),
                max_seq: 0,
                damaged_at: None,
                pending_cut: None,
                direct: DirectFd::Unopened,
            },
        );
    }

    /// Creates segment `seg` in a zeroed slot of zone `zone`'s device (a
    /// spare, or a free slot zeroed now), its header written but not
    /// durable yet: the caller syncs the device before any page of it is
    /// written ([`Writer::ensure_window`]).
    pub(super) fn create_slot_segment(&mut self, seg: u64, zone: usize) -> Result<(), StoreError> {
        let dev = self
            .shared
            .device(zone)
            .ok_or_else(|| StoreError::WriteFailed(format!("zone {zone} has no device")))?;
        let failed = |e: io::Error| {
            StoreError::from_write(format!("segment {seg} on {}", dev.path().display()), &e)
        };
        let Some((slot, written)) = dev.zeroed_slot().map_err(failed)? else {
            tracing::warn!(device = %dev.path().display(), slots = dev.slots(), "every slot of the device holds a segment; trim the log");
            return Err(StoreError::Full(self.segs.len() as u64));
        };
        let file = match dev.assign(slot, seg) {
            Ok(f) => f,
            Err(e) => {
                dev.give_back(slot, crate::device::Held::Free);
                return Err(failed(e));
            }
        };
        if let Some(s) = &self.spares {
            s.wake();
        }
        let size = file.size().map_err(failed)?;
        self.add_new_segment(seg, file, size);
        if !written {
            // Zeros as unwritten extents of a file standing in for a
            // device: not prepared (see `Device::zeroed_slot`).
            if let Some(st) = self.segs.get_mut(&seg) {
                st.prepared = 0;
            }
        }
        Ok(())
    }

    /// Segments in the three windows together.
    pub(super) fn span(&self) -> u64 {
        self.shared.config.window_segments()
    }

    /// Makes the segments' classes match the windows: moves the base past
    /// any segment already above its target class, creates the
    /// window segments missing (their directories synced before any page
    /// of them is written: a spare that came back under its old name
    /// after a crash would hide the pages), then seals what is below the
    /// base and raises the window segments, all in one durable step
    /// ([`Writer::raise_classes`]).
    pub fn ensure_window(&mut self) -> Result<(), StoreError> {
        // Past the windows too: a crash during a slide can keep the
        // marker of a segment the slide brought into the windows and lose
        // those of the segments before it. Computed, not stepped: a stray
        // classed file far past the windows must not make an open count
        // up to it.
        let floor = self
            .segs
            .range(self.base..)
            .map(|(&s, st)| self.lowest_base_for(s, st.class))
            .max()
            .unwrap_or(0);
        self.base = self.base.max(floor);
        let span = self.span();
        let new: Vec<u64> = (self.base..self.base + span)
            .filter(|s| !self.segs.contains_key(s))
            .collect();
        self.check_capacity(&new)?;
        let mut zones: BTreeSet<usize> = BTreeSet::new();
        for seg in self.base..self.base + span {
            if !self.segs.contains_key(&seg) {
                self.create_segment(seg)?;
                zones.insert(segment::zone(self.zones(), seg));
            }
        }
        for zone in zones {
            match self.shared.device(zone) {
                // The new slots' headers (the device's counterpart of the
                // directory entries).
                Some(dev) => dev.sync().map_err(|e| {
                    StoreError::from_write(format!("sync device {}", dev.path().display()), &e)
                })?,
                None => {
                    let dir = &self.zones()[zone];
                    segment::sync_dir(dir).map_err(|e| {
                        StoreError::from_write(format!("sync directory {}", dir.display()), &e)
                    })?
                }
            }
        }
        let mut changes: Vec<(u64, u8)> = self
            .segs
            .range(..self.base)
            .filter(|(_, s)| s.class < class::SEALED)
            .map(|(&id, _)| (id, class::SEALED))
            .collect();
        for seg in self.base..self.base + span {
            let target = self.target_class(seg);
            if self.segs.get(&seg).is_some_and(|st| st.class < target) {
                changes.push((seg, target));
            }
        }
        if changes.is_empty() {
            return Ok(());
        }
        self.raise_classes(&changes)
    }

    /// Refuses, before anything changes, a slide that needs segments
    /// `new` when `max_segments` or a zone's device has no room for them,
    /// so a full log answers appends with [`StoreError::Full`] and takes
    /// them again once a trim frees segments (rather than failing the
    /// store half-way through a slide).
    pub(super) fn check_capacity(&self, new: &[u64]) -> Result<(), StoreError> {
        let in_use = self.segs.len() as u64;
        if in_use + new.len() as u64 > self.shared.config.max_segments {
            return Err(StoreError::Full(in_use));
        }
        for (zone, dev) in self.shared.devices.iter().enumerate() {
            let need = new
                .iter()
                .filter(|&&s| segment::zone(self.zones(), s) == zone)
                .count();
            if need > dev.available() {
                tracing::warn!(device = %dev.path().display(), slots = dev.slots(), need, "every slot of the device holds a segment; trim the log");
                return Err(StoreError::Full(in_use));
            }
        }
        Ok(())
    }

    /// Whether every segment of `kind`'s window would have `bytes` of room
    /// with the base at `base`: a segment not made yet will be empty, and
    /// one still to be raised to the window's class will hold a marker
    /// more.
    pub(super) fn would_have_room(&self, kind: Kind, bytes: u64, base: u64) -> bool {
        let limit = self.shared.config.segment_bytes;
        let marker = page::class_marker(class::SEALED).len() as u64;
        // A data kind's number is its window's class (`page::Kind`).
        let target = kind as u8;
        self.window_at(kind, base).all(|s| {
            let (len, class) = self
                .segs
                .get(&s)
                .map_or((0, class::EMPTY), |st| (st.len, st.class));
            let len = if class < target { len + marker } else { len };
            len + bytes <= limit
        })
    }

    /// Whether every segment of `kind`'s window exists and has `bytes` of
    /// room.
    pub(super) fn has_room(&self, kind: Kind, bytes: u64) -> bool {
        let limit = self.shared.config.segment_bytes;
        self.window_at(kind, self.base)
            .all(|s| self.segs.get(&s).is_some_and(|st| st.len + bytes <= limit))
    }

    /// Slides the windows until every segment of `kind`'s window has
    /// `bytes` of room. The data segments fill in step, so a slide usually
    /// moves the base once per segment of the window: the new base is
    /// found first and reached in one [`Writer::ensure_window`], so all
    /// the markers of the slide become durable together.
    pub(super) fn make_room(&mut self, kind: Kind, bytes: u64) -> Result<(), StoreError> {
        if self.has_room(kind, bytes) {
            return Ok(());
        }
        let t = Instant::now();
        // A base a whole span on puts every window past the segments the
        // windows hold now: new and empty (the search never goes further).
        let last = self.base + self.span();
        // A data window that fills moves its full segments into the
        // end-write window, which then has to slide on too: the base found
        // makes room there as well, as much as the data needs, so one step
        // usually does both. (A group whose end-writes take more, such as
        // many tiny records, slides the end-write window once more.)
        let fits = |base| {
            self.would_have_room(kind, bytes, base)
                && (kind == Kind::EndWrite || self.would_have_room(Kind::EndWrite, bytes, base))
        };
        let mut base = self.base + 1;
        while base < last && !fits(base) {
            base += 1;
        }
        let mut r = self.slide_to(base);
        self.shared.stages.slide.record(t.elapsed());
        // The estimate is a shortcut, not a promise: should the window
        // still lack room, slide on one segment at a time (each step is
        // counted as a slide of its own).
        while r.is_ok() && !self.has_room(kind, bytes) {
            let t = Instant::now();
            r = self.slide_to(self.base + 1);
            self.shared.stages.slide.record(t.elapsed());
        }
        r
    }

    /// Moves the base to `base` and makes the windows match; a slide the
    /// segments have no room for ([`Writer::check_capacity`]) changes
    /// nothing, and the base stays.
    pub(super) fn slide_to(&mut self, base: u64) -> Result<(), StoreError> {
        let before = self.base;
        self.base = base;
        let r = self.ensure_window();
        if matches!(r, Err(StoreError::Full(_))) {
            self.base = before;
        }
        r
    }
}
