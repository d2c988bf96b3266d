//! The melder: rolls the log forward, one entry at a time, keeping the LCS,
//! the recent committed states (snapshots that in-flight transactions may
//! have read) and the recent deletions. A deterministic state machine: feed
//! it the log's bytes in order and it returns the same decisions and the
//! same states on every node.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::checkpoint::{self, Loaded, TrackEvent, Tracker};
use crate::codec::{parse, resolve, Intention};
use crate::error::DecodeError;
use crate::garbage::{Garbage, MAX_RETIRED};
use crate::genesis::Settings;
use crate::meld::{meld, AbortReason, MeldInput, MeldStats, Tombstones};
use crate::node::{take_store_error, Link, LogPos, NodeStore, StoreError, Vn};
use crate::pipeline::{
    admit_snapshot, group, is_pair_head, premeld, MeldState, Prepared, StageError,
};
use crate::snapshot::Snapshot;
use crate::txn::LocalIntention;

/// The fate of one log entry (or of a read-only transaction).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A read-only transaction: finished locally, nothing was logged.
    ReadOnly,
    /// Committed; its effects are in every state from `pos` on.
    Committed {
        /// Log position of the intention.
        pos: LogPos,
        /// CSN of the resulting committed state.
        csn: Vn,
    },
    /// Aborted by a trial meld before it was appended (it already
    /// conflicted with the host's latest state, so it would abort on every
    /// node); it never reached the log.
    Rejected {
        /// Why.
        reason: AbortReason,
    },
    /// Aborted; nothing of it is visible anywhere.
    Aborted {
        /// Log position of the intention.
        pos: LogPos,
        /// Why.
        reason: AbortReason,
    },
}

impl Outcome {
    /// Whether the transaction committed (or was read-only).
    pub fn is_committed(&self) -> bool {
        !matches!(self, Outcome::Aborted { .. } | Outcome::Rejected { .. })
    }

    /// The log position of the entry (`None` for a read-only transaction).
    pub fn pos(&self) -> Option<LogPos> {
        match self {
            Outcome::ReadOnly | Outcome::Rejected { .. } => None,
            Outcome::Committed { pos, .. } | Outcome::Aborted { pos, .. } => Some(*pos),
        }
    }
}

/// The meld state machine of one node. Cloning is cheap (states share
/// their nodes) and gives an independent node at the same log position.
#[derive(Debug, Clone)]
pub struct Melder {
    settings: Settings,
    /// Committed states at positions `lcs.pos - window.len() + 1 ..= lcs.pos`;
    /// `None` at the first position of a group-meld pair that committed
    /// together (no state exists between its two members).
    window: VecDeque<Option<MeldState>>,
    /// The bytes of the first member of a group-meld pair, waiting for the
    /// second (no state changes meanwhile, so decoding it later is the same).
    pending: Option<(LogPos, Vec<u8>)>,
    keep_readset: bool,
    /// Work done by the stages before final meld for the last entry.
    prep_stats: MeldStats,
    last_stats: MeldStats,
    /// Old states and consumed intentions not freed yet (see
    /// [`Melder::set_deferred_reclaim`]).
    retired: Garbage,
    deferred: bool,
    /// Where checkpoint parts stand (decided from the log's bytes alone).
    tracker: Tracker,
    /// Position of the latest checkpoint begin record (0: none): no state
    /// before it is retained, so no snapshot before it is accepted.
    barrier: LogPos,
    /// Whether a retained state may hold a stub (node cache): set by a
    /// sweep that stubbed something or a lazily loaded checkpoint, never
    /// cleared. Until then [`Melder::promote`] has nothing to do.
    stubs: bool,
    /// The first failure to read a stub back during a meld: the decisions
    /// since are meaningless (see [`Melder::read_error`]).
    read_error: Option<StoreError>,
}

impl Melder {
    /// A melder for a new database; its state after the genesis record
    /// (position 0) is the empty tree with CSN 0.
    pub fn new(settings: Settings) -> Melder {
        let genesis = Snapshot {
            root: None,
            pos: 0,
            csn: 0,
            db: settings.db_id,
        };
        Melder {
            settings,
            window: VecDeque::from([Some(MeldState {
                snapshot: genesis,
                tombs: Tombstones::default(),
            })]),
            pending: None,
            keep_readset: false,
            prep_stats: MeldStats::default(),
            last_stats: MeldStats::default(),
            retired: Garbage::default(),
            deferred: false,
            tracker: Tracker::default(),
            barrier: 0,
            stubs: false,
            read_error: None,
        }
    }

    /// A melder that starts from a loaded checkpoint (see
    /// [`crate::checkpoint::load`]): its state is the checkpoint's, at the
    /// position of its begin record, and the next entry it melds is the one
    /// after that (the checkpoint's parts included). It then agrees with a
    /// melder that melded the whole log.
    pub fn from_checkpoint(loaded: Loaded) -> Melder {
        let mut m = Melder::new(loaded.settings);
        m.stubs = loaded.state.root.as_ref().is_some_and(|r| r.is_stub());
        m.barrier = loaded.state.pos;
        m.tracker = Tracker::resuming(loaded.state.pos);
        m.window = VecDeque::from([Some(MeldState {
            snapshot: loaded.state,
            tombs: Tombstones::default(),
        })]);
        m
    }

    /// Position of the latest checkpoint begin record melded (0 if none).
    /// Intentions after it whose snapshot precedes it abort with
    /// [`AbortReason::SnapshotUnavailable`].
    pub fn barrier(&self) -> LogPos {
        self.barrier
    }

    /// The checkpoint tracker as of the last entry melded (hosts that
    /// prepare entries elsewhere replay it to know the barriers ahead).
    pub fn tracker(&self) -> &Tracker {
        &self.tracker
    }

    /// A melder from the bytes of a genesis record.
    pub fn from_genesis(bytes: &[u8]) -> Result<Melder, DecodeError> {
        Ok(Melder::new(Settings::decode(bytes)?))
    }

    /// Makes meld return an unchanged read-only intention subtree instead of
    /// its LCS twin (Hyder II §3.3), as premeld needs. The contents and
    /// decisions are the same either way; node identities differ, so this is
    /// a database-wide choice.
    pub fn set_keep_readset(&mut self, keep: bool) {
        self.keep_readset = keep;
    }

    /// With `true`, memory released by meld is kept until the host takes
    /// it with [`Melder::take_garbage`] (to free it elsewhere) instead of
    /// being freed inside [`Melder::apply`], or frees it in steps with
    /// [`Melder::free_garbage`]. At most 1024 retired roots and
    /// intentions are kept; past that the melder frees them itself, so
    /// memory stays bounded.
    pub fn set_deferred_reclaim(&mut self, deferred: bool) {
        self.deferred = deferred;
        if !deferred {
            self.retired = Garbage::default();
        }
    }

    /// Takes the memory released since the last call (see
    /// [`Melder::set_deferred_reclaim`]).
    pub fn take_garbage(&mut self) -> Garbage {
        // The next period's lists start with room for as much as this one
        // held: they are allocated here, once, rather than grown by
        // doubling inside the melds that retire into them, where the
        // growth would be part of every commit's latency.
        let room = Garbage {
            roots: Vec::with_capacity(self.retired.roots.len()),
            intentions: Vec::with_capacity(self.retired.intentions.len()),
        };
        std::mem::replace(&mut self.retired, room)
    }

    /// Frees at most `n` pieces of the memory released since the last
    /// [`Melder::take_garbage`] (see [`Garbage::free_some`]), so a host can
    /// free a little at a time between other work. Returns whether any
    /// remain.
    pub fn free_garbage(&mut self, n: usize) -> bool {
        self.retired.free_some(n)
    }

    fn make_room(&mut self) {
        if self.retired.len() >= MAX_RETIRED {
            self.retired = Garbage::default();
        }
    }

    fn retire(&mut self, root: Link) {
        if self.deferred && root.is_some() {
            self.make_room();
            self.retired.roots.push(root);
        }
    }

    fn retire_intention(&mut self, int: Intention) {
        if self.deferred {
            self.make_room();
            self.retired.intentions.push(int);
        }
    }

    /// Node cache: replaces the persisted subtrees of every retained state
    /// by stubs read back through `store` (see [`crate::cache`]), keeping
    /// loaded stubs used since the last call for one more. `persisted`
    /// says which checkpoint generations are complete and readable. Node
    /// identities and everything meld decides stay the same; the memory
    /// the old trees held is freed (or retired, see
    /// [`Melder::set_deferred_reclaim`]) once no snapshot holds it.
    pub fn evict(
        &mut self,
        store: &Arc<dyn NodeStore>,
        persisted: &dyn Fn(u16) -> bool,
    ) -> crate::cache::Evicted {
        self.guard(|m| m.evict_unguarded(store, persisted))
    }

    fn evict_unguarded(
        &mut self,
        store: &Arc<dyn NodeStore>,
        persisted: &dyn Fn(u16) -> bool,
    ) -> crate::cache::Evicted {
        let mut cx = crate::cache::Sweep {
            store,
            persisted,
            out: crate::cache::Evicted::default(),
            memo: std::collections::HashMap::new(),
        };
        let mut old = Vec::new();
        // Newest first: the LCS's hot stubs get their second chance from
        // it, and older states reuse what it swept.
        for s in self.window.iter_mut().rev().flatten() {
            let root = crate::cache::restub(&s.snapshot.root, &mut cx);
            old.push(std::mem::replace(&mut s.snapshot.root, root));
        }
        drop(cx.memo);
        for r in old {
            self.retire(r);
        }
        self.stubs |= cx.out.stubbed > 0;
        cx.out
    }

    /// Node cache, without evicting: every stub in memory that a
    /// checkpoint now `persisted` also holds reads from that checkpoint
    /// from now on (see [`crate::cache`]). Hosts call this (or
    /// [`Melder::evict`]) after each checkpoint they complete, before they
    /// trim the log below older ones. Walks what is in memory.
    pub fn promote(&self, persisted: &dyn Fn(u16) -> bool) {
        // Without a stub there is no address to move: skip the walk of
        // every retained tree (hundreds of thousands of nodes in a large
        // database, under the embedded engine's lock after every checkpoint).
        if !self.stubs {
            return;
        }
        let mut seen = std::collections::HashSet::new();
        for s in self.window.iter().rev().flatten() {
            crate::cache::promote(&s.snapshot.root, persisted, &mut seen);
        }
    }

    /// The database settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The last committed state.
    pub fn lcs(&self) -> &Snapshot {
        &self.lcs_state().snapshot
    }

    fn lcs_state(&self) -> &MeldState {
        // The window always ends with a state: holes only ever sit before
        // the second member of a pair, which is pushed in the same call.
        self.window
            .back()
            .and_then(Option::as_ref)
            .expect("the last window entry is a state")
    }

    /// The position the next log entry must have (one past a pending
    /// group-meld pair head, if any).
    pub fn next_pos(&self) -> LogPos {
        self.lcs().pos + 1 + u64::from(self.pending.is_some())
    }

    /// The committed state after `pos`, if retained and usable as a
    /// snapshot. With group meld on, odd positions (first members of pairs)
    /// are never snapshots.
    pub fn state_at(&self, pos: LogPos) -> Option<&Snapshot> {
        if is_pair_head(&self.settings, pos) {
            return None;
        }
        self.meld_state(pos).map(|s| &s.snapshot)
    }

    /// The retained state after `pos` with its tombstones (the input of
    /// premeld and group meld), if any.
    pub fn meld_state(&self, pos: LogPos) -> Option<&MeldState> {
        let first = self.lcs().pos + 1 - self.window.len() as u64;
        if pos < first {
            return None;
        }
        self.window.get((pos - first) as usize)?.as_ref()
    }

    /// The latest retained state at or before `pos` that transactions may
    /// begin on (see [`Melder::state_at`]): the state after `pos`, or,
    /// with group meld on and `pos` the head of a pair (a checkpoint
    /// record melded alone there, which changes no contents), the state
    /// after `pos - 1` if it is retained. What a host hands to new
    /// transactions after melding up to `pos`.
    pub fn snapshot_state(&self, pos: LogPos) -> Option<&MeldState> {
        if is_pair_head(&self.settings, pos) {
            return self.meld_state(pos - 1);
        }
        self.meld_state(pos)
    }

    /// Work done by premeld and group meld for the last entry or pair
    /// (in [`Melder::apply`]).
    pub fn last_prep_stats(&self) -> MeldStats {
        self.prep_stats
    }

    /// Work done by the last meld.
    pub fn last_stats(&self) -> MeldStats {
        self.last_stats
    }

    /// Number of remembered deletions (bounded by the conflict-zone window).
    pub fn tombstone_count(&self) -> usize {
        self.lcs_state().tombs.len()
    }

    /// The first failure to read part of a tree back from its node store
    /// during a meld (node cache), if any: from then on this melder's
    /// decisions and states are meaningless and it must be rebuilt (from
    /// a checkpoint and the log). Never set without a node store.
    pub fn read_error(&self) -> Option<&StoreError> {
        self.read_error.as_ref()
    }

    /// Runs a meld step and latches a read-back failure it hit. Failures
    /// are not cleared first: a step nested in another must not lose the
    /// outer step's failure.
    fn guard<T>(&mut self, f: impl FnOnce(&mut Melder) -> T) -> T {
        let out = f(self);
        if let Some(e) = take_store_error() {
            self.read_error.get_or_insert(e);
        }
        out
    }

    /// Decodes the entry that will be melded at `pos` (which must not be
    /// beyond [`Melder::next_pos`]) against its snapshot.
    pub fn decode(&self, pos: LogPos, bytes: &[u8]) -> Result<Intention, AbortReason> {
        decode_with(&self.settings, pos, bytes, |p| self.state_at(p).cloned())
    }

    /// Melds the next log entry through every stage the settings turn on
    /// (decode, premeld, group meld, final meld), one after the other: the
    /// single-threaded driver. Returns the outcomes decided by this entry:
    /// none for the first member of a group-meld pair (it is decided with
    /// the second), two for the second.
    pub fn apply(&mut self, bytes: &[u8]) -> Vec<Outcome> {
        self.guard(|m| m.apply_unguarded(bytes))
    }

    fn apply_unguarded(&mut self, bytes: &[u8]) -> Vec<Outcome> {
        let record = checkpoint::applies(bytes);
        let pos = self.next_pos();
        let mut stats = MeldStats::default();
        let Some((first, head_bytes)) = self.pending.take() else {
            if record {
                return vec![self.apply_checkpoint(bytes)];
            }
            // Without group meld every entry goes alone; with it, so does
            // the second member of a pair whose head was a checkpoint record.
            if !is_pair_head(&self.settings, pos) {
                let decoded = self.prepare_one(pos, bytes, &mut stats);
                self.prep_stats = stats;
                return vec![self.apply_decoded_unguarded(decoded)];
            }
            self.pending = Some((pos, bytes.to_vec()));
            return Vec::new();
        };
        if record {
            // A checkpoint record never pairs: the head goes first, alone.
            let head = self.prepare_one(first, &head_bytes, &mut stats);
            self.prep_stats = stats;
            let head = self.apply_decoded_unguarded(head);
            return vec![head, self.apply_checkpoint(bytes)];
        }
        let head = self.prepare_one(first, &head_bytes, &mut stats);
        let decoded = self.prepare_one(pos, bytes, &mut stats);
        let prepared = group(
            first,
            head,
            decoded,
            |q| self.meld_state(q).cloned(),
            &mut stats,
        );
        self.prep_stats = stats;
        match prepared {
            Ok(p) => self.apply_prepared(p),
            // Unreachable: the window keeps every state a stage can name.
            Err(e) => {
                let reason = AbortReason::Malformed(DecodeError::Invalid {
                    field: "group meld",
                    why: stage_failure(&e),
                });
                vec![
                    self.apply_decoded(Err(reason.clone())),
                    self.apply_decoded(Err(reason)),
                ]
            }
        }
    }

    /// [`Melder::apply`] for an entry this process created: `local` (from
    /// [`crate::Transaction::finish_local`], for exactly these `bytes`)
    /// replaces decoding the bytes, which gives the same intention. Falls
    /// back to decoding when it cannot be used (another snapshot tree, or
    /// the first member of a group-meld pair, which waits as bytes).
    pub fn apply_local(&mut self, bytes: &[u8], local: LocalIntention) -> Vec<Outcome> {
        self.guard(|m| m.apply_local_unguarded(bytes, local))
    }

    fn apply_local_unguarded(&mut self, bytes: &[u8], local: LocalIntention) -> Vec<Outcome> {
        if self.settings.group_meld || checkpoint::applies(bytes) {
            return self.apply_unguarded(bytes);
        }
        let pos = self.next_pos();
        let mut stats = MeldStats::default();
        let decoded = self.prepare(pos, bytes, Some(local), &mut stats);
        self.prep_stats = stats;
        vec![self.apply_decoded(decoded)]
    }

    /// Decode and premeld of one entry.
    fn prepare_one(
        &self,
        pos: LogPos,
        bytes: &[u8],
        stats: &mut MeldStats,
    ) -> Result<Intention, AbortReason> {
        self.prepare(pos, bytes, None, stats)
    }

    fn prepare(
        &self,
        pos: LogPos,
        bytes: &[u8],
        local: Option<LocalIntention>,
        stats: &mut MeldStats,
    ) -> Result<Intention, AbortReason> {
        let fast = local.and_then(|l| {
            // The checks decoding does before resolving, then the
            // in-memory conversion against the very same snapshot tree;
            // on any doubt, decoding decides (and names the error).
            let snap = l.snapshot_pos();
            admit_snapshot(&self.settings, pos, snap).ok()?;
            l.at(pos, self.state_at(snap)?)
        });
        let int = match fast {
            Some(int) => int,
            None => self.decode(pos, bytes)?,
        };
        premeld(&self.settings, int, |m| self.meld_state(m).cloned(), stats).unwrap_or_else(|e| {
            // Unreachable: the window keeps every state premeld can name.
            Err(AbortReason::Malformed(DecodeError::Invalid {
                field: "premeld",
                why: stage_failure(&e),
            }))
        })
    }

    /// Final meld of one prepared entry or pair (from the stages in
    /// [`crate::pipeline`], run by a host on other threads). Its first
    /// position must be the LCS position + 1.
    pub fn apply_prepared(&mut self, prepared: Prepared) -> Vec<Outcome> {
        self.guard(|m| m.apply_prepared_unguarded(prepared))
    }

    fn apply_prepared_unguarded(&mut self, prepared: Prepared) -> Vec<Outcome> {
        match prepared {
            Prepared::Checkpoint(_, bytes) if checkpoint::applies(&bytes) => {
                vec![self.apply_checkpoint(&bytes)]
            }
            Prepared::Checkpoint(pos, bytes) => {
                // Not a checkpoint record after all: decode decides, as
                // for any entry.
                let decoded = self.decode(pos, &bytes);
                vec![self.apply_decoded_unguarded(decoded)]
            }
            Prepared::One(_, d) => vec![self.apply_decoded_unguarded(d)],
            Prepared::Split((_, a), (_, b)) => vec![
                self.apply_decoded_unguarded(a),
                self.apply_decoded_unguarded(b),
            ],
            Prepared::Group { first, group } => self.apply_group(first, group),
            Prepared::Apart(a, b) => {
                let mut out = self.apply_prepared_unguarded(*a);
                out.extend(self.apply_prepared_unguarded(*b));
                out
            }
        }
    }

    fn apply_group(&mut self, first: LogPos, group: Intention) -> Vec<Outcome> {
        let lcs = self.lcs_state().clone();
        let mut stats = MeldStats::default();
        let result = self.meld_one(&group, first, &lcs, &mut stats);
        self.retire_intention(group);
        self.last_stats = stats;
        match result {
            Ok((next, csn)) => {
                let second = first + 1;
                self.push(None, first);
                self.push(
                    Some(MeldState {
                        snapshot: Snapshot {
                            pos: second,
                            ..next.snapshot
                        },
                        tombs: next.tombs,
                    }),
                    second,
                );
                vec![
                    Outcome::Committed { pos: first, csn },
                    Outcome::Committed { pos: second, csn },
                ]
            }
            Err(reason) => {
                let mut out = Vec::with_capacity(2);
                for pos in [first, first + 1] {
                    self.push(
                        Some(MeldState {
                            snapshot: Snapshot {
                                pos,
                                ..lcs.snapshot.clone()
                            },
                            tombs: lcs.tombs.clone(),
                        }),
                        pos,
                    );
                    out.push(Outcome::Aborted {
                        pos,
                        reason: reason.clone(),
                    });
                }
                out
            }
        }
    }

    /// Final meld of the next log entry, already decoded (and premelded).
    pub fn apply_decoded(&mut self, decoded: Result<Intention, AbortReason>) -> Outcome {
        self.guard(|m| m.apply_decoded_unguarded(decoded))
    }

    fn apply_decoded_unguarded(&mut self, decoded: Result<Intention, AbortReason>) -> Outcome {
        let pos = self.lcs().pos + 1;
        let lcs = self.lcs_state().clone();
        let mut stats = MeldStats::default();
        let result = match decoded {
            Err(reason) => Err(reason),
            Ok(int) => {
                let r = self.meld_one(&int, pos, &lcs, &mut stats);
                self.retire_intention(int);
                r
            }
        };
        self.last_stats = stats;
        let (next, outcome) = match result {
            Ok((next, csn)) => (next, Outcome::Committed { pos, csn }),
            Err(reason) => (
                MeldState {
                    snapshot: Snapshot {
                        pos,
                        ..lcs.snapshot
                    },
                    tombs: lcs.tombs,
                },
                Outcome::Aborted { pos, reason },
            ),
        };
        self.push(Some(next), pos);
        outcome
    }

    /// Melds a checkpoint record (see [`crate::checkpoint`]): the state
    /// does not change; a begin record drops every older state and the
    /// tombstones (the barrier).
    fn apply_checkpoint(&mut self, bytes: &[u8]) -> Outcome {
        let pos = self.lcs().pos + 1;
        let lcs = self.lcs_state().clone();
        self.last_stats = MeldStats::default();
        self.prep_stats = MeldStats::default();
        let csn = lcs.snapshot.csn;
        let state = |tombs| MeldState {
            snapshot: Snapshot {
                pos,
                ..lcs.snapshot.clone()
            },
            tombs,
        };
        let event = self.tracker.feed(&self.settings, pos, bytes);
        if event == TrackEvent::Begin {
            while let Some(old) = self.window.pop_front() {
                if let Some(old) = old {
                    self.retire(old.snapshot.root);
                }
            }
            self.push(Some(state(Tombstones::default())), pos);
            self.barrier = pos;
            return Outcome::Committed { pos, csn };
        }
        let outcome = match event {
            TrackEvent::Invalid(e) => Outcome::Aborted {
                pos,
                reason: AbortReason::Malformed(e),
            },
            // Not reached: callers check `checkpoint::applies` first.
            TrackEvent::NotCheckpoint => Outcome::Aborted {
                pos,
                reason: AbortReason::Malformed(DecodeError::BadMagic { what: "checkpoint" }),
            },
            _ => Outcome::Committed { pos, csn },
        };
        self.push(Some(state(lcs.tombs.clone())), pos);
        outcome
    }

    /// Appends the state after `pos` to the window and drops what left it.
    fn push(&mut self, state: Option<MeldState>, pos: LogPos) {
        self.window.push_back(state);
        let keep = self.settings.max_conflict_zone as usize + 1;
        while self.window.len() > keep {
            if let Some(Some(old)) = self.window.pop_front() {
                self.retire(old.snapshot.root);
            }
        }
        let zone = self.settings.max_conflict_zone as u64;
        if pos % zone == 0 {
            if let Some(Some(last)) = self.window.back_mut() {
                // A tombstone at p matters only to snapshots before p, and
                // no snapshot older than pos - zone - 1 is accepted from
                // now on (premeld inputs are newer still).
                last.tombs.prune(pos.saturating_sub(zone + 1));
            }
        }
    }

    /// Melds one decoded intention into `lcs`; returns the new state (its
    /// position is `pos`) and CSN.
    fn meld_one(
        &mut self,
        int: &Intention,
        pos: LogPos,
        lcs: &MeldState,
        stats: &mut MeldStats,
    ) -> Result<(MeldState, Vn), AbortReason> {
        if int.pos != pos {
            return Err(AbortReason::Malformed(DecodeError::Invalid {
                field: "position",
                why: "intention was decoded for another log position",
            }));
        }
        let melded = meld(
            &MeldInput {
                intention: int,
                lcs_root: &lcs.snapshot.root,
                lcs_csn: lcs.snapshot.csn,
                snapshot_root: &int.snapshot_root,
                tombstones: &lcs.tombs,
                keep_readset: self.keep_readset,
            },
            stats,
        )
        .map_err(|reason| *reason)?;
        let mut tombs = lcs.tombs.clone();
        for (k, scv) in &int.deletes {
            tombs.record(k, pos, *scv == 0);
        }
        let csn = lcs.snapshot.csn + int.node_count as Vn + melded.ephemeral as Vn;
        Ok((
            MeldState {
                snapshot: Snapshot {
                    root: melded.root,
                    pos,
                    csn,
                    db: lcs.snapshot.db,
                },
                tombs,
            },
            csn,
        ))
    }
}

fn stage_failure(e: &StageError) -> &'static str {
    match e {
        StageError::Unavailable(_) => "input state not retained",
        StageError::WrongState { .. } => "input state at the wrong position",
    }
}

/// Decodes the log entry at `pos` against its snapshot, which `snapshot`
/// looks up (a host may block there until final meld has produced it).
/// Checks the conflict-zone bound and the snapshot's CSN.
pub fn decode_with(
    settings: &Settings,
    pos: LogPos,
    bytes: &[u8],
    snapshot: impl FnOnce(LogPos) -> Option<Snapshot>,
) -> Result<Intention, AbortReason> {
    let parsed = parse(bytes).map_err(AbortReason::Malformed)?;
    admit_snapshot(settings, pos, parsed.snapshot_pos)?;
    let state = snapshot(parsed.snapshot_pos).ok_or(AbortReason::SnapshotUnavailable {
        snapshot_pos: parsed.snapshot_pos,
    })?;
    if state.csn != parsed.snapshot_csn {
        return Err(AbortReason::Malformed(DecodeError::Invalid {
            field: "snapshot csn",
            why: "does not match the committed state at the snapshot position",
        }));
    }
    resolve(&parsed, pos, &state.root).map_err(AbortReason::Malformed)
}
