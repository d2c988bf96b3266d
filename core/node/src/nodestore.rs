//! The node cache's store: reads persisted nodes back from the checkpoint
//! parts in the segment files.
//!
//! The writer registers every checkpoint part it appends (or recovery finds)
//! under the checkpoint's *generation*, a number this process gives each
//! checkpoint; [`melddb::NodeAddr`]s name a generation and a byte offset in
//! that checkpoint's body. A read maps the offset to the part(s) holding it
//! and reads just those bytes from the segment file with positional reads
//! (served by the OS page cache when hot), so a node costs one or two small
//! reads, not a whole part. The core verifies every node's checksum.
//!
//! Stubs pin the generation they read from; the log is never trimmed below a
//! checkpoint that is pinned (a snapshot held for a long time keeps the log
//! it can still reach).

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use melddb::{LogPos, Melder, NodeAddr, NodeStore, StoreError};

/// One checkpoint part's body bytes in a segment file.
#[derive(Debug)]
struct PartLoc {
    /// Offset of the part's first body byte in the checkpoint body.
    body_start: u64,
    len: u64,
    path: PathBuf,
    file: Arc<File>,
    /// Where that byte is in the file.
    file_offset: u64,
}

#[derive(Debug, Default)]
struct Generation {
    begin: LogPos,
    complete: bool,
    parts: Vec<PartLoc>,
    /// Body bytes registered so far (the next part's `body_start`).
    body_len: u64,
}

/// Counters of the node store.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Nodes read back (each is one or a few positional reads).
    pub nodes_loaded: u64,
    /// Memory those nodes took once loaded.
    pub loaded_bytes: u64,
    /// Positional reads made.
    pub reads: u64,
    /// Bytes read from the files.
    pub read_bytes: u64,
}

/// Called (once, until re-armed) when loads pass the threshold.
type PressureHook = Box<dyn Fn() + Send + Sync>;

/// Reads checkpoint nodes back from the log's segment files.
#[derive(Default)]
pub struct LogStore {
    generations: RwLock<BTreeMap<u16, Generation>>,
    pins: Mutex<BTreeMap<u16, u64>>,
    nodes_loaded: AtomicU64,
    loaded_bytes: AtomicU64,
    reads: AtomicU64,
    read_bytes: AtomicU64,
    /// Bytes loaded since the hook was last armed, the threshold, and the
    /// hook (the background thread's wake-up: readers load while no commit comes).
    since_armed: AtomicU64,
    threshold: AtomicU64,
    hook: std::sync::OnceLock<PressureHook>,
}

impl std::fmt::Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore")
            .field("stats", &self.stats())
            .finish()
    }
}

impl LogStore {
    /// Calls `hook` from the loading thread once `threshold` bytes were
    /// loaded since [`LogStore::arm`] (which also sets it up first).
    pub fn on_pressure(&self, threshold: u64, hook: impl Fn() + Send + Sync + 'static) {
        self.threshold.store(threshold.max(1), Ordering::Relaxed);
        let _ = self.hook.set(Box::new(hook));
        self.arm();
    }

    /// Re-arms the pressure hook (after the cache was swept).
    pub fn arm(&self) {
        self.since_armed.store(0, Ordering::Relaxed);
    }

    /// An empty store.
    pub fn new() -> LogStore {
        LogStore::default()
    }

    /// Registers the next part of checkpoint `generation` (begun at log
    /// position `begin`): `len` body bytes at `file_offset` of `path`.
    pub fn add_part(
        &self,
        generation: u16,
        begin: LogPos,
        path: &Path,
        file_offset: u64,
        len: u64,
    ) -> std::io::Result<()> {
        let mut gens = self
            .generations
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        let g = gens.entry(generation).or_insert_with(|| Generation {
            begin,
            ..Generation::default()
        });
        if g.begin != begin {
            // A reused generation number: the old checkpoint is long gone.
            *g = Generation {
                begin,
                ..Generation::default()
            };
        }
        let file = match g.parts.last() {
            Some(p) if p.path == path => p.file.clone(),
            _ => Arc::new(File::open(path)?),
        };
        g.parts.push(PartLoc {
            body_start: g.body_len,
            len,
            path: path.to_path_buf(),
            file,
            file_offset,
        });
        g.body_len += len;
        Ok(())
    }

    /// Marks checkpoint `generation` complete (durable): stubs may read
    /// from it from now on.
    pub fn complete(&self, generation: u16) {
        if let Some(g) = self
            .generations
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(&generation)
        {
            g.complete = true;
        }
    }

    /// Forgets checkpoint `generation` (its log was trimmed, or it was
    /// abandoned).
    pub fn remove(&self, generation: u16) {
        self.generations
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&generation);
    }

    /// Registered checkpoints: `(generation, begin position, complete)`.
    pub fn checkpoints(&self) -> Vec<(u16, LogPos, bool)> {
        self.generations
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(|(k, g)| (*k, g.begin, g.complete))
            .collect()
    }

    /// Generations of the complete checkpoints (the ones stubs may read
    /// from).
    pub fn complete_generations(&self) -> Vec<u16> {
        self.generations
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter_map(|(k, g)| g.complete.then_some(*k))
            .collect()
    }

    /// Live stubs that read from `generation`.
    pub fn pins(&self, generation: u16) -> u64 {
        self.pins
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&generation)
            .copied()
            .unwrap_or(0)
    }

    /// The counters so far.
    pub fn stats(&self) -> StoreStats {
        StoreStats {
            nodes_loaded: self.nodes_loaded.load(Ordering::Relaxed),
            loaded_bytes: self.loaded_bytes.load(Ordering::Relaxed),
            reads: self.reads.load(Ordering::Relaxed),
            read_bytes: self.read_bytes.load(Ordering::Relaxed),
        }
    }
}

/// What [`evict_to`] did.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Swept {
    pub sweeps: u64,
    pub stubbed: u64,
    pub unloaded: u64,
    /// The tree's memory afterwards.
    pub measured: u64,
}

/// The node cache's CLOCK eviction of `melder`'s retained trees toward
/// `budget`: the first pass spares what was used since the last one (and
/// clears its mark); if that is still too much, what was not used again
/// meanwhile goes in a second pass. `persisted` says which checkpoint
/// generations are complete. A read-back failure met on the way is
/// returned (the melder is then unusable).
pub(crate) fn evict_to(
    melder: &mut Melder,
    store: &Arc<LogStore>,
    persisted: &dyn Fn(u16) -> bool,
    budget: u64,
) -> Result<Swept, StoreError> {
    let dyn_store: Arc<dyn NodeStore> = store.clone();
    let mut out = Swept::default();
    for _ in 0..2 {
        let ev = melder.evict(&dyn_store, persisted);
        if let Some(e) = melder.read_error() {
            return Err(e.clone());
        }
        out.sweeps += 1;
        out.stubbed += ev.stubbed;
        out.unloaded += ev.unloaded;
        out.measured = melder.lcs().approx_bytes();
        if out.measured <= budget {
            break;
        }
    }
    Ok(out)
}

impl NodeStore for LogStore {
    fn read(&self, addr: NodeAddr, len: usize) -> Result<Vec<u8>, StoreError> {
        let err = |message: String| StoreError::Read { addr, message };
        let gens = self
            .generations
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        let g = gens.get(&addr.generation()).ok_or_else(|| {
            err("the checkpoint is no longer in the log (trimmed); reopen the database".into())
        })?;
        let mut off = addr.offset();
        let mut i = g
            .parts
            .partition_point(|p| p.body_start <= off)
            .checked_sub(1)
            .ok_or_else(|| err("offset before the checkpoint body".into()))?;
        let mut out = vec![0u8; 0];
        while out.len() < len && i < g.parts.len() {
            let p = &g.parts[i];
            let within = off - p.body_start;
            if within >= p.len {
                break;
            }
            let n = ((len - out.len()) as u64).min(p.len - within) as usize;
            let at = out.len();
            out.resize(at + n, 0);
            p.file
                .read_exact_at(&mut out[at..], p.file_offset + within)
                .map_err(|e| err(format!("{}: {e}", p.path.display())))?;
            self.reads.fetch_add(1, Ordering::Relaxed);
            self.read_bytes.fetch_add(n as u64, Ordering::Relaxed);
            off += n as u64;
            i += 1;
        }
        if out.is_empty() {
            return Err(err("offset past the end of the checkpoint".into()));
        }
        Ok(out)
    }

    fn loaded(&self, bytes: u64) {
        self.nodes_loaded.fetch_add(1, Ordering::Relaxed);
        self.loaded_bytes.fetch_add(bytes, Ordering::Relaxed);
        let before = self.since_armed.fetch_add(bytes, Ordering::Relaxed);
        let t = self.threshold.load(Ordering::Relaxed);
        // Exactly one load crosses the threshold.
        if t > 0 && before < t && before + bytes >= t {
            if let Some(h) = self.hook.get() {
                h();
            }
        }
    }

    fn pin(&self, generation: u16) {
        *self
            .pins
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(generation)
            .or_default() += 1;
    }

    fn unpin(&self, generation: u16) {
        let mut pins = self.pins.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = pins.get_mut(&generation) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                pins.remove(&generation);
            }
        }
    }
}
