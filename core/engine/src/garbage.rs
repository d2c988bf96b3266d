//! Tree memory that meld no longer needs, kept for the host to free off
//! meld's critical path (see `Melder::set_deferred_reclaim`).

use crate::codec::Intention;
use crate::node::Link;

/// Tree memory that meld no longer needs: old states that left the
/// retention window and the intention nodes meld replaced. Dropping it frees
/// the nodes no other state shares; it is `Send`, so a host can free it on
/// another thread, off meld's critical path.
#[derive(Debug, Default)]
pub struct Garbage {
    pub(crate) roots: Vec<Link>,
    pub(crate) intentions: Vec<Intention>,
}

impl Garbage {
    /// Number of retired roots and intentions.
    pub fn len(&self) -> usize {
        self.roots.len() + self.intentions.len()
    }
    /// Whether there is nothing to free.
    pub fn is_empty(&self) -> bool {
        self.roots.is_empty() && self.intentions.is_empty()
    }
    /// Moves everything `other` holds into this one.
    pub fn append(&mut self, mut other: Garbage) {
        self.roots.append(&mut other.roots);
        self.intentions.append(&mut other.intentions);
    }
    /// Frees at most `n` of the retired roots and intentions, so a host
    /// can free in small steps between other work. Returns whether any
    /// remain.
    pub fn free_some(&mut self, n: usize) -> bool {
        for _ in 0..n {
            if self.roots.pop().is_none() && self.intentions.pop().is_none() {
                break;
            }
        }
        !self.is_empty()
    }
}

/// A cloned melder starts with no pending garbage: the memory belongs to
/// the original, and freeing it once is enough.
impl Clone for Garbage {
    fn clone(&self) -> Garbage {
        Garbage::default()
    }
}

/// Retired roots and intentions kept at most before the melder frees them
/// itself (about 500 commits' worth: each retires a root and an
/// intention). A host that frees in steps while idle relies on it under
/// constant load.
pub(crate) const MAX_RETIRED: usize = 1024;
