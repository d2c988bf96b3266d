//! The genesis record: the first log entry, fixing the database's settings.
//! Anything that changes node identities or decisions is a setting here,
//! never a local option, so every node computes the same states.

use integer_encoding::VarInt;

use crate::error::{DecodeError, OpenError};

/// Magic bytes of the genesis record.
pub const GENESIS_MAGIC: &[u8; 4] = b"MLDG";
/// Genesis format version written by this build.
pub const GENESIS_VERSION: u8 = 1;
/// Default for [`Settings::max_conflict_zone`].
pub const DEFAULT_MAX_CONFLICT_ZONE: u32 = 1024;
/// Largest accepted [`Settings::max_conflict_zone`].
pub const MAX_CONFLICT_ZONE_LIMIT: u32 = 1 << 20;

/// Database-wide settings, recorded in the genesis record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Identifier of the database, chosen by its creator; snapshots carry it
    /// so a transaction cannot be committed to the wrong database.
    pub db_id: u64,
    /// Longest conflict zone accepted, in log entries (App. B). A
    /// transaction whose snapshot is older is aborted as `SnapshotTooOld`
    /// on every node. It also bounds the states and tombstones a node keeps.
    pub max_conflict_zone: u32,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            db_id: 0,
            max_conflict_zone: DEFAULT_MAX_CONFLICT_ZONE,
        }
    }
}

impl Settings {
    /// Checks that every setting is in its documented range.
    pub fn validate(&self) -> Result<(), OpenError> {
        if self.max_conflict_zone == 0 || self.max_conflict_zone > MAX_CONFLICT_ZONE_LIMIT {
            return Err(OpenError::Setting {
                name: "max_conflict_zone",
                why: "must be between 1 and 1048576",
            });
        }
        Ok(())
    }

    /// Encodes the genesis record.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32);
        out.extend_from_slice(GENESIS_MAGIC);
        out.push(GENESIS_VERSION);
        out.extend_from_slice(&self.db_id.encode_var_vec());
        out.extend_from_slice(&(self.max_conflict_zone as u64).encode_var_vec());
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes and validates a genesis record.
    pub fn decode(bytes: &[u8]) -> Result<Settings, DecodeError> {
        let body = crate::codec::checked_body(bytes, GENESIS_MAGIC, "genesis", 9)?;
        if body[4] != GENESIS_VERSION {
            return Err(DecodeError::UnsupportedVersion {
                found: body[4],
                supported: GENESIS_VERSION,
            });
        }
        let mut at = 5;
        let mut next = |field| -> Result<u64, DecodeError> {
            let (v, n) = u64::decode_var(&body[at..]).ok_or(DecodeError::BadVarint { field })?;
            at += n;
            Ok(v)
        };
        let db_id = next("db_id")?;
        let zone = next("max_conflict_zone")?;
        if at != body.len() {
            return Err(DecodeError::Trailing(body.len() - at));
        }
        if zone == 0 || zone > MAX_CONFLICT_ZONE_LIMIT as u64 {
            return Err(DecodeError::Limit {
                field: "max_conflict_zone",
                value: zone,
                limit: MAX_CONFLICT_ZONE_LIMIT as u64,
            });
        }
        Ok(Settings {
            db_id,
            max_conflict_zone: zone as u32,
        })
    }
}
