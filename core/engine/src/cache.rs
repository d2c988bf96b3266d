//! The node cache's tree side: replacing persisted subtrees by stubs.
//!
//! Once a checkpoint is complete, every node it wrote has an address
//! ([`NodeAddr`]) and can leave memory: a *stub* keeps what meld and
//! navigation read on every visit (key, identity, versions, height,
//! OldestDescendant) and reads the rest (value, children) back from the
//! host's [`NodeStore`] on first use. A sweep builds a state with the
//! same node identities in which persisted subtrees are stubs; the host
//! calls it (through [`crate::Melder::evict`]) when the memory the tree
//! holds passes its budget.
//!
//! A stub reads from a complete checkpoint only: a checkpoint being
//! written records its addresses on the side, and the first sweep after it
//! is complete moves them in, after which the older checkpoint may go.
//!
//! Eviction is CLOCK-like: a loaded stub that was used since the last
//! sweep keeps its body for one more sweep (its used bit is cleared), an
//! unused one is replaced by a fresh, unloaded stub. Persisted nodes that
//! are plain (never evicted yet) become unloaded stubs at once.
//!
//! Determinism: identities, versions and shapes are unchanged, so meld
//! decides and builds exactly what it would have without the cache;
//! pointer comparisons fall back to VNs where a stub or a copy is
//! involved.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::node::{Extra, Link, Node, NodeAddr, NodeStore, StoreError, COPIED};

/// What one sweep did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Evicted {
    /// Plain persisted subtrees replaced by stubs.
    pub stubbed: u64,
    /// Loaded stubs whose body was dropped.
    pub unloaded: u64,
    /// Loaded stubs kept for one more sweep (used since the last one).
    pub kept: u64,
}

/// Returns `t` with persisted subtrees replaced by stubs (see the module
/// docs). `persisted` says whether a checkpoint generation is complete and
/// still readable; nodes of other generations stay in memory.
pub(crate) fn restub(t: &Link, cx: &mut Sweep<'_>) -> Link {
    let n = t.as_ref()?;
    // Window states share most of their nodes; sweep each node once so
    // the swept states share theirs too.
    let key = Arc::as_ptr(n) as usize;
    if let Some(done) = cx.memo.get(&key) {
        return done.clone();
    }
    let result = restub_node(t, n, cx);
    cx.memo.insert(key, result.clone());
    result
}

/// What a sweep needs and keeps.
pub(crate) struct Sweep<'a> {
    pub(crate) store: &'a Arc<dyn NodeStore>,
    pub(crate) persisted: &'a dyn Fn(u16) -> bool,
    pub(crate) out: Evicted,
    /// Swept results by the address of the node they replace (a lookup
    /// table only: never iterated, so its order decides nothing).
    pub(crate) memo: HashMap<usize, Link>,
}

fn restub_node(t: &Link, n: &Arc<Node>, cx: &mut Sweep<'_>) -> Link {
    let (store, persisted) = (cx.store, cx.persisted);
    if n.is_stub() {
        n.promote_addr(persisted);
        if !n.stub_loaded() {
            return t.clone();
        }
        let Some(Extra::Stub(s)) = n.extra.as_deref() else {
            return t.clone();
        };
        if !s.used.swap(false, Ordering::Relaxed) {
            cx.out.unloaded += 1;
            let addr = n.node_addr()?;
            return Some(n.to_stub(addr, store.clone(), crate::checkpoint::read_node));
        }
        cx.out.kept += 1;
        // Hot: keep the body, but sweep below it. A changed child needs a
        // new parent, so the stub gives way to a copy of its body.
        // Straight from the cell: `body()` would mark it used again.
        let Some(b) = s.body.get() else {
            return t.clone();
        };
        // The body's address matters when it is copied below.
        if let Some(a) = n.node_addr() {
            b.addr.store(a.raw(), Ordering::Relaxed);
        }
        let l = restub(&b.left_link, cx);
        let r = restub(&b.right_link, cx);
        if same_ptr(&l, &b.left_link) && same_ptr(&r, &b.right_link) {
            return t.clone();
        }
        return Some(copy_with(b, l, r));
    }
    if let Some(addr) = n.node_addr().filter(|a| persisted(a.generation())) {
        cx.out.stubbed += 1;
        return Some(n.to_stub(addr, store.clone(), crate::checkpoint::read_node));
    }
    let l = restub(&n.left_link, cx);
    let r = restub(&n.right_link, cx);
    if same_ptr(&l, &n.left_link) && same_ptr(&r, &n.right_link) {
        return t.clone();
    }
    Some(copy_with(n, l, r))
}

/// Moves the pending checkpoint addresses of every stub in memory under
/// `t` to where they read from (see [`crate::Melder::promote`]); walks
/// each node once (`seen`).
pub(crate) fn promote(
    t: &Link,
    persisted: &dyn Fn(u16) -> bool,
    seen: &mut std::collections::HashSet<usize>,
) {
    let Some(n) = t else { return };
    if !seen.insert(Arc::as_ptr(n) as usize) {
        return;
    }
    if n.is_stub() {
        n.promote_addr(persisted);
        if let Some(Extra::Stub(s)) = n.extra.as_deref() {
            if let Some(b) = s.body.get() {
                if let Some(a) = n.node_addr() {
                    b.addr.store(a.raw(), Ordering::Relaxed);
                }
                promote(&b.left_link, persisted, seen);
                promote(&b.right_link, persisted, seen);
            }
        }
        return;
    }
    promote(&n.left_link, persisted, seen);
    promote(&n.right_link, persisted, seen);
}

/// Pointer equality: here a stub must count as a change (for meld, which
/// compares identities, it is the same node).
fn same_ptr(a: &Link, b: &Link) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(x), Some(y)) => Arc::ptr_eq(x, y),
        _ => false,
    }
}

/// A copy of `n` (same identity and versions) with other children that
/// stand for the same subtrees.
fn copy_with(n: &Node, left: Link, right: Link) -> Arc<Node> {
    let vn = n.vn();
    let mut c = n.clone();
    c.vn_cache.store(vn, Ordering::Relaxed);
    c.left_link = left;
    c.right_link = right;
    c.flags |= COPIED;
    Arc::new(c)
}

/// A [`NodeStore`] over checkpoint bodies held in memory: for tests, and
/// for hosts without storage of their own that still want to exercise the
/// cache. Feed it the parts of each checkpoint with [`MemStore::add`].
#[derive(Debug, Default)]
pub struct MemStore {
    bodies: Mutex<BTreeMap<u16, Vec<u8>>>,
    reads: std::sync::atomic::AtomicU64,
    /// Live stubs per generation.
    pins: Mutex<BTreeMap<u16, u64>>,
}

impl MemStore {
    /// An empty store.
    pub fn new() -> MemStore {
        MemStore::default()
    }

    /// Registers the parts of checkpoint `generation` (as
    /// [`crate::checkpoint::encode_streaming`] produced them).
    pub fn add(&self, generation: u16, parts: &[Vec<u8>]) -> Result<(), crate::DecodeError> {
        let mut body = Vec::new();
        for p in parts {
            match crate::checkpoint::parse_record(p)? {
                crate::checkpoint::Record::Part { chunk, .. } => body.extend_from_slice(chunk),
                crate::checkpoint::Record::Begin { .. } => {
                    return Err(crate::DecodeError::Invalid {
                        field: "checkpoint part",
                        why: "a begin record among the parts",
                    })
                }
            }
        }
        self.bodies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(generation, body);
        Ok(())
    }

    /// Forgets checkpoint `generation` (as a trimmed log would).
    pub fn remove(&self, generation: u16) {
        self.bodies
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&generation);
    }

    /// Reads served so far.
    pub fn reads(&self) -> u64 {
        self.reads.load(Ordering::Relaxed)
    }

    /// Live stubs that read from `generation`.
    pub fn pins(&self, generation: u16) -> u64 {
        self.pins
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&generation)
            .copied()
            .unwrap_or(0)
    }
}

impl NodeStore for MemStore {
    fn read(&self, addr: NodeAddr, len: usize) -> Result<Vec<u8>, StoreError> {
        self.reads.fetch_add(1, Ordering::Relaxed);
        let bodies = self.bodies.lock().unwrap_or_else(|e| e.into_inner());
        let body = bodies.get(&addr.generation()).ok_or(StoreError::Read {
            addr,
            message: "no such checkpoint (trimmed?)".into(),
        })?;
        let from = usize::try_from(addr.offset())
            .ok()
            .filter(|&o| o < body.len())
            .ok_or(StoreError::Read {
                addr,
                message: "offset past the end of the checkpoint".into(),
            })?;
        Ok(body[from..body.len().min(from.saturating_add(len))].to_vec())
    }

    fn pin(&self, generation: u16) {
        *self
            .pins
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(generation)
            .or_default() += 1;
    }

    fn unpin(&self, generation: u16) {
        let mut pins = self.pins.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = pins.get_mut(&generation) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                pins.remove(&generation);
            }
        }
    }
}
