//! Published checkpoints of a shared log: how a node joins a long log
//! without replaying it from genesis.
//!
//! A checkpoint on a shared log is the engine's checkpoint records in the
//! log itself: a begin record (a barrier every node melds alike) and the
//! parts that encode the state at it, which any node could compute, since
//! that state is the same on every node. A node that publishes
//! (`Options::publish_checkpoints`) writes them, and once its own melding
//! shows the checkpoint complete it appends a *pointer* to the companion
//! log `LOG.ckpt`: the begin's position and every part's. A joining node
//! reads the latest pointer, fetches those parts, loads and verifies the
//! checkpoint (its digest included) and melds the log from the entry after
//! the begin record on.
//!
//! Pointer record (little-endian): `MLDP`, version 1, `db_id` u64, begin
//! u64, part count u32, each part's position u64, CRC-32 of everything
//! before it.

use melddb::checkpoint::{self, Loaded};
use melddb::LogPos;
use melddb_log::{Client, ClientError};

const MAGIC: &[u8; 4] = b"MLDP";
const VERSION: u8 = 1;

/// Pointers looked at, newest first, before a joiner gives up on
/// published checkpoints and replays from genesis.
pub(crate) const TRIES: u64 = 4;

/// The companion log holding `log`'s checkpoint pointers, if its name
/// fits the service's 64-character limit.
pub(crate) fn companion(log: &str) -> Option<String> {
    let name = format!("{log}.ckpt");
    melddb_log::store::check_log_name(&name).ok().map(|_| name)
}

/// A published checkpoint: its begin record's position and its parts'.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pointer {
    pub db_id: u64,
    pub begin: LogPos,
    pub parts: Vec<LogPos>,
}

impl Pointer {
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
        if rest.len() != 20 + 8 * count || count == 0 || count as u64 > checkpoint::MAX_PARTS {
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

/// The latest published checkpoint of `log` that loads and verifies, with
/// its pointer, or `None` when there is none (or none usable: each
/// skipped one is described in the second value). Checkpoints begun at or
/// before `have` (one the node already has) are not fetched.
pub(crate) async fn latest(
    client: &Client,
    log: &str,
    have: Option<LogPos>,
) -> Result<(Option<(Pointer, Loaded)>, Vec<String>), ClientError> {
    let mut skipped = Vec::new();
    let Some(comp) = companion(log) else {
        return Ok((None, skipped));
    };
    let (first, tail) = match client.bounds(&comp).await {
        Ok(b) => b,
        // A token that may read the log but not its companion: no
        // published checkpoint for this node; it replays from genesis.
        Err(ClientError::Server {
            code: melddb_log::protocol::Code::Forbidden | melddb_log::protocol::Code::Unauthorized,
            message,
            ..
        }) => {
            skipped.push(format!("{comp} is not readable with this token: {message}"));
            return Ok((None, skipped));
        }
        Err(e) => return Err(e),
    };
    let lowest = tail.saturating_sub(TRIES).max(first);
    for at in (lowest..tail).rev() {
        let rec = client.read(&comp, at).await?;
        let Some(ptr) = Pointer::decode(&rec) else {
            skipped.push(format!("{comp} entry {at} is not a checkpoint pointer"));
            continue;
        };
        if have.is_some_and(|h| ptr.begin <= h) {
            break;
        }
        match fetch(client, log, &ptr).await {
            Ok(loaded) => return Ok((Some((ptr, loaded)), skipped)),
            Err(why) => skipped.push(format!("checkpoint begun at {}: {why}", ptr.begin)),
        }
    }
    Ok((None, skipped))
}

/// Part reads a joining node keeps in flight.
const READS_AHEAD: usize = 8;

/// Reads the parts `ptr` names and loads them (every check of
/// `checkpoint::load`, the digest included, and that they are the
/// checkpoint of the begin record `ptr` names).
async fn fetch(client: &Client, log: &str, ptr: &Pointer) -> Result<Loaded, String> {
    let mut parts = Vec::with_capacity(ptr.parts.len());
    // Reads go out `READS_AHEAD` at a time on the one connection (a round
    // trip per part would dominate a join); each record must be the next
    // part of this checkpoint before more are read, so a pointer naming
    // other entries costs a few reads at most.
    let mut pending = std::collections::VecDeque::new();
    let mut ahead = ptr.parts.iter().copied();
    for (i, &p) in ptr.parts.iter().enumerate() {
        while pending.len() < READS_AHEAD {
            let Some(next) = ahead.next() else { break };
            let (c, l) = (client.clone(), log.to_string());
            pending.push_back(tokio::spawn(async move { c.read(&l, next).await }));
        }
        let read = pending
            .pop_front()
            .ok_or_else(|| format!("part {i} was never read"))?;
        let rec = read
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        match checkpoint::parse_record(&rec) {
            Ok(checkpoint::Record::Part { begin, index, .. })
                if begin == ptr.begin && index == i as u64 => {}
            _ => {
                return Err(format!(
                    "entry {p} is not part {i} of the checkpoint begun at {}",
                    ptr.begin
                ))
            }
        }
        parts.push(rec);
    }
    let refs: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
    let loaded = checkpoint::load(&refs).map_err(|e| e.to_string())?;
    if loaded.state.pos() != ptr.begin {
        return Err(format!(
            "its parts hold the state at {}, not at {}",
            loaded.state.pos(),
            ptr.begin
        ));
    }
    if loaded.settings.db_id != ptr.db_id {
        return Err("its parts belong to another database".into());
    }
    Ok(loaded)
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
        assert_eq!(companion("bank").as_deref(), Some("bank.ckpt"));
        assert_eq!(companion(&"x".repeat(60)), None);
    }
}
