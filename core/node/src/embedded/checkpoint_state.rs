//! The state of checkpointing: when the next checkpoint is due, and the
//! one being written (its encoder thread and the parts it hands over).

use super::error::DbError;
use std::sync::mpsc::{Receiver, SyncSender};
use std::thread::JoinHandle;
use std::time::Instant;

use melddb::LogPos;

use super::stats::CheckpointInfo;

/// What the encoder thread hands over: a part, or its end.
pub(super) enum Piece {
    Part(Vec<u8>),
    Done(Result<Encoded, DbError>),
}

/// What the encoder thread reports once it handed out every part.
#[derive(Debug, Clone, Copy)]
pub(super) struct Encoded {
    pub(super) nodes: u64,
    pub(super) flushed: u64,
}

/// A checkpoint whose begin record is in the log and whose parts are not
/// all appended yet. The encoder thread hands parts over as it fills them
/// (at most two wait), so memory stays bounded whatever the state's size.
pub(super) struct InProgress {
    pub(super) begin: LogPos,
    pub(super) generation: u16,
    pub(super) csn: melddb::Vn,
    pub(super) started: Instant,
    pub(super) encoder: Option<JoinHandle<()>>,
    pub(super) parts: Option<Receiver<Piece>>,
    /// The encoder's end, received after its last part and not yet acted
    /// on ([`super::writer::Writer::finish_checkpoint`]).
    pub(super) done: Option<Result<Encoded, DbError>>,
    pub(super) bytes: u64,
    pub(super) waiters: Vec<SyncSender<Result<CheckpointInfo, DbError>>>,
}

impl InProgress {
    /// Stops the encoder (it sees the parts channel closed) and waits for it.
    pub(super) fn abandon(mut self) -> Vec<SyncSender<Result<CheckpointInfo, DbError>>> {
        self.parts = None;
        if let Some(h) = self.encoder.take() {
            let _ = h.join();
        }
        std::mem::take(&mut self.waiters)
    }
}

/// When and how checkpoints are written.
pub(super) struct CheckpointPlan {
    pub(super) every: u64,
    pub(super) part_bytes: usize,
    pub(super) trim: bool,
    pub(super) last: Option<CheckpointInfo>,
    pub(super) previous_first: Option<LogPos>,
    pub(super) appended: u64,
    /// Node store generation of the next checkpoint.
    pub(super) generation: u16,
    /// Node cache budget (0: off).
    pub(super) cache_bytes: u64,
}
