//! The intention codec: a compact, versioned, checksummed binary format
//! (specified in `docs/format.md`).
//!
//! Decoding happens in two steps. [`parse`] checks the framing, checksum,
//! limits and field validity of untrusted bytes without touching any tree.
//! `resolve` then turns the parsed nodes into tree nodes, resolving
//! cross-intention pointers and unaltered payloads against the snapshot the
//! writer read, and checks that the result is an ordered, balanced tree.
//! Both steps are pure functions of the log, so every node accepts or rejects
//! the same bytes with the same error.

mod parsing;
mod resolving;
mod writing;

pub(crate) use self::parsing::{checked_body, Reader};
pub use self::parsing::{parse, ParsedIntention};
pub use self::resolving::Intention;
pub(crate) use self::resolving::{from_local, resolve};
pub(crate) use self::writing::{encode, EncodeInput};

/// Magic bytes at the start of every intention record.
pub const INTENTION_MAGIC: &[u8; 4] = b"MLDI";
/// Intention format version written by this build.
pub const INTENTION_VERSION: u8 = 1;

const F_ALTERED: u8 = 1;
const F_DEPENDS_ON: u8 = 2;
const F_DEPENDS_ON_TREE: u8 = 4;
const F_ONLY_READ: u8 = 8;
const F_HAS_SCV: u8 = 16;
const F_HAS_SSV: u8 = 32;
const F_KNOWN: u8 = 63;

const CHILD_NONE: u8 = 0;
const CHILD_LOCAL: u8 = 1;
const CHILD_CROSS: u8 = 2;
