//! The melder: rolls the log forward, one entry at a time, keeping the LCS,
//! the recent committed states (snapshots that in-flight transactions may
//! have read) and the recent deletions. A deterministic state machine: feed
//! it the log's bytes in order and it returns the same decisions and the
//! same states on every node.

use std::collections::VecDeque;

use crate::codec::{parse, resolve, Intention};
use crate::error::DecodeError;
use crate::genesis::Settings;
use crate::meld::{meld, AbortReason, MeldInput, MeldStats, Tombstones};
use crate::node::{Link, LogPos, Vn};
use crate::snapshot::Snapshot;

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
        !matches!(self, Outcome::Aborted { .. })
    }

    /// The log position of the entry (`None` for a read-only transaction).
    pub fn pos(&self) -> Option<LogPos> {
        match self {
            Outcome::ReadOnly => None,
            Outcome::Committed { pos, .. } | Outcome::Aborted { pos, .. } => Some(*pos),
        }
    }
}

/// The meld state machine of one node. Cloning is cheap (states share
/// their nodes) and gives an independent node at the same log position.
#[derive(Debug, Clone)]
pub struct Melder {
    settings: Settings,
    /// Committed states at positions `lcs.pos - window.len() + 1 ..= lcs.pos`.
    window: VecDeque<Snapshot>,
    tombstones: Tombstones,
    keep_readset: bool,
    last_stats: MeldStats,
    /// Old states and consumed intentions not freed yet (see
    /// [`Melder::set_deferred_reclaim`]).
    retired: Garbage,
    deferred: bool,
}

/// Tree memory that meld no longer needs: old states that left the
/// retention window and the intention nodes meld replaced. Dropping it frees
/// the nodes no other state shares; it is `Send`, so a host can free it on
/// another thread, off meld's critical path.
#[derive(Debug, Default)]
pub struct Garbage {
    roots: Vec<Link>,
    intentions: Vec<Intention>,
}

impl Garbage {
    /// Number of retired roots and intentions.
    pub fn len(&self) -> usize {
        self.roots.len() + self.intentions.len()
    }
    /// Whether there is nothing to free.
    pub fn is_empty(&self) -> bool {
        self.roots.is_empty() && self.intentions.is_empty()
    }
}

/// A cloned melder starts with no pending garbage: the memory belongs to
/// the original, and freeing it once is enough.
impl Clone for Garbage {
    fn clone(&self) -> Garbage {
        Garbage::default()
    }
}

/// Retired roots kept at most before the melder frees them itself.
const MAX_RETIRED: usize = 8192;

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
            window: VecDeque::from([genesis]),
            tombstones: Tombstones::default(),
            keep_readset: false,
            last_stats: MeldStats::default(),
            retired: Garbage::default(),
            deferred: false,
        }
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
    /// being freed inside [`Melder::apply`]. At most 8192 roots are kept; past
    /// that the melder frees them itself, so memory stays bounded.
    pub fn set_deferred_reclaim(&mut self, deferred: bool) {
        self.deferred = deferred;
        if !deferred {
            self.retired = Garbage::default();
        }
    }

    /// Takes the memory released since the last call (see
    /// [`Melder::set_deferred_reclaim`]).
    pub fn take_garbage(&mut self) -> Garbage {
        std::mem::take(&mut self.retired)
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

    /// The database settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The last committed state.
    pub fn lcs(&self) -> &Snapshot {
        // The window always holds at least the LCS.
        &self.window[self.window.len() - 1]
    }

    /// The position the next log entry must have.
    pub fn next_pos(&self) -> LogPos {
        self.lcs().pos + 1
    }

    /// The committed state after `pos`, if still retained.
    pub fn state_at(&self, pos: LogPos) -> Option<&Snapshot> {
        let first = self.window.front()?.pos;
        if pos < first {
            return None;
        }
        self.window.get((pos - first) as usize)
    }

    /// Work done by the last meld.
    pub fn last_stats(&self) -> MeldStats {
        self.last_stats
    }

    /// Number of remembered deletions (bounded by the conflict-zone window).
    pub fn tombstone_count(&self) -> usize {
        self.tombstones.len()
    }

    /// Decodes the entry that will be melded at `pos` (which must not be
    /// beyond [`Melder::next_pos`]) against its snapshot.
    pub fn decode(&self, pos: LogPos, bytes: &[u8]) -> Result<Intention, AbortReason> {
        let parsed = parse(bytes).map_err(AbortReason::Malformed)?;
        if parsed.snapshot_pos >= pos {
            return Err(AbortReason::Malformed(DecodeError::Invalid {
                field: "snapshot position",
                why: "not before the intention",
            }));
        }
        let oldest_accepted = pos.saturating_sub(self.settings.max_conflict_zone as u64 + 1);
        let too_old = AbortReason::SnapshotTooOld {
            snapshot_pos: parsed.snapshot_pos,
            oldest_accepted,
        };
        if parsed.snapshot_pos < oldest_accepted {
            return Err(too_old);
        }
        let state = self.state_at(parsed.snapshot_pos).ok_or(too_old)?;
        if state.csn != parsed.snapshot_csn {
            return Err(AbortReason::Malformed(DecodeError::Invalid {
                field: "snapshot csn",
                why: "does not match the committed state at the snapshot position",
            }));
        }
        resolve(&parsed, pos, &state.root).map_err(AbortReason::Malformed)
    }

    /// Melds the next log entry.
    pub fn apply(&mut self, bytes: &[u8]) -> Outcome {
        let pos = self.next_pos();
        let decoded = self.decode(pos, bytes);
        self.apply_decoded(decoded)
    }

    /// Melds the next log entry, already decoded with [`Melder::decode`].
    pub fn apply_decoded(&mut self, decoded: Result<Intention, AbortReason>) -> Outcome {
        let pos = self.next_pos();
        let lcs = self.lcs().clone();
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
            Ok((root, csn)) => (
                Snapshot {
                    root,
                    pos,
                    csn,
                    db: lcs.db,
                },
                Outcome::Committed { pos, csn },
            ),
            Err(reason) => (Snapshot { pos, ..lcs }, Outcome::Aborted { pos, reason }),
        };
        self.window.push_back(next);
        let keep = self.settings.max_conflict_zone as usize + 1;
        while self.window.len() > keep {
            if let Some(old) = self.window.pop_front() {
                self.retire(old.root);
            }
        }
        let zone = self.settings.max_conflict_zone as u64;
        if pos % zone == 0 {
            // A tombstone at p matters only to snapshots before p, and no
            // snapshot older than pos - zone - 1 is accepted from now on.
            self.tombstones.prune(pos.saturating_sub(zone + 1));
        }
        outcome
    }

    /// Melds one decoded intention into `lcs`; returns the new root and CSN.
    fn meld_one(
        &mut self,
        int: &Intention,
        pos: LogPos,
        lcs: &Snapshot,
        stats: &mut MeldStats,
    ) -> Result<(Link, Vn), AbortReason> {
        if int.pos != pos {
            return Err(AbortReason::Malformed(DecodeError::Invalid {
                field: "position",
                why: "intention was decoded for another log position",
            }));
        }
        let snapshot_root = self
            .state_at(int.snapshot_pos)
            .map(|s| s.root.clone())
            .ok_or(AbortReason::SnapshotTooOld {
                snapshot_pos: int.snapshot_pos,
                oldest_accepted: self.window.front().map_or(0, |s| s.pos),
            })?;
        let melded = meld(
            &MeldInput {
                intention: int,
                lcs_root: &lcs.root,
                lcs_csn: lcs.csn,
                snapshot_root: &snapshot_root,
                tombstones: &self.tombstones,
                keep_readset: self.keep_readset,
            },
            stats,
        )
        .map_err(|reason| *reason)?;
        for (k, scv) in &int.deletes {
            self.tombstones.record(k, pos, *scv == 0);
        }
        let csn = lcs.csn + int.node_count as Vn + melded.ephemeral as Vn;
        Ok((melded.root, csn))
    }
}
