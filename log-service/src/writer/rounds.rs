//! Writing a batch and its fsync round: stripes encoded into pages,
//! pages and end-writes written (buffered, or held back for the round and
//! written directly), the round handed to the fsync helpers or run on the
//! writer, and the batch published and answered once it is durable.

use super::*;

impl Writer {
    /// Answers every written batch: waits for the round in flight, then
    /// syncs and answers the batch written meanwhile.
    pub(super) fn finish_all(&mut self) {
        while self.inflight.is_some() || self.next.is_some() {
            // A round promote ran here is answered on the next turn.
            if self.inflight.is_none() {
                let _ = self.promote();
            } else {
                self.finish_inflight();
            }
        }
    }

    /// Waits for the in-flight batch's fsync round, then answers its
    /// appends and starts the round of the batch written meanwhile; or, if
    /// the round failed, rolls back that batch and everything written after
    /// it and fails them all.
    pub(super) fn finish_inflight(&mut self) {
        let Some(f) = self.inflight.take() else {
            return;
        };
        let t = Instant::now();
        let had_round = f.round.is_some();
        let synced = f.round.map_or(Ok(()), wait_round);
        self.round_held.clear();
        if had_round {
            self.shared.stages.round_wait.record(t.elapsed());
        }
        match synced {
            Ok(()) => {
                let answered = self.publish(f.pending, f.ews, f.first_seq);
                let ran_here = self.promote();
                // In answer order, so the table's window holds the latest.
                self.remember_ids(&answered);
                if ran_here {
                    self.finish_inflight();
                }
            }
            Err(e) => {
                self.roll_back(&f.lens_before, f.first_seq);
                // The batch behind it shares its fate and, on a full disk,
                // its remedy.
                let why = "the batch before this one failed to reach the disk; this one was rolled back with it".to_string();
                let behind = if matches!(e, StoreError::NoSpace(_)) {
                    StoreError::NoSpace(why)
                } else {
                    StoreError::WriteFailed(why)
                };
                self.fail(f.pending, e);
                if let Some(n) = self.next.take() {
                    self.fail(n.pending, behind);
                }
            }
        }
    }

    /// Writes the batch: fragment stripes and their end-writes first, then
    /// root stripes and theirs (a root never points at an incomplete
    /// stripe). Returns every end-write, fragments first.
    pub(super) fn write_batch(
        &mut self,
        pending: &[Pending],
        first_seq: u64,
    ) -> Result<Vec<Written>, StoreError> {
        let cap =
            self.shared.config.data_shards * (self.shared.config.page_bytes as usize - HEADER);
        let mut fragments: Vec<(u64, &[u8])> = Vec::new();
        let mut roots: Vec<(u64, Vec<RootRef<'_>>)> = Vec::new();
        let mut cur: Vec<RootRef<'_>> = Vec::new();
        let mut cur_size = stripe::ROOT_COUNT_BYTES;
        for p in pending {
            let len = p.bytes.len();
            // Whole in a root stripe of its own, count included; one
            // byte more and its head goes to a fragment stripe (a record
            // that fit without the count was refused as too large).
            let small =
                stripe::ROOT_COUNT_BYTES + stripe::root_entry_overhead(&p.meta.log, 0) + len <= cap;
            let tail_len = if small { len } else { len.min(cap / 4) };
            let mut frag_ids = Vec::new();
            for chunk in p.bytes[..len - tail_len].chunks(cap) {
                let seq = self.alloc_seq();
                fragments.push((seq, chunk));
                frag_ids.push(seq);
            }
            let size = stripe::root_entry_overhead(&p.meta.log, frag_ids.len()) + tail_len;
            if size + stripe::ROOT_COUNT_BYTES > cap {
                return Err(StoreError::TooLarge {
                    len,
                    limit: self.shared.config.max_record_bytes as usize,
                });
            }
            if cur_size + size > cap && !cur.is_empty() {
                let seq = self.alloc_seq();
                roots.push((seq, std::mem::take(&mut cur)));
                cur_size = stripe::ROOT_COUNT_BYTES;
            }
            cur_size += size;
            cur.push(RootRef {
                meta: &p.meta,
                fragments: frag_ids,
                tail: &p.bytes[len - tail_len..],
            });
        }
        if !cur.is_empty() {
            let seq = self.alloc_seq();
            roots.push((seq, cur));
        }
        let mut all = Vec::new();
        if !fragments.is_empty() {
            let bodies = fragments
                .into_iter()
                .map(|(seq, b)| (seq, Body::Fragment(b)))
                .collect();
            all = self.write_stripes(Kind::Unordered, bodies, first_seq)?;
        }
        let bodies = roots
            .into_iter()
            .map(|(seq, entries)| (seq, Body::Root(entries)))
            .collect();
        all.extend(self.write_stripes(Kind::Ordered, bodies, first_seq)?);
        Ok(all)
    }

    /// Writes stripes in groups that fit a segment, each group: pages,
    /// fsync, end-writes, fsync.
    pub(super) fn write_stripes(
        &mut self,
        kind: Kind,
        stripes: Vec<(u64, Body<'_>)>,
        batch_seq: u64,
    ) -> Result<Vec<Written>, StoreError> {
        let k = self.shared.config.data_shards;
        let half = self.shared.config.segment_bytes / 2;
        let mut out = Vec::new();
        let mut group = Vec::new();
        let mut group_bytes = 0u64;
        for (seq, body) in stripes {
            let page_len = (HEADER + body.len().div_ceil(k).max(1)) as u64;
            if group_bytes + page_len > half && !group.is_empty() {
                out.extend(self.write_group(kind, std::mem::take(&mut group), batch_seq)?);
                group_bytes = 0;
            }
            group_bytes += page_len;
            group.push((seq, body));
        }
        if !group.is_empty() {
            out.extend(self.write_group(kind, group, batch_seq)?);
        }
        Ok(out)
    }

    pub(super) fn write_group(
        &mut self,
        kind: Kind,
        group: Vec<(u64, Body<'_>)>,
        batch_seq: u64,
    ) -> Result<Vec<Written>, StoreError> {
        let (k, m) = (
            self.shared.config.data_shards,
            self.shared.config.parity_shards,
        );
        let per_seg: u64 = group
            .iter()
            .map(|(_, b)| (HEADER + b.len().div_ceil(k).max(1)) as u64)
            .sum();
        self.make_room(kind, per_seg)?;
        let window = self.window(kind);
        // The page and payload buffers are the writer's, reused from group
        // to group: fresh multi-MiB buffers cost a page fault and a zeroed
        // page per 4 KiB, which was a fifth of the writer's time.
        let mut bufs = std::mem::take(&mut self.page_bufs);
        bufs.resize_with(window.len(), Vec::new);
        for b in &mut bufs {
            b.clear();
            b.reserve(per_seg as usize);
        }
        let mut payload = std::mem::take(&mut self.payload_buf);
        let mut refs = Vec::with_capacity(group.len());
        for (seq, body) in group {
            let pages: Vec<(u64, u64)> = window
                .iter()
                .zip(&bufs)
                .map(|(&seg, b)| (seg, self.segs[&seg].len + b.len() as u64))
                .collect();
            let (bytes, metas): (&[u8], Vec<EntryMeta>) = match &body {
                Body::Fragment(b) => (b, Vec::new()),
                Body::Root(entries) => {
                    let offsets = stripe::encode_root_refs_into(&mut payload, entries);
                    let metas = entries
                        .iter()
                        .zip(offsets)
                        .map(|(e, off)| EntryMeta {
                            offset: if e.fragments.is_empty() {
                                off
                            } else {
                                stripe::FRAGMENTED
                            },
                            ..(*e.meta).clone()
                        })
                        .collect();
                    (&payload, metas)
                }
            };
            let shard_len = stripe::encode_pages_into(&mut bufs, &self.rs, kind, seq, bytes)
                .map_err(StoreError::WriteFailed)?;
            refs.push((
                StripeRef {
                    seq,
                    kind,
                    k: k as u8,
                    m: m as u8,
                    shard_len,
                    payload_len: bytes.len() as u32,
                    pages,
                },
                metas,
            ));
        }
        let written: Vec<(u64, &[u8])> = window
            .iter()
            .copied()
            .zip(bufs.iter().map(|b| &b[..]))
            .collect();
        let result = self.write_and_sync(&written, true);
        drop(written);
        self.keep_buffers(bufs, payload);
        result?;
        let max_seq = refs.iter().map(|(r, _)| r.seq).max().unwrap_or(0);
        for &s in &window {
            let st = self
                .segs
                .get_mut(&s)
                .ok_or_else(|| vanished("window segment"))?;
            st.max_seq = st.max_seq.max(max_seq);
        }
        // End-writes: one page per stripe, the same bytes on three segments.
        let mut ew_total = 0u64;
        let mut ews = Vec::with_capacity(refs.len());
        let mut bodies = Vec::with_capacity(refs.len());
        // Room first: sliding changes the base recorded in the end-write.
        let approx: u64 = refs
            .iter()
            .map(|(r, metas)| {
                (HEADER
                    + 64
                    + 16 * r.pages.len()
                    + metas.iter().map(|m| 37 + m.log.len()).sum::<usize>()) as u64
            })
            .sum();
        self.make_room(Kind::EndWrite, approx)?;
        for (r, metas) in refs {
            let ew = EndWrite {
                ew_base: self.base,
                batch_seq,
                stripe: r,
                entries: metas,
            };
            let p = ew_page(&ew);
            ew_total += p.len() as u64;
            let page_crc = page::stored_crc(&p);
            bodies.push(p);
            ews.push(Written { ew, page_crc });
        }
        debug_assert!(ew_total <= approx);
        let ew_window = self.window(Kind::EndWrite);
        let mut written = Vec::with_capacity(ew_window.len());
        for &seg in &ew_window {
            let st = self
                .segs
                .get_mut(&seg)
                .ok_or_else(|| vanished("end-write segment"))?;
            let mut off = st.len;
            let mut buf = Vec::with_capacity(ew_total as usize);
            for (p, w) in bodies.iter().zip(&ews) {
                st.ew_pages.push((off, w.ew.stripe.seq));
                off += p.len() as u64;
                buf.extend_from_slice(p);
            }
            st.max_seq = st.max_seq.max(max_seq);
            written.push((seg, buf));
        }
        let written: Vec<(u64, &[u8])> = written.iter().map(|(s, b)| (*s, &b[..])).collect();
        self.write_and_sync(&written, false)?;
        self.shared
            .counters
            .stripes
            .fetch_add(ews.len() as u64, Ordering::Relaxed);
        Ok(ews)
    }

    /// Puts the group buffers back for the next group, dropping any that
    /// one huge group grew past [`KEEP_BUFFER_BYTES`].
    pub(super) fn keep_buffers(&mut self, mut bufs: Vec<Vec<u8>>, mut payload: Vec<u8>) {
        for b in &mut bufs {
            if b.capacity() > KEEP_BUFFER_BYTES {
                *b = Vec::new();
            }
        }
        if payload.capacity() > KEEP_BUFFER_BYTES {
            payload = Vec::new();
        }
        self.page_bufs = bufs;
        self.payload_buf = payload;
    }

    /// Appends each buffer to its segment; in strict end-write order the
    /// segments are fsynced at once, otherwise they join the batch's single
    /// fsync round. `data`: the buffers are data pages, which may be
    /// written directly ([`crate::direct`]); end-writes never are.
    pub(super) fn write_and_sync(
        &mut self,
        bufs: &[(u64, &[u8])],
        data: bool,
    ) -> Result<(), StoreError> {
        // End-writes wait behind the batch's held-back pages.
        let pages_held = !data && self.deferred.keys().any(|s| !self.late.contains(s));
        for (seg, buf) in bufs {
            let st = self.segs.get_mut(seg).ok_or_else(|| vanished("segment"))?;
            let fsync = self.shared.config.fsync;
            // A large write of data pages is held back for the round and
            // its whole blocks written directly; so is any write behind a
            // held-back one, to keep the segment's writes in order.
            let direct = if fsync
                && data
                && self.shared.config.tuning.direct_writes
                && buf.len() >= self.shared.config.tuning.direct_write_min_bytes as usize
                && direct::middle(st.len, buf.len()).is_some()
            {
                direct_fd(*seg, st)
            } else {
                None
            };
            let held =
                pages_held || self.deferred.contains_key(seg) || self.round_held.contains(seg);
            let now = direct.is_none() && !held;
            if !now {
                let w = DeferredWrite::new(st.file.clone(), direct, st.len, buf, &self.direct_bufs);
                self.shared
                    .counters
                    .direct_write_bytes
                    .fetch_add(w.middle().len() as u64, Ordering::Relaxed);
                self.deferred.entry(*seg).or_default().push(w);
                if !data {
                    self.late.insert(*seg);
                }
            } else if let Err(e) =
                self.shared
                    .faults
                    .write_padded_at(&st.file, buf, block_pad(st, buf.len()), st.len)
            {
                // Part of it may be there: the roll back cuts it off.
                self.torn.insert(*seg, st.len + buf.len() as u64);
                return Err(StoreError::from_write(format!("segment {seg}"), &e));
            }
            if now && fsync && buf.len() <= EARLY_WRITE_BACK_MAX {
                // Its I/O overlaps the round in flight (see the function).
                st.file.start_write_back(st.len, buf.len() as u64);
            }
            st.len += buf.len() as u64;
            st.zeroed = st.zeroed.max(st.len);
            self.shared
                .counters
                .bytes_written
                .fetch_add(buf.len() as u64, Ordering::Relaxed);
            self.dirty.insert(*seg);
        }
        if self.shared.config.tuning.strict_end_writes {
            self.sync_dirty()?;
        }
        Ok(())
    }

    /// fsyncs every segment written since the last round, in parallel
    /// (they are independent devices in a real deployment).
    pub(super) fn sync_dirty(&mut self) -> Result<(), StoreError> {
        let r = self.start_sync(None, false).map_or(Ok(()), wait_round);
        self.round_held.clear();
        r
    }

    /// Starts the fsync round of every segment written since the last one,
    /// on the helpers; `None` when there is nothing to sync (or fsync is
    /// off). With `wake`, the round's end is sent to the writer's own queue
    /// as `Cmd::Synced(wake)`, so an idle writer answers the batch at once.
    /// With `small` the writer runs the round itself if every file of it
    /// is only written back, with no writes held back for it, and it is
    /// over when this returns ([`Round::ran_here`]; no wake-up needed).
    /// An fsync of its own per file (a device flush each, and perhaps a
    /// journal commit) is left to the helpers, which overlap them, and so
    /// are held-back device writes (`direct_writes`), which the helpers
    /// issue in parallel.
    pub(super) fn start_sync(
        &mut self,
        wake: Option<u64>,
        small: bool,
    ) -> Option<(Vec<u64>, Round)> {
        let dirty = std::mem::take(&mut self.dirty);
        if !self.shared.config.fsync || dirty.is_empty() {
            return None;
        }
        let (segs, files): (Vec<u64>, Vec<(Arc<SegFile>, How)>) = dirty
            .iter()
            .filter_map(|&s| {
                let st = self.segs.get(&s)?;
                Some((s, (st.file.clone(), self.how_durable(s, st))))
            })
            .unzip();
        let here = small
            && files
                .iter()
                .all(|(_, how)| matches!(how, How::WriteBack(_)))
            && segs.iter().all(|s| !self.deferred.contains_key(s));
        let started = Instant::now();
        let shared = self.shared.clone();
        let tx = wake.filter(|_| !here).map(|seq| (seq, self.wake.clone()));
        let on_done: OnDone = Arc::new(move || {
            shared.stages.round.record(started.elapsed());
            // Full means commands are queued: handling any of them
            // finishes the round, so the wake-up is not needed.
            if let Some((seq, tx)) = &tx {
                if let Some(tx) = tx.upgrade() {
                    let _ = tx.try_send(Cmd::Synced(*seq));
                }
            }
        });
        let n = files.len() as u64;
        let files: Vec<RoundFile> = segs
            .iter()
            .zip(files)
            .map(|(s, (file, how))| RoundFile {
                writes: self.deferred.remove(s).unwrap_or_default(),
                late: self.late.contains(s),
                ..RoundFile::sync(file, how)
            })
            .collect();
        self.round_held = segs
            .iter()
            .zip(&files)
            .filter(|(_, f)| !f.writes.is_empty())
            .map(|(&s, _)| s)
            .collect();
        // Writes of segments that are gone (none expected) are dropped.
        self.deferred.clear();
        self.late.clear();
        let round = if here {
            self.shared
                .counters
                .rounds_on_writer
                .fetch_add(1, Ordering::Relaxed);
            self.syncer.run_here(files, on_done)
        } else {
            self.syncer.start(files, on_done)
        };
        let (write_backs, flushes) = (round.write_backs(), round.flushes());
        let c = &self.shared.counters;
        c.fsyncs
            .fetch_add(n - write_backs + flushes, Ordering::Relaxed);
        c.write_backs.fetch_add(write_backs, Ordering::Relaxed);
        c.flushes.fetch_add(flushes, Ordering::Relaxed);
        Some((segs, round))
    }

    /// The batch is durable: index it, answer, and push it to
    /// subscribers. Returns its appends, whose request ids the caller
    /// records ([`Writer::remember_ids`]) once the next round is started.
    #[must_use = "the answered appends' request ids must be remembered"]
    pub(super) fn publish(
        &mut self,
        mut pending: Vec<Pending>,
        ews: Vec<Written>,
        batch_seq: u64,
    ) -> Vec<Pending> {
        let started = Instant::now();
        {
            let mut idx = self.shared.index_mut();
            for Written { ew, .. } in &ews {
                for (i, e) in ew.entries.iter().enumerate() {
                    let l = idx
                        .logs
                        .entry(e.log.clone())
                        .or_insert_with(|| LogIndex::starting_at(e.pos));
                    debug_assert_eq!(l.tail(), e.pos);
                    l.locs.push_back(Loc {
                        stripe: ew.stripe.seq,
                        idx: i as u32,
                        len: e.len,
                        batch_seq,
                        offset: e.offset,
                        crc: e.crc,
                    });
                }
                idx.stripes.insert(ew.stripe.seq, ew.stripe.clone());
            }
        }
        for w in ews {
            let live = LiveEndWrite {
                base: w.ew.ew_base,
                page_crc: w.page_crc,
            };
            self.ews.insert(w.ew.stripe.seq, live);
        }
        let c = &self.shared.counters;
        c.batches.fetch_add(1, Ordering::Relaxed);
        let subs = self.shared.subs().clone();
        let acked = Instant::now();
        // Counted before any answer goes out, so whoever gets one sees
        // its append in the figures.
        self.shared.stages.acked.record_runs(
            pending
                .iter()
                .map(|p| acked.saturating_duration_since(p.at)),
        );
        c.appends.fetch_add(pending.len() as u64, Ordering::Relaxed);
        c.append_bytes.fetch_add(
            pending.iter().map(|p| p.bytes.len() as u64).sum(),
            Ordering::Relaxed,
        );
        for p in &mut pending {
            for r in p.replies.drain(..) {
                let _ = r.send(Ok(p.meta.pos));
            }
            if let Some(tx) = subs.get(&p.meta.log) {
                if tx.receiver_count() > 0 {
                    let e: Entry = Arc::from(&p.bytes[..]);
                    let _ = tx.send((p.meta.pos, e));
                }
            }
        }
        self.shared.stages.answer.record(started.elapsed());
        pending
    }

    /// Records the request ids of answered appends, so that a retry gets
    /// the same position. Called after the answers went out and the next
    /// round started. The table is large (a million ids by default) and
    /// its inserts and removals miss the cache: done before the answers,
    /// they would hold the last answer of a round until tens of
    /// microseconds after the round's end at the median, and over a
    /// hundred at the p99, which the client's p99 shows. A
    /// retry reaches this thread only after this returns, so it finds its id
    /// either way.
    pub(super) fn remember_ids(&mut self, answered: &[Pending]) {
        for p in answered {
            if p.meta.client != 0 {
                self.request_ids
                    .remember((p.meta.client, p.meta.request), p.meta.pos);
            }
        }
    }
}
