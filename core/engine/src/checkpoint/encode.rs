//! Writing a checkpoint: the state's nodes in post-order, cut into parts.

use std::sync::Arc;

use crate::error::CheckpointError;
use crate::genesis::Settings;
use crate::node::{take_store_error, LogPos, Node, NodeAddr, OwnerKind};
use crate::snapshot::Snapshot;

use super::node_record::{put, NodeRecord};
use super::{CHECKPOINT_MAGIC, CHECKPOINT_VERSION, KIND_PART, MAX_PARTS, MAX_PART_BYTES};

/// Encodes `state`, the state at the checkpoint's begin record (its
/// position is `state.pos()`), as parts of at most `part_bytes` of body
/// each, to be appended after the begin record in order (other entries may
/// come between them). The state's digest is recorded so a loader can
/// verify what it rebuilt. Holds the whole checkpoint in memory; hosts
/// with a node cache use [`encode_streaming`].
pub fn encode(
    settings: &Settings,
    state: &Snapshot,
    part_bytes: usize,
) -> Result<Vec<Vec<u8>>, CheckpointError> {
    let mut parts = Vec::new();
    encode_streaming(settings, state, part_bytes, None, |p| {
        parts.push(p);
        true
    })?;
    Ok(parts)
}

/// What [`encode_streaming`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Encoded {
    /// Parts handed to the sink.
    pub parts: u64,
    /// Nodes written.
    pub nodes: u64,
    /// Body bytes (all parts' chunks together).
    pub body_bytes: u64,
}

/// Encodes `state` like [`encode`], handing each part to `sink` as soon as
/// it is full, so at most about one part is held in memory (subtrees that
/// are stubs are read back one node at a time and not kept). `sink`
/// returns `false` to stop early (the checkpoint then stays incomplete).
///
/// With `generation`, every node written records its address in this
/// checkpoint (a [`NodeAddr`] of that generation), which is what lets the
/// node cache replace it by a stub once the checkpoint is complete.
pub fn encode_streaming(
    settings: &Settings,
    state: &Snapshot,
    part_bytes: usize,
    generation: Option<u16>,
    sink: impl FnMut(Vec<u8>) -> bool,
) -> Result<Encoded, CheckpointError> {
    // Loads below record their failures here; start clean.
    let digest = state.digest()?;
    let _ = take_store_error();
    let mut out = Chunker {
        db_id: settings.db_id,
        begin: state.pos,
        part_bytes: part_bytes.clamp(1, MAX_PART_BYTES),
        buf: Vec::new(),
        offset: 0,
        crc: crc32fast::Hasher::new(),
        index: 0,
        sink,
        stopped: false,
    };
    let genesis = settings.encode();
    let mut head = Vec::with_capacity(genesis.len() + 16);
    put(&mut head, genesis.len() as u64);
    head.extend_from_slice(&genesis);
    put(&mut head, state.csn);
    out.write(&head)?;
    let mut nodes = 0u64;
    let root = match &state.root {
        Some(n) => encode_node(n, &mut out, generation, &mut nodes)?.offset,
        None => 0,
    };
    let mut trailer = Vec::with_capacity(48);
    trailer.extend_from_slice(&nodes.to_le_bytes());
    trailer.extend_from_slice(&root.to_le_bytes());
    trailer.extend_from_slice(&digest);
    out.write(&trailer)?;
    if let Some(e) = take_store_error() {
        return Err(CheckpointError::Store(e));
    }
    let body_bytes = out.offset + 4;
    let parts = out.finish()?;
    Ok(Encoded {
        parts,
        nodes,
        body_bytes,
    })
}

/// Cuts the body into parts as it is written.
pub(super) struct Chunker<F: FnMut(Vec<u8>) -> bool> {
    pub(super) db_id: u64,
    pub(super) begin: LogPos,
    pub(super) part_bytes: usize,
    pub(super) buf: Vec<u8>,
    /// Body bytes written so far (the next record's offset).
    pub(super) offset: u64,
    pub(super) crc: crc32fast::Hasher,
    pub(super) index: u64,
    pub(super) sink: F,
    pub(super) stopped: bool,
}

impl<F: FnMut(Vec<u8>) -> bool> Chunker<F> {
    fn write(&mut self, bytes: &[u8]) -> Result<(), CheckpointError> {
        self.crc.update(bytes);
        self.buf.extend_from_slice(bytes);
        self.offset += bytes.len() as u64;
        self.emit_full()
    }

    /// Hands out full parts while more than a part is buffered (strictly
    /// more: the last part is never empty).
    fn emit_full(&mut self) -> Result<(), CheckpointError> {
        while self.buf.len() > self.part_bytes {
            let rest = self.buf.split_off(self.part_bytes);
            let chunk = std::mem::replace(&mut self.buf, rest);
            self.emit(&chunk, false)?;
        }
        Ok(())
    }

    fn emit(&mut self, chunk: &[u8], last: bool) -> Result<(), CheckpointError> {
        if self.index >= MAX_PARTS {
            return Err(CheckpointError::TooLarge { bytes: self.offset });
        }
        // A failed read-back means the bytes so far may be an empty
        // node's: never hand out a part built from them.
        if let Some(e) = take_store_error() {
            return Err(CheckpointError::Store(e));
        }
        if !self.stopped && !(self.sink)(frame(self.db_id, self.begin, self.index, last, chunk)) {
            self.stopped = true;
        }
        self.index += 1;
        if self.stopped {
            return Err(CheckpointError::Stopped);
        }
        Ok(())
    }

    fn finish(mut self) -> Result<u64, CheckpointError> {
        let crc = std::mem::take(&mut self.crc).finalize();
        self.buf.extend_from_slice(&crc.to_le_bytes());
        self.emit_full()?;
        let chunk = std::mem::take(&mut self.buf);
        self.emit(&chunk, true)?;
        Ok(self.index)
    }
}

pub(super) fn frame(db_id: u64, begin: LogPos, index: u64, last: bool, chunk: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(chunk.len() + 40);
    out.extend_from_slice(CHECKPOINT_MAGIC);
    out.push(CHECKPOINT_VERSION);
    out.push(KIND_PART);
    put(&mut out, db_id);
    put(&mut out, begin);
    put(&mut out, index);
    out.push(u8::from(last));
    out.extend_from_slice(chunk);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Where a written node's record is.
#[derive(Clone, Copy)]
pub(super) struct Written {
    pub(super) offset: u64,
}

/// Post-order (children before parents) so a full loader needs only a
/// stack; each record also names its children's offsets so a single node
/// can be read back alone.
pub(super) fn encode_node<F: FnMut(Vec<u8>) -> bool>(
    n: &Arc<Node>,
    out: &mut Chunker<F>,
    generation: Option<u16>,
    count: &mut u64,
) -> Result<Written, CheckpointError> {
    let (left, right, value) =
        n.with_body(|b| (b.left_link.clone(), b.right_link.clone(), b.payload.clone()));
    let l = match &left {
        Some(c) => Some(encode_node(c, out, generation, count)?),
        None => None,
    };
    let r = match &right {
        Some(c) => Some(encode_node(c, out, generation, count)?),
        None => None,
    };
    drop((left, right));
    let offset = out.offset;
    let rec = NodeRecord {
        key: &n.key,
        value: &value,
        vn: n.vn(),
        ncv: n.ncv(),
        nsv: n.nsv(),
        origin: match n.owner_kind() {
            OwnerKind::Intention(pos) => Some(pos),
            _ => None,
        },
        oldest: n.oldest,
        height: n.height,
        left: l.map(|w| w.offset),
        right: r.map(|w| w.offset),
    };
    out.write(&rec.encode(offset))?;
    if let Some(a) = generation.and_then(|g| NodeAddr::new(g, offset)) {
        n.record_addr(a);
    }
    *count += 1;
    Ok(Written { offset })
}
