//! # melddb-wasm
//!
//! The MeldDB core for JavaScript, through wasm-bindgen: a [`Node`] melds
//! the log entries its host hands it, begins transactions ([`Txn`]) on its
//! latest committed state and gives out immutable snapshots ([`Snap`]).
//! Nothing here does I/O or waits: the `melddb` npm package (`wasm/npm`)
//! owns the log, the event loop and the typed JavaScript API, and calls in
//! here one call at a time (nothing in here calls back into JavaScript,
//! so no call can re-enter the instance).
//!
//! Positions and CSNs cross as JavaScript numbers: exact below 2^53.

#![deny(missing_docs)]

mod decision;
mod errors;
mod join;
mod txn;

use std::collections::VecDeque;

use melddb::{Isolation, LogPos, Melder, Settings, Snapshot};
use wasm_bindgen::prelude::*;

pub use decision::Decision;
pub use join::{CheckpointLoader, Published};

use decision::Changes;
pub use txn::{Snap, Txn};

use errors::{js_error, store_error};

/// The genesis record (log position 0) of a new database with these
/// settings; see the core's `Settings` for what each one means.
#[wasm_bindgen(js_name = genesisRecord)]
pub fn genesis_record(
    db_id: u64,
    max_conflict_zone: u32,
    premeld_threads: u32,
    premeld_distance: u32,
    group_meld: bool,
) -> Result<Vec<u8>, JsValue> {
    let settings = Settings {
        db_id,
        max_conflict_zone,
        premeld_threads,
        premeld_distance,
        group_meld,
    };
    settings
        .validate()
        .map_err(|e| js_error("MeldArgumentError", "Setting", e))?;
    Ok(settings.encode())
}

/// The version of the core this build carries.
#[wasm_bindgen(js_name = coreVersion)]
pub fn core_version() -> String {
    env!("CARGO_PKG_VERSION").to_owned()
}

/// One database node: the meld state machine over one log.
#[wasm_bindgen]
pub struct Node {
    melder: Melder,
    /// Whether decisions carry their changes (someone watches).
    track: bool,
    /// Changes of entries fed but not yet decided (a group-meld pair's
    /// head is decided with the entry after it), oldest first.
    pending: VecDeque<(LogPos, Changes)>,
    /// The state at the latest checkpoint begin record melded since
    /// [`Node::keep_begin`] was turned on: the one state a local
    /// checkpoint can hold, since nothing after a begin record needs a
    /// state before it. Kept only on request, as it holds every tree node
    /// replaced since.
    last_begin: Option<Snapshot>,
    keep_begin: bool,
}

#[wasm_bindgen]
impl Node {
    /// A node on the log whose genesis record (position 0) is `genesis`;
    /// the next entry to feed it is position 1.
    #[wasm_bindgen(constructor)]
    pub fn new(genesis: &[u8]) -> Result<Node, JsValue> {
        let melder =
            Melder::from_genesis(genesis).map_err(|e| js_error("MeldLogError", "Genesis", e))?;
        Ok(Node::with_melder(melder))
    }

    /// The position of the next entry to feed.
    #[wasm_bindgen(js_name = nextPos)]
    pub fn next_pos(&self) -> f64 {
        self.melder.next_pos() as f64
    }

    /// Makes decisions carry the changes of committed entries (for
    /// watchers), or stops it.
    #[wasm_bindgen(js_name = trackChanges)]
    pub fn track_changes(&mut self, on: bool) {
        self.track = on;
    }

    /// Melds the next log entry; returns the entries it decided (none for
    /// the head of a group-meld pair, two for its second). Malformed bytes
    /// are an aborted entry like on every other node, never an error; a
    /// node of the state that cannot be read back is.
    pub fn apply(&mut self, bytes: &[u8]) -> Result<Vec<Decision>, JsValue> {
        let pos = self.melder.next_pos();
        let barrier = self.melder.barrier();
        if self.track {
            let changes = self.changes(bytes);
            self.pending.push_back((pos, changes));
        }
        let outcomes = self.melder.apply(bytes);
        if let Some(e) = self.melder.read_error() {
            return Err(store_error(e.clone()));
        }
        let begin = self.melder.barrier();
        if self.keep_begin && begin != barrier {
            if let Some(state) = self.melder.meld_state(begin) {
                self.last_begin = Some(state.snapshot().clone());
            }
        }
        let mut out = Vec::with_capacity(outcomes.len());
        for o in &outcomes {
            let Some(mut d) = Decision::from_outcome(o) else {
                continue;
            };
            // Changes of entries before this one were never claimed
            // (watching began after they were fed): drop them; the
            // entry's own, if recorded, go with a commit.
            let at = o.pos().unwrap_or(pos);
            while self.pending.front().is_some_and(|(p, _)| *p < at) {
                self.pending.pop_front();
            }
            if self.pending.front().is_some_and(|(p, _)| *p == at) {
                if let Some((_, changes)) = self.pending.pop_front() {
                    if d.committed() {
                        d.set_changes(changes);
                    }
                }
            }
            out.push(d);
        }
        Ok(out)
    }

    /// Begins a transaction on the latest committed state. `isolation`:
    /// 0 snapshot isolation, 1 repeatable read, 2 serializable.
    pub fn begin(&self, isolation: u8) -> Result<Txn, JsValue> {
        let iso = match isolation {
            0 => Isolation::SnapshotIsolation,
            1 => Isolation::RepeatableRead,
            2 => Isolation::Serializable,
            _ => {
                return Err(js_error(
                    "MeldArgumentError",
                    "Isolation",
                    format!("isolation {isolation} is not 0, 1 or 2"),
                ))
            }
        };
        Ok(Txn::new(melddb::Transaction::begin(self.melder.lcs(), iso)))
    }

    /// The latest committed state.
    pub fn snapshot(&self) -> Snap {
        Snap::new(self.melder.lcs().clone())
    }

    /// Keeps the state at each checkpoint begin record melded from now on
    /// (for [`Node::checkpoint`]), or stops and drops the one kept.
    #[wasm_bindgen(js_name = keepBegin)]
    pub fn keep_begin(&mut self, on: bool) {
        self.keep_begin = on;
        if !on {
            self.last_begin = None;
        }
    }

    /// The position of the latest checkpoint begin record kept (see
    /// [`Node::keep_begin`]), if any: where [`Node::checkpoint`] encodes a
    /// state.
    #[wasm_bindgen(js_name = lastBegin)]
    pub fn last_begin(&self) -> Option<f64> {
        self.last_begin.as_ref().map(|s| s.pos() as f64)
    }

    /// Encodes the state at [`Node::last_begin`] as checkpoint parts of at
    /// most `part_bytes` of body each, returned as one buffer: per part a
    /// u32 little-endian length and the part (the records a
    /// `CheckpointLoader` takes back).
    pub fn checkpoint(&self, part_bytes: u32) -> Result<Vec<u8>, JsValue> {
        let state = self.last_begin.as_ref().ok_or_else(|| {
            js_error(
                "MeldStateError",
                "NoBegin",
                "no checkpoint begin record was melded yet; append one first",
            )
        })?;
        let size = (part_bytes as usize).clamp(1024, melddb::checkpoint::MAX_PART_BYTES);
        let parts = melddb::checkpoint::encode(self.melder.settings(), state, size)
            .map_err(|e| js_error("MeldStorageError", "Checkpoint", e))?;
        let mut out = Vec::with_capacity(parts.iter().map(|p| p.len() + 4).sum());
        for p in parts {
            out.extend_from_slice(&(p.len() as u32).to_le_bytes());
            out.extend_from_slice(&p);
        }
        Ok(out)
    }

    /// A checkpoint begin record of this database: appended to the log,
    /// it is a barrier every node melds alike, and a state a node can
    /// checkpoint locally.
    #[wasm_bindgen(js_name = beginRecord)]
    pub fn begin_record(&self) -> Vec<u8> {
        melddb::checkpoint::begin_record(self.melder.settings().db_id)
    }
}

impl Node {
    pub(crate) fn with_melder(melder: Melder) -> Node {
        Node {
            melder,
            track: false,
            pending: VecDeque::new(),
            last_begin: None,
            keep_begin: false,
        }
    }

    /// What `bytes` would change if it commits: its puts, and its deletes
    /// of keys present in the latest state (a delete of an absent key
    /// changed nothing). Empty for bytes that are not an intention. For
    /// the second entry of a group-meld pair the latest state is the one
    /// before the pair; that is the same answer, since the second commits
    /// only if it writes no key the first wrote.
    fn changes(&self, bytes: &[u8]) -> Changes {
        let Ok(parsed) = melddb::parse(bytes) else {
            return Vec::new();
        };
        let lcs = self.melder.lcs();
        parsed
            .changes()
            .into_iter()
            .filter(|(k, v)| v.is_some() || matches!(lcs.get(k), Ok(Some(_))))
            .map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec)))
            .collect()
    }
}
