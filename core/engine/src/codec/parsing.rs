//! Checking untrusted bytes: framing, checksum, limits and field validity,
//! without touching any tree.

use std::ops::Bound;

use integer_encoding::VarInt;

use super::{
    CHILD_CROSS, CHILD_LOCAL, CHILD_NONE, F_ALTERED, F_DEPENDS_ON_TREE, F_HAS_SCV, F_HAS_SSV,
    F_KNOWN, F_ONLY_READ, INTENTION_MAGIC, INTENTION_VERSION,
};
use crate::error::{
    DecodeError, MAX_INTENTION_BYTES, MAX_INTENTION_NODES, MAX_KEY_LEN, MAX_RANGES_PER_NODE,
    MAX_VALUE_LEN,
};
use crate::isolation::Isolation;
use crate::node::{Bytes, LogPos, Vn};
use crate::range::KeyRange;

/// A node as read from the bytes, before resolution.
#[derive(Debug, Clone)]
pub(crate) struct ParsedNode<'a> {
    pub(super) flags: u8,
    pub(super) kinds: [u8; 2],
    pub(super) key: &'a [u8],
    pub(super) value: Option<&'a [u8]>,
    pub(super) scv: Vn,
    pub(super) ssv: Vn,
    pub(super) cross: [Option<(Vn, &'a [u8])>; 2],
    pub(super) ranges: Vec<KeyRange>,
}

/// An intention record whose framing and fields have been validated.
#[derive(Debug, Clone)]
pub struct ParsedIntention<'a> {
    /// The writer's isolation level.
    pub isolation: Isolation,
    /// Log position of the last intention melded into the writer's snapshot.
    pub snapshot_pos: LogPos,
    /// CSN of the writer's snapshot.
    pub snapshot_csn: Vn,
    pub(crate) nodes: Vec<ParsedNode<'a>>,
    pub(crate) root: u8,
    pub(crate) root_cross: Option<(Vn, &'a [u8])>,
    pub(crate) deletes: Vec<(&'a [u8], Vn)>,
    pub(crate) header_ranges: Vec<KeyRange>,
    /// Bytes of node keys and altered values (payload, not metadata).
    pub payload_bytes: usize,
    /// Total encoded size.
    pub total_bytes: usize,
}

impl ParsedIntention<'_> {
    /// Number of tree nodes in the intention.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }
    /// Number of keys in the delete list.
    pub fn delete_count(&self) -> usize {
        self.deletes.len()
    }
    /// What the intention writes, in key order: `(key, Some(value))` for
    /// a key it puts, `(key, None)` for one it deletes. If it commits,
    /// these are its changes to the database; a deletion may name a key
    /// that was absent (one the transaction put and deleted itself).
    pub fn changes(&self) -> Vec<(&[u8], Option<&[u8]>)> {
        let mut out: Vec<(&[u8], Option<&[u8]>)> = self
            .nodes
            .iter()
            .filter_map(|n| n.value.map(|v| (n.key, Some(v))))
            .chain(self.deletes.iter().map(|&(k, _)| (k, None)))
            .collect();
        out.sort_by(|a, b| a.0.cmp(b.0));
        out
    }
    /// Average bytes per node that are not the node's own key or value:
    /// flags, versions, pointers, dependency ranges and the share of the
    /// header and delete list (the paper's "metadata per node", §4.3).
    pub fn metadata_bytes_per_node(&self) -> f64 {
        if self.nodes.is_empty() {
            return 0.0;
        }
        (self.total_bytes - self.payload_bytes) as f64 / self.nodes.len() as f64
    }
}

/// Reads fields from a record, never past its end (shared by the
/// intention and checkpoint decoders).
pub(crate) struct Reader<'a> {
    pub(crate) buf: &'a [u8],
    pub(crate) at: usize,
}

impl<'a> Reader<'a> {
    /// Bytes not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.at
    }
    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        let b = *self
            .buf
            .get(self.at)
            .ok_or(DecodeError::Truncated { field })?;
        self.at += 1;
        Ok(b)
    }
    pub(crate) fn varint(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        let rest = &self.buf[self.at..];
        if rest.is_empty() {
            return Err(DecodeError::Truncated { field });
        }
        match u64::decode_var(rest) {
            Some((v, n)) => {
                self.at += n;
                Ok(v)
            }
            None if rest.len() < 10 && rest.iter().all(|b| b & 0x80 != 0) => {
                Err(DecodeError::Truncated { field })
            }
            None => Err(DecodeError::BadVarint { field }),
        }
    }
    pub(crate) fn count(
        &mut self,
        field: &'static str,
        limit: usize,
    ) -> Result<usize, DecodeError> {
        let v = self.varint(field)?;
        if v > limit as u64 {
            return Err(DecodeError::Limit {
                field,
                value: v,
                limit: limit as u64,
            });
        }
        Ok(v as usize)
    }
    /// A length-prefixed byte string of at most `limit` bytes.
    pub(crate) fn bytes(
        &mut self,
        field: &'static str,
        limit: usize,
    ) -> Result<&'a [u8], DecodeError> {
        let len = self.count(field, limit)?;
        self.take(len, field)
    }
    /// The next `n` bytes.
    pub(crate) fn take(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.remaining() < n {
            return Err(DecodeError::Truncated { field });
        }
        let b = &self.buf[self.at..self.at + n];
        self.at += n;
        Ok(b)
    }
    /// Reads `csn - v` and returns `v`, which must lie in `1..=csn`.
    pub(super) fn version(&mut self, field: &'static str, csn: Vn) -> Result<Vn, DecodeError> {
        let d = self.varint(field)?;
        if d >= csn {
            return Err(DecodeError::Invalid {
                field,
                why: "version is not older than the snapshot",
            });
        }
        Ok(csn - d)
    }
    pub(super) fn bound(&mut self) -> Result<Bound<Bytes>, DecodeError> {
        Ok(match self.u8("range bound")? {
            0 => Bound::Unbounded,
            1 => Bound::Included(self.bytes("range key", MAX_KEY_LEN)?.into()),
            2 => Bound::Excluded(self.bytes("range key", MAX_KEY_LEN)?.into()),
            _ => {
                return Err(DecodeError::Invalid {
                    field: "range bound",
                    why: "unknown tag",
                })
            }
        })
    }
    pub(super) fn ranges(&mut self) -> Result<Vec<KeyRange>, DecodeError> {
        let n = self.count("range count", MAX_RANGES_PER_NODE)?;
        // Every range takes at least two bytes: never allocate more than the
        // remaining input could describe.
        let mut out = Vec::with_capacity(n.min((self.buf.len() - self.at) / 2));
        for _ in 0..n {
            let start = self.bound()?;
            let end = self.bound()?;
            out.push(KeyRange { start, end });
        }
        Ok(out)
    }
}

/// Checks a record's magic, minimum length and trailing CRC-32; returns the
/// bytes before the checksum.
pub(crate) fn checked_body<'a>(
    bytes: &'a [u8],
    magic: &[u8; 4],
    what: &'static str,
    min_len: usize,
) -> Result<&'a [u8], DecodeError> {
    if bytes.len() < 4 || &bytes[..4] != magic {
        return Err(DecodeError::BadMagic { what });
    }
    if bytes.len() < min_len {
        return Err(DecodeError::Truncated { field: what });
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    let mut crc_bytes = [0u8; 4];
    crc_bytes.copy_from_slice(crc);
    if crc32fast::hash(body) != u32::from_le_bytes(crc_bytes) {
        return Err(DecodeError::Checksum);
    }
    Ok(body)
}

/// Validates the framing, checksum, limits and fields of an intention record.
/// Never panics and never allocates more than the input size justifies.
pub fn parse(bytes: &[u8]) -> Result<ParsedIntention<'_>, DecodeError> {
    if bytes.len() > MAX_INTENTION_BYTES {
        return Err(DecodeError::Limit {
            field: "intention size",
            value: bytes.len() as u64,
            limit: MAX_INTENTION_BYTES as u64,
        });
    }
    let body = checked_body(bytes, INTENTION_MAGIC, "intention", 10)?;
    let mut r = Reader { buf: body, at: 4 };
    let version = r.u8("version")?;
    if version != INTENTION_VERSION {
        return Err(DecodeError::UnsupportedVersion {
            found: version,
            supported: INTENTION_VERSION,
        });
    }
    let isolation = Isolation::from_code(r.u8("isolation")?).ok_or(DecodeError::Invalid {
        field: "isolation",
        why: "unknown level",
    })?;
    let snapshot_pos = r.varint("snapshot position")?;
    let snapshot_csn = r.varint("snapshot csn")?;
    let count = r.count("node count", MAX_INTENTION_NODES)?;
    // A node takes at least four bytes.
    let mut nodes = Vec::with_capacity(count.min(body.len() / 4));
    let mut payload = 0usize;
    for _ in 0..count {
        let flags = r.u8("node flags")?;
        if flags & !F_KNOWN != 0 {
            return Err(DecodeError::Invalid {
                field: "node flags",
                why: "unknown flag bits",
            });
        }
        let kinds_byte = r.u8("child kinds")?;
        let kinds = [kinds_byte & 3, (kinds_byte >> 2) & 3];
        if kinds_byte >> 4 != 0 || kinds.contains(&3) {
            return Err(DecodeError::Invalid {
                field: "child kinds",
                why: "unknown child kind",
            });
        }
        let altered = flags & F_ALTERED != 0;
        if flags & F_HAS_SCV == 0 && !altered {
            return Err(DecodeError::Invalid {
                field: "node flags",
                why: "a node without a source version must be an insert",
            });
        }
        if flags & F_ONLY_READ != 0 && (altered || flags & F_HAS_SSV == 0) {
            return Err(DecodeError::Invalid {
                field: "node flags",
                why: "a read-only subtree cannot be altered and needs a structure version",
            });
        }
        let key = r.bytes("node key", MAX_KEY_LEN)?;
        let value = if altered {
            Some(r.bytes("node value", MAX_VALUE_LEN)?)
        } else {
            None
        };
        payload += key.len() + value.map_or(0, |v| v.len());
        let scv = if flags & F_HAS_SCV != 0 {
            r.version("scv", snapshot_csn)?
        } else {
            0
        };
        let ssv = if flags & F_HAS_SSV != 0 {
            r.version("ssv", snapshot_csn)?
        } else {
            0
        };
        let mut cross = [None, None];
        for (i, kind) in kinds.iter().enumerate() {
            if *kind == CHILD_CROSS {
                let vn = r.version("pointer", snapshot_csn)?;
                cross[i] = Some((vn, r.bytes("pointer key", MAX_KEY_LEN)?));
            }
        }
        let ranges = if flags & F_DEPENDS_ON_TREE != 0 {
            let rs = r.ranges()?;
            if rs.is_empty() {
                return Err(DecodeError::Invalid {
                    field: "dependency ranges",
                    why: "DependsOnTree without a range",
                });
            }
            rs
        } else {
            Vec::new()
        };
        nodes.push(ParsedNode {
            flags,
            kinds,
            key,
            value,
            scv,
            ssv,
            cross,
            ranges,
        });
    }
    let root = r.u8("root kind")?;
    let root_cross = match root {
        CHILD_NONE | CHILD_LOCAL => None,
        CHILD_CROSS => {
            let vn = r.version("root pointer", snapshot_csn)?;
            Some((vn, r.bytes("root pointer key", MAX_KEY_LEN)?))
        }
        _ => {
            return Err(DecodeError::Invalid {
                field: "root kind",
                why: "unknown kind",
            })
        }
    };
    if (root == CHILD_LOCAL) != (count > 0) {
        return Err(DecodeError::Invalid {
            field: "root kind",
            why: "a local root needs nodes, and nodes need a local root",
        });
    }
    let ndel = r.count("delete count", MAX_INTENTION_NODES)?;
    let mut deletes: Vec<(&[u8], Vn)> = Vec::with_capacity(ndel.min(body.len() / 2));
    for _ in 0..ndel {
        let k = r.bytes("deleted key", MAX_KEY_LEN)?;
        let scv = match r.varint("deleted scv")? {
            0 => 0,
            d if d - 1 < snapshot_csn => snapshot_csn - (d - 1),
            _ => {
                return Err(DecodeError::Invalid {
                    field: "deleted scv",
                    why: "version is not older than the snapshot",
                })
            }
        };
        if let Some((prev, _)) = deletes.last() {
            if *prev >= k {
                return Err(DecodeError::Invalid {
                    field: "delete list",
                    why: "keys not strictly ascending",
                });
            }
        }
        deletes.push((k, scv));
    }
    let header_ranges = r.ranges()?;
    if r.at != body.len() {
        return Err(DecodeError::Trailing(body.len() - r.at));
    }
    Ok(ParsedIntention {
        isolation,
        snapshot_pos,
        snapshot_csn,
        nodes,
        root,
        root_cross,
        deletes,
        header_ranges,
        payload_bytes: payload,
        total_bytes: bytes.len(),
    })
}
