//! Checkpoint pointers: the records of a shared log's companion log
//! (`LOG.ckpt`) that name a published checkpoint, so that a joining node
//! finds it without scanning the log (`docs/format.md`, "Checkpoint
//! pointers"). Pointer record (little-endian): `MLDP`, version 1, `db_id`
//! u64, begin u64, part count u32, each part's position u64, CRC-32 of
//! everything before it.

use super::MAX_PARTS;
use crate::node::LogPos;

const MAGIC: &[u8; 4] = b"MLDP";
const VERSION: u8 = 1;

/// A published checkpoint: its begin record's position and its parts'.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pointer {
    /// The database's identifier (the genesis record's).
    pub db_id: u64,
    /// Position of the checkpoint's begin record.
    pub begin: LogPos,
    /// Positions of its parts, increasing, after `begin`.
    pub parts: Vec<LogPos>,
}

impl Pointer {
    /// The pointer's record bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(25 + 8 * self.parts.len());
        out.extend_from_slice(MAGIC);
        out.push(VERSION);
        out.extend_from_slice(&self.db_id.to_le_bytes());
        out.extend_from_slice(&self.begin.to_le_bytes());
        out.extend_from_slice(&(self.parts.len() as u32).to_le_bytes());
        for p in &self.parts {
            out.extend_from_slice(&p.to_le_bytes());
        }
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Parses a pointer; `None` for anything else (a stranger's record is
    /// skipped, never trusted).
    pub fn decode(b: &[u8]) -> Option<Pointer> {
        let (body, crc) = b.split_at_checked(b.len().checked_sub(4)?)?;
        if crc32fast::hash(body).to_le_bytes() != crc[..] {
            return None;
        }
        let rest = body.strip_prefix(MAGIC)?.strip_prefix(&[VERSION])?;
        let u64_at = |i: usize| -> Option<u64> {
            Some(u64::from_le_bytes(rest.get(i..i + 8)?.try_into().ok()?))
        };
        let db_id = u64_at(0)?;
        let begin = u64_at(8)?;
        let count = u32::from_le_bytes(rest.get(16..20)?.try_into().ok()?) as usize;
        if rest.len() != 20 + 8 * count || count == 0 || count as u64 > MAX_PARTS {
            return None;
        }
        let parts: Option<Vec<u64>> = (0..count).map(|i| u64_at(20 + 8 * i)).collect();
        let parts = parts?;
        // Parts come after their begin record, in log order.
        if parts[0] <= begin || parts.windows(2).any(|w| w[0] >= w[1]) {
            return None;
        }
        Some(Pointer {
            db_id,
            begin,
            parts,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointers_round_trip_and_anything_else_is_refused() {
        let p = Pointer {
            db_id: 7,
            begin: 100,
            parts: vec![101, 105, 300],
        };
        let b = p.encode();
        assert_eq!(Pointer::decode(&b), Some(p.clone()));
        // Every single-byte change and every truncation is refused.
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x40;
            assert_eq!(Pointer::decode(&c), None, "byte {i}");
            assert_eq!(Pointer::decode(&b[..i]), None, "cut at {i}");
        }
        for bad in [
            Pointer {
                parts: vec![],
                ..p.clone()
            },
            Pointer {
                parts: vec![100],
                ..p.clone()
            },
            Pointer {
                parts: vec![101, 101],
                ..p.clone()
            },
        ] {
            assert_eq!(Pointer::decode(&bad.encode()), None, "{bad:?}");
        }
    }
}
