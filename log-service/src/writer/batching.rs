//! Taking appends off the queue and into batches: the writer's loop,
//! request-id deduplication, per-log positions and the batch being
//! written while the round before it syncs.

use super::*;

impl Writer {
    pub fn run(mut self) {
        let mut queue: VecDeque<Cmd> = VecDeque::new();
        loop {
            let cmd = match queue.pop_front() {
                Some(c) => c,
                // While a batch syncs, the next command is either appends
                // (written at once, next to the round) or the round's end.
                None => match self.rx.blocking_recv() {
                    Some(c) => c,
                    None => {
                        self.finish_all();
                        return;
                    }
                },
            };
            if !matches!(cmd, Cmd::Append(_) | Cmd::AppendMany(_) | Cmd::Synced(_)) {
                // Everything but an append sees every written batch done:
                // trim records the stable point, repair rewrites segments,
                // a barrier promises that earlier appends are answered.
                self.finish_all();
            }
            match cmd {
                Cmd::Append(a) => self.gather_and_append(vec![a], &mut queue),
                Cmd::AppendMany(v) => self.gather_and_append(v, &mut queue),
                Cmd::Trim { log, pos, reply } => {
                    let _ = reply.send(self.trim(&log, pos));
                }
                Cmd::Repair { seg, liars } => {
                    if let Err(e) = self.repair(seg, &liars) {
                        tracing::error!(segment = seg, error = %e, "segment repair failed");
                    }
                }
                Cmd::RepairNow { seg, liars, reply } => {
                    let _ = reply.send(self.repair(seg, &liars));
                }
                Cmd::Barrier(reply) => {
                    let _ = reply.send(());
                }
                Cmd::Segments(reply) => {
                    let nz = self.zones().len() as u64;
                    let _ = reply.send(
                        self.segs
                            .iter()
                            .map(|(&id, s)| SegmentInfo {
                                id,
                                zone: id % nz,
                                class: s.class,
                                len: s.len,
                            })
                            .collect(),
                    );
                }
                Cmd::EndWriteCopies(reply) => {
                    let _ = reply.send(self.end_write_copies());
                }
                Cmd::Markers(reply) => {
                    let _ = reply.send(
                        self.segs
                            .iter()
                            .filter(|(_, st)| !st.markers.is_empty())
                            .map(|(&seg, st)| (seg, st.file.clone(), st.markers.clone()))
                            .collect(),
                    );
                }
                Cmd::Synced(seq) => {
                    if self.inflight.as_ref().is_some_and(|f| f.first_seq == seq) {
                        self.finish_inflight();
                    }
                }
                Cmd::Shutdown => {}
            }
            // A round that ended while the writer was busy (its wake-up is
            // dropped when the queue is full, or taken while gathering a
            // batch) is answered here, and so is the next if it has ended
            // too.
            while self.inflight.as_mut().is_some_and(|f| f.round_done()) {
                self.finish_inflight();
            }
            if self.shared.stopping.load(Ordering::SeqCst) && queue.is_empty() {
                // Finish what is queued, then stop.
                while let Ok(c) = self.rx.try_recv() {
                    queue.push_back(c);
                }
                if queue.is_empty() {
                    self.finish_all();
                    return;
                }
            }
        }
    }

    /// Takes every append already queued (up to the batch limits; an
    /// `AppendMany` is never split) and writes them as one batch. Other
    /// commands met on the way wait in `queue`, in order.
    pub(super) fn gather_and_append(&mut self, first: Vec<AppendReq>, queue: &mut VecDeque<Cmd>) {
        let mut batch = first;
        let mut bytes: usize = batch.iter().map(|a| a.bytes.len()).sum();
        while bytes < BATCH_BYTES && batch.len() < BATCH_COUNT && queue.is_empty() {
            match self.rx.try_recv() {
                Ok(Cmd::Append(a)) => {
                    bytes += a.bytes.len();
                    batch.push(a);
                }
                Ok(Cmd::AppendMany(v)) => {
                    bytes += v.iter().map(|a| a.bytes.len()).sum::<usize>();
                    batch.extend(v);
                }
                // This batch finishes the in-flight one after it is written
                // anyway.
                Ok(Cmd::Synced(_)) => {}
                Ok(other) => queue.push_back(other),
                Err(_) => break,
            }
        }
        self.append_batch(batch);
    }

    pub(super) fn tail_of(&self, log: &str) -> u64 {
        let idx = self.shared.index();
        idx.logs.get(log).map(|l| l.tail()).unwrap_or(0)
    }

    pub(super) fn append_batch(&mut self, reqs: Vec<AppendReq>) {
        if let Some(why) = &self.failed {
            for r in reqs {
                let _ = r.reply.send(Err(StoreError::WriteFailed(format!(
                    "the store stopped accepting appends after an unrecoverable write error ({why}); restart the service to recover"
                ))));
            }
            return;
        }
        if self.unfinished_roll_back {
            if let Err(e) = self.finish_roll_back() {
                for r in reqs {
                    let _ = r.reply.send(Err(e.clone()));
                }
                return;
            }
        }
        let taken = Instant::now();
        self.shared
            .stages
            .queued
            .record_runs(reqs.iter().map(|r| taken.saturating_duration_since(r.at)));
        let mut pending: Vec<Pending> = Vec::with_capacity(reqs.len());
        let mut in_batch: IdMap<usize> =
            IdMap::with_capacity_and_hasher(reqs.len(), Default::default());
        let mut tails: HashMap<String, u64> = HashMap::new();
        for r in reqs {
            let key = (r.client, r.request);
            if r.client != 0 {
                if let Some(pos) = self.request_ids.get(key) {
                    let _ = r.reply.send(Ok(pos));
                    continue;
                }
                // A retry of an append written but not yet answered (in the
                // batch syncing or the one written meanwhile): answered
                // with it.
                let unanswered = [&mut self.inflight, &mut self.next]
                    .into_iter()
                    .flatten()
                    .find_map(|f| Some((*f.keys.get(&key)?, f)));
                if let Some((i, f)) = unanswered {
                    f.pending[i].replies.push(r.reply);
                    continue;
                }
                if let Some(&i) = in_batch.get(&key) {
                    pending[i].replies.push(r.reply);
                    continue;
                }
                in_batch.insert(key, pending.len());
            }
            self.queue_record(&mut pending, &mut tails, r.log, key, r.bytes, r.at, r.reply);
        }
        if pending.is_empty() {
            return;
        }
        if let Err(e) = self.check_counts(&pending, &tails) {
            for p in pending {
                for r in p.replies {
                    let _ = r.send(Err(e.clone()));
                }
            }
            return;
        }
        // While a round runs, this write joins the batch written during it
        // (same batch number: recovery treats it as one batch, so at most
        // two batches are ever unacknowledged); otherwise it starts one.
        let batch_seq = self.next.as_ref().map_or(self.next_seq, |n| n.first_seq);
        let write_seq = self.next_seq;
        let lens_before: BTreeMap<u64, u64> =
            self.segs.iter().map(|(&s, st)| (s, st.len)).collect();
        let t0 = Instant::now();
        let written = self.write_batch(&pending, batch_seq);
        self.shared.stages.write.record(t0.elapsed());
        let ews = match written {
            Ok(ews) => ews,
            Err(e) => {
                // Only this write's pages are rolled back: what was written
                // before it (the batch syncing, the batch joined) stands,
                // and the segments the joined batch dirtied still need
                // their round.
                let dirty = self.dirty.clone();
                self.roll_back(&lens_before, write_seq);
                self.dirty.extend(dirty);
                self.fail(pending, e);
                return;
            }
        };
        let batch = InFlight {
            payload: pending.iter().map(|p| p.bytes.len()).sum(),
            pending,
            ews,
            first_seq: batch_seq,
            lens_before,
            round: None,
            keys: in_batch,
            tails,
        };
        match &mut self.next {
            Some(n) => n.absorb(batch),
            None => self.next = Some(batch),
        }
        if self.inflight.is_none() {
            if self.promote() {
                self.finish_inflight();
            }
        } else if self
            .next
            .as_ref()
            .is_some_and(|n| n.payload > MAX_NEXT_BYTES)
        {
            // Bounded memory: a batch that grew this large waits for the
            // round ahead instead of growing further.
            self.finish_inflight();
        }
        // A round that has ended meanwhile is answered by the run loop.
    }

    /// Refuses a batch whose positions or stripe numbers would reach
    /// [`crate::meta::LIMIT`]: the metadata written after it (a trim's,
    /// the next open's) would carry a count its own check refuses, and
    /// the store would not open again. Stripe numbers are counted high
    /// (every record split into fragments and given a root of its own).
    pub(super) fn check_counts(
        &self,
        pending: &[Pending],
        tails: &HashMap<String, u64>,
    ) -> Result<(), StoreError> {
        let limit = crate::meta::LIMIT;
        if let Some((log, _)) = tails.iter().find(|(_, &t)| t >= limit) {
            return Err(StoreError::Exhausted(format!(
                "log {log:?}'s next position; append to another log"
            )));
        }
        let cap = (self.shared.config.data_shards
            * (self.shared.config.page_bytes as usize - HEADER)) as u64;
        let stripes = pending
            .iter()
            .map(|p| p.bytes.len() as u64 / cap + 2)
            .sum::<u64>()
            + 1;
        if self.next_seq.saturating_add(stripes) >= limit {
            return Err(StoreError::Exhausted(
                "the store's next stripe number; move the logs to a new store".into(),
            ));
        }
        Ok(())
    }

    /// Adds one record to the batch being built: its position follows the
    /// log's tail after everything already written.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn queue_record(
        &self,
        pending: &mut Vec<Pending>,
        tails: &mut HashMap<String, u64>,
        log: String,
        (client, request): (u64, u64),
        bytes: bytes::Bytes,
        at: Instant,
        reply: Reply,
    ) {
        let tail = match tails.get_mut(&log) {
            Some(t) => t,
            None => {
                // After the records already written and not yet published:
                // the batch written during the round first, then the one
                // syncing.
                let t = match [&self.next, &self.inflight]
                    .into_iter()
                    .flatten()
                    .find_map(|f| f.tails.get(&log))
                {
                    Some(&t) => t,
                    None => self.tail_of(&log),
                };
                tails.entry(log.clone()).or_insert(t)
            }
        };
        let pos = *tail;
        *tail += 1;
        pending.push(Pending {
            meta: EntryMeta {
                log,
                pos,
                client,
                request,
                len: bytes.len() as u32,
                offset: stripe::FRAGMENTED,
                crc: crc32fast::hash(&bytes),
            },
            bytes,
            at,
            replies: vec![reply],
        });
    }

    /// Starts the fsync round of the batch written meanwhile, which becomes
    /// the one in flight; without fsync it is answered at once. Returns
    /// whether the writer ran the round itself: it is over, and the caller
    /// answers it ([`Writer::finish_inflight`]), as no helper will send a
    /// wake-up for it.
    #[must_use = "a round the writer ran itself must be answered by the caller"]
    pub(super) fn promote(&mut self) -> bool {
        debug_assert!(self.inflight.is_none());
        let Some(mut n) = self.next.take() else {
            return false;
        };
        // A small round runs here. Handing it to the helpers costs a
        // wake-up per file and one back to the writer, which on two shared
        // cores took more CPU than the round's I/O; appends that arrive
        // meanwhile wait for the round's end instead of being written
        // beside it, and measured less than that (docs/log-service.md,
        // "How a batch becomes durable"). A large round goes to the
        // helpers: its files' write-backs overlap, and the writer writes
        // the next batch meanwhile. ([`Writer::start_sync`] sends more
        // to the helpers.)
        let limit = self.shared.config.tuning.writer_round_max_bytes;
        let small = limit > 0 && (n.payload as u64) <= limit;
        match self.start_sync(Some(n.first_seq), small) {
            None => {
                let answered = self.publish(n.pending, n.ews, n.first_seq);
                self.remember_ids(&answered);
                false
            }
            Some(round) => {
                let here = round.1.ran_here();
                n.round = Some(round);
                self.inflight = Some(n);
                here
            }
        }
    }

    pub(super) fn alloc_seq(&mut self) -> u64 {
        let s = self.next_seq;
        self.next_seq += 1;
        s
    }
}
