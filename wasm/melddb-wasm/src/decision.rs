//! The fate of one log entry as JavaScript sees it.

use melddb::{AbortReason, Outcome};
use wasm_bindgen::prelude::*;

/// What a committed entry changed: `(key, Some(value))` for a put,
/// `(key, None)` for a deletion of a present key, in key order.
pub(crate) type Changes = Vec<(Vec<u8>, Option<Vec<u8>>)>;

/// One decided log entry: committed or aborted, with the abort's reason.
#[wasm_bindgen]
#[derive(Debug, Clone)]
pub struct Decision {
    committed: bool,
    pos: u64,
    csn: u64,
    reason: Option<&'static str>,
    key: Option<Vec<u8>>,
    message: String,
    changes: Changes,
}

impl Decision {
    /// The decision for an outcome of [`melddb::Melder::apply`]; `None`
    /// for outcomes `apply` never gives (read-only, rejected).
    pub(crate) fn from_outcome(o: &Outcome) -> Option<Decision> {
        match o {
            Outcome::Committed { pos, csn } => Some(Decision {
                committed: true,
                pos: *pos,
                csn: *csn,
                reason: None,
                key: None,
                message: String::new(),
                changes: Vec::new(),
            }),
            Outcome::Aborted { pos, reason } => {
                let (code, key) = reason_parts(reason);
                Some(Decision {
                    committed: false,
                    pos: *pos,
                    csn: 0,
                    reason: Some(code),
                    key,
                    message: reason.to_string(),
                    changes: Vec::new(),
                })
            }
            Outcome::ReadOnly | Outcome::Rejected { .. } => None,
        }
    }

    pub(crate) fn set_changes(&mut self, changes: Changes) {
        self.changes = changes;
    }
}

/// An abort reason's code and the key it names, if it names one.
pub(crate) fn reason_parts(r: &AbortReason) -> (&'static str, Option<Vec<u8>>) {
    (r.code(), r.key().map(<[u8]>::to_vec))
}

#[wasm_bindgen]
impl Decision {
    /// Whether the entry committed.
    #[wasm_bindgen(getter)]
    pub fn committed(&self) -> bool {
        self.committed
    }
    /// The entry's log position.
    #[wasm_bindgen(getter)]
    pub fn pos(&self) -> f64 {
        self.pos as f64
    }
    /// The CSN of the state it committed (0 if aborted).
    #[wasm_bindgen(getter)]
    pub fn csn(&self) -> f64 {
        self.csn as f64
    }
    /// Why it aborted: `WriteWrite`, `ReadWrite`, `Phantom`,
    /// `SnapshotTooOld`, `SnapshotUnavailable` or `Malformed`.
    #[wasm_bindgen(getter)]
    pub fn reason(&self) -> Option<String> {
        self.reason.map(str::to_owned)
    }
    /// The conflicting key, when the reason names one.
    #[wasm_bindgen(getter)]
    pub fn key(&self) -> Option<Vec<u8>> {
        self.key.clone()
    }
    /// The reason in words.
    #[wasm_bindgen(getter)]
    pub fn message(&self) -> String {
        self.message.clone()
    }
    /// How many changes a committed entry made (filled only while the
    /// node is asked to track changes).
    #[wasm_bindgen(js_name = changeCount)]
    pub fn change_count(&self) -> usize {
        self.changes.len()
    }
    /// The key of change `i`.
    #[wasm_bindgen(js_name = changeKey)]
    pub fn change_key(&self, i: usize) -> Option<Vec<u8>> {
        self.changes.get(i).map(|c| c.0.clone())
    }
    /// The value change `i` stored (`undefined` for a deletion).
    #[wasm_bindgen(js_name = changeValue)]
    pub fn change_value(&self, i: usize) -> Option<Vec<u8>> {
        self.changes.get(i).and_then(|c| c.1.clone())
    }
}
