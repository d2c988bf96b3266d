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
//! The pointer record is `melddb::checkpoint::Pointer`.

pub(crate) use melddb::checkpoint::Pointer;
use melddb::checkpoint::{self, Loaded};
use melddb::LogPos;
use melddb_log::{Client, ClientError};

/// Pointers looked at, newest first, before a joiner gives up on
/// published checkpoints and replays from genesis.
pub(crate) const TRIES: u64 = 4;

/// The companion log holding `log`'s checkpoint pointers, if its name
/// fits the service's 64-character limit.
pub(crate) fn companion(log: &str) -> Option<String> {
    let name = format!("{log}.ckpt");
    melddb_log::store::check_log_name(&name).ok().map(|_| name)
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
    fn the_companion_log_is_named_after_the_log_when_the_name_fits() {
        assert_eq!(companion("bank").as_deref(), Some("bank.ckpt"));
        assert_eq!(companion(&"x".repeat(60)), None);
    }
}
