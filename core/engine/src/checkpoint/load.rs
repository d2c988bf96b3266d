//! Rebuilding a state from a checkpoint's parts, whole or lazily (with
//! stubs read back through a node store).

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::codec::Reader;
use crate::error::{CheckpointError, DecodeError};
use crate::genesis::Settings;
use crate::node::{Bytes, Link, LogPos, NodeAddr, NodeStore, Owner, OwnerKind, Vn, NO_LOGGED_NODE};
use crate::snapshot::{Digest, Snapshot};

use super::node_record::{stub_from, Built, NodeRecord};
use super::{parse_record, Record};

/// A checkpoint rebuilt from its parts.
#[derive(Debug, Clone)]
pub struct Loaded {
    /// The database settings recorded in it.
    pub settings: Settings,
    /// The state at the checkpoint's begin record.
    pub state: Snapshot,
    /// Nodes rebuilt.
    pub nodes: u64,
}

/// Rebuilds the state of a complete checkpoint from its parts, in order,
/// entirely in memory. Verifies every part, that they belong together,
/// every node's checksum, the tree (key order, AVL balance, depth,
/// OldestDescendant, child offsets), the body checksum and the recorded
/// digest. Never panics.
pub fn load(parts: &[&[u8]]) -> Result<Loaded, CheckpointError> {
    load_with(parts.iter().map(|p| Ok::<_, CheckpointError>(*p)), None)
}

/// Like [`load`], but keeps no node in memory: it verifies the parts as
/// they come (every node's checksum and place in the tree, the body
/// checksum; not the digest, which needs the whole tree) and returns a
/// state whose root is a stub read back through `store` from checkpoint
/// `generation` (the host maps that number to these parts). Parts may be
/// read one at a time: none is kept after it was parsed.
pub fn load_lazy<B: AsRef<[u8]>, E>(
    parts: impl IntoIterator<Item = Result<B, E>>,
    store: Arc<dyn NodeStore>,
    generation: u16,
) -> Result<Loaded, CheckpointError>
where
    CheckpointError: From<E>,
{
    load_with(parts, Some((store, generation)))
}

pub(super) fn load_with<B: AsRef<[u8]>, E>(
    parts: impl IntoIterator<Item = Result<B, E>>,
    lazy: Option<(Arc<dyn NodeStore>, u16)>,
) -> Result<Loaded, CheckpointError>
where
    CheckpointError: From<E>,
{
    let mut loader = Loader {
        lazy,
        buf: Vec::new(),
        consumed: 0,
        crc: crc32fast::Hasher::new(),
        head: None,
        stack: Vec::new(),
        owners: BTreeMap::new(),
        nodes: 0,
        trailer: None,
    };
    let mut first: Option<(u64, LogPos)> = None;
    let mut done = false;
    for (i, p) in parts.into_iter().enumerate() {
        let p = p?;
        let p = p.as_ref();
        let i = i as u64;
        if done {
            return Err(CheckpointError::Incomplete {
                index: i,
                why: "parts after the last part",
            });
        }
        let rec = parse_record(p).map_err(|e| CheckpointError::Part {
            index: i,
            source: e,
        })?;
        let Record::Part {
            db_id,
            begin,
            index,
            last,
            chunk,
        } = rec
        else {
            return Err(CheckpointError::Incomplete {
                index: i,
                why: "a begin record where a part was expected",
            });
        };
        if index != i {
            return Err(CheckpointError::Incomplete {
                index: i,
                why: "parts are not the parts of one checkpoint, in order",
            });
        }
        if *first.get_or_insert((db_id, begin)) != (db_id, begin) {
            return Err(CheckpointError::Incomplete {
                index: i,
                why: "parts belong to different checkpoints",
            });
        }
        loader.feed(chunk, last)?;
        done = last;
    }
    let Some((db_id, begin)) = first else {
        return Err(CheckpointError::Incomplete {
            index: 0,
            why: "no parts",
        });
    };
    if !done {
        return Err(CheckpointError::Incomplete {
            index: 0,
            why: "the last part is missing",
        });
    }
    loader.finish(db_id, begin)
}

pub(super) struct Loader {
    pub(super) lazy: Option<(Arc<dyn NodeStore>, u16)>,
    /// Body bytes received and not yet parsed.
    pub(super) buf: Vec<u8>,
    /// Body offset of `buf[0]`.
    pub(super) consumed: u64,
    pub(super) crc: crc32fast::Hasher,
    /// Settings and CSN once the head is parsed.
    pub(super) head: Option<(Settings, Vn)>,
    pub(super) stack: Vec<Built>,
    pub(super) owners: BTreeMap<LogPos, Arc<Owner>>,
    pub(super) nodes: u64,
    /// The 48-byte trailer and CRC once the body ended.
    pub(super) trailer: Option<Vec<u8>>,
}

/// Node count (8), root offset (8), digest (32), then the body CRC (4).
pub(super) const TRAILER: usize = 8 + 8 + 32 + 4;

impl Loader {
    pub(super) fn feed(&mut self, chunk: &[u8], last: bool) -> Result<(), CheckpointError> {
        self.buf.extend_from_slice(chunk);
        if last && self.buf.len() < TRAILER {
            return Err(DecodeError::Truncated {
                field: "checkpoint trailer",
            }
            .into());
        }
        let mut at = 0usize;
        loop {
            // The last TRAILER bytes received may be the trailer, not node
            // records: hold them back until the body is complete.
            let avail = &self.buf[at..];
            let limit = avail.len().saturating_sub(TRAILER);
            if limit == 0 {
                break;
            }
            let window = &avail[..limit];
            let offset = self.consumed + at as u64;
            let Some((_, csn)) = &self.head else {
                let mut r = Reader { buf: window, at: 0 };
                let parsed = (|| {
                    let s = Settings::decode(r.bytes("checkpoint settings", 64)?)?;
                    let csn = r.varint("checkpoint csn")?;
                    Ok::<_, DecodeError>((s, csn))
                })();
                match parsed {
                    Ok(h) => {
                        self.head = Some(h);
                        at += r.at;
                        continue;
                    }
                    Err(DecodeError::Truncated { .. }) if !last => break,
                    Err(e) => return Err(e.into()),
                }
            };
            match NodeRecord::parse(window, offset, *csn) {
                Ok((rec, len)) => {
                    let owners = (self.lazy.is_none()).then_some(&mut self.owners);
                    push(&mut self.stack, owners, &rec, offset)?;
                    self.nodes += 1;
                    at += len;
                }
                Err(DecodeError::Truncated { .. }) if !last => break,
                Err(e) => return Err(e.into()),
            }
        }
        self.crc.update(&self.buf[..at]);
        self.buf.drain(..at);
        self.consumed += at as u64;
        if last {
            if self.buf.len() != TRAILER {
                return Err(DecodeError::Trailing(self.buf.len() - TRAILER).into());
            }
            self.trailer = Some(std::mem::take(&mut self.buf));
        }
        Ok(())
    }
}

/// Checks a parsed record against the subtrees on the loader's stack (its
/// children) and pushes its own.
pub(super) fn push(
    stack: &mut Vec<Built>,
    owners: Option<&mut BTreeMap<LogPos, Arc<Owner>>>,
    rec: &NodeRecord<'_>,
    offset: u64,
) -> Result<(), CheckpointError> {
    let bad = |why| CheckpointError::Body(DecodeError::BadTree { why });
    let mut pop = |want: Option<u64>| -> Result<Option<Built>, CheckpointError> {
        let Some(o) = want else { return Ok(None) };
        let b = stack.pop().ok_or_else(|| bad("child missing"))?;
        if b.offset != o {
            return Err(bad("child offset does not match the child"));
        }
        Ok(Some(b))
    };
    let right = pop(rec.right)?;
    let left = pop(rec.left)?;
    let key = Bytes::from(rec.key);
    if left.as_ref().is_some_and(|l| l.max[..] >= key[..])
        || right.as_ref().is_some_and(|r| r.min[..] <= key[..])
    {
        return Err(bad("keys out of order"));
    }
    let (hl, hr) = (
        left.as_ref().map_or(0, |b| b.height),
        right.as_ref().map_or(0, |b| b.height),
    );
    if hl.abs_diff(hr) > 1 {
        return Err(bad("unbalanced subtree"));
    }
    if rec.height != hl.max(hr) + 1 {
        return Err(bad("recorded height is not the subtree's"));
    }
    let f = |b: &Option<Built>| b.as_ref().map_or(NO_LOGGED_NODE, |b| b.oldest);
    let oldest = rec
        .origin
        .unwrap_or(NO_LOGGED_NODE)
        .min(f(&left))
        .min(f(&right));
    if oldest != rec.oldest {
        return Err(bad("recorded OldestDescendant is not the subtree's"));
    }
    let min = left.as_ref().map_or_else(|| key.clone(), |l| l.min.clone());
    let max = right
        .as_ref()
        .map_or_else(|| key.clone(), |r| r.max.clone());
    // Kept in memory (a full load): one owner per origin, shared.
    let node = owners.map(|owners| {
        let owner = rec.origin.map(|p| {
            owners
                .entry(p)
                .or_insert_with(|| Owner::new(OwnerKind::Intention(p), 0))
                .clone()
        });
        let l = left.and_then(|b| b.node);
        let r = right.and_then(|b| b.node);
        Arc::new(rec.node(owner, l, r, None))
    });
    stack.push(Built {
        node,
        key,
        vn: rec.vn,
        ncv: rec.ncv,
        nsv: rec.nsv,
        origin: rec.origin,
        height: rec.height,
        oldest: rec.oldest,
        offset,
        min,
        max,
    });
    Ok(())
}

impl Loader {
    pub(super) fn finish(mut self, db_id: u64, begin: LogPos) -> Result<Loaded, CheckpointError> {
        let Some((settings, csn)) = self.head.take() else {
            return Err(DecodeError::Truncated {
                field: "checkpoint head",
            }
            .into());
        };
        if settings.db_id != db_id {
            return Err(CheckpointError::Body(DecodeError::Invalid {
                field: "checkpoint settings",
                why: "db_id differs from the parts' db_id",
            }));
        }
        let t = self.trailer.take().unwrap_or_default();
        if t.len() != TRAILER {
            return Err(DecodeError::Truncated {
                field: "checkpoint trailer",
            }
            .into());
        }
        self.crc.update(&t[..TRAILER - 4]);
        if self.crc.clone().finalize().to_le_bytes()[..] != t[TRAILER - 4..] {
            return Err(CheckpointError::Body(DecodeError::Checksum));
        }
        let le = |b: &[u8]| {
            let mut x = [0u8; 8];
            x.copy_from_slice(b);
            u64::from_le_bytes(x)
        };
        let (count, root_offset) = (le(&t[..8]), le(&t[8..16]));
        let mut digest: Digest = [0; 32];
        digest.copy_from_slice(&t[16..48]);
        let bad = |why| CheckpointError::Body(DecodeError::BadTree { why });
        if count != self.nodes {
            return Err(bad("node count differs from the nodes found"));
        }
        let root = match (self.stack.pop(), self.stack.is_empty()) {
            (None, _) if count == 0 && root_offset == 0 => None,
            (Some(b), true) if b.offset == root_offset => Some(b),
            _ => return Err(bad("not exactly one root where the trailer says")),
        };
        let root: Link = match (root, &self.lazy) {
            (None, _) => None,
            (Some(b), None) => b.node,
            (Some(b), Some((store, generation))) => {
                let addr = NodeAddr::new(*generation, b.offset)
                    .ok_or_else(|| bad("checkpoint too large to address"))?;
                Some(stub_from(&b, addr, store.clone()))
            }
        };
        let state = Snapshot {
            root,
            pos: begin,
            csn,
            db: settings.db_id,
        };
        if self.lazy.is_none() && state.digest()? != digest {
            return Err(CheckpointError::Digest);
        }
        Ok(Loaded {
            settings,
            state,
            nodes: count,
        })
    }
}
