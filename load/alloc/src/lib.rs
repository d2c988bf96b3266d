//! [`MeldAlloc`]: mimalloc as a Rust global allocator, without the detour
//! through its aligned API for ordinary layouts.
//!
//! The `mimalloc` crate passes every allocation to `mi_malloc_aligned`,
//! because Rust asks with an alignment. For the small, 8-aligned blocks
//! meld allocates by the million (a 160-byte tree node) that costs extra
//! checks on every call and, whenever the free list at hand is empty, the
//! generic aligned path: a share of a meld's instructions that calling
//! `mi_malloc` for such layouts saves. Other layouts still take the
//! aligned functions.
//!
//! Pick it in a binary, and apply MeldDB's allocator settings first thing
//! in `main` ([`configure`]):
//!
//! ```no_run
//! #[global_allocator]
//! static GLOBAL: melddb_alloc::MeldAlloc = melddb_alloc::MeldAlloc;
//!
//! fn main() {
//!     melddb_alloc::configure();
//!     let v: Vec<u64> = (0..10).collect();
//!     assert_eq!(v.len(), 10);
//! }
//! ```

#![deny(missing_docs)]

use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

use libmimalloc_sys as mi;

/// How long (milliseconds) mimalloc keeps memory that became free before
/// it gives it back to the OS, unless `MIMALLOC_PURGE_DELAY` says
/// otherwise. mimalloc's own default is 10 ms. Meld frees the nodes of
/// old states in batches and allocates new ones at once; with 10 ms the
/// freed pages are returned in between, so the next nodes fault fresh,
/// zeroed pages back in and the kernel's page clearing shows in every
/// meld's latency. With a second, memory still goes back to the OS when
/// a process stops using it (mimalloc waits ten times as long for whole
/// arenas), and melds do not pay for clearing pages.
pub const PURGE_DELAY_MS: i64 = 1000;

/// `mi_option_purge_delay` in mimalloc v2's `mi_option_t` (the sys crate
/// names only some options). The child-process test below fails if this
/// number is not the option `MIMALLOC_PURGE_DELAY` sets.
const OPTION_PURGE_DELAY: mi::mi_option_t = 15;

/// Applies MeldDB's mimalloc settings ([`PURGE_DELAY_MS`]) where the
/// environment does not set them (`MIMALLOC_PURGE_DELAY`, or the older
/// `MIMALLOC_RESET_DELAY`, wins). mimalloc reads the setting whenever it
/// decides about freed memory, so call this early in `main`; calling it
/// again changes nothing.
pub fn configure() {
    if !delay_set_by_env() {
        // SAFETY: a plain FFI call with a valid option number; mimalloc
        // reads options without synchronization, and a stale read only
        // means one purge decided with the old delay.
        unsafe { mi::mi_option_set(OPTION_PURGE_DELAY, PURGE_DELAY_MS as _) }
    }
}

/// Whether the environment sets mimalloc's purge delay (under either name).
fn delay_set_by_env() -> bool {
    ["MIMALLOC_PURGE_DELAY", "MIMALLOC_RESET_DELAY"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
}

/// The purge delay mimalloc uses now (milliseconds; −1: never purge).
// `c_long` is `i64` here but `i32` on other targets.
#[allow(clippy::useless_conversion)]
pub fn purge_delay_ms() -> i64 {
    // SAFETY: a plain FFI call with a valid option number.
    i64::from(unsafe { mi::mi_option_get(OPTION_PURGE_DELAY) })
}

/// The largest alignment mimalloc (v2) gives every block it hands out
/// for a size at least that large (`MI_MAX_ALIGN_SIZE`).
const MAX_NATURAL_ALIGN: usize = 16;

/// Whether `mi_malloc(layout.size())` is aligned enough for `layout`: the
/// test mimalloc v2 itself makes before it serves an aligned request
/// with a plain allocation (`mi_malloc_is_naturally_aligned`).
#[inline]
fn plain(layout: &Layout) -> bool {
    layout.align() <= MAX_NATURAL_ALIGN && layout.align() <= layout.size()
}

/// mimalloc, through `mi_malloc` and `mi_realloc` when the layout's
/// alignment is one those already give, through the aligned functions
/// otherwise (and always for zeroed blocks).
#[derive(Debug, Default, Clone, Copy)]
pub struct MeldAlloc;

// SAFETY: every path returns a block of at least `layout.size()` bytes
// aligned to `layout.align()` (see `plain`), or null on failure, and frees
// only what mimalloc allocated; `mi_free` takes blocks from either API.
unsafe impl GlobalAlloc for MeldAlloc {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: plain FFI calls; mimalloc accepts any size and a
        // power-of-two alignment, which `Layout` guarantees.
        unsafe {
            if plain(&layout) {
                mi::mi_malloc(layout.size()) as *mut u8
            } else {
                mi::mi_malloc_aligned(layout.size(), layout.align()) as *mut u8
            }
        }
    }

    /// Always the aligned function: `mi_zalloc` for ordinary layouts makes
    /// the meld suite's brute-force validator slower and meld no faster.
    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as in `alloc`.
        unsafe { mi::mi_zalloc_aligned(layout.size(), layout.align()) as *mut u8 }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator (the caller's contract).
        unsafe { mi::mi_free(ptr as *mut c_void) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout`; the new
        // block keeps the alignment by the same test on the new size.
        unsafe {
            let new = Layout::from_size_align_unchecked(new_size, layout.align());
            if plain(&new) {
                mi::mi_realloc(ptr as *mut c_void, new_size) as *mut u8
            } else {
                mi::mi_realloc_aligned(ptr as *mut c_void, new_size, layout.align()) as *mut u8
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every block is aligned as asked, holds what was written into it,
        /// and keeps its content through a reallocation to another size
        /// (which may switch between the plain and the aligned functions).
        #[test]
        fn blocks_are_aligned_and_keep_their_content(
            size in 1usize..5000,
            align_log in 0u32..8,
            new_size in 1usize..5000,
            zeroed in any::<bool>(),
        ) {
            let align = 1usize << align_log;
            let layout = Layout::from_size_align(size, align).expect("valid layout");
            let a = MeldAlloc;
            // SAFETY: a non-zero-size layout; the block is written and read
            // only within its size and freed once.
            unsafe {
                let p = if zeroed { a.alloc_zeroed(layout) } else { a.alloc(layout) };
                prop_assert!(!p.is_null());
                prop_assert_eq!(p as usize % align, 0, "size {} align {}", size, align);
                if zeroed {
                    prop_assert!(std::slice::from_raw_parts(p, size).iter().all(|&b| b == 0));
                }
                for i in 0..size {
                    *p.add(i) = (i % 251) as u8;
                }
                let q = a.realloc(p, layout, new_size);
                prop_assert!(!q.is_null());
                prop_assert_eq!(q as usize % align, 0, "realloc to {} align {}", new_size, align);
                for i in 0..size.min(new_size) {
                    prop_assert_eq!(*q.add(i), (i % 251) as u8);
                }
                a.dealloc(q, Layout::from_size_align(new_size, align).expect("valid layout"));
            }
        }
    }

    /// `configure` sets the delay unless the environment set one (checked
    /// here when this process was started without one, and always in a
    /// child process started with one).
    #[test]
    fn configure_sets_the_purge_delay_unless_the_environment_does() {
        if let Some(v) = std::env::var_os("MELDDB_ALLOC_CHILD_EXPECTS") {
            configure();
            let want: i64 = v.to_str().and_then(|s| s.parse().ok()).expect("a number");
            assert_eq!(purge_delay_ms(), want);
            return;
        }
        configure();
        if !delay_set_by_env() {
            assert_eq!(purge_delay_ms(), PURGE_DELAY_MS);
        }
        let exe = std::env::current_exe().expect("test binary path");
        let out = std::process::Command::new(exe)
            .args([
                "--exact",
                "tests::configure_sets_the_purge_delay_unless_the_environment_does",
                "--test-threads=1",
            ])
            .env("MIMALLOC_PURGE_DELAY", "-1")
            .env("MELDDB_ALLOC_CHILD_EXPECTS", "-1")
            .output()
            .expect("child test runs");
        // Captured, so the child's own report is not counted as a test.
        assert!(
            out.status.success(),
            "the environment's delay was not kept:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn the_plain_path_is_taken_only_for_natural_alignments() {
        let l = |s, a| Layout::from_size_align(s, a).expect("valid layout");
        assert!(plain(&l(160, 8)));
        assert!(plain(&l(16, 16)));
        assert!(!plain(&l(8, 16)));
        assert!(!plain(&l(64, 32)));
    }
}
