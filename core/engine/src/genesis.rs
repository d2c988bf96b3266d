//! The genesis record: the first log entry, fixing the database's settings.
//! Anything that changes node identities or decisions is a setting here,
//! never a local option, so every node computes the same states.

use integer_encoding::VarInt;

use crate::error::{DecodeError, OpenError};

/// Magic bytes of the genesis record.
pub const GENESIS_MAGIC: &[u8; 4] = b"MLDG";
/// Genesis format version written by this build (version 1, without the
/// pipeline settings, is still read: it means no premeld and no group meld).
pub const GENESIS_VERSION: u8 = 2;
/// Largest accepted [`Settings::premeld_threads`].
pub const MAX_PREMELD_THREADS: u32 = 64;
/// Largest accepted [`Settings::premeld_distance`].
pub const MAX_PREMELD_DISTANCE: u32 = 4096;
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
    /// Premeld threads `t` (Hyder II §3.4); 0 turns premeld off. Together
    /// with [`Settings::premeld_distance`] it fixes the state each intention
    /// is premelded against (`v - t*d - 1`), hence node identities, so it is
    /// a database setting and not a local option.
    pub premeld_threads: u32,
    /// Premeld distance `d` (Hyder II §3.4); must be at least 1 when premeld is on.
    pub premeld_distance: u32,
    /// Group meld (Hyder II §4): adjacent intentions (odd, even) are combined
    /// and melded as one, sharing their fate.
    pub group_meld: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            db_id: 0,
            max_conflict_zone: DEFAULT_MAX_CONFLICT_ZONE,
            premeld_threads: 0,
            premeld_distance: 0,
            group_meld: false,
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
        if self.premeld_threads > MAX_PREMELD_THREADS {
            return Err(OpenError::Setting {
                name: "premeld_threads",
                why: "must be at most 64",
            });
        }
        if self.premeld_threads > 0 {
            if self.premeld_distance == 0 || self.premeld_distance > MAX_PREMELD_DISTANCE {
                return Err(OpenError::Setting {
                    name: "premeld_distance",
                    why: "must be between 1 and 4096 when premeld is on",
                });
            }
            if self.premeld_lag() >= self.max_conflict_zone as u64 {
                return Err(OpenError::Setting {
                    name: "premeld_threads",
                    why: "premeld_threads * premeld_distance + 1 must be below max_conflict_zone, \
                          or the premeld input state would not be retained",
                });
            }
        }
        Ok(())
    }

    /// Whether premeld is on.
    pub fn premeld(&self) -> bool {
        self.premeld_threads > 0
    }

    /// `t*d + 1`: how far behind an intention its premeld input state is.
    pub fn premeld_lag(&self) -> u64 {
        self.premeld_threads as u64 * self.premeld_distance as u64 + 1
    }

    /// Encodes the genesis record.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(32);
        out.extend_from_slice(GENESIS_MAGIC);
        out.push(GENESIS_VERSION);
        out.extend_from_slice(&self.db_id.encode_var_vec());
        out.extend_from_slice(&(self.max_conflict_zone as u64).encode_var_vec());
        out.extend_from_slice(&(self.premeld_threads as u64).encode_var_vec());
        out.extend_from_slice(&(self.premeld_distance as u64).encode_var_vec());
        out.push(u8::from(self.group_meld));
        let crc = crc32fast::hash(&out);
        out.extend_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes and validates a genesis record.
    pub fn decode(bytes: &[u8]) -> Result<Settings, DecodeError> {
        let body = crate::codec::checked_body(bytes, GENESIS_MAGIC, "genesis", 9)?;
        let version = body[4];
        if version != 1 && version != GENESIS_VERSION {
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
        let (mut threads, mut distance) = (0, 0);
        if version >= 2 {
            threads = next("premeld_threads")?;
            distance = next("premeld_distance")?;
        }
        let group = match (version, body.get(at)) {
            (1, _) => false,
            (_, Some(0)) => {
                at += 1;
                false
            }
            (_, Some(1)) => {
                at += 1;
                true
            }
            _ => {
                return Err(DecodeError::Invalid {
                    field: "group_meld",
                    why: "must be 0 or 1",
                })
            }
        };
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
        let fits = |v: u64, limit: u32, field| {
            u32::try_from(v)
                .ok()
                .filter(|v| *v <= limit)
                .ok_or(DecodeError::Limit {
                    field,
                    value: v,
                    limit: limit as u64,
                })
        };
        let settings = Settings {
            db_id,
            max_conflict_zone: zone as u32,
            premeld_threads: fits(threads, MAX_PREMELD_THREADS, "premeld_threads")?,
            premeld_distance: fits(distance, MAX_PREMELD_DISTANCE, "premeld_distance")?,
            group_meld: group,
        };
        settings.validate().map_err(|_| DecodeError::Invalid {
            field: "premeld settings",
            why: "premeld distance is 0 or the premeld lag exceeds the conflict zone",
        })?;
        Ok(settings)
    }
}
