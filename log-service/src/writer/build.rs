//! Building the writer from what recovery found, and the steps recovery
//! takes on it before it runs: the writer's state stays private to this
//! module tree, so recovery hands over its findings ([`Recovered`]) and
//! asks for what it needs through these methods.

use super::*;

use crate::error::{ConfigError, OpenError};

/// What recovery found on disk, for the writer to go on from.
pub(crate) struct Recovered {
    /// Every segment found, by number.
    pub segs: BTreeMap<u64, SegState>,
    /// The windows' base: the lowest segment not sealed.
    pub base: u64,
    /// The next stripe number to hand out.
    pub next_seq: u64,
    /// The service metadata.
    pub meta: Meta,
    /// Live stripes' end-writes: where their copies are and what they hold.
    pub ews: BTreeMap<u64, LiveEndWrite>,
    /// The request ids of the last `dedup_window` appends.
    pub request_ids: RequestIds,
}

impl Writer {
    /// A writer over `found`, taking its commands from `rx` and its
    /// rounds' wake-ups through `wake`, with the spare pool `spares`.
    pub(crate) fn new(
        shared: Arc<Shared>,
        rx: mpsc::Receiver<Cmd>,
        wake: mpsc::WeakSender<Cmd>,
        spares: Option<Spares>,
        found: Recovered,
    ) -> Result<Writer, OpenError> {
        let config = &shared.config;
        let rs = ReedSolomon::new(config.data_shards, config.parity_shards).map_err(|e| {
            OpenError::Config(ConfigError::Invalid(format!(
                "{} data + {} parity shards: {e}",
                config.data_shards, config.parity_shards
            )))
        })?;
        let flush_devs = config
            .zones
            .iter()
            .enumerate()
            .map(|(zi, z)| {
                (config.fsync && config.tuning.flush_once_per_device)
                    .then(|| match shared.device(zi) {
                        Some(dev) => crate::device::flush_key(dev.path()),
                        None => crate::flush::write_back_device(z),
                    })
                    .flatten()
            })
            .collect();
        // A round syncs at most one segment per zone plus the end-write
        // segments, each on its own helper: the writer writes the next
        // batch meanwhile.
        let syncer = SyncPool::new(config.zones.len() + END_WRITE_COPIES, shared.faults.clone());
        Ok(Writer {
            rx,
            segs: found.segs,
            base: found.base,
            next_seq: found.next_seq,
            meta: found.meta,
            ews: found.ews,
            request_ids: found.request_ids,
            failed: None,
            unfinished_roll_back: false,
            dirty: Default::default(),
            deferred: Default::default(),
            direct_bufs: Default::default(),
            round_held: Default::default(),
            torn: Default::default(),
            late: Default::default(),
            syncer,
            rs,
            page_bufs: Vec::new(),
            payload_buf: Vec::new(),
            inflight: None,
            next: None,
            wake,
            spares,
            flush_devs,
            shared,
        })
    }

    /// Forgets the end-writes and index entries of stripes below the live
    /// floor (what trim made unreachable), before recovery decides what
    /// is missing.
    pub(crate) fn forget_unreachable(&mut self) {
        let floor = self.live_floor();
        self.ews = self.ews.split_off(&floor);
        let mut idx = self.shared.index_mut();
        idx.stripes = idx.stripes.split_off(&floor);
    }

    /// Stores the metadata in every zone and keeps each zone's reserve.
    pub(crate) fn store_meta(&mut self) -> io::Result<()> {
        let zones = self.zones().to_vec();
        self.meta.store(&zones)?;
        self.meta.keep_reserve(&zones);
        Ok(())
    }

    /// The segments found, for recovery's checks of their ends.
    pub(crate) fn segments_mut(&mut self) -> impl Iterator<Item = (u64, &mut SegState)> {
        self.segs.iter_mut().map(|(&id, st)| (id, st))
    }

    /// How many segments the writer has.
    pub(crate) fn segment_count(&self) -> usize {
        self.segs.len()
    }

    /// Segments to rebuild before the writer runs: the damaged ones, and
    /// the missing ones a live stripe has a page or an end-write copy on.
    pub(crate) fn segments_to_rebuild(&self) -> Vec<u64> {
        let mut wanted: Vec<u64> = self
            .segs
            .iter()
            .filter(|(_, s)| s.damaged_at.is_some())
            .map(|(&id, _)| id)
            .collect();
        let idx = self.shared.index();
        for r in idx.stripes.values() {
            for (seg, _) in &r.pages {
                if !self.segs.contains_key(seg) {
                    wanted.push(*seg);
                }
            }
        }
        for live in self.ews.values() {
            for seg in live.base..live.base + END_WRITE_COPIES as u64 {
                if !self.segs.contains_key(&seg) {
                    wanted.push(seg);
                }
            }
        }
        wanted.sort_unstable();
        wanted.dedup();
        wanted
    }
}
