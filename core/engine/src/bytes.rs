//! [`Bytes`]: an immutable byte string that stores short values inline.
//!
//! Keys and values of up to 22 bytes live inside the tree node itself, so a
//! node is one allocation; longer ones are shared behind an `Arc` between
//! the versions of a node. Meld creates and frees many nodes per
//! transaction, so this matters on its critical path.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::Arc;

const INLINE: usize = 22;

/// Compares two keys in byte order (the same order as `<[u8]>::cmp`), eight
/// bytes at a time as big-endian integers. Meld compares keys at every node
/// it visits; for the short keys of typical workloads this avoids a call to
/// `memcmp` per comparison.
#[inline(always)]
pub(crate) fn cmp_keys(a: &[u8], b: &[u8]) -> Ordering {
    // Keys of eight bytes or more (the common case) are decided by their
    // first eight bytes unless those are equal; this path has no loop.
    if let (Some(x), Some(y)) = (a.first_chunk::<8>(), b.first_chunk::<8>()) {
        let (x, y) = (u64::from_be_bytes(*x), u64::from_be_bytes(*y));
        if x != y {
            return x.cmp(&y);
        }
        if a.len() == 8 && b.len() == 8 {
            return Ordering::Equal;
        }
        return cmp_rest(&a[8..], &b[8..]);
    }
    cmp_rest(a, b)
}

/// `cmp_keys` for what the eight-byte fast path does not decide.
#[inline(never)]
fn cmp_rest(a: &[u8], b: &[u8]) -> Ordering {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 8 <= n {
        let x = u64::from_be_bytes(a[i..i + 8].try_into().unwrap_or([0; 8]));
        let y = u64::from_be_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
        if x != y {
            return x.cmp(&y);
        }
        i += 8;
    }
    if i < n {
        let mut x = [0u8; 8];
        let mut y = [0u8; 8];
        x[..n - i].copy_from_slice(&a[i..n]);
        y[..n - i].copy_from_slice(&b[i..n]);
        let (x, y) = (u64::from_be_bytes(x), u64::from_be_bytes(y));
        if x != y {
            return x.cmp(&y);
        }
    }
    a.len().cmp(&b.len())
}

/// An immutable, cheaply cloned byte string (a key or a value).
#[derive(Clone)]
pub struct Bytes(Repr);

#[derive(Clone)]
enum Repr {
    Inline { len: u8, data: [u8; INLINE] },
    Shared(Arc<[u8]>),
}

impl Bytes {
    /// The bytes as a slice.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        match &self.0 {
            // `min` instead of a bounds check: `len` never exceeds INLINE.
            Repr::Inline { len, data } => &data[..(*len as usize).min(INLINE)],
            Repr::Shared(a) => a,
        }
    }
}

impl Bytes {
    /// Starts loading the shared allocation's header (its reference count)
    /// into the cache without waiting for it, so that a later clone's
    /// atomic increment, which stalls the core until the line arrives,
    /// finds it there. A plain load does not stall: the core goes on with
    /// the instructions after it while the line is fetched.
    #[inline]
    pub(crate) fn touch(&self) {
        if let Repr::Shared(a) = &self.0 {
            std::hint::black_box(Arc::strong_count(a));
        }
    }

    /// Heap bytes behind this string (0 when stored inline): the shared
    /// allocation's length plus its two reference counts.
    pub(crate) fn heap_bytes(&self) -> usize {
        match &self.0 {
            Repr::Inline { .. } => 0,
            Repr::Shared(a) => a.len() + 16,
        }
    }
}

impl Default for Bytes {
    /// The empty string.
    fn default() -> Bytes {
        Bytes(Repr::Inline {
            len: 0,
            data: [0; INLINE],
        })
    }
}

impl Deref for Bytes {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsRef<[u8]> for Bytes {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl Borrow<[u8]> for Bytes {
    fn borrow(&self) -> &[u8] {
        self.as_slice()
    }
}

impl From<&[u8]> for Bytes {
    fn from(b: &[u8]) -> Bytes {
        if b.len() <= INLINE {
            let mut data = [0u8; INLINE];
            data[..b.len()].copy_from_slice(b);
            Bytes(Repr::Inline {
                len: b.len() as u8,
                data,
            })
        } else {
            Bytes(Repr::Shared(b.into()))
        }
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(v: Vec<u8>) -> Bytes {
        if v.len() <= INLINE {
            Bytes::from(&v[..])
        } else {
            Bytes(Repr::Shared(v.into()))
        }
    }
}

impl From<&str> for Bytes {
    fn from(s: &str) -> Bytes {
        Bytes::from(s.as_bytes())
    }
}

impl<const N: usize> From<&[u8; N]> for Bytes {
    fn from(b: &[u8; N]) -> Bytes {
        Bytes::from(&b[..])
    }
}

impl PartialEq for Bytes {
    fn eq(&self, other: &Bytes) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for Bytes {}

impl PartialEq<[u8]> for Bytes {
    fn eq(&self, other: &[u8]) -> bool {
        self.as_slice() == other
    }
}

impl PartialOrd for Bytes {
    fn partial_cmp(&self, other: &Bytes) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Bytes {
    fn cmp(&self, other: &Bytes) -> Ordering {
        cmp_keys(self.as_slice(), other.as_slice())
    }
}

impl Hash for Bytes {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.as_slice().hash(h)
    }
}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "b\"{}\"", self.as_slice().escape_ascii())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_and_shared_behave_alike() {
        for len in [0usize, 1, 21, 22, 23, 100] {
            let v: Vec<u8> = (0..len as u8).collect();
            let a = Bytes::from(&v[..]);
            let b = Bytes::from(v.clone());
            assert_eq!(&a[..], &v[..]);
            assert_eq!(a, b);
            assert_eq!(a.clone().to_vec(), v);
        }
        let (a, ab) = (Bytes::from(&b"a"[..]), Bytes::from(&b"ab"[..]));
        assert!(a < ab);
        let (long, short) = (Bytes::from(&[9u8; 30][..]), Bytes::from(&[9u8; 22][..]));
        assert!(long > short);
    }

    #[test]
    fn cmp_keys_matches_slice_order() {
        let samples: Vec<Vec<u8>> = vec![
            vec![],
            vec![0],
            vec![0, 0],
            vec![1],
            vec![255],
            vec![1, 2, 3, 4, 5, 6, 7, 8],
            vec![1, 2, 3, 4, 5, 6, 7, 8, 0],
            vec![1, 2, 3, 4, 5, 6, 7, 9],
            vec![1, 2, 3, 4, 5, 6, 7],
            (0..20).collect(),
            (0..21).collect(),
            vec![9; 17],
            vec![9; 16],
            vec![0, 255, 0, 255],
        ];
        for a in &samples {
            for b in &samples {
                assert_eq!(cmp_keys(a, b), a.cmp(b), "{a:?} vs {b:?}");
            }
        }
    }
}
