//! Tree nodes, their meld metadata (meld paper §4, App. C) and node identity.
//!
//! Node identity is defined here and nowhere else: every node that is part of a
//! committed state has a *version number* (VN) that is unique in the database.
//! VNs are never stored per node in the log. A logged node belongs to an
//! [`Owner`] (the intention it was logged in) and has a 1-based post-order
//! sequence number inside it; its VN is `owner.base + seq`, where `base` is the
//! CSN of the state the owner was melded into (meld paper §4.1 and App. E). An
//! intention's CSN is therefore `base + node_count`, and the ephemeral nodes
//! created while melding intention `I` take `CSN(I) + k` for the k-th one. An
//! ephemeral node's VN is fixed when meld makes it, so it keeps no owner.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use crate::range::KeyRange;

/// A version number: the identity of a committed node. `0` means "none".
pub type Vn = u64;
/// A position in the shared log. Positions only grow and are never reused.
pub type LogPos = u64;
pub use crate::bytes::Bytes;
/// A child pointer: `None` is an empty subtree.
pub(crate) type Link = Option<Arc<Node>>;

/// What kind of container a node lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OwnerKind {
    /// Decoded from the intention at this log position.
    Intention(LogPos),
    /// Created by meld (memory only, deterministic). Such a node has no
    /// [`Owner`] object: [`Node::owner_kind`] reports this for `None`.
    Ephemeral,
    /// Created by a running transaction; not yet logged, has no VN.
    Local,
}

/// The container of a set of nodes; it fixes their VN base once melded.
#[derive(Debug)]
pub(crate) struct Owner {
    base: AtomicU64,
    pub(crate) kind: OwnerKind,
}

impl Owner {
    pub(crate) fn new(kind: OwnerKind, base: Vn) -> Arc<Owner> {
        Arc::new(Owner {
            base: AtomicU64::new(base),
            kind,
        })
    }
    /// Sets the VN base. Meld calls this once, before it compares any VN of the
    /// owner's nodes; it is a pure function of the log, so every node agrees.
    pub(crate) fn set_base(&self, base: Vn) {
        self.base.store(base, Ordering::Relaxed);
    }
    pub(crate) fn base(&self) -> Vn {
        self.base.load(Ordering::Relaxed)
    }
}

pub(crate) const ALTERED: u16 = 1;
pub(crate) const DEPENDS_ON: u16 = 2;
pub(crate) const DEPENDS_ON_TREE: u16 = 4;
pub(crate) const SUBTREE_ONLY_READ: u16 = 8;
/// Transaction-local only: a write (update, insert, delete, rotation) happened
/// at this node or below it. Encoded as the negation of SUBTREE_ONLY_READ.
pub(crate) const DIRTY: u16 = 16;
/// Decoded intention nodes only: the left (right) child is a node of the same
/// intention, not a pointer into the snapshot. Lets meld tell without
/// touching the (usually cold) child.
pub(crate) const LEFT_OWNED: u16 = 32;
pub(crate) const RIGHT_OWNED: u16 = 64;
/// A stub: a persisted subtree that is not in memory. Its key, versions,
/// height and OldestDescendant are here; children and value are read back
/// from a [`NodeStore`] on first use (see [`Node::body`]).
pub(crate) const STUB: u16 = 128;
/// A copy the node cache made of a node to put stubs under it: same
/// identity (VN and every version), different pointer. Lets [`same`]
/// know that pointer inequality does not mean different nodes.
pub(crate) const COPIED: u16 = 256;

/// `oldest` of a subtree that holds no logged node (only ephemeral ones).
pub const NO_LOGGED_NODE: LogPos = u64::MAX;

/// One node of the copy-on-write binary search tree.
///
/// `repr(C)` keeps what meld reads of a node in its first 80 bytes: on a
/// visit the key, children, versions, flags and height; on a subtree it
/// does not descend into but hangs under a new node, the reference count,
/// height and OldestDescendant. With the two reference counts in front,
/// that is the first 96 bytes of a 160-byte allocation, which starts at 0
/// or 32 modulo 64, so those fields always span exactly two cache lines.
/// OldestDescendant is among them because meld reads it from every new
/// node's untouched sibling: behind the payload it would cost a third
/// cache line on each of those reads.
#[derive(Debug)]
#[repr(C)]
pub struct Node {
    pub(crate) key: Bytes,
    /// Children. Read them through [`Node::left`] / [`Node::right`], which
    /// load a stub's; a stub's own are empty.
    pub(crate) left_link: Link,
    pub(crate) right_link: Link,
    /// OldestDescendant (App. B): the smallest log position of any logged
    /// intention with a node in this subtree, or NO_LOGGED_NODE.
    pub(crate) oldest: LogPos,
    /// The VN once computed (0 before): a cache of `owner.base + seq`,
    /// filled at creation for ephemeral nodes and on first use otherwise,
    /// so meld rarely has to load the (often cold) owner.
    pub(crate) vn_cache: AtomicU64,
    /// Source content version: VN of the node that first produced this payload
    /// as seen by the writer's snapshot (0 if the key did not exist there).
    pub(crate) scv: Vn,
    pub(crate) flags: u16,
    /// AVL height of the subtree (a leaf has height 1).
    pub(crate) height: u8,
    /// 1-based post-order position inside the owner.
    pub(crate) seq: u32,
    /// Source structure version: oldest version with exactly this subtree as
    /// seen in the writer's snapshot (0 if invalidated by a restructuring).
    pub(crate) ssv: Vn,
    /// The intention or transaction the node belongs to; `None` for an
    /// ephemeral node, whose VN is fixed (cached) when meld makes it and
    /// which belongs to no intention, so it holds no reference to count.
    pub(crate) owner: Option<Arc<Owner>>,
    /// The value; read it through [`Node::val`] (a stub's is empty).
    pub(crate) payload: Bytes,
    /// DependencyRange of a DependsOnTree node (phantom protection), or a
    /// stub's loader. Both are rare, so one pointer holds either.
    pub(crate) extra: Option<Box<Extra>>,
    /// Where the node was last written by a checkpoint ([`NodeAddr`]), or
    /// 0. A stub is read back from here. Atomic because the checkpoint
    /// encoder records it on nodes that other threads share.
    pub(crate) addr: AtomicU64,
}

// The layout promise above: everything meld reads ends within 80 bytes.
const _: () = assert!(std::mem::offset_of!(Node, ssv) + 8 <= 80);
const _: () = assert!(std::mem::offset_of!(Node, oldest) + 8 <= 80);
const _: () = assert!(std::mem::offset_of!(Node, height) < 80);

/// The rarely present parts of a node.
#[derive(Debug)]
pub(crate) enum Extra {
    /// DependencyRange of a DependsOnTree intention node.
    Ranges(Box<[KeyRange]>),
    /// A stub's loader and, once loaded, its body.
    Stub(Stub),
}

/// Reads the node at an address back through a store, with stubs for its
/// children. The format of what is stored belongs to the layer that writes
/// it (a checkpoint), so whoever makes a stub says how to read it.
pub(crate) type ReadBody = fn(&Arc<dyn NodeStore>, NodeAddr) -> Result<Arc<Node>, StoreError>;

/// What a stub needs to read its body back.
pub(crate) struct Stub {
    pub(crate) store: Arc<dyn NodeStore>,
    /// How the body is read from `store`.
    pub(crate) read: ReadBody,
    pub(crate) body: OnceLock<Arc<Node>>,
    /// Set when the body is used; the cache's sweep clears it (CLOCK).
    pub(crate) used: AtomicBool,
    /// The stub's address in a checkpoint being written (0: none). The
    /// body is read from `addr` until that checkpoint is complete; the
    /// sweep after it moves this there, so older checkpoints can be
    /// trimmed.
    pub(crate) next: AtomicU64,
    /// The generation this stub pins in its store (see [`NodeStore::pin`]).
    pub(crate) pinned: std::sync::atomic::AtomicU16,
}

impl Drop for Stub {
    fn drop(&mut self) {
        self.store.unpin(*self.pinned.get_mut());
    }
}

impl std::fmt::Debug for Stub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stub")
            .field("loaded", &self.body.get().is_some())
            .field("next", &self.next.load(Ordering::Relaxed))
            .finish()
    }
}

/// The address of a node inside a checkpoint: which checkpoint (a small
/// number the host gives each one it writes, wrapping at 2^16) and the byte
/// offset of the node's record in the checkpoint's body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NodeAddr(u64);

impl NodeAddr {
    const OFFSET_BITS: u32 = 48;
    /// The address of the record at `offset` in checkpoint `generation`.
    /// `None` if the offset does not fit in 48 bits.
    pub fn new(generation: u16, offset: u64) -> Option<NodeAddr> {
        (offset < 1 << Self::OFFSET_BITS)
            .then(|| NodeAddr(u64::from(generation) << Self::OFFSET_BITS | offset))
    }
    pub(crate) fn from_raw(raw: u64) -> Option<NodeAddr> {
        (raw != 0).then_some(NodeAddr(raw))
    }
    pub(crate) fn raw(self) -> u64 {
        self.0
    }
    /// The checkpoint's generation number.
    pub fn generation(self) -> u16 {
        (self.0 >> Self::OFFSET_BITS) as u16
    }
    /// The record's byte offset in the checkpoint body.
    pub fn offset(self) -> u64 {
        self.0 & ((1 << Self::OFFSET_BITS) - 1)
    }
}

impl std::fmt::Display for NodeAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "checkpoint #{} offset {}",
            self.generation(),
            self.offset()
        )
    }
}

/// Where persisted nodes are read back from: the host's view of the
/// checkpoints in its log. The core parses and verifies what it returns.
pub trait NodeStore: Send + Sync {
    /// Up to `len` bytes of checkpoint `addr.generation()`'s body from
    /// `addr.offset()` on (fewer only where the body ends).
    fn read(&self, addr: NodeAddr, len: usize) -> Result<Vec<u8>, StoreError>;
    /// Called with the size of every node body loaded into memory and kept
    /// there (not for bodies read for one walk), so the host can account
    /// its cache.
    fn loaded(&self, _bytes: u64) {}
    /// A stub that reads from checkpoint `generation` came to exist: that
    /// checkpoint must stay readable (not trimmed) until as many
    /// [`NodeStore::unpin`] calls came for it.
    fn pin(&self, _generation: u16) {}
    /// A stub no longer reads from checkpoint `generation`.
    fn unpin(&self, _generation: u16) {}
}

/// Reading a persisted node back failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The host could not read the bytes (I/O error, trimmed log, unknown
    /// checkpoint).
    #[error("cannot read node at {addr}: {message}")]
    Read {
        /// The node's address.
        addr: NodeAddr,
        /// What the host reported.
        message: String,
    },
    /// The bytes read back are not the node that was written there.
    #[error(
        "node at {addr} is damaged: {why}; the database files are corrupt, run `melddb check`"
    )]
    Corrupt {
        /// The node's address.
        addr: NodeAddr,
        /// What is wrong.
        why: &'static str,
    },
}

thread_local! {
    /// The first load failure on this thread since it was last taken. Node
    /// accessors cannot return errors without making every tree walk
    /// fallible; instead a failed load yields an empty node and is recorded
    /// here, and every operation that may touch stubs takes it at its end
    /// and fails as a whole (see [`take_store_error`]).
    static STORE_ERROR: RefCell<Option<StoreError>> = const { RefCell::new(None) };
}

/// Takes the load failure recorded on this thread, if any. Operations on
/// trees with stubs call it after they ran; a `Some` means their result is
/// meaningless and must be discarded.
pub(crate) fn take_store_error() -> Option<StoreError> {
    STORE_ERROR.with(|e| e.borrow_mut().take())
}

/// Runs `f`, which may read stubs back, and fails if any read failed
/// (clearing a failure left over from an operation that did not look).
pub(crate) fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, StoreError> {
    let _ = take_store_error();
    let out = f();
    match take_store_error() {
        None => Ok(out),
        Some(e) => Err(e),
    }
}

fn record_store_error(err: StoreError) {
    STORE_ERROR.with(|e| {
        let mut slot = e.borrow_mut();
        if slot.is_none() {
            *slot = Some(err);
        }
    });
}

/// What a failed load yields: a childless, empty node, never used because
/// the operation that got it fails (see [`take_store_error`]).
fn poison() -> &'static Node {
    static POISON: OnceLock<Node> = OnceLock::new();
    POISON.get_or_init(|| Node {
        key: Bytes::default(),
        left_link: None,
        right_link: None,
        vn_cache: AtomicU64::new(0),
        scv: 0,
        flags: 0,
        height: 1,
        seq: 0,
        ssv: 0,
        owner: None,
        payload: Bytes::default(),
        extra: None,
        oldest: NO_LOGGED_NODE,
        addr: AtomicU64::new(0),
    })
}

impl Node {
    /// The node's key.
    pub fn key(&self) -> &[u8] {
        &self.key
    }
    /// The node's value (read back first if the node is a stub).
    pub fn value(&self) -> &[u8] {
        self.val()
    }

    /// The node's value as [`Bytes`].
    #[inline]
    pub(crate) fn val(&self) -> &Bytes {
        &self.body().payload
    }
    /// The left child.
    #[inline]
    pub(crate) fn left(&self) -> &Link {
        &self.body().left_link
    }
    /// The right child.
    #[inline]
    pub(crate) fn right(&self) -> &Link {
        &self.body().right_link
    }
    /// DependencyRange (intention nodes only).
    pub(crate) fn ranges(&self) -> Option<&[KeyRange]> {
        match self.extra.as_deref() {
            Some(Extra::Ranges(r)) => Some(r),
            _ => None,
        }
    }
    /// Whether this is a stub (see [`STUB`]).
    #[inline]
    pub(crate) fn is_stub(&self) -> bool {
        self.flags & STUB != 0
    }
    /// Records that a checkpoint being written holds this node at `addr`:
    /// a plain node's address changes at once (the sweep only uses it once
    /// that checkpoint is complete); a stub keeps reading from its current
    /// address until then (see [`Stub::next`]).
    pub(crate) fn record_addr(&self, addr: NodeAddr) {
        match self.stub() {
            Some(s) => s.next.store(addr.raw(), Ordering::Relaxed),
            None => self.addr.store(addr.raw(), Ordering::Relaxed),
        }
    }
    /// Moves a stub's pending address to where it reads from, if the
    /// checkpoint holding it is `persisted`.
    pub(crate) fn promote_addr(&self, persisted: &dyn Fn(u16) -> bool) {
        if let Some(s) = self.stub() {
            if let Some(next) = NodeAddr::from_raw(s.next.load(Ordering::Relaxed)) {
                if persisted(next.generation()) {
                    s.store.pin(next.generation());
                    let old = s.pinned.swap(next.generation(), Ordering::Relaxed);
                    s.store.unpin(old);
                    self.addr.store(next.raw(), Ordering::Relaxed);
                    s.next.store(0, Ordering::Relaxed);
                }
            }
        }
    }
    fn stub(&self) -> Option<&Stub> {
        match self.extra.as_deref() {
            Some(Extra::Stub(s)) if self.is_stub() => Some(s),
            _ => None,
        }
    }
    /// Whether this stub's body is in memory (false for non-stubs).
    pub(crate) fn stub_loaded(&self) -> bool {
        self.loaded_body().is_some()
    }
    /// A stub's body if it is in memory, without counting as a use.
    pub(crate) fn loaded_body(&self) -> Option<&Node> {
        self.stub().and_then(|s| s.body.get()).map(|b| &**b)
    }
    /// The checkpoint address recorded on the node, if any.
    pub(crate) fn node_addr(&self) -> Option<NodeAddr> {
        NodeAddr::from_raw(self.addr.load(Ordering::Relaxed))
    }

    /// The node itself, or for a stub the node read back from its store
    /// (kept, so later calls are cheap). A failed read yields an empty
    /// node and records the error for [`take_store_error`].
    #[inline]
    pub(crate) fn body(&self) -> &Node {
        if self.flags & STUB == 0 {
            self
        } else {
            self.load_body()
        }
    }

    #[cold]
    fn load_body(&self) -> &Node {
        let Some(s) = self.stub() else { return self };
        if let Some(n) = s.body.get() {
            if !s.used.load(Ordering::Relaxed) {
                s.used.store(true, Ordering::Relaxed);
            }
            return n;
        }
        match self.read_back(s) {
            Ok(n) => {
                s.used.store(true, Ordering::Relaxed);
                s.store.loaded(n.approx_bytes());
                s.body.get_or_init(|| n)
            }
            Err(e) => {
                record_store_error(e);
                poison()
            }
        }
    }

    fn read_back(&self, s: &Stub) -> Result<Arc<Node>, StoreError> {
        let addr = self.node_addr().ok_or(StoreError::Corrupt {
            addr: NodeAddr(0),
            why: "stub without an address",
        })?;
        let n = (s.read)(&s.store, addr)?;
        if n.vn() != self.vn() || n.key != self.key || n.height != self.height {
            return Err(StoreError::Corrupt {
                addr,
                why: "the node read back is not the one the stub stands for",
            });
        }
        Ok(n)
    }

    /// Runs `f` on the node's body without keeping a stub's body in memory
    /// afterwards (for walks over a whole tree, which would otherwise pull
    /// all of it into memory). A failed read runs `f` on an empty node and
    /// records the error.
    pub(crate) fn with_body<R>(&self, f: impl FnOnce(&Node) -> R) -> R {
        match self.stub() {
            None => f(self),
            Some(s) => match s.body.get() {
                Some(n) => f(n),
                None => match self.read_back(s) {
                    Ok(n) => f(&n),
                    Err(e) => {
                        record_store_error(e);
                        f(poison())
                    }
                },
            },
        }
    }

    /// Memory one in-memory node takes: the node, its reference counts and
    /// the heap behind its key and value.
    pub(crate) fn approx_bytes(&self) -> u64 {
        (std::mem::size_of::<Node>() + 16) as u64
            + self.key.heap_bytes() as u64
            + self.payload.heap_bytes() as u64
            + match self.extra.as_deref() {
                None => 0,
                Some(Extra::Stub(_)) => std::mem::size_of::<Extra>() as u64,
                Some(Extra::Ranges(r)) => (r.len() * std::mem::size_of::<KeyRange>()) as u64,
            }
    }

    /// A stub standing for `self`, read back from `store` at `addr` by
    /// `read`.
    pub(crate) fn to_stub(
        &self,
        addr: NodeAddr,
        store: Arc<dyn NodeStore>,
        read: ReadBody,
    ) -> Arc<Node> {
        Arc::new(Node {
            key: self.key.clone(),
            left_link: None,
            right_link: None,
            vn_cache: AtomicU64::new(self.vn()),
            scv: self.scv,
            flags: (self.flags & !COPIED) | STUB,
            height: self.height,
            seq: self.seq,
            ssv: self.ssv,
            owner: self.owner.clone(),
            payload: Bytes::default(),
            extra: Some(Box::new(Extra::Stub(Stub {
                body: OnceLock::new(),
                used: AtomicBool::new(false),
                next: AtomicU64::new(0),
                pinned: std::sync::atomic::AtomicU16::new({
                    store.pin(addr.generation());
                    addr.generation()
                }),
                store,
                read,
            }))),
            oldest: self.oldest,
            addr: AtomicU64::new(addr.raw()),
        })
    }
    /// The node's version number (identity). Only meaningful for committed nodes.
    #[inline]
    pub fn vn(&self) -> Vn {
        match self.vn_cache.load(Ordering::Relaxed) {
            0 => {
                // An ephemeral node's VN is cached when it is made; without
                // one (the poison node) it has none.
                let Some(owner) = &self.owner else { return 0 };
                let base = owner.base();
                let vn = base + self.seq as Vn;
                // Only a committed owner's VNs are final (its base is set
                // and never changes again); a local node's are not VNs.
                if base != 0 && owner.kind != OwnerKind::Local {
                    self.vn_cache.store(vn, Ordering::Relaxed);
                }
                vn
            }
            v => v,
        }
    }

    #[inline]
    pub(crate) fn flag(&self, f: u16) -> bool {
        self.flags & f != 0
    }
    #[inline]
    pub(crate) fn altered(&self) -> bool {
        self.flag(ALTERED)
    }
    #[inline]
    pub(crate) fn depends_on(&self) -> bool {
        self.flag(DEPENDS_ON)
    }
    #[inline]
    pub(crate) fn only_read(&self) -> bool {
        self.flag(SUBTREE_ONLY_READ)
    }
    /// New content version: the VN that produced this node's payload.
    #[inline]
    pub fn ncv(&self) -> Vn {
        if self.altered() {
            self.vn()
        } else {
            self.scv
        }
    }
    /// New structure version: the oldest version with exactly this subtree.
    #[inline]
    pub fn nsv(&self) -> Vn {
        if self.only_read() {
            self.ssv
        } else {
            self.vn()
        }
    }
    /// OldestDescendant (App. B): the smallest log position of any logged
    /// intention holding a node of this subtree (the node closest to the log
    /// head), or [`NO_LOGGED_NODE`] if all of them are ephemeral. Garbage
    /// collection sweeps subtrees whose value is below its threshold.
    pub fn oldest_descendant(&self) -> LogPos {
        self.oldest
    }
    /// Whether both nodes belong to the same owner (same intention).
    #[inline]
    pub(crate) fn same_owner(&self, other: &Arc<Owner>) -> bool {
        self.owner.as_ref().is_some_and(|o| Arc::ptr_eq(o, other))
    }
    /// What kind of container the node lives in.
    #[inline]
    pub(crate) fn owner_kind(&self) -> OwnerKind {
        self.owner.as_ref().map_or(OwnerKind::Ephemeral, |o| o.kind)
    }
}

impl Clone for Node {
    fn clone(&self) -> Node {
        Node {
            key: self.key.clone(),
            payload: self.payload.clone(),
            left_link: self.left_link.clone(),
            right_link: self.right_link.clone(),
            owner: self.owner.clone(),
            seq: self.seq,
            vn_cache: AtomicU64::new(self.vn_cache.load(Ordering::Relaxed)),
            scv: self.scv,
            ssv: self.ssv,
            flags: self.flags,
            height: self.height,
            extra: match self.extra.as_deref() {
                Some(Extra::Ranges(r)) => Some(Box::new(Extra::Ranges(r.clone()))),
                // A clone of a stub is a plain node: callers clone bodies.
                _ => None,
            },
            oldest: self.oldest,
            addr: AtomicU64::new(self.addr.load(Ordering::Relaxed)),
        }
    }
}

/// Starts loading both cache lines of the node behind `l` (its reference
/// count, key and children; its versions, flags and payload header) without
/// waiting for them. Walks over a large committed tree miss the cache at
/// almost every node; touching a node a step before it is needed lets
/// those misses overlap instead of stalling the walk one after another.
/// Plain loads only: an atomic update (a clone) would stall until the line
/// arrived.
#[inline]
pub(crate) fn touch(l: &Link) {
    if let Some(n) = l {
        std::hint::black_box(Arc::strong_count(n));
        std::hint::black_box(n.flags);
    }
}

#[inline]
pub(crate) fn height(l: &Link) -> u8 {
    l.as_ref().map_or(0, |n| n.height)
}

#[inline]
pub(crate) fn nsv_of(l: &Link) -> Vn {
    l.as_ref().map_or(0, |n| n.nsv())
}

#[inline]
pub(crate) fn same(a: &Link, b: &Link) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(x), Some(y)) => same_node(x, y),
        _ => false,
    }
}

/// Whether two committed nodes are the same node. Pointer equality, except
/// where the node cache replaced a node by a stub or a copy with the same
/// identity: then equal VNs (identities are unique) decide.
#[inline]
pub(crate) fn same_node(x: &Arc<Node>, y: &Arc<Node>) -> bool {
    Arc::ptr_eq(x, y) || ((x.flags | y.flags) & (STUB | COPIED) != 0 && x.vn() == y.vn())
}

/// OldestDescendant of a node whose own log position is `own` (or
/// [`NO_LOGGED_NODE`] for an ephemeral node) with children `l` and `r`.
#[inline]
pub(crate) fn oldest_from(l: &Link, r: &Link, own: LogPos) -> LogPos {
    let f = |x: &Link| x.as_ref().map_or(NO_LOGGED_NODE, |n| n.oldest);
    own.min(f(l)).min(f(r))
}

/// Looks up `key` in a committed tree.
pub(crate) fn find<'a>(mut t: &'a Link, key: &[u8]) -> Option<&'a Arc<Node>> {
    while let Some(n) = t {
        match crate::bytes::cmp_keys(key, &n.key) {
            std::cmp::Ordering::Less => t = n.left(),
            std::cmp::Ordering::Greater => t = n.right(),
            std::cmp::Ordering::Equal => return Some(n),
        }
    }
    None
}

/// The smallest key of a non-empty subtree.
pub(crate) fn min_key(n: &Arc<Node>) -> &[u8] {
    let mut n = n;
    while let Some(l) = n.left() {
        n = l;
    }
    &n.key
}

/// The largest key of a non-empty subtree.
pub(crate) fn max_key(n: &Arc<Node>) -> &[u8] {
    let mut n = n;
    while let Some(r) = n.right() {
        n = r;
    }
    &n.key
}
