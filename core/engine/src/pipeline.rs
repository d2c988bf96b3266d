//! The stages before final meld (Hyder II §3–4), as pure functions that
//! hosts call on any thread: premeld and group meld. Each takes the log
//! entry (or entries) and the one retained state it needs, and returns what
//! final meld consumes ([`Prepared`]); which state that is follows from the
//! log positions and the genesis settings alone ([`premeld_input`],
//! [`group_input`]), so every node computes the same thing whatever its
//! thread count or timing.
//!
//! **Premeld** checks an intention against the state `m = v - t*d - 1` with
//! meld itself. If meld finds a conflict, the intention is aborted and final
//! meld skips it. Otherwise the intention is re-expressed on `m`: its
//! effects (writes, reads, ranges, delete list) are replayed on `m` exactly
//! as a transaction would have produced them there. The result is the pair
//! `<S_m, S_out>` with the original readset that Hyder II's modified meld
//! yields (§3.3), written as an ordinary intention whose snapshot is `m`, so
//! final meld only checks the short zone after `m`. Its nodes belong to the
//! intention's log position, so their identities depend only on the log and
//! the settings.
//!
//! **Group meld** takes the pair at positions `(2k-1, 2k)`. Both members
//! are first brought to a common state `q` (the later of their two
//! snapshots, after premeld), which checks the older one over the gap, like
//! premeld. If the second member read, scanned or wrote a key the first one
//! wrote, the second aborts and the first goes on alone. Otherwise their
//! effects are replayed together on `q` into one group intention, which
//! final meld melds once: both commit or both abort (fate sharing). See
//! `docs/pipeline.md` for which decisions can differ from plain meld.
//!
//! **Checkpoint records** (see [`crate::checkpoint`]) never pair: a pair
//! with one is melded one entry after the other ([`Prepared::Apart`]), so
//! the state a begin record holds exists on every node. Premeld never
//! needs a state behind the latest begin record (see [`premeld_input`]).

use crate::codec::Intention;
use crate::error::DecodeError;
use crate::genesis::Settings;
use crate::isolation::Isolation;
use crate::meld::{meld, AbortReason, MeldInput, MeldStats, Tombstones};
use crate::node::{Link, LogPos, Node};
use crate::range::KeyRange;
use crate::snapshot::Snapshot;
use crate::txn::{Effects, Transaction};

/// A retained committed state together with the deletions meld remembers
/// as of it: the input premeld and group meld need. Cheap to clone.
#[derive(Debug, Clone)]
pub struct MeldState {
    pub(crate) snapshot: Snapshot,
    pub(crate) tombs: Tombstones,
}

impl MeldState {
    /// The committed state.
    pub fn snapshot(&self) -> &Snapshot {
        &self.snapshot
    }
}

/// Whether an intention at `pos` may name the state after `snapshot_pos`
/// as its snapshot: before it, inside the conflict-zone bound (App. B), and
/// not the first position of a group-meld pair (which has no state).
pub(crate) fn admit_snapshot(
    settings: &Settings,
    pos: LogPos,
    snapshot_pos: LogPos,
) -> Result<(), AbortReason> {
    if snapshot_pos >= pos {
        return Err(AbortReason::Malformed(DecodeError::Invalid {
            field: "snapshot position",
            why: "not before the intention",
        }));
    }
    let oldest_accepted = pos.saturating_sub(settings.max_conflict_zone as u64 + 1);
    if snapshot_pos < oldest_accepted {
        return Err(AbortReason::SnapshotTooOld {
            snapshot_pos,
            oldest_accepted,
        });
    }
    if is_pair_head(settings, snapshot_pos) {
        return Err(AbortReason::SnapshotUnavailable { snapshot_pos });
    }
    Ok(())
}

/// A log entry (or a pair of them) ready for final meld.
#[derive(Debug)]
pub enum Prepared {
    /// One entry: its intention (maybe premelded) or why it aborts.
    One(LogPos, Result<Intention, AbortReason>),
    /// The two entries of a group-meld pair, melded as one intention that
    /// commits or aborts as a whole.
    Group {
        /// Position of the first member; the second is `first + 1`.
        first: LogPos,
        /// The group intention.
        group: Intention,
    },
    /// The two entries of a group-meld pair that were not grouped because
    /// one of them aborts before final meld; the other is melded alone.
    Split(
        (LogPos, Result<Intention, AbortReason>),
        (LogPos, Result<Intention, AbortReason>),
    ),
    /// A checkpoint record (see [`crate::checkpoint`]): final meld decides
    /// it from its bytes; there is nothing to decode or premeld.
    Checkpoint(LogPos, Vec<u8>),
    /// The two entries of a group-meld pair one of which is a checkpoint
    /// record: a record never pairs, so final meld takes them one after
    /// the other, each alone.
    Apart(Box<Prepared>, Box<Prepared>),
}

impl Prepared {
    /// The first log position this covers.
    pub fn first_pos(&self) -> LogPos {
        match self {
            Prepared::One(p, _) => *p,
            Prepared::Group { first, .. } => *first,
            Prepared::Split((p, _), _) => *p,
            Prepared::Checkpoint(p, _) => *p,
            Prepared::Apart(a, _) => a.first_pos(),
        }
    }
    /// Number of log entries this covers (1 or 2).
    pub fn entries(&self) -> u64 {
        match self {
            Prepared::One(..) | Prepared::Checkpoint(..) => 1,
            Prepared::Apart(a, b) => a.entries() + b.entries(),
            _ => 2,
        }
    }
}

/// The state premeld melds the entry at `pos` against: `pos - t*d - 1`
/// (Hyder II Algorithm 1), moved one back to an even position when group
/// meld is on (odd positions are inside pairs and have no state of their
/// own). `None` when premeld is off or the log is too short.
///
/// The state may precede the latest checkpoint begin record (which no
/// node keeps states behind): premeld then asks for nothing, since an
/// intention that survives decoding has a snapshot at or after that
/// record, newer than this state.
pub fn premeld_input(settings: &Settings, pos: LogPos) -> Option<LogPos> {
    if !settings.premeld() || pos <= settings.premeld_lag() {
        return None;
    }
    let m = pos - settings.premeld_lag();
    Some(if settings.group_meld && m % 2 == 1 {
        m - 1
    } else {
        m
    })
}

/// Whether the entry at `pos` is the first member of a group-meld pair.
pub fn is_pair_head(settings: &Settings, pos: LogPos) -> bool {
    settings.group_meld && pos % 2 == 1
}

/// The state group meld brings both members of a pair to: the later of
/// their snapshots. `None` when a member already aborted (nothing to group).
pub fn group_input(
    a: &Result<Intention, AbortReason>,
    b: &Result<Intention, AbortReason>,
) -> Option<LogPos> {
    match (a, b) {
        (Ok(a), Ok(b)) => Some(a.snapshot_pos.max(b.snapshot_pos)),
        _ => None,
    }
}

/// A host handed a stage the wrong state: not the one the stage asked for.
/// Premelding against a state of the host's choosing would give nodes
/// different identities (Hyder II App. C), so the stages name the state
/// they need and refuse any other.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StageError {
    /// The lookup had no state at the position asked for.
    #[error(
        "no retained state at position {0}; keep states until the premelds that need them ran"
    )]
    Unavailable(LogPos),
    /// The lookup returned a state at another position.
    #[error("asked for the state at {wanted}, got the one at {got}")]
    WrongState {
        /// The position the stage asked for.
        wanted: LogPos,
        /// The position of the state it got.
        got: LogPos,
    },
}

/// Result of a stage: `Err` is a host error, `Ok(Err)` an abort decided
/// the same way on every node.
pub type StageResult<T> = Result<Result<T, AbortReason>, StageError>;

fn fetch(
    pos: LogPos,
    lookup: impl FnOnce(LogPos) -> Option<MeldState>,
) -> Result<MeldState, StageError> {
    let s = lookup(pos).ok_or(StageError::Unavailable(pos))?;
    if s.snapshot.pos != pos {
        return Err(StageError::WrongState {
            wanted: pos,
            got: s.snapshot.pos,
        });
    }
    Ok(s)
}

/// Premeld (Hyder II Algorithm 1) of the entry `int` decoded at `int.pos`:
/// asks `lookup` for the state [`premeld_input`] names (a host may block
/// there until final meld has produced it), checks `int` against it and,
/// if it passes, re-expresses it there. Without premeld, or when that
/// state is not newer than the intention's snapshot, `int` is returned
/// unchanged without a lookup.
pub fn premeld(
    settings: &Settings,
    int: Intention,
    lookup: impl FnOnce(LogPos) -> Option<MeldState>,
    stats: &mut MeldStats,
) -> StageResult<Intention> {
    let base = premeld_base(settings, int.pos, int.snapshot_pos);
    if base == int.snapshot_pos {
        return Ok(Ok(int));
    }
    let input = fetch(base, lookup)?;
    Ok(premeld_on(int, &input, stats))
}

/// The state the entry at `pos`, written on the snapshot at
/// `snapshot_pos`, is expressed on after premeld: the premeld input if it
/// is newer than the snapshot, else the snapshot itself.
pub fn premeld_base(settings: &Settings, pos: LogPos, snapshot_pos: LogPos) -> LogPos {
    match premeld_input(settings, pos) {
        Some(m) if m > snapshot_pos => m,
        _ => snapshot_pos,
    }
}

fn premeld_on(
    int: Intention,
    input: &MeldState,
    stats: &mut MeldStats,
) -> Result<Intention, AbortReason> {
    if input.snapshot.pos <= int.snapshot_pos {
        return Ok(int);
    }
    check(&int, input, stats)?;
    let effects = effects_of(&int);
    rebuild(&effects, int.isolation, int.pos, input)
}

/// Group meld of the pair `(a, b)` at positions `(first, first + 1)`
/// (already decoded and premelded); asks `lookup` for the state
/// [`group_input`] names when both members are alive.
pub fn group(
    first: LogPos,
    a: Result<Intention, AbortReason>,
    b: Result<Intention, AbortReason>,
    lookup: impl FnOnce(LogPos) -> Option<MeldState>,
    stats: &mut MeldStats,
) -> Result<Prepared, StageError> {
    let (a, b) = match (a, b) {
        (Ok(a), Ok(b)) => (a, b),
        (a, b) => return Ok(Prepared::Split((first, a), (first + 1, b))),
    };
    let q = fetch(a.snapshot_pos.max(b.snapshot_pos), lookup)?;
    Ok(group_on(first, a, b, &q, stats))
}

fn group_on(
    first: LogPos,
    a: Intention,
    b: Intention,
    q: &MeldState,
    stats: &mut MeldStats,
) -> Prepared {
    // Bring both to `q`: this checks the member with the older snapshot
    // over the entries between the two snapshots, exactly like premeld.
    let (a, b) = match (premeld_on(a, q, stats), premeld_on(b, q, stats)) {
        (Ok(a), Ok(b)) => (a, b),
        (a, b) => return Prepared::Split((first, a), (first + 1, b)),
    };
    let ea = effects_of(&a);
    let eb = effects_of(&b);
    if let Some(reason) = conflicts_with_earlier(&eb, &ea) {
        // The first member is in the second's conflict zone (Hyder II §4):
        // the second aborts and the first goes on alone.
        return Prepared::Split((first, Ok(a)), (first + 1, Err(reason)));
    }
    let isolation = stronger(a.isolation, b.isolation);
    let combined = union(ea, eb);
    match rebuild(&combined, isolation, first, q) {
        Ok(group) => Prepared::Group { first, group },
        // Cannot happen after the checks above (both replays succeeded on
        // `q` and their keys are disjoint); kept as an abort, never a panic.
        Err(e) => Prepared::Split((first, Err(e.clone())), (first + 1, Err(e))),
    }
}

/// Trial meld (Hyder §5): would `local`, appended now, abort against
/// `latest` (the host's newest state)? Its conflict zone up to `latest` is
/// checked exactly as meld would; `Err` means it aborts on every node, so
/// the host may skip the append. `Ok` promises nothing about entries
/// appended after `latest`, nor when part of a tree could not be read back
/// from its node store (then meld decides).
pub fn trial_meld(
    settings: &Settings,
    local: &crate::txn::LocalIntention,
    latest: &MeldState,
    stats: &mut MeldStats,
) -> Result<(), AbortReason> {
    crate::node::guarded(|| trial_meld_unguarded(settings, local, latest, stats)).unwrap_or(Ok(()))
}

fn trial_meld_unguarded(
    settings: &Settings,
    local: &crate::txn::LocalIntention,
    latest: &MeldState,
    stats: &mut MeldStats,
) -> Result<(), AbortReason> {
    let snap = local.snapshot();
    let pos = latest.snapshot.pos + 1;
    admit_snapshot(settings, pos, snap.pos)?;
    if snap.pos == latest.snapshot.pos {
        // Nothing committed since its snapshot: no conflict possible.
        return Ok(());
    }
    // A clone: the host melds the intention itself afterwards.
    match local.clone().at(pos, snap) {
        Some(int) => check(&int, latest, stats),
        None => Ok(()),
    }
}

/// Meld of `int` into `input`, for its decision only.
fn check(int: &Intention, input: &MeldState, stats: &mut MeldStats) -> Result<(), AbortReason> {
    meld(
        &MeldInput {
            intention: int,
            lcs_root: &input.snapshot.root,
            lcs_csn: input.snapshot.csn,
            snapshot_root: &int.snapshot_root,
            tombstones: &input.tombs,
            keep_readset: true,
        },
        stats,
    )
    .map(|_| ())
    .map_err(|r| *r)
}

/// Replays `effects` on `input` as the intention at `pos`.
fn rebuild(
    effects: &Effects,
    isolation: Isolation,
    pos: LogPos,
    input: &MeldState,
) -> Result<Intention, AbortReason> {
    let internal = |why: &'static str| {
        AbortReason::Malformed(DecodeError::Invalid {
            field: "premeld",
            why,
        })
    };
    Transaction::replay(&input.snapshot, isolation, effects, pos)
        .map_err(|_| internal("replay disagrees with the state meld accepted"))
}

/// The effects of a decoded intention.
pub(crate) fn effects_of(int: &Intention) -> Effects {
    fn walk(t: &Link, int: &Intention, e: &mut Effects) {
        let Some(n) = t else { return };
        if !int.owns(n) {
            return;
        }
        walk(n.left(), int, e);
        visit(n, e);
        walk(n.right(), int, e);
    }
    fn visit(n: &Node, e: &mut Effects) {
        if n.altered() {
            e.writes.push((n.key.clone(), n.val().clone()));
        } else if n.depends_on() {
            e.reads.push(n.key.clone());
        }
        if let Some(rs) = n.ranges() {
            e.ranges.extend(rs.iter().cloned());
        }
    }
    let mut e = Effects::default();
    walk(&int.root, int, &mut e);
    e.ranges.extend(int.header_ranges.iter().cloned());
    e.deletes = int.deletes.clone();
    e
}

/// Whether `later` read, scanned or wrote something `earlier` wrote: the
/// brute-force predicates of the conflict zone restricted to one entry.
fn conflicts_with_earlier(later: &Effects, earlier: &Effects) -> Option<AbortReason> {
    let mut written: Vec<&[u8]> = earlier
        .writes
        .iter()
        .map(|(k, _)| &k[..])
        .chain(earlier.deletes.iter().map(|(k, _)| &k[..]))
        .collect();
    written.sort_unstable();
    let hit = |k: &[u8]| written.binary_search(&k).is_ok();
    for k in later
        .writes
        .iter()
        .map(|(k, _)| k)
        .chain(later.deletes.iter().map(|(k, _)| k))
    {
        if hit(k) {
            return Some(AbortReason::WriteWrite { key: k.clone() });
        }
    }
    for k in &later.reads {
        if hit(k) {
            return Some(AbortReason::ReadWrite { key: k.clone() });
        }
    }
    for r in &later.ranges {
        if in_range(&written, r) {
            return Some(AbortReason::Phantom { range: r.clone() });
        }
    }
    None
}

fn in_range(sorted: &[&[u8]], r: &KeyRange) -> bool {
    let rr = r.as_ref();
    let from = sorted.partition_point(|w| !rr.above_start(w));
    sorted.get(from).is_some_and(|w| rr.below_end(w))
}

/// The effects of both members of a group, which share no written key.
fn union(a: Effects, b: Effects) -> Effects {
    let mut writes = a.writes;
    writes.extend(b.writes);
    writes.sort_by(|x, y| x.0.cmp(&y.0));
    let mut deletes = a.deletes;
    deletes.extend(b.deletes);
    deletes.sort_by(|x, y| x.0.cmp(&y.0));
    let mut reads = a.reads;
    reads.extend(b.reads);
    reads.sort();
    reads.dedup();
    // A key one member read and the other wrote is covered by the write's
    // content-version check, which is the same version (both on `q`).
    // A read of a key the other member deleted is covered by the delete
    // list's version check.
    reads.retain(|k| {
        writes.binary_search_by(|(w, _)| w.cmp(k)).is_err()
            && deletes.binary_search_by(|(d, _)| d.cmp(k)).is_err()
    });
    let mut ranges = a.ranges;
    ranges.extend(b.ranges);
    Effects {
        writes,
        reads,
        ranges,
        deletes,
    }
}

fn stronger(a: Isolation, b: Isolation) -> Isolation {
    let rank = |i: Isolation| match i {
        Isolation::SnapshotIsolation => 0,
        Isolation::RepeatableRead => 1,
        Isolation::Serializable => 2,
    };
    if rank(a) >= rank(b) {
        a
    } else {
        b
    }
}
