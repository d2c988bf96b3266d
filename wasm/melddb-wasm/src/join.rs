//! Joining a long log from a published checkpoint: the JavaScript host
//! reads the companion log `LOG.ckpt`, parses its newest pointers here
//! ([`Published`]), reads the parts one names from the log and hands them
//! to a [`CheckpointLoader`], which verifies and loads them into a node
//! that melds on from the entry after the checkpoint's begin record.

use melddb::checkpoint::{self, Pointer, Record};
use melddb::Melder;
use wasm_bindgen::prelude::*;

use crate::errors::js_error;
use crate::Node;

/// A checkpoint pointer read from a log's companion log `LOG.ckpt`.
#[wasm_bindgen]
pub struct Published {
    ptr: Pointer,
}

#[wasm_bindgen]
impl Published {
    /// Parses one record of the companion log: `undefined` for anything
    /// that is not a well-formed pointer (such a record is skipped, never
    /// trusted).
    pub fn parse(bytes: &[u8]) -> Option<Published> {
        Pointer::decode(bytes).map(|ptr| Published { ptr })
    }
    /// Position of the checkpoint's begin record in the log.
    #[wasm_bindgen(getter)]
    pub fn begin(&self) -> f64 {
        self.ptr.begin as f64
    }
    /// Positions of its parts in the log, increasing.
    #[wasm_bindgen(getter)]
    pub fn parts(&self) -> Vec<f64> {
        self.ptr.parts.iter().map(|&p| p as f64).collect()
    }
}

/// Collects the parts of one checkpoint, in order, and loads them into a
/// node: the parts a [`Published`] pointer names, or those of a checkpoint
/// the host saved itself ([`CheckpointLoader::saved`]).
#[wasm_bindgen]
pub struct CheckpointLoader {
    ptr: Pointer,
    /// Whether `ptr.db_id` is known (a saved checkpoint's is not checked
    /// against a pointer).
    check_db: bool,
    parts: Vec<Vec<u8>>,
}

fn bad_checkpoint(why: String) -> JsValue {
    js_error("MeldLogError", "Checkpoint", why)
}

#[wasm_bindgen]
impl CheckpointLoader {
    /// A loader for the checkpoint `published` names.
    #[wasm_bindgen(constructor)]
    pub fn new(published: &Published) -> CheckpointLoader {
        CheckpointLoader {
            ptr: published.ptr.clone(),
            check_db: true,
            parts: Vec::new(),
        }
    }

    /// A loader for a checkpoint of `count` parts begun at `begin` that the
    /// host saved from [`Node::checkpoint`].
    pub fn saved(begin: f64, count: u32) -> Result<CheckpointLoader, JsValue> {
        if count == 0 || u64::from(count) > checkpoint::MAX_PARTS {
            return Err(bad_checkpoint(format!(
                "a checkpoint has 1 to {} parts, not {count}",
                checkpoint::MAX_PARTS
            )));
        }
        Ok(CheckpointLoader {
            ptr: Pointer {
                db_id: 0,
                begin: begin as u64,
                parts: vec![0; count as usize],
            },
            check_db: false,
            parts: Vec::new(),
        })
    }

    /// Adds the next part (the log entry at the next position of
    /// `parts`); fails if it is not the next part of this checkpoint.
    pub fn add(&mut self, bytes: Vec<u8>) -> Result<(), JsValue> {
        let index = self.parts.len() as u64;
        let at = self.ptr.parts.get(self.parts.len()).copied();
        match (at, checkpoint::parse_record(&bytes)) {
            (
                Some(_),
                Ok(Record::Part {
                    begin, index: i, ..
                }),
            ) if begin == self.ptr.begin && i == index => {}
            (at, _) => {
                return Err(bad_checkpoint(format!(
                    "{} is not part {index} of the checkpoint begun at {}",
                    at.map_or_else(
                        || "a record past the last part".to_owned(),
                        |p| format!("entry {p}")
                    ),
                    self.ptr.begin
                )))
            }
        }
        self.parts.push(bytes);
        Ok(())
    }

    /// Loads the parts added (every check of the core's checkpoint
    /// loader, the state digest included, and that they hold the state at
    /// the pointer's begin record of the pointer's database) into a node
    /// whose next entry is the one after the begin record. The loader is
    /// empty afterwards.
    pub fn finish(&mut self) -> Result<Node, JsValue> {
        let parts = std::mem::take(&mut self.parts);
        if parts.len() != self.ptr.parts.len() {
            return Err(bad_checkpoint(format!(
                "{} of the {} parts of the checkpoint begun at {} were added",
                parts.len(),
                self.ptr.parts.len(),
                self.ptr.begin
            )));
        }
        let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        let loaded = checkpoint::load(&refs).map_err(|e| bad_checkpoint(e.to_string()))?;
        if loaded.state.pos() != self.ptr.begin {
            return Err(bad_checkpoint(format!(
                "its parts hold the state at {}, not at {}",
                loaded.state.pos(),
                self.ptr.begin
            )));
        }
        if self.check_db && loaded.settings.db_id != self.ptr.db_id {
            return Err(bad_checkpoint(
                "its parts belong to another database".to_owned(),
            ));
        }
        Ok(Node::with_melder(Melder::from_checkpoint(loaded)))
    }
}
