//! Committed states (snapshots) and ordered scans over trees.

use std::ops::Bound;

use crate::node::{find, guarded, Bytes, Link, LogPos, StoreError, Vn};
pub use crate::range::Order;

/// An immutable committed state of the database: the tree after melding the
/// log up to and including [`Snapshot::pos`]. Cheap to clone; holding one
/// keeps its nodes alive.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub(crate) root: Link,
    pub(crate) pos: LogPos,
    pub(crate) csn: Vn,
    pub(crate) db: u64,
}

impl Snapshot {
    /// Log position of the last entry melded into this state.
    pub fn pos(&self) -> LogPos {
        self.pos
    }
    /// Commit sequence number of this state (VN of its newest node).
    pub fn csn(&self) -> Vn {
        self.csn
    }
    /// Identifier of the database (from its genesis record).
    pub fn db_id(&self) -> u64 {
        self.db
    }
    /// Reads one key. Fails only with a node cache, when part of the
    /// tree could not be read back from the log.
    pub fn get(&self, key: &[u8]) -> Result<Option<Bytes>, StoreError> {
        guarded(|| find(&self.root, key).map(|n| n.val().clone()))
    }
    /// The pairs between `start` and `end` in `order`, at most `limit`,
    /// produced lazily: memory stays O(tree height) however long the
    /// range, and the iterator keeps this snapshot's state alive.
    pub fn range(
        &self,
        start: Bound<&[u8]>,
        end: Bound<&[u8]>,
        order: Order,
        limit: Option<usize>,
    ) -> crate::range_iter::Range {
        crate::range_iter::Range::new(&self.root, start, end, order, limit)
    }
    /// Number of keys (walks the whole tree).
    pub fn len(&self) -> Result<usize, StoreError> {
        fn count(t: &Link) -> usize {
            t.as_ref().map_or(0, |n| {
                n.with_body(|b| 1 + count(&b.left_link) + count(&b.right_link))
            })
        }
        guarded(|| count(&self.root))
    }
    /// Whether the state holds no key.
    pub fn is_empty(&self) -> bool {
        self.root.is_none()
    }
    /// Height of the tree (0 when empty).
    pub fn height(&self) -> u8 {
        crate::node::height(&self.root)
    }
    /// An estimate of the memory the state's tree holds, in bytes: every
    /// reachable node in memory plus the heap behind its key and value
    /// (values shared between versions are counted once per node, so this
    /// errs high). Stubs count as themselves (and their body if it is
    /// loaded); what only the log holds is not counted. Walks everything
    /// in memory.
    pub fn approx_bytes(&self) -> u64 {
        fn walk(t: &Link) -> u64 {
            t.as_ref().map_or(0, |n| {
                let own = n.approx_bytes();
                if n.is_stub() {
                    // Not `body()`: measuring is not a use.
                    return match n.loaded_body() {
                        None => own,
                        Some(b) => {
                            own + b.approx_bytes() + walk(&b.left_link) + walk(&b.right_link)
                        }
                    };
                }
                own + walk(&n.left_link) + walk(&n.right_link)
            })
        }
        walk(&self.root)
    }
    /// Every pair in key order.
    pub fn to_vec(&self) -> Result<Vec<(Bytes, Bytes)>, StoreError> {
        self.range(Bound::Unbounded, Bound::Unbounded, Order::Forward, None)
            .collect()
    }
}

/// A state digest: BLAKE3 over the reachable tree in pre-order, covering
/// every node's key, value, version number (identity), content and
/// structure versions, height and OldestDescendant, plus the state's log
/// position and CSN. Two nodes that melded the same log with the same
/// settings have equal digests; any divergence in contents, shape or node
/// identities changes it.
pub type Digest = [u8; 32];

impl Snapshot {
    /// The state digest (see [`Digest`]). Visits every node: O(n).
    /// Fails only with a node cache, when part of the tree could not be
    /// read back from the log.
    pub fn digest(&self) -> Result<Digest, StoreError> {
        let mut h = blake3::Hasher::new();
        h.update(b"melddb-state-digest-v1");
        h.update(&self.db.to_le_bytes());
        h.update(&self.pos.to_le_bytes());
        h.update(&self.csn.to_le_bytes());
        guarded(|| digest_tree(&self.root, &mut h))?;
        Ok(*h.finalize().as_bytes())
    }

    /// The state digest as 64 lowercase hex digits.
    pub fn digest_hex(&self) -> Result<String, StoreError> {
        Ok(hex(&self.digest()?))
    }
}

/// `bytes` as lowercase hex digits.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn digest_tree(t: &Link, h: &mut blake3::Hasher) {
    let Some(n) = t else {
        // An explicit marker for an empty subtree fixes the shape.
        h.update(&[0]);
        return;
    };
    h.update(&[1]);
    h.update(&(n.key.len() as u32).to_le_bytes());
    h.update(&n.key);
    // A stub's body is read back for the walk and not kept.
    n.with_body(|b| {
        h.update(&(b.payload.len() as u32).to_le_bytes());
        h.update(&b.payload);
        for v in [n.vn(), n.ncv(), n.nsv(), n.oldest_descendant()] {
            h.update(&v.to_le_bytes());
        }
        h.update(&[n.height]);
        digest_tree(&b.left_link, h);
        digest_tree(&b.right_link, h);
    });
}

#[cfg(test)]
mod tests {
    use crate::{Database, Isolation, Settings};

    #[test]
    fn approx_bytes_counts_every_node_and_its_heap() {
        let mut db = Database::create(Settings::default()).unwrap();
        assert_eq!(db.snapshot().approx_bytes(), 0);
        for chunk in 0..10u64 {
            let mut tx = db.begin(Isolation::Serializable);
            for i in 0..1000u64 {
                // 8-byte keys are stored inline; 100-byte values on the heap.
                tx.put(&(chunk * 1000 + i).to_be_bytes(), &[7u8; 100])
                    .unwrap();
            }
            assert!(db.commit(tx).unwrap().is_committed());
        }
        let node = std::mem::size_of::<crate::node::Node>() as u64 + 16;
        assert_eq!(db.snapshot().approx_bytes(), 10_000 * (node + 100 + 16));
    }
}
